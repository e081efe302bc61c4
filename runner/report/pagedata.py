"""What report.html shows, computed in Python from the tables the other reports use: one JSON
document (`page_data`), drawn in the browser by templates/report.js and with matplotlib by
runner.report.figures. Its size does not grow with the judgments: each chart is an aggregate
(runner.report.aggregate), the system view has a row per system up to MAX_SYSTEMS, and the
item browser's rows are a bounded sample (runner.report.browser).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from runner.expand import Expansion
from runner.reduce.series import Series
from runner.report.aggregate import MAX_POINTS, QUANTILES, counts, scatter_and_counts
from runner.report.browser import ItemRows, prompt_text, with_bodies
from runner.report.headline import system_note, unparsed_judges
from runner.report.reliability import reliability_page
from runner.report.standing import MIN_PARSED_SHARE, MIN_POINTS, best_judges, no_spread

__all__ = ["MAX_POINTS", "MAX_SYSTEMS", "QUANTILES", "page_data"]

MAX_SYSTEMS = 200  # more systems than this: no per-system rows (a chart row each), only a count


def page_data(expansion: Expansion, series: Mapping[tuple[str, str], Mapping[str, Series]],
              corr: Sequence[Mapping[str, Any]],
              summ: Sequence[Mapping[str, Any]], battles: Sequence[Mapping[str, Any]],
              board: tuple[list[str], list[dict[str, Any]]] | None,
              manifest: Mapping[str, Any], rows: ItemRows,
              reliability: Sequence[Mapping[str, Any]] = (), *,
              ranking: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Everything the page shows, as plain JSON-able values.

    Args:
        expansion: the job and its items.
        series: per (data set, aspect), each judge's scores beside the human's.
        corr, summ, battles: correlations.csv's, summary.csv's and battle.csv's rows.
        board: the leaderboard's columns and rows, or None.
        manifest, rows: manifest.json's content and the item browser's kept rows.
        reliability: reliability.csv's rows (runner.report.write sets them later: they are
            made on the other core meanwhile).
        ranking: ranking.csv's rows (shown with the battles).

    Returns:
        The page's JSON document.
    """
    job = expansion.job
    return {
        "job": job.name,
        "manifest": dict(manifest),
        "prompts": [{"name": p.name, "parser": p.parser, "aspects": list(p.aspects),
                     "samples": p.samples} for p in job.prompts],
        "unparsed": [{"judge": j, "unparsed": u, "answered": a, "text": what}
                     for j, u, a, what in unparsed_judges(summ)],
        "ranked_if": {"parsed_share": MIN_PARSED_SHARE, "min_points": MIN_POINTS},
        "no_spread": [{"judge": j, "dataset": ds, "aspect": asp, "top": t, "scored": n,
                       "score": score} for j, ds, asp, t, n, score in no_spread(summ)],
        "levels": list(job.levels), "methods": list(job.methods), "bootstrap": job.bootstrap,
        "datasets": _datasets(expansion, series, corr, summ),
        "summary": [dict(s) for s in summ],
        "failures": [{"dataset": k[0], "prompt": k[1], "aspect": k[2], "model": k[3],
                      "type": k[4], "examples": v} for k, v in rows.examples.items()],
        "battles": [dict(b) for b in battles],
        "ranking": [dict(r) for r in ranking],
        "leaderboard": {"columns": board[0], "rows": board[1]} if board else None,
        "reliability": reliability_page(expansion, reliability),
        "items": _items(expansion, rows),
    }


def _datasets(expansion: Expansion, series: Mapping[tuple[str, str], Mapping[str, Series]],
              corr: Sequence[Mapping[str, Any]],
              summ: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per data set, its aspects' correlations, best judges, charts and systems."""
    juries = {j.name for j in expansion.job.juries}
    best = best_judges(corr, summ)  # the terminal's `*` and `judge runs`' rule: one answer
    datasets: dict[str, dict[str, Any]] = {}
    for (dataset, aspect), judges in series.items():
        d = datasets.setdefault(dataset, {"name": dataset, "aspects": []})
        llm = {name: data for name, data in judges.items() if "/" in name or name in juries}
        first = next(iter(judges.values()), None)  # the human scores: any judge's rows have them
        human = first.human if first is not None else np.empty(0)
        charts = {name: scatter_and_counts(data.judge, data.human) for name, data in llm.items()}
        d["aspects"].append({
            "aspect": aspect,
            "correlations": [dict(r) for r in corr
                             if r["dataset"] == dataset and r["aspect"] == aspect],
            "best": [[level, subset, method, judge] for (ds, asp, level, method, subset), judge
                     in best.items() if ds == dataset and asp == aspect],
            "scatter": {name: scatter for name, (scatter, _) in charts.items()},
            "distribution": {name: dist for name, (_, dist) in charts.items()},
            "human": counts(human),
            "systems": {name: _systems(data) for name, data in llm.items()},
            "system_note": system_note([r for r in corr if r["dataset"] == dataset
                                        and r["aspect"] == aspect]),
        })
    for s in summ:
        datasets.setdefault(s["dataset"], {"name": s["dataset"], "aspects": []})
    return list(datasets.values())


def _items(expansion: Expansion, rows: ItemRows) -> dict[str, Any]:
    """The item browser: the kept rows, each prompt's text once."""
    chosen = rows.kept()
    kept = with_bodies([r for r, _ in chosen], expansion)  # in the same order
    texts: dict[str, int] = {}
    sampled = any(p.samples > 1 for p in expansion.job.prompts)  # a sample column where it tells
    return {**rows.counts(), "capped": rows.capped,
            "columns": ["dataset", "item", "system", "aspect", "judge",
                        *(["sample"] if sampled else []), "score",
                        "human", "diff", "status", "message", "raw", "prompt"],
            "rows": [[r.dataset, r.item, r.system, r.aspect, r.judge,
                      *([r.sample] if sampled else []), r.score, r.human,
                      r.diff, r.status, r.message, r.raw,
                      texts.setdefault(prompt_text(r.body), len(texts))] for r in kept],
            "why": [w for _, w in chosen],  # per row: the pools that kept it, space-separated
            "prompts": list(texts)}


def _systems(data: Series) -> dict[str, Any]:
    """Per system: judge and human means (and judge sd); and the pairwise accuracy of the
    judge's system ranking against the humans' (pairs the humans do not tie)."""
    names = data.labels.systems
    ok = ~np.isnan(data.judge)
    count = np.bincount(data.system, weights=ok, minlength=len(names))
    # the systems scored, named (an item without a system has the name ""), by name
    kept = sorted((names[c], c) for c in np.flatnonzero(count).tolist() if names[c] != "")
    if not kept or len(kept) > MAX_SYSTEMS:
        return {"rows": [], "pairs": 0, "pairwise_accuracy": None, "systems": len(kept)}
    systems = [name for name, _ in kept]
    k = len(kept)
    slot = np.full(len(names), k, dtype=np.intp)  # code -> row of its kept system, or k
    slot[[c for _, c in kept]] = np.arange(k)
    # rows left out (unscored, or of no system) go to an extra bin k: no copy of the columns
    index = np.where(ok, slot[data.system], k)
    n = np.bincount(index, minlength=k + 1)[:k]
    mj = np.bincount(index, data.judge, minlength=k + 1)[:k] / n
    mh = np.bincount(index, data.human, minlength=k + 1)[:k] / n
    var = np.bincount(index, (data.judge - np.append(mj, 0)[index]) ** 2,
                      minlength=k + 1)[:k] / np.maximum(n - 1, 1)
    rows = [{"system": str(s), "n": int(k), "judge": float(a), "judge_sd": float(np.sqrt(v)),
             "human": float(h)} for s, k, a, v, h in zip(systems, n, mj, var, mh, strict=True)]
    dj, dh = np.subtract.outer(mj, mj), np.subtract.outer(mh, mh)
    upper = np.triu(np.ones_like(dh, dtype=bool), 1) & (dh != 0)
    total = int(upper.sum())
    agree = int(((dj * dh) > 0)[upper].sum())
    return {"rows": rows, "pairs": total,
            "pairwise_accuracy": agree / total if total else None, "systems": len(kept)}
