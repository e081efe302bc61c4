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

Sample and dataset levels, their resamples and CIs: runner.reduce.levels. The statistics:
runner.reduce.statistics.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from runner.job.spec import DEFAULT_METHODS
from runner.reduce.levels import (
    CELLS,
    Data,
    Selection,
    as_series,
    check,
    ci,
    level_stats,
    prepare,
    selections,
)
from runner.reduce.resample import Draws, Resamples
from runner.reduce.series import Row, Series
from runner.reduce.statistics import STATISTICS

__all__ = ["MIN_SYSTEMS", "Correlation", "Row", "correlate"]

FloatArray = npt.NDArray[np.float64]

MIN_SYSTEMS = 5
"""System level: fewer systems than this get no CI, and a warning in the reports."""


@dataclass(frozen=True, slots=True)
class Correlation:
    """One coefficient. ``n_groups``/``n_items`` count what it was computed from."""

    level: str  # sample | dataset | system
    method: str  # a name of runner.reduce.statistics.STATISTICS
    subset: str  # a subset name or "all"
    value: float | None  # None when undefined (too few groups, constant scores)
    n_groups: int  # sample level: groups averaged (after skip); else groups present
    n_items: int
    ci_low: float | None  # 95% percentile bootstrap CI; at system level only from MIN_SYSTEMS
    ci_high: float | None
    n_systems: int = 0  # distinct systems among the items (the system level's sample size)


def _system_level(d: Data, methods: Sequence[str], n_boot: int, seed: int,
                  resamples: Resamples) -> list[Correlation]:
    """System level per subset; "all" averages the subsets (None if any is undefined).
    A selection with MIN_SYSTEMS systems or more gets a bootstrap CI over its groups."""
    methods = [*(m for m in methods if STATISTICS[m].rows is not None),
               *(m for m, s in STATISTICS.items() if s.rows is None)]  # always reported
    out: list[Correlation] = []
    for sel in selections(d):
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
                value = STATISTICS[m].one(mx, my)
            out.append(Correlation("system", m, sel.name, value, sel.g1 - sel.g0, i1 - i0,
                                   *ci(None if value is None else boot.get(m)),
                                   n_systems=n_systems))
    return out


def _system_boot(d: Data, sel: Selection, methods: Sequence[str], n_boot: int,
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
    chunks = drawn.blocks(max(1, CELLS // max(shape[0], 1))) if isinstance(drawn, Draws) \
        else iter([drawn])
    parts: dict[str, list[FloatArray]] = {m: [] for m in methods}
    for counts in chunks:
        n = counts @ sums[2]
        with np.errstate(invalid="ignore", divide="ignore"):
            mx, my = (counts @ sums[0]) / n, (counts @ sums[1]) / n
        for m in methods:
            parts[m].append(STATISTICS[m].systems(mx, my, n > 0))
        del counts  # one block held at a time
    return {m: np.concatenate(v) for m, v in parts.items()}


def correlate(rows: Series | Sequence[Row], *, policy: str = "skip",
              levels: Sequence[str] = ("sample", "dataset", "system"),
              methods: Sequence[str] = DEFAULT_METHODS,
              n_boot: int = 1000, seed: int = 0,
              resamples: Resamples | None = None) -> list[Correlation]:
    """Correlate judge with human scores.

    Args:
        rows: judged outputs, a Series (or `Row`s, made one by Series.of_rows); rows whose
            judge (or human) score is NaN (None) are dropped.
        policy: "skip" drops sample-level groups without a coefficient, "zero" counts them as 0.
        levels: any of sample, dataset, system.
        methods: names of runner.reduce.statistics.STATISTICS; a statistic of the system
            level only (pairwise_accuracy) is always added there and ignored elsewhere.
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
    check(policy, levels, methods, n_boot)
    d = prepare(as_series(rows))
    resamples = Resamples() if resamples is None else resamples
    out: list[Correlation] = []
    for level in levels:
        if level == "system":
            out += _system_level(d, methods, n_boot, seed, resamples)
            continue
        for sel, m, st in level_stats(d, level, methods, policy, n_boot, seed, resamples):
            i0, i1 = int(d.edges[sel.g0]), int(d.edges[sel.g1])
            out.append(Correlation(level, m, sel.name, st.value, st.n_groups, st.n_items,
                                   *ci(st.boot), n_systems=len(np.unique(d.system[i0:i1]))))
    return out
