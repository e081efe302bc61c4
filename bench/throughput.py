"""Benchmarks 1 and 2: the runner's request path against a bare aiohttp loop.

1. Zero-latency server, 64 in flight: runner / bare aiohttp (target >= 0.8), also the openai SDK
   (default and aiohttp transports), and the runner with `bench.caches.MemoryCache` (no disk:
   the pool's own cost).
   Loops alternate within each round in a rotating order; the figure is the median over rounds
   of runner/bare measured back to back. `cache_store_us` times storing one answer.
2. 200 ms server latency, 256 in flight: runner requests/s against 0.9 x 256 / 0.2 (1,152/s).

All loops post the same bodies: the `Task.body` of tasks expanded from a synthetic JSONL job.
Every loop runs on asyncio's event loop, as `judge run` does.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench import cached, caches, clients, common
from runner.job.load import load_job
from runner.job.spec import Job
from runner.prepare import prepare
from runner.tasks import Task

ASPECTS = ("coherence", "consistency", "fluency", "relevance")
Loop = Callable[[Path], Coroutine[Any, Any, clients.Timing]]


def _tasks(folder: Path, items: int, url: str, concurrency: int) -> tuple[Job, list[Task]]:
    path = common.write_job(folder, items, aspects=ASPECTS, base_url=url,
                            concurrency=concurrency, max_retries=2)
    job = load_job(path)
    return job, list(prepare(job, folder).tasks())


def _measure(loop: Loop, work: Path, server: common.Server) -> dict[str, Any]:
    """Run one loop on its event loop; throughput plus client and server CPU per answer."""
    cpu0, server0 = time.process_time(), common.process_cpu_s(server.process.pid)
    timing = clients.run(loop(work))
    cpu1, server1 = time.process_time(), common.process_cpu_s(server.process.pid)
    per = 1e6 / max(timing.answers, 1)
    return {"answers": timing.answers, "seconds": round(timing.seconds, 3),
            "rate": round(timing.rate, 1), "errors": timing.errors,
            "client_cpu_us_per_answer": round((cpu1 - cpu0) * per),
            "server_cpu_us_per_answer": round((server1 - server0) * per)}


def _rounds(loops: dict[str, Loop], rounds: int, work: Path,
            server: common.Server) -> dict[str, list[dict[str, Any]]]:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in loops}
    names = list(loops)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            runs[name].append(_measure(loops[name], work / f"{name}-{r}", server))
    return runs


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"rate_median": round(statistics.median(r["rate"] for r in runs), 1),
            "client_cpu_us_per_answer_median":
                statistics.median(r["client_cpu_us_per_answer"] for r in runs),
            "server_cpu_us_per_answer_median":
                statistics.median(r["server_cpu_us_per_answer"] for r in runs),
            "errors": sum(r["errors"] for r in runs), "runs": runs}


def _ratio(runs: dict[str, list[dict[str, Any]]], name: str, base: str = "bare") -> float:
    """Median over rounds of name/base, each pair measured in the same round."""
    ratios = [float(a["rate"]) / float(b["rate"])
              for a, b in zip(runs[name], runs[base], strict=True)]
    return round(statistics.median(ratios), 3)


def _openai(bodies: list[bytes], url: str, concurrency: int, deadline_s: float, transport: str,
            _: Path) -> Coroutine[Any, Any, clients.Timing]:
    return clients.openai_loop(bodies, url, concurrency=concurrency, deadline_s=deadline_s,
                               transport=transport)


def zero_latency(work: Path, quick: bool) -> dict[str, Any]:
    """Benchmark 1."""
    concurrency, rounds = 64, (2 if quick else 5)
    items = 1000 if quick else 2500  # x 4 aspects: requests per run
    with common.server() as server:
        job, tasks = _tasks(work / "job", items, server.url, concurrency)
        bodies, url = [t.body for t in tasks], server.url + "/chat/completions"
        deadline = 6.0 if quick else 15.0

        def bare(_: Path) -> Coroutine[Any, Any, clients.Timing]:
            return clients.bare_loop(bodies, url, concurrency=concurrency, deadline_s=deadline)

        def runner(d: Path) -> Coroutine[Any, Any, clients.Timing]:
            return clients.runner_loop(tasks, job, d, deadline_s=deadline)

        def in_memory(d: Path) -> Coroutine[Any, Any, clients.Timing]:
            return clients.runner_loop(tasks, job, d, deadline_s=deadline,
                                       cache_factory=caches.MemoryCache)

        loops: dict[str, Loop] = {"bare": bare, "runner": runner,
                                  "runner_memorycache": in_memory}
        runs = _rounds(loops, rounds, work, server)
        sdk = bodies[: 600 if quick else 3000]
        sdk_deadline = 4.0 if quick else 8.0
        for transport in ("default", "aiohttp"):
            sdk_loop: Loop = functools.partial(_openai, sdk, server.url, concurrency,
                                               sdk_deadline, transport)
            runs[f"openai_{transport}"] = [_measure(sdk_loop, work, server)]
    ratio = _ratio(runs, "runner")
    bare_rate = statistics.median(r["rate"] for r in runs["bare"])
    return {
        "setup": {"concurrency": concurrency, "requests_per_run": len(tasks), "rounds": rounds,
                  "deadline_s": deadline, "body_bytes": len(bodies[0]),
                  "cache": "fresh runner.execute.store.cache.Cache per run, in a temp dir on the "
                           "same disk",
                  "event_loops": {"runner": "asyncio", "bare": "asyncio"}},
        "target": "runner/bare >= 0.8",
        "runner_over_bare": ratio,
        "pass": ratio >= 0.8,
        "runner_memorycache_over_bare": _ratio(runs, "runner_memorycache"),
        "cache_store_us": caches.put_cost(work / "put-cost", [
            (t.key, cached.record(t, job.models[0].endpoint)) for t in tasks[:4000]]),
        "openai_default_over_bare": round(runs["openai_default"][0]["rate"] / bare_rate, 3),
        "openai_aiohttp_over_bare": round(runs["openai_aiohttp"][0]["rate"] / bare_rate, 3),
        "loops": {name: _summary(r) for name, r in runs.items()},
    }


def high_latency(work: Path, quick: bool) -> dict[str, Any]:
    """Benchmark 2."""
    concurrency, latency = 256, 0.2
    waves, rounds = (20, 1) if quick else (50, 2)
    ideal = concurrency / latency
    with common.server(latency=latency) as server:
        job, tasks = _tasks(work / "job", concurrency * waves // len(ASPECTS), server.url,
                            concurrency)
        bodies, url = [t.body for t in tasks], server.url + "/chat/completions"
        deadline = waves * latency * 1.5

        def bare(_: Path) -> Coroutine[Any, Any, clients.Timing]:
            return clients.bare_loop(bodies, url, concurrency=concurrency, deadline_s=deadline)

        def runner(d: Path) -> Coroutine[Any, Any, clients.Timing]:
            return clients.runner_loop(tasks, job, d, deadline_s=deadline)

        loops: dict[str, Loop] = {"bare": bare, "runner": runner}
        runs = _rounds(loops, rounds, work, server)
        max_in_flight = server.stats()["max_in_flight"]
    runner = statistics.median(r["rate"] for r in runs["runner"])
    bare = statistics.median(r["rate"] for r in runs["bare"])
    return {
        "setup": {"concurrency": concurrency, "latency_s": latency, "requests_per_run": len(tasks),
                  "rounds": rounds, "server_max_in_flight": max_in_flight,
                  "event_loops": {"runner": "asyncio", "bare": "asyncio"}},
        "target": f"runner >= 0.9 x {ideal:.0f} = {0.9 * ideal:.0f} requests/s",
        "runner_rate": runner,
        "runner_over_ideal": round(runner / ideal, 3),
        "pass": runner >= 0.9 * ideal,
        "bare_rate": bare,
        "bare_over_ideal": round(bare / ideal, 3),
        "runner_over_bare": _ratio(runs, "runner"),
        "loops": {name: _summary(r) for name, r in runs.items()},
    }
