"""Every statistic of judge against human scores, each written once, here.

A `Statistic` is all the reducer and the reports need of one: its name; its value on two
samples; its values on many groups at once (the sample level), on many resamples of a
selection's groups (the dataset level's CIs and paired differences) and on many resamples
of per-system means (the system level's CIs); and whether Williams' test applies. correlate
and compare run every level, every CI and every paired difference from it; correlations.csv,
compare.csv, report.md's tables, the page and the terminal print whatever names they are
given. A new statistic is a new entry in STATISTICS and its name in runner.job.spec.METHODS
(the job layer checks job files against that list before any call: it cannot import this
one, and a check here would load numpy before a run's expanders fork; the two are compared on
import).

Point values are scipy.stats' statistics, computed by runner.reduce._coef with scipy's own
operations in numpy; resampled values are the same statistics written as weighted sums over
the drawn groups' summaries (runner.reduce.pooled; Kendall's: runner.reduce._kendall), which
the tests check against scipy on explicitly resampled rows. Lin's concordance coefficient (Lin
1989), 2 cov(x, y) / (var x + var y + (mean x - mean y)^2) with 1/n moments, is a correlation
that also penalises a judge on the wrong scale or shifted (rank correlations hide both); it is
not scale-free, so Williams' t (derived for dependent Pearson correlations) and the permutation
test (which standardises each judge) do not apply to it. Its paired difference and CI do: a
paired bootstrap of groups assumes nothing of the statistic but that it is a smooth function of
the drawn items, as CCC is of their moments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from runner.job.spec import METHODS
from runner.reduce import _coef, _kendall
from runner.reduce.pooled import Pooled

__all__ = ["STATISTICS", "Statistic"]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
Drawn = tuple[FloatArray, FloatArray, FloatArray]
"""Pooled.drawn of a block of resamples: items drawn per x value, y value and (x, y) cell."""
# Groups up to this size get sample-level Kendall from pair counts, not a scipy call each.
_SHORT = 64


@dataclass(frozen=True, slots=True)
class Statistic:
    """One statistic, at every level it is reported at.

    A sample (a group, the pooled items, the system means) with fewer than two points or a
    constant side has no value, for every statistic alike, so that `policy` treats their
    groups alike.
    """

    name: str
    one: Callable[[FloatArray, FloatArray], float | None]
    """Two 1-D samples -> the value, None where undefined: the dataset level, the system
    level over system means, reliability.csv's rows and Williams' test."""
    rows: Callable[[FloatArray, FloatArray], FloatArray] | None
    """(k, m) samples, no row constant -> k values: the sample level's groups of m items.
    None: reported at system level only, and there always."""
    resampled: Callable[[Pooled, FloatArray, Drawn], FloatArray] | None
    """A selection's summaries, draw counts (resamples x groups) and their `Drawn` -> the
    pooled value per resample (anything where a side is constant: the caller masks it)."""
    systems: Callable[[FloatArray, FloatArray, BoolArray], FloatArray]
    """Per-system judge and human means (resamples x systems) and which systems each
    resample drew -> `one` of each row over its drawn systems, NaN where undefined."""
    williams: bool
    """Williams' t and the permutation test of compare.csv apply: a correlation, blind to
    each side's scale."""


def _defined(x: FloatArray, y: FloatArray) -> bool:
    return len(x) >= 2 and bool(np.ptp(x)) and bool(np.ptp(y))


def _pearson_rows(x: FloatArray, y: FloatArray, valid: BoolArray) -> FloatArray:
    """Pearson of each row over its valid columns, NaN where undefined."""
    k = valid.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        dx = np.where(valid, x - np.where(valid, x, 0).sum(1, keepdims=True) / k[:, None], 0)
        dy = np.where(valid, y - np.where(valid, y, 0).sum(1, keepdims=True) / k[:, None], 0)
        value = (dx * dy).sum(1) / np.sqrt((dx * dx).sum(1) * (dy * dy).sum(1))
    return np.where(np.isfinite(value) & (k >= 2), np.clip(value, -1.0, 1.0), np.nan)


def _ranks(v: FloatArray, valid: BoolArray) -> FloatArray:
    """Average ranks of each row's valid columns."""
    pair = valid[:, :, None] & valid[:, None, :]
    return np.asarray(((v[:, None, :] < v[:, :, None]) & pair).sum(2)
                      + (((v[:, None, :] == v[:, :, None]) & pair).sum(2) + 1) / 2,
                      dtype=np.float64)


def _signs(mx: FloatArray, my: FloatArray, valid: BoolArray
           ) -> tuple[FloatArray, FloatArray, BoolArray]:
    """sign(mx_i - mx_j), sign(my_i - my_j) of each row's valid pairs i < j (0 elsewhere)."""
    pair = valid[:, :, None] & valid[:, None, :]
    pair = pair & np.triu(np.ones(pair.shape[1:], dtype=bool), 1)
    return (np.sign(mx[:, :, None] - mx[:, None, :]) * pair,
            np.sign(my[:, :, None] - my[:, None, :]) * pair, pair)


def _finite(value: FloatArray) -> FloatArray:
    return np.where(np.isfinite(value), value, np.nan)


def _kendall_systems(mx: FloatArray, my: FloatArray, valid: BoolArray) -> FloatArray:
    sx, sy, _ = _signs(mx, my, valid)
    with np.errstate(invalid="ignore", divide="ignore"):
        return _finite((sx * sy).sum((1, 2)) / np.sqrt((sx * sx).sum((1, 2))
                                                       * (sy * sy).sum((1, 2))))


def _pairwise_systems(mx: FloatArray, my: FloatArray, valid: BoolArray) -> FloatArray:
    sx, sy, pair = _signs(mx, my, valid)
    with np.errstate(invalid="ignore", divide="ignore"):
        return _finite(((sx == sy) & pair).sum((1, 2)) / pair.sum((1, 2)))


def _pairwise(mx: FloatArray, my: FloatArray) -> float | None:
    """The share of pairs whose judge and human differences have the same sign (a tie agrees
    only with a tie; Kocmi et al. 2021)."""
    if len(mx) < 2:
        return None
    iu = np.triu_indices(len(mx), 1)
    return float((np.sign((mx[:, None] - mx)[iu]) == np.sign((my[:, None] - my)[iu])).mean())


def _pearson_drawn(p: Pooled, c: FloatArray, _: Drawn) -> FloatArray:
    n, sa, sc, saa, scc, sac = (c @ p.moments).T  # one-pass: fine once centred
    out: FloatArray = (sac - sa * sc / n) / np.sqrt((saa - sa * sa / n) * (scc - sc * sc / n))
    return out


def _spearman_drawn(p: Pooled, c: FloatArray, drawn: Drawn) -> FloatArray:
    wx, wy, wxy = drawn
    n = wx.sum(axis=0)
    rx = np.cumsum(wx, axis=0) - (wx - 1) / 2  # average rank of each distinct value
    ry = np.cumsum(wy, axis=0) - (wy - 1) / 2
    centre = n * ((n + 1) / 2) ** 2  # the ranks' mean is (n + 1) / 2 exactly
    cov = (wxy * rx[p.cx] * ry[p.cy]).sum(axis=0) - centre
    # sum of squared deviations of average ranks: (n^3 - sum of tie sizes cubed) / 12
    out: FloatArray = 12 * cov / np.sqrt((n * n * n - (wx * wx * wx).sum(axis=0)) *
                                         (n * n * n - (wy * wy * wy).sum(axis=0)))
    return out


def _kendall_drawn(p: Pooled, c: FloatArray, drawn: Drawn) -> FloatArray:
    wx, wy, wxy = drawn
    n = wx.sum(axis=0)
    untied_x, untied_y = n * n - (wx * wx).sum(axis=0), n * n - (wy * wy).sum(axis=0)
    out: FloatArray = p.pairs().sums(c, wxy) / np.sqrt(untied_x * untied_y)
    return out


def _kendall_rows(xs: FloatArray, ys: FloatArray) -> FloatArray:
    if xs.shape[1] <= _SHORT:  # scipy's kendalltau calls itself once per row
        return _kendall.tau_b_rows(xs, ys)
    return np.array([_coef.kendall(x, y) for x, y in zip(xs, ys, strict=True)])


def _ccc(x: FloatArray, y: FloatArray) -> FloatArray:
    """Lin's concordance coefficient along the last axis (1/n moments)."""
    mx, my = x.mean(axis=-1, keepdims=True), y.mean(axis=-1, keepdims=True)
    cov = ((x - mx) * (y - my)).mean(axis=-1)
    spread = ((x - mx) ** 2).mean(axis=-1) + ((y - my) ** 2).mean(axis=-1)
    return np.asarray(2 * cov / (spread + (mx - my)[..., 0] ** 2), dtype=np.float64)


def _ccc_drawn(p: Pooled, c: FloatArray, _: Drawn) -> FloatArray:
    n, sa, sc, saa, scc, sac = (c @ p.moments).T
    shift = p.offset + (sa - sc) / n  # mean x - mean y of the drawn items
    out: FloatArray = 2 * (sac - sa * sc / n) / (saa - sa * sa / n + scc - sc * sc / n
                                                  + n * shift * shift)
    return out


def _ccc_systems(mx: FloatArray, my: FloatArray, valid: BoolArray) -> FloatArray:
    k = valid.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        x, y = (np.where(valid, v, 0).sum(1) / k for v in (mx, my))
        dx, dy = np.where(valid, mx - x[:, None], 0), np.where(valid, my - y[:, None], 0)
        value = 2 * (dx * dy).sum(1) / ((dx * dx).sum(1) + (dy * dy).sum(1) + k * (x - y) ** 2)
    spread = [np.where(valid, v, -np.inf).max(1) > np.where(valid, v, np.inf).min(1)
              for v in (mx, my)]
    return np.where((k >= 2) & spread[0] & spread[1], value, np.nan)


def _unless_undefined(f: Callable[[FloatArray, FloatArray], object]
                      ) -> Callable[[FloatArray, FloatArray], float | None]:
    def one(x: FloatArray, y: FloatArray) -> float | None:
        return float(f(x, y)) if _defined(x, y) else None  # type: ignore[arg-type]
    return one


STATISTICS: Mapping[str, Statistic] = {s.name: s for s in (
    Statistic("pearson", _unless_undefined(_coef.pearson), _coef.pearson, _pearson_drawn,
              _pearson_rows, williams=True),
    # what spearmanr computes: Pearson on average ranks
    Statistic("spearman", _unless_undefined(_coef.spearman),
              lambda xs, ys: _coef.pearson(_coef.rankdata(xs), _coef.rankdata(ys)),
              _spearman_drawn, lambda mx, my, valid: _pearson_rows(
                  _ranks(mx, valid), _ranks(my, valid), valid), williams=True),
    Statistic("kendall", _unless_undefined(_coef.kendall), _kendall_rows, _kendall_drawn,
              _kendall_systems, williams=True),
    Statistic("ccc", _unless_undefined(_ccc), _ccc, _ccc_drawn, _ccc_systems, williams=False),
    Statistic("pairwise_accuracy", _pairwise, None, None, _pairwise_systems, williams=False),
)}
"""The statistics by name, in the order they are reported."""

if set(METHODS) != {s.name for s in STATISTICS.values() if s.rows is not None}:
    raise ImportError("runner.job.spec.METHODS must name the statistics of "
                      "runner.reduce.statistics that have a sample level")
