"""The batch ledger of a PostgreSQL cache, in two tables of the cache's own database: the rows
and invariant of the SQLite ledger (runner.execute.ledger), shared by every machine that shares
the cache.

A folder cache keeps its ledger in the folder (runner.execute.ledger.Ledger); a PostgreSQL cache
is shared by machines that share no folder, so its ledger is shared the same way: every shard of
a SLURM array, and `judge batches` run anywhere, see the same open batches and the keys they
hold. Same rows and invariant as the SQLite ledger:

    judge_batches (file_id text PRIMARY KEY, batch_id text UNIQUE, job, model, endpoint, state,
                   requests, completed, failed, created, updated, ingested boolean,
                   output_file, error_file)
    judge_batch_keys (file_id REFERENCES judge_batches, key, PRIMARY KEY (file_id, key))

The tables are created on first use like the answers table: `CREATE TABLE IF NOT EXISTS` under
the cache's advisory lock. Autocommit, so each write is durable when it returns; `reserve`
writes its row and keys in one transaction. Nothing secret is stored (no URL, no key), and
messages carry the URL without its password. Request files stay on the machine that wrote them
(`files`): OpenAI keeps a copy of each upload, which another machine reads to collect.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg import conninfo

from runner.errors import CacheError, redact_url
from runner.execute.ledger import COLUMNS, BatchRow
from runner.execute.store.pgcache import LOCK_ID
from runner.execute.store.pgsession import CONNECT_TIMEOUT_S

__all__ = ["SCHEMA", "PgLedger"]

_Result = TypeVar("_Result")

SCHEMA: tuple[LiteralString, ...] = (
    "CREATE TABLE IF NOT EXISTS judge_batches (file_id text PRIMARY KEY, batch_id text UNIQUE, "
    "job text NOT NULL, model text NOT NULL, endpoint text NOT NULL, state text NOT NULL, "
    "requests integer NOT NULL, completed integer NOT NULL DEFAULT 0, "
    "failed integer NOT NULL DEFAULT 0, created double precision NOT NULL, "
    "updated double precision NOT NULL, ingested boolean NOT NULL DEFAULT false, "
    "output_file text, error_file text)",
    "CREATE TABLE IF NOT EXISTS judge_batch_keys (file_id text NOT NULL REFERENCES "
    "judge_batches (file_id), key text NOT NULL, PRIMARY KEY (file_id, key))",
    "CREATE INDEX IF NOT EXISTS judge_batch_keys_key ON judge_batch_keys (key)",
)


class PgLedger(contextlib.AbstractContextManager["PgLedger"]):
    """The batches of one PostgreSQL cache; request files in `files` on this machine."""

    def __init__(self, url: str, files: Path) -> None:
        """Connect and create the tables if they are not there yet.

        Args:
            url: the PostgreSQL cache's URL (its password never reaches a message).
            files: the folder on this machine that keeps request files until ingested.

        Raises:
            CacheError: the server cannot be reached or the tables cannot be created.
        """
        self.location, self.files = redact_url(url), files
        try:
            self._password = str(conninfo.conninfo_to_dict(url).get("password") or "")
            self._conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise CacheError(f"{self.location}: cannot open the batch ledger "
                             f"({self._clean(exc)}); check --cache / JUDGE_CACHE_URL and that "
                             "the server is up") from None
        try:
            self._guarded("creating the batch ledger tables", self._create_tables)
        except BaseException:
            self._conn.close()
            raise

    def _create_tables(self) -> None:
        with self._conn.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_ID,))
            for statement in SCHEMA:
                self._conn.execute(statement)

    def _clean(self, exc: Exception) -> str:
        text = " ".join(str(exc).split())
        return text.replace(self._password, "***") if getattr(self, "_password", "") else text

    def _guarded(self, what: str, call: Callable[[], _Result]) -> _Result:
        """`call()`, a database error turned into a CacheError naming `what` failed."""
        try:
            return call()
        except psycopg.Error as exc:
            raise CacheError(f"{self.location}: {what} failed ({self._clean(exc)}); check the "
                             "server, then rerun to resume") from None

    def _write(self, what: str, sql: LiteralString, params: Sequence[Any]) -> None:
        self._guarded(what, lambda: self._conn.execute(sql, params))

    def _read(self, sql: LiteralString, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._guarded("reading the batch ledger",
                        lambda: self._conn.execute(sql, params).fetchall())

    def reserve(self, *, file_id: str, job: str, model: str, endpoint: str,
                keys: Sequence[str]) -> None:
        """`BatchLedger.reserve`: the row and its keys in one transaction."""
        now = time.time()

        def insert() -> None:
            with self._conn.transaction():
                self._conn.execute(
                    "INSERT INTO judge_batches (file_id, job, model, endpoint, state, requests, "
                    "created, updated) VALUES (%s, %s, %s, %s, 'submitting', %s, %s, %s)",
                    (file_id, job, model, endpoint, len(keys), now, now))
                self._conn.execute("INSERT INTO judge_batch_keys (file_id, key) SELECT %s, "
                                   "unnest(%s::text[]) ON CONFLICT DO NOTHING",
                                   (file_id, list(keys)))

        self._guarded(f"recording batch file {file_id}", insert)

    def attach(self, file_id: str, batch_id: str, state: str) -> None:
        """`BatchLedger.attach`."""
        self._write(f"recording batch {batch_id}", "UPDATE judge_batches SET batch_id = %s, "
                    "state = %s, updated = %s WHERE file_id = %s",
                    (batch_id, state, time.time(), file_id))

    def update(self, file_id: str, *, state: str, completed: int = 0, failed: int = 0,
               output_file: str | None = None, error_file: str | None = None) -> None:
        """`BatchLedger.update`."""
        self._write(f"updating batch file {file_id}",
                    "UPDATE judge_batches SET state = %s, completed = %s, failed = %s, "
                    "output_file = %s, error_file = %s, updated = %s WHERE file_id = %s",
                    (state, completed, failed, output_file, error_file, time.time(), file_id))

    def mark_ingested(self, file_id: str) -> None:
        """`BatchLedger.mark_ingested`."""
        self._write(f"updating batch file {file_id}", "UPDATE judge_batches SET ingested = true, "
                    "updated = %s WHERE file_id = %s", (time.time(), file_id))

    def rows(self, job: str | None = None) -> list[BatchRow]:
        """`BatchLedger.rows`."""
        if job is None:
            got = self._read(f"SELECT {COLUMNS} FROM judge_batches ORDER BY created")
        else:
            got = self._read(f"SELECT {COLUMNS} FROM judge_batches WHERE job = %s "
                             "ORDER BY created", (job,))
        return [BatchRow.of(r) for r in got]

    def pending(self) -> list[BatchRow]:
        """`BatchLedger.pending`."""
        return [BatchRow.of(r) for r in self._read(
            f"SELECT {COLUMNS} FROM judge_batches WHERE NOT ingested ORDER BY created")]

    def keys(self, file_id: str) -> list[str]:
        """`BatchLedger.keys`."""
        return [k for (k,) in self._read("SELECT key FROM judge_batch_keys WHERE file_id = %s",
                                         (file_id,))]

    def held(self) -> set[str]:
        """`BatchLedger.held`."""
        return {k for (k,) in self._read(
            "SELECT k.key FROM judge_batch_keys k JOIN judge_batches b ON b.file_id = k.file_id "
            "WHERE NOT b.ingested")}

    def close(self) -> None:
        """`BatchLedger.close`."""
        self._conn.close()

    def __exit__(self, *exc: object) -> None:
        self.close()
