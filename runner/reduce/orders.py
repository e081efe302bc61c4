"""The scores of group prompts by the order their members were shown in, kept for the position
figures as four flat columns: which judge, data set, aspect and group; which order; which
member; the score: 17 bytes a judgment, where a dict per group of dicts per order of lists
held ~200 (runner.reduce.reliability.Positions keeps them while the judgments stream by).

`groups()` gives back each group's orders, one group at a time, as the dicts gave them.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator

import numpy as np

__all__ = ["OrderScores", "Orders"]

Orders = dict[tuple[str, ...], dict[str, list[float]]]
"""One group's scores: order shown (member ids) -> member id -> its scores in that order."""


class OrderScores:
    """Scores by (judge, dataset, aspect, group), order and member, in arrival order."""

    def __init__(self) -> None:
        self.keys: dict[tuple[str, str, str, str], int] = {}
        """(judge, dataset, aspect, group anchor) -> code, in order of first appearance."""
        self.orders: dict[tuple[str, ...], int] = {}
        self.members: dict[str, int] = {}
        self.key, self.order, self.member = array("i"), array("i"), array("i")
        self.score = array("d")
        self.scored = bytearray()

    def add(self, key: tuple[str, str, str, str], order: tuple[str, ...], member: str,
            score: float | None) -> None:
        """One judgment of a group's member.

        Args:
            key: the judge, data set, aspect and group.
            order: the members in the order shown.
            member: the member scored.
            score: its score; None: it had none (the member still counts as seen in that
                order).
        """
        self.key.append(self.keys.setdefault(key, len(self.keys)))
        self.order.append(self.orders.setdefault(order, len(self.orders)))
        self.member.append(self.members.setdefault(member, len(self.members)))
        self.score.append(0.0 if score is None else score)
        self.scored.append(score is not None)

    def groups(self) -> Iterator[tuple[tuple[str, str, str, str], Orders]]:
        """Each group's orders in order of first appearance, each built when it is reached."""
        if not self.keys:
            return
        keys = np.frombuffer(self.key, dtype=np.int32)
        index = np.argsort(keys, kind="stable")  # codes are given in order of appearance
        bounds = np.searchsorted(keys[index], np.arange(len(self.keys) + 1)).tolist()
        orders, members = list(self.orders), list(self.members)
        order_col, member_col = np.frombuffer(self.order, dtype=np.int32), np.frombuffer(
            self.member, dtype=np.int32)
        score_col, scored = np.frombuffer(self.score), np.frombuffer(self.scored, dtype=bool)
        for key, k in self.keys.items():
            rows = index[bounds[k]:bounds[k + 1]]
            group: Orders = {}
            for o, m, s, ok in zip(order_col[rows].tolist(), member_col[rows].tolist(),
                                   score_col[rows].tolist(), scored[rows].tolist(),
                                   strict=True):
                got = group.setdefault(orders[o], {}).setdefault(members[m], [])
                if ok:
                    got.append(s)
            yield key, group
