"""A PostgreSQL connection that rides out its server's outages: what PgCache
(runner/execute/store/pgcache.py) stands on, apart from its tables.

A server that stops answering (frozen, a dead network path) never blocks a run for good: every
call has a deadline (QUERY_TIMEOUT_S: `statement_timeout` on the server, and a
deadline.Watchdog for a server that itself does not answer); connecting has CONNECT_TIMEOUT_S. A
connection the server drops (a restart, a failover, an idle timeout) or that overran its
deadline is opened again with capped backoff for up to RECONNECT_WINDOW_S (JUDGE_PG_WAIT_S),
the call's answers kept in memory meanwhile (they count only once stored:
runner/execute/pool.py); then the call raises one CacheError naming the server. A run's pool
never waits inside a call (`wait_aside`): a thread reconnects while its calls raise
CacheAwayError at once. Every statement of a PgCache is a read or an idempotent insert, so
running one again after a drop is safe.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, LiteralString, TypeVar

import psycopg
from psycopg import conninfo

from runner.errors import CacheAwayError, CacheError, redact_url
from runner.execute.store.deadline import WAIT_S, Watchdog, waited_s

__all__ = ["AWAY_AFTER_S", "CONNECT_TIMEOUT_S", "QUERY_TIMEOUT_S", "RECONNECT_WINDOW_S",
           "PgSession", "Scrubbed"]

CONNECT_TIMEOUT_S = 10  # libpq's connect_timeout (its least is 2)
QUERY_TIMEOUT_S = 60.0
"""Longest wait for one statement's answer (server-side statement_timeout, and the watchdog)."""
RECONNECT_WINDOW_S = WAIT_S
"""How long a dropped connection is tried again (with capped backoff) before a call fails,
unless JUDGE_PG_WAIT_S says otherwise (deadline.set_wait): `_window`."""
AWAY_AFTER_S = 5.0
"""In a run's pool (`wait_aside`), how long a statement may go unanswered before the server
counts as away: its event loop waits this long once an outage, not up to QUERY_TIMEOUT_S."""
BACKOFF_S = (0.1, 5.0)  # first and longest pause between reconnects
KEEPALIVE_S = (30, 10, 3)  # idle, interval, count: a dead peer or path found in ~1 min

R = TypeVar("R")


class Scrubbed:
    """A database's errors as messages without its URL's password: PgSession's and the batch
    ledger's (runner/execute/pgledger.py)."""

    location: str  # the database, as redact_url shows it
    _password = ""  # the URL's password, taken out of the server's messages

    def _clean(self, exc: Exception) -> str:
        text = " ".join(str(exc).split())
        return text.replace(self._password, "***") if self._password else text

    def _fail(self, what: str, exc: Exception) -> CacheError:
        return CacheError(f"{self.location}: {what} failed ({self._clean(exc)}); check the "
                          "server, then rerun to resume")


class PgSession(Scrubbed):
    """One connection to a database with every deadline set, opened again when the server
    drops it (module doc). A subclass holds its session's state again on the new connection
    (`_restore`)."""

    def __init__(self, url: str) -> None:
        self.location = redact_url(url)
        try:
            parts = conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError:
            raise CacheError("--cache / JUDGE_CACHE_URL is not a valid PostgreSQL URL; write it "
                             "as postgresql://USER@HOST:PORT/DBNAME") from None
        self._password = str(parts.get("password") or "")
        self._spilled = "postgresql://{user}@{host}:{port}/{dbname}".format(**{
            "user": "", "host": "", "dbname": "", **parts, "port": parts.get("port") or 5432})
        """The database as the user reads it, whatever the URL spells (a password,
        `postgres://`, a default port): its user, host, port and name; what names its spill
        files (PgCache.keep)."""
        self._url = url
        self._watchdog = Watchdog(QUERY_TIMEOUT_S)
        self._down: CacheError | None = None  # set when reconnecting failed for the window
        self._lost: CacheError | None = None  # set when the session's state was not held again
        self._aside = False  # `wait_aside`: a call never waits for the server
        self._away: threading.Thread | None = None  # reconnecting while the calls raise
        try:
            self._conn = self._open()
        except psycopg.Error as exc:
            self._watchdog.close()
            raise CacheError(f"{self.location}: cannot connect to the cache ({self._clean(exc)}); "
                             "check --cache / JUDGE_CACHE_URL and that the server is up") from None

    def _open(self) -> psycopg.Connection[tuple[Any, ...]]:
        """A new connection with every timeout set (see the module docstring)."""
        conn = psycopg.connect(self._url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                               tcp_user_timeout=int(QUERY_TIMEOUT_S * 1000), keepalives=1,
                               keepalives_idle=KEEPALIVE_S[0], keepalives_interval=KEEPALIVE_S[1],
                               keepalives_count=KEEPALIVE_S[2])
        try:
            with self._watchdog.armed(conn.fileno(), QUERY_TIMEOUT_S):
                conn.execute("SELECT set_config('statement_timeout', %s, false)",
                             (str(int(QUERY_TIMEOUT_S * 1000)),))
        except BaseException:
            conn.close()
            raise
        return conn

    def _call(self, what: str, call: Callable[[], R]) -> R:
        """`call()` under the deadline; when the connection is dropped or overran it, again on
        a new one (see `_reconnect`). Any other failure is a CacheError."""
        self._not_away()
        since: float | None = None
        while True:
            try:
                if not self._conn.closed:
                    with self._watchdog.armed(self._conn.fileno(), self._deadline):
                        done = call()
                    if self._lost is not None:  # after the call: what it stored is kept
                        raise self._lost
                    return done
                error: Exception = psycopg.OperationalError("the connection is closed")
            except psycopg.OperationalError as exc:
                if not (self._conn.broken or self._watchdog.fired):
                    raise self._fail(what, exc) from None
                error = exc
            except psycopg.Error as exc:
                raise self._fail(what, exc) from None
            since = since if since is not None else time.monotonic()
            if self._aside:
                self._away = threading.Thread(target=self._reconnect_aside, name="pgcache-away",
                                              args=(what, since, error, self._watchdog.fired),
                                              daemon=True)
                self._away.start()
                raise CacheAwayError(self._spilled, self._window)
            self._reconnect(what, since, error, self._watchdog.fired)

    def wait_aside(self, aside: bool = True) -> None:
        """`aside`: from now on a call that finds the server away (dropped, refusing, or
        silent for AWAY_AFTER_S) does not wait for it: a thread reconnects (`_reconnect`)
        while every call raises CacheAwayError at once, until the server is back (the call
        runs) or the thread gave up (its CacheError). Else calls wait inline again.

        What it buys: the pool's event loop is never held by an outage. Held for the whole
        reconnect window, the requests in flight timed out and were sent again: bought twice
        (tests/test_pg_wait.py)."""
        self._aside = aside

    def _not_away(self) -> None:
        """Raise CacheAwayError while a thread reconnects (a patient caller waits for it
        instead), the CacheError of a reconnect that gave up (the run is stopping)."""
        if self._away is not None:
            if self._aside and self._away.is_alive():
                raise CacheAwayError(self._spilled, self._window)
            self._away.join()
            self._away = None
        if self._down is not None:
            raise self._down

    def _reconnect_aside(self, what: str, since: float, error: Exception,
                         timed_out: bool) -> None:
        with contextlib.suppress(CacheError):  # kept in _down or _lost: the next call raises it
            self._reconnect(what, since, error, timed_out)

    def _reconnect(self, what: str, since: float, error: Exception, timed_out: bool) -> None:
        """A new connection, tried with capped backoff until RECONNECT_WINDOW_S after `since`
        (a restart refuses connections for a moment, and trying at once while it shuts down
        only fails), holding the session's state again (`_restore`); else a CacheError naming
        the server."""
        self._conn.close()
        pause = BACKOFF_S[0]
        while (left := since + self._window - time.monotonic()) > 0:
            time.sleep(min(pause, left))
            pause = min(pause * 2, BACKOFF_S[1])
            try:
                conn = self._open()
            except psycopg.Error as exc:
                error, timed_out = exc, timed_out or "timeout" in str(exc)
                continue
            self._conn = conn
            try:
                self._restore()
            except psycopg.Error as exc:
                conn.close()
                error = exc
                continue
            self._revived()
            return
        detail = (f"no reply to {what} within {self._deadline:g} s" if timed_out
                  else f"{what}: {self._clean(error)}")
        self._down = CacheError(f"{self.location}: the PostgreSQL server does not answer "
                                f"({detail}; reconnecting failed for {self._window:g} s); "
                                "check that it is running and reachable, then rerun to resume")
        raise self._down

    @property
    def _window(self) -> float:
        return waited_s(RECONNECT_WINDOW_S)

    @property
    def _deadline(self) -> float:
        return min(AWAY_AFTER_S, QUERY_TIMEOUT_S) if self._aside else QUERY_TIMEOUT_S

    def _restore(self) -> None:
        """What the dropped session held, held again on the new connection (`_conn`); a
        psycopg.Error tries another connection."""

    def _revived(self) -> None:
        """Called once the connection is back (and restored)."""

    def _rows(self, what: str, sql: LiteralString, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        def rows() -> list[tuple[Any, ...]]:
            with self._conn.cursor(binary=True) as cur:
                return cur.execute(sql, params).fetchall()

        return self._call(what, rows)
