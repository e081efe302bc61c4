"""Copy a study's cache between backends, and to and from a JSONL archive to publish with a
paper, never overwriting an answer and never leaving half a copy.

An archive is one JSON object a line, `{"key": "<64 hex>", "record": {...}}` (the record as
the cache stores it, see runner/execute/store/cache.py), gzip-compressed when its name ends in
`.gz`.
Copies skip keys the destination has already (never overwriting an answer); an archive is read
and checked in full before the first record is stored, and written to a temporary file that is
renamed into place, so a bad line or a failure halfway leaves nothing half-done.
"""

from __future__ import annotations

import gzip
import itertools
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from runner.errors import DataError
from runner.execute.store.backend import CacheBackend

__all__ = ["TransferStats", "copy_cache", "is_archive", "load_archive", "write_archive"]

KEYS_PER_ROUND = 1000  # keys per round of has_many / get_many
_KEY = re.compile(r"^[0-9a-f]{64}$")
_FIELDS = ("request", "response", "source")


@dataclass(slots=True)
class TransferStats:
    """What a copy or an archive load did: every key is either copied or already there."""

    copied: int = 0
    """Keys stored in the destination."""
    already: int = 0
    """Keys the destination had already (left as they were)."""


def is_archive(location: str | Path) -> bool:
    """Whether a `--cache`-like location names a JSONL archive rather than a cache.

    Args:
        location: a path or URL.

    Returns:
        True for names ending in .jsonl or .jsonl.gz.
    """
    return str(location).endswith((".jsonl", ".jsonl.gz"))


def _open(path: Path, mode: str, gz: bool) -> IO[bytes]:
    if gz:
        return gzip.open(path, mode + "b")  # type: ignore[return-value]
    return path.open(mode + "b")


def _store(pairs: Iterator[tuple[str, dict[str, Any]]], dst: CacheBackend,
           progress: Callable[[int], None]) -> TransferStats:
    stats = TransferStats()
    while batch := list(itertools.islice(pairs, KEYS_PER_ROUND)):
        there = dst.has_many([k for k, _ in batch])
        fresh = [(key, record) for key, record in batch if key not in there]
        dst.put_many(fresh)  # one transaction per chunk, not one per record
        stats.copied += len(fresh)
        stats.already += len(batch) - len(fresh)
        progress(len(batch))
    return stats


def _records(src: CacheBackend) -> Iterator[tuple[str, dict[str, Any]]]:
    keys = src.keys()
    while batch := list(itertools.islice(keys, KEYS_PER_ROUND)):
        records = src.get_many(batch)
        yield from ((k, records[k]) for k in batch if k in records)


def copy_cache(src: CacheBackend, dst: CacheBackend,
               progress: Callable[[int], None] = lambda n: None) -> TransferStats:
    """Copy every record of one cache into another, except keys the other has.

    Args:
        src: the cache copied from.
        dst: the cache copied into.
        progress: called with the number of keys done after each batch of KEYS_PER_ROUND.

    Returns:
        How many records were copied and how many keys `dst` had already.
    """
    return _store(_records(src), dst, progress)


def write_archive(src: CacheBackend, path: Path,
                  progress: Callable[[int], None] = lambda n: None) -> int:
    """Write every record of a cache to a JSONL archive, through a temporary file renamed into
    place.

    Args:
        src: the cache.
        path: the archive; gzip-compressed when its name ends in .gz.
        progress: called with the number of keys done after each batch of KEYS_PER_ROUND.

    Returns:
        The number of records written.

    Raises:
        DataError: the archive cannot be written (nothing is left at `path`).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    written = 0
    try:
        with _open(tmp, "w", gz=path.name.endswith(".gz")) as out:
            for key, record in _records(src):
                out.write(orjson.dumps({"key": key, "record": record}) + b"\n")
                written += 1
                if written % KEYS_PER_ROUND == 0:
                    progress(KEYS_PER_ROUND)
        os.replace(tmp, path)
    except OSError as exc:
        raise DataError(f"{path}: cannot write the archive ({exc}); check the folder and "
                        "free disk space") from None
    finally:
        tmp.unlink(missing_ok=True)
    return written


def _parsed(path: Path, number: int, line: bytes) -> tuple[str, dict[str, Any]]:
    where = f"{path}:{number}"
    try:
        row = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DataError(f"{where}: not JSON ({exc}); an archive has one "
                        '{"key": ..., "record": {...}} object a line') from None
    if not isinstance(row, dict) or not isinstance(row.get("key"), str) \
            or not _KEY.match(row["key"]):
        raise DataError(f'{where}: "key" must be a cache key (64 lowercase hex digits)')
    record = row.get("record")
    if not isinstance(record, dict) or any(f not in record for f in _FIELDS):
        raise DataError(f'{where}: "record" must be an object with '
                        f"{', '.join(_FIELDS)} (as `judge cache export` writes it)")
    return row["key"], record


def _read_archive(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(key, record) of each non-blank line of an archive, each line checked as it is read."""
    try:
        with _open(path, "r", gz=path.name.endswith(".gz")) as lines:
            for number, line in enumerate(lines, 1):
                if line.strip():
                    yield _parsed(path, number, line)
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot read the archive ({exc}); check the path") from None


def load_archive(path: Path, dst: CacheBackend,
                 progress: Callable[[int], None] = lambda n: None) -> TransferStats:
    """Store an archive's records in a cache, after checking every line first: a bad line
    stores nothing.

    Args:
        path: the archive.
        dst: the cache; keys it has already are left alone.
        progress: called with the number of keys done after each batch of KEYS_PER_ROUND.

    Returns:
        How many records were stored and how many keys `dst` had already.

    Raises:
        DataError: before anything is stored: the file cannot be read, or a line is not a
            {"key", "record"} object with a cache key and a whole record (it names the file
            and line).
    """
    for _ in _read_archive(path):
        pass
    return _store(_read_archive(path), dst, progress)
