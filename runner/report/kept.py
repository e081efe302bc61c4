"""A kept run as `judge runs` lists it and `judge serve`'s first page shows it: one row, made
in one place, from the run's manifest.json, correlations.csv and summary.csv."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import orjson

from runner.report.folder import own_bytes, read_csv
from runner.report.headline import shown_method
from runner.report.standing import points, ranked

__all__ = ["RUN_COLUMNS", "run_row", "size"]

RUN_COLUMNS = ("run", "kind", "models", "tasks", "calls", "cost", "cached", "saved", "disk",
               "best correlation")


def run_row(path: Path) -> tuple[str, ...]:
    """The RUN_COLUMNS of the kept run in `path`, as text.

    Args:
        path: the kept run's folder.

    Returns:
        One row of `judge runs`'s table.
    """
    m = orjson.loads((path / "manifest.json").read_bytes())
    counts = m.get("counts", {})
    cost = m.get("estimated_cost_usd")
    return (path.name, m.get("kind", "run"), ",".join(x["name"] for x in m.get("models", [])),
            str(counts.get("tasks", "")), str(counts.get("api_calls", "")),
            "unknown" if cost is None else f"${cost:.4f}", *_saved(m.get("bill")),
            size(own_bytes(path)), _best(path))


def _saved(bill: Any) -> tuple[str, str]:
    """The `cached` and `saved` columns of a manifest's bill (runner.job.bill.Bill): the
    share of prompt tokens read from a provider's prompt cache, and what caching and batching
    saved against list price ("unknown" without a price; "" in a manifest without a bill)."""
    if not isinstance(bill, dict):
        return "", ""
    tokens, saved = bill["tokens"], bill["saved_usd"]
    prompt = tokens["input"] + tokens["cached_input"] + tokens["cache_write"]
    share = f"{tokens['cached_input'] / prompt:.0%}" if prompt else "-"
    if saved["caching"] is None:
        return share, "unknown"
    return share, f"${saved['caching'] + saved['batching']:.4f}"


def size(n: int) -> str:
    """`0B`, `512B`, `35kB`, `1.2GB`: bytes in decimal units, without a space (one column).

    Args:
        n: a size in bytes.

    Returns:
        The size as text.
    """
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{n}B"


def _best(run: Path) -> str:
    """`fake/stars 0.472 n=40 (spearman, sample, openmeva/overall)`: the highest correlation
    among the ranked judges (runner.report.standing, the rule of the run's own table and
    report.html: enough answers parsed, enough groups) over all items at the first level,
    spearman where computed; "none ranked" if there are coefficients but none is ranked, ""
    without any."""
    rows, summary = read_csv(run / "correlations.csv"), read_csv(run / "summary.csv")
    rows = [r for r in rows if "/" in r["judge"] and r["subset"] == "all" and r["value"]
            and math.isfinite(float(r["value"]))]
    if not rows:
        return ""
    # as the run's own result table: spearman, else the job's first
    method = shown_method(list(dict.fromkeys(r["method"] for r in rows)))
    level = rows[0]["level"]
    eligible = {(d, a, judge) for (d, a, lv, m, _), judges in ranked(rows, summary).items()
                if lv == level and m == method for judge in judges}
    candidates = [r for r in rows if r["method"] == method and r["level"] == level
                  and (r["dataset"], r["aspect"], r["judge"]) in eligible]
    if not candidates:  # too few answers parsed, or too few groups, to say which is best
        return f"none ranked ({method}, {level})"
    top = max(candidates, key=lambda r: float(r["value"]))
    return (f"{top['judge']} {float(top['value']):.3f} n={points(top)} ({method}, {level}, "
            f"{top['dataset']}/{top['aspect']})")
