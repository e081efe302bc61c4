"""A run's lease on (cache, job, shard): two runs of one job on one cache never both call.

Two `judge run`s of the same job on the same cache (two terminals, a cron job and a person, two
SLURM tasks given the same shard index) would each call every missing task: twice the spend, and
the last writer's reports win. So `judge run` takes a lease before its first call, and a second
run finds it and stops at once, naming the holder. A lease is per job *and* shard: `--shard 0/4`
and `--shard 1/4` of one job run together.

The lease is released by the operating system or the server when its holder dies, even on
kill -9, so a crashed run never leaves a lock to clear by hand:

- a diskcache folder: `lease-<hash>.lock` in the folder, held with fcntl.flock (the kernel drops
  it with the holder's last descriptor); the file holds the holder's description.
- PostgreSQL: a session-level advisory lock (dropped with the connection), its description in
  the `judge_lease` table (runner/execute/store/pgcache.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import socket
import sys
import time
from pathlib import Path
from typing import Protocol

from runner.errors import CacheError, redact_url

__all__ = ["FolderLease", "Lease", "LeaseHeldError", "describe", "held_error", "lease_id",
           "lease_name"]


class LeaseHeldError(CacheError):
    """Another live run holds the lease (exit 2, before any call)."""


class Lease(Protocol):
    """A held lease; `release` (or leaving the `with` block) gives it back."""

    def release(self) -> None: ...

    def __enter__(self) -> Lease: ...

    def __exit__(self, *exc: object) -> None: ...


def lease_name(job: str, shard: str | None) -> str:
    """What a lease is on within one cache: the job's name and its shard (`all` without one).

    Args:
        job: the job's name.
        shard: the shard (`i/n`), or None.

    Returns:
        The lease's name.
    """
    return f"job {job} shard {shard or 'all'}"


def lease_id(name: str) -> int:
    """A stable 31-bit number for `name` (a lock file's name, an advisory lock's key).

    Returns:
        The number.
    """
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") >> 1


def describe(command: str | None = None) -> str:
    """This process as a lease holder: host, pid, start time and command (any password in a
    URL of it replaced by ***: the description is shown to whoever else runs the job).

    Args:
        command: the command line that runs, if known.

    Returns:
        The description written where the lease is held.
    """
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    command = redact_url(command or " ".join(["judge", *sys.argv[1:]]))
    return f"host {socket.gethostname()} pid {os.getpid()} since {started}: {command}"


def held_error(location: str, name: str, holder: str) -> LeaseHeldError:
    """The one line a second run stops with: who holds the lease and what to do.

    Args:
        location: the cache, as the user gave it.
        name: the lease's name.
        holder: the holder's description (describe), if known.

    Returns:
        The error to raise.
    """
    who = holder.strip() or "another run (it has not written its description yet)"
    return LeaseHeldError(
        f"{location}: {name} is already running on this cache, held by {who}; wait for it to "
        "finish or stop it, then rerun (a stopped or killed run frees it at once); different "
        "--shard values of one job may run together")


class FolderLease(contextlib.AbstractContextManager["FolderLease"]):
    """A lease in a diskcache folder: an exclusive flock on `lease-<id>.lock`, which holds the
    holder's description. The file is never removed: removing it while another process has it
    open would let a third lock a new file beside the old one."""

    def __init__(self, directory: Path, name: str, holder: str) -> None:
        self.path = directory / f"lease-{lease_id(name):08x}.lock"
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CacheError(f"{self.path}: cannot open the run's lease file ({exc}); check the "
                             "cache folder's permissions or pass --cache-dir") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(self._fd, 4096, 0).decode(errors="replace")
            os.close(self._fd)
            raise held_error(str(directory), name, text) from None
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, holder.encode(), 0)
        except OSError as exc:
            # The flock holds without it: on a full disk a second run names no holder, and a
            # fully cached job still reports.
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                self.release()
                raise CacheError(f"{self.path}: cannot write the run's lease file ({exc}); "
                                 "check the cache folder's permissions") from None

    def release(self) -> None:
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # the kernel drops the flock with it
        self._fd = -1

    def __exit__(self, *exc: object) -> None:
        self.release()
