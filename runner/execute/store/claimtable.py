"""Where a cache keeps its in-flight claims: which run is buying which key right now.

Two tables, the same on both backends (runner/execute/claims.py uses them):

    owner (id PRIMARY KEY, host, pid, expires)   -- a run that claims; live while expires > now
                                                 -- (PostgreSQL: + backend, its session's pid)
    claim (key PRIMARY KEY, owner)                -- a key being bought, by that run

A claim is live while its owner is: the owner renews one row (not one a key) to stay live, and a
killed run's claims lapse with its row, after the expiry; in a folder also as soon as a run on
the same host finds its pid dead, on PostgreSQL as soon as the server has ended its session. A
key is claimed by one statement for a whole batch: it is inserted, or taken over where its owner
is no longer live, and the keys this run now holds come back (RETURNING). Keys are inserted in
key order, so two runs claiming overlapping batches on PostgreSQL lock their rows in one order
and never deadlock.

- a diskcache folder: `claims.db`, a small SQLite file beside the cache's own, no fsync (a claim
  an OS crash loses only lets another run buy that key, and the crash ends the run too); its
  rollback journal is truncated after each transaction, where a WAL file would grow to ~4 MB
  before a checkpoint, room a nearly full disk keeps for answers;
- PostgreSQL: the tables `judge_claim_owner` and `judge_claim`, created with the cache's,
  UNLOGGED (no write-ahead log: a server crash empties them, which only lets the runs of that
  moment buy their keys again).
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, LiteralString

import orjson

from runner.errors import CacheError
from runner.execute.store.faults import BUSY_MS, transaction

__all__ = ["PG_SCHEMA", "TTL_S", "FolderClaims", "Owner", "pg_claim", "pg_release", "pg_renew",
           "set_ttl", "ttl_s"]

SEP = "\x1f"  # between the keys of a PostgreSQL statement (a key is a hex digest)
TTL_S = 60.0
"""A claim's life after its run's last renewal (renewed every TTL_S / 3)."""

_ttl_s = TTL_S


def set_ttl(seconds: float) -> None:
    """The claims' life for the runs of this process (the cli's JUDGE_CLAIM_TTL_S).

    Args:
        seconds: how long a claim lives unless its owner renews it.
    """
    global _ttl_s
    _ttl_s = seconds


def ttl_s() -> float:
    """The claims' life for the runs of this process.

    Returns:
        The seconds set by set_ttl, else the default.
    """
    return _ttl_s


def _host() -> str:
    """This host as the pids a run sees: its name and its pid namespace (containers that share
    a host name, `--network host`, do not share pids: one must not find another's pid dead)."""
    try:
        return f"{socket.gethostname()} pidns {os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:  # no /proc: the name alone
        return socket.gethostname()


@dataclass(frozen=True, slots=True)
class Owner:
    """A run that claims keys: its host and pid (a folder's runs on one host check the pid),
    and a run id that tells it apart from a later process with the same pid."""

    host: str = field(default_factory=_host)
    pid: int = field(default_factory=os.getpid)
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def id(self) -> str:
        return f"{self.host} pid {self.pid} run {self.run}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


_FOLDER_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS owner (id TEXT PRIMARY KEY, host TEXT NOT NULL, "
    "pid INTEGER NOT NULL, expires REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS claim (key TEXT PRIMARY KEY, owner TEXT NOT NULL) WITHOUT ROWID",
)


class FolderClaims:
    """The claims of a diskcache folder, in `claims.db` in it (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "claims.db"
        try:
            self._db = sqlite3.connect(self.path, timeout=BUSY_MS / 1000, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=TRUNCATE")
            self._db.execute("PRAGMA synchronous=OFF")
            for statement in _FOLDER_SCHEMA:
                self._db.execute(statement)
        except sqlite3.Error as exc:
            raise self._error("open", exc) from None
        self._registered = False

    def _error(self, what: str, exc: Exception) -> CacheError:
        return CacheError(f"{self.path}: cannot {what} the claims of this run ({exc}); check "
                          "the cache folder (its disk, its permissions), then rerun to resume")

    def claim(self, keys: Sequence[str], owner: Owner, ttl_s: float) -> set[str]:
        """As `CacheBackend.claim`; CacheError if the claim table cannot be written."""
        now = time.time()
        with self._transaction("store"):
            self._register(owner, now + ttl_s)
            self._drop_dead(owner, now)
            rows = self._db.execute(
                "INSERT INTO claim (key, owner) SELECT value, ? FROM json_each(?) WHERE true "
                "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner "
                "WHERE claim.owner = excluded.owner OR NOT EXISTS (SELECT 1 FROM owner "
                "WHERE owner.id = claim.owner AND owner.expires > ?) RETURNING key",
                (owner.id, orjson.dumps(list(keys)), now)).fetchall()
        return {key for (key,) in rows}

    def _register(self, owner: Owner, expires: float) -> None:
        self._db.execute("INSERT INTO owner (id, host, pid, expires) VALUES (?, ?, ?, ?) "
                         "ON CONFLICT (id) DO UPDATE SET expires = excluded.expires",
                         (owner.id, owner.host, owner.pid, expires))
        if not self._registered:  # once a run: what killed runs left behind
            self._db.execute("DELETE FROM owner WHERE expires <= ?", (time.time(),))
            self._db.execute("DELETE FROM claim WHERE owner NOT IN (SELECT id FROM owner)")
            self._registered = True

    def _drop_dead(self, owner: Owner, now: float) -> None:
        """Owners on this host whose process is gone (a kill -9): their claims lapse now."""
        for other, pid in self._db.execute("SELECT id, pid FROM owner WHERE host = ? AND "
                                           "id != ? AND expires > ?", (owner.host, owner.id, now)
                                           ).fetchall():
            if not _alive(pid):
                self._db.execute("DELETE FROM owner WHERE id = ?", (other,))

    def renew(self, owner: Owner, ttl_s: float) -> None:
        """As `CacheBackend.renew_claims`; CacheError if the claim table cannot be written."""
        with self._transaction("renew"):
            self._register(owner, time.time() + ttl_s)

    def release(self, owner: Owner, keys: Sequence[str], *, last: bool = False) -> None:
        """As `CacheBackend.release_claims`; CacheError if the claim table cannot be written."""
        with self._transaction("release"):
            self._db.execute("DELETE FROM claim WHERE owner = ? AND key IN "
                             "(SELECT value FROM json_each(?))",
                             (owner.id, orjson.dumps(list(keys))))
            if last:
                self._db.execute("DELETE FROM owner WHERE id = ?", (owner.id,))

    def _transaction(self, what: str) -> contextlib.AbstractContextManager[None]:
        """One transaction; what SQLite raises is the CacheError saying it cannot `what` the
        claims."""
        return transaction(self._db, functools.partial(self._error, what))

    def close(self) -> None:
        self._db.close()


PG_SCHEMA: tuple[LiteralString, ...] = (
    "CREATE UNLOGGED TABLE IF NOT EXISTS judge_claim_owner (id text PRIMARY KEY, "
    "host text NOT NULL, pid integer NOT NULL, expires timestamptz NOT NULL, "
    "backend integer NOT NULL)",
    "CREATE UNLOGGED TABLE IF NOT EXISTS judge_claim (key text PRIMARY KEY, owner text NOT NULL)",
)

_PG_OWNER: LiteralString = (
    "INSERT INTO judge_claim_owner (id, host, pid, expires, backend) VALUES (%(id)s, %(host)s, "
    "%(pid)s, now() + make_interval(secs => %(ttl)s), pg_backend_pid()) ON CONFLICT (id) "
    "DO UPDATE SET expires = excluded.expires, backend = excluded.backend")
_PG_CLAIM: LiteralString = (
    "INSERT INTO judge_claim (key, owner) SELECT k, %(id)s FROM "
    "unnest(string_to_array(%(keys)s, %(sep)s)) AS k ORDER BY k "
    "ON CONFLICT (key) DO UPDATE SET owner = excluded.owner "
    "WHERE judge_claim.owner = excluded.owner OR NOT EXISTS (SELECT 1 FROM judge_claim_owner o "
    "WHERE o.id = judge_claim.owner AND o.expires > now() AND EXISTS (SELECT 1 FROM "
    "pg_stat_activity a WHERE a.pid = o.backend)) RETURNING key")
"""An owner is live while its expiry is ahead and its database session runs: the server ends
a killed client's session at once (as it drops its lease), so its claims lapse then, not at
the expiry. The claim and the renewal record the session they run in (a reconnect's new one)."""


def pg_claim(conn: Any, keys: Sequence[str], owner: Owner, ttl_s: float) -> set[str]:
    """FolderClaims.claim on a psycopg connection (autocommit): the owner's row first, in a
    statement of its own, then the claims. One statement for both let a second run, its claim
    waiting on a key's row, check the owner against a snapshot from before that row was
    committed, find no live owner and take the key too: both bought it.

    Args:
        conn: an autocommit psycopg connection.
        keys, owner, ttl_s: as CacheBackend.claim.

    Returns:
        The keys this owner now holds.
    """
    pg_renew(conn, owner, ttl_s)
    rows = conn.execute(_PG_CLAIM, {"id": owner.id, "keys": SEP.join(keys),
                                    "sep": SEP}).fetchall()
    return {row[0] for row in rows}


def pg_renew(conn: Any, owner: Owner, ttl_s: float) -> None:
    """FolderClaims.renew on a psycopg connection.

    Args:
        conn: an autocommit psycopg connection.
        owner, ttl_s: as CacheBackend.renew_claims.
    """
    conn.execute(_PG_OWNER, {"id": owner.id, "host": owner.host, "pid": owner.pid, "ttl": ttl_s})


def pg_release(conn: Any, owner: Owner, keys: Sequence[str], *, last: bool = False) -> None:
    """FolderClaims.release on a psycopg connection: the rows locked in key order first (as
    claims lock them), so a release and another run's claim never deadlock.

    Args:
        conn: an autocommit psycopg connection.
        owner, keys, last: as CacheBackend.release_claims.
    """
    conn.execute("DELETE FROM judge_claim WHERE key = ANY(ARRAY(SELECT key FROM judge_claim "
                 "WHERE owner = %s AND key = ANY(string_to_array(%s, %s)) ORDER BY key "
                 "FOR UPDATE))", (owner.id, SEP.join(keys), SEP))
    if last:
        conn.execute("DELETE FROM judge_claim_owner WHERE id = %s", (owner.id,))
