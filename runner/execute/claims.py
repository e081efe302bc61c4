"""In-flight claims: two runs on one cache never buy the same request twice, whoever asks.

The run lease (runner/execute/store/lease.py) keeps two runs of one job apart, but two jobs with
different names whose tasks render the same requests (a copied job file, overlapping studies,
shards whose items render the same request) would each buy every one of them. So the pool
claims, in the cache, the keys it is about to buy: the cache misses of each lookup batch
(backend.LOOKUP_BATCH tasks), in one statement (runner/execute/store/claimtable.py), never the
cached ones. A key claimed by another live run is not bought: its task is deferred, and once
the rest of the run's work is done the run waits for that answer to appear in the cache
(re-checked with a growing pause, at most POLL_S[1]), and buys it itself only if the claim
lapses without an answer (that run failed the task, or stopped, or was killed).

A claim lives as long as its run: the run renews its owner row every TTL_S / 3, so a killed
run's claims lapse TTL_S after its last renewal (`JUDGE_CLAIM_TTL_S` sets it), sooner when
a run on the same host finds its pid dead (a folder) or the server has ended its session
(PostgreSQL). A run gives its
claims back once their answers are stored where other processes read them (with the next
batch's claim or the renewal, after a fold), when a task fails, and when it ends.

What it buys: requests = distinct keys for two and four concurrent runs of overlapping jobs on
one cache, folder or PostgreSQL (tests/test_claims.py; 2x and 4x the requests without it). What
it costs: 6-7.5 us of CPU a sent task on a folder, ~3% of the pool's client CPU an answer at
0 ms, below the noise of `bench/run.py --only throughput` and `--quick --only pgcache`
(bench/README.md, "The claims' cost"). A fully cached run claims nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Sequence

from runner.errors import CacheAwayError, CacheError
from runner.execute.stats import RunStats
from runner.execute.store import claimtable
from runner.execute.store.backend import LOOKUP_BATCH, CacheBackend
from runner.execute.store.claimtable import TTL_S, Owner
from runner.tasks import Task

__all__ = ["POLL_S", "TTL_S", "Claims"]

POLL_S = (0.05, 2.0)
"""First and longest pause between two looks for the answers another run is buying."""


class Claims:
    """One `execute`'s claims on a cache: which keys it may buy, which it waits for.

    Invariants: `held` is every key this run claimed and has not given back; `answered` those
    of them whose answers are stored (given back once other processes can read them);
    `waiting` the deferred tasks, whose keys another live run holds; `ready` deferred tasks
    whose claim this run took over, to buy now.
    """

    def __init__(self, cache: CacheBackend, stop: asyncio.Event, stats: RunStats,
                 on_progress: Callable[[RunStats], None]) -> None:
        self.cache, self.stop, self.stats, self.on_progress = cache, stop, stats, on_progress
        self.owner, self.ttl_s = Owner(), claimtable.ttl_s()
        self.held: set[str] = set()
        self.answered: list[str] = []
        self.waiting: dict[str, Task] = {}
        self.ready: list[Task] = []
        self._lock = asyncio.Lock()  # one worker looks for deferred answers at a time
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._refused_since: float | None = None  # the cache refusing this run's claims

    def take(self, tasks: list[Task]) -> list[Task]:
        """Of `tasks` (cache misses, distinct keys), those this run buys now, in order; the
        others are deferred (claimed by another live run) or counted as cache hits (answered
        by another run since the lookup).

        What it buys: no request bought twice by concurrent runs, for one claim statement
        and one lookup of the claimed keys a batch, and their release later.

        Args:
            tasks: cache misses with distinct keys, in dispatch order.

        Returns:
            The tasks to call now.
        """
        if not tasks:
            return tasks
        if self._timer is None:
            self._timer = self._loop.call_later(self.ttl_s / 3, self._tick)
        self._give_back()
        mine, done = self._claim([task.key for task in tasks])
        send = []
        for task in tasks:
            if task.key in mine:
                send.append(task)
            elif task.key not in done:  # another live run buys it
                self.waiting[task.key] = task
        self.stats.waiting = len(self.waiting)
        return send

    def stored(self, keys: Iterable[str]) -> None:
        """These keys' answers are stored: give them back once other processes read them.

        Args:
            keys: the keys just stored.
        """
        self.answered.extend(keys)

    async def deferred(self) -> Task | None:
        """The next deferred task to buy (its claim lapsed without an answer); None once every
        deferred answer is in the cache or the run stops (the rest are listed as not run)."""
        async with self._lock:
            pause = POLL_S[0]
            while not self.ready:
                if not self.waiting:
                    return None
                if self.stop.is_set():
                    self._not_run()
                    return None
                if self._settle():
                    pause = POLL_S[0]
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop.wait(), timeout=pause)
                pause = min(pause * 2, POLL_S[1])
            return self.ready.pop()

    def _settle(self) -> bool:
        """Look once for the deferred answers: count those now stored, take over the lapsed
        claims (into `ready`). Returns whether anything changed."""
        self._give_back()  # this run's answers visible to the run waiting for them
        keys = list(self.waiting)
        try:
            found = self.cache.has_many(keys)
            self._hits(len(found))
            mine, done = self._claim([key for key in keys if key not in found], waiting=True)
        except CacheAwayError:  # the database away for now: looked for again later
            return False
        except CacheError as exc:  # the cache is gone (a database away past its window):
            self.stats.fatal = self.stats.fatal or str(exc)  # the run stops, as the pool's
            self.stop.set()  # own lookups would stop it; requests in flight are not cancelled
            return False
        self.ready.extend(self.waiting[key] for key in mine)
        for key in [*found, *mine, *done]:
            del self.waiting[key]
        self.stats.waiting = len(self.waiting)
        self.on_progress(self.stats)  # the progress line goes on while this run waits
        return bool(found or mine or done)

    def _claim(self, keys: Sequence[str], *, waiting: bool = False
               ) -> tuple[set[str], set[str]]:
        """Claim `keys`: those to buy, and those found stored after all (another run stored
        the answer and gave its claim back between the lookup and the claim: cache hits, the
        claims given back at once). A cache that refuses the claims (a full disk, a database
        away) has the store's own error handling: all of `keys` are sent, as without claims;
        but keys another live run was found buying (`waiting`) are waited for until the cache
        has refused for TTL_S (by then that run's claims have lapsed anyway), not bought at
        the first refusal. A database away for now (CacheAwayError) is the caller's to wait
        for (claims are idempotent: asked again, the same ones are this run's)."""
        mine: set[str] = set()
        try:
            for start in range(0, len(keys), LOOKUP_BATCH):
                mine |= self.cache.claim(keys[start:start + LOOKUP_BATCH], self.owner,
                                         self.ttl_s)
        except CacheAwayError:
            raise
        except CacheError:  # claims save money, never stop a run: send as without them
            now = self._loop.time()
            self._refused_since = self._refused_since or now
            if waiting and now - self._refused_since < self.ttl_s:
                return set(), set()
            return set(keys), set()
        self._refused_since = None
        self.held |= mine
        done = self.cache.has_many(list(mine)) if mine else set()
        if done:
            self.give_up(done)
            self._hits(len(done))
            mine -= done
        return mine, done

    def _hits(self, count: int) -> None:
        if count:
            self.stats.cache_hits += count
            self.on_progress(self.stats)

    def _give_back(self) -> None:
        """Release the claims of the stored answers, once other processes can read them (a
        folder's appended answers are folded first); kept for later if the fold fails."""
        if not self.answered:
            return
        try:
            self.cache.fold()
        except CacheError:
            return
        answered, self.answered = self.answered, []
        self.give_up(answered)

    def give_up(self, keys: Iterable[str]) -> None:
        """Give these claims back (answered, or not bought after all: a task failed, the
        budget ran out), free for another run at once; if the cache refuses, they lapse with
        the run.

        Args:
            keys: the keys released now.
        """
        keys = [key for key in keys if key in self.held]
        self.held.difference_update(keys)
        with contextlib.suppress(CacheError):
            for start in range(0, len(keys), LOOKUP_BATCH):
                self.cache.release_claims(self.owner, keys[start:start + LOOKUP_BATCH])

    def _not_run(self) -> None:
        """The deferred tasks left are not run (the run stops): listed as missing."""
        self.stats.missing.extend(self.waiting)
        self.waiting.clear()
        self.stats.waiting = 0

    def _tick(self) -> None:
        """Renew this run's claims (every TTL_S / 3), giving back the answered ones."""
        self._timer = self._loop.call_later(self.ttl_s / 3, self._tick)
        with contextlib.suppress(CacheError):
            self.cache.renew_claims(self.owner, self.ttl_s)
        self._give_back()

    def close(self) -> None:
        """The run ends (its answers folded): every claim given back, the owner removed; the
        deferred tasks left are not run."""
        if self._timer is None:
            return
        self._timer.cancel()
        self._not_run()
        self.give_up(list(self.held))
        with contextlib.suppress(CacheError):
            self.cache.release_claims(self.owner, [], last=True)
