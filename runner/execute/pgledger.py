"""The batch ledger of a PostgreSQL cache: runner.execute.ledger's rows, invariant and queries,
in two tables of the cache's own database (_SCHEMA). A PostgreSQL cache is shared by machines
that share no folder, so its ledger is shared the same way: every shard of a SLURM array, and
`judge batches` run anywhere, see the same open batches and the keys they hold.

The tables are created on first use like the answers table: `CREATE TABLE IF NOT EXISTS` under
the cache's advisory lock. Autocommit, so each write is durable when it returns; `reserve`
writes its row and keys in one transaction. Nothing secret is stored (no URL, no key), and
messages carry the URL without its password. Request files stay on the machine that wrote them
(`files`): OpenAI keeps a copy of each upload, which another machine reads to collect.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg import conninfo

from runner.errors import CacheError, redact_url
from runner.execute.ledger import BatchLedger
from runner.execute.store.pgcache import LOCK_ID
from runner.execute.store.pgsession import CONNECT_TIMEOUT_S, Scrubbed

__all__ = ["PgLedger"]

_Result = TypeVar("_Result")

_SCHEMA: tuple[LiteralString, ...] = (
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


class PgLedger(BatchLedger, Scrubbed):
    """The batches of one PostgreSQL cache; request files in `files` on this machine. The
    ledger's SQL gets psycopg's placeholders (`?` is in no statement but as one)."""

    _batches, _keys = "judge_batches", "judge_batch_keys"

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
            for statement in _SCHEMA:
                self._conn.execute(statement)

    def _guarded(self, what: str, call: Callable[[], _Result]) -> _Result:
        """`call()`, a database error turned into a CacheError naming `what` failed."""
        try:
            return call()
        except psycopg.Error as exc:
            raise self._fail(what, exc) from None

    def _reserve(self, sql: str, row: Sequence[Any], file_id: str, keys: Sequence[str]) -> None:
        def insert() -> None:
            with self._conn.transaction():
                self._conn.execute(sql.replace("?", "%s"), row)
                self._conn.execute("INSERT INTO judge_batch_keys (file_id, key) SELECT %s, "
                                   "unnest(%s::text[]) ON CONFLICT DO NOTHING",
                                   (file_id, list(keys)))

        self._guarded(f"recording batch file {file_id}", insert)

    def _write(self, what: str, sql: str, params: Sequence[Any]) -> None:
        self._guarded(what, lambda: self._conn.execute(sql.replace("?", "%s"), params))

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._guarded("reading the batch ledger",
                             lambda: self._conn.execute(sql.replace("?", "%s"), params).fetchall())

    def close(self) -> None:
        """`BatchLedger.close`."""
        self._conn.close()

