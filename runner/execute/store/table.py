"""The answers' table in a cache folder's SQLite file, read and written in batches through
this process's own connection: diskcache's `Cache` table, whose layout is spelled out here
(`COLUMNS`, `KEY_INDEX`) and checked when a folder is opened, never assumed.

Why not diskcache's Python API alone: it reads and writes one key a call. Its `set` (a SELECT,
an INSERT or UPDATE and Python around them) cost ~4x this module's upsert of 500 rows a
statement (248 against 61 us an answer, an ad-hoc microbenchmark of 20,000 records, load
~9), and its `get` and `in` ~2x a batched `IN (...)` query; the pool stores every answer and a
rescore reads every one. Why not its private attributes (its connection and query helper): a
diskcache release may change them without notice; it cannot change the layout of a file its
older releases wrote without a migration, which `matches` would see.

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

from runner.execute.store.faults import transaction

__all__ = ["CHUNK", "chunks", "connect", "matches", "read", "stored_keys", "write"]

CHUNK = 500  # keys a query: under SQLite's 999-parameter limit on old builds
# The columns of diskcache's `Cache` table (diskcache 5), in order, and its unique index, which
# the upsert's ON CONFLICT names.
COLUMNS = ("rowid", "key", "raw", "store_time", "expire_time", "access_time", "access_count",
           "tag", "size", "mode", "filename", "value")
KEY_INDEX = ("key", "raw")

# A record stored as diskcache.Cache.set stores a str key and a small bytes value: raw key
# (raw = 1), no expiry, no tag, size 0, MODE_RAW (1), the bytes inline; replacing keeps the
# row. diskcache's triggers on the table keep its entry count and volume.
_UPSERT = ("INSERT INTO Cache(key, raw, store_time, expire_time, access_time, access_count, "
           "tag, size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, 0, 1, NULL, ?) "
           "ON CONFLICT(key, raw) DO UPDATE SET store_time = excluded.store_time, "
           "expire_time = NULL, access_time = excluded.access_time, tag = NULL, size = 0, "
           "mode = 1, filename = NULL, value = excluded.value")


def connect(path: str) -> sqlite3.Connection:
    """This process's own connection to the folder's database `path` (made by diskcache
    first): autocommit, transactions begun explicitly, a 60 s wait for another writer's lock
    (diskcache's), and no fsync (as Cache's diskcache: store/cache.py says why)."""
    db = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
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


def _rows(db: sqlite3.Connection, columns: str, keys: Sequence[str], where: str = ""
          ) -> Iterator[Any]:
    """`columns` of the rows of the keys among `keys` that have one, one query per CHUNK."""
    for chunk in chunks(keys):
        yield from db.execute(f"SELECT {columns} FROM Cache WHERE raw = 1{where} AND key IN "
                              f"({','.join('?' * len(chunk))})", chunk)


def stored_keys(db: sqlite3.Connection, keys: Sequence[str]) -> set[str]:
    """The keys among `keys` that have a row."""
    return {row[0] for row in _rows(db, "key", keys)}


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
    for key, mode, filename, value in _rows(db, "key, mode, filename, value", keys):
        # An inline record is the bytes themselves; a large one kept as a file is read
        # through diskcache's get.
        if mode == MODE_RAW and filename is None and value is not None:
            out[key] = value
        elif (raw := store.get(key)) is not None:
            out[key] = raw
    return out


def write(db: sqlite3.Connection | None, store: Any, chunk: Sequence[tuple[str, bytes]]) -> None:
    """Store `chunk` in one transaction, as diskcache's `set` would store each record inline;
    a record too large to be kept in its row, every record of its key, and every key whose
    record is a file (replacing it must remove the file, which only `set` does) go through
    diskcache's `set` after it, in order, so a later record of a key still wins.

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
    with transaction(db):
        filed = {row[0] for row in _rows(db, "key", [k for k, _ in chunk],
                                         " AND filename IS NOT NULL")}
        by_set = filed | {k for k, raw in chunk if len(raw) >= limit}
        db.executemany(_UPSERT, [(k, now, now, raw) for k, raw in chunk if k not in by_set])
    for key, raw in chunk:
        if key in by_set:
            store.set(key, raw)
