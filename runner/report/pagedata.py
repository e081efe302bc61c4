"""What report.html shows, computed in Python from the tables the other reports use.

The page is one JSON document (see `page_data`) rendered in the browser by a small
hand-written script; runner.report.figures draws the same data with matplotlib. Large series
are reduced here, so the page stays small whatever the job's size: a scatter of more than
`MAX_POINTS` pairs becomes a 2-D histogram, distributions are counts per distinct score
(or per bin).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from runner.expand import Expansion
from runner.reduce.series import Series
from runner.report.browser import ItemRows, prompt_text, with_bodies
from runner.report.headline import system_note, unparsed_judges
from runner.report.relpage import reliability_page

__all__ = ["page_data", "with_reliability"]

MAX_POINTS = 1500  # a scatter with more pairs is sent as a 2-D histogram
BINS = 20  # histogram bins for a continuous scale


def page_data(expansion: Expansion, series: Mapping[tuple[str, str], Mapping[str, Series]],
              corr: Sequence[Mapping[str, Any]],
              summ: Sequence[Mapping[str, Any]], battles: Sequence[Mapping[str, Any]],
              board: tuple[list[str], list[dict[str, Any]]] | None,
              manifest: Mapping[str, Any], rows: ItemRows,
              reliability: Sequence[Mapping[str, Any]] = (), *,
              ranking: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Everything the page shows, as plain JSON-able values. `reliability` is
    reliability.csv's rows, shown as they are (or given later: `with_reliability`);
    `ranking`, ranking.csv's (shown with the battles)."""
    job = expansion.job
    juries = {j.name for j in job.juries}
    datasets: dict[str, dict[str, Any]] = {}
    for (dataset, aspect), judges in series.items():
        d = datasets.setdefault(dataset, {"name": dataset, "aspects": []})
        llm = {name: data for name, data in judges.items() if "/" in name or name in juries}
        arrays = {name: _arrays(data) for name, data in llm.items()}  # each made once
        first = next(iter(judges), "")  # the human scores: any judge's rows have them
        human = (arrays[first] if first in arrays
                 else _arrays(judges[first]) if first in judges else (np.zeros(0),) * 2)[1]
        d["aspects"].append({
            "aspect": aspect,
            "correlations": [dict(r) for r in corr
                             if r["dataset"] == dataset and r["aspect"] == aspect],
            "scatter": {name: _scatter(data, arrays[name]) for name, data in llm.items()},
            "distribution": {name: _counts(arrays[name][0]) for name in llm},
            "human": _counts(human),
            "systems": {name: _systems(data, arrays[name]) for name, data in llm.items()},
            "system_note": system_note([r for r in corr if r["dataset"] == dataset
                                        and r["aspect"] == aspect]),
        })
    for s in summ:
        datasets.setdefault(s["dataset"], {"name": s["dataset"], "aspects": []})
    kept = with_bodies(rows.rows(), expansion)
    texts: dict[str, int] = {}
    sampled = any(p.samples > 1 for p in job.prompts)  # a sample column only where it tells
    return {
        "job": job.name,
        "manifest": dict(manifest),
        "prompts": [{"name": p.name, "parser": p.parser, "aspects": list(p.aspects),
                     "samples": p.samples} for p in job.prompts],
        "unparsed": [{"judge": j, "unparsed": u, "answered": a}
                     for j, u, a in unparsed_judges(summ)],
        "levels": list(job.levels), "methods": list(job.methods), "bootstrap": job.bootstrap,
        "datasets": list(datasets.values()),
        "summary": [dict(s) for s in summ],
        "failures": [{"dataset": k[0], "prompt": k[1], "aspect": k[2], "model": k[3],
                      "type": k[4], "examples": v} for k, v in rows.examples.items()],
        "battles": [dict(b) for b in battles],
        "ranking": [dict(r) for r in ranking],
        "leaderboard": {"columns": board[0], "rows": board[1]} if board else None,
        "reliability": reliability_page(expansion, reliability),
        "items": {"seen": rows.seen, "capped": rows.capped, "cap": rows.cap,
                  "columns": ["dataset", "item", "system", "aspect", "judge",
                              *(["sample"] if sampled else []), "score",
                              "human", "diff", "status", "message", "raw", "prompt"],
                  "rows": [[r.dataset, r.item, r.system, r.aspect, r.judge,
                            *([r.sample] if sampled else []), r.score, r.human,
                            r.diff, r.status, r.message, r.raw,
                            texts.setdefault(prompt_text(r.body), len(texts))] for r in kept],
                  "prompts": list(texts)},
    }


def with_reliability(page: dict[str, Any], expansion: Expansion,
                     reliability: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`page` (page_data's) with reliability.csv's rows in it: the page made while they are
    computed on the other core (runner.report.write)."""
    page["reliability"] = reliability_page(expansion, reliability)
    return page


def _arrays(data: Series) -> tuple[Any, Any]:
    """Judge and human scores as float arrays (NaN where the judge gave none)."""
    return data.judge, data.human


def _scatter(data: Series, arrays: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """Judge (x) against human (y): the points, or a 2-D histogram, with the least-squares
    line of human on judge."""
    x, y = _arrays(data) if arrays is None else arrays
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    out: dict[str, Any] = {"n": int(x.size), "fit": _fit(x, y)}
    if x.size <= MAX_POINTS:
        out["points"] = np.round(np.column_stack([x, y]), 4).tolist()
        return out
    xs, ys = _edges(x), _edges(y)
    grid, _, _ = np.histogram2d(x, y, bins=[xs, ys])
    i, j = np.nonzero(grid)
    out["hist"] = {"x": xs.tolist(), "y": ys.tolist(),
                   "cells": np.column_stack([i, j, grid[i, j]]).astype(int).tolist()}
    return out


def _fit(x: Any, y: Any) -> list[float] | None:
    if x.size < 2 or np.ptp(x) == 0:
        return None
    slope, intercept = np.polyfit(x, y, 1)
    return [float(slope), float(intercept)]


def _edges(values: Any) -> Any:
    """Bin edges: one bin per step of a regular scale (1-5 stars, halves), else BINS equal
    bins."""
    distinct = np.unique(values)
    if distinct.size == 1:
        return np.array([distinct[0] - 0.5, distinct[0] + 0.5])
    step = float(np.min(np.diff(distinct)))
    span = (distinct[-1] - distinct[0]) / step
    on_grid = np.allclose((distinct - distinct[0]) / step,
                          np.round((distinct - distinct[0]) / step), atol=0.1)
    if on_grid and span < 2 * BINS:
        return distinct[0] - step / 2 + step * np.arange(round(span) + 2)
    return np.linspace(distinct[0], distinct[-1], BINS + 1)


def _counts(values: Any) -> dict[str, Any]:
    """Counts per distinct value (few values) or per bin, plus the missing count."""
    finite = values[~np.isnan(values)]
    out: dict[str, Any] = {"missing": int(values.size - finite.size)}
    if not finite.size:
        out["edges"], out["counts"] = [], []
        return out
    edges = _edges(finite)
    counts, _ = np.histogram(finite, bins=edges)
    out["edges"], out["counts"] = np.round(edges, 6).tolist(), counts.tolist()
    return out


def _systems(data: Series, arrays: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """Per system: judge and human means (and judge sd); and the pairwise accuracy of the
    judge's system ranking against the humans' (pairs the humans do not tie)."""
    judge, human = _arrays(data) if arrays is None else arrays
    names = np.array(data.labels.systems, dtype=object)[data.system] if len(data) else \
        np.zeros(0, dtype=object)
    ok = ~np.isnan(judge) & (names != "")
    if not ok.any():
        return {"rows": [], "pairs": 0, "pairwise_accuracy": None}
    systems, index = np.unique(names[ok].astype(str), return_inverse=True)
    n = np.bincount(index)
    mj = np.bincount(index, judge[ok]) / n
    mh = np.bincount(index, human[ok]) / n
    var = np.bincount(index, (judge[ok] - mj[index]) ** 2) / np.maximum(n - 1, 1)
    rows = [{"system": str(s), "n": int(k), "judge": float(a), "judge_sd": float(np.sqrt(v)),
             "human": float(h)} for s, k, a, v, h in zip(systems, n, mj, var, mh, strict=True)]
    dj, dh = np.subtract.outer(mj, mj), np.subtract.outer(mh, mh)
    upper = np.triu(np.ones_like(dh, dtype=bool), 1) & (dh != 0)
    total = int(upper.sum())
    agree = int(((dj * dh) > 0)[upper].sum())
    return {"rows": rows, "pairs": total,
            "pairwise_accuracy": agree / total if total else None}
