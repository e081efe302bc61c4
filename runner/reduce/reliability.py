"""Is the judge reliable? Pure functions over scores already judged (zero calls): agreement
(alpha, weighted_kappa, agreement), partial correlation (partial), and the significance of two
judges' difference (williams, permutation_p). Position bias: runner.reduce.positions; sample
sizes: runner.reduce.power.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal, get_args

import krippendorff
import numpy as np
import numpy.typing as npt

from runner.reduce import _coef
from runner.reduce.statistics import STATISTICS

__all__ = ["Values", "agreement", "alpha", "correlation", "partial",
           "permutation_p", "weighted_kappa", "williams"]

FloatArray = npt.NDArray[np.float64]
Values = Sequence[float] | FloatArray
Level = Literal["nominal", "ordinal", "interval", "ratio"]
LEVELS: tuple[Level, ...] = get_args(Level)
MAX_VALUES = 1000  # above this many distinct values: interval alpha in closed form, else None
MAX_CATEGORIES = 1000  # weighted kappa's k x k table


def alpha(table: Sequence[Sequence[float | None]], level: Level = "interval") -> float | None:
    """Krippendorff's alpha of a coders x units table (None = missing).

    Units coded by fewer than two coders do not count (Krippendorff 2011). None when fewer
    than two units are pairable or every pairable value is the same (alpha undefined), and
    for levels other than interval when there are more than MAX_VALUES distinct values
    (continuous scores: the package's tables would grow as values^2).

    Args:
        table: one row a coder, one column a unit.
        level: the level of measurement, one of LEVELS.

    Returns:
        alpha, or None where it is undefined or not computed.

    Raises:
        ValueError: an unknown level.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)} (got {level!r})")
    data = np.array(table, dtype=float)  # None becomes NaN
    if data.ndim != 2 or data.shape[0] < 2:
        return None
    pairable = data[:, np.sum(~np.isnan(data), axis=0) >= 2]
    values = pairable[~np.isnan(pairable)]
    distinct = np.unique(values).size
    if pairable.shape[1] < 2 or distinct < 2:
        return None
    if distinct > MAX_VALUES:  # the package builds values x values and units x values tables
        return _interval_alpha(pairable) if level == "interval" else None
    return _krippendorff(pairable, level)


def _krippendorff(data: FloatArray, level: Level) -> float:
    """krippendorff.alpha(reliability_data=data, level_of_measurement=level) with the
    package's own arithmetic, but its coincidence matrix summed over the pairs of values each
    unit has (the package builds a units x values x values array: about a second a call for a
    0-100 scale over a few thousand units). tests/test_reliability.py checks the bits."""
    domain = np.unique(data[~np.isnan(data)])
    n_units, n_values = data.shape[1], len(domain)
    coder, unit = np.nonzero(~np.isnan(data))
    cell = unit * n_values + np.searchsorted(domain, data[coder, unit])
    counts = np.bincount(cell, minlength=n_units * n_values).reshape(n_units, n_values)
    return _alpha_of(_coincidences(counts), domain, level)


def _alpha_of(o: FloatArray, domain: FloatArray, level: Level) -> float:
    """alpha from the coincidence matrix `o` over the sorted values `domain`."""
    n_v = o.sum(axis=0)
    package = krippendorff.krippendorff
    e: FloatArray = package._random_coincidences(n_v)
    d: FloatArray = package._distances(domain, package._distance_metric(level), n_v)
    return float(1 - (o * d).sum() / (e * d).sum())


def _coincidences(counts: npt.NDArray[np.int64]) -> FloatArray:
    """The package's coincidence matrix of a units x values table of counts: per unit,
    (c_v c_w - [v = w] c_v) / (m_u - 1), summed over the units in order (the same additions
    as the package's sum over its first axis; the units' zero terms left out)."""
    n_values = counts.shape[1]
    pairable = np.maximum(counts.sum(axis=1), 2)
    unit, value = np.nonzero(counts)  # by unit, then value
    per_unit = np.bincount(unit, minlength=len(counts))
    reps = per_unit[unit]  # each entry meets every entry of its unit, itself included
    left = np.repeat(np.arange(len(unit)), reps)
    start = (np.cumsum(per_unit) - per_unit)[unit[left]]
    right = start + np.arange(len(left)) - np.repeat(np.cumsum(reps) - reps, reps)
    c = counts[unit, value].astype(np.float64)
    pair = c[left] * c[right] - np.where(left == right, c[left], 0.0)
    weight = pair / (pairable[unit[left]] - 1)
    summed = np.bincount(value[left] * n_values + value[right], weights=weight,
                         minlength=n_values * n_values)  # float64 with weights
    return np.asarray(summed, dtype=np.float64).reshape(n_values, n_values)


def _interval_alpha(data: FloatArray) -> float:
    """Interval alpha without a coincidence matrix: with squared differences, both
    disagreements are sums of squares. Ordered pairs within a unit of m values sum to
    2 (m S2 - S1^2); D_o = sum over units of that / (m - 1), / n; D_e = the same over all
    n pairable values, / (n (n - 1))."""
    present = ~np.isnan(data)
    m = present.sum(axis=0).astype(float)
    v = np.where(present, data, 0.0)
    s1, s2 = v.sum(axis=0), (v ** 2).sum(axis=0)
    n = float(m.sum())
    observed = float((2 * (m * s2 - s1 ** 2) / (m - 1)).sum()) / n
    expected = 2 * (n * float(s2.sum()) - float(s1.sum()) ** 2) / (n * (n - 1))
    return 1 - observed / expected


def agreement(x: Values, y: Values) -> tuple[float | None, float | None, float | None]:
    """(alpha ordinal, alpha interval, quadratic-weighted kappa) of two raters who both rated
    every unit: x[i] and y[i] are unit i's two values. Equal, bit for bit, to
    alpha([x, y], "ordinal"), alpha([x, y], "interval") and weighted_kappa(x, y)
    (tests/test_reliability.py), in one pass: with two values a unit, the coincidence matrix
    is the contingency table plus its transpose, counted with one bincount, where alpha's
    general path enumerates each unit's pairs (reliability.csv of a 100k-item study compares
    300 pairs of judges a data set and aspect: ~0.1 s a pair that way).

    Args:
        x, y: the two raters' values, unit by unit.

    Returns:
        (alpha ordinal, alpha interval, kappa), each None where undefined.
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.ndim != 1 or xs.shape != ys.shape or np.isnan(xs).any() or np.isnan(ys).any():
        rows = [xs.tolist(), ys.tolist()]  # missing values: the general path
        return alpha(rows, "ordinal"), alpha(rows, "interval"), weighted_kappa(xs, ys)
    kappa = weighted_kappa(xs, ys)
    domain, codes = _codes(np.concatenate([xs, ys]))
    if xs.size < 2 or domain.size < 2:
        return None, None, kappa
    if domain.size > MAX_VALUES:
        return None, _interval_alpha(np.vstack([xs, ys])), kappa
    n = domain.size
    table = np.bincount(codes[:xs.size] * n + codes[xs.size:], minlength=n * n).reshape(n, n)
    o = (table + table.T).astype(np.float64)  # exact: counts well below 2**53
    return _alpha_of(o, domain, "ordinal"), _alpha_of(o, domain, "interval"), kappa


def _codes(values: FloatArray) -> tuple[FloatArray, npt.NDArray[np.intp]]:
    """The sorted distinct values and each value's index among them: np.unique's, counted
    without a sort when the values are integers in a small range (judges' scales)."""
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if values.size and hi - lo <= MAX_CATEGORIES and np.all(values == np.round(values)):
        offsets = (values - lo).astype(np.intp)
        present = np.bincount(offsets, minlength=int(hi - lo) + 1) > 0
        index = np.cumsum(present) - 1
        return (np.flatnonzero(present) + lo).astype(np.float64), index[offsets]
    domain, inverse = np.unique(values, return_inverse=True)
    return domain.astype(np.float64), inverse.astype(np.intp)


def weighted_kappa(a: Values, b: Values,
                   weights: str = "quadratic") -> float | None:
    """Cohen's weighted kappa of two raters over the same items, categories = the integers
    from the smallest to the largest value seen: 1 - sum(w * observed) / sum(w * expected),
    w = |i - j| (linear) or (i - j)^2 (quadratic). None when a value is not an integer, the
    range spans more than MAX_CATEGORIES, the lists differ in length, or the expected
    disagreement is 0.

    Args:
        a, b: the two raters' values, item by item.
        weights: "linear" or "quadratic".

    Returns:
        kappa, or None.
    """
    if weights not in ("linear", "quadratic") or len(a) != len(b) or len(a) == 0:
        return None
    xa, xb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if not (np.all(xa == np.round(xa)) and np.all(xb == np.round(xb))):
        return None
    lo = int(min(xa.min(), xb.min()))
    k = int(max(xa.max(), xb.max())) - lo + 1
    if k > MAX_CATEGORIES:
        return None
    cells = (xa.astype(np.intp) - lo) * k + (xb.astype(np.intp) - lo)
    observed = np.bincount(cells, minlength=k * k).reshape(k, k) / xa.size
    expected = np.outer(observed.sum(axis=1), observed.sum(axis=0))
    diff = np.abs(np.subtract.outer(np.arange(k), np.arange(k))).astype(float)
    w = diff if weights == "linear" else diff ** 2
    disagreement = float((w * expected).sum())
    return None if disagreement == 0 else 1 - float((w * observed).sum()) / disagreement


def correlation(method: str, x: Values, y: Values) -> float | None:
    """A statistic of runner.reduce.statistics (pearson / spearman / kendall ...).

    Args:
        method: a name in runner.reduce.statistics.STATISTICS.
        x, y: the paired variables.

    Returns:
        The statistic; None for fewer than three points or when undefined.
    """
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.size < 3:
        return None
    value = STATISTICS[method].one(xs, ys)
    return None if value is None or math.isnan(value) else value


def partial(method: str, x: Values, y: Values, z: Values,
            corr: Callable[[str, Values, Values], float | None] = correlation
            ) -> float | None:
    """Correlation of x and y controlling for z: (r_xy - r_xz r_yz) / sqrt((1 - r_xz^2)
    (1 - r_yz^2)), each r by `method` (pearson, or spearman: the partial rank correlation);
    `corr` computes them (correlation, or a caller's memo of it).

    Args:
        method: pearson or spearman.
        x, y: the variables correlated; z: the one controlled for.
        corr: the correlation function.

    Returns:
        The partial correlation, or None when undefined.
    """
    rxy, rxz, ryz = corr(method, x, y), corr(method, x, z), corr(method, y, z)
    if rxy is None:
        return None
    rxz, ryz = rxz or 0.0, ryz or 0.0  # a constant z explains nothing
    denominator = math.sqrt((1 - rxz ** 2) * (1 - ryz ** 2))
    return None if denominator == 0 else (rxy - rxz * ryz) / denominator


def williams(r12: float, r13: float, r23: float, n: int) -> tuple[float, float] | None:
    """Williams' t for H0: rho12 = rho13, where variable 1 (the human) is shared and r23 is
    the two judges' correlation with each other; df = n - 3 (Steiger 1980 eq. 7; Graham &
    Baldwin 2014).

    Args:
        r12: corr(human, judge A).
        r13: corr(human, judge B).
        r23: corr(judge A, judge B).
        n: the items all three are computed over.

    Returns:
        (t, two-sided p); None when n < 4 or the correlation matrix is singular.
    """
    k = 1 - r12 ** 2 - r13 ** 2 - r23 ** 2 + 2 * r12 * r13 * r23
    if n < 4 or k <= 0:
        return None
    t = (r12 - r13) * math.sqrt((n - 1) * (1 + r23)) / math.sqrt(
        2 * k * (n - 1) / (n - 3) + ((r12 + r13) ** 2 / 4) * (1 - r23) ** 3)
    return t, float(2 * _coef.scipy_stats().t.sf(abs(t), n - 3))


def permutation_p(method: str, a: Sequence[float], b: Sequence[float], human: Sequence[float],
                  n_perm: int, seed: int = 0) -> float | None:
    """Paired permutation test of corr(a, human) - corr(b, human): each item's two judge
    scores are swapped with probability 1/2 (after each judge is standardised, so scales do not
    matter); two-sided p = (1 + #|diff*| >= |diff|) / (1 + n_perm).

    Args:
        method: pearson, or a rank method (the ranks are permuted; kendall by tau-b).
        a, b: judge A's and judge B's scores; human: the human scores of those items.
        n_perm: the permutations.
        seed: the random generator's seed.

    Returns:
        p, or None for fewer than three items, a constant series or no permutation.
    """
    xa, xb, h = (np.asarray(v, dtype=float) for v in (a, b, human))
    if xa.size < 3 or np.ptp(xa) == 0 or np.ptp(xb) == 0 or np.ptp(h) == 0 or n_perm < 1:
        return None
    if method != "pearson":  # rank methods: permute the ranks
        xa, xb, h = _coef.rankdata(xa), _coef.rankdata(xb), _coef.rankdata(h)
    za, zb = (xa - xa.mean()) / xa.std(), (xb - xb.mean()) / xb.std()
    observed = _diff(method, za[None, :], zb[None, :], h)[0]
    rng = np.random.default_rng(seed)
    extreme = 0
    for start in range(0, n_perm, 256):
        swap = rng.random((min(256, n_perm - start), za.size)) < 0.5
        pa, pb = np.where(swap, zb, za), np.where(swap, za, zb)
        extreme += int(np.sum(np.abs(_diff(method, pa, pb, h)) >= abs(observed) - 1e-12))
    return (1 + extreme) / (1 + n_perm)


def _diff(method: str, a: FloatArray, b: FloatArray, h: FloatArray) -> FloatArray:
    """corr(a_i, h) - corr(b_i, h) for each row i (pearson on values or on ranks; kendall)."""
    if method == "kendall":
        return np.array([_coef.kendall(ra, h) - _coef.kendall(rb, h)
                         for ra, rb in zip(a, b, strict=True)])
    return _rows_pearson(a, h) - _rows_pearson(b, h)


def _rows_pearson(x: FloatArray, y: FloatArray) -> FloatArray:
    xc = x - x.mean(axis=1, keepdims=True)
    yc = y - y.mean()
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = (xc @ yc) / np.sqrt((xc ** 2).sum(axis=1) * (yc ** 2).sum())
    return out
