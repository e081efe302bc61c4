"""A deadline for blocking calls on a socket that the peer may never answer.

store/pgsession.py arms it around every statement: a frozen PostgreSQL server
(SIGSTOP, a hung host behind a live kernel) would otherwise block a run for good, silently.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import weakref
from collections.abc import Iterator

__all__ = ["WAIT_S", "Watchdog", "rest_all", "set_wait", "waited_s"]

WAIT_S = 60.0
"""How long a PostgreSQL cache waits for its server when it goes away, by default."""

_wait_s: float | None = None


def set_wait(seconds: float) -> None:
    """How long this process's PostgreSQL caches wait for a server that went away (the cli's
    JUDGE_PG_WAIT_S; here, not in pgsession, so that setting it imports no psycopg).

    Args:
        seconds: the wait, from the first failed attempt.
    """
    global _wait_s
    _wait_s = seconds


def waited_s(default: float) -> float:
    """The wait set by `set_wait`, else `default` (pgsession.RECONNECT_WINDOW_S).

    Args:
        default: the wait when none was set.

    Returns:
        The wait in seconds.
    """
    return default if _wait_s is None else _wait_s


class Watchdog:
    """Shuts a connection's socket when a call overruns its deadline: the one way to end a wait
    on a server that does not answer. A frozen server's kernel still acknowledges every packet,
    so neither TCP keepalives nor tcp_user_timeout fire, and statement_timeout is the frozen
    server's own. One daemon thread a cache; `armed` wakes it only when the new deadline comes
    before its next wake-up, so a steady stream of calls costs two lock round trips each."""

    def __init__(self, idle_s: float) -> None:
        self._cond = threading.Condition()
        self._due: float | None = None  # the armed call's deadline (monotonic), None: idle
        self._wake_at = 0.0  # when the thread's current wait ends
        self._idle_s = idle_s  # the longest idle wait: a steady stream of calls never wakes it
        self._fd = -1
        self._closed = False
        self._resting = False  # `rest` is ending the thread
        self._thread: threading.Thread | None = None
        _ALL.add(self)
        self.fired = False
        """The last armed call overran its deadline and its socket was shut."""

    @contextlib.contextmanager
    def armed(self, fd: int, seconds: float) -> Iterator[None]:
        """Shut the socket `fd` if the block has not ended within `seconds`.

        Args:
            fd: the connection's socket.
            seconds: the call's deadline, from now.

        Yields:
            Nothing; `fired` says afterwards whether the socket was shut.
        """
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="pgcache-watchdog",
                                                daemon=True)
                self._thread.start()
            self._due, self._fd, self.fired = time.monotonic() + seconds, fd, False
            self._idle_s = seconds
            if self._due < self._wake_at:
                self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._due = None

    def _watch(self) -> None:
        with self._cond:
            while not self._closed and not self._resting:
                now = time.monotonic()
                if self._due is not None and now >= self._due:
                    self._due, self.fired = None, True
                    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._fd)) as s:
                        s.shutdown(socket.SHUT_RDWR)  # libpq's wait ends: the connection is broken
                    continue
                self._wake_at = self._due if self._due is not None else now + self._idle_s
                self._cond.wait(self._wake_at - now)

    def rest(self) -> None:
        """End the thread while no call is armed; the next `armed` starts it again. For a
        process about to fork (runner.children.forkable wants one thread): see rest_all."""
        with self._cond:
            thread, self._thread = self._thread, None
            self._resting = True
            self._cond.notify()
        if thread is not None:
            thread.join()
            _gone(thread.native_id)
        with self._cond:
            self._resting = False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()


def _gone(native_id: int | None) -> None:
    """Wait until the OS thread `native_id` has ended (Linux), a second at most: a joined
    thread can still be listed for a moment, and runner.children.forkable counts the OS's
    threads."""
    task = f"/proc/self/task/{native_id}"
    deadline = time.monotonic() + 1.0
    while native_id is not None and os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.001)


_ALL: weakref.WeakSet[Watchdog] = weakref.WeakSet()
"""Every Watchdog of this process (a run holds two caches: its lease's and its answers')."""


def rest_all() -> None:
    """End every watchdog thread of this process while no call is armed (before a fork);
    each starts again with its cache's next call."""
    for watchdog in list(_ALL):
        watchdog.rest()
