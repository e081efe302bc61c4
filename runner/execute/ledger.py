"""The durable ledger of submitted provider batches: batch id -> the cache keys it holds, state.

Invariant: a key is in at most one row whose state is live (LIVE) or not yet ingested: no key
is submitted again while an answer to it may still come.

It lives beside the answers, because the keys it guards are cache keys: every job and every
shard sharing a cache sees the same open batches and none submits a key a live batch already
holds, whatever `--out` or the working directory says. One interface, `BatchLedger`, two
implementations: `Ledger`, a small SQLite file `batches.sqlite` in a cache folder (stdlib
sqlite3), and `runner.execute.pgledger.PgLedger`, two tables in a PostgreSQL cache's database.
Neither holds a secret: ids, states, counts and cache keys only.

Every write is its own transaction, durable when the method returns. The order that makes a
kill -9 at any point safe (see runner.execute.batch):

1. upload the request file;
2. `reserve(file_id, keys)`: a row in state `submitting` holding the keys, committed;
3. create the batch, then `attach(file_id, batch_id)` at once.

A row still `submitting` on the next run is resolved against the provider's batch list (a batch
whose input file is that file: attach to it; none: the create never happened, so the batch is
created now over the file already uploaded, never a second upload).
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from runner.errors import CacheError

__all__ = ["COLUMNS", "FILENAME", "FILES", "LIVE", "TERMINAL", "BatchLedger", "BatchRow", "Ledger"]

FILENAME = "batches.sqlite"
FILES = "batch-files"  # request files kept on this machine until their batch is ingested
LIVE = frozenset({"submitting", "validating", "in_progress", "finalizing", "cancelling"})
"""States in which the provider may still answer a batch's requests."""
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled", "abandoned"})
"""`abandoned`: reserved, but the provider never created the batch (a kill before create)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    file_id TEXT PRIMARY KEY,      -- the uploaded request file: known before the batch id
    batch_id TEXT UNIQUE,          -- NULL while submitting
    job TEXT NOT NULL,
    model TEXT NOT NULL,           -- the job's model name
    endpoint TEXT NOT NULL,
    state TEXT NOT NULL,
    requests INTEGER NOT NULL,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    ingested INTEGER NOT NULL DEFAULT 0,
    output_file TEXT,
    error_file TEXT
);
CREATE TABLE IF NOT EXISTS batch_keys (
    file_id TEXT NOT NULL REFERENCES batches(file_id),
    key TEXT NOT NULL,
    PRIMARY KEY (file_id, key)
);
CREATE INDEX IF NOT EXISTS batch_keys_key ON batch_keys(key);
"""


@dataclass(frozen=True, slots=True)
class BatchRow:
    """One submitted (or being submitted) batch as the ledger knows it: the columns of the
    `batches` table (see _SCHEMA), `ingested` as a bool."""

    file_id: str
    batch_id: str | None
    job: str
    model: str
    endpoint: str
    state: str
    requests: int
    completed: int
    failed: int
    created: float
    updated: float
    ingested: bool
    output_file: str | None
    error_file: str | None

    @property
    def live(self) -> bool:
        """Whether the provider may still answer its requests (its state is in LIVE)."""
        return self.state in LIVE

    @classmethod
    def of(cls, r: Sequence[object]) -> BatchRow:
        """A row as either implementation reads it.

        Args:
            r: the values of one row, in the order of COLUMNS.

        Returns:
            The row, each value converted to its field's type.
        """
        return cls(file_id=str(r[0]), batch_id=None if r[1] is None else str(r[1]),
                   job=str(r[2]), model=str(r[3]), endpoint=str(r[4]), state=str(r[5]),
                   requests=int(r[6]), completed=int(r[7]), failed=int(r[8]),  # type: ignore[call-overload]
                   created=float(r[9]), updated=float(r[10]),  # type: ignore[arg-type]
                   ingested=bool(r[11]), output_file=None if r[12] is None else str(r[12]),
                   error_file=None if r[13] is None else str(r[13]))


COLUMNS = ("file_id, batch_id, job, model, endpoint, state, requests, completed, failed, "
            "created, updated, ingested, output_file, error_file")


class BatchLedger(Protocol):
    """What runner.execute.batch and `judge batches` need from a ledger (see the module)."""

    location: str
    """Where the ledger is, for messages (a URL without its password)."""
    files: Path
    """The folder this machine keeps request files in until their batch is ingested."""

    def reserve(self, *, file_id: str, job: str, model: str, endpoint: str,
                keys: Sequence[str]) -> None:
        """Record, before the create call, that `keys` are about to be submitted in a batch
        over the uploaded `file_id` (state `submitting`); durable when it returns.

        Args:
            file_id: the provider's id of the uploaded request file.
            job: the job's name.
            model: the job's model name.
            endpoint: the batch endpoint's label (its base URL).
            keys: the cache keys of the file's requests.

        Raises:
            CacheError: the ledger cannot be written.
        """
        ...

    def attach(self, file_id: str, batch_id: str, state: str) -> None:
        """Record the batch the provider created over `file_id`.

        Args:
            file_id: the reserved row's file id.
            batch_id: the provider's batch id.
            state: the batch's state as the create call returned it.

        Raises:
            CacheError: the ledger cannot be written.
        """
        ...

    def update(self, file_id: str, *, state: str, completed: int = 0, failed: int = 0,
               output_file: str | None = None, error_file: str | None = None) -> None:
        """Record a batch's state as the provider last reported it.

        Args:
            file_id: the row's file id.
            state: the batch's state.
            completed: requests answered so far.
            failed: requests failed so far.
            output_file: the provider's id of the answers file, once there is one.
            error_file: the provider's id of the errors file, once there is one.

        Raises:
            CacheError: the ledger cannot be written.
        """
        ...

    def mark_ingested(self, file_id: str) -> None:
        """Record that every answer of the batch is in the cache: its keys are free again.

        Args:
            file_id: the row's file id.

        Raises:
            CacheError: the ledger cannot be written.
        """
        ...

    def rows(self, job: str | None = None) -> list[BatchRow]:
        """Every batch, oldest first.

        Args:
            job: only this job's batches; None for every job's.

        Returns:
            The rows, by creation time.
        """
        ...

    def pending(self) -> list[BatchRow]:
        """Batches not yet ingested (live, or ended and not collected): every job's.

        Returns:
            The rows, oldest first.
        """
        ...

    def keys(self, file_id: str) -> list[str]:
        """The cache keys a batch holds.

        Args:
            file_id: the row's file id.

        Returns:
            The keys `reserve` recorded for it.
        """
        ...

    def held(self) -> set[str]:
        """Keys in a batch that is not ingested yet: never submit these again.

        Returns:
            The keys of every row not yet ingested, of every job.
        """
        ...

    def close(self) -> None:
        """Close the connection; the ledger is not used again."""
        ...

    def __enter__(self) -> BatchLedger: ...

    def __exit__(self, *exc: object) -> None: ...


class Ledger(contextlib.AbstractContextManager["Ledger"]):
    """The batches of one cache directory, in its batches.sqlite."""

    def __init__(self, cache_dir: Path) -> None:
        """Open (or create) the ledger of a cache folder.

        Args:
            cache_dir: the cache folder; batches.sqlite and the batch-files folder live in it.

        Raises:
            CacheError: the folder or the file cannot be created or opened.
        """
        self.path = cache_dir / FILENAME
        self.location, self.files = str(self.path), cache_dir / FILES
        try:
            cache_dir.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a returned write is on disk
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise CacheError(f"{self.path}: cannot open the batch ledger ({exc}); check the "
                             "cache directory's permissions or pass --cache-dir") from None

    def reserve(self, *, file_id: str, job: str, model: str, endpoint: str,
                keys: Sequence[str]) -> None:
        """`BatchLedger.reserve`: one transaction for the row and its keys."""
        now = time.time()
        with self._tx():
            self._db.execute(
                "INSERT INTO batches (file_id, job, model, endpoint, state, requests, created, "
                "updated) VALUES (?, ?, ?, ?, 'submitting', ?, ?, ?)",
                (file_id, job, model, endpoint, len(keys), now, now))
            self._db.executemany("INSERT OR IGNORE INTO batch_keys (file_id, key) VALUES (?, ?)",
                                 ((file_id, k) for k in keys))

    def attach(self, file_id: str, batch_id: str, state: str) -> None:
        """`BatchLedger.attach`."""
        with self._tx():
            self._db.execute("UPDATE batches SET batch_id = ?, state = ?, updated = ? "
                             "WHERE file_id = ?", (batch_id, state, time.time(), file_id))

    def update(self, file_id: str, *, state: str, completed: int = 0, failed: int = 0,
               output_file: str | None = None, error_file: str | None = None) -> None:
        """`BatchLedger.update`."""
        with self._tx():
            self._db.execute(
                "UPDATE batches SET state = ?, completed = ?, failed = ?, output_file = ?, "
                "error_file = ?, updated = ? WHERE file_id = ?",
                (state, completed, failed, output_file, error_file, time.time(), file_id))

    def mark_ingested(self, file_id: str) -> None:
        """`BatchLedger.mark_ingested`."""
        with self._tx():
            self._db.execute("UPDATE batches SET ingested = 1, updated = ? WHERE file_id = ?",
                             (time.time(), file_id))

    def rows(self, job: str | None = None) -> list[BatchRow]:
        """`BatchLedger.rows`."""
        where, args = ("WHERE job = ?", (job,)) if job is not None else ("", ())
        cur = self._db.execute(f"SELECT {COLUMNS} FROM batches {where} ORDER BY created", args)
        return [BatchRow.of(r) for r in cur]

    def pending(self) -> list[BatchRow]:
        """`BatchLedger.pending`."""
        cur = self._db.execute(f"SELECT {COLUMNS} FROM batches WHERE ingested = 0 "
                               "ORDER BY created")
        return [BatchRow.of(r) for r in cur]

    def keys(self, file_id: str) -> list[str]:
        """`BatchLedger.keys`."""
        return [k for (k,) in self._db.execute(
            "SELECT key FROM batch_keys WHERE file_id = ?", (file_id,))]

    def held(self) -> set[str]:
        """`BatchLedger.held`."""
        return {k for (k,) in self._db.execute(
            "SELECT k.key FROM batch_keys k JOIN batches b ON b.file_id = k.file_id "
            "WHERE b.ingested = 0")}

    def _tx(self) -> _Transaction:
        return _Transaction(self._db, self.path)

    def close(self) -> None:
        """`BatchLedger.close`."""
        self._db.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on an error; a disk error is a CacheError."""

    def __init__(self, db: sqlite3.Connection, path: Path) -> None:
        self.db, self.path = db, path

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if kind is None:
            try:
                self.db.execute("COMMIT")
                return
            except sqlite3.Error as error:
                self.db.execute("ROLLBACK")
                raise CacheError(f"{self.path}: cannot write the batch ledger ({error}); "
                                 "check free disk space") from None
        self.db.execute("ROLLBACK")

