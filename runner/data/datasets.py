"""Data sets as `Item`s: the registered benchmarks and the user's own files.

`REGISTRY` (read from `registry.toml` next to this module) names every benchmark this
package can load, with the exact upstream files, their sha256 and size. `load` reads
those files where they are under `data_dir` (it never copies or re-hashes them);
`fetch` downloads missing or corrupt ones and `verify` hashes them. `load_file` reads a
user's JSONL, CSV or JSON file through a `FieldMap`.

The CLI passes `data_dir` in; nothing here reads the environment or prints.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
import tomllib
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, BinaryIO

from runner.data import loaders
from runner.data.loaders import Item, read_records, safe_unpickle
from runner.data.seen import Seen
from runner.errors import ConfigError, DataError

__all__ = ["REGISTRY", "DatasetInfo", "FieldMap", "Item", "RemoteFile", "fetch", "load",
           "load_file", "safe_unpickle", "verify"]

_RAW_PREFIX = "https://raw.githubusercontent.com"
_CHUNK = 1 << 16
_TIMEOUT = 60.0  # seconds per blocking socket operation, not for the whole file
_BITS64 = (1 << 64) - 1
_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".json": "json"}


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteFile:
    """One upstream file of a registered data set."""

    path: str  # where it lives, relative to `data_dir` (POSIX separators)
    url: str  # raw.githubusercontent.com URL pinned to an upstream commit
    sha256: str  # hex digest of the exact upstream bytes
    size: int  # in bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetInfo:
    """What a registered data set is, where its files come from, and what items carry."""

    name: str
    description: str
    license: str  # upstream license, and the terms of the underlying data
    files: tuple[RemoteFile, ...]
    aspects: tuple[str, ...]  # aspects with human scores (empty when the set has none)
    fields: tuple[str, ...]  # template field names its items carry
    lower_is_better: frozenset[str]  # metric names where lower is better; reduce negates them
    subsets: tuple[str, ...]  # empty when the set has none
    answer: str | None = None  # the field holding the judged text (length bias); None = none


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


def _read_registry() -> dict[str, DatasetInfo]:
    registry = resources.files("runner.data").joinpath("registry.toml")
    table = tomllib.loads(registry.read_text("utf-8"))
    return {name: DatasetInfo(
        name=name, description=entry["description"], license=entry["license"],
        files=tuple(RemoteFile(**file) for file in entry["files"]),
        aspects=tuple(entry["aspects"]), fields=tuple(entry["fields"]),
        lower_is_better=frozenset(entry["lower_is_better"]), subsets=tuple(entry["subsets"]),
        answer=entry.get("answer"),
    ) for name, entry in table.items()}


REGISTRY: Mapping[str, DatasetInfo] = MappingProxyType(_read_registry())
"""Registered data sets by name, in priority order."""

# None: a registered set of prompt files only; load() refuses it.
_LOADERS: Mapping[str, loaders.Loader | None] = {
    "openmeva": loaders.openmeva, "tst_formality": loaders.tst_formality,
    "summeval": loaders.summeval, "geval_prompts": None, "bagel": loaders.bagel,
    "korean_chat": loaders.korean_chat,
    "colossalai_en": loaders.colossalai, "colossalai_cn": loaders.colossalai,
}
_OPTIONS = ("subsets", "systems")


def _info(name: str) -> DatasetInfo:
    if name not in REGISTRY:
        raise ConfigError(f"unknown data set {name!r}; registered: {', '.join(REGISTRY)} "
                          "(or give a file with a field mapping)")
    return REGISTRY[name]


# ------------------------------------------------------------------- registered sets


def load(name: str, data_dir: Path, *,
         options: Mapping[str, Any] | None = None) -> Iterator[Item]:
    """Read a registered data set from its upstream files under `data_dir`.

    Files are checked for presence here, at call time, not hashed (`verify` does that).
    Items come in file order, grouped by source where the upstream file is.

    Args:
        name: A key of `REGISTRY`.
        data_dir: The directory holding the registered files at their `RemoteFile.path`.
        options: `subsets` (list of subset names) and `systems` (list of system names)
            keep only matching items. Any other key is an error.

    Returns:
        An iterator of `Item`s.

    Raises:
        ConfigError: Unknown name or option, unknown subset, a requested system that no
            item has (raised when the iterator is exhausted), or `geval_prompts`, which
            holds prompt files only and has no items.
        DataError: A file is missing (message names it and the fix) or malformed.
    """
    info = _info(name)
    loader = _LOADERS[name]
    if loader is None:
        raise ConfigError(f"data set {name!r} holds prompt files, not items: use its files "
                          f"({', '.join(f.path for f in info.files)}) as prompt templates")
    subsets, systems = _options(info, options or {})
    paths = []
    for remote in info.files:
        path = data_dir / remote.path
        if not path.is_file():
            raise DataError(f"{path}: missing file of data set {name!r}; run "
                            f"`judge datasets fetch {name}` or set JUDGE_DATA_DIR")
        paths.append(path)
    return _filtered(loader(paths, name), name, subsets, systems)


def _options(info: DatasetInfo, options: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ConfigError(f"data set {info.name!r}: unknown option {unknown[0]!r}; "
                          f"options are {', '.join(_OPTIONS)}")
    chosen: list[set[str]] = []
    for key in _OPTIONS:
        value = options.get(key, [])
        if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"data set {info.name!r}: option {key!r} must be a list of "
                              f"names (got {value!r})")
        chosen.append(set(value))
    bad = sorted(chosen[0] - set(info.subsets))
    if bad:
        known = ", ".join(info.subsets) or "none"
        raise ConfigError(f"data set {info.name!r}: unknown subset {bad[0]!r}; "
                          f"subsets are: {known}")
    return chosen[0], chosen[1]


def _filtered(items: Iterator[Item], name: str, subsets: set[str],
              systems: set[str]) -> Iterator[Item]:
    seen: set[str] = set()
    for item in items:
        seen.add(item.system)
        if (not subsets or item.subset in subsets) and (not systems or item.system in systems):
            yield item
    missing = sorted(systems - seen)
    if missing:
        raise ConfigError(f"data set {name!r}: no item has system {missing[0]!r}; "
                          f"systems are: {', '.join(sorted(seen))}")


def verify(name: str, data_dir: Path) -> list[tuple[str, str]]:
    """Hash every registered file of a data set.

    Args:
        name: A key of `REGISTRY`.
        data_dir: The data directory.

    Returns:
        One `(RemoteFile.path, status)` per file, status "ok", "missing" or
        "sha256 mismatch" (a wrong size counts as a mismatch).

    Raises:
        ConfigError: Unknown name.
    """
    report = []
    for remote in _info(name).files:
        path = data_dir / remote.path
        if not path.is_file():
            report.append((remote.path, "missing"))
        else:
            report.append((remote.path, "ok" if _intact(path, remote) else "sha256 mismatch"))
    return report


def _intact(path: Path, remote: RemoteFile) -> bool:
    if path.stat().st_size != remote.size:
        return False
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest() == remote.sha256


def fetch(name: str, data_dir: Path, *, mirror: str | None = None) -> list[Path]:
    """Download the files of a data set that are missing or fail their sha256.

    Each file is streamed into a temporary file next to its destination, checked
    against the registered size and sha256, and renamed into place only if it matches,
    so an interrupted or corrupt download never leaves a partial file behind.

    Args:
        name: A key of `REGISTRY`.
        data_dir: The data directory; created as needed.
        mirror: Replaces "https://raw.githubusercontent.com" in each URL, keeping
            `/OWNER/REPO/COMMIT/PATH`, e.g. "http://127.0.0.1:8000".

    Returns:
        The paths written, in registry order (empty if everything was intact).

    Raises:
        ConfigError: Unknown name, or a mirror that is not an http(s) or file URL.
        DataError: A download failed or did not match its registered sha256.
    """
    info = _info(name)
    if mirror is not None and urllib.parse.urlsplit(mirror).scheme not in {"http", "https",
                                                                            "file"}:
        raise ConfigError(f"mirror {mirror!r} must be an http://, https:// or file:// URL")
    written = []
    for remote in info.files:
        dest = data_dir / remote.path
        if dest.is_file() and _intact(dest, remote):
            continue
        url = remote.url
        if mirror is not None and url.startswith(_RAW_PREFIX):
            url = mirror.rstrip("/") + url[len(_RAW_PREFIX):]
        _download(url, dest, remote)
        written.append(dest)
    return written


def _download(url: str, dest: Path, remote: RemoteFile) -> None:
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, temp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part",
                                         dir=dest.parent)
    except OSError as exc:
        raise DataError(f"{dest.parent}: cannot write ({exc.strerror}); use a writable "
                        "data directory (JUDGE_DATA_DIR)") from None
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _stream(url, out, remote)
            out.flush()
            os.fsync(out.fileno())
        if digest != remote.sha256:
            raise DataError(f"{url}: sha256 {digest} does not match the registered "
                            f"{remote.sha256} for {remote.path}; nothing was written, "
                            "check the mirror or report a changed upstream")
        os.replace(temp, dest)  # atomic on one file system: readers see old or new, never half
    finally:
        temp.unlink(missing_ok=True)


def _stream(url: str, out: BinaryIO, remote: RemoteFile) -> str:
    """Copy the response body to `out`; return its sha256. Sizes are checked as we go."""
    import urllib.error  # here: ~20 ms of every command's start-up otherwise
    import urllib.request
    from http.client import HTTPException

    digest, size = hashlib.sha256(), 0
    fix = f"{remote.path} was not written; check the network or pass a mirror"
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT) as response:
            while chunk := response.read(_CHUNK):
                size += len(chunk)
                if size > remote.size:
                    break
                digest.update(chunk)
                out.write(chunk)
    except urllib.error.HTTPError as exc:
        raise DataError(f"{url}: HTTP {exc.code} {exc.reason}; {fix}") from None
    except urllib.error.URLError as exc:
        raise DataError(f"{url}: download failed ({exc.reason}); {fix}") from None
    except (OSError, HTTPException) as exc:
        raise DataError(f"{url}: download failed ({exc!r}); {fix}") from None
    if size != remote.size:
        raise DataError(f"{url}: got {'more than ' if size > remote.size else ''}{size} "
                        f"bytes, expected {remote.size}; {fix}")
    return digest.hexdigest()


# ------------------------------------------------------------------------ user files


def load_file(path: Path, mapping: FieldMap, *, dataset: str) -> Iterator[Item]:
    """Read a user's JSONL, CSV or JSON (list of objects) file as `Item`s.

    The mapping and the file's presence are checked at call time; rows are read lazily
    (JSONL and CSV stream; JSON is parsed whole). CSV is read as UTF-8 (a BOM is skipped).
    Text cells pass through untouched; score cells must be finite numbers or numeric text.

    Args:
        path: The file.
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
    fmt = mapping.format or _FORMATS.get(path.suffix.lower())
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
    systems is held once, not 16 times) is that same str; group, system and subset names and
    scores are interned in dicts of at most LIMIT entries (cleared when full); empty
    annotators, metrics and extras are NO_VALUES.
    """

    LIMIT = 1 << 16

    def __init__(self) -> None:
        self.interned_names: dict[str, str] = {}
        self.interned_numbers: dict[float, float] = {}
        self.previous_text: dict[str, str] = {}  # text field name -> the previous item's

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
            human=human, annotators=annotators or NO_VALUES,
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
            raise ConfigError(f"{self.path}: column {column!r} (mapped as {role}) not found; "
                              f"columns are: {_names(self.row)}; fix the field mapping")
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
        try:
            if isinstance(value, bool) or not isinstance(value, int | float | str):
                raise ValueError
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise DataError(f"{self.where}: column {column!r} (mapped as {role}) is "
                            f"{value!r}, not a finite number; fix the value or the mapping")
        return number


def _names(row: Iterable[str]) -> str:
    return ", ".join(repr(name) for name in row) or "(none)"
