"""The scores of sampled judges (a prompt's `samples = k`, or n choices in one answer), kept for
self-consistency as four flat columns: which judge, data set and aspect; which item; which
sample; the score: 20 bytes a score, where nested dicts of lists held ~150
(runner.reduce.reliability.Positions keeps them while the judgments stream by).

`tables()` gives, one judge, data set and aspect at a time, the samples x items table of each
sample's mean score that Krippendorff's alpha reads, exactly as the dicts gave it.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator

import numpy as np

__all__ = ["SampleScores"]

_TOUCHED = -1
"""The sample of an entry that only records that the item was seen (a judgment of n choices
none of which scored): the item has a column in its table, of missing values."""


class SampleScores:
    """Scores by (judge, data set, aspect), item and sample, in arrival order."""

    def __init__(self) -> None:
        self.keys: dict[tuple[str, str, str], int] = {}
        """(judge, dataset, aspect) -> code, in order of first appearance."""
        self.items: dict[str, int] = {}
        """item id -> code, in order of first appearance."""
        self.key, self.item, self.sample = array("i"), array("i"), array("q")
        self.score = array("d")

    def add(self, key: tuple[str, str, str], item_id: str, sample: int, score: float) -> None:
        """One score of an item's sample.

        Args:
            key: the judge, data set and aspect.
            item_id, sample, score: the item's id, the sample's number and its score.
        """
        self.key.append(self.keys.setdefault(key, len(self.keys)))
        self.item.append(self.items.setdefault(item_id, len(self.items)))
        self.sample.append(sample)
        self.score.append(score)

    def touch(self, key: tuple[str, str, str], item_id: str) -> None:
        """Record that `key` judged `item_id`, whether or not a score came of it.

        Args:
            key, item_id: as for `add`.
        """
        self.add(key, item_id, _TOUCHED, math.nan)

    def tables(self) -> Iterator[tuple[tuple[str, str, str], list[list[float | None]]]]:
        """Per (judge, dataset, aspect) with two or more samples of some item, in order of
        first appearance: the samples x items table (items by id, samples in order), each
        cell the mean of that sample's scores (statistics.fmean's: fsum / n), None for none.
        """
        if not self.keys:
            return
        keys, items, samples, values = (np.frombuffer(column, dtype=dtype) for column, dtype in (
            (self.key, np.int32), (self.item, np.int32), (self.sample, np.int64),
            (self.score, np.float64)))
        item_ids = list(self.items)
        order = np.argsort(keys, kind="stable")
        bounds = np.searchsorted(keys[order], np.arange(len(self.keys) + 1))
        for key, k in self.keys.items():
            rows = order[bounds[k]:bounds[k + 1]]
            scores: dict[int, dict[int, list[float]]] = {}
            for i, s, v in zip(items[rows].tolist(), samples[rows].tolist(),
                               values[rows].tolist(), strict=True):
                got = scores.setdefault(i, {})
                if s != _TOUCHED:
                    got.setdefault(s, []).append(v)
            if max((len(s) for s in scores.values()), default=0) < 2:
                continue
            ids = sorted(scores, key=lambda i: item_ids[i])
            every = sorted({s for i in ids for s in scores[i]})
            yield key, [[math.fsum(v) / len(v) if (v := scores[i].get(s)) else None
                         for i in ids] for s in every]
