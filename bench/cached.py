"""Benchmark 3: a fully cached 100,000-task job rerun through the real CLI, then rescored.

The cache is pre-filled directly (batched transactions) with the records `execute` would have
stored for answers from tests/fakeserver.py, under the keys `runner.expand` computes. The job's
model points at a closed 127.0.0.1 port with --max-retries 0, so any task not found in the cache
would fail the run (exit 1) instead of being silently called.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import diskcache
import orjson

from bench import common
from runner.execute.cache import NEVER
from runner.expand import Task, prepare
from runner.job.load import load_job
from tests.fakeserver import default_reply

ASPECTS = ("coherence", "consistency", "fluency", "relevance")
TARGET_S = 10.0


def record(task: Task, endpoint: str) -> dict[str, Any]:
    """What `execute` stores for one answer of the fake server."""
    request = orjson.loads(task.body)
    usage = {"prompt_tokens": task.prompt_tokens, "completion_tokens": 3,
             "total_tokens": task.prompt_tokens + 3}
    response = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
                "model": request["model"], "usage": usage,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": default_reply(request)}}]}
    return {"request": request, "endpoint": endpoint, "response": response, "usage": usage,
            "latency_s": 0.0, "time": 0.0, "source": "api"}


def _batches(tasks: Iterator[Task], size: int) -> Iterator[list[Task]]:
    while batch := list(islice(tasks, size)):
        yield batch


def prefill(job_path: Path, cache_dir: Path) -> int:
    """Store an answer for every task of the job; returns the number of entries."""
    job = load_job(job_path)
    endpoints = {m.name: m.endpoint for m in job.models}
    # The same settings as runner.execute.cache.Cache: no eviction, a limit nobody reaches.
    disk = diskcache.Cache(str(cache_dir), eviction_policy="none", size_limit=NEVER,
                           cull_limit=0)
    try:
        for batch in _batches(prepare(job, job_path.parent).tasks(), 2000):
            with disk.transact():
                for task in batch:
                    disk.set(task.key, orjson.dumps(record(task, endpoints[task.model])))
        return len(disk)
    finally:
        disk.close()


def _counts(out: Path) -> dict[str, Any]:
    try:
        counts: dict[str, Any] = orjson.loads((out / "manifest.json").read_bytes())["counts"]
        return counts
    except (OSError, KeyError, orjson.JSONDecodeError):
        return {}


def cached_rerun(work: Path, quick: bool) -> dict[str, Any]:
    """Benchmark 3."""
    items = 5000 if quick else 25000
    tasks = items * len(ASPECTS)
    dead = f"http://127.0.0.1:{common.free_port()}/v1"  # nothing listens: a call would fail
    job = common.write_job(work / "job", items, aspects=ASPECTS, base_url=dead)
    cache = work / "cache"
    started = time.perf_counter()
    entries = prefill(job, cache)
    prefill_s = time.perf_counter() - started
    load = [common.load_avg()]
    run = common.run_child([common.JUDGE, "run", str(job), "--cache-dir", str(cache), "--out",
                            str(work / "run"), "--max-retries", "0", "--yes"],
                           cwd=work, timeout_s=300)
    load.append(common.load_avg())
    rescore = common.run_child([common.JUDGE, "rescore", str(job), "--cache-dir", str(cache),
                                "--out", str(work / "rescore")], cwd=work, timeout_s=300)
    load.append(common.load_avg())
    ok = run.exit_code == 0 and entries == tasks
    return {
        "setup": {"tasks": tasks, "items": items, "aspects": len(ASPECTS),
                  "cache_entries": entries, "prefill_s": round(prefill_s, 1),
                  "cache_mb": round(sum(f.stat().st_size for f in cache.rglob("*")) / 1e6, 1)},
        "target": f"judge run (all cached) < {TARGET_S:g} s wall",
        "run": {**run.figures(), "counts": _counts(work / "run"),
                "stderr_tail": run.stderr.strip().splitlines()[-3:]},
        "run_seconds": round(run.seconds, 2),
        "pass": None if quick else ok and run.seconds < TARGET_S,  # quick: a smaller job
        "rescore": {**rescore.figures(), "stderr_tail": rescore.stderr.strip().splitlines()[-3:]},
        "rescore_tasks_per_s": round(tasks / rescore.seconds) if rescore.exit_code == 0 else None,
        "load_avg": load,
        "command": f"judge run JOB --cache-dir CACHE --out OUT --max-retries 0 --yes; "
                   f"judge rescore JOB --cache-dir CACHE --out OUT  ({tasks} tasks)",
    }
