"""The durable ledger of submitted provider batches: batch id -> the cache keys it holds, state.

Invariant: a key is in at most one row whose state is live (LIVE) or not yet ingested: no key
is submitted again while an answer to it may still come.

It lives beside the answers, because the keys it guards are cache keys: every job and every
shard sharing a cache sees the same open batches and none submits a key a live batch already
holds, whatever `--out` or the working directory says. `BatchLedger` writes its queries once
for two databases: `Ledger`, a small SQLite file `batches.sqlite` in a cache folder (stdlib
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
from typing import Any

from runner.errors import CacheError
from runner.execute.store.faults import BUSY_MS, transaction

__all__ = ["FILES", "LIVE", "BatchLedger", "BatchRow", "Ledger"]

FILENAME = "batches.sqlite"
FILES = "batch-files"  # request files kept on this machine until their batch is ingested
LIVE = frozenset({"submitting", "validating", "in_progress", "finalizing", "cancelling"})
"""States in which the provider may still answer a batch's requests; the others: completed,
failed, expired, cancelled, and `abandoned` (reserved, but no batch will be created)."""

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


_COLUMNS = ("file_id, batch_id, job, model, endpoint, state, requests, completed, failed, "
            "created, updated, ingested, output_file, error_file")


def _row(r: Sequence[Any]) -> BatchRow:
    """A row read in the order of _COLUMNS, `ingested` (0/1 in SQLite) as a bool."""
    values = list(r)
    values[11] = bool(values[11])
    return BatchRow(*values)


class BatchLedger(contextlib.AbstractContextManager["BatchLedger"]):
    """What runner.execute.batch and `judge batches` need from a ledger (see the module): its
    queries, written once over the tables `_batches` and `_keys`, with `?` placeholders; `Ledger`
    and runner.execute.pgledger.PgLedger run them on their own database."""

    location: str
    """Where the ledger is, for messages (a URL without its password)."""
    files: Path
    """The folder this machine keeps request files in until their batch is ingested."""
    _batches, _keys = "batches", "batch_keys"

    def reserve(self, *, file_id: str, job: str, model: str, endpoint: str,
                keys: Sequence[str]) -> None:
        """Record, before the create call, that `keys` are about to be submitted in a batch
        over the uploaded `file_id` (state `submitting`); durable when it returns, the row and
        its keys in one transaction.

        Args:
            file_id: the provider's id of the uploaded request file.
            job: the job's name.
            model: the job's model name.
            endpoint: the batch endpoint's label (its base URL).
            keys: the cache keys of the file's requests.

        Raises:
            CacheError: the ledger cannot be written.
        """
        now = time.time()
        self._reserve(f"INSERT INTO {self._batches} (file_id, job, model, endpoint, state, "
                      "requests, created, updated) VALUES (?, ?, ?, ?, 'submitting', ?, ?, ?)",
                      (file_id, job, model, endpoint, len(keys), now, now), file_id, keys)

    def attach(self, file_id: str, batch_id: str, state: str) -> None:
        """Record the batch the provider created over `file_id`.

        Args:
            file_id: the reserved row's file id.
            batch_id: the provider's batch id.
            state: the batch's state as the create call returned it.

        Raises:
            CacheError: the ledger cannot be written.
        """
        self._write(f"recording batch {batch_id}", f"UPDATE {self._batches} SET batch_id = ?, "
                    "state = ?, updated = ? WHERE file_id = ?",
                    (batch_id, state, time.time(), file_id))

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
        self._write(f"updating batch file {file_id}",
                    f"UPDATE {self._batches} SET state = ?, completed = ?, failed = ?, "
                    "output_file = ?, error_file = ?, updated = ? WHERE file_id = ?",
                    (state, completed, failed, output_file, error_file, time.time(), file_id))

    def mark_ingested(self, file_id: str) -> None:
        """Record that every answer of the batch is in the cache: its keys are free again.

        Args:
            file_id: the row's file id.

        Raises:
            CacheError: the ledger cannot be written.
        """
        self._write(f"updating batch file {file_id}", f"UPDATE {self._batches} SET "
                    "ingested = true, updated = ? WHERE file_id = ?", (time.time(), file_id))

    def rows(self, job: str | None = None) -> list[BatchRow]:
        """Every batch, oldest first.

        Args:
            job: only this job's batches; None for every job's.

        Returns:
            The rows, by creation time.
        """
        where, args = ("WHERE job = ?", (job,)) if job is not None else ("", ())
        return [_row(r) for r in self._read(
            f"SELECT {_COLUMNS} FROM {self._batches} {where} ORDER BY created", args)]

    def pending(self) -> list[BatchRow]:
        """Batches not yet ingested (live, or ended and not collected): every job's.

        Returns:
            The rows, oldest first.
        """
        return [_row(r) for r in self._read(
            f"SELECT {_COLUMNS} FROM {self._batches} WHERE NOT ingested ORDER BY created")]

    def keys(self, file_id: str) -> list[str]:
        """The cache keys a batch holds.

        Args:
            file_id: the row's file id.

        Returns:
            The keys `reserve` recorded for it.
        """
        return [k for (k,) in self._read(f"SELECT key FROM {self._keys} WHERE file_id = ?",
                                         (file_id,))]

    def held(self) -> set[str]:
        """Keys in a batch that is not ingested yet: never submit these again.

        Returns:
            The keys of every row not yet ingested, of every job.
        """
        return {k for (k,) in self._read(
            f"SELECT k.key FROM {self._keys} k JOIN {self._batches} b "
            "ON b.file_id = k.file_id WHERE NOT b.ingested")}

    def close(self) -> None:
        """Close the connection; the ledger is not used again."""
        raise NotImplementedError

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reserve(self, sql: str, row: Sequence[Any], file_id: str, keys: Sequence[str]) -> None:
        """Insert the row (`sql` with `row`) and the file's keys in one transaction."""
        raise NotImplementedError

    def _write(self, what: str, sql: str, params: Sequence[Any]) -> None:
        """Run one statement in its own transaction; `what` names it in an error."""
        raise NotImplementedError

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        raise NotImplementedError


class Ledger(BatchLedger):
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
            self._db = sqlite3.connect(self.path, timeout=BUSY_MS / 1000,
                                       isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # a returned write is on disk
            self._db.executescript(_SCHEMA)
        except sqlite3.Error as exc:
            raise CacheError(f"{self.path}: cannot open the batch ledger ({exc}); check the "
                             "cache directory's permissions or pass --cache-dir") from None

    def _reserve(self, sql: str, row: Sequence[Any], file_id: str, keys: Sequence[str]) -> None:
        with transaction(self._db, self._refused):
            self._db.execute(sql, row)
            self._db.executemany("INSERT OR IGNORE INTO batch_keys (file_id, key) VALUES (?, ?)",
                                 ((file_id, k) for k in keys))

    def _write(self, what: str, sql: str, params: Sequence[Any]) -> None:
        with transaction(self._db, self._refused):
            self._db.execute(sql, params)

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._db.execute(sql, params).fetchall()

    def _refused(self, error: sqlite3.Error) -> CacheError:
        """What a failed write raises: the file and the fix (a lock's: the other process)."""
        fix = ("another judge process is using it: let it end (or stop it), then rerun"
               if "locked" in str(error) else "check free disk space")
        return CacheError(f"{self.path}: cannot write the batch ledger ({error}); {fix}")

    def close(self) -> None:
        """`BatchLedger.close`."""
        self._db.close()
