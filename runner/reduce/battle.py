"""Battles: a judge compares candidates' answers to the same question, in both orders.

A prompt with per = "group" and order = "both" sends each group (one question; members = the
candidates' answers) twice: members in data order, then reversed. The parser's per-position
scores ("1", "2" for `pair`) are mapped back to the members, so each order gives every member
a score. An order's outcome for a pair of members compares their two scores; per judge and
model pair, battle.csv counts the questions where both orders agree (a_wins, ties, b_wins)
and those where they disagree (inconsistent: the verdict followed the position, not the
answers). A question where some order has no score for a member is `failed`, outside `n`.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from runner.expand import Expansion
from runner.reduce.judgments import Judgment
from runner.reduce.orders import Orders

__all__ = ["BATTLE_COLUMNS", "Battles"]

BATTLE_COLUMNS = ["judge", "dataset", "aspect", "model_a", "model_b", "n", "a_wins", "ties",
                  "b_wins", "inconsistent", "failed", "a_win_rate", "tie_rate", "b_win_rate",
                  "inconsistent_rate", "a_mean", "b_mean"]


class Battles:
    """Collects the judgments of order = "both" prompts while the reports stream them."""

    def __init__(self, expansion: Expansion) -> None:
        self.expansion = expansion
        self.prompts = {p.name for p in expansion.job.prompts if p.order == "both"}
        self.systems: dict[tuple[str, str], str] = {}
        self.groups: dict[tuple[str, str, str, str], Orders] = defaultdict(dict)
        """Per (judge, dataset, aspect, group) its Orders (an empty list of scores records a
        member whose score failed)."""

    @property
    def enabled(self) -> bool:
        """Whether the job has a prompt with order = "both" (battle.csv is written)."""
        return bool(self.prompts)

    def watch(self, judgments: Iterable[Judgment]) -> Iterator[Judgment]:
        """Pass every judgment through, keeping the scores of the battle prompts (a job
        without one: the judgments themselves, no extra step per judgment).

        Args:
            judgments: every judgment, read once.

        Returns:
            The same judgments.
        """
        return self._watch(judgments) if self.prompts else iter(judgments)

    def _watch(self, judgments: Iterable[Judgment]) -> Iterator[Judgment]:
        for j in judgments:
            t = j.task
            if t.prompt in self.prompts and t.members:
                orders = self.groups[f"{t.model}/{t.prompt}", t.dataset, t.aspect, t.item_id]
                scores = orders.setdefault(t.members, {}).setdefault(j.item.item_id, [])
                if j.score is not None:
                    scores.append(j.score)
                self.systems[t.dataset, j.item.item_id] = j.item.system
            yield j

    def rows(self) -> list[dict[str, Any]]:
        """battle.csv rows: per judge, data set, aspect and model pair (A before B in data
        order)."""
        tally: dict[tuple[str, str, str, str, str], dict[str, Any]] = {}
        # every item's position, made only here: a job without battles holds no such dict
        # (~136 bytes an item, 34 MB of a 1M-task run of 250k items; bench/README.md, Memory)
        position = {(name, it.item_id): i for name, its in self.expansion.items.items()
                    for i, it in enumerate(its)} if self.groups else {}
        for (judge, dataset, aspect, _group), orders in self.groups.items():
            members = sorted({m for order in orders for m in order},
                             key=lambda m: position.get((dataset, m), 0))
            for a, b in itertools.combinations(members, 2):
                key = (judge, dataset, aspect, self.systems[dataset, a], self.systems[dataset, b])
                row = tally.setdefault(key, _empty(key))
                _count(row, [scores for scores in orders.values() if a in scores and b in scores],
                       a, b)
        return [_finish(row) for row in tally.values()]


def _empty(key: tuple[str, str, str, str, str]) -> dict[str, Any]:
    judge, dataset, aspect, model_a, model_b = key
    return {"judge": judge, "dataset": dataset, "aspect": aspect, "model_a": model_a,
            "model_b": model_b, "n": 0, "a_wins": 0, "ties": 0, "b_wins": 0, "inconsistent": 0,
            "failed": 0, "_a": [], "_b": []}


def _count(row: dict[str, Any], orders: Sequence[Mapping[str, list[float]]], a: str,
           b: str) -> None:
    """Add one question: both orders must score both members, else it counts as failed."""
    if len(orders) < 2 or any(not o[a] or not o[b] for o in orders):
        row["failed"] += 1
        return
    means = [(statistics.fmean(o[a]), statistics.fmean(o[b])) for o in orders]
    outcomes = {"a_wins" if sa > sb else "b_wins" if sa < sb else "ties" for sa, sb in means}
    row["n"] += 1
    row[outcomes.pop() if len(outcomes) == 1 else "inconsistent"] += 1
    row["_a"].extend(sa for sa, _ in means)
    row["_b"].extend(sb for _, sb in means)


def _finish(row: dict[str, Any]) -> dict[str, Any]:
    n = row["n"]
    for rate, count in (("a_win_rate", "a_wins"), ("tie_rate", "ties"),
                        ("b_win_rate", "b_wins"), ("inconsistent_rate", "inconsistent")):
        row[rate] = round(row[count] / n, 4) if n else None
    a, b = row.pop("_a"), row.pop("_b")
    row["a_mean"] = round(statistics.fmean(a), 4) if a else None
    row["b_mean"] = round(statistics.fmean(b), 4) if b else None
    return row
