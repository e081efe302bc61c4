"""The stream of tasks to send, which every worker of the pool (runner.execute.pool) pulls.

Cache hits and repeated keys are counted and skipped, looked up in batches
(cached_flag_batches). Before they are sent, the keys of each batch of cache misses are claimed
in the cache (runner/execute/claims.py): a key another live run is buying waits for that run's
answer. Under --budget the claimed tasks are reserved at their estimated cost. Once the run
stops (or is offline, or over budget) the rest are listed as missing, not sent.

The stream is a plain generator (no await inside, so one worker's `next` ends before another's
starts): a dispatcher task feeding a queue cost a task switch per answer at zero latency.
"""

from __future__ import annotations

import array
import asyncio
from collections.abc import Callable, Iterable, Iterator, Mapping

from runner.errors import CacheAwayError
from runner.estimate import estimate_cost
from runner.execute.claims import Claims
from runner.execute.commits import Commits
from runner.execute.stats import RunStats
from runner.execute.store.backend import CacheBackend, cached_flag_batches
from runner.job.spec import ModelSpec
from runner.tasks import Task, task_key

__all__ = ["Dispatch"]


class Dispatch:
    """What the stream of tasks to send shares with the workers that pull it: the run's
    counters, the claims on the keys it sends, the commits (the cache disk's room, its
    database away) and --budget's reservations.

    Args:
        cache: the open cache.
        stats: the run's counters.
        commits: the pool's group commit (runner.execute.commits).
        stop: set when the run stops (the first Ctrl-C, a fatal error).
        on_progress: called with the counters when they change.
        models: model name -> its spec (its price, for --budget).
        budget: --budget in dollars, None without one.
    """

    def __init__(self, cache: CacheBackend, stats: RunStats, commits: Commits,
                 stop: asyncio.Event, on_progress: Callable[[RunStats], None],
                 models: Mapping[str, ModelSpec], budget: float | None) -> None:
        self.cache, self.stats, self.commits, self.stop = cache, stats, commits, stop
        self.on_progress, self.models, self.budget = on_progress, models, budget
        self.claims = Claims(cache, stop, stats, on_progress)  # keys bought by this run only

    def afford(self, tasks: list[Task]) -> list[Task]:
        """Those of `tasks` (claimed: this run buys them) whose cost fits in the budget (none:
        all), reserved; from the first that does not, the run is over its budget and the
        rest are not run, their claims given back. Reserved once claimed, not before: a task
        deferred to another run's claim costs this run nothing unless it takes the claim
        over (deferred ones kept their share before, and stopped the run early).

        Args:
            tasks: claimed tasks, in order.

        Returns:
            The first of them that fit in the budget.
        """
        if self.budget is None:
            return tasks
        stats = self.stats
        for at, task in enumerate(tasks):
            cost = self._reserved_cost(task)
            if stats.budget_stopped or stats.committed_cost + cost > self.budget:
                stats.budget_stopped = True
                stats.missing.extend(task.key for task in tasks[at:])
                self.claims.give_up([task.key for task in tasks[at:]])
                return tasks[:at]
            stats.committed_cost += cost
        return tasks

    def to_call(self, tasks: Iterable[Task], *, offline: bool, hashes: array.array[int]
                ) -> Iterator[Task | None]:
        """The tasks to send, in order: cache hits and repeated keys counted and skipped; once
        the run stops (or is offline, or over budget) the rest are listed as missing, not
        sent. None when a lookup or a claim found the cache's database away
        (commits.hold_off): the worker waits for it to be back, and the next pull asks again.

        Memory stays flat over a cached run: only keys not in the cache (sent or missing) are
        kept in a set, to never send one twice. A repeat of a cached key is told apart
        afterwards from a 64-bit hash of every key, appended to `hashes`
        (RunStats.settle_repeats).

        Args:
            tasks: the tasks, in order.
            offline: send none (--offline): the uncached are listed as missing.
            hashes: the key hashes counted so far, appended to.

        Yields:
            Each task to send, or None while the cache's database is away.
        """
        stats, uncached = self.stats, set()
        repeats_of_uncached, checked = 0, False
        batches = cached_flag_batches(self.cache, tasks, task_key, self._away, ahead=False)
        for batch, flags in batches:
            if not batch:
                yield None
                continue
            hashes.extend([hash(task.key) for task in batch])
            to_send = []
            for task, cached in zip(batch, flags, strict=True):
                if cached:
                    stats.cache_hits += 1
                    self.on_progress(stats)
                    continue
                if task.key in uncached:  # e.g. two parsers over one request: one call serves both
                    stats.duplicates += 1
                    repeats_of_uncached += 1
                    continue
                uncached.add(task.key)
                if offline or self.stop.is_set() or stats.budget_stopped:
                    stats.missing.append(task.key)
                    continue
                to_send.append(task)
            if to_send and not checked:
                self.commits.check_room()
                checked = True
            yield from self._claimed(to_send)
        # Repeats found cached (of a cached key, or of one stored since it was sent) were
        # counted as hits: they are repeats.
        stats.settle_repeats(hashes, repeats_of_uncached)

    def unheld(self, todo: Iterator[Task | None], holds: Callable[[Task], bool]
               ) -> Iterator[Task | None]:
        """The tasks of `todo` but those `holds` holds (--until-ci: a judge whose CIs are
        narrow enough), which are listed as not run and taken off the budget's committed
        spend. Asked as a worker takes the task, not when `to_call` looks its batch up
        (LOOKUP_BATCH tasks ahead), so that `holds` sees the answers stored up to the task's
        dispatch.

        Args:
            todo: the stream `to_call` makes.
            holds: whether a task is held.

        Yields:
            Each task to send, or None while the cache's database is away.
        """
        stats = self.stats
        for task in todo:
            if task is None or not holds(task):  # None: the cache's database away (to_call)
                yield task
                continue
            stats.missing.append(task.key)  # its claim is given back with the others' at the end
            if self.budget is not None:
                stats.committed_cost -= self._reserved_cost(task)

    def _claimed(self, tasks: list[Task]) -> Iterator[Task | None]:
        """Those of `tasks` this run claims (another run's are deferred) and affords; None
        while the cache's database is away, or none if it stays away (listed as missing)."""
        while True:
            try:
                sent = self.claims.take(tasks)  # claimed by another run: deferred
                break
            except CacheAwayError as exc:
                if not self._away(exc):
                    self.stats.missing.extend(task.key for task in tasks)
                    return
                yield None
        yield from self.afford(sent)

    def _away(self, exc: CacheAwayError) -> bool:
        """A lookup or a claim found the cache's database away: dispatch waits for it; whether
        to ask again once it is back (not if the run is stopping)."""
        self.commits.hold_off(exc)
        return self.commits.error is None and not self.stop.is_set()

    def _reserved_cost(self, task: Task) -> float:
        """What --budget counts a task at when it is dispatched: its price at its token
        estimate and max_tokens (0 for a model without a price: check_budget refuses those)."""
        return estimate_cost(self.models[task.model], task.prompt_tokens, task.max_tokens) or 0.0
