"""A run's lease (store/lease.py) held by a PostgreSQL session, across reconnects.

A session-level advisory lock, which the server drops with the connection (kill -9 included),
described in the judge_lease table (created with the cache's schema, store/pgcache.py). A
reconnect takes the leases again, or stops the run if another run took one meanwhile.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import psycopg

from runner.errors import CacheError
from runner.execute.store import pgsession
from runner.execute.store.lease import held_error, lease_id
from runner.execute.store.pgsession import PgSession

__all__ = ["LEASE_CLASS", "LeasedSession"]

LEASE_CLASS = 0x6A72  # "jr": the first key of a run lease's advisory lock (store/lease.py)

_LEASED: weakref.WeakSet[LeasedSession] = weakref.WeakSet()  # sessions holding a lease
_reviving = threading.Event()  # set while one cache's reconnect checks the others' leases


class LeasedSession(PgSession):
    """A PgSession that holds run leases, taken again on each new connection."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self._leases: dict[int, tuple[str, str]] = {}  # advisory lock -> (name, holder)

    def lease(self, name: str, holder: str) -> PgLease:
        """`CacheBackend.lease`, for as long as this connection lives (see the module
        docstring)."""
        lock = lease_id(name)
        if not self._call("taking the run's lease", lambda: self._take(lock, name, holder)):
            rows = self._rows("reading the lease's holder",
                              "SELECT holder FROM judge_lease WHERE id = %s", (lock,))
            raise held_error(self.location, name, str(rows[0][0]) if rows else "")
        self._leases[lock] = (name, holder)
        _LEASED.add(self)
        return PgLease(self, lock)

    def _take(self, lock: int, name: str, holder: str) -> bool:
        row = self._conn.execute("SELECT pg_try_advisory_lock(%s, %s)",
                                 (LEASE_CLASS, lock)).fetchone()
        if not row or not row[0]:
            return False
        self._conn.execute("INSERT INTO judge_lease (id, name, holder) VALUES (%s, %s, %s) "
                           "ON CONFLICT (id) DO UPDATE SET name = excluded.name, "
                           "holder = excluded.holder, since = now()", (lock, name, holder))
        return True

    def _retake(self) -> None:
        """This cache's leases on a new connection (the old session's locks died with it); a
        CacheError if another run took one meanwhile: this one stops, so no task is called
        by both."""
        for lock, (name, holder) in self._leases.items():
            with self._watchdog.armed(self._conn.fileno(), pgsession.QUERY_TIMEOUT_S):
                if self._take(lock, name, holder):
                    continue
            self._leases.clear()
            self._lost = CacheError(f"{self.location}: {name}: the run's lease was lost while "
                                    "the server was away and another run holds it now; this "
                                    "run stops so that no task is called twice (rerun later "
                                    "to resume)")
            raise self._lost

    def _revived(self) -> None:
        """After a reconnect, the other caches of this process that hold a lease (an idle
        connection does not notice a restart) check theirs, and take it again if it died. A
        lease lost meanwhile makes this cache's calls raise once each has run (`_lost`): the
        run stops, and what the call stored stays stored."""
        if _reviving.is_set():
            return
        _reviving.set()
        try:
            for other in [c for c in _LEASED if c is not self and c._leases]:
                try:
                    other._call("checking the run's lease", other._ping)
                except CacheError as exc:
                    self._lost = self._lost or exc
        finally:
            _reviving.clear()

    def _ping(self) -> None:
        self._conn.execute("SELECT 1")

    def release(self, lock: int) -> None:
        """Give a lease back (once; nothing to do if the connection is gone, which dropped
        it).

        Args:
            lock: the lease's advisory lock id, as `lease` took it.
        """
        if self._leases.pop(lock, None) is None or self._conn.closed or self._conn.broken:
            return
        with (contextlib.suppress(psycopg.Error),
              self._watchdog.armed(self._conn.fileno(), pgsession.QUERY_TIMEOUT_S)):
            self._conn.execute("DELETE FROM judge_lease WHERE id = %s", (lock,))
            self._conn.execute("SELECT pg_advisory_unlock(%s, %s)", (LEASE_CLASS, lock))

    def _restore(self) -> None:
        """On a new connection: this session's leases taken again."""
        self._retake()

    def close(self) -> None:
        for lock in list(self._leases):
            self.release(lock)
        self._watchdog.close()
        self._conn.close()


class PgLease(contextlib.AbstractContextManager["PgLease"]):
    """A run's lease held by a LeasedSession's connection (see LeasedSession.lease)."""

    def __init__(self, cache: LeasedSession, lock: int) -> None:
        self._cache, self._lock = cache, lock

    def release(self) -> None:
        self._cache.release(self._lock)

    def __exit__(self, *exc: object) -> None:
        self.release()
