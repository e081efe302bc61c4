"""A Bradley-Terry ranking of the systems from battle.csv's pairwise outcomes, with bootstrap CIs.

battle.csv counts, per judge and system pair, the questions where both orders agreed (A wins,
tie, B wins) and those where they disagreed (inconsistent). Over more than two systems these
pairs do not say who is best on their own; a Bradley-Terry model does: P(i beats j) =
p_i / (p_i + p_j), fitted by Hunter's (2004) MM iterations. A tie or an inconsistent verdict
counts half a win to each side (the verdict followed the position, not the answers: AlpacaEval
and MT-Bench count it as a tie too); a tenth of a virtual tie between every pair that met keeps
a system that never won at a finite strength. `strength` is log p_i, centred on the mean of
the systems (0 = average; a difference d is odds of e^d to 1). CIs: the battles of each judge,
data set and aspect are drawn with replacement (multinomially over the outcome counts), the
model refitted on each resample, all resamples at once in numpy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["RANKING_COLUMNS", "battle_lines", "rank_rows"]

RANKING_COLUMNS = ["judge", "dataset", "aspect", "rank", "model", "strength", "ci_low",
                   "ci_high", "battles", "wins", "ties", "losses"]
PRIOR = 0.1  # virtual ties between every pair that met
ITERATIONS = 500
TOLERANCE = 1e-10

Array = npt.NDArray[np.float64]


def rank_rows(battles: Sequence[Mapping[str, Any]], *, n_boot: int = 1000,
              seed: int = 0) -> list[dict[str, Any]]:
    """ranking.csv rows (RANKING_COLUMNS), strongest first, per judge, data set and aspect.

    Args:
        battles: battles.csv's rows.
        n_boot: the bootstrap resamples for each strength's interval.
        seed: the resampling seed.

    Returns:
        The ranking rows.
    """
    tables: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for row in battles:
        tables.setdefault((row["judge"], row["dataset"], row["aspect"]), []).append(row)
    out: list[dict[str, Any]] = []
    for (judge, dataset, aspect), rows in tables.items():
        models = list(dict.fromkeys(m for r in rows for m in (r["model_a"], r["model_b"])))
        wins = _wins(rows, {m: i for i, m in enumerate(models)}, len(models))
        strength = _fit(wins[None])[0]
        low, high = _intervals(wins, n_boot, seed)
        order = sorted(range(len(models)), key=lambda i: -strength[i])
        for rank, i in enumerate(order, 1):
            out.append({"judge": judge, "dataset": dataset, "aspect": aspect, "rank": rank,
                        "model": models[i], "strength": round(float(strength[i]), 4),
                        "ci_low": low[i], "ci_high": high[i],
                        "battles": int(wins[i].sum()), "wins": int(wins[i, :, 0].sum()),
                        "ties": int(wins[i, :, 1].sum()), "losses": int(wins[i, :, 2].sum())})
    return out


def _wins(rows: Sequence[Mapping[str, Any]], index: Mapping[str, int], k: int) -> Array:
    """(k, k, 3): for each ordered pair (i, j), i's wins, ties (with inconsistent verdicts) and
    losses against j; symmetric in the sense that [i, j] mirrors [j, i]."""
    out = np.zeros((k, k, 3))
    for r in rows:
        a, b = index[r["model_a"]], index[r["model_b"]]
        ties = int(r["ties"]) + int(r["inconsistent"])
        out[a, b] += (int(r["a_wins"]), ties, int(r["b_wins"]))
        out[b, a] += (int(r["b_wins"]), ties, int(r["a_wins"]))
    return out


def _fit(wins: Array) -> Array:
    """Log strengths, centred, for a stack of (B, k, k, 3) outcome tables: MM iterations
    p_i <- W_i / sum_j n_ij / (p_i + p_j), with W_i = wins + ties / 2 (+ the prior's)."""
    met = wins.sum(-1) > 0
    score = wins[..., 0] + wins[..., 1] / 2 + PRIOR / 2 * met  # (B, k, k)
    games = wins.sum(-1) + PRIOR * met
    won = score.sum(-1)
    p = np.ones(won.shape)
    for _ in range(ITERATIONS):
        denominator = (games / (p[:, :, None] + p[:, None, :])).sum(-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            new = np.where(denominator > 0, won / denominator, p)
        new /= np.exp(np.log(new).mean(-1, keepdims=True))
        done = np.abs(new - p).max() < TOLERANCE
        p = new
        if done:
            break
    logs = np.log(p)
    result: Array = logs - logs.mean(-1, keepdims=True)
    return result


def _intervals(wins: Array, n_boot: int, seed: int) -> tuple[list[float | None],
                                                             list[float | None]]:
    """95% percentile CIs of each system's strength over `n_boot` resamples of the battles."""
    k = wins.shape[0]
    if not n_boot:
        return [None] * k, [None] * k
    upper = np.triu_indices(k, 1)
    cells = wins[upper].reshape(-1)  # (pairs x 3) outcome counts, each battle once
    total = int(cells.sum())
    if not total:
        return [None] * k, [None] * k
    draws = np.random.default_rng(seed).multinomial(total, cells / total, size=n_boot)
    boot = np.zeros((n_boot, k, k, 3))
    drawn = draws.reshape(n_boot, -1, 3)
    boot[:, upper[0], upper[1]] = drawn
    boot[:, upper[1], upper[0]] = drawn[..., ::-1]
    strengths = _fit(boot)
    low, high = np.percentile(strengths, [2.5, 97.5], axis=0)
    return ([round(float(v), 4) for v in low], [round(float(v), 4) for v in high])


def battle_lines(battles: Sequence[Mapping[str, Any]],
                 ranking: Sequence[Mapping[str, Any]]) -> list[str]:
    """The battles' result as `judge run` prints it: each pair's verdicts (how many the two
    orders disagree on), then the Bradley-Terry ranking with CIs (empty without a battle).

    Args:
        battles: battle.csv's rows (runner.reduce.battle).
        ranking: ranking.csv's rows (rank_rows).

    Returns:
        The lines.
    """
    if not battles:
        return []
    out = ["battles (both orders; a win or tie only when the two orders agree):"]
    for b in battles:
        out.append(f"  {b['judge']} on {b['dataset']} / {b['aspect']}: {b['model_a']} vs "
                   f"{b['model_b']}: {b['a_wins']} wins, {b['ties']} ties, {b['b_wins']} "
                   f"losses, {b['inconsistent']} inconsistent of {b['n']}"
                   + (f" ({b['failed']} failed)" if b["failed"] else ""))
    if ranking:
        out.append("ranking (Bradley-Terry strength, 95% CI; ranking.csv):")
        width = max(len(str(r["model"])) for r in ranking)
        for r in ranking:
            ci = "" if r["ci_low"] is None else f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]"
            out.append(f"  {r['rank']:>2}. {str(r['model']):<{width}}  {r['strength']:6.2f}{ci}"
                       f"  ({r['judge']} on {r['dataset']} / {r['aspect']})")
    return out
