"""scipy.stats' correlation coefficients, in numpy alone: the same operations, so the same bits.

Importing scipy.stats costs 0.7-1.5 s of CPU (it loads every distribution), more than a fully
cached 100,000-task run spends on its correlations. The reducer needs four statistics from it,
and each is a few numpy operations, written here as scipy 1.17 writes them:

* rankdata: average ranks along the last axis (ties get the mean of their ordinal ranks).
* pearson: pearsonr's statistic along the last axis: centred, scaled by the largest deviation,
  normalised, vecdot, clipped to [-1, 1] (rounded for two points); NaN for a constant row.
* spearman: spearmanr's statistic for two 1-D samples: np.corrcoef of their average ranks.
* kendall: kendalltau's tau-b for two 1-D samples: the same integer pair counts (concordant
  minus discordant from runner.reduce._kendall's merges over the distinct (x, y) cells, where
  scipy counts discordant pairs by a merge sort; both are exact) and the same float operations.

tests/test_reduce.py checks every one against scipy, bit for bit, on random and tied data.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import numpy.typing as npt

from runner.reduce import _kendall

__all__ = ["kendall", "pearson", "rankdata", "scipy_stats", "spearman"]

FloatArray = npt.NDArray[np.float64]


def rankdata(a: npt.ArrayLike) -> FloatArray:
    """scipy.stats.rankdata(a, axis=-1) (method "average") for data without NaN."""
    x = np.asarray(a, dtype=np.float64)
    shape = x.shape
    j = np.argsort(x, axis=-1, stable=True)
    ordinal = np.broadcast_to(np.arange(1, shape[-1] + 1, dtype=np.float64), shape)
    y = np.take_along_axis(x, j, axis=-1)
    first = np.concatenate([np.ones((*shape[:-1], 1), dtype=bool), y[..., :-1] != y[..., 1:]],
                           axis=-1)
    indices = np.arange(y.size)[first.reshape(-1)]
    counts = np.diff(indices, append=np.asarray([y.size], dtype=indices.dtype))
    ranks = np.repeat(ordinal[first] + (counts.astype(np.float64) - 1) / 2, counts)
    out = np.empty(shape, dtype=np.float64)
    np.put_along_axis(out, j, ranks.reshape(shape), axis=-1)
    return out


def pearson(x: npt.ArrayLike, y: npt.ArrayLike) -> FloatArray:
    """scipy.stats.pearsonr(x, y, axis=-1).statistic: one coefficient per row (a 0-d array
    for 1-D input), NaN where a row of x or y is constant."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    constant = np.all(xs == xs[..., 0:1], axis=-1) | np.all(ys == ys[..., 0:1], axis=-1)
    xm = xs - np.mean(xs, axis=-1, keepdims=True)
    ym = ys - np.mean(ys, axis=-1, keepdims=True)
    xmax = np.max(np.abs(xm), axis=-1, keepdims=True)
    ymax = np.max(np.abs(ym), axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        normxm = xmax * np.linalg.norm(xm / xmax, axis=-1, keepdims=True)
        normym = ymax * np.linalg.norm(ym / ymax, axis=-1, keepdims=True)
        r = np.clip(np.vecdot(xm / normxm, ym / normym), -1.0, 1.0)  # along the last axis
    if xs.shape[-1] == 2:  # scipy rounds two points to exactly -1 or 1
        r = np.round(r)
    return np.where(constant, np.nan, r)


def spearman(x: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """scipy.stats.spearmanr(x, y).statistic for two 1-D samples, neither constant."""
    ranked = np.column_stack((rankdata(x), rankdata(y)))
    matrix: FloatArray = np.asarray(np.corrcoef(ranked, rowvar=False))
    return float(matrix[1, 0])


def kendall(x: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """scipy.stats.kendalltau(x, y).statistic (tau-b) for two 1-D samples; NaN when every
    pair ties on one side."""
    xs, ys = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    size = xs.size
    ux, ix = np.unique(xs, return_inverse=True)
    uy, iy = np.unique(ys, return_inverse=True)
    cells, weight = np.unique(ix.ravel() * len(uy) + iy.ravel(), return_counts=True)
    con_minus_dis = _kendall.concordance(cells // len(uy), cells % len(uy), weight)
    xtie, ytie = (_ties(np.bincount(i.ravel())) for i in (ix, iy))
    tot = (size * (size - 1)) // 2
    if xtie == tot or ytie == tot:
        return float("nan")
    tau = con_minus_dis / np.sqrt(tot - xtie) / np.sqrt(tot - ytie)
    return float(np.minimum(1.0, max(-1.0, tau)))


def _ties(counts: npt.NDArray[np.intp]) -> int:
    """Pairs tied within the values of one side (scipy's count_rank_tie, first figure)."""
    cnt = counts.astype(np.int64)
    cnt = cnt[cnt > 1]
    return int((cnt * (cnt - 1) // 2).sum())


def scipy_stats() -> ModuleType:
    """scipy.stats, imported on first use (Williams' test, the position rows' binomial test):
    importing it costs 0.7-1.5 s of CPU, more than the correlations of a 100,000-task run.

    Returns:
        The scipy.stats module.
    """
    import scipy.stats  # -X importtime: 1.46 s cumulative on this 2-core machine
    return scipy.stats
