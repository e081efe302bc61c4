"""Correlate judge scores with human judgments at sample, dataset and system level.

* sample: per group (one source), correlate judge and human over its outputs, then take the
  plain mean over groups. A group with fewer than two items or a constant side has no
  coefficient: ``policy="skip"`` drops it (Wang et al. 2023, G-Eval), ``policy="zero"``
  counts it as 0 (Lai et al. 2023).
* dataset: one coefficient over all items pooled.
* system: mean judge and mean human per system, correlated over systems, plus pairwise
  accuracy (Kocmi et al. 2021): the share of system pairs whose judge and human
  differences have the same sign (a tie agrees only with a tie). It rests on `n_systems`
  points, not on the items: with at least MIN_SYSTEMS systems a 95% CI comes from the same
  resamples of groups (system means recomputed from the drawn groups); with fewer, none, and
  the reports warn (three systems give "spearman 1.000" from any 90 items that rank them).

Subset "all": sample level averages over all groups, dataset level pools all items, system
level is the mean of the subsets' values. Data without subsets (subset "") reports "all" only.

Items whose judge score is missing (None/NaN, a parse failure) are dropped first.

Input: a `runner.reduce.series.Series` (numpy columns with label codes), or `Row`s made one by
Series.of_rows: one code path inside.

Bootstrap: groups are drawn with replacement (within each subset, for "all"). One matrix of draw
counts per selection, seeded, is shared by every method and level, so paired judges see the same
resamples; it comes from a `runner.reduce.resample.Resamples` the caller owns (one per report
set: every judge and aspect of a data set reuses it), never from module state. Point values are
scipy.stats' statistics, computed by runner.reduce._coef with scipy's own operations in numpy
(the same bits, without importing scipy; sample-level Kendall over groups of up to 64 items:
scipy's counts and arithmetic, vectorised); resampled dataset-level values are the same
statistics written as weighted sums over the drawn groups, which is what makes 1,000 resamples
cheap (the tests check them against scipy on explicitly resampled rows). Kendall's concordance
sum is quadratic in the draw counts; runner.reduce._kendall evaluates it exactly, by a merge
sort over the distinct (judge, human) cells planned once per selection (per resample O(cells x
log2(distinct values of the side with fewer))) or, when cheaper (few groups, both sides near-
continuous), by a groups x groups matrix of at most 4,096 groups.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from runner.errors import ConfigError, DataError
from runner.reduce import _coef, _kendall
from runner.reduce._systems import system_rows
from runner.reduce.resample import Draws, Resamples, blocks
from runner.reduce.series import Series

__all__ = ["Comparison", "Correlation", "Row", "compare", "correlate"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]

POLICIES = ("skip", "zero")
LEVELS = ("sample", "dataset", "system")
METHODS = ("pearson", "spearman", "kendall", "pairwise_accuracy")
MIN_SYSTEMS = 5
"""System level: fewer systems than this get no CI, and a warning in the reports."""
# Largest number of float64 cells held in one temporary array (32 MiB).
_CELLS = 1 << 22
# Groups up to this size get sample-level Kendall from pair counts, not a scipy call each.
_SHORT = 64


class Row(NamedTuple):
    """One judged output (a NamedTuple, made once per judge and cell: a tenth of a frozen
    dataclass's construction time)."""

    group: str  # the source it was generated from (document, story beginning, sentence)
    system: str  # the system that generated it
    subset: str  # e.g. a transfer direction; "" when the data has none
    judge: float | None  # None (or NaN) when the judge's reply could not be parsed
    human: float


@dataclass(frozen=True, slots=True)
class Correlation:
    """One coefficient. ``n_groups``/``n_items`` count what it was computed from."""

    level: str  # sample | dataset | system
    method: str  # pearson | spearman | kendall | pairwise_accuracy
    subset: str  # a subset name or "all"
    value: float | None  # None when undefined (too few groups, constant scores)
    n_groups: int  # sample level: groups averaged (after skip); else groups present
    n_items: int
    ci_low: float | None  # 95% percentile bootstrap CI; at system level only from MIN_SYSTEMS
    ci_high: float | None
    n_systems: int = 0  # distinct systems among the items (the system level's sample size)


@dataclass(frozen=True, slots=True)
class Comparison:
    """Judge a minus judge b on the same items, with a paired bootstrap test."""

    level: str
    method: str
    subset: str
    judge_a: float | None
    judge_b: float | None
    diff: float | None  # judge_a - judge_b
    ci_low: float | None
    ci_high: float | None
    p_value: float | None  # two-sided, bootstrap distribution shifted to the null
    n_groups: int  # groups resampled


@dataclass(frozen=True, slots=True)
class _Data:
    """Usable rows sorted by (subset, group), so each group's items are contiguous.

    Group g holds items ``edges[g]:edges[g + 1]`` (never empty); subset k holds groups
    ``bounds[k]:bounds[k + 1]``.
    """

    x: FloatArray  # judge
    y: FloatArray  # human
    system: IntArray  # system index per item
    edges: IntArray
    bounds: IntArray
    subsets: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Selection:
    name: str
    g0: int  # groups g0:g1
    g1: int
    strata: tuple[int, ...]  # group counts of consecutive strata, each resampled on its own


@dataclass(frozen=True, slots=True)
class _Stat:
    value: float | None
    boot: FloatArray | None  # one value per resample, NaN where undefined
    n_groups: int
    n_items: int


def _prepare(s: Series) -> _Data:
    """Usable rows (finite judge and human) in (subset, group) order: subsets and groups in
    order of first appearance among them, each group's items in row order; systems numbered
    by their names' sorted order."""
    x, y = s.judge, s.human
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    width = max(len(s.labels.groups), 1)
    code = s.subset[ok].astype(np.int64) * width + s.group[ok]
    # (subset, group) pairs ranked by first appearance among the usable rows; subsets likewise
    uniq, first_at, inverse = np.unique(code, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    appearance = np.argsort(first_at, kind="stable")
    group_rank = np.empty(len(uniq), dtype=np.intp)
    group_rank[appearance] = np.arange(len(uniq))
    subset_codes = dict.fromkeys((uniq[appearance] // width).tolist())
    subsets = tuple(s.labels.subsets[c] for c in subset_codes)
    if "all" in subsets:
        raise DataError('subset name "all" is reserved for the overall value; rename the subset')
    subset_of = {c: i for i, c in enumerate(subset_codes)}
    group_subset = np.array([subset_of[c] for c in (uniq // width).tolist()], dtype=np.intp)
    perm = np.lexsort((group_rank[inverse], group_subset[inverse]))  # stable: row order inside
    order, kept = ok[perm], inverse[perm]
    firsts = np.flatnonzero(np.r_[True, kept[1:] != kept[:-1]]) if len(kept) else kept
    present = np.unique(s.system[order])
    by_name = sorted(present.tolist(), key=lambda c: s.labels.systems[c])
    rank = np.zeros(int(present.max()) + 1 if present.size else 0, dtype=np.intp)
    rank[by_name] = np.arange(len(by_name))
    bounds = np.searchsorted(group_subset[kept[firsts]], np.arange(len(subsets)))
    return _Data(
        x=x[order], y=y[order],
        system=rank[s.system[order]].astype(np.intp),
        edges=np.r_[firsts, len(kept)].astype(np.intp),
        bounds=np.r_[bounds, len(firsts)].astype(np.intp),
        subsets=subsets,
    )


def _series(data: Series | Sequence[Row]) -> Series:
    return data if isinstance(data, Series) else Series.of_rows(data)


def _selections(d: _Data) -> list[_Selection]:
    n_groups = len(d.edges) - 1
    if d.subsets in ((), ("",)):
        return [_Selection("all", 0, n_groups, (n_groups,))]
    b = [int(v) for v in d.bounds]
    parts = [_Selection(s, b[k], b[k + 1], (b[k + 1] - b[k],)) for k, s in enumerate(d.subsets)]
    return [*parts, _Selection("all", 0, n_groups, tuple(p.strata[0] for p in parts))]


def _check(policy: str, levels: Sequence[str], methods: Sequence[str], n_boot: int) -> None:
    if policy not in POLICIES:
        raise ConfigError(f"policy must be 'skip' or 'zero' (got {policy!r})")
    for kind, given, known in (("level", levels, LEVELS), ("method", methods, METHODS)):
        for name in given:
            if name not in known:
                raise ConfigError(f"unknown {kind} {name!r}; choose from {', '.join(known)}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 0:
        raise ConfigError(f"n_boot must be a non-negative integer (got {n_boot!r})")


def _scipy_rows(method: str, xs: FloatArray, ys: FloatArray) -> FloatArray:
    """One coefficient per row of xs/ys (no row constant), as scipy.stats computes it."""
    if method == "pearson":
        r = _coef.pearson(xs, ys)
    elif method == "spearman":  # what spearmanr computes: Pearson on average ranks
        r = _coef.pearson(_coef.rankdata(xs), _coef.rankdata(ys))
    elif xs.shape[1] <= _SHORT:  # scipy's kendalltau calls itself once per row
        r = _kendall.tau_b_rows(xs, ys)
    else:
        r = np.array([_coef.kendall(x, y) for x, y in zip(xs, ys, strict=True)])
    return np.asarray(r, dtype=np.float64)


def _group_coefs(d: _Data, method: str) -> FloatArray:
    """Coefficient per group, NaN where undefined; groups of equal size go to scipy at once."""
    sizes = np.diff(d.edges)
    out = np.full(len(sizes), np.nan)
    for m in np.unique(sizes[sizes >= 2]):
        gs = np.flatnonzero(sizes == m)
        idx = d.edges[gs][:, None] + np.arange(m)
        xs, ys = d.x[idx], d.y[idx]
        ok = (np.ptp(xs, axis=1) > 0) & (np.ptp(ys, axis=1) > 0)
        if ok.any():
            out[gs[ok]] = _scipy_rows(method, xs[ok], ys[ok])
    return out


def _pooled(method: str, x: FloatArray, y: FloatArray) -> float | None:
    """One scipy coefficient, or None if undefined (fewer than 2 points, a constant side)."""
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    if method == "pearson":
        return float(_coef.pearson(x, y))
    if method == "spearman":
        return _coef.spearman(x, y)
    return _coef.kendall(x, y)


def _table(v: npt.NDArray[Any], gid: IntArray,
           n_groups: int) -> tuple[_kendall.Counts, npt.NDArray[Any], IntArray]:
    """(G, U) count of each group's items per distinct value of v; the U values; and each
    item's value index."""
    uniq, value = np.unique(v, return_inverse=True)
    value = value.ravel()
    return _kendall.counts(value, gid, (n_groups, len(uniq))), uniq, value


@dataclass(frozen=True, slots=True)
class _Pooled:
    """Per-group summaries of one selection, enough to pool any resample's items."""

    moments: FloatArray  # (G, 6) sums of 1, x, y, x^2, y^2, xy (x, y centred)
    txy: _kendall.Counts  # (G, K) items per distinct (x, y) cell
    cx: IntArray  # (K,) x value index of each cell (cells are in x order); likewise cy
    cy: IntArray
    x_starts: IntArray  # (Ux,) where each x value's cells begin
    y_order: IntArray  # (K,) the cells in y order, and where each y value's begin
    y_starts: IntArray
    kendall: _kendall.Pairs | None  # concordance sums, if kendall is wanted

    def drawn(self, c: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Items drawn by resamples c per distinct x value, y value and (x, y) cell, each
        (values, resamples): the cells' counts, summed by x and by y (whole numbers, so
        exactly the per-value tables' products)."""
        wxy = self.txy.drawn(c)
        wx = np.add.reduceat(wxy, self.x_starts, axis=0)
        wy = np.add.reduceat(wxy[self.y_order], self.y_starts, axis=0)
        return wx, wy, wxy


def _summarise(d: _Data, sel: _Selection, kendall: int | None) -> _Pooled:
    """kendall: None, or the number of resamples Kendall's sums will be wanted for."""
    i0, i1, n_groups = int(d.edges[sel.g0]), int(d.edges[sel.g1]), sel.g1 - sel.g0
    x, y, edges = d.x[i0:i1], d.y[i0:i1], d.edges[sel.g0:sel.g1 + 1] - i0
    a, c = x - x.mean(), y - y.mean()
    parts = np.stack([np.ones_like(a), a, c, a * a, c * c, a * c], axis=1)
    gid = np.repeat(np.arange(n_groups), np.diff(edges))
    ux = np.unique(x, return_inverse=True)[1].ravel()
    y_values, uy = np.unique(y, return_inverse=True)
    n_y = len(y_values)
    txy, cells, _ = _table(ux * n_y + uy.ravel(), gid, n_groups)
    cx, cy = cells // n_y, cells % n_y  # cells sorted by x, then y
    y_order = np.argsort(cy, kind="stable")
    return _Pooled(np.add.reduceat(parts, edges[:-1], axis=0), txy, cx, cy,
                   np.flatnonzero(np.r_[True, cx[1:] != cx[:-1]]), y_order,
                   np.flatnonzero(np.r_[True, np.diff(cy[y_order]) != 0]),
                   None if kendall is None else _kendall.pairs(x, y, edges, cx, cy, kendall))


def _boot_chunk(p: _Pooled, methods: Sequence[str], c: FloatArray) -> dict[str, FloatArray]:
    """Pooled coefficients for resamples c (rows: draw counts per group), NaN if undefined.

    Weights are laid out (values, resamples) so that cumsum and gathers run along rows.
    """
    wx, wy, wxy = p.drawn(c)
    out: dict[str, FloatArray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        if "pearson" in methods:
            n, sa, sc, saa, scc, sac = (c @ p.moments).T  # one-pass: fine once centred
            out["pearson"] = (sac - sa * sc / n) / np.sqrt((saa - sa * sa / n) *
                                                           (scc - sc * sc / n))
        n, wx2, wy2 = wx.sum(axis=0), wx * wx, wy * wy
        if "spearman" in methods:
            rx = np.cumsum(wx, axis=0) - (wx - 1) / 2  # average rank of each distinct value
            ry = np.cumsum(wy, axis=0) - (wy - 1) / 2
            centre = n * ((n + 1) / 2) ** 2  # the ranks' mean is (n + 1) / 2 exactly
            cov = (wxy * rx[p.cx] * ry[p.cy]).sum(axis=0) - centre
            # sum of squared deviations of average ranks: (n^3 - sum of tie sizes cubed) / 12
            out["spearman"] = 12 * cov / np.sqrt((n * n * n - (wx2 * wx).sum(axis=0)) *
                                                 (n * n * n - (wy2 * wy).sum(axis=0)))
        if p.kendall is not None:
            untied_x, untied_y = n * n - wx2.sum(axis=0), n * n - wy2.sum(axis=0)
            out["kendall"] = p.kendall.sums(c, wxy) / np.sqrt(untied_x * untied_y)
    undefined = ((wx > 0).sum(axis=0) < 2) | ((wy > 0).sum(axis=0) < 2)  # a constant side
    return {m: np.where(undefined, np.nan, r) for m, r in out.items()}


def _boot_pooled(d: _Data, sel: _Selection, methods: Sequence[str],
                 counts: FloatArray | Draws) -> dict[str, FloatArray]:
    """The pooled coefficient per resample of sel's groups, resamples taken in chunks."""
    p = _summarise(d, sel, len(counts) if "kendall" in methods else None)
    width = max(p.txy.shape[1], 1)  # at least as many cells as x or y values
    step = max(1, _CELLS // 8 // width)
    if isinstance(counts, Draws):  # the block of counts itself kept under _CELLS too
        step = max(1, min(step, _CELLS // max(sum(counts.strata), 1)))
    chunks = [_boot_chunk(p, methods, c) for c in blocks(counts, step)]
    return {m: np.concatenate([ch[m] for ch in chunks]) for m in methods}


def _samples(coefs: Mapping[str, FloatArray], sizes: IntArray,
             counts: FloatArray | Draws | None, policy: str) -> dict[str, _Stat]:
    """Sample-level statistics of each method from its per-group coefficients; with counts,
    each resample's mean over the groups it drew (one pass over the counts for every method)."""
    used, vals = {}, {}
    for m, c in coefs.items():
        defined = ~np.isnan(c)
        used[m] = defined if policy == "skip" else np.ones_like(defined)
        vals[m] = np.where(defined, c, 0.0)
    boots: dict[str, FloatArray] = {}
    if counts is not None:
        # a float operand: a bool one would skip BLAS
        weights = {m: used[m].astype(np.float64) for m in coefs}
        if isinstance(counts, Draws):
            step = max(1, _CELLS // max(sum(counts.strata), 1))
            parts: dict[str, list[tuple[FloatArray, FloatArray]]] = {m: [] for m in coefs}
            for block in counts.blocks(step):
                for m in coefs:
                    parts[m].append((block @ weights[m], block @ vals[m]))
            sums = {m: (np.concatenate([d for d, _ in parts[m]]),
                        np.concatenate([n for _, n in parts[m]])) for m in coefs}
        else:
            sums = {m: (counts @ weights[m], counts @ vals[m]) for m in coefs}
        with np.errstate(divide="ignore", invalid="ignore"):
            boots = {m: np.where(den > 0, num / den, np.nan) for m, (den, num) in sums.items()}
    out = {}
    for m in coefs:
        k = int(used[m].sum())
        out[m] = _Stat(float(vals[m][used[m]].mean()) if k else None, boots.get(m), k,
                       int(sizes[used[m]].sum()))
    return out


def _level_stats(d: _Data, level: str, methods: Sequence[str], policy: str, n_boot: int,
                 seed: int, resamples: Resamples) -> Iterator[tuple[_Selection, str, _Stat]]:
    """Sample- or dataset-level statistics for every selection, in selection-major order."""
    methods = [m for m in methods if m != "pairwise_accuracy"]
    sizes = np.diff(d.edges)
    coefs = {m: _group_coefs(d, m) for m in methods} if level == "sample" else {}
    for sel in _selections(d):
        counts = (resamples.counts(sel.strata, n_boot, seed) if n_boot and sel.g1 > sel.g0
                  else None)
        if level == "sample":
            stats = _samples({m: coefs[m][sel.g0:sel.g1] for m in methods},
                             sizes[sel.g0:sel.g1], counts, policy)
            for m in methods:
                yield sel, m, stats[m]
            continue
        i0, i1 = int(d.edges[sel.g0]), int(d.edges[sel.g1])
        boots = {} if counts is None else _boot_pooled(d, sel, methods, counts)
        for m in methods:
            value = _pooled(m, d.x[i0:i1], d.y[i0:i1])
            yield sel, m, _Stat(value, boots.get(m), sel.g1 - sel.g0, i1 - i0)


def _system_value(method: str, mx: FloatArray, my: FloatArray) -> float | None:
    if method != "pairwise_accuracy":
        return _pooled(method, mx, my)
    if len(mx) < 2:
        return None
    iu = np.triu_indices(len(mx), 1)
    agree = np.sign((mx[:, None] - mx)[iu]) == np.sign((my[:, None] - my)[iu])
    return float(agree.mean())


def _system_level(d: _Data, methods: Sequence[str], n_boot: int, seed: int,
                  resamples: Resamples) -> list[Correlation]:
    """System level per subset; "all" averages the subsets (None if any is undefined).
    A selection with MIN_SYSTEMS systems or more gets a bootstrap CI over its groups."""
    methods = [*(m for m in methods if m != "pairwise_accuracy"), "pairwise_accuracy"]
    out: list[Correlation] = []
    for sel in _selections(d):
        i0, i1 = int(d.edges[sel.g0]), int(d.edges[sel.g1])
        parts = [c for c in out if c.subset != "all"]
        ids = d.system[i0:i1]
        n_systems = len(np.unique(ids))
        boot = (_system_boot(d, sel, methods, n_boot, seed, resamples)
                if n_systems >= MIN_SYSTEMS and n_boot and not (sel.name == "all" and parts)
                else {})
        for m in methods:
            if sel.name == "all" and parts:
                vals = [c.value for c in parts if c.method == m]
                value = None if None in vals else sum(v for v in vals if v is not None) / len(vals)
            else:
                mx, my = (np.array([v[i0:i1][ids == s].mean() for s in np.unique(ids)])
                          for v in (d.x, d.y))
                value = _system_value(m, mx, my)
            out.append(Correlation("system", m, sel.name, value, sel.g1 - sel.g0, i1 - i0,
                                   *_ci(None if value is None else boot.get(m)),
                                   n_systems=n_systems))
    return out


def _system_boot(d: _Data, sel: _Selection, methods: Sequence[str], n_boot: int,
                 seed: int, resamples: Resamples) -> dict[str, FloatArray]:
    """Each method's system-level value on every resample of the selection's groups: the
    per-system means of the drawn groups' items (a system no drawn group has is left out)."""
    g0, g1 = sel.g0, sel.g1
    i0 = int(d.edges[g0])
    ids = d.system[i0:int(d.edges[g1])]
    systems = np.unique(ids)
    col = np.searchsorted(systems, ids)
    group = np.repeat(np.arange(g1 - g0), np.diff(d.edges[g0:g1 + 1]))
    shape = (g1 - g0, len(systems))
    sums = [np.zeros(shape) for _ in range(3)]
    for total, values in zip(sums, (d.x[i0:i0 + len(ids)], d.y[i0:i0 + len(ids)],
                                    np.ones(len(ids))), strict=True):
        np.add.at(total, (group, col), values)
    drawn = resamples.counts(sel.strata, n_boot, seed)
    chunks = drawn.blocks(max(1, _CELLS // max(shape[0], 1))) if isinstance(drawn, Draws) \
        else iter([drawn])
    parts: dict[str, list[FloatArray]] = {m: [] for m in methods}
    for counts in chunks:
        n = counts @ sums[2]
        with np.errstate(invalid="ignore", divide="ignore"):
            mx, my = (counts @ sums[0]) / n, (counts @ sums[1]) / n
        for m in methods:
            parts[m].append(system_rows(m, mx, my, n > 0))
    out = {m: np.concatenate(v) for m, v in parts.items()}
    return out


def _ci(boot: FloatArray | None) -> tuple[float | None, float | None]:
    if boot is None or not (ok := boot[~np.isnan(boot)]).size:
        return None, None
    low, high = np.percentile(ok, [2.5, 97.5])
    return float(low), float(high)


def correlate(rows: Series | Sequence[Row], *, policy: str = "skip",
              levels: Sequence[str] = ("sample", "dataset", "system"),
              methods: Sequence[str] = ("pearson", "spearman", "kendall"),
              n_boot: int = 1000, seed: int = 0,
              resamples: Resamples | None = None) -> list[Correlation]:
    """Correlate judge with human scores.

    Args:
        rows: judged outputs, a Series (or `Row`s, made one by Series.of_rows); rows whose
            judge (or human) score is NaN (None) are dropped.
        policy: "skip" drops sample-level groups without a coefficient, "zero" counts them as 0.
        levels: any of sample, dataset, system.
        methods: any of pearson, spearman, kendall; pairwise_accuracy is always added at
            system level and ignored elsewhere.
        n_boot: bootstrap resamples of groups for sample/dataset CIs (0: no CIs).
        seed: seed of the numpy Generator drawing the resamples.
        resamples: the draw counts already drawn for the caller's other judges (one per
            report set); a fresh one if None.

    Returns:
        Level by level (in the order given), each subset then "all", each method.

    Raises:
        ConfigError: unknown policy, level or method, or a bad n_boot.
        DataError: a subset is named "all".
    """
    _check(policy, levels, methods, n_boot)
    d = _prepare(_series(rows))
    resamples = Resamples() if resamples is None else resamples
    out: list[Correlation] = []
    for level in levels:
        if level == "system":
            out += _system_level(d, methods, n_boot, seed, resamples)
            continue
        for sel, m, st in _level_stats(d, level, methods, policy, n_boot, seed, resamples):
            i0, i1 = int(d.edges[sel.g0]), int(d.edges[sel.g1])
            out.append(Correlation(level, m, sel.name, st.value, st.n_groups, st.n_items,
                                   *_ci(st.boot), n_systems=len(np.unique(d.system[i0:i1]))))
    return out


def _keys(a: Series, b: Series) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Each row's (group, system, subset) as one integer, the same in both series (their
    labels may differ)."""
    out = [np.zeros(len(a), dtype=np.int64), np.zeros(len(b), dtype=np.int64)]
    for field in ("groups", "systems", "subsets"):
        known: dict[str, int] = {}
        codes = []
        for s in (a, b):
            labels: Sequence[str] = getattr(s.labels, field)
            column = getattr(s, field[:-1])
            table = np.array([known.setdefault(n, len(known)) for n in labels] or [0],
                             dtype=np.int64)
            codes.append(table[column])
        width = max(len(known), 1)
        out = [o * width + c for o, c in zip(out, codes, strict=True)]
    return out[0], out[1]


def _duplicate(s: Series, key: npt.NDArray[np.int64], name: str) -> None:
    """DataError for the first row whose (group, system, subset) an earlier row has."""
    uniq, first = np.unique(key, return_index=True)
    if len(uniq) == len(key):
        return
    seen_before = np.ones(len(key), dtype=bool)
    seen_before[first] = False
    i = int(np.flatnonzero(seen_before)[0])
    g, sy, sb = (s.labels.groups[int(s.group[i])], s.labels.systems[int(s.system[i])],
                 s.labels.subsets[int(s.subset[i])])
    raise DataError(f"judge {name} has two rows for group {g!r}, system {sy!r}, subset "
                    f"{sb!r}; compare needs one each")


def _take(s: Series, rows: npt.NDArray[np.intp]) -> Series:
    return Series(s.judge[rows], s.human[rows], s.group[rows], s.system[rows], s.subset[rows],
                  s.labels)


def _pair(a: Series, b: Series) -> tuple[Series, Series]:
    """Rows present and scored by both judges, in a's order, matched on (group, system,
    subset)."""
    ka, kb = _keys(a, b)
    _duplicate(a, ka, "a")
    _duplicate(b, kb, "b")
    order = np.argsort(kb, kind="stable")
    at = np.searchsorted(kb[order], ka)
    found = at < len(kb)
    found[found] = kb[order][at[found]] == ka[found]
    ia = np.flatnonzero(found)
    ib = order[at[ia]]
    usable = (np.isfinite(a.judge[ia]) & np.isfinite(a.human[ia]) & np.isfinite(b.judge[ib])
              & np.isfinite(b.human[ib]))
    ia, ib = ia[usable], ib[usable]
    differ = np.flatnonzero(a.human[ia] != b.human[ib])
    if differ.size:
        i, j = int(ia[differ[0]]), int(ib[differ[0]])
        raise DataError(f"group {a.labels.groups[int(a.group[i])]!r}, system "
                        f"{a.labels.systems[int(a.system[i])]!r}: the two judges' rows carry "
                        f"different human scores ({float(a.human[i])} vs {float(b.human[j])})")
    return _take(a, ia), _take(b, ib)


def _comparison(level: str, method: str, sel: _Selection, sa: _Stat, sb: _Stat) -> Comparison:
    diff = None if sa.value is None or sb.value is None else sa.value - sb.value
    low = high = p = None
    if diff is not None and sa.boot is not None and sb.boot is not None:
        dist = sa.boot - sb.boot
        dist = dist[~np.isnan(dist)]
        if dist.size:
            low, high = _ci(dist)
            # Shift the bootstrap distribution to the null (diff 0) and count as extreme.
            p = float((1 + np.sum(np.abs(dist - diff) >= abs(diff))) / (1 + dist.size))
    return Comparison(level, method, sel.name, sa.value, sb.value, diff, low, high, p,
                      sel.g1 - sel.g0)


def compare(a: Series | Sequence[Row], b: Series | Sequence[Row], *, policy: str = "skip",
            levels: Sequence[str] = ("sample", "dataset"),
            methods: Sequence[str] = ("pearson", "spearman", "kendall"),
            n_boot: int = 1000, seed: int = 0,
            resamples: Resamples | None = None) -> list[Comparison]:
    """Paired bootstrap comparison of two judges' correlations with the same human scores.

    Rows are matched on (group, system, subset); only items both judges scored are used,
    and both judges' coefficients are computed on the same group resamples.

    Args:
        a, b: the two judges' rows, as for `correlate`.
        policy, levels, methods, n_boot, seed, resamples: as for `correlate` (no system
            level).

    Returns:
        Level by level, each subset then "all", each method: a minus b.

    Raises:
        ConfigError: as for correlate, or "system" among the levels.
        DataError: duplicate rows for one output, or matched rows with different humans.
    """
    _check(policy, levels, methods, n_boot)
    if "system" in levels:
        raise ConfigError("compare supports levels sample and dataset (got 'system')")
    ra, rb = _pair(_series(a), _series(b))
    da, db = _prepare(ra), _prepare(rb)
    resamples = Resamples() if resamples is None else resamples
    out: list[Comparison] = []
    for level in levels:
        for (sel, m, sa), (_, _, sb) in zip(
                _level_stats(da, level, methods, policy, n_boot, seed, resamples),
                _level_stats(db, level, methods, policy, n_boot, seed, resamples), strict=True):
            out.append(_comparison(level, m, sel, sa, sb))
    return out
