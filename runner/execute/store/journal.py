"""The answers' journal: where the pool's answers are durable before SQLite holds them.

The pool stores the answers of each event-loop turn together (~10-20 at zero latency). In
SQLite, transactions that small cost ~30-40 us an answer (a B-tree insert under a random key, two
diskcache triggers, the WAL's page writes); transactions of thousands cost ~14 us. So
`Cache.append` writes a turn's answers to an append-only file first, with one write(2): once it
returns they survive a kill -9, exactly as SQLite's own writes do with synchronous=OFF. The Cache
then moves them into SQLite ("folds") in large transactions (runner/execute/store/cache.py says
when).

A Cache object's journal is `journal/<time>-<pid>.log` in the cache folder, locked with lockf
for as long as it is open (a POSIX lock: it ends with its process, and a forked child does not
inherit it). Opening a Cache folds the journals whose lock can be taken, those of processes that
died, then removes them: a kill -9 loses none of the answers its run counted.

A frame: <u32 size><u32 crc32><u16 key length><key><record>, size and crc covering key and
record. A journal cut short (a kill in the middle of a write, a machine crash) is read up to
its last whole frame.

A run stopped while its disk is full writes the answers it holds (runner.execute.commits) to a
spill file of the same format outside the cache folder (`spill`: under the system's temporary
folder, else ~/.cache/judge-runner/spill/ or $XDG_CACHE_HOME's), in a folder named for the cache
folder's path; opening the cache folder reads and folds those as it does its own journals. A
run whose PostgreSQL server stays away past its reconnect window spills the answers the server
did not take the same way (home first), and the next open of that database stores them
(`recover`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import struct
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

from runner.errors import CacheError, DiskFullError

__all__ = ["Journal", "frames", "recover", "spill", "unfolded"]

FOLDER = "journal"
_HEAD = struct.Struct("<IIH")
_LIVE: set[str] = set()
"""This process's open journals. A POSIX lock stops other processes (a forked child too), but
not its own: a second Cache on the same folder must not fold them, and closing its descriptor
of one would end the lock."""

Row = tuple[str, bytes]  # a cache key and its record's orjson bytes
# A disk full for this user, out of space or over a quota (a home folder on a cluster): the
# answers are held, not dropped (runner.execute.commits).
FULL = (errno.ENOSPC, errno.EDQUOT)


def _framed(rows: Sequence[Row]) -> bytes:
    """`rows` as frames, end to end (one loop, no call a row: every answer of the pool)."""
    parts: list[bytes] = []
    for key, raw in rows:
        encoded = key.encode()
        parts += (_HEAD.pack(len(encoded) + len(raw), zlib.crc32(raw, zlib.crc32(encoded)),
                             len(encoded)), encoded, raw)
    return b"".join(parts)


def frames(data: bytes) -> list[Row]:
    """The whole frames at the start of `data`, up to the first cut or damaged one (a frame
    without a key, as zeroed blocks would read, is damaged). Each record is copied once, out
    of `data`: a run's recovery reads every answer of a killed run through here.

    Returns:
        The key and record bytes of each whole frame.
    """
    rows, pos, end, view = [], 0, len(data), memoryview(data)
    while pos + _HEAD.size <= end:
        size, crc, key_len = _HEAD.unpack_from(data, pos)
        start, stop = pos + _HEAD.size, pos + _HEAD.size + size
        if not 0 < key_len <= size or stop > end or zlib.crc32(view[start:stop]) != crc:
            break
        rows.append((data[start:start + key_len].decode(), data[start + key_len:stop]))
        pos = stop
    return rows


class Journal:
    """One open journal file in `directory`/journal/: append frames, clear once folded."""

    def __init__(self, directory: Path) -> None:
        folder = directory / FOLDER
        stem = f"{time.time_ns():020d}-{os.getpid()}"
        self.path = folder / f"{stem}.log"
        fd = -1
        try:
            folder.mkdir(exist_ok=True)
            # Made and locked under another name, then renamed: no opener can see an unlocked
            # journal of a live writer.
            temporary = folder / f"{stem}.new"
            fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(temporary, self.path)
        except OSError as exc:
            if fd >= 0:
                os.close(fd)
            error = DiskFullError if exc.errno in FULL else CacheError
            raise error(f"{folder}: cannot write the answers' journal ({exc}); check the "
                        "cache folder's permissions and free space") from None
        self.directory = directory
        self._fd, self._pid, self._size = fd, os.getpid(), 0
        self._broken = False  # a failed write could not be cut back: no more appends
        _LIVE.add(str(self.path))

    def append(self, rows: Sequence[Row]) -> None:
        """Write `rows` in one call; durable against a kill -9 when this returns. On failure
        the file is cut back to what it held, and CacheError is raised.

        Args:
            rows: the keys and record bytes.

        Raises:
            CacheError: The write failed (a full disk: DiskFullError).
        """
        data = _framed(rows)
        try:
            if self._broken:
                raise OSError(errno.EIO, "an earlier write failed")
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as exc:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                self._broken = True  # a cut frame would hide every later one from recovery
            error = DiskFullError if exc.errno in FULL else CacheError
            raise error(f"{self.directory}: could not store {len(rows)} answers in its "
                             f"journal {self.path.name} ({exc}); free space, then rerun to "
                             "resume") from None
        self._size += len(data)

    @property
    def mine(self) -> bool:
        """False in a forked child: it leaves its parent's journal alone."""
        return os.getpid() == self._pid

    def clear(self) -> None:
        """Everything written is in SQLite now."""
        if self._size:
            os.ftruncate(self._fd, 0)
            self._size = 0

    def close(self, *, remove: bool) -> None:
        """Close; `remove` when everything written is in SQLite (else the next open folds it).
        A forked child leaves its parent's journal alone.

        Args:
            remove: delete the file (its rows are stored).
        """
        if not self.mine:
            return
        if remove:
            self.path.unlink(missing_ok=True)
        os.close(self._fd)  # after the unlink: the lock holds until the file is gone
        _LIVE.discard(str(self.path))


def recover(place: Path | str, store: Callable[[list[Row]], object]) -> int:
    """Store with `store`, oldest first, the answers kept for the cache `place` that no live
    process holds, and remove their files: a folder's journals and spill files, or the spill
    files of a shared database (answers a run held while it was away). When `store` raises
    CacheError (SQLite or the database refused them), the file stays for the next open.

    Args:
        place: the cache folder, or the database's URL without its password.
        store: stores a list of rows.

    Returns:
        The number of answers stored.
    """
    folded = 0
    for path in _journals(place):
        if path.name.endswith(".new"):
            _remove_stale(path)
        elif path.name.endswith(".log") and str(path) not in _LIVE:
            with contextlib.suppress(CacheError):  # a full disk: kept for the next open
                folded += _fold_file(path, store)
    return folded


def _journals(place: Path | str) -> list[Path]:
    """The journals of the cache `place` (a folder's own), then its spill files, each folder's
    oldest first."""
    own = [place / FOLDER] if isinstance(place, Path) else []
    paths: list[Path] = []
    for folder in [*own, *_ours(_spill_folders(place))]:
        with contextlib.suppress(OSError):
            paths += [folder / name for name in sorted(os.listdir(folder))]
    return paths


def unfolded(directory: Path) -> list[Row]:
    """Every row of the journals in `directory`, oldest first, left where they are: what a
    cache opened read-only reads beside SQLite (it may not fold them).

    Returns:
        The key and record bytes of each row.
    """
    rows: list[Row] = []
    for path in _journals(directory):
        if path.name.endswith(".log"):
            with contextlib.suppress(OSError):
                rows += frames(path.read_bytes())
    return rows


def _spill_folders(place: Path | str) -> list[Path]:
    """Where the answers held for a cache go when it cannot take them, by preference, each in a
    folder named for the cache: for a cache folder (a Path, its own disk full) the system's
    temporary folder, then ~/.cache/judge-runner/spill/ (each, likely, on another disk); for a
    shared database (its URL without a password, while the server is away) the reverse, since
    a temporary folder may not outlive a reboot."""
    name = hashlib.sha256(str(place.resolve() if isinstance(place, Path) else place)
                          .encode()).hexdigest()[:16]
    home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"  # as pgcache's index
    folders = [Path(tempfile.gettempdir()) / f"judge-runner-{os.getuid()}" / "spill" / name,
               Path(home) / "judge-runner" / "spill" / name]
    return folders if isinstance(place, Path) else folders[::-1]


def _ours(folders: list[Path]) -> list[Path]:
    """The spill folders this user alone can have written: their `spill` folder a real folder
    of this user's, that no one else may enter, in a real folder of this user's. A spill
    folder's name is easy to guess, and the system's temporary folder is shared: a folder
    another user made there first could plant answers that the next open stores, or read
    ours."""
    def private(path: Path, strict: bool) -> bool:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and \
            not (strict and st.st_mode & 0o077)

    return [f for f in folders if private(f.parent, True) and private(f.parent.parent, False)]


def spill(place: Path | str, rows: Sequence[Row]) -> Path:
    """Write `rows` to a new spill file of the cache `place` (a folder, or a database's URL
    without its password; the journals' format), in the first spill folder that takes it; the
    next open of the cache reads and stores it (`recover`). Returns its path; raises
    DiskFullError naming the folders when none takes it.

    Args:
        place: the cache folder, or the database's URL without its password.
        rows: the key and record bytes of each answer held.

    Returns:
        The spill file written.

    Raises:
        DiskFullError: No spill folder took the file (the message names each and why).
    """
    data, refusals = _framed(rows), []
    for folder in _spill_folders(place):
        stem = folder / f"{time.time_ns():020d}-{os.getpid()}"
        try:
            folder.parent.parent.mkdir(parents=True, exist_ok=True)
            folder.parent.mkdir(mode=0o700, exist_ok=True)
            if not _ours([folder]):
                raise OSError(errno.EPERM, "not this user's own folder")
            folder.mkdir(mode=0o700, exist_ok=True)
            # Written whole under another name, then renamed: a reader never folds half of it
            with open(f"{stem}.new", "xb") as file:
                file.write(data)
            os.rename(f"{stem}.new", f"{stem}.log")
            return Path(f"{stem}.log")
        except OSError as exc:
            Path(f"{stem}.new").unlink(missing_ok=True)
            refusals.append(f"{folder}: {exc}")
    raise DiskFullError(f"{place}: the disk is full, and no other folder took the "
                        f"{len(rows)} answers held ({'; '.join(refusals)}); free space, then "
                        "rerun to resume (those answers are asked again)")


def _fold_file(path: Path, store: Callable[[list[Row]], object]) -> int:
    """Fold the journal `path` into SQLite with `store` and remove it; the answers folded (0
    if it is gone: folded by another process, or if another process holds it: its writer is
    alive, or another opener is folding it). Raises CacheError if the journal cannot be read,
    or `store` does."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise CacheError(f"{path}: cannot read the answers' journal ({exc})") from None
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0  # its writer is alive
        if not path.exists():
            return 0  # folded and removed by another opener
        with os.fdopen(os.dup(fd), "rb") as file:
            rows = frames(file.read())
        if rows:
            store(rows)
        path.unlink(missing_ok=True)
        return len(rows)
    finally:
        os.close(fd)


def _remove_stale(path: Path) -> None:
    """A journal made but never renamed holds no answers: its writer died in between. Removed
    once a minute old and unlocked (a live writer renames it within microseconds)."""
    try:
        if path.stat().st_mtime > time.time() - 60:
            return
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)
