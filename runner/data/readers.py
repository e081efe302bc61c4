"""Safe, exact readers of the file formats the data sets and users' files come in. Every
failure is a one-line DataError naming the file (and line) and the fix.
"""

from __future__ import annotations

import csv
import io
import json
import math
import pickle
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from runner.errors import DataError

__all__ = ["FORMATS", "jsonl", "loads", "number", "read_bytes", "read_json", "read_records",
           "safe_unpickle"]


# Exactly these types may appear in an unpickled value. Without find_class no other
# type can be built, but sets, frozensets and bytearrays have their own opcodes.
_PLAIN = frozenset({dict, list, tuple, str, int, float, bool, bytes, type(None)})


class _PlainUnpickler(pickle.Unpickler):
    """Refuses every global, so no class is built and no callable is reachable."""

    def find_class(self, module: str, name: str, /) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")

    def persistent_load(self, pid: Any, /) -> Any:
        raise pickle.UnpicklingError("persistent ids are not allowed")


def safe_unpickle(data: bytes) -> Any:
    """Unpickle plain data only: dict, list, tuple, str, int, float, bool, None, bytes.

    Every GLOBAL/STACK_GLOBAL/INST/OBJ/EXT opcode is refused before anything is called,
    so a malicious pickle cannot run code. Protocol 0-2 pickles of `bytes` need a global
    (`_codecs.encode`) and are refused too; protocol 3+ is fine.

    Args:
        data: The pickle bytes.

    Returns:
        The unpickled value.

    Raises:
        DataError: The pickle is malformed, names a global, or holds a disallowed type.
    """
    try:
        value = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # no user code can run here, so every failure is bad data
        raise DataError(f"pickle refused: {exc}; only plain containers and scalars "
                        "are loaded") from None
    _check_plain(value)
    return value


def _check_plain(value: Any) -> None:
    """Walk the value iteratively (no recursion limit, cycles visited once)."""
    stack: list[Any] = [value]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if type(node) not in _PLAIN:
            raise DataError(f"pickle refused: it holds a {type(node).__name__}; only plain "
                            "containers and scalars are loaded")
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list | tuple):
            stack.extend(node)


def read_bytes(path: Path, fix: str) -> bytes:
    """A file's bytes.

    Args:
        path, fix: The file, and what the user should do (ending the error message).

    Returns:
        The file's content.

    Raises:
        DataError: The file cannot be read.
    """
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror}); {fix}") from None


def loads(data: bytes) -> Any:
    """JSON as the standard library reads it, through orjson where orjson can (~3x faster a
    line). Whatever orjson refuses (NaN and Infinity, lone surrogates, a byte-order mark,
    UTF-16, nesting past 1,024) goes to `json.loads`, which decides; so does a value orjson
    may have read as a float where `json` keeps an int (an integer past 64 bits).

    Args:
        data: One JSON document, as bytes.

    Returns:
        The decoded value, equal to what `json.loads` returns.

    Raises:
        ValueError: The bytes are not valid JSON or not valid text.
    """
    try:
        value = orjson.loads(data)
        if _read_exactly(value):
            return value
    except (orjson.JSONDecodeError, RecursionError):  # RecursionError: nested past ~490
        pass
    return json.loads(data)


_TWO_TO_63 = 2.0**63


def _read_exactly(value: Any) -> bool:
    """No float at or past 2**63 in magnitude anywhere in `value`: orjson turns an integer
    outside [-2**63, 2**64) into a float, which `json` reads as an exact int."""
    if type(value) is dict:
        values: Iterable[Any] = value.values()
    elif type(value) is list:
        values = value
    else:
        return type(value) is not float or -_TWO_TO_63 < value < _TWO_TO_63
    for v in values:  # a record's scalars checked here, without a call each
        kind = type(v)
        if kind is float:
            if not -_TWO_TO_63 < v < _TWO_TO_63:
                return False
        elif (kind is dict or kind is list) and not _read_exactly(v):
            return False
    return True


def read_json(path: Path, fix: str) -> Any:
    """A JSON file, decoded as `loads` decodes.

    Args:
        path, fix: The file, and what the user should do (ending the error message).

    Returns:
        The decoded value.

    Raises:
        DataError: The file cannot be read or is not valid JSON.
    """
    try:
        return loads(read_bytes(path, fix))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise DataError(f"{path}: not valid JSON ({exc}); {fix}") from None


def jsonl(path: Path, fix: str) -> Iterator[tuple[int, Any]]:
    """Stream (line number, value) for each non-blank line of a JSONL file.

    Args:
        path, fix: The file, and what the user should do (ending the error message).

    Returns:
        An iterator of (1-based line number, decoded value).

    Raises:
        DataError: A line is not valid JSON (the message names the line).
    """
    with path.open("rb") as file:
        for number, line in enumerate(file, start=1):
            if line.strip():
                try:
                    yield number, loads(line)
                except ValueError as exc:
                    raise DataError(f"{path}:{number}: not valid JSON ({exc}); {fix}") from None


# ------------------------------------------------------------------------ user files

_Rows = Iterator[tuple[int, str, Any]]
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".json": "json"}  # by extension


def read_records(path: Path, fmt: str) -> _Rows:
    """Stream (0-based index, "file:line" for messages, record) from a user's file.

    Args:
        path: A JSONL, CSV (UTF-8, BOM skipped) or JSON (list of objects) file.
        fmt: "jsonl", "csv" or "json".

    Returns:
        An iterator of (index, where, record): a CSV row is a dict of str, a JSON record any
        decoded value (checked by the caller).

    Raises:
        DataError: The file is not valid in that format.
    """
    if fmt == "csv":
        return _csv_rows(path)
    if fmt == "jsonl":
        return ((i, f"{path}:{n}", row) for i, (n, row) in enumerate(jsonl(path, "fix the line")))
    data = read_json(path, "fix the file")
    if not isinstance(data, list):
        raise DataError(f"{path}: top level is a {type(data).__name__}, expected a list "
                        "of objects; use JSONL or wrap the records in a list")
    return ((i, f"{path}: record {i}", row) for i, row in enumerate(data))


def _csv_rows(path: Path) -> _Rows:
    try:
        with path.open(encoding="utf-8-sig", newline="") as file:
            reader = csv.DictReader(file, strict=True)
            for index, row in enumerate(reader):
                yield index, f"{path}:{reader.line_num}", row
    except (csv.Error, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid UTF-8 CSV ({exc}); fix the file") from None


def number(value: Any) -> float:
    """A cell's or a field's value as a number: an int, a float or text of one (a CSV's cells are
    text); NaN for anything else, a bool included, so the caller's finiteness check names it.

    Returns:
        The number, possibly not finite.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return math.nan
    try:
        return float(value)
    except ValueError:
        return math.nan
