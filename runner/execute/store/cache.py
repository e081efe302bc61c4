"""The content-addressed response cache: sha256 key -> one orjson record, on disk, forever.

A plain `diskcache.Cache` with eviction off and a size limit nobody reaches: a research cache must
never drop a paid answer (the default 1 GiB limit silently culls past ~700k entries, LRU turns
every read into a write, and FanoutCache drops writes under contention). Reads and writes are
direct calls on the event loop thread: a hit costs ~14 us, far less than a thread hop. The
pool's answers go through `append`: a journal file first (store/journal.py), SQLite in large
transactions afterwards. Batches of keys go through this process's own SQLite connection
(store/table.py); one key through diskcache's public API.

A record: {"request": body, "endpoint": str, "response": chat-completions JSON,
"usage": {...}, "latency_s": float, "time": unix seconds, "source": "api" | "import:<file>"}.
Only successful responses are stored; the API key is never part of a record.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import diskcache
import orjson

from runner.errors import CacheError, DiskFullError
from runner.execute.store import table
from runner.execute.store.claimtable import FolderClaims, Owner
from runner.execute.store.faults import (
    DBNAME,
    ReadOnlyDisk,
    damage,
    decoded,
    free_bytes,
    full,
    guarded,
    not_writable,
    refused,
    writable,
)
from runner.execute.store.journal import Journal, Row, recover, spill, unfolded
from runner.execute.store.lease import FolderLease

__all__ = ["Cache", "answer_record"]

NEVER = 2**62  # size limit no cache reaches: eviction stays off
FOLD_ROWS = 1024  # appended answers folded into SQLite together, in one transaction
FOLD_S = 1.0  # or the age of the oldest of them that makes the next append fold
TRANSACTION = 2 * FOLD_ROWS  # records a transaction, at most: a fold is one
ROOM = 64 * 1024  # free bytes below which the folder's disk counts as full before a run calls


def answer_record(*, body: bytes, endpoint: str, response: Mapping[str, Any] | orjson.Fragment,
                  usage: Mapping[str, Any], latency_s: float, source: str,
                  replica: str | None = None) -> dict[str, Any]:
    """The one shape of a stored answer (see the module docstring).

    Args:
        body: The request as sent (compact JSON).
        endpoint: Where it was sent (no secret in it).
        response: The answer, or a Fragment of its JSON bytes as received.
        usage: Its token counts.
        latency_s: Seconds it took.
        source: "api", "batch:<batch id>" or "import:<where>".
        replica: The base URL that answered: a record field, never part of the key (a fleet
            change keeps every answer).

    Returns:
        The record to store.
    """
    # The body is already compact JSON: a Fragment embeds its bytes as they are, where
    # loads-then-dumps cost a parse and a serialisation per answer (a third of batch ingest).
    record = {"request": orjson.Fragment(body), "endpoint": endpoint, "response": response,
              "usage": usage, "latency_s": latency_s, "time": time.time(), "source": source}
    if replica is not None:
        record["replica"] = replica
    return record


class Cache(contextlib.AbstractContextManager["Cache"]):
    """Response records by cache key."""

    def __init__(self, directory: Path, *, read_only: bool = False,
                 never_write: bool = False) -> None:
        """`read_only`: the caller only reads, so a folder this process may not write is
        opened read-only (faults.ReadOnlyDisk: its journals read, not folded); without it,
        such a folder is a CacheError. A writable folder is opened for writing either way,
        unless its disk is too full for that (diskcache writes its settings at every open):
        then it is read as a read-only folder is, and every write raises DiskFullError
        (`full`): a fully cached job still reports. `never_write`: a writable folder is
        opened as a read-only one too (no settings written, no journal folded): a reader
        beside a live run that must not be a second writer (`judge serve`)."""
        self.directory = directory
        self.read_only = never_write or not writable(directory)
        if self.read_only and not (read_only or never_write):
            raise not_writable(directory)
        self._store: Any = None  # diskcache.Cache, or a ReadOnlyDisk: the one-key API
        self.full: DiskFullError | None = None
        """Why the folder was opened read-only though writable: its disk is full."""
        try:
            if not self.read_only:
                self._open_writable()
            if self.read_only:
                self._store = ReadOnlyDisk(directory)
                self._db = self._store.connection
            self._batched = table.matches(self._db)  # else the one-key API (store/table.py)
        except OSError as exc:
            raise CacheError(f"{directory}: cannot open the cache ({exc}); check the path and "
                             "its permissions or pass --cache-dir") from None
        except sqlite3.Error as exc:
            raise refused(directory, exc) from None
        self._journal: Journal | None = None  # the one being written
        self._pending: list[Row] = []  # appended to it
        self._since = 0.0  # when the oldest of them was
        # every appended row not yet known in SQLite (read-only: every journal's, left there)
        self._unfolded: dict[str, bytes] = dict(unfolded(directory)) if self.read_only else {}
        self._pid = os.getpid()
        self._claims: FolderClaims | None = None  # opened by the first claim
        if not self.read_only:
            recover(directory, self._recovered)  # answers of a run that was killed

    def _open_writable(self) -> None:
        """diskcache's folder and this process's own connection; read-only (`full`) if the
        disk is too full to open them."""
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            # synchronous=OFF: SQLite hands every write to the OS at once but never waits
            # for fsync, so a killed process (kill -9, OOM) loses nothing; only an OS crash
            # or a power cut can lose the last answers. The fsyncs stalled the event loop
            # (~40 us a put, and a disk flush every ~45 puts).
            self._store = diskcache.Cache(str(self.directory), eviction_policy="none",
                                          size_limit=NEVER, cull_limit=0, sqlite_synchronous=0)
            self._db = table.connect(str(self.directory / DBNAME))
        except sqlite3.Error as exc:
            # SQLite says "disk I/O error" when it cannot make its -wal or -shm file
            if not full(exc) and free_bytes(self.directory, ROOM) >= ROOM:
                raise
            if self._store is not None:
                self._store.close()
            self.full = DiskFullError(str(refused(self.directory, exc)))
            if not (self.directory / DBNAME).is_file():  # nothing to read either
                raise self.full from None
            self.read_only = True

    def _recovered(self, rows: list[Row]) -> None:
        """Fold a killed run's journal; if SQLite refuses (a full disk), its answers stay in
        it for the next open, and this object reads them from here: a rerun on a disk still
        full must not buy them again."""
        try:
            self.put_raw(rows)
        except CacheError:
            self._unfolded.update(rows)
            raise

    @guarded
    def __contains__(self, key: str) -> bool:
        return key in self._unfolded or key in self._store

    @guarded
    def get(self, key: str) -> dict[str, Any] | None:
        """`CacheBackend.get`."""
        raw = self._unfolded.get(key)
        if raw is None:
            raw = self._store.get(key)
        return None if raw is None else decoded(self.directory, key, raw)

    @guarded
    def has_many(self, keys: Sequence[str]) -> set[str]:
        """`CacheBackend.has_many`: one query per table.CHUNK keys, where `in` would make one
        each (a 100k-task rerun asks 100k times)."""
        found = table.stored_keys(self._db, keys) if self._batched else \
            {key for key in keys if key in self._store}
        if self._unfolded:
            found.update(key for key in keys if key in self._unfolded)
        return found

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """`CacheBackend.get_many`, read as get_many_raw reads."""
        return {key: decoded(self.directory, key, raw)
                for key, raw in self.get_many_raw(keys).items()}

    @guarded
    def get_many_raw(self, keys: Sequence[str]) -> dict[str, bytes]:
        """`Rereadable.get_many_raw` (store/reader.py): get_many's records, not decoded."""
        out = table.read(self._db if self._batched else None, self._store, keys)
        if self._unfolded:
            out.update((key, raw) for key in keys if (raw := self._unfolded.get(key)) is not None)
        return out

    @guarded
    def put(self, key: str, record: Mapping[str, Any]) -> None:
        """`CacheBackend.put`."""
        self._writing()
        self.fold()
        if not self._store.set(key, orjson.dumps(record)):
            raise CacheError(f"{self.directory}: could not store {key}; free space, then rerun")

    def put_many(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        """`CacheBackend.put_many`, TRANSACTION records per SQLite transaction (one put is
        one, ~60 us; table.write says how); a later record of a key replaces an earlier one."""
        self.fold()  # an earlier append of a key must not land after this record of it
        return self.put_raw((key, orjson.dumps(record)) for key, record in items)

    def append(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        """`CacheBackend.append`: durable once in the journal (store/journal.py, one write);
        into SQLite together, in one transaction, when an append finds FOLD_ROWS pending or the
        oldest FOLD_S old, and at `fold` and `close`."""
        return self._journaled([(key, orjson.dumps(record)) for key, record in items])

    def _journaled(self, rows: list[Row]) -> int:
        """append's rows, serialised."""
        self._writing()
        if self._journal is None:
            self._journal = Journal(self.directory)
        self._journal.append(rows)
        if not self._pending:
            self._since = time.monotonic()
        self._pending += rows
        self._unfolded.update(rows)
        if len(self._pending) >= FOLD_ROWS or time.monotonic() - self._since >= FOLD_S:
            try:
                self.fold()
            except DiskFullError:  # durable in the journal: SQLite takes them when it can
                self._since = time.monotonic()
        return len(rows)

    def keep(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> Path | None:
        """`CacheBackend.keep`: in the journal if it takes them now, else in a spill file
        outside the folder (journal.spill), which the next open of the folder folds; read by
        this object at once either way."""
        rows = [(key, orjson.dumps(record)) for key, record in items]
        try:
            self._journaled(rows)
            return None
        except DiskFullError:
            path = spill(self.directory, rows)
            self._unfolded.update(rows)
            return path

    def check_room(self) -> None:
        """Raise DiskFullError when the folder's disk has less than ROOM bytes free: a run
        about to call stops before its first call, rather than buy answers it cannot store."""
        if (free := free_bytes(self.directory, ROOM)) < ROOM:
            raise DiskFullError(f"{self.directory}: the disk is full ({free // 1024} KiB free); "
                                "free space, then rerun to resume")
        self._writing()

    def fold(self) -> None:
        """`CacheBackend.fold`, in one SQLite transaction (~14 us an answer, where the pool's
        turns of ~10-20 would cost ~30-40 us each), then the journal is emptied; what SQLite
        refuses stays in it, which the next open of the folder folds."""
        journal = self._journal
        if not self._pending or journal is None or not journal.mine:
            return  # nothing appended; or a forked child: its parent's answers are its parent's
        self.put_raw(self._pending)
        journal.clear()
        for key, raw in self._pending:  # in SQLite now: reads find them there
            if self._unfolded.get(key) is raw:
                del self._unfolded[key]
        self._pending = []

    def _writing(self) -> None:
        if self.full is not None:
            raise DiskFullError(str(self.full))
        if self.read_only:
            raise not_writable(self.directory)

    def put_raw(self, rows: Iterable[Row]) -> int:
        """put_many of records already serialised (a journal's rows), without waiting for
        the appended ones: `fold` and the recovery of journals use it.

        Returns:
            The number stored.
        """
        self._writing()
        stream, stored = iter(rows), 0
        while chunk := list(itertools.islice(stream, TRANSACTION)):
            try:
                table.write(self._db if self._batched else None, self._store, chunk)
            except (OSError, sqlite3.Error) as exc:
                if "locked" in str(exc) or "malformed" in str(exc):
                    raise refused(self.directory, exc) from None
                error, fix = (DiskFullError, "free space") if full(exc) else \
                    (CacheError, "check the folder's permissions")
                raise error(f"{self.directory}: could not store {len(chunk)} answers "
                            f"({exc}); {fix}, then rerun to resume") from None
            stored += len(chunk)
        return stored

    def damaged(self, keys: Sequence[str] | None = None) -> Iterator[tuple[str, str]]:
        """The stored records among `keys` (None: every one) that are damaged, read
        table.CHUNK at a time: `judge cache check` and `judge run --refresh-damaged`.

        Yields:
            Each damaged record's key, and why (`damage`).
        """
        self.fold()
        if keys is None:
            keys = self._all_keys()
        for chunk in table.chunks(keys):
            for key, raw in self.get_many_raw(chunk).items():
                if (why := damage(raw)) is not None:
                    yield key, why

    @guarded
    def _all_keys(self) -> list[str]:
        return list(self._store)  # diskcache's public iteration (and ReadOnlyDisk's)

    @guarded
    def drop(self, keys: Iterable[str]) -> int:
        """Remove the records of `keys` (damaged ones: the next run asks them again).

        Returns:
            How many there were.
        """
        self._writing()
        self.fold()
        return sum(bool(self._store.delete(key)) for key in keys)

    def keys(self) -> Iterator[str]:
        self.fold()
        return iter(self._store)

    @guarded
    def stats(self) -> dict[str, int]:
        """Entries and bytes on disk."""
        self.fold()
        return {"entries": len(self._store), "bytes": int(self._store.volume())}

    def reopened(self) -> Cache:
        """This folder opened again for reading, on a connection of its own (a forked
        reader's: runner.expand_ahead)."""
        return Cache(self.directory, read_only=True)

    def rest(self) -> None:
        """Nothing to do before a fork (a PgCache ends its watchdog thread)."""

    def lease(self, name: str, holder: str) -> FolderLease:
        """`CacheBackend.lease`: a flock on a file in this folder (store/lease.py)."""
        return FolderLease(self.directory, name, holder)

    def claim(self, keys: Sequence[str], owner: Owner, ttl_s: float) -> set[str]:
        """`CacheBackend.claim`, in this folder's claims.db (store/claimtable.py)."""
        self._writing()
        if self._claims is None:
            self._claims = FolderClaims(self.directory)
        return self._claims.claim(keys, owner, ttl_s)

    def renew_claims(self, owner: Owner, ttl_s: float) -> None:
        """`CacheBackend.renew_claims`."""
        if self._claims is not None:
            self._claims.renew(owner, ttl_s)

    def release_claims(self, owner: Owner, keys: Sequence[str], *, last: bool = False) -> None:
        """`CacheBackend.release_claims`."""
        if self._claims is not None:
            self._claims.release(owner, keys, last=last)

    def close(self) -> None:
        """Fold every appended answer and close. What SQLite refuses stays in its journal,
        which the next open of the folder folds."""
        if os.getpid() == self._pid:
            with contextlib.suppress(CacheError):
                self.fold()
            if self._journal is not None:
                self._journal.close(remove=not self._pending)
                self._journal = None
        if self._claims is not None:
            self._claims.close()
        if not self.read_only:
            self._db.close()  # a ReadOnlyDisk closes its own
        self._store.close()

    def __exit__(self, *exc: object) -> None:
        self.close()
