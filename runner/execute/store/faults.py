"""A cache folder this process may not write, a cache database SQLite cannot use, and a
record damaged on disk, a write transaction that fails.

A study is handed over as a cache folder on a read-only mount, or owned by another user:
`rescore`, `report`, `plan`, `status` and `cache export` only read it, so they open its
database read-only (`ReadOnlyDisk`: SQLite's immutable or mode=ro; no journal, no folding)
instead of failing where diskcache would write its settings. `refused` turns what SQLite raises
for a damaged, truncated, unwritable or long-locked database into one CacheError naming the file
and what to do, where a traceback named nothing. `damage` says why a record's bytes are not a
record: judging makes that its task's failure (answers.DAMAGED). `transaction` rolls back a
failed write, a failed COMMIT's too, so the connection takes the next one (left open, every later
BEGIN failed: "cannot start a transaction within a transaction").
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote

import diskcache
import orjson

from runner.errors import CacheError, DiskFullError

__all__ = ["BUSY_MS", "DBNAME", "ReadOnlyDisk", "damage", "decoded", "free_bytes", "full",
           "guarded", "not_writable", "refused", "transaction", "writable"]

BUSY_MS = 60_000  # a connection waits this long for another run's transaction (they take ~ms)
DBNAME = "cache.db"  # diskcache's


def writable(directory: Path) -> bool:
    """Whether this process may write the cache folder `directory` (a folder yet to be made
    counts as writable: making it says otherwise): the folder, and its database files that
    exist. os.access, so a read-only mount is read-only for root too.

    Returns:
        False when the folder or a database file of it is not writable.
    """
    if not directory.exists():
        return True
    paths = [directory] + [directory / f"{DBNAME}{end}" for end in ("", "-wal", "-shm")]
    return all(os.access(p, os.W_OK) for p in paths if p.exists())


def refused(directory: Path, exc: BaseException) -> CacheError:
    """The CacheError for what SQLite (or the file system) raised on the folder's database.

    Returns:
        The error to raise instead, naming the file and the fix (DiskFullError for a full disk).
    """
    db, text = directory / DBNAME, str(exc)
    if full(exc):
        return DiskFullError(f"{directory}: the disk is full ({text}); free space, then rerun to "
                             "resume")
    if "not a database" in text or "malformed" in text:
        return CacheError(f"{db}: the cache database is damaged ({text}); restore the folder "
                          "from a copy, or move it aside and rerun (every answer not found "
                          "elsewhere is asked again)")
    if "locked" in text:
        return CacheError(f"{db}: locked by another process for over a minute ({text}); let "
                          "the other judge command on this folder end (or stop it), then rerun")
    if "readonly" in text or "unable to open" in text or isinstance(exc, PermissionError):
        return CacheError(f"{db}: cannot write the cache ({text}); {_whose(directory)}")
    return CacheError(f"{db}: the cache database cannot be used ({text}); check the folder, "
                      "then rerun")


P = ParamSpec("P")
R = TypeVar("R")


def guarded(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
    """`method`, with what SQLite raises (a damaged or long-locked database) as one CacheError
    naming the file and the fix (`refused`), where it was a traceback.

    Args:
        method: a method of an object with a `directory` (the cache folder).

    Returns:
        The wrapped method.
    """
    def call(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise refused(self.directory, exc) from None
    call.__doc__ = method.__doc__
    return call


@contextlib.contextmanager
def transaction(db: sqlite3.Connection,
                refused: Callable[[sqlite3.Error], Exception] | None = None) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT on `db` (isolation_level=None); on any error, a best-effort
    ROLLBACK, then the error goes on, what SQLite raised as `refused` makes it if given.

    Args:
        db: the connection, outside a transaction.
        refused: the error to raise instead of a sqlite3.Error (naming the file and the fix).

    Returns:
        The context of the transaction's statements.
    """
    try:
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # the error that led here says more
                    db.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        if refused is None:
            raise
        raise refused(exc) from None


def damage(raw: bytes) -> str | None:
    """Why `raw` is not a stored record (not JSON, or not a JSON object), or None if it is
    one: a record whose bytes were damaged on disk (a bad sector, a copy cut short) must cost
    its own task, named, and never the whole study.

    Returns:
        The reason, or None.
    """
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"not JSON: {exc}"
    return None if isinstance(record, dict) else "not a JSON object"


def decoded(directory: Path, key: str, raw: bytes) -> dict[str, Any]:
    """The record `raw` stored under `key` in `directory`; CacheError naming the key and the
    fix if it is damaged.

    Args:
        directory: the cache folder, for the message.
        key: the record's key, for the message.
        raw: the record's bytes as stored.

    Returns:
        The decoded record.

    Raises:
        CacheError: The record is not a JSON object.
    """
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        record = None
    if not isinstance(record, dict):
        raise CacheError(f"{directory}: the cached answer {key} is unreadable ({damage(raw)}); "
                         f"`judge cache check --cache-dir {directory} --drop` removes it, and "
                         "`judge run --refresh-damaged` asks it again")
    return record


def full(exc: BaseException) -> bool:
    """Whether `exc` says the disk is full (the file system's ENOSPC or EDQUOT, a user's
    quota; SQLite's SQLITE_FULL).

    Returns:
        True for a full disk or quota.
    """
    return getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or \
        "disk is full" in str(exc) or getattr(exc, "sqlite_errorname", None) == "SQLITE_FULL"


def free_bytes(directory: Path, unknown: int) -> int:
    """Bytes free for this user on the disk of `directory` (`unknown` if it cannot be told).

    Args:
        directory: a folder on the disk.
        unknown: what to return when it cannot be told.

    Returns:
        The free bytes.
    """
    try:
        stat = os.statvfs(directory)
    except OSError:
        return unknown
    return stat.f_bavail * stat.f_frsize


def not_writable(directory: Path) -> CacheError:
    """The CacheError of a command that must write a folder it may not.

    Returns:
        The error, naming the folder's owner and the fix.
    """
    return CacheError(f"{directory}: the cache folder is not writable; {_whose(directory)}")


def _whose(directory: Path) -> str:
    """What to do about a folder this process may not write."""
    try:
        owner = directory.stat().st_uid
    except OSError:
        owner = os.getuid()
    who = f"it belongs to uid {owner}: run as that user, or " if owner != os.getuid() else ""
    return (f"{who}make it and its files writable (or copy it and pass the copy as "
            "--cache-dir); rescore, report, plan, status, cache export and run --offline read "
            "it as it is")


class ReadOnlyDisk:
    """The part of diskcache.Cache that reading needs (runner.execute.store.cache), over a
    connection that never writes, and leaves no file behind: `immutable=1` (no lock, no
    -wal or -shm file: a folder closed by its last writer, as one handed over is), or, while
    a -wal file says a writer may be at work, `mode=ro`, which takes SQLite's locks (and
    needs the -shm file: where SQLite cannot use one, immutable it is)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        path = quote(str(directory / DBNAME))
        if not (directory / DBNAME).is_file():
            raise CacheError(f"{directory}: no cache database here ({DBNAME}); pass the "
                             "cache folder as --cache-dir")
        self.connection = sqlite3.connect(f"file:{path}?immutable=1", uri=True,
                                          isolation_level=None, check_same_thread=False)
        """Read-only: store/table.py reads batches of keys through it."""
        if (directory / f"{DBNAME}-wal").exists():  # a writer may be at work: take its locks
            with contextlib.suppress(sqlite3.OperationalError):
                locking = sqlite3.connect(f"file:{path}?mode=ro", uri=True,
                                          isolation_level=None, check_same_thread=False)
                locking.execute("SELECT count(*) FROM Settings").fetchall()
                self.connection.close()
                self.connection = locking
        settings = dict(self.connection.execute("SELECT key, value FROM Settings").fetchall())
        self._files = diskcache.Disk(str(directory),  # reads the records kept as files
                                     min_file_size=settings.get("disk_min_file_size", 2**15))
        self._size, self._count = int(settings.get("size", 0)), int(settings.get("count", 0))

    def get(self, key: str) -> bytes | None:
        """The stored bytes of `key`, or None.

        Returns:
            The record's bytes as stored, or None.
        """
        row = self.connection.execute("SELECT mode, filename, value FROM Cache WHERE key = ? "
                                      "AND raw = 1", (key,)).fetchone()
        return None if row is None else bytes(self._files.fetch(*row, False))

    def __contains__(self, key: str) -> bool:
        return self.connection.execute("SELECT 1 FROM Cache WHERE key = ? AND raw = 1",
                                       (key,)).fetchone() is not None

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        for (key,) in self.connection.execute("SELECT key FROM Cache WHERE raw = 1 ORDER BY "
                                              "rowid"):
            yield key

    def volume(self) -> int:
        (pages,), (size,) = (self.connection.execute(f"PRAGMA {p}").fetchone()
                             for p in ("page_count", "page_size"))
        return int(pages) * int(size) + self._size

    def close(self) -> None:
        self.connection.close()
