"""Every child process judge-runner starts for itself, and how it starts, talks to and ends
them: the one place for them (docs/explanation/processes.md says which command has which).

Two kinds, each with its contract in its class: `Spawned`, a fresh interpreter (the cache
reader), whatever threads this process has, talking in frames (`framed`) over its stdin and
stdout; `Forked`, a fork sharing this process's memory copy-on-write (the forked expanders of a
rescore, a report computed aside), only where `forkable` says so, writing to one pipe.

A child that dies (killed, out of memory) is never an error of the command: its parent does
the child's work itself, so a kill -9 of a child loses nothing. `one_process(True)`
(JUDGE_PROCESSES=1) makes `second_core` and `forkable` false: no child at all, the simple path
any bug can be bisected against. `alive` says whether the process owning a leftover file (an
upload, a report stage, by its pid) still runs.
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

__all__ = ["Forked", "Spawned", "alive", "forkable", "framed", "one_process", "second_core",
           "unframed"]

_LENGTH = 4  # bytes of a frame's length

_ONE_PROCESS = [False]
"""Set by `one_process`: no child process of the storage layer or the reports."""


def framed(data: bytes) -> bytes:
    """`data` as sent through a pipe to or from a child: its 4-byte big-endian length first.

    Args:
        data: one message, at most 4 GiB.

    Returns:
        The frame to write.
    """
    return len(data).to_bytes(_LENGTH, "big") + data


def unframed(pipe: IO[bytes]) -> bytes | None:
    """The next frame's bytes from `pipe`.

    Args:
        pipe: the reading end, positioned at a frame's start.

    Returns:
        The frame's data; None at the end of the pipe, or if the frame was cut short (the
        writer stopped writing it: a child that died).
    """
    if len(head := pipe.read(_LENGTH)) != _LENGTH:
        return None
    size = int.from_bytes(head, "big")
    return data if len(data := pipe.read(size)) == size else None


class Spawned:
    """`python -P -m module args...` in a fresh interpreter, its stdin, stdout and stderr piped
    to this process, until `close`. -P keeps the current folder off sys.path (a user's own
    ./runner would shadow ours), and PYTHONPATH leads to this package."""

    def __init__(self, module: str, *args: str) -> None:
        ours = str(Path(__file__).resolve().parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (ours, os.environ.get("PYTHONPATH")) if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-P", "-m", module, *args], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)

    def send(self, data: bytes) -> bool:
        """Write `data`, one message, as a frame to the child's stdin.

        Args:
            data: one message.

        Returns:
            True when written, False if the child is gone.
        """
        stdin = self.process.stdin
        try:
            assert stdin is not None
            stdin.write(framed(data))
            stdin.flush()
        except (OSError, ValueError):  # BrokenPipeError; or a pipe `end` closed
            return False
        return True

    def receive(self) -> bytes | None:
        """The child's next frame from its stdout; None if it ended (or died writing it)."""
        stdout = self.process.stdout
        if stdout is None or stdout.closed:
            return None
        return unframed(stdout)

    def end(self) -> None:
        """End the child: its stdin and stdout closed (EOF ends it; a reply it is still writing
        fails), then a kill if it has not gone within 10 s."""
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None and not pipe.closed:
                with contextlib.suppress(OSError):  # a write it never read: it is gone anyway
                    pipe.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def last_words(self) -> str:
        """Once ended: the last line it left on stderr, else its exit status."""
        stderr = self.process.stderr
        said = stderr.read().decode(errors="replace").strip() if stderr is not None else ""
        return said.splitlines()[-1] if said else f"exit status {self.process.returncode}"

    def close(self) -> None:
        """End the child and close every pipe to it."""
        self.end()
        if self.process.stderr is not None:
            self.process.stderr.close()


def alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's counts): the owner of a leftover file
    named by its pid (an upload, a report stage).

    Args:
        pid: a process id of this machine.

    Returns:
        False only when no such process exists.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def one_process(on: bool) -> None:
    """Run every command in this one process (JUDGE_PROCESSES=1, read by the cli): no child,
    whatever the machine (see the module's docstring). Results are the same either way; the
    children only buy speed.

    Args:
        on: True to keep every command in this process.
    """
    _ONE_PROCESS[0] = on


def second_core() -> bool:
    """Whether this process may run on two cores or more: a child process working beside it
    gains nothing on one (nor with `one_process`).

    Returns:
        True when the process may use two cores or more and `one_process` is off.
    """
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
    with `one_process`.

    Returns:
        True when a fork now is safe and affordable.
    """
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
