"""The pool phase of a run: the generation stage (if any), then the judge tasks, through the
pool; the log of the judge tasks it dispatched, for the reports.
"""

from __future__ import annotations

from array import array
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from runner.execute.stats import RunStats
from runner.execute.store.backend import CacheBackend
from runner.expand_ahead import with_key_index
from runner.job.spec import Job
from runner.reduce.judgments import READ_BATCH, CachedFirst
from runner.session.select import WorkingSet, derive
from runner.tasks import Task, new_task

if TYPE_CHECKING:
    from runner.reduce.stopping import UntilCI

__all__ = ["TaskLog", "run_async", "run_pool"]


T = TypeVar("T")


def run_async(work: Awaitable[T]) -> T:
    """`asyncio.run(work)` on asyncio's own event loop (not uvloop's: bench/README.md "What each
    mechanism buys"), without handing asyncio its result.

    On Python 3.11, asyncio.run formats the repr of its main task, result included, when it
    restores its SIGINT handler (signal.getsignal tries the handler, a partial holding the
    task, as a signal.Handlers value and builds the ValueError's message). Results hold sets
    of keys and working sets: a WorkingSet of 25k items took 0.5 s and 70 MB to format.

    Args:
        work: the coroutine to run.

    Returns:
        Its result.
    """
    import asyncio  # here: ~65 ms that rescore and a fully cached run never need

    box: list[T] = []

    async def main() -> None:
        box.append(await work)

    with asyncio.Runner() as runner:
        runner.run(main())
    return box[0]


async def run_pool(sel: WorkingSet, served: Job, cache: CacheBackend, *, stop: Any,
                   key_reader: Callable[[str], Callable[[], str | None]], offline: bool,
                   budget: float | None, on_progress: Callable[[RunStats], None],
                   dispatched: TaskLog, in_batches: frozenset[str] = frozenset(),
                   cached_first: CachedFirst | None = None,
                   say: Callable[[str], None] = lambda message: None
                   ) -> tuple[RunStats, WorkingSet]:
    """Generation stage (if any), then every judge task, through the pool.

    Args:
        sel: the selection (with --shard: only its shard's tasks run).
        served: sel.job with the base URLs of the local servers `serving` started.
        cache: the selection's open cache.
        stop: an asyncio.Event: set, the pool dispatches nothing more.
        key_reader: variable name -> its API key's reader (see `key_reader`).
        offline, budget, dispatched, in_batches: as the fields of runner.session.run.Run.
        on_progress: called with the counters as the pool goes.
        cached_first: a CachedFirst pass that judged the tasks before `cached_first.uncached_onward`
            (a job without a generation stage): the pool runs the rest, with its counters.
        say: prints a line for the user (a full cache disk, and when it has room again).

    Returns:
        The counters, and the selection with the generated data sets derived from the
        generators' answers.
    """
    # Here, not at the top: aiohttp and the pool took 0.41 s and 0.55 s to import after
    # runner.cli.main (this 2-core box, loaded), which plan, status and the report commands
    # would pay for nothing.
    import aiohttp

    from runner.execute.pool import Endpoint, execute
    endpoints = {m.name: Endpoint(model=m, base_url=m.base_url or "",
                                  api_key=key_reader(m.api_key_env), key_reader=key_reader)
                 for m in served.models}
    limits = sel.job.limits
    connector = aiohttp.TCPConnector(limit=limits.concurrency, limit_per_host=0)
    stats = RunStats() if cached_first is None else cached_first.stats
    async with aiohttp.ClientSession(connector=connector) as session:
        run = {"cache": cache, "session": session, "endpoints": endpoints, "limits": limits,
               "stop": stop, "offline": offline, "budget": budget, "stats": stats,
               "on_progress": on_progress, "say": say}
        if sel.job.generate:
            stats.total += sel.expansion.generation_count()
            generation = sel.expansion.generation_tasks()
            await execute(_not_in_batches(generation, in_batches, stats), **run)
            if stop.is_set():
                return stats, sel
            sel = derive(sel)  # judge what the generators answered
        until = _until_ci(sel, cache, stats) if cached_first is None else None
        logged = _logged(_judge_tasks(sel, cache, stats, cached_first, until), dispatched)
        await execute(_not_in_batches(logged, in_batches, stats), **run,
                      hashes=None if cached_first is None else cached_first.hashes,
                      holds=None if until is None else until.holds)
    if until is not None:
        stats.until_ci = until.verdicts(stopped=stop.is_set())
    return stats, sel


def _judge_tasks(sel: WorkingSet, cache: CacheBackend, stats: RunStats,
                 cached_first: CachedFirst | None, until: UntilCI | None) -> Iterator[Task]:
    """The judge stage's tasks for the pool, counted into `stats.total`: every one (their keys
    kept as the job's key index, without a shard or --until-ci), those --until-ci hands out, or
    the rest after a CachedFirst pass (which counted them)."""
    if cached_first is not None:
        assert cached_first.uncached_onward is not None, "a fully cached pass needs no pool"
        return cached_first.uncached_onward
    count = sel.expansion.count()
    stats.total += count
    tasks = sel.expansion.tasks() if until is None else until.tasks()
    if sel.shard is None and until is None:  # the job's keys, kept for its rescore
        tasks = with_key_index(cache, sel.expansion, READ_BATCH, count, tasks)
    return tasks


def _until_ci(sel: WorkingSet, cache: CacheBackend, stats: RunStats) -> UntilCI | None:
    """The --until-ci rule of the run (limits.until_ci), its order the --sample draw's."""
    # here, not at the top: it imports numpy (~0.15 s, and BLAS threads, which would keep
    # runner.expand_ahead from forking) for every command that imports this module
    from runner.reduce.stopping import UntilCI
    width = sel.job.limits.until_ci
    seed = sel.task_selection.seed or 0
    return None if width is None else UntilCI(sel.expansion, cache, stats, width, seed)


class TaskLog:
    """The judge tasks a run dispatched, in order, for the reports to judge afterwards instead
    of expanding the job a second time: ~42 bytes a task where a list of Tasks without bodies
    held ~230 (10M tasks: ~0.4 GB instead of 2.3 GB).

    Per task: its sha256 key as 32 bytes, the index of its (data set, item id, members) and the
    index of its (prompt, aspect, model, sample). Consecutive tasks of one item share the first
    (one tuple an item), and a job has few of the second. Tasks come back without their bodies
    and token estimates (body b"", prompt_tokens and max_tokens 0): the reports read neither.
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._keys = bytearray()
        self._units: list[tuple[str, str, tuple[str, ...]]] = []
        self._unit_of = array("I")
        self._kinds: list[tuple[str, str, str, int]] = []
        self._kind_index: dict[tuple[str, str, str, int], int] = {}
        self._kind_of = array("H")

    def __len__(self) -> int:
        return len(self._unit_of)

    def append(self, task: Task) -> None:
        """Log `task` (its key, item and kind; not its body).

        Args:
            task: a task handed to the pool.
        """
        self._keys += bytes.fromhex(task.key)
        unit = (task.dataset, task.item_id, task.members)
        if not self._units or self._units[-1] != unit:
            self._units.append(unit)
        self._unit_of.append(len(self._units) - 1)
        kind = (task.prompt, task.aspect, task.model, task.sample)
        index = self._kind_index.get(kind)
        if index is None:
            index = self._kind_index[kind] = len(self._kinds)
            self._kinds.append(kind)
        self._kind_of.append(index)

    def drain(self) -> Iterator[Task]:
        """The tasks once, in order; the log is emptied when they have all been read (the
        reports read it once, and hold their own tables after it)."""
        yield from self
        self.clear()

    def __iter__(self) -> Iterator[Task]:
        keys, units, kinds = memoryview(self._keys), self._units, self._kinds
        for i, (unit, kind) in enumerate(zip(self._unit_of, self._kind_of, strict=True)):
            dataset, item_id, members = units[unit]
            prompt, aspect, model, sample = kinds[kind]
            yield new_task(key=keys[32 * i:32 * i + 32].hex(), dataset=dataset,
                           item_id=item_id, prompt=prompt, aspect=aspect, model=model,
                           sample=sample, body=b"", prompt_tokens=0, max_tokens=0,
                           members=members)


def _logged(tasks: Iterator[Task], log: TaskLog) -> Iterator[Task]:
    """Pass tasks through, appending each to `log` for the reports (see TaskLog)."""
    for task in tasks:
        log.append(task)
        yield task


def _not_in_batches(tasks: Iterator[Task], in_batches: frozenset[str], stats: RunStats
                    ) -> Iterator[Task]:
    """The tasks whose key no live provider batch holds; the others are counted as not run
    (stats.missing)."""
    for task in tasks:
        if task.key in in_batches:
            stats.missing.append(task.key)
        else:
            yield task
