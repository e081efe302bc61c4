"""Benchmark: what one shard pays, against one process running the whole job.

A fully cached job of 40,000 items x 1 aspect (8 systems a group: 5,000 groups; quick: 8,000
items), pre-filled into one cache folder (bench/cached.py's `prefill`), with its model on one
zero-latency fake server (bench/server.py; the run must make no call: its request count is
checked). Each round runs, one process at a time, `judge run JOB --shard I/8` for I = 0..7,
`judge run JOB --shard 0/1000` (the floor: a shard of ~40 items still starts Python, reads the
whole data file and opens the cache), then `judge run JOB` once over the whole job (the
reports included), each through
common.run_child: its own CPU seconds, peak RSS and wall time. A fully cached run is the
expansion's share of a shard's cost: every request rendered and hashed, every key looked up.

With JUDGE_BENCH_SHARDS_BASE=/path/to/an/older/tree (e.g. a `git worktree add /tmp/shard-base
f08defe`, the split by cache key), the rounds alternate that tree's code and this one's (A, B,
A, B: the machine's speed drifts), each on PYTHONPATH, over the same cache and job:

    JUDGE_BENCH_SHARDS_BASE=/tmp/shard-base .venv/bin/python bench/run.py --only shards \\
        --out /tmp/shards.json
"""

from __future__ import annotations

import compileall
import os
import re
import statistics
from pathlib import Path
from typing import Any

from bench import cached, common

SHARDS = 8
ROUNDS = 2  # per code tree
ASPECTS = ("overall",)


def _judge(tree: Path, *args: str) -> list[str]:
    """`judge ARGS` running the runner package of `tree` (through env: the same process, so
    run_child's figures are the judge's)."""
    return ["env", f"PYTHONPATH={tree}", common.JUDGE, *args]


def _summary(children: list[common.Child]) -> dict[str, Any]:
    cpu = [c.user_s + c.sys_s for c in children]
    rss = [c.max_rss_mib for c in children]
    wall = [c.seconds for c in children]
    return {"cpu_s": {"median": round(statistics.median(cpu), 3), "max": round(max(cpu), 3),
                      "sum": round(sum(cpu), 2)},
            "max_rss_mib": {"median": round(statistics.median(rss), 1),
                            "max": round(max(rss), 1)},
            "wall_s": {"median": round(statistics.median(wall), 3),
                       "max": round(max(wall), 3), "sum": round(sum(wall), 2)}}


def _round(tree: Path, job: Path, cache: Path, work: Path) -> dict[str, Any]:
    """One round on `tree`'s code: the 8 shards one after another, then the whole job."""
    load = [common.load_avg()]
    shards, totals = [], []
    for i in range(SHARDS):
        child = common.run_child(_judge(tree, "run", str(job), "--cache-dir", str(cache),
                                        "--out", str(work / "shard-out"), "--yes",
                                        "--shard", f"{i}/{SHARDS}"), cwd=work, timeout_s=600)
        shards.append(child)
        found = re.search(r"shard \d+/\d+: (\d+) tasks: (\d+) cached", child.stderr)
        totals.append((int(found[1]), int(found[2])) if found else (-1, -1))
    # The floor: a shard holding almost nothing (1 of 1,000: ~40 items of 40,000) still starts
    # Python, reads the whole data file and opens the cache.
    floor = common.run_child(_judge(tree, "run", str(job), "--cache-dir", str(cache), "--out",
                                    str(work / "shard-out"), "--yes", "--shard", "0/1000"),
                             cwd=work, timeout_s=600)
    load.append(common.load_avg())
    whole = common.run_child(_judge(tree, "run", str(job), "--cache-dir", str(cache),
                                    "--out", str(work / "whole-out"), "--yes"),
                             cwd=work, timeout_s=600)
    load.append(common.load_avg())
    return {"shards": [c.figures() for c in shards], "shard_tasks": [t for t, _ in totals],
            "shard_cached": [c for _, c in totals], "one_process": whole.figures(),
            "shard_of_1000": floor.figures(),
            "shard_summary": _summary(shards), "load_avg": load,
            "ok": all(c.exit_code == 0 for c in [*shards, floor, whole])}


def _best(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the lowest of the rounds (the machine's noise only ever adds)."""
    def low(path: tuple[str, ...]) -> float:
        values = []
        for r in rounds:
            value: Any = r
            for part in path:
                value = value[part]
            values.append(value)
        return float(min(values))
    return {"shard_cpu_s_median": low(("shard_summary", "cpu_s", "median")),
            "shard_cpu_s_max": low(("shard_summary", "cpu_s", "max")),
            "shard_rss_mib_median": low(("shard_summary", "max_rss_mib", "median")),
            "shard_rss_mib_max": low(("shard_summary", "max_rss_mib", "max")),
            "shard_wall_s_median": low(("shard_summary", "wall_s", "median")),
            "shards_cpu_s_sum": low(("shard_summary", "cpu_s", "sum")),
            "shard_of_1000_cpu_s": min(r["shard_of_1000"]["cpu_user_s"] + r["shard_of_1000"]
                                       ["cpu_sys_s"] for r in rounds),
            "shard_of_1000_rss_mib": low(("shard_of_1000", "max_rss_mib")),
            "one_process_cpu_s": min(r["one_process"]["cpu_user_s"] + r["one_process"]
                                     ["cpu_sys_s"] for r in rounds),
            "one_process_rss_mib": low(("one_process", "max_rss_mib")),
            "one_process_wall_s": low(("one_process", "seconds"))}


def shard_share(work: Path, quick: bool) -> dict[str, Any]:
    """The benchmark (see the module)."""
    items = 8_000 if quick else 40_000
    here = common.ROOT
    base = os.environ.get("JUDGE_BENCH_SHARDS_BASE")
    trees = {"after": here} if not base else {"before": Path(base), "after": here}
    for tree in trees.values():  # compiled once, as installed code is (common.compile_runner)
        compileall.compile_dir(str(tree / "runner"), quiet=1)
    with common.server(latency=0.0) as fake:
        job = common.write_job(work / "job", items, aspects=ASPECTS, base_url=fake.url,
                               max_retries=0)
        cache = work / "cache"
        entries = cached.prefill(job, cache)
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        probe = [common.speed_probe()]
        for _ in range(ROUNDS):
            for name, tree in trees.items():  # alternated: A, B, A, B
                rounds[name].append(_round(tree, job, cache, work))
        probe.append(common.speed_probe())
        requests = fake.stats().get("requests")
    best = {name: _best(rs) for name, rs in rounds.items()}
    after = best["after"]
    ok = requests == 0 and all(r["ok"] and sum(r["shard_tasks"]) == items
                               and r["shard_cached"] == r["shard_tasks"]
                               for rs in rounds.values() for r in rs)
    result: dict[str, Any] = {
        "setup": {"items": items, "tasks": items * len(ASPECTS), "groups": items // 8,
                  "shards": SHARDS, "cache_entries": entries, "rounds_per_tree": ROUNDS,
                  "trees": {name: str(tree) for name, tree in trees.items()}},
        "rounds": rounds, "best": best, "server_requests": requests, "speed_probe_s": probe,
        "shard_cpu_s": after["shard_cpu_s_median"],
        "shard_rss_mib": after["shard_rss_mib_median"],
        "one_process_cpu_s": after["one_process_cpu_s"],
        "target": "a shard of N pays about 1/N of the expansion (issue 26)",
        "pass": None if quick or "before" not in best else ok and (
            after["shard_cpu_s_median"] < best["before"]["shard_cpu_s_median"]),
        "ok": ok,
        "command": ("JUDGE_BENCH_SHARDS_BASE=/tmp/shard-base bench/run.py --only shards "
                    "--out /tmp/shards.json"),
    }
    if "before" in best:
        result["before_over_after_shard_cpu"] = round(
            best["before"]["shard_cpu_s_median"] / after["shard_cpu_s_median"], 2)
        result["before_over_after_shard_rss"] = round(
            best["before"]["shard_rss_mib_median"] / after["shard_rss_mib_median"], 2)
    return result
