"""One judge's scores beside the humans', as columns: what correlate, compare and the page read
(and as `Row` tuples, for small series and tests).

A `Series` is the reducer's input for one (data set, aspect, judge): a row per item the judge
and the humans both saw, in the reports' row order (the order `Row` lists had). It holds
numpy columns, 8 bytes a row for each score and 4 for each label code, where a list of `Row`
tuples held ~150 bytes a row: at ten million judgments that is the difference between ~0.3 GB
and ~1.5 GB for the series alone. Label codes index `Labels`, shared by every judge of a data
set.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["Labels", "Row", "Series", "coded"]

FloatArray = npt.NDArray[np.float64]
CodeArray = npt.NDArray[np.int32]


class Row(NamedTuple):
    """One judged output, a row of a `Series` (a NamedTuple, made once per judge and cell: a
    tenth of a frozen dataclass's construction time)."""

    group: str  # the source it was generated from (document, story beginning, sentence)
    system: str  # the system that generated it
    subset: str  # e.g. a transfer direction; "" when the data has none
    judge: float | None  # None (or NaN) when the judge's reply could not be parsed
    human: float


@dataclass(frozen=True, slots=True)
class Labels:
    """The names a data set's label codes stand for: `groups[code]`, `systems[code]`,
    `subsets[code]`."""

    groups: Sequence[str]
    systems: Sequence[str]
    subsets: Sequence[str]


@dataclass(frozen=True, slots=True)
class Series:
    """One judge against the humans over one data set and aspect, a row per item.

    Fields:
        judge: the judge's score per row, NaN where it gave none (a failed or unparsed task).
        human: the human score per row (finite).
        group, system, subset: each row's label codes into `labels`.
        labels: the names of the codes.
    """

    judge: FloatArray
    human: FloatArray
    group: CodeArray
    system: CodeArray
    subset: CodeArray
    labels: Labels

    def __len__(self) -> int:
        return int(self.judge.size)

    @classmethod
    def of_rows(cls, rows: Iterable[Row]) -> Series:
        """A series of `Row` tuples (group, system, subset, judge, human), codes in order of
        first appearance.

        Args:
            rows: the rows, in the reports' order; a judge of None is NaN.
        Returns:
            the same rows as columns.
        """
        rows = list(rows)
        judge = [np.nan if r.judge is None else r.judge for r in rows]
        return cls(np.array(judge, dtype=np.float64),
                   np.array([r.human for r in rows], dtype=np.float64),
                   *coded((r.group, r.system, r.subset) for r in rows))

    def rows(self) -> list[Row]:
        """The series as `Row` tuples (for small series and tests)."""
        g, s, b = self.labels.groups, self.labels.systems, self.labels.subsets
        return [Row(g[gi], s[si], b[bi], None if np.isnan(j) else float(j), float(h))
                for gi, si, bi, j, h in zip(self.group.tolist(), self.system.tolist(),
                                            self.subset.tolist(), self.judge.tolist(),
                                            self.human.tolist(), strict=True)]


def coded(labels: Iterable[tuple[str, str, str]]
          ) -> tuple[CodeArray, CodeArray, CodeArray, Labels]:
    """Rows' (group, system, subset) names as label codes, in order of first appearance.

    Args:
        labels: each row's group, system and subset.

    Returns:
        The group, system and subset code columns, and the names they stand for.
    """
    names: tuple[dict[str, int], dict[str, int], dict[str, int]] = ({}, {}, {})
    columns: tuple[list[int], list[int], list[int]] = ([], [], [])
    for row in labels:
        for n, column, name in zip(names, columns, row, strict=True):
            column.append(n.setdefault(name, len(n)))
    group, system, subset = (np.array(c, dtype=np.int32) for c in columns)
    return group, system, subset, Labels(*(tuple(n) for n in names))
