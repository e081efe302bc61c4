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
advisory lock (many shards start at once) and its version is checked on every open. A
connection the server drops (restart, failover, idle timeout) is opened again once per call.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, LiteralString, TypeVar

import orjson
import psycopg
from psycopg import conninfo

from runner.errors import CacheError

__all__ = ["SCHEMA_VERSION", "PgCache", "redact"]

SCHEMA_VERSION = 1
CHUNK = 2000  # keys per query: one round trip per chunk, where `in` would make one per key
CONNECT_TIMEOUT_S = 10
LOCK_ID = 0x6A75646765  # "judge": the advisory lock the schema is created under

R = TypeVar("R")

SCHEMA: tuple[LiteralString, ...] = (
    "CREATE TABLE IF NOT EXISTS judge_cache_meta (name text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE IF NOT EXISTS judge_cache (key text PRIMARY KEY, record bytea NOT NULL, "
    "source text NOT NULL, created timestamptz NOT NULL DEFAULT now())",
    "INSERT INTO judge_cache_meta VALUES ('schema_version', '1') ON CONFLICT DO NOTHING",
)


def redact(url: str) -> str:
    """The URL without its password, for messages and the manifest."""
    try:
        parts = conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://<unparsable URL>"
    user = f"{parts['user']}@" if parts.get("user") else ""
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{parts.get('host', '')}{port}/{parts.get('dbname', '')}"


class PgCache:
    """Response records by cache key, in PostgreSQL."""

    def __init__(self, url: str) -> None:
        self.location = redact(url)
        try:
            self._password = str(conninfo.conninfo_to_dict(url).get("password") or "")
        except psycopg.ProgrammingError:
            raise CacheError("--cache / JUDGE_CACHE_URL is not a valid PostgreSQL URL; write it "
                             "as postgresql://USER@HOST:PORT/DBNAME") from None
        self._url = url
        self._conn = self._connect()
        try:
            self._ensure_schema()
        except BaseException:
            self._conn.close()
            raise

    def _connect(self) -> psycopg.Connection[tuple[Any, ...]]:
        try:
            return psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise CacheError(f"{self.location}: cannot connect to the cache ({self._clean(exc)}); "
                             "check --cache / JUDGE_CACHE_URL and that the server is up") from None

    def _call(self, what: str, call: Callable[[], R]) -> R:
        """`call()`; once more on a new connection if the server dropped this one (a restart,
        a failover, an idle timeout): every statement here is a read or an idempotent insert,
        so running it twice is safe. Any other failure is a CacheError."""
        try:
            return call()
        except psycopg.OperationalError as exc:
            if not self._conn.broken:
                raise self._fail(what, exc) from None
        except psycopg.Error as exc:
            raise self._fail(what, exc) from None
        self._conn.close()
        self._conn = self._connect()
        try:
            return call()
        except psycopg.Error as exc:
            raise self._fail(what, exc) from None

    def _clean(self, exc: Exception) -> str:
        text = " ".join(str(exc).split())
        return text.replace(self._password, "***") if self._password else text

    def _fail(self, what: str, exc: Exception) -> CacheError:
        return CacheError(f"{self.location}: {what} failed ({self._clean(exc)}); check the "
                          "server, then rerun to resume")

    def _ensure_schema(self) -> None:
        try:
            with self._conn.transaction():
                self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_ID,))
                for statement in SCHEMA:
                    self._conn.execute(statement)
                row = self._conn.execute("SELECT value FROM judge_cache_meta "
                                         "WHERE name = 'schema_version'").fetchone()
        except psycopg.Error as exc:
            raise self._fail("creating the cache tables", exc) from None
        found = row[0] if row else None
        if found != str(SCHEMA_VERSION):
            raise CacheError(f"{self.location}: cache schema version {found}, this judge-runner "
                             f"reads version {SCHEMA_VERSION}; upgrade judge-runner or use "
                             "another database")

    def _rows(self, what: str, sql: LiteralString, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        def rows() -> list[tuple[Any, ...]]:
            with self._conn.cursor(binary=True) as cur:
                return cur.execute(sql, params).fetchall()

        return self._call(what, rows)

    def __contains__(self, key: str) -> bool:
        return bool(self._rows("a lookup", "SELECT 1 FROM judge_cache WHERE key = %s", (key,)))

    def get(self, key: str) -> dict[str, Any] | None:
        """The record stored under `key`, or None."""
        rows = self._rows("a read", "SELECT record FROM judge_cache WHERE key = %s", (key,))
        return orjson.loads(rows[0][0]) if rows else None

    def has_many(self, keys: Sequence[str]) -> set[str]:
        """The keys among `keys` that are stored: one query per CHUNK keys."""
        found: set[str] = set()
        for start in range(0, len(keys), CHUNK):
            chunk = list(keys[start:start + CHUNK])
            found.update(row[0] for row in self._rows(
                "a lookup", "SELECT key FROM judge_cache WHERE key = ANY(%s)", (chunk,)))
        return found

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Records of the stored keys among `keys`, CHUNK keys a query."""
        out: dict[str, dict[str, Any]] = {}
        for start in range(0, len(keys), CHUNK):
            chunk = list(keys[start:start + CHUNK])
            for k, record in self._rows("a read", "SELECT key, record FROM judge_cache "
                                        "WHERE key = ANY(%s)", (chunk,)):
                out[k] = orjson.loads(record)
        return out

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        """Store a record unless the key has one already (the first answer wins)."""
        row = (key, orjson.dumps(record), str(record.get("source", "")))
        self._call(f"storing {key}", lambda: self._conn.execute(
            "INSERT INTO judge_cache (key, record, source) VALUES (%s, %s, %s) "
            "ON CONFLICT (key) DO NOTHING", row))

    def put_many(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        """Store many records, CHUNK per INSERT (one statement, so one transaction, in
        autocommit mode) unless a key has one already: the first answer wins, also between
        duplicates within one call. Returns the number given. Each committed chunk is durable:
        a kill -9 mid-way loses at most the chunk being written, and a rerun stores it."""
        stream, given = iter(items), 0
        while chunk := list(itertools.islice(stream, CHUNK)):
            columns = ([k for k, _ in chunk], [orjson.dumps(r) for _, r in chunk],
                       [str(r.get("source", "")) for _, r in chunk])
            self._call(f"storing {len(chunk)} answers", functools.partial(
                self._insert_many, columns))
            given += len(chunk)
        return given

    def append(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        """put_many: each statement is committed when it returns (the server is the journal)."""
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

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> PgCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
