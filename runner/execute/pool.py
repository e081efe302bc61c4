"""The worker pool: cache hit, or limiter -> POST -> store, with retries and a clean stop.

N workers pull from one stream of the tasks to call (cache hits and duplicate keys skipped,
looked up in batches). A response is handed to the store the moment it arrives, with no
`await` in between (group commit, `_Commits`): the answers that arrive in one turn of the event
loop are stored together at the end of that turn (`append`: a diskcache folder writes them to
its journal, one write), and an answer counts as done (in the counters, the progress line and
the manifest) only once that store has returned. A kill -9 loses at most the answers of the turn
in progress, which were never counted; a cancel or an error stores whatever was received before
`execute` returns or raises, and every answer is in SQLite (`fold`) when it does.
Before they are sent, the keys of each batch of cache misses are claimed in the cache
(runner/execute/claims.py): a key another live run is buying waits for that run's answer.
A 429 pauses dispatch for the whole pool for the advised time. Setting `stop` (the first Ctrl-C)
stops dispatching and retrying; in-flight requests finish. Cancelling the caller (the second
Ctrl-C) cancels them.
"""

from __future__ import annotations

import array
import asyncio
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from runner.errors import (
    APIError,
    AuthError,
    ConnectError,
    RequestError,
    RetryableError,
    RunnerError,
)
from runner.execute.breaker import Breaker
from runner.execute.claims import Claims
from runner.execute.client import Response, send, timeout_of
from runner.execute.fleet import Fleet, Replica, fleet_for
from runner.execute.limiter import Limiter
from runner.execute.stats import RunStats
from runner.execute.store.backend import CacheBackend, cached_flag_batches
from runner.execute.store.cache import answer_record
from runner.expand import Task, estimate_cost, task_key
from runner.job.spec import Limits, ModelSpec

__all__ = ["Endpoint", "RunStats", "backoff", "execute"]

Pending = tuple[Task, dict[str, Any], int, int]
"""An answer waiting for its store: the task, its record, its prompt and completion tokens."""

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0


@dataclass(slots=True)
class Endpoint:
    """Where one model of the job is served, resolved at run time."""

    model: ModelSpec
    base_url: str
    api_key: Callable[[], str | None] = lambda: None
    """Returns the key when called (read at call time, never stored)."""
    key_reader: Callable[[str], Callable[[], str | None]] | None = None
    """Variable name -> key reader, for the replicas of `model.endpoints` (each its own key)."""

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


def backoff(attempt: int, retry_after: float | None = None) -> float:
    """Capped exponential backoff with full jitter; a server's Retry-After is a floor."""
    delay = random.uniform(0.5, 1.0) * min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0**attempt)
    return max(delay, retry_after) if retry_after is not None else delay


class _Commits:
    """Group commit: answers handed over in one event-loop turn, stored together.

    `add` queues an answer and, for the first of a turn, schedules `flush` with call_soon, so
    the flush runs after every callback already due: all the answers that arrived together. A
    SQLite transaction costs ~50 us whatever its size, one per answer was a third of the client's
    CPU at zero latency, and one per turn still ~30-40 us an answer: `append` journals them
    (runner/execute/store/journal.py). `on_stored` runs once a turn with the answers stored,
    never before. A failed store (whatever the error: an exception in a loop callback would
    only be logged) leaves its answers uncounted (the rerun asks again), stops the run, and is
    raised by `execute` once the workers are done.
    """

    def __init__(self, cache: CacheBackend, loop: asyncio.AbstractEventLoop,
                 on_stored: Callable[[list[Pending]], None],
                 on_failed: Callable[[list[Task]], None]) -> None:
        self.cache, self.loop = cache, loop
        self.on_stored, self.on_failed = on_stored, on_failed
        self.pending: list[Pending] = []
        self.error: Exception | None = None
        """The first failed commit's error (a CacheError when the disk refused)."""

    def add(self, task: Task, record: dict[str, Any], prompt: int, completion: int) -> None:
        if not self.pending:
            self.loop.call_soon(self.flush)
        self.pending.append((task, record, prompt, completion))

    def flush(self) -> None:
        """Store what is pending now (also called directly when `execute` ends)."""
        batch, self.pending = self.pending, []
        if not batch:
            return
        try:
            self.cache.append([(task.key, record) for task, record, _, _ in batch])
        except Exception as exc:  # noqa: BLE001 - a callback's error would only be logged
            self.error = self.error or exc
            self.on_failed([task for task, _, _, _ in batch])
            return
        self.on_stored(batch)

    def fold(self) -> None:
        """At the end: every stored answer visible to the next stage's reader processes. If
        that fails, the answers are still stored (a diskcache folder keeps them in its
        journal for the next open) and `execute` raises the error."""
        try:
            self.cache.fold()
        except Exception as exc:  # noqa: BLE001 - raised by execute, after the workers
            self.error = self.error or exc


class _Pool:
    """Shared state of the workers: endpoints, limiters, the pool-wide 429 pause."""

    def __init__(self, cache: CacheBackend, session: aiohttp.ClientSession,
                 endpoints: Mapping[str, Endpoint], limits: Limits, stop: asyncio.Event,
                 stats: RunStats, on_progress: Callable[[RunStats], None]) -> None:
        self.cache, self.session, self.endpoints = cache, session, endpoints
        self.limits, self.stop, self.stats, self.on_progress = limits, stop, stats, on_progress
        self.limiters = {name: Limiter(e.model.rpm or limits.rpm, e.model.tpm or limits.tpm)
                         for name, e in endpoints.items()}
        self.fleets = {name: fleet_for(e.model, e.base_url, e.api_key, e.key_reader, limits,
                                       stats.endpoints.setdefault(name, {}))
                       for name, e in endpoints.items()}
        self.resume_at = 0.0
        self.timeout = timeout_of(limits.timeout_s)
        self.loop = asyncio.get_running_loop()
        self.commits = _Commits(cache, self.loop, self._stored, self._not_stored)
        self.claims = Claims(cache, stop, stats, on_progress)  # keys bought by this run only
        self.identity = {name: e.model.endpoint for name, e in endpoints.items()}
        """model -> the endpoint recorded with its answers (a property computed once, here)."""
        self.breaker = Breaker({name: [r.label for r in f.replicas]
                                for name, f in self.fleets.items()},
                               {name: e.model.model for name, e in endpoints.items()})

    async def wait_pause(self) -> None:
        while (delay := self.resume_at - self.loop.time()) > 0 and not self.stop.is_set():
            await self._sleep_unless_stopped(delay)

    def pause(self, seconds: float) -> None:
        self.resume_at = max(self.resume_at, self.loop.time() + seconds)

    async def run_task(self, task: Task) -> None:
        fleet = self.fleets[task.model]
        error: APIError | None = None
        avoid: Replica | None = None  # the replica that just failed this task
        for attempt in range(self.limits.max_retries + 1):
            if self.stop.is_set():  # not started, or between retries: left for the rerun
                self.stats.missing.append(task.key)
                return
            # The usual case (no 429 pause, no limits, one replica) awaits nothing: each await
            # of a coroutine costs at zero latency.
            if avoid is not None or self.resume_at > self.loop.time() or \
                    not self.limiters[task.model].unlimited or (replica := fleet.take()) is None:
                replica = await self._route(task, fleet, avoid)
            if replica is None:  # stopped while waiting: send nothing
                self.stats.missing.append(task.key)
                return
            self.stats.attempts += 1
            route = replica.provider
            body, decode = (task.body, None) if route.plain else \
                (route.encode(task.body), route.decode)
            try:
                # One attempt at `replica`, in its provider's dialect (runner.execute.providers),
                # awaited here: each level of coroutines between the worker and aiohttp costs at
                # every resumption, several a request.
                response = await send(self.session, route.url, body,
                                      headers=route.headers(replica.api_key()),
                                      timeout=self.timeout, decode=decode)
            except RetryableError as exc:
                error, avoid = exc, replica
                elsewhere = fleet.failed(replica, exc)
                if isinstance(exc, ConnectError) and \
                        self._fatal(self.breaker.connect_failed(task.model, replica.label, exc)):
                    self.stats.missing.append(task.key)  # never reached a server: not run
                    return
                if attempt < self.limits.max_retries:
                    self.stats.retries += 1
                    delay = backoff(attempt, exc.retry_after)
                    if exc.status == 429 and not fleet.several:
                        self.pause(delay)
                    if not elsewhere:  # another replica is up: retry there at once
                        await self._sleep_unless_stopped(delay)
                continue
            except RequestError as exc:
                fleet.release(replica)
                error = exc
                self._fatal(self.breaker.not_found(task.model, replica.label, exc))
                break
            except AuthError as exc:
                fleet.release(replica)
                where = f"in {replica.key_env} " if replica.key_env else ""
                self._fatal(f"the server at {replica.label} refused the credentials {where}"
                            f"(HTTP {exc.status}: {exc.detail}): check the key and its "
                            "permissions")
                error = exc
                break
            # No await from here to the hand-over: a cancel cannot split an answer from its store.
            self._store(task, response, fleet, replica)
            return
        assert error is not None
        self.stats.failures[task.key] = error.reason
        self.claims.failed(task.key)
        self.on_progress(self.stats)

    def _fatal(self, message: str | None) -> bool:
        """Stop the run with `message` (the first one wins), when there is one."""
        if message is None:
            return False
        self.stats.fatal = self.stats.fatal or message
        self.stop.set()
        return True

    async def _sleep_unless_stopped(self, delay: float) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), timeout=delay)
        except TimeoutError:
            pass

    async def _route(self, task: Task, fleet: Fleet, avoid: Replica | None) -> Replica | None:
        """Wait for the pool's pause, the model's limiter and a replica (and its limiter);
        None when the run stopped meanwhile."""
        if self.resume_at > self.loop.time():
            await self.wait_pause()
        limiter = self.limiters[task.model]
        if not limiter.unlimited:
            await limiter.acquire(task.prompt_tokens + task.max_tokens)
        replica = fleet.take() if avoid is None else None
        if replica is None:
            replica = await fleet.acquire(task.prompt_tokens + task.max_tokens, avoid, self.stop)
        if self.resume_at > self.loop.time():  # a 429 came while this worker sat in a limiter
            await self.wait_pause()
        if self.stop.is_set() and replica is not None:
            fleet.release(replica)
            return None
        return replica

    def _store(self, task: Task, response: Response, fleet: Fleet, replica: Replica) -> None:
        data = response.data
        usage = data.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        # The answer as it came, when it is the chat completion itself: serialising the parsed
        # copy again cost as much as the rest of the record.
        stored = data if response.raw is None else orjson.Fragment(response.raw)
        self.commits.add(task, answer_record(body=task.body, endpoint=self.identity[task.model],
                                             response=stored, usage=usage,
                                             latency_s=response.latency_s, source="api",
                                             replica=replica.label),
                         prompt, completion)
        used = prompt + completion if usage else None
        reserved = task.prompt_tokens + task.max_tokens
        self.limiters[task.model].reconcile(reserved, used)
        fleet.succeeded(replica, response.headers, reserved, used)
        self.breaker.succeeded(task.model)

    def _stored(self, batch: list[Pending]) -> None:
        """A turn's answers are stored: now they count (one progress report a turn)."""
        stats, endpoints = self.stats, self.endpoints
        for task, _, prompt, completion in batch:
            stats.called.add(task.key)
            stats.prompt_tokens += prompt
            stats.completion_tokens += completion
            cost = estimate_cost(endpoints[task.model].model, prompt, completion)
            if cost is None:
                stats.unpriced += 1
            else:
                stats.cost += cost
        stats.api_calls += len(batch)
        self.claims.stored([pending[0].key for pending in batch])
        self.on_progress(stats)

    def _not_stored(self, tasks: list[Task]) -> None:
        """A commit failed: its answers are not stored, so they are left for the rerun."""
        self.stats.missing.extend(task.key for task in tasks)
        self.stop.set()


async def execute(tasks: Iterable[Task], *, cache: CacheBackend, session: aiohttp.ClientSession,
                  endpoints: Mapping[str, Endpoint], limits: Limits,
                  stop: asyncio.Event | None = None, offline: bool = False,
                  budget: float | None = None, total: int = 0, stats: RunStats | None = None,
                  on_progress: Callable[[RunStats], None] = lambda s: None,
                  hashes: array.array[int] | None = None) -> RunStats:
    """Make sure every task has a cached answer, calling the API only for those that don't.

    Returns the run's counters; failed tasks are in `failures`, never in the cache. `hashes`:
    the key hashes of tasks the caller already counted as cache hits (see
    RunStats.settle_repeats), so that their repeats among `tasks` count as repeats.
    """
    stats = stats if stats is not None else RunStats(total=total)  # or add to a run's counters
    stop = stop or asyncio.Event()
    pool = _Pool(cache, session, endpoints, limits, stop, stats, on_progress)
    # One stream of the tasks to call, pulled by every worker: a plain generator (no await
    # inside, so one worker's `next` ends before another's starts). A dispatcher task feeding
    # a queue cost a task switch per answer at zero latency.
    todo = _to_call(tasks, pool, offline=offline, budget=budget,
                    hashes=array.array("q") if hashes is None else hashes)

    async def worker() -> None:
        for task in todo:
            await pool.run_task(task)
        while (later := await pool.claims.deferred()) is not None:  # another run's claims
            await pool.run_task(later)

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(limits.concurrency):
                group.create_task(worker())
    except ExceptionGroup as group:
        raise _ours(group) from None
    finally:
        pool.commits.flush()  # answers received in the last turn, or before a cancel
        pool.commits.fold()
        pool.claims.close()
    if pool.commits.error is not None:
        raise pool.commits.error
    stats.interrupted = stop.is_set() and stats.fatal is None
    return stats


def _ours(group: ExceptionGroup[Exception]) -> Exception:
    """What the workers raised, as the caller reports it: the first RunnerError itself (a
    cache that cannot be read: one `Error:` line, where a group was a traceback) when every
    error is one, else the group."""
    ours, rest = group.split(RunnerError)
    if ours is None or rest is not None:
        return group
    first: Exception = ours
    while isinstance(first, ExceptionGroup):
        first = first.exceptions[0]
    return first


def _to_call(tasks: Iterable[Task], pool: _Pool, *, offline: bool, budget: float | None,
             hashes: array.array[int]) -> Iterator[Task]:
    """The tasks to send, in order: cache hits and repeated keys counted and skipped; once the
    run stops (or is offline, or over budget) the rest are listed as missing, not sent.

    Memory stays flat over a cached run: only keys not in the cache (sent or missing) are kept
    in a set, to never send one twice. A repeat of a cached key is told apart afterwards from
    a 64-bit hash of every key, appended to `hashes` (RunStats.settle_repeats)."""
    stats, uncached = pool.stats, set()
    repeats_of_uncached = 0
    for batch, flags in cached_flag_batches(pool.cache, tasks, task_key):
        hashes.extend([hash(task.key) for task in batch])
        to_send = []
        for task, cached in zip(batch, flags, strict=True):
            if cached:
                stats.cache_hits += 1
                pool.on_progress(stats)
                continue
            if task.key in uncached:  # e.g. two parsers over one request: one call serves both
                stats.duplicates += 1
                repeats_of_uncached += 1
                continue
            uncached.add(task.key)
            if offline or pool.stop.is_set() or stats.budget_stopped:
                stats.missing.append(task.key)
                continue
            if budget is not None:
                model = pool.endpoints[task.model].model
                cost = estimate_cost(model, task.prompt_tokens, task.max_tokens) or 0.0
                if stats.committed_cost + cost > budget:
                    stats.budget_stopped = True
                    stats.missing.append(task.key)
                    continue
                stats.committed_cost += cost
            to_send.append(task)
        yield from pool.claims.take(to_send)  # claimed by another run: deferred
    # Repeats found cached (of a cached key, or of one stored since it was sent) were counted
    # as hits: they are repeats.
    stats.settle_repeats(hashes, repeats_of_uncached)
