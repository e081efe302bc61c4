"""Each judge against the humans, per data set and aspect, as `Series` gathered from the cells:
what correlations.csv, compare.csv, power.csv and report.html's plots are made from.

The LLM judges' (and juries') series come from the cells with numpy (a stable sort of the
cells by data set, aspect and judge); the metric columns and `iaa` from the items. Measured
with bench/memory.py's holders on a cached 100k-task run: the series keep 28 bytes a task
where the `Row` lists kept 95 (bench/README.md, "Memory": "Columnar cells").
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter

import numpy as np
import numpy.typing as npt

from runner.data.datasets import Item
from runner.expand import Expansion
from runner.reduce.cells import Cells, grouped
from runner.reduce.series import Series, coded

__all__ = ["humans", "judge_series"]


class _Codes:
    """One data set's label codes: group, system and subset per item (global index), with
    the names in order of first appearance over its items."""

    def __init__(self, items: Sequence[Item], at: npt.NDArray[np.int64]) -> None:
        self.at = at  # the data set's items' global indices, increasing
        self.group, self.system, self.subset, self.labels = coded(map(
            attrgetter("group", "system", "subset"), map(items.__getitem__, at.tolist())))

    def local(self, items: npt.NDArray[np.int32] | list[int]) -> npt.NDArray[np.intp]:
        """The positions of global item indices among the data set's items."""
        return np.searchsorted(self.at, items).astype(np.intp)

    def series(self, judge: npt.NDArray[np.float64], human: npt.NDArray[np.float64],
               local: npt.NDArray[np.intp]) -> Series:
        return Series(judge, human, self.group[local], self.system[local], self.subset[local],
                      self.labels)


def humans(cells: Cells, aspects: Sequence[str]
           ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
    """items x aspects: the human score (0 where none), and whether the item has one (the
    judges' series here, reliability.csv's agreement and length rows).

    Args:
        cells: the judged items.
        aspects: the aspects, in column order.

    Returns:
        The human scores and the mask of those present, both items x aspects.
    """
    where = {a: k for k, a in enumerate(aspects)}
    human = np.zeros((len(cells.items), len(aspects)))
    has = np.zeros((len(cells.items), len(aspects)), dtype=bool)
    for i, it in enumerate(cells.items):
        for aspect, value in it.human.items():
            if (k := where.get(aspect)) is not None:
                human[i, k], has[i, k] = value, True
    return human, has


def judge_series(expansion: Expansion, cells: Cells
                 ) -> dict[tuple[str, str], dict[str, Series]]:
    """(dataset, aspect) -> judge -> its series against the human score, for items with a
    human score.

    Args:
        expansion: the job's items (metrics, annotators) and lower-is-better metrics.
        cells: the collected cells.
    Returns:
        the LLM judges (`model/prompt`) and juries in the cells' order (pairs and judges by
        first appearance, rows in cell order), then each metric column (negated where lower
        is better) and `iaa` (annotator 2 against annotator 1 where a data set released
        both) in the items' order.
    """
    aspects, aspect_of = cells.aspect_codes()
    names, name_of = cells.names()
    human, has = humans(cells, aspects)
    cell_aspect = aspect_of[cells.judge]
    kept = np.flatnonzero(has[cells.item, cell_aspect])
    width = max(len(names), 1)
    key = ((cells.dataset()[kept] * len(aspects) + cell_aspect[kept]) * width
           + name_of[cells.judge[kept]])  # int32: a few thousand values at most
    out: dict[tuple[str, str], dict[str, Series]] = {}
    codes: dict[int, _Codes] = {}
    for k, at in zip(*grouped(key, len(cells.datasets) * len(aspects) * width), strict=True):
        p, name = divmod(k, width)
        d, a = divmod(p, len(aspects))
        if (c := codes.get(d)) is None:
            c = codes[d] = _Codes(cells.items, np.flatnonzero(cells.item_dataset == d))
        rows = kept[at]
        items = cells.item[rows]
        out.setdefault((cells.datasets[d], aspects[a]), {})[names[name]] = c.series(
            cells.score[rows], human[items, a], c.local(items))
    for (dataset, aspect), judges in out.items():
        _item_series(expansion, cells, dataset, aspect, judges,
                     codes[cells.datasets.index(dataset)])
    return out


def _item_series(expansion: Expansion, cells: Cells, dataset: str, aspect: str,
                 judges: dict[str, Series], c: _Codes) -> None:
    """The metric columns' and `iaa`'s series of one data set and aspect, into `judges`."""
    lower = expansion.lower_is_better.get(dataset, frozenset())
    start = cells.starts[cells.datasets.index(dataset)]
    gathered: dict[str, tuple[list[float], list[float], list[int]]] = {}
    for n, it in enumerate(expansion.items[dataset]):
        if aspect not in it.human or not (it.metrics or it.annotators):
            continue
        h = it.human[aspect]
        local = start + n
        for name, value in it.aspect_metrics(aspect).items():
            got = gathered.setdefault(name, ([], [], []))
            got[0].append(-value if name in lower else value)
            got[1].append(h)
            got[2].append(local)
        votes = it.annotators.get(aspect, ())
        if len(votes) >= 2:
            got = gathered.setdefault("iaa", ([], [], []))
            got[0].append(votes[1])
            got[1].append(votes[0])
            got[2].append(local)
    for name, (judge, human, at) in gathered.items():
        series = c.series(np.array(judge, dtype=np.float64), np.array(human, dtype=np.float64),
                          c.local(at))
        judges[name] = _joined(judges[name], series) if name in judges else series


def _joined(a: Series, b: Series) -> Series:
    """Two series of one data set (the same labels), a's rows then b's."""
    return Series(np.concatenate([a.judge, b.judge]), np.concatenate([a.human, b.human]),
                  np.concatenate([a.group, b.group]), np.concatenate([a.system, b.system]),
                  np.concatenate([a.subset, b.subset]), a.labels)


