"""The embedded local judge: calls/s through llama.cpp, with and without its prompt cache.

Sends the OpenMEVA star prompt for the same stories, one request at a time (what a single
llama.cpp slot serves), to a LocalServer started with prompt_cache=False and then True, and
again in the other order, so the two are compared within one run. Bounded: `n` requests per
round, a 120 s timeout per request, 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from runner.data.datasets import load
from runner.execute.local import LocalServer
from runner.tasks import render

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "prompts" / "wang2023" / "openmeva.txt"


def _prompts(data_dir: Path, n: int) -> list[str]:
    template = TEMPLATE.read_text()
    items = []
    for item in load("openmeva", data_dir):
        items.append(render(template, item.fields))
        if len(items) == n:
            break
    return items


async def _calls_per_s(base_url: str, model: str, prompts: list[str]) -> float:
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        for prompt in prompts:
            body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                    "temperature": 0, "max_tokens": 16}
            async with session.post(f"{base_url}/chat/completions", data=orjson.dumps(body),
                                    headers={"Content-Type": "application/json"},
                                    timeout=aiohttp.ClientTimeout(total=120)) as resp:
                resp.raise_for_status()
                await resp.read()
    return len(prompts) / (time.perf_counter() - started)


def _round(prompt_cache: bool, prompts: list[str]) -> dict[str, float]:
    with LocalServer("smollm2", prompt_cache=prompt_cache) as server:
        rate = asyncio.run(_calls_per_s(server.base_url, server.model, prompts))
        return {"startup_s": round(server.startup_seconds, 2), "calls_per_s": round(rate, 2)}


def local_judge(work: Path, quick: bool, data_dir: Path) -> dict[str, Any]:
    """calls/s with the prompt cache off and on, each measured twice, interleaved."""
    if importlib.util.find_spec("llama_cpp") is None:
        return {"skipped": "llama-cpp-python is not installed: make install-local",
                "pass": None}
    prompts = _prompts(data_dir, 8 if quick else 30)
    rounds = []
    for prompt_cache in (False, True, True, False):
        rounds.append({"prompt_cache": prompt_cache, **_round(prompt_cache, prompts)})
    off = [r["calls_per_s"] for r in rounds if not r["prompt_cache"]]
    on = [r["calls_per_s"] for r in rounds if r["prompt_cache"]]
    return {"requests_per_round": len(prompts), "rounds": rounds,
            "calls_per_s_cache_off": round(sum(off) / len(off), 2),
            "calls_per_s_cache_on": round(sum(on) / len(on), 2),
            "cache_on_over_off": round(sum(on) / sum(off), 2), "pass": None}
