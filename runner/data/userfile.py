"""A user's own data file (JSONL, CSV or a JSON list) read as `Item`s through a `FieldMap`:
`load_file`, with the values of consecutive items shared (`_ItemInterner`). Re-exported by
runner.data.datasets, beside the registered benchmarks.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from runner.data.loaders import Item
from runner.data.readers import FORMATS, number, read_records
from runner.data.seen import Seen
from runner.errors import ConfigError, DataError

__all__ = ["NO_VALUES", "FieldMap", "load_file"]

_BITS64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class FieldMap:
    """How the columns of a user's file become `Item` fields."""

    id: str | None = None  # column with the item id; None = the record's 0-based position
    group: str | None = None  # None = each item is its own group
    system: str | None = None  # None = ""
    subset: str | None = None  # None = ""
    text: Mapping[str, str]  # template field -> column (at least one)
    # aspect -> column, or several annotator columns (mean taken, kept in annotators)
    human: Mapping[str, str | tuple[str, ...]]
    metrics: tuple[str, ...] = ()  # metric columns; they apply to every aspect (under "*")
    lower_is_better: tuple[str, ...] = ()  # those of `metrics` where lower is better
    format: str | None = None  # "jsonl", "csv" or "json" (list of objects); None = extension
    answer: str | None = None  # the judged text field (length bias); default: output, answer...


def load_file(path: Path, mapping: FieldMap, *, dataset: str) -> Iterator[Item]:
    """Read a user's JSONL, CSV or JSON (list of objects) file as `Item`s.

    The mapping and the file's presence are checked at call time; rows are read lazily
    (JSONL and CSV stream; JSON is parsed whole). CSV is read as UTF-8 (a BOM is skipped).
    Text cells pass through untouched; score cells must be finite numbers or numeric text.

    Args:
        mapping: Which columns hold the id, group, system, subset, text, scores, metrics.
        dataset: The name the job gives this data set (becomes `Item.dataset`).

    Returns:
        An iterator of `Item`s in file order.

    Raises:
        ConfigError: The mapping is invalid, the format unknown, or a mapped column is
            absent from the first record.
        DataError: The file is missing or malformed, a later record lacks a mapped column,
            a score is not a number, or an item id repeats.
    """
    fmt = mapping.format or FORMATS.get(path.suffix.lower())
    if fmt not in {"jsonl", "csv", "json"}:
        raise ConfigError(f"{path}: cannot tell the format from {path.suffix!r}; "
                          "set format to jsonl, csv or json in the field mapping")
    _check_mapping(path, mapping)
    if not path.is_file():
        raise DataError(f"{path}: file not found; check the path in the job file")
    return _mapped(path, read_records(path, fmt), mapping, dataset,
                   reread=lambda: read_records(path, fmt))


def _check_mapping(path: Path, mapping: FieldMap) -> None:
    if not mapping.text:
        raise ConfigError(f"{path}: the field mapping has no text columns; map at least "
                          "one template field, e.g. text = {output = \"column\"}")
    for aspect, columns in mapping.human.items():
        if isinstance(columns, tuple) and not columns:
            raise ConfigError(f"{path}: human.{aspect} lists no columns; give one column "
                              "or several annotator columns")
    stray = sorted(set(mapping.lower_is_better) - set(mapping.metrics))
    if stray:
        raise ConfigError(f"{path}: lower_is_better names {stray[0]!r}, which is not "
                          "among the metric columns; add it to metrics or remove it")


def _mapped(path: Path, rows: Iterator[tuple[int, str, Any]], mapping: FieldMap,
            dataset: str, reread: Callable[[], Iterator[tuple[int, str, Any]]]
            ) -> Iterator[Item]:
    # Ids seen so far, as 64-bit hashes (~12 bytes an item: a plan over 2.5M items streams
    # them, where a set of the id strings held ~200 MB); a hash already seen is checked
    # against the file itself, so a collision never turns into a false error.
    seen, interner = Seen(), _ItemInterner()
    for index, where, row in rows:
        if not isinstance(row, dict):
            raise DataError(f"{where}: a {type(row).__name__}, expected an object; "
                            "each record must map column names to values")
        cell = _Cells(path, where, row, first=index == 0)
        item_id = cell.text(mapping.id, "id") if mapping.id else str(index)
        if mapping.id and not seen.add(_id64(item_id)):
            first = _first_with_id(reread(), mapping.id, item_id, index)
            if first is not None:
                raise DataError(f"{where}: item id {item_id!r} (column {mapping.id!r}) repeats "
                                f"the one at {first}; ids must be unique within a data set")
        yield interner.item(dataset, item_id, cell, mapping)


NO_VALUES: Mapping[str, Any] = MappingProxyType({})
"""The one empty mapping every item without annotators, metrics or extras shares."""


class _ItemInterner:
    """Equal values of consecutive items as one object, to hold a large data set in less memory
    (a run keeps every item: 2.5M items of ~580-byte lines took ~1.4 KB each, ~0.8 KB shared).

    A text field equal to the previous item's (a group's source: a document judged for 16
    systems is held once, not 16 times) is that same str; group, system and subset names,
    scores and items' human scores (a dict equal to one seen before, zeros aside: 0.0 and -0.0
    are equal keys) are interned in dicts of at most LIMIT entries (cleared when full); empty
    annotators, metrics and extras are NO_VALUES. The human scores' dict is 184 bytes an item
    of 4 aspects; scores on a scale repeat (the synthetic 250k items x 4 aspects of
    bench/memory.py: 625 distinct dicts), so a 1M-task run holds ~46 MB less
    (bench/README.md, Memory). Nothing changes an item's dicts once it is made.
    """

    LIMIT = 1 << 16

    def __init__(self) -> None:
        self.interned_names: dict[str, str] = {}
        self.interned_numbers: dict[float, float] = {}
        self.previous_text: dict[str, str] = {}  # text field name -> the previous item's
        self.interned_scores: dict[tuple[tuple[str, float], ...], dict[str, float]] = {}

    def name(self, value: str) -> str:
        if len(self.interned_names) >= self.LIMIT and value not in self.interned_names:
            self.interned_names.clear()
        return self.interned_names.setdefault(value, value)

    def number(self, value: float) -> float:
        if not value:  # 0.0 and -0.0 are equal keys: keep the sign as read
            return value
        if len(self.interned_numbers) >= self.LIMIT and value not in self.interned_numbers:
            self.interned_numbers.clear()
        return self.interned_numbers.setdefault(value, value)

    def scores(self, human: dict[str, float]) -> dict[str, float]:
        if 0.0 in human.values():  # -0.0 == 0.0: a shared dict could change a zero's sign
            return human
        key = tuple(human.items())
        if len(self.interned_scores) >= self.LIMIT and key not in self.interned_scores:
            self.interned_scores.clear()
        return self.interned_scores.setdefault(key, human)

    def text(self, name: str, value: str) -> str:
        last = self.previous_text.get(name)
        if last is not None and last == value:
            return last
        self.previous_text[name] = value
        return value

    def item(self, dataset: str, item_id: str, cell: _Cells, mapping: FieldMap) -> Item:
        human: dict[str, float] = {}
        annotators: dict[str, tuple[float, ...]] = {}
        for aspect, columns in mapping.human.items():
            if isinstance(columns, str):
                human[aspect] = self.number(cell.number(columns, f"human.{aspect}"))
            else:
                scores = tuple(self.number(cell.number(c, f"human.{aspect}")) for c in columns)
                human[aspect] = self.number(sum(scores) / len(scores))
                annotators[aspect] = scores
        metrics = {c: self.number(cell.number(c, "metrics")) for c in mapping.metrics}
        return Item(
            dataset=dataset, item_id=item_id,
            group=self.name(cell.text(mapping.group, "group")) if mapping.group else item_id,
            system=self.name(cell.text(mapping.system, "system")) if mapping.system else "",
            subset=self.name(cell.text(mapping.subset, "subset")) if mapping.subset else "",
            fields={name: self.text(name, cell.text(column, f"text.{name}"))
                    for name, column in mapping.text.items()},
            human=self.scores(human), annotators=annotators or NO_VALUES,
            metrics={"*": metrics} if metrics else NO_VALUES, extra=NO_VALUES,
        )


def _id64(item_id: str) -> int:
    """An id's 64-bit hash (Python's own: per process, which is all a pass needs)."""
    return hash(item_id) & _BITS64


def _first_with_id(rows: Iterator[tuple[int, str, Any]], column: str, item_id: str,
                   before: int) -> str | None:
    """Where an earlier record (index < before) has `item_id` in `column`, or None."""
    for index, where, row in rows:
        if index >= before:
            return None
        value = row.get(column) if isinstance(row, dict) else None
        if value is not None and not isinstance(value, bool) and str(value) == item_id:
            return where
    return None


class _Cells:
    """Reads mapped cells of one record with messages naming file, line and column."""

    def __init__(self, path: Path, where: str, row: Mapping[str, Any], *, first: bool):
        self.path, self.where, self.row, self.first = path, where, row, first

    def _get(self, column: str, role: str) -> Any:
        if column in self.row and self.row[column] is not None:
            return self.row[column]
        if self.first and column not in self.row:  # absent from the start: the mapping is wrong
            names = ", ".join(map(repr, self.row)) or "(none)"
            raise ConfigError(f"{self.path}: column {column!r} (mapped as {role}) not found; "
                              f"columns are: {names}; fix the field mapping")
        raise DataError(f"{self.where}: column {column!r} (mapped as {role}) is missing or "
                        "null; fill it in or drop the record")

    def text(self, column: str, role: str) -> str:
        value = self._get(column, role)
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise DataError(f"{self.where}: column {column!r} (mapped as {role}) is a "
                        f"{type(value).__name__}, expected text; fix the value or the mapping")

    def number(self, column: str, role: str) -> float:
        value = self._get(column, role)
        as_float = number(value)
        if not math.isfinite(as_float):
            raise DataError(f"{self.where}: column {column!r} (mapped as {role}) is "
                            f"{value!r}, not a finite number; fix the value or the mapping")
        return as_float
