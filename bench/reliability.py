"""Benchmark: what the reliability figures add to a fully cached job's reports, in process.

The synthetic job of bench.cached (4 aspects, one judge, an `output` field and a human score per
item) is pre-filled in a diskcache; the cached answers are judged and collected twice, without
and with runner.reduce.reliability.Positions watching, then reliability_rows is timed, and so are
a 1,000-permutation test and a power plan over the pooled scores. No network.
"""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import cached, common
from runner.execute.store.cache import Cache
from runner.job.load import load_job
from runner.prepare import prepare
from runner.reduce.judgments import judge
from runner.reduce.positions import Positions
from runner.reduce.power import plan_power
from runner.reduce.reliability import permutation_p
from runner.report.reliability import reliability_rows
from runner.report.write import collect


def _timed(func: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    value = func()
    return value, time.perf_counter() - started


def reliability(work: Path, quick: bool) -> dict[str, Any]:
    """Seconds for collect with and without the watcher, reliability_rows, permutations and
    a power plan."""
    items = 2500 if quick else 25000
    job_path = common.write_job(work / "job", items, aspects=cached.ASPECTS,
                                base_url="http://127.0.0.1:9/v1")
    entries = cached.prefill(job_path, work / "cache")
    expansion = prepare(load_job(job_path), job_path.parent)
    load = [common.load_avg()]
    with Cache(work / "cache") as cache:
        _, plain_s = _timed(lambda: collect(expansion, judge(expansion, cache), io.BytesIO()))
        positions = Positions(expansion)
        tables, watched_s = _timed(lambda: collect(
            expansion, positions.watch(judge(expansion, cache)), io.BytesIO()))
    rows, rows_s = _timed(lambda: reliability_rows(expansion, tables.cells, positions))
    cells = tables.cells
    scores = cells.score
    human = np.array([cells.items[i].human[cells.judges[j][1]] for i, j in
                      zip(cells.item.tolist(), cells.judge.tolist(), strict=True)], dtype=float)
    other = scores + np.random.default_rng(0).normal(size=scores.size)
    _, perm_s = _timed(lambda: permutation_p("pearson", scores, other, human, 1000))
    _, power_s = _timed(lambda: plan_power(scores, other, human, method="spearman", width=0.05))
    load.append(common.load_avg())
    return {
        "setup": {"tasks": entries, "items": items, "aspects": len(cached.ASPECTS)},
        "collect_s": round(plain_s, 2),
        "collect_with_watcher_s": round(watched_s, 2),
        "reliability_rows_s": round(rows_s, 2),
        "reliability_rows": len(rows),
        "permutation_1000_s": round(perm_s, 2),
        "plan_power_s": round(power_s, 2),
        "n_pooled": int(scores.size),
        "load_avg": load,
        "command": "bench/run.py --only reliability (in process; no network)",
    }
