"""The request loops under test, each timed from its first request to its last answer.

- `runner_loop`: `runner.execute.pool.execute` with a fresh cache, as `judge run` drives it.
- `bare_loop`: N aiohttp workers posting the same bodies through one ClientSession.
- `openai_loop`: N workers calling `openai.AsyncOpenAI().chat.completions.create`.

All three use `concurrency` requests in flight and stop dispatching at `deadline_s`. `run`
runs one on asyncio's event loop, the one `judge run` uses (uvloop's was removed: it bought
nothing as a whole process, bench/README.md "What each mechanism buys").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import openai
import orjson

from bench.bare import Timing, bare_loop, connector  # noqa: F401  (bare_loop: for throughput.py)
from runner.execute.pool import Endpoint, execute
from runner.execute.store.cache import Cache
from runner.job.spec import Job
from runner.tasks import Task

CacheFactory = Callable[[Path], Cache]
R = TypeVar("R")

def run(work: Coroutine[Any, Any, R]) -> R:
    """asyncio.run(work), on asyncio's own loop as `judge run` runs its pool."""
    with asyncio.Runner() as runner:
        return runner.run(work)




async def runner_loop(tasks: Iterable[Task], job: Job, cache_dir: Path, *, deadline_s: float,
                      cache_factory: CacheFactory = Cache) -> Timing:
    """Drive `execute` over `tasks` into a cache at `cache_dir`, timed until the cache is closed
    (the pool's last group commit is done before `execute` returns). The stop event (the first
    Ctrl-C) is set at the deadline: in-flight requests finish, nothing new starts."""
    endpoints = {m.name: Endpoint(model=m, base_url=m.base_url or "") for m in job.models}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    cache = cache_factory(cache_dir)
    async with aiohttp.ClientSession(connector=connector(job.limits.concurrency)) as session:
        handle = loop.call_later(deadline_s, stop.set)
        started = time.perf_counter()
        try:
            stats = await execute(tasks, cache=cache, session=session, endpoints=endpoints,
                                  limits=job.limits, stop=stop)
        finally:
            cache.close()
        seconds = time.perf_counter() - started
        handle.cancel()
    return Timing(stats.api_calls, seconds, stats.retries + len(stats.failures))


async def openai_loop(bodies: Sequence[bytes], url: str, *, concurrency: int,
                      deadline_s: float, transport: str = "default") -> Timing:
    """The openai SDK with its default (httpx2) or aiohttp transport; SDK retries off."""
    http_client: Any = (openai.DefaultAioHttpClient() if transport == "aiohttp"
                        else openai.DefaultAsyncHttpxClient())
    requests = [orjson.loads(b) for b in bodies]
    todo = iter(requests)
    answers = errors = 0
    loop = asyncio.get_running_loop()

    async def worker(client: Any, deadline: float) -> None:
        nonlocal answers, errors
        for request in todo:
            if loop.time() > deadline:
                return
            try:
                await client.chat.completions.create(**request)
            except openai.APIError:
                errors += 1
                continue
            answers += 1

    async with openai.AsyncOpenAI(base_url=url, api_key="bench", max_retries=0,
                                  http_client=http_client) as client:
        started = time.perf_counter()
        deadline = loop.time() + deadline_s
        await asyncio.gather(*(worker(client, deadline) for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return Timing(answers, seconds, errors)
