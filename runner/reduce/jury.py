"""Juries: a virtual judge made of several judges' scores (Verga et al. 2024, "Replacing
Judges with Juries"), with zero calls.

A jury (`[juries.NAME]` in the job) pools, per item and aspect, the scores its member judges
(`model/prompt`) gave: their mean, median or majority. Its verdicts are cells of the report
tables like any judge's, under the judge name NAME, so scores.csv, correlations.csv, compare and
report.html treat it as one. Because it reads only the members' scores, adding a jury to a
finished study and running `judge rescore` costs nothing.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from runner.job.spec import JurySpec

__all__ = ["judge_name", "member", "verdict", "verdicts"]


def judge_name(model: str, prompt: str) -> str:
    """A judge's name in the reports: `model/prompt`, or a jury's own name (its cells have no
    prompt).

    Args:
        model, prompt: the model's and the prompt's names (a jury's name, and "").

    Returns:
        The judge's name.
    """
    return f"{model}/{prompt}" if prompt else model


def member(judge: str) -> tuple[str, str]:
    """(model, prompt) of a member named `model/prompt` (a model name may hold "/").

    Args:
        judge: a judge's name, as judge_name makes it.

    Returns:
        The model's name and the prompt's.
    """
    model, _, prompt = judge.rpartition("/")
    return model, prompt


def verdict(method: str, scores: Sequence[float]) -> float | None:
    """The jury's score from its members' scores: "mean", "median", or "majority" (the most
    frequent score; a tie between the most frequent is their median). None for no scores.

    Args:
        method: the jury's method.
        scores: its members' scores for one item and aspect.

    Returns:
        The jury's score, or None without scores.
    """
    if not scores:
        return None
    if method == "mean":
        return statistics.fmean(scores)
    if method == "median":
        return float(statistics.median(scores))
    counts = Counter(scores).most_common()
    top = [value for value, count in counts if count == counts[0][1]]
    return float(statistics.median(top))


def verdicts(jury: JurySpec, judges: Sequence[tuple[str, str, str]], item: Sequence[int],
             judge: Sequence[int], score: npt.NDArray[np.float64], scored: Sequence[bool]
             ) -> dict[tuple[int, str], float | None]:
    """(item, aspect) -> the jury's score, for every item and aspect some member judged (in
    order of first appearance); None where fewer than `jury.quorum` members have a score for
    it.

    Args:
        jury: the jury's declaration.
        judges, item, judge, score, scored: the columns of runner.reduce.cells.Cells of
            those names.

    Returns:
        The jury's score by item and aspect.
    """
    members = {member(j) for j in jury.judges}
    codes = {c for c, (p, _, m) in enumerate(judges) if (m, p) in members}
    pooled: dict[tuple[int, str], list[float]] = {}
    for c, (i, j) in enumerate(zip(item, judge, strict=True)):
        if j not in codes:
            continue
        votes = pooled.setdefault((i, judges[j][1]), [])
        if scored[c]:
            votes.append(float(score[c]))
    quorum = jury.quorum or len(jury.judges)
    return {key: verdict(jury.method, votes) if len(votes) >= quorum else None
            for key, votes in pooled.items()}
