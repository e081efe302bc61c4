"""One selection's items summarised per group, so that any resample of its groups pools cheaply.

A resample of groups is a row of draw counts (how many times each group is drawn). Pooling
its items anew for each of 1,000 resamples would redo the whole dataset level 1,000 times;
instead each group is summarised once (its moments, its items per distinct (judge, human)
cell) and a resample's pooled statistic is a weighted sum of the summaries: what makes the
dataset level's CIs cheap (runner.reduce.statistics writes each statistic on a `Pooled`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from runner.reduce import _kendall

__all__ = ["Pooled"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]


class Pooled:
    """Per-group summaries of one selection's items, enough to pool any resample of them.

    Args:
        x, y: judge and human scores of the selection's items, group by group.
        edges: where each group's items start, and the end (edges[0] == 0).
        n_boot: resamples it will pool (it chooses how Kendall's sums are made).

    Fields:
        moments: (G, 6) sums of 1, a, c, a^2, c^2, ac per group, where a = x - mean(x) and
            c = y - mean(y) over the selection (centred, so one-pass sums stay exact enough).
        offset: mean(x) - mean(y) over the selection (what centring took away).
        txy: (G, K) items per distinct (x, y) cell.
        cx, cy: (K,) x and y value index of each cell (cells are in x order).
        x_starts: (Ux,) where each x value's cells begin.
        y_order, y_starts: the cells in y order, and where each y value's begin.
    """

    __slots__ = ("_pairs", "_plan", "cx", "cy", "moments", "offset", "txy", "x_starts",
                 "y_order", "y_starts")

    def __init__(self, x: FloatArray, y: FloatArray, edges: IntArray, n_boot: int) -> None:
        n_groups = len(edges) - 1
        a, c = x - x.mean(), y - y.mean()
        parts = np.stack([np.ones_like(a), a, c, a * a, c * c, a * c], axis=1)
        gid = np.repeat(np.arange(n_groups), np.diff(edges))
        ux = np.unique(x, return_inverse=True)[1].ravel()
        y_values, uy = np.unique(y, return_inverse=True)
        n_y = len(y_values)
        cells, cell = np.unique(ux * n_y + uy.ravel(), return_inverse=True)
        self.txy = _kendall.counts(cell.ravel(), gid, (n_groups, len(cells)))
        self.cx, self.cy = cells // n_y, cells % n_y  # cells sorted by x, then y
        self.y_order = np.argsort(self.cy, kind="stable")
        self.moments: FloatArray = np.add.reduceat(parts, edges[:-1], axis=0)
        self.offset = float(x.mean() - y.mean())
        self.x_starts = np.flatnonzero(np.r_[True, self.cx[1:] != self.cx[:-1]])
        self.y_starts = np.flatnonzero(np.r_[True, np.diff(self.cy[self.y_order]) != 0])
        self._plan: tuple[Any, ...] = (x, y, edges, n_boot)
        self._pairs: _kendall.Pairs | None = None

    def pairs(self) -> _kendall.Pairs:
        """Kendall's concordance sums, planned on first use (only Kendall's tau asks)."""
        if self._pairs is None:
            x, y, edges, n_boot = self._plan
            self._pairs = _kendall.pairs(x, y, edges, self.cx, self.cy, n_boot)
        return self._pairs

    def drawn(self, c: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Items drawn by resamples c per distinct x value, y value and (x, y) cell, each
        (values, resamples): the cells' counts, summed by x and by y (whole numbers, so
        exactly the per-value tables' products).

        Args:
            c: draw counts, resamples x groups.
        Returns:
            (per x value, per y value, per cell), each laid out (values, resamples).
        """
        wxy = self.txy.drawn(c)
        wx = np.add.reduceat(wxy, self.x_starts, axis=0)
        wy = np.add.reduceat(wxy[self.y_order], self.y_starts, axis=0)
        return wx, wy, wxy

