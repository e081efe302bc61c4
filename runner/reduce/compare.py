"""Two judges' statistics with the same human scores, compared by a paired bootstrap.

Rows are matched on (group, system, subset); both judges' values are computed on the same
group resamples (runner.reduce.levels), so the difference's CI and p-value are paired.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from runner.errors import ConfigError, DataError
from runner.job.spec import DEFAULT_METHODS
from runner.reduce.levels import (
    Selection,
    Stat,
    as_series,
    check,
    ci,
    level_stats,
    prepare,
)
from runner.reduce.resample import Resamples
from runner.reduce.series import Row, Series

__all__ = ["Comparison", "compare", "paired_levels"]


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


def paired_levels(levels: Sequence[str]) -> list[str]:
    """The levels `compare` takes from a job's: all but system (no groups to resample there),
    sample and dataset where that leaves none.

    Args:
        levels: the job's levels.

    Returns:
        The levels to compare at.
    """
    return [lv for lv in levels if lv != "system"] or ["sample", "dataset"]


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


def _comparison(level: str, method: str, sel: Selection, sa: Stat, sb: Stat) -> Comparison:
    diff = None if sa.value is None or sb.value is None else sa.value - sb.value
    low = high = p = None
    if diff is not None and sa.boot is not None and sb.boot is not None:
        dist = sa.boot - sb.boot
        dist = dist[~np.isnan(dist)]
        if dist.size:
            low, high = ci(dist)
            # Shift the bootstrap distribution to the null (diff 0) and count as extreme.
            p = float((1 + np.sum(np.abs(dist - diff) >= abs(diff))) / (1 + dist.size))
    return Comparison(level, method, sel.name, sa.value, sb.value, diff, low, high, p,
                      sel.g1 - sel.g0)


def compare(a: Series | Sequence[Row], b: Series | Sequence[Row], *, policy: str = "skip",
            levels: Sequence[str] = ("sample", "dataset"),
            methods: Sequence[str] = DEFAULT_METHODS,
            n_boot: int = 1000, seed: int = 0,
            resamples: Resamples | None = None) -> list[Comparison]:
    """Paired bootstrap comparison of two judges' correlations with the same human scores,
    over the items both judges scored (matched and resampled as the module says).

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
    check(policy, levels, methods, n_boot)
    if "system" in levels:
        raise ConfigError("compare supports levels sample and dataset (got 'system')")
    ra, rb = _pair(as_series(a), as_series(b))
    da, db = prepare(ra), prepare(rb)
    resamples = Resamples() if resamples is None else resamples
    out: list[Comparison] = []
    for level in levels:
        for (sel, m, sa), (_, _, sb) in zip(
                level_stats(da, level, methods, policy, n_boot, seed, resamples),
                level_stats(db, level, methods, policy, n_boot, seed, resamples), strict=True):
            out.append(_comparison(level, m, sel, sa, sb))
    return out
