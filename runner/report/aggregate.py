"""The page's charts of one judge's score column, as aggregates: bins, counts and quantiles.

What report.html draws of a judge (runner.report.pagedata) is made here from the judge's and
the humans' score columns, in a size set by the score scale, never by the number of rows: a
scatter of more than `MAX_POINTS` pairs is a 2-D histogram (at most ~41 x 41 cells) with the
judge's score quantiles per human score level, and a distribution is counts per bin with its
mean and quantiles.

Each column's distinct values give the bins (the first rows' distinct values are tried first,
so a column on a scale of at most `FEW` scores, stars, halves or 1-10, is not sorted at all);
every row's bin is arithmetic on the equal-width edges, and on such a scale the quantiles are
read from counts, without sorting the rows. Over the 100 series of 100,000 rows of a
ten-million-judgment study (bench/page.py, OPENBLAS_NUM_THREADS=1 as `judge` runs), page_data
took 11.3-12.1 s with numpy's histogram2d, polyfit, lexsort and quantile, and takes 4.4-5.2 s
this way (3 alternated processes, best of 2 calls each, load average 11 on 2 cores; the
page's figures unchanged but for the fit line's last digits, relative 1e-14).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["BINS", "FEW", "MAX_POINTS", "QUANTILES", "counts", "scatter_and_counts"]

MAX_POINTS = 1500  # a scatter with more pairs is sent as a 2-D histogram
BINS = 20  # histogram bins for a continuous scale
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)  # the box summaries: whiskers, box, median
FEW = 64  # at most this many distinct scores: quantiles from counts per score


def scatter_and_counts(judge: Any, human: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """One judge's scatter (judge score x against human score y, where both are known) and
    the distribution of its scores (NaN: unscored).

    Args:
        judge, human: float arrays of the same length; human scores finite.
    Returns:
        the scatter: n, the least-squares line of human on judge, and either the points or
        a 2-D histogram with the judge's quantiles per human level ("levels"); and the
        distribution, as `counts` makes it.
    """
    ok = ~(np.isnan(judge) | np.isnan(human))
    x, y = judge[ok], human[ok]
    scored = judge[~np.isnan(judge)]  # x itself, unless a human score is missing
    xc = _Column(x)
    dist = _counts(xc if scored.size == x.size else _Column(scored), judge.size - scored.size)
    out: dict[str, Any] = {"n": int(x.size), "fit": _fit(x, y)}
    if x.size <= MAX_POINTS:
        out["points"] = np.round(np.column_stack([x, y]), 4).tolist()
        return out, dist
    yc = _Column(y)
    ix, iy = xc.bins(), yc.bins()
    nx, ny = xc.edges.size - 1, yc.edges.size - 1
    grid = np.bincount(ix * ny + iy, minlength=nx * ny).reshape(nx, ny)
    i, j = np.nonzero(grid)
    out["hist"] = {"x": xc.edges.tolist(), "y": yc.edges.tolist(),
                   "cells": np.column_stack([i, j, grid[i, j]]).tolist()}
    out["levels"] = _levels(xc, iy, ny)
    return out, dist


def counts(values: Any) -> dict[str, Any]:
    """Counts per distinct value (few values) or per bin, the missing (NaN) count, and the
    finite values' mean and `QUANTILES`.

    Args:
        values: one column's values, a float array with NaN where missing.

    Returns:
        The counts (or bins), the missing count, the mean and the quantiles.
    """
    finite = values[~np.isnan(values)]
    return _counts(_Column(finite), values.size - finite.size)


class _Column:
    """A column of finite scores with its sorted distinct values, its bins' edges and, on a
    scale of at most `FEW` distinct scores, each row's index into them."""

    def __init__(self, values: Any) -> None:
        self.values = values
        self.distinct, self.index = _distinct(values)
        self.edges = _edges(self.distinct) if values.size else np.empty(0)

    def bins(self) -> Any:
        """Each row's bin (numpy's histogram's)."""
        if self.index is None:
            return _bin(self.values, self.edges)
        return _bin(self.distinct, self.edges)[self.index]


def _distinct(values: Any) -> tuple[Any, Any]:
    """Sorted distinct values, and each row's index into them if there are at most `FEW`.
    The distinct values of the first rows are tried first: if every row is one of them, the
    column is not sorted at all."""
    head = np.unique(values[:4096])
    if 0 < head.size <= FEW:
        index = np.minimum(np.searchsorted(head, values), head.size - 1)
        if np.array_equal(head[index], values):
            return head, index
    distinct = np.unique(values)
    return distinct, np.searchsorted(distinct, values) if distinct.size <= FEW else None


def _counts(column: _Column, missing: int) -> dict[str, Any]:
    out: dict[str, Any] = {"missing": missing}
    finite = column.values
    if not finite.size:
        out["edges"], out["counts"] = [], []
        return out
    edges = column.edges
    out["edges"] = np.round(edges, 6).tolist()
    if column.index is not None:
        per = np.bincount(column.index, minlength=column.distinct.size)  # rows per value
        binned = np.bincount(_bin(column.distinct, edges), weights=per,
                             minlength=edges.size - 1)
        out["counts"] = binned.astype(np.int64).tolist()
        q = _from_counts(column.distinct, per)
    else:
        out["counts"] = np.bincount(_bin(finite, edges), minlength=edges.size - 1).tolist()
        q = np.quantile(finite, QUANTILES)
    out["quantiles"] = np.round(q, 4).tolist()
    out["mean"] = round(float(finite.mean()), 4)
    return out


def _edges(distinct: Any) -> Any:
    """Bin edges for sorted distinct values: one bin per step of a regular scale (1-5 stars,
    halves), else BINS equal bins."""
    if distinct.size == 1:
        return np.array([distinct[0] - 0.5, distinct[0] + 0.5])
    step = float(np.min(np.diff(distinct)))
    span = (distinct[-1] - distinct[0]) / step
    on_grid = np.allclose((distinct - distinct[0]) / step,
                          np.round((distinct - distinct[0]) / step), atol=0.1)
    if on_grid and span < 2 * BINS:
        return distinct[0] - step / 2 + step * np.arange(round(span) + 2)
    return np.linspace(distinct[0], distinct[-1], BINS + 1)


def _bin(values: Any, edges: Any) -> Any:
    """Each value's bin, as numpy's histogram assigns it ([e_k, e_k+1), the last bin closed),
    by arithmetic on the equal-width edges, then a step left or right where rounding put a
    value next to its bin."""
    bins = edges.size - 1
    width = (edges[-1] - edges[0]) / bins
    at = np.clip(((values - edges[0]) / width).astype(np.intp), 0, bins - 1)
    at -= (values < edges[at]) & (at > 0)
    at += (values >= edges[at + 1]) & (at < bins - 1)
    return at


def _from_counts(distinct: Any, per: Any) -> Any:
    """`QUANTILES` (numpy's linear method) of a column given as counts per distinct value."""
    n = int(per.sum())
    cum = np.cumsum(per)
    at = np.multiply(QUANTILES, n - 1)
    low = np.floor(at)
    high = np.minimum(low + 1, n - 1)
    below = distinct[np.searchsorted(cum, low, side="right")]
    above = distinct[np.searchsorted(cum, high, side="right")]
    return below + (above - below) * (at - low)


def _levels(xc: _Column, level: Any, levels: int) -> dict[str, Any]:
    """The judge scores per human score level (`level`: each row's): how many, and their
    `QUANTILES` (None for an empty level), as numpy's default (linear) quantile."""
    n = np.bincount(level, minlength=levels)
    x, xd = xc.values, xc.distinct
    if xc.index is not None:  # counts per (level, score): no sort
        per = np.bincount(level * xd.size + xc.index,
                          minlength=levels * xd.size).reshape(levels, xd.size)
        rows = [_from_counts(xd, per[k]) if n[k] else None for k in range(levels)]
    else:  # one sort by (level, score); each level's quantiles read in its run
        ordered = x[np.lexsort((x, level))]
        start = np.cumsum(n) - n
        at = start[:, None] + np.multiply.outer(np.maximum(n - 1, 0), QUANTILES)
        low = np.floor(at).astype(np.intp)
        high = np.minimum(low + 1, np.maximum(start + n - 1, 0)[:, None])
        q = ordered[low] + (ordered[high] - ordered[low]) * (at - low)
        rows = [q[k] if n[k] else None for k in range(levels)]
    return {"n": n.tolist(),
            "q": [None if r is None else np.round(r, 4).tolist() for r in rows]}


def _fit(x: Any, y: Any) -> list[float] | None:
    """The least-squares line of y on x (slope, intercept); None if x does not vary."""
    if x.size < 2 or np.ptp(x) == 0:
        return None
    dx = x - x.mean()  # sums, not BLAS's dot: no thread pool woken for one line
    slope = float(np.sum(dx * (y - y.mean()))) / float(np.sum(dx * dx))
    return [slope, float(y.mean() - slope * x.mean())]
