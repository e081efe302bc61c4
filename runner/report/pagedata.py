"""What report.html shows, computed in Python from the tables the other reports use.

The page is one JSON document (see `page_data`) rendered in the browser by a small
hand-written script; runner.report.figures draws the same data with matplotlib. Large series
are reduced here, so the page stays small whatever the job's size: a scatter of more than
`MAX_POINTS` pairs becomes a 2-D histogram, distributions are counts per distinct score
(or per bin).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from runner.expand import Expansion
from runner.reduce.correlate import Row
from runner.report.browser import ItemRows, prompt_text, with_bodies

__all__ = ["page_data"]

MAX_POINTS = 1500  # a scatter with more pairs is sent as a 2-D histogram
BINS = 20  # histogram bins for a continuous scale


def page_data(expansion: Expansion, series: Mapping[tuple[str, str], Mapping[str, list[Row]]],
              corr: Sequence[Mapping[str, Any]],
              summ: Sequence[Mapping[str, Any]], battles: Sequence[Mapping[str, Any]],
              board: tuple[list[str], list[dict[str, Any]]] | None,
              manifest: Mapping[str, Any], rows: ItemRows) -> dict[str, Any]:
    """Everything the page shows, as plain JSON-able values."""
    job = expansion.job
    datasets: dict[str, dict[str, Any]] = {}
    for (dataset, aspect), judges in series.items():
        d = datasets.setdefault(dataset, {"name": dataset, "aspects": []})
        llm = {name: data for name, data in judges.items() if "/" in name}
        d["aspects"].append({
            "aspect": aspect,
            "correlations": [dict(r) for r in corr
                             if r["dataset"] == dataset and r["aspect"] == aspect],
            "scatter": {name: _scatter([(r.judge, r.human) for r in data])
                        for name, data in llm.items()},
            "distribution": {name: _counts([r.judge for r in data]) for name, data in llm.items()},
            "human": _counts([r.human for r in next(iter(judges.values()), [])]),
            "systems": {name: _systems(data) for name, data in llm.items()},
        })
    for s in summ:
        datasets.setdefault(s["dataset"], {"name": s["dataset"], "aspects": []})
    kept = with_bodies(rows.rows(), expansion)
    texts: dict[str, int] = {}
    return {
        "job": job.name,
        "manifest": dict(manifest),
        "prompts": [{"name": p.name, "parser": p.parser, "aspects": list(p.aspects)}
                    for p in job.prompts],
        "levels": list(job.levels), "methods": list(job.methods), "bootstrap": job.bootstrap,
        "datasets": list(datasets.values()),
        "summary": [dict(s) for s in summ],
        "failures": [{"dataset": k[0], "prompt": k[1], "aspect": k[2], "model": k[3],
                      "type": k[4], "examples": v} for k, v in rows.examples.items()],
        "battles": [dict(b) for b in battles],
        "leaderboard": {"columns": board[0], "rows": board[1]} if board else None,
        "items": {"seen": rows.seen, "capped": rows.capped, "cap": rows.cap,
                  "columns": ["dataset", "item", "system", "aspect", "judge", "score",
                              "human", "diff", "status", "message", "raw", "prompt"],
                  "rows": [[r.dataset, r.item, r.system, r.aspect, r.judge, r.score, r.human,
                            r.diff, r.status, r.message, r.raw,
                            texts.setdefault(prompt_text(r.body), len(texts))] for r in kept],
                  "prompts": list(texts)},
    }


def _finite(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and not math.isnan(v)]


def _scatter(pairs: Sequence[tuple[float | None, float | None]]) -> dict[str, Any]:
    """Judge (x) against human (y): the points, or a 2-D histogram, with the least-squares
    line of human on judge."""
    xy = [(x, y) for x, y in pairs if x is not None and y is not None
          and not math.isnan(x) and not math.isnan(y)]
    out: dict[str, Any] = {"n": len(xy), "fit": _fit(xy)}
    if len(xy) <= MAX_POINTS:
        out["points"] = [[round(x, 4), round(y, 4)] for x, y in xy]
        return out
    xs, ys = _edges([x for x, _ in xy]), _edges([y for _, y in xy])
    cells = Counter((_bin(x, xs), _bin(y, ys)) for x, y in xy)
    out["hist"] = {"x": xs, "y": ys, "cells": [[i, j, c] for (i, j), c in cells.items()]}
    return out


def _fit(xy: Sequence[tuple[float, float]]) -> list[float] | None:
    if len(xy) < 2 or len({x for x, _ in xy}) < 2:
        return None
    slope, intercept = statistics.linear_regression([x for x, _ in xy], [y for _, y in xy])
    return [slope, intercept]


def _edges(values: Sequence[float]) -> list[float]:
    """Bin edges: one bin per distinct value on an integer-like scale, else BINS equal bins."""
    distinct = sorted(set(values))
    if len(distinct) <= 2 * BINS:
        steps = [b - a for a, b in itertools.pairwise(distinct)] or [1.0]
        half = min(steps) / 2
        return [v - half for v in distinct] + [distinct[-1] + half]
    lo, hi = distinct[0], distinct[-1]
    return [lo + (hi - lo) * i / BINS for i in range(BINS + 1)]


def _bin(value: float, edges: Sequence[float]) -> int:
    lo, hi = 0, len(edges) - 2
    while lo < hi:  # the last edge <= value, clamped to the bins
        mid = (lo + hi + 1) // 2
        if edges[mid] <= value:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _counts(values: Sequence[float | None]) -> dict[str, Any]:
    """Counts per distinct value (few values) or per bin, plus the missing count."""
    finite = _finite(values)
    out: dict[str, Any] = {"missing": len(values) - len(finite)}
    if not finite:
        out["edges"], out["counts"] = [], []
        return out
    edges = _edges(finite)
    counts = [0] * (len(edges) - 1)
    for v in finite:
        counts[_bin(v, edges)] += 1
    out["edges"], out["counts"] = [round(e, 6) for e in edges], counts
    return out


def _systems(data: Sequence[Row]) -> dict[str, Any]:
    """Per system: judge and human means (and judge sd); and the pairwise accuracy of the
    judge's system ranking against the humans' (pairs the humans do not tie)."""
    by: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for r in data:
        if r.system and r.judge is not None and not math.isnan(r.judge):
            by[r.system][0].append(r.judge)
            by[r.system][1].append(r.human)
    systems: list[dict[str, Any]] = [{"system": s, "n": len(j), "judge": statistics.fmean(j),
                "judge_sd": statistics.stdev(j) if len(j) > 1 else 0.0,
                "human": statistics.fmean(h)} for s, (j, h) in sorted(by.items())]
    agree = total = 0
    for a, b in itertools.combinations(systems, 2):
        dh = a["human"] - b["human"]
        if dh == 0:
            continue
        total += 1
        agree += (a["judge"] - b["judge"]) * dh > 0
    return {"rows": systems, "pairs": total,
            "pairwise_accuracy": agree / total if total else None}
