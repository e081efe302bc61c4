"""Benchmark 3: a fully cached 100,000-task job rerun through the real CLI, then rescored.

The cache is pre-filled through `Cache.put_many` (the pool's own store) with the records
`execute` would have stored for answers from tests/fakeserver.py, under the keys
`runner.expand` computes. The job's model points at a closed 127.0.0.1 port with
--max-retries 0, so any task not found in the cache would fail the run (exit 1) instead of
being silently called.

Then `phases` profiles the same run in a fresh interpreter, one stage at a time (each stage's
output materialised before the next starts), CPU and wall seconds per stage:

    python -m bench.cached JOB CACHE OUT    # prints the phases as JSON
"""

from __future__ import annotations

import gc
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.tasks import Task

# Everything else is imported inside the functions: `python -m bench.cached` times the imports
# of a run from an interpreter that has loaded nothing of the runner's yet.

ASPECTS = ("coherence", "consistency", "fluency", "relevance")
TARGET_S = 3.0  # issue #13: judge run and judge rescore of the cached 100k job, each
REPEATS = 3  # each command is timed this many times; the fastest is the figure


def record(task: Task, endpoint: str) -> dict[str, Any]:
    """What `execute` stores for one answer of the fake server."""
    import orjson

    from tests.fakeserver import default_reply
    request = orjson.loads(task.body)
    usage = {"prompt_tokens": task.prompt_tokens, "completion_tokens": 3,
             "total_tokens": task.prompt_tokens + 3}
    response = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
                "model": request["model"], "usage": usage,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": default_reply(request)}}]}
    return {"request": request, "endpoint": endpoint, "response": response, "usage": usage,
            "latency_s": 0.0, "time": 0.0, "source": "api"}


def prefill(job_path: Path, cache_dir: Path) -> int:
    """Store an answer for every task of the job, as the pool stores them (`Cache.put_many`);
    returns the number of entries."""
    from runner.execute.store.cache import Cache
    from runner.job.load import load_job
    from runner.prepare import prepare
    job = load_job(job_path)
    endpoints = {m.name: m.endpoint for m in job.models}
    with Cache(cache_dir) as cache:
        cache.put_many((task.key, record(task, endpoints[task.model]))
                       for task in prepare(job, job_path.parent, stream=True).tasks())
        return cache.stats()["entries"]


def cached_rerun(work: Path, quick: bool) -> dict[str, Any]:
    """Benchmark 3."""
    from bench import common
    items = 5000 if quick else 25000
    tasks = items * len(ASPECTS)
    dead = f"http://127.0.0.1:{common.free_port()}/v1"  # nothing listens: a call would fail
    job = common.write_job(work / "job", items, aspects=ASPECTS, base_url=dead)
    cache = work / "cache"
    started = time.perf_counter()
    entries = prefill(job, cache)
    prefill_s = time.perf_counter() - started
    load, probe = [common.load_avg()], [common.speed_probe()]
    runs: dict[str, list[common.Child]] = {"run": [], "rescore": []}
    for _ in range(REPEATS):  # alternating: the machine's speed drifts
        runs["run"].append(common.run_child(
            [common.JUDGE, "run", str(job), "--cache-dir", str(cache), "--out",
             str(work / "run"), "--max-retries", "0", "--yes"], cwd=work, timeout_s=300))
        runs["rescore"].append(common.run_child(
            [common.JUDGE, "rescore", str(job), "--cache-dir", str(cache), "--out",
             str(work / "rescore")], cwd=work, timeout_s=300))
        load.append(common.load_avg())
    probe.append(common.speed_probe())
    run, rescore = (min(runs[name], key=lambda c: c.seconds) for name in ("run", "rescore"))
    profiled = subprocess.run([common.PYTHON, "-m", "bench.cached", str(job), str(cache),
                               str(work / "phases")], cwd=common.ROOT, capture_output=True,
                              text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    load.append(common.load_avg())
    ok = all(c.exit_code == 0 for cs in runs.values() for c in cs) and entries == tasks
    return {
        "setup": {"tasks": tasks, "items": items, "aspects": len(ASPECTS),
                  "cache_entries": entries, "prefill_s": round(prefill_s, 1),
                  "cache_mb": round(sum(f.stat().st_size for f in cache.rglob("*")) / 1e6, 1)},
        "target": f"judge run and judge rescore (all cached) < {TARGET_S:g} s wall each",
        "run": {**run.figures(), "counts": common.manifest_counts(work / "run"),
                "stderr_tail": run.stderr.strip().splitlines()[-3:]},
        "run_seconds": round(run.seconds, 2),
        "rescore_seconds": round(rescore.seconds, 2),
        "all_seconds": {name: [round(c.seconds, 2) for c in children]
                        for name, children in runs.items()},
        # quick: a smaller job
        "pass": None if quick else ok and max(run.seconds, rescore.seconds) < TARGET_S,
        "rescore": {**rescore.figures(), "stderr_tail": rescore.stderr.strip().splitlines()[-3:]},
        "rescore_tasks_per_s": round(tasks / rescore.seconds) if rescore.exit_code == 0 else None,
        "phases": (json.loads(profiled.stdout) if profiled.returncode == 0
                   else {"error": profiled.stderr.strip().splitlines()[-3:]}),
        "load_avg": load,
        "speed_probe_s": probe,
        "command": f"judge run JOB --cache-dir CACHE --out OUT --max-retries 0 --yes; "
                   f"judge rescore JOB --cache-dir CACHE --out OUT  ({tasks} tasks)",
    }


class _Clock:
    """CPU and wall seconds of consecutive stages, the first from the process's start."""

    def __init__(self) -> None:
        self.stages: dict[str, dict[str, float]] = {}
        self.cpu, self.wall = 0.0, time.perf_counter() - _age()

    def lap(self, name: str) -> None:
        cpu, wall = time.process_time(), time.perf_counter()
        self.stages[name] = {"cpu_s": round(cpu - self.cpu, 3),
                             "wall_s": round(wall - self.wall, 3)}
        self.cpu, self.wall = cpu, wall

    def timed(self, name: str, step: Callable[[], Any]) -> Any:
        value = step()
        self.lap(name)
        return value


def _age() -> float:
    """Seconds since this process started (Linux: /proc, 10 ms resolution)."""
    ticks = os.sysconf("SC_CLK_TCK")
    started = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
    return float(Path("/proc/uptime").read_text().split()[0]) - started


def phases(job: Path, cache: Path, out: Path) -> dict[str, dict[str, float]]:
    """`judge run JOB` (all cached) stage by stage, in this (fresh) interpreter: the imports
    a run makes, selecting the job, the pool (expansion, cache lookups, dispatch), judging
    (reading and parsing every answer), then each report. Expansion, the pool's lookups and
    the judge's reads are also timed alone, as extra stages (marked "alone")."""
    clock = _Clock()
    gc.set_threshold(100_000, 50, 100)  # as runner.cli.main.main
    from runner import api
    from runner.cli import runcmd
    from runner.execute.stats import RunStats
    from runner.execute.store.backend import cached_flags
    from runner.reduce.battle import Battles
    from runner.reduce.judgments import judge
    from runner.reduce.positions import Positions
    from runner.report import write
    from runner.report.browser import ItemRows
    from runner.report.html import render
    from runner.report.markdown import reliability_markdown
    from runner.report.pagedata import page_data
    from runner.report.reliability import csv_bytes, reliability_rows
    from runner.session.report import BatchAnswers, manifest
    from runner.session.select import open_selected
    clock.lap("import (the modules judge run loads)")

    sel = clock.timed("select: load the job and its data", lambda: api.selection(
        str(job), cache_dir=cache, out=out))
    expansion = sel.expansion
    clock.timed("expansion alone (every task, key and body)",
                lambda: sum(1 for _ in expansion.tasks()))
    judged: list[Task] = []
    run = api.Run(sel, started=0.0, command="bench", environ=os.environ,
                  dispatched=judged)  # type: ignore[arg-type]  # a list: as TaskLog, no bodies dropped
    stats = clock.timed("pool: expansion + lookups + dispatch", lambda: runcmd._execute(run))
    sel = run.sel
    keys = [t.key for t in judged]
    with open_selected(sel) as c:
        clock.timed("cache lookups alone (has_many over every key)",
                    lambda: sum(hit for _, hit in cached_flags(c, keys, str)))
        clock.timed("cache reads alone (get_many over every key)",
                    lambda: [c.get_many(keys[i:i + 128]) for i in range(0, len(keys), 128)])
    with open_selected(sel) as c:
        judgments = clock.timed("judge: read + parse every answer", lambda: list(judge(
            expansion, c, failures=stats.failures, fresh=frozenset(stats.called),
            tasks=judged)))
    answers, battles, positions, rows = (BatchAnswers(), Battles(expansion),
                                         Positions(expansion), ItemRows())
    buffer = io.BytesIO()
    tables = clock.timed("collect: judgments.jsonl lines, cells, item rows", lambda: write.collect(
        expansion, rows.watch(battles.watch(positions.watch(answers.watch(judgments)))), buffer))
    clock.timed("write judgments.jsonl", lambda: write.write_atomic(
        out / "judgments.jsonl", buffer.getvalue()))
    def scores_csv() -> None:
        with write.atomic_file(out / "scores.csv") as f:
            write.scores_csv(tables, f)
    clock.timed("scores.csv", scores_csv)
    series = clock.timed("judge_rows (judge vs human rows)",
                         lambda: write.judge_rows(expansion, tables))
    corr = clock.timed("correlations (1,000 bootstrap resamples)",
                       lambda: write.correlations(expansion, tables, series))
    summ = clock.timed("summary", lambda: write.summary(tables))
    reliability = clock.timed("reliability rows", lambda: reliability_rows(
        expansion, tables.cells, positions))
    clock.timed("report.md, correlations/summary/reliability.csv", lambda: (
        write._markdown(expansion, corr, summ, answers.notes) + reliability_markdown(reliability),
        csv_bytes(write.CORRELATION_COLUMNS, corr), csv_bytes(write.SUMMARY_COLUMNS, summ)))
    made = clock.timed("manifest", lambda: manifest(sel, RunStats(), time.time(), "judge run"))
    clock.timed("report.html", lambda: write.write_atomic(out / "report.html", render(page_data(
        expansion, series, corr, summ, battles.rows(), None, made, rows, reliability))))
    return clock.stages


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as `judge` runs (runner.cli.main)
    from bench.common import compile_runner
    compile_runner()
    print(json.dumps(phases(*map(Path, sys.argv[1:4])), indent=1))
