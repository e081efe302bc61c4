"""Child processes of this very runner package: a fresh interpreter running `python -m` a
module (`spawn`: the reader and folding processes, whatever threads this one has), or a fork
sharing this process's memory (`Forked`: the expanders of a rescore and the reports' work set
aside), only where `forkable` says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, NoReturn

__all__ = ["Forked", "alive", "forkable", "one_process", "second_core", "spawn"]

_ONE_PROCESS = [False]
"""Set by `one_process`: no child process of the storage layer or the reports."""


def spawn(module: str, *args: str) -> subprocess.Popen[bytes]:
    """`python -P -m module args...` in a fresh interpreter. -P keeps the current folder off
    sys.path (a user's own ./runner would shadow ours), and PYTHONPATH leads to this package."""
    ours = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (ours, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen([sys.executable, "-P", "-m", module, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's counts): the owner of a leftover file
    named by its pid (an upload, a report stage) is gone when this is False."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def one_process(on: bool) -> None:
    """Run every command in this one process (JUDGE_PROCESSES=1, read by the cli): no reader
    or folding child and no forked expander or report, whatever the machine, so that any bug
    can be bisected against the simple path. Results are the same either way; the children
    only buy speed (docs/explanation/processes.md)."""
    _ONE_PROCESS[0] = on


def second_core() -> bool:
    """Whether this process may run on two cores or more: a child process working beside it
    gains nothing on one (nor with `one_process`)."""
    if _ONE_PROCESS[0]:
        return False
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(
        os.cpu_count() or 1)
    return len(cores) >= 2


def forkable() -> bool:
    """Whether forking this process now is safe: Linux (macOS's system libraries are not
    fork-safe), one thread (a fork copies a lock another thread holds, locked forever in the
    child) and memory available for twice this process's resident size (a child that reads
    the tables it shares touches their reference counts, and so copies their pages). Never
    with `one_process`."""
    if _ONE_PROCESS[0]:
        return False
    if sys.platform != "linux" or not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    try:
        status = _fields("/proc/self/status")
        available = int(_fields("/proc/meminfo").get("MemAvailable", "0 kB").split()[0])
    except (OSError, ValueError):
        return False
    resident = int(status.get("VmRSS", "0 kB").split()[0])  # kB, as MemAvailable
    return status.get("Threads") == "1" and available > 2 * resident


def _fields(path: str) -> dict[str, str]:
    """A /proc file of `Name:  value` lines as a dict."""
    with open(path, encoding="ascii") as f:
        return {name: value.strip() for name, _, value in (line.partition(":") for line in f)}


class Forked:
    """A forked child that runs `work(pipe)`, writing to a pipe this process reads (`pipe`),
    and leaves with os._exit: no atexit handler, no flush of buffers it copied, no cleanup of
    what it shares with this process. The child never runs the collector (a collection would
    touch, and so copy, every page it shares) and ignores Ctrl-C (this process decides, and
    stops it). A failure in `work` ends the child with one line on stderr, `name` first; a
    closed pipe (this process stopped reading) ends it quietly. Fork only where `forkable()`
    says so.

    `pipe_size`: the pipe's capacity asked for (Linux; best effort), so that the child can
    write that much ahead without waiting for this process to read. `siblings`: the other
    children's pipes, which this child closes (a child must not hold a sibling's pipe open:
    the sibling would not see this process close it)."""

    def __init__(self, work: Callable[[IO[bytes]], None], name: str, *, pipe_size: int = 0,
                 siblings: Sequence[IO[bytes]] = ()) -> None:
        read, write = os.pipe()
        if pipe_size and hasattr(fcntl, "F_SETPIPE_SZ"):
            with contextlib.suppress(OSError):  # over /proc/sys/fs/pipe-max-size: as it is
                fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, pipe_size)
        pid = os.fork()
        if pid == 0:
            for pipe in siblings:
                with contextlib.suppress(OSError):
                    os.close(pipe.fileno())
            _run_child(work, name, read, write)
        os.close(write)
        self.pid, self.pipe = pid, os.fdopen(read, "rb")

    def reap(self) -> None:
        """Wait for the child to end (it has, or is about to: its pipe was read to the end)."""
        if self.pid:
            os.waitpid(self.pid, 0)
            self.pid = 0
        self.pipe.close()

    def stop(self) -> None:
        """End the child if it is still going (its result is no longer wanted), and reap it."""
        self.pipe.close()  # a child still writing gets EPIPE and leaves
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.reap()


def _run_child(work: Callable[[IO[bytes]], None], name: str, read: int, write: int) -> NoReturn:
    gc.disable()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 0
    try:
        os.close(read)
        with os.fdopen(write, "wb") as out:
            work(out)
    except BrokenPipeError:  # this process stopped reading: nothing more is wanted
        pass
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"{name}: {type(exc).__name__}: {exc}\n".encode(errors="replace"))
        code = 1
    finally:
        os._exit(code)
