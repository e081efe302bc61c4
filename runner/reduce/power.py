"""How many items a study needs to separate two judges' correlations, from a pilot.

plan_power: the items (whole groups) for a 95% bootstrap CI of the difference of two judges'
correlations of a chosen width, and for 80% power to find the pilot's difference.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from runner.reduce import _coef
from runner.reduce.reliability import FloatArray, correlation

__all__ = ["MAX_GROUPS", "POWER", "PowerPlan", "plan_power"]


@dataclass(frozen=True, slots=True)
class PowerPlan:
    """Items needed to separate two judges' correlations, from a pilot (dataset level)."""

    method: str  # pearson | spearman
    n_pilot: int
    diff: float  # corr(A, human) - corr(B, human) on the pilot
    width_pilot: float  # width of the pilot's 95% bootstrap CI of diff
    width: float  # the target width
    n_for_width: int  # items for a 95% CI of the target width: whole groups, width ~ 1/sqrt(G)
    groups_for_width: int  # the groups those items are (items, where the data has no groups)
    width_check: float | None  # bootstrap width with that many groups drawn from the pilot
    groups_pilot: int  # the pilot's groups (items, where the data has no groups)
    power_pilot: float  # power of a study the pilot's size to separate A and B
    groups_for_power: int | None  # groups for POWER at 5% (None: beyond MAX_GROUPS)
    n_for_power: int | None  # items for POWER: groups_for_power x the pilot's items a group


POWER = 0.8
MAX_GROUPS = 200_000
"""The largest study `plan_power` sizes (beyond: "more than" that, None)."""


def plan_power(a: Sequence[float], b: Sequence[float], human: Sequence[float], *,
               method: str, width: float, groups: Sequence[str] | None = None,
               n_boot: int = 500, seed: int = 0, check_limit: int = 20_000) -> PowerPlan | None:
    """Sample sizes from a pilot: for a CI of the difference `width` wide (the width of a
    bootstrap of the pilot's whole groups scaled by 1/sqrt(G), checked by a bootstrap at that
    many groups up to `check_limit` items), and for POWER to find the pilot's difference at
    5% (two-sided).

    Both resample groups, not items, as the report's CIs do: an error the items of a group
    share (one story, one source text) makes a study's groups, not its items, the unit of
    its precision. Power is simulated, not read off a CI width: studies of G groups are drawn with
    replacement from the pilot's `groups` (the unit of the dataset level: items of a group
    stay together; each item its own group without `groups`), and a study separates A and B
    when its difference is beyond 1.96 of the simulated studies' standard deviation. The
    smallest G with power >= POWER is found by doubling, then bisection.

    Args:
        a, b: judge A's and judge B's pilot scores; human: the human scores of those items.
        method: pearson or spearman.
        width: the target width of the 95% CI of the difference.
        groups: each item's group (None: each item its own).
        n_boot: the simulated studies per size.
        seed: the random generator's seed.
        check_limit: the largest study the width is checked at by a bootstrap.

    Returns:
        The plan; None for another method, a pilot of fewer than 10 items or a constant judge.
    """
    xa, xb, h = (np.asarray(v, dtype=float) for v in (a, b, human))
    if method not in ("pearson", "spearman") or xa.size < 10 or width <= 0:
        return None
    if method == "spearman":
        xa, xb, h = _coef.rankdata(xa), _coef.rankdata(xb), _coef.rankdata(h)
    diff = correlation("pearson", xa, h), correlation("pearson", xb, h)
    if diff[0] is None or diff[1] is None:
        return None
    sums = _group_sums(xa, xb, h, groups)
    per_group = xa.size / len(sums)
    rng = np.random.default_rng(seed)
    w0 = _boot_width(sums, len(sums), n_boot, rng)
    d = diff[0] - diff[1]
    g_width = max(2, math.ceil(len(sums) * (w0 / width) ** 2))
    n_width = max(4, math.ceil(g_width * per_group))
    check = _boot_width(sums, g_width, n_boot, rng) if n_width <= check_limit else None
    power = functools.partial(_power, sums, n_boot, np.random.default_rng(seed))
    g = _groups_for_power(power) if abs(d) > 1e-12 else None
    return PowerPlan(method, int(xa.size), d, w0, width, n_width, g_width, check, len(sums),
                     power(len(sums)), g, None if g is None else math.ceil(g * per_group))


def _group_sums(a: FloatArray, b: FloatArray, h: FloatArray,
                groups: Sequence[str] | None) -> FloatArray:
    """Per group: n, and the sums of a, b, h, a*a, b*b, h*h, a*h, b*h (what a Pearson
    correlation over any union of groups is made of)."""
    if groups is None:
        codes = np.arange(a.size)
    else:
        _, codes = np.unique(np.asarray(groups, dtype=object).astype(str), return_inverse=True)
    cols = np.stack([np.ones_like(a), a, b, h, a * a, b * b, h * h, a * h, b * h], axis=1)
    out = np.zeros((int(codes.max()) + 1, cols.shape[1]))
    np.add.at(out, codes, cols)
    return out


def _draw_diffs(sums: FloatArray, n_sim: int, rng: np.random.Generator,
                groups: int) -> FloatArray:
    """corr(A, human) - corr(B, human) of n_sim simulated studies of `groups` groups drawn
    with replacement from the pilot's (non-finite differences dropped)."""
    per = max(1, (1 << 22) // max(groups, 1))
    diffs = []
    for start in range(0, n_sim, per):
        pick = rng.integers(0, len(sums), size=(min(per, n_sim - start), groups))
        n, sa, sb, sh, saa, sbb, shh, sah, sbh = np.moveaxis(sums[pick].sum(axis=1), 1, 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            vh = shh - sh * sh / n
            ra = (sah - sa * sh / n) / np.sqrt((saa - sa * sa / n) * vh)
            rb = (sbh - sb * sh / n) / np.sqrt((sbb - sb * sb / n) * vh)
        dd = ra - rb
        diffs.append(dd[np.isfinite(dd)])
    return np.concatenate(diffs)


def _power(sums: FloatArray, n_sim: int, rng: np.random.Generator, groups: int) -> float:
    """The share of n_sim simulated studies of `groups` groups (drawn from the pilot's) whose
    difference of correlations is beyond z(0.975) of the studies' standard deviation."""
    dist = _draw_diffs(sums, n_sim, rng, groups)
    if dist.size < 2:
        return math.nan
    sd = float(dist.std(ddof=1))
    if sd == 0:
        return 1.0 if abs(float(dist.mean())) > 0 else 0.0
    return float(np.mean(np.abs(dist) > _Z * sd))


_Z = 1.959963984540054  # the standard normal's 97.5th percentile: 5%, two-sided


def _groups_for_power(power: Callable[[int], float]) -> int | None:
    """The fewest groups with power(groups) >= POWER (doubling from 2, then bisection)."""
    low, high = 1, 2
    while power(high) < POWER:
        low, high = high, high * 2
        if high > MAX_GROUPS:
            return None
    while high - low > max(1, low // 50):  # to within 2%: the simulation's own noise
        mid = (low + high) // 2
        if power(mid) >= POWER:
            high = mid
        else:
            low = mid
    return high


def _boot_width(sums: FloatArray, groups: int, n_boot: int, rng: np.random.Generator) -> float:
    """Width of the 95% percentile interval of the difference over n_boot studies of `groups`
    groups: whole groups, as the report's CIs resample, so an error a group's items share
    widens it (items drawn one by one would not see it)."""
    dist = _draw_diffs(sums, n_boot, rng, groups)
    return float(np.percentile(dist, 97.5) - np.percentile(dist, 2.5)) if dist.size else math.nan
