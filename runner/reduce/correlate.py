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

Bootstrap: groups are drawn with replacement (within each subset, for "all"). One matrix of
draw counts per selection, seeded, is shared by every method and level, so paired judges see
the same resamples. Point values are scipy.stats' statistics, computed by runner.reduce._coef
with scipy's own operations in numpy (the same bits, without importing scipy; sample-level
Kendall over groups of up to 64 items: scipy's counts and arithmetic, vectorised); resampled
dataset-level values are the same statistics written as weighted sums over the drawn groups,
which is what makes 1,000 resamples cheap (the tests check them against scipy on explicitly
resampled rows). Kendall's
concordance sum is quadratic in the draw counts; runner.reduce._kendall evaluates it exactly,
by a merge sort over the distinct (judge, human) cells planned once per selection (per resample
O(cells x log2(distinct values of the side with fewer))) or, when cheaper (few groups, both
sides near-continuous), by a groups x groups matrix of at most 4,096 groups.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from runner.errors import ConfigError, DataError
from runner.reduce import _coef, _kendall
from runner.reduce._systems import system_rows

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
# Draw counts kept for reuse (see _counts): (strata, n_boot, seed) -> counts, at most this many
# float64 cells in all (64 MiB).
_KEPT_CELLS = 1 << 23
# Draws of one stratum taken at a time by _draw (int64, 8 MiB).
_DRAW_CELLS = 1 << 20
_DRAWN: dict[tuple[tuple[int, ...], int, int], FloatArray] = {}


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


def _usable(r: Row) -> bool:
    return r.judge is not None and math.isfinite(r.judge) and math.isfinite(r.human)


def _prepare(rows: Sequence[Row]) -> _Data:
    """Usable rows (finite judge and human) in (subset, group) order: subsets and groups in
    order of first appearance among them, each group's items in row order."""
    # Columns first, then numpy: None (a failed judge) becomes NaN in a float array.
    x = np.array([r.judge for r in rows], dtype=np.float64)
    y = np.array([r.human for r in rows], dtype=np.float64)
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    keys: dict[tuple[str, str], int] = {}
    code = np.array([keys.setdefault((r.subset, r.group), len(keys)) for r in rows],
                    dtype=np.intp)[ok]
    names = list(keys)
    # groups ranked by first appearance among the usable rows; subsets likewise
    first_code, first_at = np.unique(code, return_index=True)
    appearance = first_code[np.argsort(first_at)]
    group_rank = np.empty(len(names), dtype=np.intp)
    group_rank[appearance] = np.arange(len(appearance))
    subsets = tuple(dict.fromkeys(names[c][0] for c in appearance))
    if "all" in subsets:
        raise DataError('subset name "all" is reserved for the overall value; rename the subset')
    subset_of = {s: i for i, s in enumerate(subsets)}
    group_subset = np.array([subset_of.get(n[0], -1) for n in names], dtype=np.intp)
    perm = np.lexsort((group_rank[code], group_subset[code]))  # stable: row order inside
    order, kept = ok[perm], code[perm]
    firsts = np.flatnonzero(np.r_[True, kept[1:] != kept[:-1]]) if len(kept) else kept
    system_names = [rows[i].system for i in order]
    systems = {s: i for i, s in enumerate(sorted(set(system_names)))}
    bounds = np.searchsorted(group_subset[kept[firsts]], np.arange(len(subsets)))
    return _Data(
        x=x[order], y=y[order],
        system=np.array([systems[s] for s in system_names], dtype=np.intp),
        edges=np.r_[firsts, len(kept)].astype(np.intp),
        bounds=np.r_[bounds, len(firsts)].astype(np.intp),
        subsets=subsets,
    )


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


def _counts(strata: tuple[int, ...], n_boot: int, seed: int) -> FloatArray | _Draws:
    """(n_boot, sum(strata)) times each group is drawn, each stratum drawn within itself.

    Read-only, and remembered (up to _KEPT_CELLS cells in all): every judge and aspect of a
    data set, at sample and dataset level, resamples the same groups with the same seed, and
    drawing them is most of a 1,000-resample bootstrap's time. A matrix past _KEPT_CELLS
    (past ~8,000 groups at 1,000 resamples) is never held whole: `_Draws` makes it a block
    of resamples at a time, the same bits."""
    key = (strata, n_boot, seed)
    if (kept := _DRAWN.get(key)) is not None:
        return kept
    if n_boot * sum(strata) > _KEPT_CELLS:
        return _Draws(strata, n_boot, seed)
    counts = _draw(strata, n_boot, seed)
    counts.flags.writeable = False
    while _DRAWN and sum(c.size for c in _DRAWN.values()) + counts.size > _KEPT_CELLS:
        del _DRAWN[next(iter(_DRAWN))]  # the oldest first
    _DRAWN[key] = counts
    return counts


def _draw(strata: tuple[int, ...], n_boot: int, seed: int) -> FloatArray:
    """Each stratum's n_boot x k draws, taken _DRAW_CELLS at a time straight into the result.

    The generator's stream runs on across calls, so the counts are the bits of one
    (n_boot, k) draw per stratum, without holding its int64 draws, their bincount and a
    concatenated copy at once (~4x the result's size at its peak)."""
    rng = np.random.default_rng(seed)
    out = np.empty((n_boot, sum(strata)), dtype=np.float64)
    start = 0
    for k in strata:
        step = max(1, _DRAW_CELLS // max(k, 1))
        for b0 in range(0, n_boot, step):
            rows = min(step, n_boot - b0)
            out[b0:b0 + rows, start:start + k] = _drawn(rng, k, rows)
        start += k
    return out


def _drawn(rng: np.random.Generator, k: int, rows: int) -> npt.NDArray[np.intp]:
    """(rows, k) counts of k groups drawn k times with replacement, per row."""
    draws = rng.integers(0, k, size=(rows, k)) + k * np.arange(rows)[:, None]
    return np.bincount(draws.ravel(), minlength=rows * k).reshape(rows, k)


# Where each stratum's draws start in the seeded stream, by (strata, n_boot, seed): a few
# hundred bytes a stratum, found with one pass over every draw.
_STARTS: dict[tuple[tuple[int, ...], int, int], list[Mapping[str, Any]]] = {}


class _Draws:
    """_draw's matrix of counts, made `step` resamples at a time and never held whole.

    Each stratum gets a generator that starts where that stratum's draws start in the seeded
    stream (the stream runs on across calls, so a block of rows is the same bits as those
    rows of one draw); finding those starts costs one pass over every draw, once per
    (strata, n_boot, seed)."""

    def __init__(self, strata: tuple[int, ...], n_boot: int, seed: int) -> None:
        self.strata, self.n_boot = strata, n_boot
        key = (strata, n_boot, seed)
        if key not in _STARTS:
            rng, starts = np.random.default_rng(seed), []
            for k in strata:
                starts.append(rng.bit_generator.state)
                step = max(1, _DRAW_CELLS // k)
                for b0 in range(0, n_boot, step):
                    rng.integers(0, k, size=(min(step, n_boot - b0), k))
            _STARTS[key] = starts
        self.starts = _STARTS[key]

    def __len__(self) -> int:
        return self.n_boot

    def blocks(self, step: int) -> Iterator[FloatArray]:
        """The matrix's rows, `step` at a time, in order."""
        rngs = []
        for state in self.starts:
            rng = np.random.default_rng(0)
            rng.bit_generator.state = state
            rngs.append(rng)
        for b0 in range(0, self.n_boot, step):
            rows = min(step, self.n_boot - b0)
            block = np.empty((rows, sum(self.strata)), dtype=np.float64)
            start = 0
            for k, rng in zip(self.strata, rngs, strict=True):
                block[:, start:start + k] = _drawn(rng, k, rows)
                start += k
            yield block


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


def _blocks(counts: FloatArray | _Draws, step: int) -> Iterator[FloatArray]:
    if isinstance(counts, _Draws):
        return counts.blocks(step)
    return (counts[b:b + step] for b in range(0, len(counts), step))


def _boot_pooled(d: _Data, sel: _Selection, methods: Sequence[str],
                 counts: FloatArray | _Draws) -> dict[str, FloatArray]:
    """The pooled coefficient per resample of sel's groups, resamples taken in chunks."""
    p = _summarise(d, sel, len(counts) if "kendall" in methods else None)
    width = max(p.txy.shape[1], 1)  # at least as many cells as x or y values
    step = max(1, _CELLS // 8 // width)
    if isinstance(counts, _Draws):  # the block of counts itself kept under _CELLS too
        step = max(1, min(step, _CELLS // max(sum(counts.strata), 1)))
    chunks = [_boot_chunk(p, methods, c) for c in _blocks(counts, step)]
    return {m: np.concatenate([ch[m] for ch in chunks]) for m in methods}


def _samples(coefs: Mapping[str, FloatArray], sizes: IntArray,
             counts: FloatArray | _Draws | None, policy: str) -> dict[str, _Stat]:
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
        if isinstance(counts, _Draws):
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
                 seed: int) -> Iterator[tuple[_Selection, str, _Stat]]:
    """Sample- or dataset-level statistics for every selection, in selection-major order."""
    methods = [m for m in methods if m != "pairwise_accuracy"]
    sizes = np.diff(d.edges)
    coefs = {m: _group_coefs(d, m) for m in methods} if level == "sample" else {}
    for sel in _selections(d):
        counts = _counts(sel.strata, n_boot, seed) if n_boot and sel.g1 > sel.g0 else None
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


def _system_level(d: _Data, methods: Sequence[str], n_boot: int, seed: int
                  ) -> list[Correlation]:
    """System level per subset; "all" averages the subsets (None if any is undefined).
    A selection with MIN_SYSTEMS systems or more gets a bootstrap CI over its groups."""
    methods = [*(m for m in methods if m != "pairwise_accuracy"), "pairwise_accuracy"]
    out: list[Correlation] = []
    for sel in _selections(d):
        i0, i1 = int(d.edges[sel.g0]), int(d.edges[sel.g1])
        parts = [c for c in out if c.subset != "all"]
        ids = d.system[i0:i1]
        n_systems = len(np.unique(ids))
        boot = (_system_boot(d, sel, methods, n_boot, seed)
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
                 seed: int) -> dict[str, FloatArray]:
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
    drawn = _counts(sel.strata, n_boot, seed)
    blocks = drawn.blocks(max(1, _CELLS // max(shape[0], 1))) if isinstance(drawn, _Draws) \
        else iter([drawn])
    parts: dict[str, list[FloatArray]] = {m: [] for m in methods}
    for counts in blocks:
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


def correlate(rows: Sequence[Row], *, policy: str = "skip",
              levels: Sequence[str] = ("sample", "dataset", "system"),
              methods: Sequence[str] = ("pearson", "spearman", "kendall"),
              n_boot: int = 1000, seed: int = 0) -> list[Correlation]:
    """Correlate judge with human scores.

    Args:
        rows: judged outputs; rows whose judge (or human) score is None/NaN are dropped.
        policy: "skip" drops sample-level groups without a coefficient, "zero" counts them as 0.
        levels: any of sample, dataset, system.
        methods: any of pearson, spearman, kendall; pairwise_accuracy is always added at
            system level and ignored elsewhere.
        n_boot: bootstrap resamples of groups for sample/dataset CIs (0: no CIs).
        seed: seed of the numpy Generator drawing the resamples.

    Returns:
        Level by level (in the order given), each subset then "all", each method.

    Raises:
        ConfigError: unknown policy, level or method, or a bad n_boot.
        DataError: a subset is named "all".
    """
    _check(policy, levels, methods, n_boot)
    d = _prepare(rows)
    out: list[Correlation] = []
    for level in levels:
        if level == "system":
            out += _system_level(d, methods, n_boot, seed)
            continue
        for sel, m, st in _level_stats(d, level, methods, policy, n_boot, seed):
            i0, i1 = int(d.edges[sel.g0]), int(d.edges[sel.g1])
            out.append(Correlation(level, m, sel.name, st.value, st.n_groups, st.n_items,
                                   *_ci(st.boot), n_systems=len(np.unique(d.system[i0:i1]))))
    return out


def _pair(a: Sequence[Row], b: Sequence[Row]) -> tuple[list[Row], list[Row]]:
    """Rows present and scored by both judges, in a's order, matched on (group, system, subset)."""
    index: dict[str, dict[tuple[str, str, str], Row]] = {"a": {}, "b": {}}
    for name, rows in (("a", a), ("b", b)):
        for r in rows:
            if (key := (r.group, r.system, r.subset)) in index[name]:
                raise DataError(f"judge {name} has two rows for group {r.group!r}, system "
                                f"{r.system!r}, subset {r.subset!r}; compare needs one each")
            index[name][key] = r
    ia, ib = index["a"], index["b"]
    pairs = [(ra, ib[k]) for k, ra in ia.items() if k in ib and _usable(ra) and _usable(ib[k])]
    for ra, rb in pairs:
        if ra.human != rb.human:
            raise DataError(f"group {ra.group!r}, system {ra.system!r}: the two judges' rows "
                            f"carry different human scores ({ra.human} vs {rb.human})")
    return [p[0] for p in pairs], [p[1] for p in pairs]


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


def compare(a: Sequence[Row], b: Sequence[Row], *, policy: str = "skip",
            levels: Sequence[str] = ("sample", "dataset"),
            methods: Sequence[str] = ("pearson", "spearman", "kendall"),
            n_boot: int = 1000, seed: int = 0) -> list[Comparison]:
    """Paired bootstrap comparison of two judges' correlations with the same human scores.

    Rows are matched on (group, system, subset); only items both judges scored are used,
    and both judges' coefficients are computed on the same group resamples.

    Raises:
        ConfigError: as for correlate, or "system" among the levels.
        DataError: duplicate rows for one output, or matched rows with different humans.
    """
    _check(policy, levels, methods, n_boot)
    if "system" in levels:
        raise ConfigError("compare supports levels sample and dataset (got 'system')")
    ra, rb = _pair(a, b)
    da, db = _prepare(ra), _prepare(rb)
    out: list[Comparison] = []
    for level in levels:
        for (sel, m, sa), (_, _, sb) in zip(_level_stats(da, level, methods, policy, n_boot, seed),
                                            _level_stats(db, level, methods, policy, n_boot, seed),
                                            strict=True):
            out.append(_comparison(level, m, sel, sa, sb))
    return out
