"""The floor every client is measured against: aiohttp workers posting request bodies.

Its own module so that a bare process (bench/process.py) imports aiohttp and orjson, nothing
else: the same start-up a hand-written script pays.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp
import orjson

__all__ = ["Timing", "bare_loop", "connector"]


@dataclass(frozen=True)
class Timing:
    """Answers received in `seconds`; `errors` counts failed requests (retries included)."""

    answers: int
    seconds: float
    errors: int = 0

    @property
    def rate(self) -> float:
        return self.answers / self.seconds if self.seconds > 0 else 0.0


def connector(concurrency: int) -> aiohttp.TCPConnector:
    # As runner.cli.main does: one connection per worker, no per-host cap.
    return aiohttp.TCPConnector(limit=concurrency, limit_per_host=0)


async def bare_loop(bodies: Sequence[bytes], url: str, *, concurrency: int,
                    deadline_s: float) -> Timing:
    """The floor: post each body, read and decode the answer, nothing else."""
    headers = {"Content-Type": "application/json"}
    todo = iter(bodies)
    answers = errors = 0
    loop = asyncio.get_running_loop()

    async def worker(session: aiohttp.ClientSession, deadline: float) -> None:
        nonlocal answers, errors
        for body in todo:
            if loop.time() > deadline:
                return
            async with session.post(url, data=body, headers=headers) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    errors += 1
                    continue
            orjson.loads(raw)
            answers += 1

    async with aiohttp.ClientSession(connector=connector(concurrency)) as session:
        started = time.perf_counter()
        deadline = loop.time() + deadline_s
        await asyncio.gather(*(worker(session, deadline) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return Timing(answers, seconds, errors)
