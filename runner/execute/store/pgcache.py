"""The response cache in one PostgreSQL table, shared by every machine of a study.

SQLite over NFS is unsafe, so many machines (SLURM arrays, Kubernetes indexed Jobs, CI, several
people) share answers through a real database instead. Same keys and records as the diskcache
backend (runner/execute/store/cache.py); the table:

    judge_cache (key text PRIMARY KEY, record bytea, source text, created timestamptz)
    judge_cache_meta (name text PRIMARY KEY, value text)   -- schema_version = SCHEMA_VERSION

`record` is the orjson bytes of the record, as diskcache stores them: bytea, not JSONB, because
JSONB rejects the NUL character a model may well emit, rewrites the text on the way in and costs
a parse on every read; `source` ("api", "import:<where>") is a column of its own to query by.

Inserts are `ON CONFLICT DO NOTHING`: two workers that answer the same key never corrupt
anything, and the first stored answer wins (a put never replaces a record, unlike diskcache's).
psycopg 3 in autocommit mode, synchronous: `put` stays a plain call, so the pool keeps no `await`
between receiving an answer and storing it. The schema is created on first use under an
advisory lock (many shards start at once) and its version is checked on every open.

A server that goes away (restarted, frozen, a dead network path) is waited for, within
deadlines, by the PgSession under it (runner/execute/store/pgsession.py).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, LiteralString, TypeVar

import orjson

from runner.errors import CacheError
from runner.execute.store.claimtable import PG_SCHEMA, Owner, pg_claim, pg_release, pg_renew
from runner.execute.store.deadline import rest_all
from runner.execute.store.journal import Row, recover, spill
from runner.execute.store.pglease import LeasedSession

__all__ = ["NOWHERE", "SCHEMA_VERSION", "PgCache"]

SCHEMA_VERSION = 1
CHUNK = 2000  # keys per query: one round trip per chunk, where `in` would make one per key
LOCK_ID = 0x6A75646765  # "judge": the advisory lock the schema is created under
NOWHERE = bytes(6)  # the place of no row: ctid (0,0) (a row's offset starts at 1)
SEP = "\x1f"  # the unit separator, between the keys of a query: a cache key is a hex digest

R = TypeVar("R")

SCHEMA: tuple[LiteralString, ...] = (
    "CREATE TABLE IF NOT EXISTS judge_cache_meta (name text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE IF NOT EXISTS judge_cache (key text PRIMARY KEY, record bytea NOT NULL, "
    "source text NOT NULL, created timestamptz NOT NULL DEFAULT now())",
    "INSERT INTO judge_cache_meta VALUES ('schema_version', '1') ON CONFLICT DO NOTHING",
    "CREATE TABLE IF NOT EXISTS judge_lease (id integer PRIMARY KEY, name text NOT NULL, "
    "holder text NOT NULL, since timestamptz NOT NULL DEFAULT now())",
    *PG_SCHEMA,
)


def _any_of(keys: Sequence[str]) -> tuple[LiteralString, tuple[Any, ...]]:
    """`ANY(...)` of the keys of a query, and its parameters: the keys joined into one text
    that the server splits. psycopg dumps a list to an array key by key in Python: a read of
    2,000 records took ~4.1 us of this process's CPU a key with the list and ~1.2 us with the
    text (alternated rounds of 200k keys on a 10M-row cache, the server's CPU the same: ~10 us
    a key), ~29 s of the ~450 CPU-seconds a 10M rescore takes. A key that holds the separator
    (or is empty) goes as a list."""
    joined = SEP.join(keys)
    if joined.count(SEP) == len(keys) - 1 and all(keys):
        return "ANY(string_to_array(%s, %s))", (joined, SEP)
    return "ANY(%s)", (list(keys),)


class PgCache(LeasedSession, contextlib.AbstractContextManager["PgCache"]):
    """Response records by cache key, in PostgreSQL (on a PgSession: its deadlines and
    reconnects; and a LeasedSession: the run's lease)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._owner: tuple[Owner, float] | None = None  # the run claiming keys here, its TTL
        try:
            self._ensure_schema()
            # answers an earlier run kept while this database was away (`keep`), stored now
            recover(self._spilled, self._insert_rows)
        except BaseException:
            self.close()
            raise

    def _ensure_schema(self) -> None:
        def create() -> tuple[Any, ...] | None:
            with self._conn.transaction():
                self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_ID,))
                for statement in SCHEMA:
                    self._conn.execute(statement)
                return self._conn.execute("SELECT value FROM judge_cache_meta "
                                          "WHERE name = 'schema_version'").fetchone()

        row = self._call("creating the cache tables", create)
        found = row[0] if row else None
        if found != str(SCHEMA_VERSION):
            raise CacheError(f"{self.location}: cache schema version {found}, this judge-runner "
                             f"reads version {SCHEMA_VERSION}; upgrade judge-runner or use "
                             "another database")

    def _restore(self) -> None:
        """On a new connection: this cache's leases taken again, and the claims' owner in its
        new session at once (its old one reads as a dead run's)."""
        super()._restore()
        if self._owner is not None:
            pg_renew(self._conn, *self._owner)

    def __contains__(self, key: str) -> bool:
        return bool(self._rows("a lookup", "SELECT 1 FROM judge_cache WHERE key = %s", (key,)))

    def get(self, key: str) -> dict[str, Any] | None:
        """`CacheBackend.get`."""
        rows = self._rows("a read", "SELECT record FROM judge_cache WHERE key = %s", (key,))
        return orjson.loads(rows[0][0]) if rows else None

    def has_many(self, keys: Sequence[str]) -> set[str]:
        """`CacheBackend.has_many`, CHUNK keys a query."""
        return {row[0] for row in self._by_key("a lookup", "key", keys)}

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """`CacheBackend.get_many`, CHUNK keys a query."""
        return {k: orjson.loads(record) for k, record in self._by_key("a read", "key, record",
                                                                      keys)}

    def get_many_raw(self, keys: Sequence[str]) -> dict[str, bytes]:
        """`Rereadable.get_many_raw` (store/reader.py): get_many's records, not decoded."""
        return dict(self._by_key("a read", "key, record", keys))

    def get_many_raw_located(self, keys: Sequence[str]) -> tuple[dict[str, bytes],
                                                                  dict[str, bytes]]:
        """get_many_raw, and where the table holds each stored key's row: what a located key
        index keeps (get_many_raw_at).

        Returns:
            The records, and their rows' places (ctid, TID bytes), by key.
        """
        rows = list(self._by_key("a read", "key, record, ctid", keys))
        return {key: record for key, record, _ in rows}, {key: place for key, _, place in rows}

    def _by_key(self, what: str, columns: LiteralString, keys: Sequence[str]
                ) -> Iterator[tuple[Any, ...]]:
        """`columns` of the rows of the stored keys among `keys`: one query per CHUNK keys
        (their keys as _any_of sends them)."""
        for start in range(0, len(keys), CHUNK):
            any_of, param = _any_of(keys[start:start + CHUNK])
            yield from self._rows(what, "SELECT " + columns + " FROM judge_cache WHERE key = "
                                  + any_of, param)

    def get_many_raw_at(self, keys: Sequence[str], places: Sequence[bytes]
                        ) -> tuple[dict[str, bytes], int]:
        """get_many_raw, reading each key's row at the place given (ctid, TID bytes, from
        get_many_raw_located; NOWHERE for none) rather than through the key's index.

        A place names a row, not a key: a row found there counts only for the key it holds,
        and every key not found so (a row moved or deleted since, or not stored then) is read
        by its key. A rewritten table (VACUUM FULL, CLUSTER, a restore) has other indexes
        (`index_folder`), so such places are never asked for.

        What it buys: the server's CPU a key, read in task order from a 10M-row table, fell
        from 7.6-8.1 us by key to 0.7-1.2 us by place (alternated rounds of 200k keys); as a
        whole process, runner/expand_ahead.py's docstring.

        Returns:
            The records by key, and how many were not at their place (read by key).
        """
        out: dict[str, bytes] = {}
        for start in range(0, len(keys), CHUNK):
            at = [p for p in places[start:start + CHUNK] if p != NOWHERE]
            if not at:
                continue
            wanted = set(keys[start:start + CHUNK])
            text = " ".join([f"({block},{row})" for block, row
                             in struct.iter_unpack(">IH", b"".join(at))])
            out.update((key, record) for key, record in self._rows(
                "a read", "SELECT key, record FROM judge_cache WHERE "
                "ctid = ANY(string_to_array(%s, ' ')::tid[])", (text,)) if key in wanted)
        placed = len(out)
        if placed < len(keys) and (unread := [k for k in keys if k not in out]):
            out.update(self.get_many_raw(unread))
        return out, len(out) - placed

    def index_folder(self) -> Path:
        """Where this machine keeps the located key indexes of jobs read from this table:
        ~/.cache/judge-runner/postgresql/ (or under $XDG_CACHE_HOME), in a folder named for
        the server (its system identifier, where the user may read it; else the URL without
        its password), the database and the table's file, which a rewrite of the table
        changes. Deleting it only costs the next read its speed."""
        server, database, table = self._rows(
            "naming the table", "SELECT CASE WHEN has_function_privilege("
            "'pg_control_system()', 'execute') THEN (SELECT system_identifier::text FROM "
            "pg_control_system()) END, (SELECT oid FROM pg_database WHERE datname = "
            "current_database()), pg_relation_filenode('judge_cache')", ())[0]
        server = server or hashlib.sha256(self.location.encode()).hexdigest()[:16]
        home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        return Path(home) / "judge-runner" / "postgresql" / f"{server}-{database}-{table}"

    def reopened(self) -> PgCache:
        """Another PgCache of the same database, on a connection of its own (a forked
        reader's: runner.expand_ahead)."""
        return PgCache(self._url)

    def rest(self) -> None:
        """End the watchdog threads of this process's caches (this one's, and a run's lease
        cache's) until their next call: before a fork."""
        rest_all()

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        """`CacheBackend.put`, unless the key has one already (the first answer wins)."""
        row = (key, orjson.dumps(record), str(record.get("source", "")))
        self._call(f"storing {key}", lambda: self._conn.execute(
            "INSERT INTO judge_cache (key, record, source) VALUES (%s, %s, %s) "
            "ON CONFLICT (key) DO NOTHING", row))

    def put_many(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        """`CacheBackend.put_many`, CHUNK per INSERT (one statement, so one transaction, in
        autocommit mode) unless a key has one already: the first answer wins, also between
        duplicates within one call."""
        return self._insert((key, orjson.dumps(record), str(record.get("source", "")))
                            for key, record in items)

    def _insert(self, rows: Iterable[tuple[str, bytes, str]], what: str = "answers") -> int:
        """Store (key, record bytes, source) rows, CHUNK per INSERT; the rows given."""
        stream, given = iter(rows), 0
        while chunk := list(itertools.islice(stream, CHUNK)):
            columns = ([k for k, _, _ in chunk], [raw for _, raw, _ in chunk],
                       [source for _, _, source in chunk])
            self._call(f"storing {len(chunk)} {what}", functools.partial(
                self._insert_many, columns))
            given += len(chunk)
        return given

    def keep(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> Path:
        """`CacheBackend.keep`: in a spill file on this machine (journal.spill), which the
        next open of this database stores. Without it a run stopped by an outage lost the
        answers it held and the rerun bought them again (7-8 of them after a 60 s outage)."""
        return spill(self._spilled, [(key, orjson.dumps(record)) for key, record in items])

    def _insert_rows(self, rows: list[Row]) -> None:
        """Store spilled rows (key, record bytes) as they were kept (their bytes)."""
        self._insert(((key, raw, str(orjson.loads(raw).get("source", ""))) for key, raw in rows),
                     "kept answers")

    def append(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        """`CacheBackend.append`: put_many, each statement committed when it returns (the
        server is the journal); CacheAwayError while the server is away, even for no items
        (the pool's look whether it is back)."""
        self._not_away()
        return self.put_many(items)

    def fold(self) -> None:
        """Nothing waits: `append` commits at once."""

    def _insert_many(self, columns: tuple[list[str], list[bytes], list[str]]) -> None:
        # unnest keeps the given order, so ON CONFLICT DO NOTHING keeps the first of two
        # records of one key within a chunk too.
        self._conn.execute("INSERT INTO judge_cache (key, record, source) SELECT * FROM "
                           "unnest(%s::text[], %s::bytea[], %s::text[]) "
                           "ON CONFLICT (key) DO NOTHING", columns)

    def keys(self) -> Iterator[str]:
        """Every key in key order, CHUNK a query (keyset paging: no long transaction)."""
        last = ""
        while rows := self._rows("listing keys", "SELECT key FROM judge_cache WHERE key > %s "
                                 "ORDER BY key LIMIT %s", (last, CHUNK)):
            yield from (row[0] for row in rows)
            last = rows[-1][0]

    def stats(self) -> dict[str, int]:
        """Entries and bytes the table takes (with its index)."""
        rows = self._rows("counting", "SELECT count(*), pg_total_relation_size('judge_cache') "
                          "FROM judge_cache", ())
        return {"entries": int(rows[0][0]), "bytes": int(rows[0][1])}

    def claim(self, keys: Sequence[str], owner: Owner, ttl_s: float) -> set[str]:
        """`CacheBackend.claim` (store/claimtable.py)."""
        self._owner = owner, ttl_s
        return self._call("claiming keys", lambda: pg_claim(self._conn, keys, owner, ttl_s))

    def renew_claims(self, owner: Owner, ttl_s: float) -> None:
        """`CacheBackend.renew_claims`."""
        self._owner = owner, ttl_s
        self._call("renewing claims", lambda: pg_renew(self._conn, owner, ttl_s))

    def release_claims(self, owner: Owner, keys: Sequence[str], *, last: bool = False) -> None:
        """`CacheBackend.release_claims`."""
        self._call("releasing claims", lambda: pg_release(self._conn, owner, keys, last=last))

    def __exit__(self, *exc: object) -> None:
        self.close()
