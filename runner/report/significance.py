"""Two judges against each other: whether they differ (compare.csv's Williams and
permutation columns) and how many items would tell (`judge plan --power`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from runner.reduce.power import plan_power
from runner.reduce.reliability import correlation, permutation_p, williams
from runner.reduce.series import Row, Series
from runner.reduce.statistics import STATISTICS

__all__ = ["POWER_COLUMNS", "SIGNIFICANCE_COLUMNS", "power_lines", "power_rows", "significance"]

SIGNIFICANCE_COLUMNS = ["williams_t", "williams_p", "permutation_p"]
POWER_COLUMNS = ["dataset", "aspect", "method", "n_pilot", "diff", "ci_width_pilot",
                 "target_width", "n_for_width", "groups_for_width", "width_check",
                 "groups_pilot", "power_pilot", "groups_for_power", "n_for_power"]


def _matched(a: Sequence[Row], b: Sequence[Row], subset: str
             ) -> tuple[list[float], list[float], list[float], list[str]]:
    """Scores of items both judges scored (matched on group, system, subset), the human's,
    and each item's group."""
    def ok(r: Row) -> bool:
        return r.judge is not None and not math.isnan(r.judge) and subset in ("all", r.subset)
    index = {(r.group, r.system, r.subset): r for r in b if ok(r)}
    pairs = [(r, index[k]) for r in a if ok(r) and (k := (r.group, r.system, r.subset)) in index]
    return ([float(p[0].judge) for p in pairs if p[0].judge is not None],
            [float(p[1].judge) for p in pairs if p[1].judge is not None],
            [p[0].human for p in pairs], [p[0].group for p in pairs])


def significance(rows: Sequence[dict[str, Any]], by_data: Mapping[tuple[str, str],
                 Mapping[str, Series]], judges: tuple[str, str], *,
                 permutations: int = 0, seed: int = 0) -> list[dict[str, Any]]:
    """compare.csv rows with williams_t, williams_p and permutation_p added at dataset level
    (empty at sample level): Williams' test on r(A, human), r(B, human), r(A, B) over the
    items both judges scored, and, with `permutations`, a paired permutation test.

    Args:
        rows: compare.csv's rows (runner.report.write.comparison).
        by_data, judges: per (data set, aspect), each judge's series; and (A, B).
        permutations, seed: the permutation test's permutations (0: none) and seed.

    Returns:
        The rows with SIGNIFICANCE_COLUMNS added.
    """
    out = []
    for r in rows:
        extra: dict[str, Any] = dict.fromkeys(SIGNIFICANCE_COLUMNS)
        if r["level"] == "dataset" and STATISTICS[r["method"]].williams:
            data = by_data[r["dataset"], r["aspect"]]
            xa, xb, h, _ = _matched(data[judges[0]].rows(), data[judges[1]].rows(), r["subset"])
            r12, r13, r23 = (correlation(r["method"], x, y) for x, y in ((xa, h), (xb, h),
                                                                          (xa, xb)))
            if r12 is not None and r13 is not None and r23 is not None:
                if (w := williams(r12, r13, r23, len(h))) is not None:
                    extra["williams_t"], extra["williams_p"] = w
            if permutations:
                extra["permutation_p"] = permutation_p(r["method"], xa, xb, h, permutations,
                                                       seed)
        out.append({**r, **extra})
    return out


def power_rows(by_data: Mapping[tuple[str, str], Mapping[str, Series]],
               judges: tuple[str, str], *, width: float, methods: Sequence[str],
               n_boot: int = 500, seed: int = 0) -> list[dict[str, Any]]:
    """`judge plan --power`: the pilot's figures and the items needed
    (runner.reduce.power.plan_power).

    Args:
        by_data, judges: per (data set, aspect), each judge's series (the pilot); and (A, B).
        width: the target width of the 95% CI of corr(A) - corr(B).
        methods: pearson and/or spearman.
        n_boot, seed: the simulated studies per size and the random generator's seed.

    Returns:
        POWER_COLUMNS rows, per data set, aspect and method.
    """
    out = []
    for (dataset, aspect), data in by_data.items():
        if judges[0] not in data or judges[1] not in data:
            continue
        xa, xb, h, groups = _matched(data[judges[0]].rows(), data[judges[1]].rows(), "all")
        for method in methods:
            plan = plan_power(xa, xb, h, method=method, width=width, groups=groups,
                              n_boot=n_boot, seed=seed)
            if plan is not None:
                out.append({"dataset": dataset, "aspect": aspect, "method": method,
                            "n_pilot": plan.n_pilot, "diff": plan.diff,
                            "ci_width_pilot": plan.width_pilot, "target_width": plan.width,
                            "n_for_width": plan.n_for_width, "width_check": plan.width_check,
                            "groups_for_width": plan.groups_for_width,
                            "groups_pilot": plan.groups_pilot, "power_pilot": plan.power_pilot,
                            "groups_for_power": plan.groups_for_power,
                            "n_for_power": plan.n_for_power})
    return out


def power_lines(rows: Sequence[Mapping[str, Any]], judges: tuple[str, str],
                width: float) -> list[str]:
    """What `judge plan --power` prints.

    Args:
        rows, judges, width: power_rows' rows, (A, B) and the target width.

    Returns:
        The lines.
    """
    lines = [f"A = {judges[0]}, B = {judges[1]}; target 95% CI width of A - B: {width}; "
             "power to separate A and B: 80% at alpha 0.05 (studies of whole groups drawn "
             "from the pilot)"]
    for r in rows:
        check = ("" if r["width_check"] is None
                 else f" (bootstrap at that size: {r['width_check']:.3f})")
        if r["groups_for_power"] is None:
            sep = "no study finds a difference" if not r["diff"] else "more than 200,000 groups"
        else:
            sep = f"{r['n_for_power']} items ({r['groups_for_power']} groups)"
        lines.append(f"{r['dataset']}/{r['aspect']} {r['method']}: pilot n {r['n_pilot']} in "
                     f"{r['groups_pilot']} groups, diff {r['diff']:+.3f}, CI width "
                     f"{r['ci_width_pilot']:.3f}, power {r['power_pilot']:.2f}; "
                     f"{r['n_for_width']} items ({r['groups_for_width']} groups) for width "
                     f"{width}{check}; {sep} for 80% power")
    if len(lines) == 1:
        lines.append("no data set and aspect has both judges with 10 or more common items")
    return lines
