"""The pool's answers on their way into the cache: stored a turn at a time (group commit, see
`Commits`), and held while the cache folder's disk is full.

A full disk (a DiskFullError from a cache folder) must not cost an answer: dropped, the rerun
bought it again (3 runs of 3 on a 1.2 MB tmpfs bought 15-16 answers twice). So the answers the
disk refused are held in memory, the pool stops dispatching (`until_room`), the user is told
once, and the write is tried again on a timer of the event loop (RETRY_S, doubling to
RETRY_CAP_S: the loop never blocks) until the disk takes them; then they count, the user is
told, and dispatch goes on. A stop meanwhile (Ctrl-C, SIGTERM) writes what is held wherever it
can go (`settle`: Cache.keep, the journal or a spill file outside the folder, named), and the
rerun reads it. A run that would call with the disk already full stops before its first call
(`check_room`): one `Error:` line, nothing bought. Any other refusal (a PostgreSQL server away
past its reconnect window) stops the run, and the answers it refused are kept elsewhere
(CacheBackend.keep: a spill file the next open stores) and count; only if nowhere takes them
are they left for the rerun.

A PostgreSQL server that goes away is waited for the same way, and told in one line when the
wait starts and one when it ends: the pool's cache never waits inside a call
(PgCache.wait_aside: a thread reconnects while its calls raise CacheAwayError), so the answers
are held, dispatch pauses (`hold_off`, also when a lookup or a claim found it away) and the
event loop stays free for the requests in flight, until the server is back or the reconnect
window ends (then they are kept elsewhere, as above).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.errors import CacheAwayError, CacheError, DiskFullError
from runner.execute.store.backend import CacheBackend
from runner.execute.store.cache import Cache
from runner.job.bill import Tokens
from runner.tasks import Task

__all__ = ["Commits", "Pending"]

Pending = tuple[Task, dict[str, Any], Tokens]
"""An answer waiting for its store: the task, its record, its tokens by kind."""

RETRY_S = 0.25  # the first write again of held answers, this long after the disk refused
RETRY_CAP_S = 4.0  # the longest wait between two: space freed is seen within 4 s


class Commits:
    """Group commit: answers handed over in one event-loop turn, stored together.

    `add` queues an answer and, for the first of a turn, schedules `flush` with call_soon, so
    the flush runs after every callback already due: all the answers that arrived together. A
    SQLite transaction costs ~50 us whatever its size, one per answer was a third of the client's
    CPU at zero latency, and one per turn still ~30-40 us an answer: `append` journals them
    (runner/execute/store/journal.py). `on_stored` runs once a turn with the answers stored,
    never before. A failed store (whatever the error: an exception in a loop callback would
    only be logged) stops the run and is raised by `execute` once the workers are done; its
    answers are held (a full disk) or kept elsewhere (module doc), uncounted only if nowhere
    takes them (the rerun asks again).
    """

    def __init__(self, cache: CacheBackend, loop: asyncio.AbstractEventLoop,
                 on_stored: Callable[[list[Pending]], None],
                 on_failed: Callable[[list[Task]], None],
                 say: Callable[[str], None]) -> None:
        self.cache, self.loop, self.say = cache, loop, say
        self.on_stored, self.on_failed = on_stored, on_failed
        self.pending: list[Pending] = []
        self.error: Exception | None = None
        """The first failed commit's error (a CacheError when the disk refused)."""
        self.held: list[Pending] = []
        """Answers a full disk refused, oldest first; while there are some, every turn's
        answers join them (a key's later record stays later)."""
        self.room = asyncio.Event()
        """Set while nothing is held: the pool may dispatch."""
        self.room.set()
        self._retry: asyncio.TimerHandle | None = None
        self._told_kept = False  # the user told where refused answers are kept
        self._delay = RETRY_S
        self._spilled_keys: set[str] = set()  # written to a spill file while the database is away
        self._away: CacheAwayError | None = None  # what the answers are held for: a database
        self._since = 0.0  # when the hold began (loop time)
        self._aside: Callable[[bool], None] | None = getattr(cache, "wait_aside", None)
        """A PostgreSQL cache's PgCache.wait_aside, looked up: importing pgcache here would
        import psycopg into every run."""
        if self._aside is not None:
            self._aside(True)

    def add(self, task: Task, record: dict[str, Any], tokens: Tokens) -> None:
        """Queue an answer, stored with the others of this event-loop turn.

        Args:
            task: the task answered.
            record: its record (store/cache.answer_record).
            tokens: its usage by kind, for the bill.
        """
        if not self.pending:
            self.loop.call_soon(self.flush)
        self.pending.append((task, record, tokens))

    def flush(self) -> None:
        """Store what is pending now (also called directly when `execute` ends)."""
        batch, self.pending = self.pending, []
        if not batch:
            return
        if self.held:  # the disk is full: written again with the held ones
            self.held += batch
            self._set_aside(batch)
            return
        self._store(batch)

    def _store(self, batch: list[Pending]) -> None:
        try:
            self.cache.append([(task.key, record) for task, record, _ in batch])
        except (DiskFullError, CacheAwayError) as exc:
            self._hold(batch, exc)
            return
        except CacheError as exc:
            self.error = self.error or exc
            self._keep_elsewhere(batch)
            return
        except Exception as exc:  # noqa: BLE001 - a callback's error would only be logged
            self.error = self.error or exc
            self.on_failed([task for task, _, _ in batch])
            return
        self.on_stored(batch)

    def _keep_elsewhere(self, batch: list[Pending]) -> None:
        """The cache refused `batch` for good (a PostgreSQL server away past its reconnect
        window): the run stops with that error, but the answers, paid for, are kept in a spill
        file that the next open of the cache stores (CacheBackend.keep), and count; if nowhere
        takes them they are left for the rerun."""
        gave_up = "" if self._away is None else \
            f"cache database at {self._away.place}: gave up after {self._waited}; "
        if self._keep(batch, lambda where: None if self._told_kept else (
                f"{gave_up}answers the cache did not take are kept in "
                f"{where.parent if where else 'its journal'}; the next run stores them")):
            self._told_kept = True  # once: every later answer goes the same way, and folder
            self.on_failed([])  # stops the run: every later answer comes here too

    def _keep(self, batch: list[Pending], told: Callable[[Path | None], str | None]) -> bool:
        """Hand `batch` to CacheBackend.keep: kept, the user is told `told(where)` (where: the
        spill file, None for the journal) and the answers count; if nowhere takes them, the
        error is kept for `execute` and they are left for the rerun. Returns whether kept."""
        try:
            where = self.cache.keep([(task.key, record) for task, record, _ in batch])
        except Exception as exc:  # noqa: BLE001 - raised by execute, after the workers
            self.error = self.error or exc
            self.on_failed([task for task, _, _ in batch])
            return False
        if (message := told(where)) is not None:
            self.say(message)
        self.on_stored(batch)
        return True

    def hold_off(self, away: CacheAwayError) -> None:
        """A lookup or a claim found the cache's database away: dispatch pauses until it is
        back, as for a refused store.

        Args:
            away: the error the lookup raised.
        """
        self._hold([], away)

    def _hold(self, batch: list[Pending], refusal: Exception) -> None:
        """The store refused `batch` (a full disk, a database away): held, dispatch paused,
        the user told, a retry set."""
        self.held = batch + self.held
        self._set_aside(batch)
        if self._retry is None:
            if self.room.is_set():
                self.room.clear()
                self._away = refusal if isinstance(refusal, CacheAwayError) else None
                self._since = self.loop.time()
                self.say(str(refusal) if self._away else f"cache disk full at {self._folder}: "
                         "free space; the run continues by itself (Ctrl-C to stop, nothing is "
                         "lost)")
                self._delay = RETRY_S
            else:
                self._delay = min(RETRY_CAP_S, self._delay * 2)
            self._retry = self.loop.call_later(self._delay, self._write_held)

    def _set_aside(self, batch: list[Pending]) -> None:
        """Every answer held (the disk full, the database away) is also written at once where
        it survives a kill -9 (CacheBackend.keep: the journal if it takes it now, else a spill
        file outside the folder, on this machine; the next open stores it), so a kill -9
        during the wait loses none. Once there is room the held copies are stored too, and
        storing an answer twice under its key changes nothing. A spill refused (no folder has
        room) leaves them held in memory only."""
        new = [(task.key, record) for task, record, _ in batch
               if task.key not in self._spilled_keys]
        if not new:
            return
        try:
            self.cache.keep(new)
        except (CacheError, OSError):
            return
        self._spilled_keys.update(key for key, _ in new)

    @property
    def _waited(self) -> str:
        return f"{self.loop.time() - self._since:.0f} s"

    @property
    def _folder(self) -> Path:
        assert isinstance(self.cache, Cache), "only a cache folder says its disk is full"
        return self.cache.directory

    def _write_held(self) -> None:
        """The retry: the held answers written again; stored, they count and dispatch goes
        on."""
        self._retry = None
        batch, self.held = self.held, []
        self._store(batch)
        if not self.held:
            self.room.set()
            if self.error is None:
                self.say((f"cache database at {self._away.place}: back after {self._waited}, "
                          if self._away else f"cache disk at {self._folder}: room again, ")
                         + f"{len(batch)} held answers stored; the run goes on")
            self._away = None  # a later refusal is not this wait's end

    async def until_room(self, stop: asyncio.Event) -> None:
        """Wait while answers are held (the disk full, the database away): until they are
        stored or `stop` is set.

        Args:
            stop: set when the run stops.
        """
        if self.room.is_set() or stop.is_set():
            return
        waits = [asyncio.ensure_future(self.room.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def check_room(self) -> None:
        """Before the first call (and before its keys are claimed, which takes space too): a
        cache folder's disk with no room is DiskFullError (one `Error:` line) before any call,
        where a run would buy answers only to hold them. A run with nothing to call never
        checks: it reads, needing no space."""
        if isinstance(self.cache, Cache):
            self.cache.check_room()

    def settle(self) -> None:
        """At the end (a stop while the disk is full or the database away): what is held is
        written wherever it can go (CacheBackend.keep) and counts, the user told where; if
        nowhere takes it, it is left for the rerun and the error raised by `execute`."""
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        batch, self.held = self.held, []
        self.room.set()
        if not batch:
            return
        self._keep(batch, lambda where: (
            (f"cache database at {self._away.place} unreachable" if self._away else
             f"cache disk full at {self._folder}") + f": {len(batch)} held answers written to "
            f"{where or 'its journal'}; the rerun reads them (keep the file until then)"))

    def close(self) -> None:
        """The pool is done: the cache's calls wait for an away database inline again."""
        if self._aside is not None:
            self._aside(False)

    def fold(self) -> None:
        """At the end: every stored answer visible to the next stage's reader processes. A
        full disk leaves them in the journal, where this process and its readers read them
        and the next open folds them; any other failure is raised by `execute` (the answers
        still in the journal)."""
        try:
            self.cache.fold()
        except DiskFullError:
            pass
        except Exception as exc:  # noqa: BLE001 - raised by execute, after the workers
            self.error = self.error or exc
