"""Position bias and self-consistency, collected while the reports stream the judgments.

Positions collects the scores of group prompts by the position each member was shown in, and
pair verdicts per order, so position_rows can report the share of pairs whose verdict flips
when the order is swapped, the first-position win rate (binomial test against 1/2) and the
mean score by position. It also keeps the samples of sampled prompts (`samples = k`, and the
n choices of one answer) for self-consistency.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from runner.expand import Expansion
from runner.reduce import _coef
from runner.reduce.judgments import Judgment
from runner.reduce.orders import Orders, OrderScores
from runner.reduce.samples import SampleScores

__all__ = ["Positions"]


class Positions:
    """Collects, while the reports stream the judgments, what position and self-consistency
    figures need: group prompts' scores by order and member, and every judge's samples."""

    def __init__(self, expansion: Expansion) -> None:
        job = expansion.job
        self.sampled = frozenset(p.name for p in job.prompts if p.samples > 1)
        """Prompts with several samples a task: only their scores are kept for
        self-consistency, so a large single-sample job pays one set lookup a judgment."""
        self.groups = OrderScores()
        """(judge, dataset, aspect, group), order shown, member -> scores (group prompts)."""
        self.samples = SampleScores()
        """(judge, dataset, aspect), item id, sample -> scores (one per order). A sample is a
        task's sample index, or with n > 1 choices an answer (sample index x n + choice)."""

    def watch(self, judgments: Iterable[Judgment]) -> Iterator[Judgment]:
        """Pass every judgment through, keeping its score.

        Args:
            judgments: the judgments' stream.

        Returns:
            The same judgments, lazily.
        """
        for j in judgments:
            t = j.task
            if t.prompt not in self.sampled and not t.members and not j.choice_scores:
                yield j
                continue
            judge = f"{t.model}/{t.prompt}"
            if j.choice_scores:  # n choices in one answer: coder = (sample, choice)
                key = (judge, t.dataset, t.aspect)
                self.samples.touch(key, j.item.item_id)
                n = len(j.choice_scores)
                for c, score in enumerate(j.choice_scores):
                    if score is not None:
                        self.samples.add(key, j.item.item_id, t.sample * n + c, score)
            elif j.score is not None and t.prompt in self.sampled:
                self.samples.add((judge, t.dataset, t.aspect), j.item.item_id, t.sample,
                                 j.score)
            if t.members:
                self.groups.add((judge, t.dataset, t.aspect, t.item_id), t.members,
                                j.item.item_id, j.score)
            yield j

    def position_rows(self) -> list[dict[str, Any]]:
        """reliability.csv rows of figure `position`.

        Returns:
            The rows, per judge, data set and aspect.
        """
        tally: dict[tuple[str, str, str], dict[str, Any]] = {}
        for (judge, dataset, aspect, _group), orders in self.groups.groups():
            t = tally.setdefault((judge, dataset, aspect), {
                "first": 0, "second": 0, "ties": 0, "pairs": 0, "flips": 0,
                "by_position": defaultdict(list)})
            _tally_group(t, orders)
        rows = []
        for (judge, dataset, aspect), t in tally.items():
            rows += _position_rows(judge, dataset, aspect, t)
        return rows


def _tally_group(t: dict[str, Any], orders: Orders) -> None:
    """Add one group: every pair of members, in every order that scored both."""
    verdicts: dict[tuple[str, str], list[str]] = defaultdict(list)  # one per order
    for order, scores in orders.items():
        for position, member in enumerate(order, 1):
            if scores.get(member):
                t["by_position"][position].append(statistics.fmean(scores[member]))
        for first, second in itertools.combinations(order, 2):
            if not scores.get(first) or not scores.get(second):
                continue
            s1, s2 = statistics.fmean(scores[first]), statistics.fmean(scores[second])
            t["first" if s1 > s2 else "second" if s1 < s2 else "ties"] += 1
            pair = (min(first, second), max(first, second))
            verdicts[pair].append("tie" if s1 == s2 else first if s1 > s2 else second)
    for seen in verdicts.values():
        if len(seen) >= 2:  # the pair was scored in at least two orders
            t["pairs"] += 1
            t["flips"] += len(set(seen)) > 1


def _position_rows(judge: str, dataset: str, aspect: str, t: Mapping[str, Any]
                   ) -> list[dict[str, Any]]:
    def row(statistic: str, value: float | None, n: int, p: float | None = None,
            b: str = "") -> dict[str, Any]:
        return {"dataset": dataset, "aspect": aspect, "figure": "position", "a": judge,
                "b": b, "statistic": statistic, "value": value, "n": n, "p_value": p}

    out = []
    if t["pairs"]:
        out.append(row("flip_rate", t["flips"] / t["pairs"], t["pairs"]))
    decisive = t["first"] + t["second"]
    if decisive:
        p = float(_coef.scipy_stats().binomtest(t["first"], decisive, 0.5).pvalue)
        out.append(row("first_position_win_rate", t["first"] / decisive, decisive, p))
    for position in sorted(t["by_position"]):
        scores = t["by_position"][position]
        out.append(row("mean_score", statistics.fmean(scores), len(scores),
                       b=f"position {position}"))
    return out
