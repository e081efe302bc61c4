"""Each statistic at the sample and dataset levels of one judge's data, with its resamples:
what correlate and compare both compute (runner.reduce.statistics defines the statistics).

Data (`prepare`) are the usable rows in (subset, group) order; a selection is a subset, or
"all" (every group). Sample level: each group's value, then their mean; dataset level: one
value over the selection's items pooled. Bootstrap: groups are drawn with replacement (within
each subset, for "all"), the draw counts from the caller's runner.reduce.resample.Resamples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from runner.errors import ConfigError, DataError
from runner.job.spec import LEVELS, POLICIES
from runner.reduce.pooled import Pooled
from runner.reduce.resample import Draws, Resamples, blocks
from runner.reduce.series import Row, Series
from runner.reduce.statistics import STATISTICS

__all__ = ["CELLS", "Data", "Selection", "Stat", "as_series", "check", "ci", "level_stats",
           "prepare", "selections"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]

CELLS = 1 << 22
"""Largest number of float64 cells held in one temporary array (32 MiB)."""


@dataclass(frozen=True, slots=True)
class Data:
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
class Selection:
    name: str
    g0: int  # groups g0:g1
    g1: int
    strata: tuple[int, ...]  # group counts of consecutive strata, each resampled on its own


@dataclass(frozen=True, slots=True)
class Stat:
    value: float | None
    boot: FloatArray | None  # one value per resample, NaN where undefined
    n_groups: int
    n_items: int


def prepare(s: Series) -> Data:
    """Usable rows (finite judge and human) in (subset, group) order: subsets and groups in
    order of first appearance among them, each group's items in row order; systems numbered
    by their names' sorted order.

    Args:
        s: one judge's scores with the human ones, per row.

    Returns:
        The usable rows, ordered and numbered for resampling by group.
    """
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
    return Data(
        x=x[order], y=y[order],
        system=rank[s.system[order]].astype(np.intp),
        edges=np.r_[firsts, len(kept)].astype(np.intp),
        bounds=np.r_[bounds, len(firsts)].astype(np.intp),
        subsets=subsets,
    )


def as_series(data: Series | Sequence[Row]) -> Series:
    """The rows as a Series (a Series passes as it is).

    Args:
        data: a Series, or rows of one judge and aspect.

    Returns:
        The Series.
    """
    return data if isinstance(data, Series) else Series.of_rows(data)


def selections(d: Data) -> list[Selection]:
    """The parts of `d` reported on their own: each subset, then all of them.

    Args:
        d: the prepared rows.

    Returns:
        One Selection per subset (when there are subsets) and one for all groups, last.
    """
    n_groups = len(d.edges) - 1
    if d.subsets in ((), ("",)):
        return [Selection("all", 0, n_groups, (n_groups,))]
    b = [int(v) for v in d.bounds]
    parts = [Selection(s, b[k], b[k + 1], (b[k + 1] - b[k],)) for k, s in enumerate(d.subsets)]
    return [*parts, Selection("all", 0, n_groups, tuple(p.strata[0] for p in parts))]


def check(policy: str, levels: Sequence[str], methods: Sequence[str], n_boot: int) -> None:
    """Check the options of a correlation before any work.

    Args:
        policy, levels, methods, n_boot: as for runner.reduce.correlate.correlate.

    Raises:
        ConfigError: An option is unknown or out of range (the message names it).
    """
    if policy not in POLICIES:
        raise ConfigError(f"policy must be 'skip' or 'zero' (got {policy!r})")
    for kind, given, known in (("level", levels, LEVELS), ("method", methods, STATISTICS)):
        for name in given:
            if name not in known:
                raise ConfigError(f"unknown {kind} {name!r}; choose from {', '.join(known)}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 0:
        raise ConfigError(f"n_boot must be a non-negative integer (got {n_boot!r})")


def _group_coefs(d: Data, rows: Callable[[FloatArray, FloatArray], FloatArray]
                 ) -> FloatArray:
    """A statistic's `rows` per group, NaN where undefined; groups of equal size go at once."""
    sizes = np.diff(d.edges)
    out = np.full(len(sizes), np.nan)
    for m in np.unique(sizes[sizes >= 2]):
        gs = np.flatnonzero(sizes == m)
        idx = d.edges[gs][:, None] + np.arange(m)
        xs, ys = d.x[idx], d.y[idx]
        ok = (np.ptp(xs, axis=1) > 0) & (np.ptp(ys, axis=1) > 0)
        if ok.any():
            out[gs[ok]] = rows(xs[ok], ys[ok])
    return out


def _boot_chunk(p: Pooled, methods: Sequence[str], c: FloatArray) -> dict[str, FloatArray]:
    """Pooled values for resamples c (rows: draw counts per group), NaN if undefined."""
    drawn = p.drawn(c)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = {m: STATISTICS[m].resampled(p, c, drawn) for m in methods}  # type: ignore[misc]
    wx, wy, _ = drawn
    undefined = ((wx > 0).sum(axis=0) < 2) | ((wy > 0).sum(axis=0) < 2)  # a constant side
    return {m: np.where(undefined, np.nan, r) for m, r in out.items()}


def _boot_pooled(d: Data, sel: Selection, methods: Sequence[str],
                 counts: FloatArray | Draws) -> dict[str, FloatArray]:
    """The pooled coefficient per resample of sel's groups, resamples taken in chunks."""
    i0, i1 = int(d.edges[sel.g0]), int(d.edges[sel.g1])
    p = Pooled(d.x[i0:i1], d.y[i0:i1], d.edges[sel.g0:sel.g1 + 1] - i0, len(counts))
    width = max(p.txy.shape[1], 1)  # at least as many cells as x or y values
    step = max(1, CELLS // 8 // width)
    if isinstance(counts, Draws):  # the block of counts itself kept under CELLS too
        step = max(1, min(step, CELLS // max(sum(counts.strata), 1)))
    chunks = []
    for c in blocks(counts, step):
        chunks.append(_boot_chunk(p, methods, c))
        del c  # before the next block is made: one block held at a time, not two
    return {m: np.concatenate([ch[m] for ch in chunks]) for m in methods}


def _samples(coefs: Mapping[str, FloatArray], sizes: IntArray,
             counts: FloatArray | Draws | None, policy: str) -> dict[str, Stat]:
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
            step = max(1, CELLS // max(sum(counts.strata), 1))
            parts: dict[str, list[tuple[FloatArray, FloatArray]]] = {m: [] for m in coefs}
            for block in counts.blocks(step):
                for m in coefs:
                    parts[m].append((block @ weights[m], block @ vals[m]))
                del block  # one block held at a time
            sums = {m: (np.concatenate([d for d, _ in parts[m]]),
                        np.concatenate([n for _, n in parts[m]])) for m in coefs}
        else:
            sums = {m: (counts @ weights[m], counts @ vals[m]) for m in coefs}
        with np.errstate(divide="ignore", invalid="ignore"):
            boots = {m: np.where(den > 0, num / den, np.nan) for m, (den, num) in sums.items()}
    out = {}
    for m in coefs:
        k = int(used[m].sum())
        out[m] = Stat(float(vals[m][used[m]].mean()) if k else None, boots.get(m), k,
                       int(sizes[used[m]].sum()))
    return out


def level_stats(d: Data, level: str, methods: Sequence[str], policy: str, n_boot: int,
                 seed: int, resamples: Resamples) -> Iterator[tuple[Selection, str, Stat]]:
    """Sample- or dataset-level statistics for every selection, in selection-major order.

    Args:
        d: the prepared rows.
        level: "sample" or "dataset".
        methods, policy, n_boot, seed, resamples: as for runner.reduce.correlate.correlate.

    Yields:
        The selection, the statistic's name and its value with its bootstrap draws.
    """
    methods = [m for m in methods if STATISTICS[m].rows is not None]
    sizes = np.diff(d.edges)
    coefs = ({m: _group_coefs(d, STATISTICS[m].rows) for m in methods}  # type: ignore[arg-type]
             if level == "sample" else {})
    for sel in selections(d):
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
            value = STATISTICS[m].one(d.x[i0:i1], d.y[i0:i1])
            yield sel, m, Stat(value, boots.get(m), sel.g1 - sel.g0, i1 - i0)


def ci(boot: FloatArray | None) -> tuple[float | None, float | None]:
    """The 95% percentile interval of bootstrap draws.

    Args:
        boot: one value per resample (NaN where undefined), or None.

    Returns:
        The 2.5th and 97.5th percentiles, or (None, None) without a finite draw.
    """
    if boot is None or not (ok := boot[~np.isnan(boot)]).size:
        return None, None
    low, high = np.percentile(ok, [2.5, 97.5])
    return float(low), float(high)
