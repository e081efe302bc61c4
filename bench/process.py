"""A whole `judge run` against a whole bare aiohttp process, and where the run's time goes.

`throughput` times the pool inside one interpreter; a user runs a command. Here both sides are
processes started from nothing on the same zero-latency fake server (a fresh one per process,
so its clock marks that process's first and last request):

- `judge run JOB --cache-dir FRESH --out O --yes`: 40,000 calls (10,000 items x 4 aspects;
  `--quick` 8,000), 64 in flight, reports included;
- `python bench/process.py bare BODIES URL 64`: the same request bodies (read from a file the
  benchmark wrote), 64 aiohttp workers through one session, each answer decoded, nothing kept.

Each process's wall time is split by the server's clock: start-up (interpreter, imports, job,
expansion: process start to the first request), calls (first to last request) and the rest
(last request to exit: for judge, storing the last answers, the reports and the exit). The
figure is the median over alternated rounds of bare seconds / judge seconds, whole and for the
calls alone.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: the bare process
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402

ASPECTS = ("coherence", "consistency", "fluency", "relevance")
CONCURRENCY = 64
ROUNDS = 3
TIMEOUT_S = 300.0


def _stamps(server: common.Server) -> tuple[float, float, int]:
    stats = server.stats()
    return stats["first_request_at"], stats["last_request_at"], stats["requests"]


def _timed(args: list[str], work: Path, latency: float = 0.0) -> dict[str, Any]:
    """Run `args` (URL replaced by a fresh server's) and split its wall time."""
    with common.server(latency) as server:
        argv = [server.url if a == "URL" else a for a in args]
        started = time.time()
        child = common.run_child(argv, cwd=work, timeout_s=TIMEOUT_S)
        ended = time.time()
        first, last, requests = _stamps(server)
    if child.exit_code != 0:
        raise RuntimeError(f"{args[:2]} exited {child.exit_code}: {child.stderr[-2000:]}")
    return {**child.figures(), "requests": requests,
            "start_s": round(first - started, 3), "calls_s": round(last - first, 3),
            "rest_s": round(ended - last, 3)}


def whole_process(work: Path, quick: bool) -> dict[str, Any]:
    """The figures of `judge run` and the bare process, alternated over ROUNDS rounds."""
    from runner.job.load import load_job
    from runner.prepare import prepare

    items = 2_000 if quick else 10_000
    job_dir = work / "job"
    # the job's base URL is rewritten per server: a placeholder port, replaced below
    job = common.write_job(job_dir, items, aspects=ASPECTS, base_url="http://127.0.0.1:9/v1",
                           concurrency=CONCURRENCY)
    template = job.read_text(encoding="utf-8")
    bodies = work / "bodies.jsonl"
    with bodies.open("wb") as f:
        for task in prepare(load_job(job), job_dir).tasks():
            f.write(task.body + b"\n")
    runs: dict[str, list[dict[str, Any]]] = {"judge": [], "bare": []}
    for round_ in range(ROUNDS):
        for name in (("judge", "bare") if round_ % 2 == 0 else ("bare", "judge")):
            if name == "bare":
                runs[name].append(_timed([common.PYTHON, str(Path(__file__)), "bare",
                                          str(bodies), "URL", str(CONCURRENCY)], work))
                continue
            # the job names its server: one job file per round, written when the server is up
            runs[name].append(_judge_round(job, template, work, round_))
    ratio = statistics.median(b["seconds"] / j["seconds"]
                              for b, j in zip(runs["bare"], runs["judge"], strict=True))
    calls = statistics.median(b["calls_s"] / j["calls_s"]
                              for b, j in zip(runs["bare"], runs["judge"], strict=True))
    return {"tasks": items * len(ASPECTS), "concurrency": CONCURRENCY,
            "judge_over_bare": round(ratio, 3), "judge_over_bare_calls": round(calls, 3),
            "judge_split_s": _median_split(runs["judge"]),
            "bare_split_s": _median_split(runs["bare"]), "runs": runs}


def _judge_round(job: Path, template: str, work: Path, round_: int) -> dict[str, Any]:
    with common.server(0.0) as server:
        job.write_text(template.replace("http://127.0.0.1:9/v1", server.url), encoding="utf-8")
        cache, out = work / f"cache-{round_}", work / f"out-{round_}"
        started = time.time()
        child = common.run_child([common.JUDGE, "run", str(job), "--cache-dir", str(cache),
                                  "--out", str(out), "--yes"], cwd=work, timeout_s=TIMEOUT_S)
        ended = time.time()
        first, last, requests = _stamps(server)
    if child.exit_code != 0:
        raise RuntimeError(f"judge run exited {child.exit_code}: {child.stderr[-2000:]}")
    return {**child.figures(), "requests": requests, "counts": common.manifest_counts(out),
            "start_s": round(first - started, 3), "calls_s": round(last - first, 3),
            "rest_s": round(ended - last, 3)}


def _median_split(runs: list[dict[str, Any]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in runs), 3)
            for k in ("seconds", "start_s", "calls_s", "rest_s")}


async def _bare(bodies: list[bytes], url: str, concurrency: int) -> None:
    from bench.bare import bare_loop

    timing = await bare_loop(bodies, url, concurrency=concurrency, deadline_s=TIMEOUT_S)
    if timing.answers != len(bodies):
        raise SystemExit(f"bare: {timing.answers} answers of {len(bodies)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["bare"]:
        _, _, path, url, n = sys.argv
        asyncio.run(_bare(Path(path).read_bytes().splitlines(), url + "/chat/completions",
                          int(n)))
