"""Benchmarks 5 and 5b: memory of `judge plan` and of a fully cached `judge run`.

plan_memory: peak RSS (a subprocess, wait4 rusage) of `judge plan` over synthetic user JSONL
(each line ~580 bytes: a ~300-character source shared by the 8 systems of a group, a
~120-character output, ids and human scores): 250k items x 4 aspects (1,000,000 tasks), in the
full run also 100k items x 2 prompts x 5 aspects (1,000,000) and 2.5M items x 4 aspects
(10,000,000 tasks; ~6 minutes on the 2-core machine).

run_memory: peak RSS of `judge run` over the same kind of job with every answer in the cache,
at two sizes (full: 300k and 1M tasks; --quick: 20k and 60k), and the growth per task between
them; then, in this process under tracemalloc, what holds the memory of a 100k-task cached run
(--quick: 20k), stage by stage, in bytes per task. The cache is pre-filled with compact records
(the response, usage and source: all the reports read; no request copy) through Cache.put_many.
MB here is 10^6 bytes; MiB is also recorded.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

import runner.report.write as write
from bench import common
from runner.execute.store.cache import Cache
from runner.job.load import load_job
from runner.prepare import prepare
from runner.reduce.judgments import judge
from runner.selection import TaskSelection
from runner.session import pool, select
from runner.tasks import Task
from tests.fakeserver import default_reply

TARGET_MB = 500.0  # issue 13: plan over 10,000,000 tasks
RUN_TARGET_1M_MB, RUN_TARGET_10M_MB = 300.0, 1000.0  # issue 38: a cached run's largest process
ASPECTS = ("coherence", "consistency", "fluency", "relevance")
SHAPES = {  # name: (items, prompts, aspects)
    "250k_items_x_4_aspects": (250_000, 1, ASPECTS),
    "100k_items_x_2_prompts_x_5_aspects": (100_000, 2, (*ASPECTS, "overall")),
    "2500k_items_x_4_aspects": (2_500_000, 1, ASPECTS),
}
# What write_reports calls, watched one at a time under tracemalloc (absent names are skipped).
STAGES = ("collect", "scores_csv", "judge_rows", "correlations", "summary", "reliability_rows",
          "leaderboard", "page_data", "render")


def _plan(work: Path, name: str, scale: float) -> dict[str, Any]:
    items, prompts, aspects = SHAPES[name]
    items = int(items * scale)
    folder = work / name
    started = time.perf_counter()
    job = common.write_job(folder, items, aspects=aspects, prompts=prompts,
                           base_url="http://127.0.0.1:9/v1")
    write_s = time.perf_counter() - started
    child = common.run_child([common.JUDGE, "plan", str(job), "--cache-dir",
                              str(folder / "cache")], cwd=folder, timeout_s=1200)
    tasks = sum(int(n) for n in re.findall(r"(\d+) tasks", child.stdout))
    peak_mb = child.max_rss_mib * 2**20 / 1e6
    result = {"items": items, "tasks": tasks, "dataset_mb": round(
                  (folder / "synth.jsonl").stat().st_size / 1e6, 1),
              "write_dataset_s": round(write_s, 1), **child.figures(),
              "max_rss_mb": round(peak_mb, 1),
              "tasks_per_s": round(tasks / child.seconds) if child.seconds else None,
              "pass": child.exit_code == 0 and peak_mb < TARGET_MB,
              "stdout": child.stdout.strip().splitlines()[-3:]}
    (folder / "synth.jsonl").unlink()  # 1.4 GB at 10M tasks
    return result


def plan_memory(work: Path, quick: bool) -> dict[str, Any]:
    """Benchmark 5."""
    names = list(SHAPES)[:1] if quick else list(SHAPES)
    scale = 0.2 if quick else 1.0
    shapes = {name: _plan(work, name, scale) for name in names}
    main, largest = shapes[names[0]], shapes[names[-1]]
    return {"setup": {"scale": scale, "shapes": {n: SHAPES[n][:2] + (len(SHAPES[n][2]),)
                                                 for n in names}},
            "target": f"judge plan peak RSS < {TARGET_MB:g} MB (10^6 bytes) at 10,000,000 tasks",
            "max_rss_mb": main["max_rss_mb"],
            "max_rss_mb_10m": None if quick else largest["max_rss_mb"],
            "seconds_10m": None if quick else largest["seconds"],
            "pass": None if quick else all(s["pass"] for s in shapes.values()),
            "shapes": shapes,
            "command": "judge plan JOB --cache-dir CACHE"}


def _compact(task: Task) -> dict[str, Any]:
    """The fake server's answer as a record with only what the reports read."""
    reply = default_reply(orjson.loads(task.body))
    return {"response": {"choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": reply}}]},
            "usage": {"prompt_tokens": task.prompt_tokens, "completion_tokens": 3},
            "source": "api"}


def _cached_job(folder: Path, items: int) -> tuple[Path, dict[str, Any]]:
    """A job of items x 4 aspects whose model is a closed port, every answer in the cache."""
    dead = f"http://127.0.0.1:{common.free_port()}/v1"  # a cache miss would fail the run
    started = time.perf_counter()
    job = common.write_job(folder, items, aspects=ASPECTS, base_url=dead)
    with Cache(folder / "cache") as cache:
        stored = cache.put_many((t.key, _compact(t))
                                for t in prepare(load_job(job), folder, stream=True).tasks())
    return job, {"items": items, "tasks": items * len(ASPECTS), "cache_entries": stored,
                 "prefill_s": round(time.perf_counter() - started, 1)}


def _run(folder: Path, items: int) -> dict[str, Any]:
    job, setup = _cached_job(folder, items)
    child = common.run_child([common.JUDGE, "run", str(job), "--cache-dir",
                              str(folder / "cache"), "--out", str(folder / "out"),
                              "--max-retries", "0", "--yes"], cwd=folder, timeout_s=1800)
    peak_mb = child.max_rss_mib * 2**20 / 1e6
    return {**setup, **child.figures(), "max_rss_mb": round(peak_mb, 1),
            "bytes_per_task": round(peak_mb * 1e6 / setup["tasks"]),
            "stderr_tail": child.stderr.strip().splitlines()[-2:]}


class _Watch:
    """Traced memory around calls of write_reports' stages: what each holds on return and at
    its peak, over what was traced when it was called."""

    def __init__(self) -> None:
        self.stages: dict[str, dict[str, int]] = {}

    def wrap(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def watched(*args: Any, **kwargs: Any) -> Any:
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            try:
                return func(*args, **kwargs)
            finally:
                now, peak = tracemalloc.get_traced_memory()
                self.stages[name] = {"kept": now - before, "peak": peak - before}
        return watched

    @staticmethod
    def traced() -> int:
        return tracemalloc.get_traced_memory()[0]


def _holders(folder: Path, items: int) -> dict[str, Any]:
    """A cached run's stages in this process under tracemalloc: bytes per task each keeps."""
    job, setup = _cached_job(folder, items)
    tasks, watch = setup["tasks"], _Watch()
    originals = {n: getattr(write, n) for n in STAGES if hasattr(write, n)}
    tracemalloc.start()
    try:
        for name, func in originals.items():
            setattr(write, name, watch.wrap(name, func))
        base = watch.traced()
        sel = select.select(TaskSelection(job=job, cache_dir=folder / "cache"), data_dir=folder)
        items_b = watch.traced() - base
        log = pool.TaskLog()
        tracemalloc.reset_peak()
        with select.open_selected(sel) as cache:
            asyncio.run(pool.run_pool(
                sel, sel.job, cache, stop=asyncio.Event(), key_reader=lambda _: lambda: None,
                offline=False, budget=None, on_progress=lambda _: None, dispatched=log))
            pool_peak = tracemalloc.get_traced_memory()[1] - base - items_b
            log_b = watch.traced() - base - items_b
            write.write_reports(folder / "out", sel.expansion, judge(sel.expansion, cache,
                                                                      tasks=log.drain()), {})
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
        for name, func in originals.items():
            setattr(write, name, func)
    per = {"items (Item objects, held all run)": items_b,
           "TaskLog (the run's tasks, for the reports)": log_b,
           "pool, during dispatch (key hashes, lookup batches)": pool_peak - log_b}
    for name, s in watch.stages.items():
        per[f"{name}: kept on return"] = s["kept"]
        per[f"{name}: peak inside"] = s["peak"]
    return {**setup, "traced_peak_mb": round(peak / 1e6, 1),
            "mb": {k: round(v / 1e6, 1) for k, v in per.items()},
            "bytes_per_task": {k: round(v / tasks) for k, v in per.items()}}


def run_memory(work: Path, quick: bool) -> dict[str, Any]:
    """Benchmark 5b."""
    small, large = (5_000, 15_000) if quick else (75_000, 250_000)
    runs = {f"{items * len(ASPECTS)}_tasks": _run(work / f"run{items}", items)
            for items in (small, large)}
    a, b = runs.values()
    growth = (b["max_rss_mb"] - a["max_rss_mb"]) * 1e6 / (b["tasks"] - a["tasks"])
    projected = b["max_rss_mb"] + growth * (10_000_000 - b["tasks"]) / 1e6  # linear: a floor
    holders = _holders(work / "holders", 5_000 if quick else 25_000)
    return {"setup": {"sizes_tasks": [r["tasks"] for r in runs.values()]},
            "target": f"cached judge run, largest process <= {RUN_TARGET_1M_MB:g} MB at "
                      f"1,000,000 tasks and <= {RUN_TARGET_10M_MB:g} MB at 10,000,000 (projected)",
            "max_rss_mb": b["max_rss_mb"], "tasks": b["tasks"],
            "growth_bytes_per_task": round(growth), "projected_10m_mb": round(projected),
            "pass": None if quick else (b["max_rss_mb"] <= RUN_TARGET_1M_MB
                                        and projected <= RUN_TARGET_10M_MB),
            "runs": runs, "holders": holders,
            "command": "judge run JOB --cache-dir CACHE --out OUT --max-retries 0 --yes"}
