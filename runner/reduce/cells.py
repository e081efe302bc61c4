"""The report cells as columns: one row per item x prompt x aspect x model, in order of first
appearance, what scores.csv, summary.csv, the leaderboard, the correlations and reliability.csv
are all built from.

A cell (`Cells`) takes 23 bytes in numpy columns; while collecting, it is found through a dense
int32 grid per data set (item x judge, ~4 bytes a cell), not a dict of tuples. What it buys:
`collect` keeps 17 bytes a task where a dict of cell objects kept 187, so ten million
judgments' cells take ~0.2 GB, not ~1.9, at the same CPU (bench/memory.py on a cached
100k-task run; bench/README.md, "Memory": "Columnar cells").

The mean of several samples is `statistics.fmean`'s: the correctly rounded sum (math.fsum)
divided by the count, computed once all samples are in (integer scores summed exactly in
numpy, others with math.fsum), so the reports keep their bits.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from runner.data.datasets import Item
from runner.expand import Expansion
from runner.job.spec import JurySpec
from runner.reduce.jury import judge_name, verdicts

__all__ = ["FAILURES", "CellBuilder", "Cells", "grouped"]

FAILURES = ("parse", "refusal", "api")
"""The failure types counted per cell (summary.csv's parse_failures, refusals, api_failures)."""
_EXACT = float(2 ** 52)  # integer scores whose sums stay below this are summed exactly


@dataclass(slots=True)
class Cells:
    """The collected cells, as numpy columns of equal length (one entry a cell).

    Fields:
        items: every item a cell may point at, the expansion's, data set by data set.
        item_dataset: each item's data set, as an index into `datasets`.
        datasets: data set names.
        starts: where each data set's items start in `items` (its expansion list's order;
            an item a cell had that the list lacks is appended where it was met).
        judges: judge code -> (prompt, aspect, model); a jury's cells have prompt "".
        item: each cell's item (index into `items`).
        judge: each cell's judge code.
        score: each cell's score, NaN where it has none.
        scored: whether the cell has a score (a parser's own NaN would count as one).
        failures: (cells, 3) failed samples by type, in FAILURES order.
    """

    items: list[Item]
    item_dataset: npt.NDArray[np.int32]
    datasets: list[str]
    starts: list[int]
    judges: list[tuple[str, str, str]]
    item: npt.NDArray[np.int32]
    judge: npt.NDArray[np.int32]
    score: npt.NDArray[np.float64]
    scored: npt.NDArray[np.bool_]
    failures: npt.NDArray[np.uint16]

    def __len__(self) -> int:
        return int(self.item.size)

    def dataset(self) -> npt.NDArray[np.int32]:
        """Each cell's data set code (an index into `datasets`)."""
        return self.item_dataset[self.item]

    def aspect_codes(self) -> tuple[list[str], npt.NDArray[np.int32]]:
        """The aspect names, and each judge code's aspect as an index into them."""
        names = list(dict.fromkeys(a for _, a, _ in self.judges))
        where = {a: i for i, a in enumerate(names)}
        return names, np.array([where[a] for _, a, _ in self.judges], dtype=np.int32)

    def names(self) -> tuple[list[str], npt.NDArray[np.int32]]:
        """The judge names (`model/prompt`, a jury's own), and each judge code's name as an
        index into them."""
        names = list(dict.fromkeys(judge_name(m, p) for p, _, m in self.judges))
        where = {n: i for i, n in enumerate(names)}
        return names, np.array([where[judge_name(m, p)] for p, _, m in self.judges],
                               dtype=np.int32)


def grouped(keys: npt.NDArray[np.integer[Any]], size: int
            ) -> tuple[list[int], list[npt.NDArray[np.intp]]]:
    """The distinct values of `keys` (each in range(size), a small range: judges, data sets,
    aspects) in order of first appearance, and each one's positions in order.

    A counting pass (the first position of each value) and a stable argsort of the values'
    ranks, a radix sort for up to 32,767 of them: at ten million cells ~1.6 s and ~10 bytes a
    cell at its peak, where numpy.unique with return_inverse took ~8 s and ~40 bytes.

    Args:
        keys: one small non-negative integer per row.
        size: an upper bound of the keys, exclusive.
    Returns:
        (distinct keys, positions of each), both in order of first appearance.
    """
    n = int(keys.size)
    if not n:
        return [], []
    first = np.full(size, n, dtype=np.int64)
    np.minimum.at(first, keys, np.arange(n))
    present = np.flatnonzero(first < n)
    distinct = present[np.argsort(first[present], kind="stable")]
    rank = np.zeros(size, dtype=np.int16 if len(distinct) < 2 ** 15 else np.int32)
    rank[distinct] = np.arange(len(distinct))
    ranks = rank[keys]
    order = np.argsort(ranks, kind="stable")
    bounds = np.r_[0, np.cumsum(np.bincount(ranks, minlength=len(distinct)))].tolist()
    return distinct.tolist(), [order[a:b] for a, b in zip(bounds[:-1], bounds[1:],
                                                          strict=True)]


class _Grid:
    """One data set's cells while collecting: item -> local index, judge -> local column, and
    `slots[local item * stride + column]` = the cell's index, -1 for none yet.

    An item's local index is its position in the data set's list (`listed`), found by a cursor:
    judgments come in the list's order, so the item is the cursor's or the next one (the same
    object: judging looks items up in the expansion). Only a judgment out of that order builds
    the item id -> local index dict: a run holds none, where the dict held ~80 bytes an item
    (bench/README.md, Memory)."""

    __slots__ = ("at", "columns", "glob", "index", "item_of", "listed", "slots", "stride")

    def __init__(self, listed: Sequence[Item], start: int,
                 judges: Sequence[tuple[tuple[str, str, str], int]]) -> None:
        self.listed, self.at = listed, 0
        self.index: dict[str, int] | None = None
        self.item_of = array("i", range(start, start + len(listed)))
        self.columns: dict[tuple[str, str, str], int] = {}
        self.glob: list[int] = []  # local column -> global judge code
        for key, code in judges:
            if key not in self.columns:
                self.columns[key] = len(self.glob)
                self.glob.append(code)
        self.stride = max(len(self.glob), 1)
        self.slots = array("i", [-1]) * (len(listed) * self.stride)

    def local(self, item: Item) -> int | None:
        """The item's local index, None if the data set's list lacks it and no cell has it."""
        listed, at = self.listed, self.at
        if at < len(listed) and listed[at] is item:
            return at
        if at + 1 < len(listed) and listed[at + 1] is item:
            self.at = at + 1
            return at + 1
        if self.index is None:
            self.index = {it.item_id: i for i, it in enumerate(listed)}
        local = self.index.get(item.item_id)
        if local is not None and local < len(listed):
            self.at = local
        return local

    def column(self, key: tuple[str, str, str], code: int) -> int:
        """The local column of a judge the job did not list for this data set, widening the
        grid."""
        col = self.columns[key] = len(self.glob)
        self.glob.append(code)
        if col >= self.stride:
            wider = max(2 * self.stride, col + 1)
            slots = array("i", [-1]) * (len(self.item_of) * wider)
            old = self.stride
            for i in range(len(self.item_of)):
                slots[i * wider:i * wider + old] = self.slots[i * old:(i + 1) * old]
            self.slots, self.stride = slots, wider
        return col

    def add_item(self, item: Item, global_index: int) -> int:
        """A local index for an item the data set's list lacks (`local` returned None)."""
        assert self.index is not None, "local() builds the index before it returns None"
        self.item_of.append(global_index)
        self.slots.extend(array("i", [-1]) * self.stride)
        local = self.index[item.item_id] = len(self.item_of) - 1
        return local


class CellBuilder:
    """Gathers cells one judgment at a time (`add`), then `finish` gives the `Cells`.

    Args:
        expansion: the job's items (a cell's item index points into them) and judges.
    """

    def __init__(self, expansion: Expansion) -> None:
        self.expansion = expansion
        self.items: list[Item] = []
        self.item_dataset = array("i")
        self.datasets: list[str] = []
        self.starts: list[int] = []
        self.codes: dict[tuple[str, str, str], int] = {}
        """judge -> its code, in order of first appearance."""
        self.grids: dict[str, _Grid] = {}
        self.item, self.judge = array("i"), array("i")
        self.score, self.count = array("d"), array("I")
        self.failures = [array("H") for _ in FAILURES]
        self.more_cell, self.more_score = array("i"), array("d")
        """Each cell's second and later scores, in arrival order (samples > 1)."""
        self._dataset: str | None = None
        self._grid: _Grid | None = None

    def _open(self, dataset: str) -> _Grid:
        """The data set's grid, made on its first cell: its items, its judges by the job."""
        if (grid := self.grids.get(dataset)) is None:
            items = list(self.expansion.items.get(dataset, ()))
            start, d = len(self.items), len(self.datasets)
            self.datasets.append(dataset)
            self.starts.append(start)
            self.items += items
            self.item_dataset.extend(array("i", [d]) * len(items))
            prompts = [p for p in self.expansion.job.prompts
                       if not p.datasets or dataset in p.datasets]
            keys = [(p.name, a, m.name) for p in prompts for a in p.aspects
                    for m in self.expansion.judges(p)]
            judges = [(key, self.codes.setdefault(key, len(self.codes))) for key in keys]
            grid = self.grids[dataset] = _Grid(items, start, judges)
        self._dataset, self._grid = dataset, grid
        return grid

    def add(self, dataset: str, item: Item, judge: tuple[str, str, str], score: float | None,
            failure: str | None) -> None:
        """Count one judgment of the cell of (`dataset`, `item`, `judge`), made if it is new.

        Args:
            dataset: the data set's name.
            item: the judged item.
            judge: the prompt, aspect and model.
            score, failure: the parsed score and the failure's type, each None without one.
        """
        grid = self._grid if dataset == self._dataset and self._grid is not None \
            else self._open(dataset)
        if (local := grid.local(item)) is None:  # an item the lists lack
            self.items.append(item)
            self.item_dataset.append(self.datasets.index(dataset))
            local = grid.add_item(item, len(self.items) - 1)
        if (col := grid.columns.get(judge)) is None:
            col = grid.column(judge, self.codes.setdefault(judge, len(self.codes)))
        slot = local * grid.stride + col
        if (c := grid.slots[slot]) < 0:
            c = grid.slots[slot] = len(self.item)
            self.item.append(grid.item_of[local])
            self.judge.append(grid.glob[col])
            self.score.append(math.nan)
            self.count.append(0)
            for f in self.failures:
                f.append(0)
        if score is not None:
            if (n := self.count[c]) == 0:
                self.score[c] = score
            else:
                self.more_cell.append(c)
                self.more_score.append(score)
            self.count[c] = n + 1
        if failure in FAILURES:
            self.failures[FAILURES.index(failure)][c] += 1

    def finish(self, juries: Sequence[JurySpec] = ()) -> Cells:
        """The cells, each with the mean of its scores; then each jury's verdicts as cells
        of its own (prompt "", model = the jury's name), as runner.reduce.jury describes.

        Args:
            juries: the job's juries, in its order.
        Returns:
            the columns; the builder is emptied.
        """
        # the columns as numpy arrays over the builder's own buffers, not copies of them: at
        # ten million cells a copy made the builder's peak ~0.3 GB higher
        score = _column(self.score, np.float64)
        count = _column(self.count, np.uint32)
        _means(score, count, np.array(self.more_cell, dtype=np.int64),
               np.array(self.more_score, dtype=np.float64))
        cells = Cells(self.items, np.array(self.item_dataset, dtype=np.int32), self.datasets,
                      self.starts, list(self.codes), _column(self.item, np.int32),
                      _column(self.judge, np.int32), score, count > 0,
                      np.stack([np.array(f, dtype=np.uint16) for f in self.failures], axis=1))
        self.grids.clear()
        self.item = self.judge = self.more_cell = array("i")
        self.score = self.more_score = array("d")
        return _with_juries(cells, juries) if juries else cells


def _column(values: array[Any], dtype: type[np.generic]) -> npt.NDArray[Any]:
    """A numpy array over an array.array's buffer (which it keeps alive), if the item sizes
    agree, else a copy."""
    if not len(values):
        return np.zeros(0, dtype=dtype)
    if values.itemsize == np.dtype(dtype).itemsize:
        return np.frombuffer(values, dtype=dtype)
    return np.array(values, dtype=dtype)


def _means(score: npt.NDArray[np.float64], count: npt.NDArray[np.integer[Any]],
           more_cell: npt.NDArray[np.int64], more_score: npt.NDArray[np.float64]) -> None:
    """Each multi-sample cell's mean in `score`, as statistics.fmean makes it: fsum / n."""
    if not more_cell.size:
        return
    order = np.argsort(more_cell, kind="stable")
    cell, extra = more_cell[order], more_score[order]
    multi = np.unique(cell)
    values = np.concatenate([score[multi], extra])
    if np.all(values == np.floor(values)) and \
            float(np.abs(values).max()) * float(count.max()) < _EXACT:
        # integers: every partial sum is exact, so this is fsum's value
        total = score[multi] + np.bincount(np.searchsorted(multi, cell), weights=extra,
                                           minlength=multi.size)
        score[multi] = total / count[multi]
        return
    starts = np.searchsorted(cell, multi)
    ends = np.r_[starts[1:], cell.size]
    firsts, rest = score[multi].tolist(), extra.tolist()
    for c, first, a, b in zip(multi.tolist(), firsts, starts.tolist(), ends.tolist(),
                              strict=True):
        score[c] = math.fsum([first, *rest[a:b]]) / int(count[c])


def _with_juries(cells: Cells, juries: Sequence[JurySpec]) -> Cells:
    """`cells` with every jury's cells appended: for each item and aspect some member judged
    (in order of first appearance), the verdict of its members' scores, None below quorum
    (runner.reduce.jury.verdicts). Juries read the judges' cells only, not each other's."""
    judge_codes = {key: i for i, key in enumerate(cells.judges)}
    judges = list(cells.judges)
    columns = (cells.judges, cells.item.tolist(), cells.judge.tolist(), cells.score,
               cells.scored.tolist())
    new_item: list[int] = []
    new_judge: list[int] = []
    new_score: list[float] = []
    new_scored: list[bool] = []
    for jury in juries:
        for (i, aspect), value in verdicts(jury, *columns).items():
            key = ("", aspect, jury.name)
            if (code := judge_codes.get(key)) is None:
                code = judge_codes[key] = len(judges)
                judges.append(key)
            new_item.append(i)
            new_judge.append(code)
            new_score.append(math.nan if value is None else value)
            new_scored.append(value is not None)
    n = len(new_item)
    return Cells(cells.items, cells.item_dataset, cells.datasets, cells.starts, judges,
                 np.concatenate([cells.item, np.array(new_item, dtype=np.int32)]),
                 np.concatenate([cells.judge, np.array(new_judge, dtype=np.int32)]),
                 np.concatenate([cells.score, np.array(new_score, dtype=np.float64)]),
                 np.concatenate([cells.scored, np.array(new_scored, dtype=bool)]),
                 np.concatenate([cells.failures, np.zeros((n, len(FAILURES)), np.uint16)]))
