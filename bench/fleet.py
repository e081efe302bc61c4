"""Benchmark: one model served by a fleet of 8 fake endpoints at 200 ms latency.

Eight fake servers (tests/fakeserver.py's app, latency 0.2 s each, with bench/server.py's
`/bench/stats`) listen on eight 127.0.0.1 ports, all in ONE child process (`python
bench/fleet.py --ports P1,P2,...`), and serve one model through `endpoints = [...]`: eight
server processes would compete with the client for the 2 cores. The runner's pool
(`runner.execute.pool.execute`, a real diskcache in a temp dir) keeps `in_flight` requests
going. The figure is the aggregate answers/s over the ideal `in_flight / latency` (target
>= 0.9 at 1,024 in flight), plus how evenly the calls spread over the replicas (all of equal
capacity: the ideal share is 1/8 each). For scale on a loaded machine, a bare aiohttp loop
(worker i always posts to server i mod 8, decodes, nothing else) runs first against the same
servers: `runner_over_bare` is the runner's rate over the bare loop's.

Quick mode: 512 in flight, 15 waves of requests. Full: 1,024 in flight, 30 waves. Bounded by a
deadline (3x the ideal time).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import clients, common  # noqa: E402
from bench.server import RecordingState, _stats_handler  # noqa: E402
from runner.execute.pool import Endpoint, execute  # noqa: E402
from runner.execute.store.cache import Cache  # noqa: E402
from runner.job.load import load_job  # noqa: E402
from runner.prepare import prepare  # noqa: E402
from tests.fakeserver import Script, make_app  # noqa: E402

REPLICAS = 8
LATENCY_S = 0.2
ASPECTS = ("coherence", "consistency", "fluency", "relevance")


QUICK = (512, 15)  # (in flight, waves of requests)
FULL = (1024, 30)


def fleet_throughput(work: Path, quick: bool) -> dict[str, Any]:
    in_flight, waves = QUICK if quick else FULL
    ideal = in_flight / LATENCY_S
    with servers_process(REPLICAS, LATENCY_S) as servers:
        path = common.write_job(work / "job", in_flight * waves // len(ASPECTS),
                                aspects=ASPECTS, base_url=servers[0].url,
                                concurrency=in_flight, max_retries=2)
        entries = ", ".join(f'{{base_url = "{s.url}"}}' for s in servers)
        text = re.sub(r'base_url = "[^"]*"', f"endpoints = [{entries}]", path.read_text())
        path.write_text(text, encoding="utf-8")
        job = load_job(path)
        tasks = list(prepare(job, work / "job").tasks())
        deadline = waves * LATENCY_S * 3
        bare = asyncio.run(_bare([t.body for t in tasks], [s.url for s in servers], in_flight,
                                 deadline))
        started_cpu = time.process_time()
        stats, seconds = clients.run(_run(job, tasks, work / "cache", deadline_s=deadline))
        cpu = time.process_time() - started_cpu
    per_server = [c["calls"] for c in stats.endpoints["judge"].values()]
    rate = stats.api_calls / seconds
    share = [round(n / max(sum(per_server), 1), 3) for n in per_server]
    return {
        "setup": {"replicas": REPLICAS, "latency_s": LATENCY_S, "in_flight": in_flight,
                  "requests": len(tasks),
                  "cache": "runner.execute.store.cache.Cache in a temp dir",
                  "event_loops": {"runner": "asyncio",
                                  "bare": "asyncio"}},
        "target": f">= 0.9 x {ideal:.0f} = {0.9 * ideal:.0f} answers/s",
        "rate": round(rate, 1),
        "over_ideal": round(rate / ideal, 3),
        "pass": None if quick else rate >= 0.9 * ideal,
        "answered": stats.api_calls, "failures": len(stats.failures),
        "retries": stats.retries, "seconds": round(seconds, 2),
        "client_cpu_us_per_answer": round(cpu * 1e6 / max(stats.api_calls, 1)),
        "bare_rate": round(bare, 1),
        "runner_over_bare": round(rate / bare, 3) if bare else None,
        "share_per_replica": share,
        "max_share_over_even": round(max(share) * REPLICAS, 3),
    }


async def _bare(bodies: list[bytes], urls: list[str], in_flight: int, deadline_s: float
                ) -> float:
    """Answers/s of the floor: worker i posts to urls[i % len(urls)], nothing else."""
    todo, answers = iter(bodies), 0
    loop = asyncio.get_running_loop()
    headers = {"Content-Type": "application/json"}

    async def worker(session: aiohttp.ClientSession, url: str, deadline: float) -> None:
        nonlocal answers
        for body in todo:
            if loop.time() > deadline:
                return
            async with session.post(url + "/chat/completions", data=body,
                                    headers=headers) as resp:
                raw = await resp.read()
            answers += resp.status == 200 and bool(orjson.loads(raw))

    connector = aiohttp.TCPConnector(limit=in_flight, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        started, deadline = time.perf_counter(), loop.time() + deadline_s
        await asyncio.gather(*(worker(session, urls[i % len(urls)], deadline)
                               for i in range(in_flight)))
        return answers / (time.perf_counter() - started)


async def _run(job: Any, tasks: list[Any], cache_dir: Path, *, deadline_s: float
               ) -> tuple[Any, float]:
    endpoints = {m.name: Endpoint(model=m, base_url=m.base_url or "") for m in job.models}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=job.limits.concurrency, limit_per_host=0)
    with Cache(cache_dir) as cache:
        async with aiohttp.ClientSession(connector=connector) as session:
            handle = loop.call_later(deadline_s, stop.set)
            started = time.perf_counter()
            stats = await execute(tasks, cache=cache, session=session, endpoints=endpoints,
                                  limits=job.limits, stop=stop)
            seconds = time.perf_counter() - started
            handle.cancel()
    return stats, seconds


@contextlib.contextmanager
def servers_process(n: int, latency: float) -> Iterator[list[common.Server]]:
    """`n` fake servers on free 127.0.0.1 ports in one child process; stopped by its pid."""
    ports = [common.free_port() for _ in range(n)]
    with common.serving([common.PYTHON, str(Path(__file__).resolve()), "--ports",
                         ",".join(map(str, ports)), "--latency", str(latency)],
                        ports) as process:
        yield [common.Server(port, process) for port in ports]


async def _serve(ports: list[int], latency: float) -> None:
    for port in ports:
        state = RecordingState(Script(latency_s=latency))
        app = make_app(state)
        app.router.add_get("/bench/stats", _stats_handler(state))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    await asyncio.Event().wait()  # until terminated


def main() -> None:
    parser = argparse.ArgumentParser(description="fake servers on several 127.0.0.1 ports")
    parser.add_argument("--ports", required=True, help="comma-separated, e.g. 8001,8002")
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    asyncio.run(_serve([int(p) for p in args.ports.split(",")], args.latency))


if __name__ == "__main__":
    main()
