"""The answers' table in a cache folder's SQLite file, read and written in batches through
this process's own connection: diskcache's `Cache` table, whose layout is spelled out here
(`COLUMNS`, `KEY_INDEX`) and checked when a folder is opened, never assumed.

Why not diskcache's Python API alone: it reads and writes one key a call. Its `set` (a SELECT,
an INSERT or UPDATE and Python around them) cost ~4x this module's upsert of 500 rows a
statement (248 against 61 us an answer, an ad-hoc microbenchmark of 20,000 records, load
~9), and its `get` and `in` ~2x a batched `IN (...)` query; the pool stores every answer and a
rescore reads every one. Why not its private attributes (its connection and query helper,
which this code used until 2026-11): a diskcache release may change them without notice;
it cannot change the layout of a file its older releases wrote without a migration, which
`matches` would see.

A folder whose table does not match (a diskcache that lays it out otherwise) is read and
written through diskcache's public API instead (`Cache.get`, `in`, `Cache.transact` + `set`):
the same answers, slower. Records too large to be kept in the row (diskcache's
`disk.min_file_size`, 32 KiB by default: it keeps them as files) always go through it.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from typing import Any

from diskcache.core import MODE_RAW

__all__ = ["CHUNK", "COLUMNS", "KEY_INDEX", "Stored", "chunks", "connect", "filed", "matches",
           "read", "stored_keys", "stored_rows", "upsert", "write"]

CHUNK = 500  # keys a query: under SQLite's 999-parameter limit on old builds
COLUMNS = ("rowid", "key", "raw", "store_time", "expire_time", "access_time", "access_count",
           "tag", "size", "mode", "filename", "value")
"""The columns of diskcache's `Cache` table (diskcache 5), in order."""
KEY_INDEX = ("key", "raw")
"""Its unique index, which the upsert's ON CONFLICT names."""

# A record stored as diskcache.Cache.set stores a str key and a small bytes value: raw key
# (raw = 1), no expiry, no tag, size 0, MODE_RAW (1), the bytes inline; replacing keeps the
# row. diskcache's triggers on the table keep its entry count and volume.
_UPSERT = ("INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, "
           "tag, size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, 0, 1, NULL, ?) "
           "ON CONFLICT(key, raw) DO UPDATE SET store_time = excluded.store_time, "
           "expire_time = NULL, access_time = excluded.access_time, tag = NULL, size = 0, "
           "mode = 1, filename = NULL, value = excluded.value")

Stored = tuple[str, int, str | None, bytes | None]
"""A row as `stored_rows` reads it: key, mode, filename (a record kept as a file), value."""


def connect(path: str, *, synchronous_off: bool) -> sqlite3.Connection:
    """This process's own connection to the folder's database `path` (made by diskcache
    first): autocommit, transactions begun explicitly, a 60 s wait for another writer's lock
    (diskcache's), and with `synchronous_off` no fsync (Cache's: a kill -9 loses nothing,
    only an OS crash can lose the last answers)."""
    db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
    if synchronous_off:
        db.execute("PRAGMA synchronous = OFF")
    return db


def matches(db: sqlite3.Connection) -> bool:
    """Whether the database's `Cache` table is laid out as this module reads and writes it:
    exactly COLUMNS, a unique index on KEY_INDEX, and diskcache's MODE_RAW the 1 the upsert
    writes."""
    columns = tuple(row[1] for row in db.execute("PRAGMA table_info(Cache)"))
    if columns != COLUMNS or MODE_RAW != 1:
        return False
    for _, name, unique, *_ in db.execute("PRAGMA index_list(Cache)"):
        if unique and tuple(r[2] for r in db.execute(f"PRAGMA index_info({name!r})")) == \
                KEY_INDEX:
            return True
    return False


def chunks(keys: Sequence[str]) -> Iterator[Sequence[str]]:
    """`keys` CHUNK at a time."""
    for start in range(0, len(keys), CHUNK):
        yield keys[start:start + CHUNK]


def _marks(chunk: Sequence[str]) -> str:
    return ",".join("?" * len(chunk))


def stored_keys(db: sqlite3.Connection, keys: Sequence[str]) -> set[str]:
    """The keys among `keys` that have a row, one query per CHUNK."""
    found: set[str] = set()
    for chunk in chunks(keys):
        found.update(row[0] for row in db.execute(
            f"SELECT key FROM Cache WHERE raw = 1 AND key IN ({_marks(chunk)})", chunk))
    return found


def stored_rows(db: sqlite3.Connection, keys: Sequence[str]) -> Iterator[Stored]:
    """The rows of the keys among `keys` that have one (see Stored), one query per CHUNK. A
    row whose mode is MODE_RAW and filename None holds the record's bytes in `value`."""
    for chunk in chunks(keys):
        yield from db.execute("SELECT key, mode, filename, value FROM Cache WHERE raw = 1 AND "
                              f"key IN ({_marks(chunk)})", chunk)


def upsert(db: sqlite3.Connection, rows: Sequence[tuple[str, float, bytes]]) -> None:
    """Store (key, time, record bytes) rows as diskcache's `set` would store them inline,
    replacing a key's row, in the caller's transaction. Only for records under diskcache's
    min_file_size whose key has no row kept as a file (`filed`)."""
    db.executemany(_UPSERT, [(key, now, now, raw) for key, now, raw in rows])


def filed(db: sqlite3.Connection, keys: Sequence[str]) -> set[str]:
    """The keys among `keys` whose record is kept as a file (diskcache's for a large one):
    replacing it must remove the file, which only diskcache's `set` does."""
    found: set[str] = set()
    for chunk in chunks(keys):
        found.update(row[0] for row in db.execute(
            "SELECT key FROM Cache WHERE raw = 1 AND filename IS NOT NULL AND key IN "
            f"({_marks(chunk)})", chunk))
    return found


def read(db: sqlite3.Connection | None, store: Any, keys: Sequence[str]) -> dict[str, bytes]:
    """The stored records of `keys`, as the bytes stored.

    Args:
        db: This process's connection to a folder whose table matches; None: read every key
            through diskcache's public API.
        store: The folder's `diskcache.Cache` (or its read-only stand-in).
        keys: The keys to look up.

    Returns:
        Record bytes by key, for the keys that have one.
    """
    if db is None:
        return {key: raw for key in keys if (raw := store.get(key)) is not None}
    out: dict[str, bytes] = {}
    for key, mode, filename, value in stored_rows(db, keys):
        # An inline record is the bytes themselves; a large one kept as a file is read
        # through diskcache's get.
        if mode == MODE_RAW and filename is None and value is not None:
            out[key] = value
        elif (raw := store.get(key)) is not None:
            out[key] = raw
    return out


def write(db: sqlite3.Connection | None, store: Any, chunk: Sequence[tuple[str, bytes]]) -> None:
    """Store `chunk` in one transaction (`upsert`); a record too large to be kept in its row,
    every record of its key, and every key whose record is a file go through diskcache's
    `set` after it, in order, so a later record of a key still wins.

    Args:
        db: This process's connection to a folder whose table matches; None: every record
            through diskcache's `set`, in one diskcache transaction.
        store: The folder's `diskcache.Cache`.
        chunk: (key, record bytes) rows, a later row of a key replacing an earlier one.

    Raises:
        OSError: The disk refused a record kept as a file.
        sqlite3.Error: SQLite refused the transaction (it is rolled back).
    """
    if db is None:
        with store.transact():
            for key, raw in chunk:
                store.set(key, raw)
        return
    limit, now = store.disk.min_file_size, time.time()
    db.execute("BEGIN IMMEDIATE")
    try:
        by_set = filed(db, [key for key, _ in chunk]) | {k for k, raw in chunk if len(raw) >= limit}
        upsert(db, [(k, now, raw) for k, raw in chunk if k not in by_set])
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    for key, raw in chunk:
        if key in by_set:
            store.set(key, raw)
