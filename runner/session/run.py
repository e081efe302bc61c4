"""One run on its road, `judge run`'s and `runner.run`'s alike: select -> serve -> cached first ->
pool -> report.

`api.selection` is the select phase (a WorkingSet); a Run takes it the rest of the way, one
method a phase. Its caller brings where the keys are read (`environ`), how the pool is stopped
(an asyncio.Event) and where progress and messages go. Nothing here prints or exits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runner.execute.stats import RunStats
from runner.execute.store.backend import CacheBackend
from runner.execute.store.lease import describe, lease_name
from runner.job.spec import Job
from runner.reduce.judgments import CachedFirst, Judgment
from runner.session.pool import TaskLog, run_pool
from runner.session.report import judged_dispatched, write_run_reports
from runner.session.select import (
    WorkingSet,
    check_budget,
    check_keys,
    check_until_ci,
    key_reader,
    open_selected,
)
from runner.session.serve import serving

if TYPE_CHECKING:
    from runner.report.write import Tables

__all__ = ["CACHED_FIRST_TASKS", "Run"]

CACHED_FIRST_TASKS = 20_000
"""From this many tasks, a run judges the cached ones first (see Run.cached_first); a smaller
run gains little from it."""


@dataclass(slots=True)
class Run:
    """A run of one working set, from its checks to its reports.

    The phases, in order: `check` and `lease` (before any call), `serve` (the cache opened and
    the local servers started), then either `pool` and `report`, or `cached_first` (which
    judges the cached tasks and hands the rest to the pool as the reports are written).
    """

    sel: WorkingSet
    """The working set; `pool` replaces it with the generated data sets derived."""
    started: float
    """When the run started (seconds since the epoch), for the manifest."""
    command: str
    """The command line (or API call), for the manifest."""
    environ: Mapping[str, str]
    """Where the API keys are read, at call time (never stored)."""
    offline: bool = False
    """No call: what is not cached is counted as not run."""
    budget: float | None = None
    """Stop dispatching before the estimated spend passes this many USD."""
    in_batches: frozenset[str] = frozenset()
    """Keys a live provider batch holds: never called, counted as not run."""
    dispatched: TaskLog = field(default_factory=TaskLog)
    """The judge tasks the pool dispatched, for the reports."""
    _leased: CacheBackend | None = field(default=None, init=False, repr=False)
    """The cache `lease` opened, while it holds the lease (see `opened`)."""

    def check(self, *, batch: bool = False) -> None:
        """Every key the job needs is set and --budget can be kept (an offline run needs
        neither), and --until-ci can run this job.

        Args:
            batch: the run goes through a provider batch (--batch, or a model in batch mode).

        Raises:
            MissingKeyError: a model or endpoint without its key.
            ConfigError: a budget with a model without a price; --until-ci with a shard, a
                batch or a generation stage.
        """
        if not self.offline:
            check_keys(self.sel.job, self.environ)
            check_budget(self.sel.job, self.budget)
        check_until_ci(self.sel.job, sharded=self.sel.shard is not None, batch=batch)

    @contextlib.contextmanager
    def lease(self, holder_command: str | None = None) -> Iterator[None]:
        """The run's lease on (cache, job, shard) for the block, before any call: a second run
        of this job on this cache stops here, naming the first (runner/execute/store/lease.py).
        An offline run takes none (it makes no call), as rescore.

        Args:
            holder_command: the command the lease's description names [default: this
                process's command line].
        """
        if self.offline:  # nor opens the cache for writing: a read-only one reads as it is
            yield
            return
        shard = None if self.sel.shard is None else str(self.sel.shard)
        with open_selected(self.sel) as cache, \
                cache.lease(lease_name(self.sel.job.name, shard), describe(holder_command)):
            self._leased = cache
            try:
                yield
            finally:
                self._leased = None

    @contextlib.contextmanager
    def serve(self) -> Iterator[tuple[CacheBackend, Job]]:
        """The cache (`opened`) and, unless offline, the local servers of `local:` models
        started.

        Yields:
            The open cache, and the job with its local servers' base URLs.
        """
        servers = contextlib.nullcontext(self.sel.job) if self.offline else serving(self.sel.job)
        with self.opened() as cache, servers as served:
            yield cache, served

    def opened(self) -> contextlib.AbstractContextManager[CacheBackend]:
        """The run's cache: the lease's while it is held, so that the batch stage, a cached-first
        pass and the pool share one connection and one journal (what one stored, the others
        see), else the selection's, opened (offline, for reading only).

        Returns:
            The cache, to open with `with`.
        """
        if self._leased is not None:
            return contextlib.nullcontext(self._leased)
        return open_selected(self.sel, read_only=self.offline)

    async def pool(self, cache: CacheBackend, served: Job, *, stop: Any,
                   on_progress: Callable[[RunStats], None],
                   say: Callable[[str], None] = lambda message: None,
                   cached_first: CachedFirst | None = None) -> RunStats:
        """The pool over the working set.

        Args:
            cache, served: `serve`'s.
            stop, on_progress, say, cached_first: as for runner.session.pool.run_pool.

        Returns:
            The counters; `sel` now holds the generated data sets.
        """
        stats, self.sel = await run_pool(
            self.sel, served, cache, stop=stop, key_reader=key_reader(self.environ),
            offline=self.offline, budget=self.budget, on_progress=on_progress,
            dispatched=self.dispatched, in_batches=self.in_batches, cached_first=cached_first,
            say=say)
        return stats

    def report(self, stats: RunStats, extra: Mapping[str, Any] | None = None) -> Tables:
        """The reports of the tasks the pool dispatched, written into sel.out_dir.

        Args:
            stats: the pool's counters; extra: more manifest keys (the batch stage's).

        Returns:
            The reports' tables.
        """
        # reads only (an offline run's folder may be read-only); the manifest once judged:
        # damaged records are failures
        with open_selected(self.sel, read_only=True) as cache:
            judgments = judged_dispatched(self.sel, cache, stats, self.dispatched)
            return write_run_reports(self.sel, stats, judgments, started=self.started,
                                     command=self.command, extra=extra)

    def cached_first_count(self) -> int:
        """The run's task count if it can judge its cached tasks first (one shard-less judge
        stage, no generation stage, no --until-ci, CACHED_FIRST_TASKS tasks or more; a cache
        folder or PostgreSQL), else 0."""
        job = self.sel.job
        if self.sel.shard is not None or job.generate or job.limits.until_ci is not None:
            return 0
        count = self.sel.expansion.count()  # ~0.04 s at 100k tasks: counted once for the run
        return count if count >= CACHED_FIRST_TASKS else 0

    def cached_first(self, count: int, *, on_progress: Callable[[RunStats], None],
                     cached_done: Callable[[], None],
                     pool: Callable[[CachedFirst], object]) -> tuple[RunStats, Tables]:
        """A run that judges its tasks in order as rescore does while their answers are
        cached, and hands the first task without one, and every later one, to the pool (then
        judges them as a run does). A fully cached run never starts the pool: it took ~1 s of
        a 100k-task rerun (dispatch, the task log, aiohttp). Reports and counts are the pool's.

        The reports are written in one pass over the judgments, in task order: the pool runs
        while the report writer reads, between the cached judgments and those it dispatched.
        With nothing cached at the start (a first run) the pool runs first, and the reports'
        modules load after it, while the reader of its answers starts (bench/README.md "The
        floors").

        Args:
            count: the run's task count (`cached_first_count`).
            on_progress: called with the counters as the cached answers are read.
            cached_done: called when the cached answers have all been read.
            pool: runs the pool over the rest (`pool`, on the caller's loop and signals).

        Returns:
            The counters, and the reports' tables.
        """
        stats = RunStats()
        stats.total = count
        with self.opened() as cache:  # the lease's: the pool's too, in `pool`
            first = CachedFirst(self.sel.expansion, cache, stats, count=count,
                                on_progress=on_progress)
            judgments: Iterator[Judgment]
            if first.uncached_onward is None:
                judgments = self._cached_then_pooled(first, cache, stats, cached_done, pool)
            else:  # nothing cached at the start: the reports' modules load after the pool
                cached_done()
                pool(first)
                judgments = judged_dispatched(self.sel, cache, stats, self.dispatched)
            # its readers read while the reports' modules load
            tables = write_run_reports(self.sel, stats, judgments, started=self.started,
                                       command=self.command)
        return stats, tables

    def _cached_then_pooled(self, first: CachedFirst, cache: CacheBackend, stats: RunStats,
                            cached_done: Callable[[], None],
                            pool: Callable[[CachedFirst], object]) -> Iterator[Judgment]:
        yield from first
        cached_done()
        if first.uncached_onward is None:  # all cached: repeats counted as the pool counts them
            stats.settle_repeats(first.hashes)
            return
        pool(first)
        yield from judged_dispatched(self.sel, cache, stats, self.dispatched)
