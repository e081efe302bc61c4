"""The worker pool: cache hit, or limiter -> POST -> store, with retries and a clean stop.

N workers pull from one stream of the tasks to call (cache hits and duplicate keys skipped,
looked up in batches). A response is handed to the store the moment it arrives, with no
`await` in between (group commit, runner.execute.commits): the answers that arrive in one turn
of the event loop are stored together at the end of that turn (`append`: a diskcache folder
writes them to its journal, one write), and an answer counts as done (in the counters, the
progress line and the manifest) only once that store has returned. A kill -9 loses at most the
answers of the turn in progress, which were never counted; a cancel or an error stores whatever
was received before `execute` returns or raises, and every answer is in SQLite (`fold`) when it
does (on a full disk: in the journal, or a spill file the next open folds). A full cache disk
pauses dispatch while the answers it refused are held (commits.py).
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

import aiohttp
import orjson

from runner.errors import (
    APIError,
    AuthError,
    CacheAwayError,
    RequestError,
    RetryableError,
    RunnerError,
    redact_url,
)
from runner.estimate import estimate_cost, model_price
from runner.execute.breaker import Breaker, refused, too_long
from runner.execute.claims import Claims
from runner.execute.client import Response, send, timeout_of
from runner.execute.commits import Commits, Pending
from runner.execute.fleet import Fleet, Replica, fleet_for
from runner.execute.limiter import Limiter
from runner.execute.prefixes import PrefixGate
from runner.execute.stats import RunStats
from runner.execute.store.backend import CacheBackend, cached_flag_batches
from runner.execute.store.cache import answer_record
from runner.job.bill import Tokens
from runner.job.spec import Limits, ModelSpec
from runner.tasks import Task, task_key

__all__ = ["Endpoint", "RunStats", "backoff", "execute"]

BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
NOTICE_WAIT_S = 5.0
"""A server's ask to wait longer than this is told on stderr (a shorter one is routine)."""


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


class _Pool:
    """Shared state of the workers: endpoints, limiters, the pool-wide 429 pause."""

    def __init__(self, cache: CacheBackend, session: aiohttp.ClientSession,
                 endpoints: Mapping[str, Endpoint], limits: Limits, stop: asyncio.Event,
                 stats: RunStats, on_progress: Callable[[RunStats], None],
                 say: Callable[[str], None]) -> None:
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
        self.commits = Commits(cache, self.loop, self._stored, self._not_stored, say)
        self.claims = Claims(cache, stop, stats, on_progress)  # keys bought by this run only
        self.identity = {name: redact_url(e.model.endpoint) for name, e in endpoints.items()}
        """model -> the endpoint recorded with its answers (a property computed once, here),
        without a token its base URL may carry (`?key=`): no secret reaches the cache."""
        self.breaker = Breaker({name: [r.label for r in f.replicas]
                                for name, f in self.fleets.items()},
                               {name: e.model.model for name, e in endpoints.items()},
                               limits.down_after_s)
        self.probes = {name: asyncio.Lock() for name in endpoints}
        """model -> held by the one task in flight while the model is unproven (breaker)."""
        self.prefixes = PrefixGate({name: e.model.kind for name, e in endpoints.items()})
        """Holds the requests of a cache-marked prefix until its first one is answered."""
        self.told_until = 0.0
        """Until when the longest wait a server asked for was told (one line per new ask)."""

    async def wait_pause(self) -> None:
        while (delay := self.resume_at - self.loop.time()) > 0 and not self.stop.is_set():
            await self._sleep_unless_stopped(delay)

    def away(self, exc: CacheAwayError) -> bool:
        """A lookup or a claim found the cache's database away: dispatch waits for it; whether
        to ask again once it is back (not if the run is stopping)."""
        self.commits.hold_off(exc)
        return self.commits.error is None and not self.stop.is_set()

    def afford(self, tasks: list[Task], budget: float | None) -> list[Task]:
        """Those of `tasks` (claimed: this run buys them) whose cost fits in `budget` (none:
        all), reserved; from the first that does not, the run is over its budget and the
        rest are not run, their claims given back. Reserved once claimed, not before: a task
        deferred to another run's claim costs this run nothing unless it takes the claim
        over (deferred ones kept their share before, and stopped the run early)."""
        if budget is None:
            return tasks
        stats = self.stats
        for at, task in enumerate(tasks):
            cost = _reserved_cost(self, task)
            if stats.budget_stopped or stats.committed_cost + cost > budget:
                stats.budget_stopped = True
                stats.missing.extend(task.key for task in tasks[at:])
                self.claims.give_up([task.key for task in tasks[at:]])
                return tasks[:at]
            stats.committed_cost += cost
        return tasks

    def pause(self, seconds: float) -> None:
        self.resume_at = max(self.resume_at, self.loop.time() + seconds)

    async def probe(self, task: Task) -> None:
        """`run_task` for a model whose endpoint has not yet shown it is there (see
        runner.execute.breaker): one such task at a time."""
        async with self.probes[task.model]:
            if task.model in self.breaker.unproven:
                await self.run_task(task)
                return
        await self.run_task(task)

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
                    not self.commits.room.is_set() or \
                    not self.limiters[task.model].unlimited or (replica := fleet.take()) is None:
                replica = await self._route(task, fleet, avoid)
            if replica is None:  # stopped while waiting: send nothing
                self.stats.missing.append(task.key)
                return
            self.stats.attempts += 1
            route = replica.provider
            body, decode = (task.body, None) if route.plain else \
                (route.encode(task.body, task.prefix), route.decode)
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
                if self._fatal(self._verdict(task, replica, exc, elsewhere)):
                    self.stats.missing.append(task.key)  # no answer to keep: not run
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
                self._fatal(self._verdict(task, replica, exc, elsewhere=False))
                break
            except AuthError as exc:
                fleet.release(replica)
                self._fatal(refused(replica.label, replica.key_env,
                                    replica.api_key() is not None, exc))
                error = exc
                break
            # No await from here to the hand-over: a cancel cannot split an answer from its store.
            self._store(task, response, fleet, replica)
            return
        assert error is not None
        self.stats.failures[task.key] = error.reason
        self.claims.give_up([task.key])
        self.on_progress(self.stats)

    def _verdict(self, task: Task, replica: Replica, exc: APIError,
                 elsewhere: bool) -> str | None:
        """Whether a failed attempt stops the run: the breaker's verdict, or a server asking
        to wait longer than limits.max_wait_s while no other replica of the model is up (a
        fleet goes on without the one that asked; a wait over NOTICE_WAIT_S is told, once
        per longer ask)."""
        wait = exc.retry_after
        if wait is not None and wait > self.limits.max_wait_s and not elsewhere:
            return too_long(replica.label, exc, self.limits.max_wait_s)
        now = self.loop.time()
        if wait is not None and wait > NOTICE_WAIT_S and now + wait > self.told_until:
            self.told_until = now + wait
            self.stats.notes.append(f"the server at {replica.label} asks to wait {wait:.0f} s "
                                    f"({exc.reason}): waiting")
            self.on_progress(self.stats)
        return self.breaker.failed(task.model, replica.label, exc, now)

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
        await self.commits.until_room(self.stop)  # the disk full: nothing sent meanwhile
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
        tokens = Tokens.of(usage)
        # The answer as it came, when it is the chat completion itself: serialising the parsed
        # copy again cost as much as the rest of the record.
        stored = data if response.raw is None else orjson.Fragment(response.raw)
        self.commits.add(task, answer_record(body=task.body, endpoint=self.identity[task.model],
                                             response=stored, usage=usage,
                                             latency_s=response.latency_s, source="api",
                                             replica=replica.label),
                         tokens)
        used = tokens.prompt + tokens.output if usage else None
        reserved = task.prompt_tokens + task.max_tokens
        self.limiters[task.model].reconcile(reserved, used)
        fleet.succeeded(replica, response.headers, reserved, used)
        self.breaker.succeeded(task.model, replica.label)

    def _stored(self, batch: list[Pending]) -> None:
        """A turn's answers are stored: now they count (one progress report a turn)."""
        stats, endpoints = self.stats, self.endpoints
        for task, _, tokens in batch:
            stats.called.add(task.key)
            stats.bill.add(model_price(endpoints[task.model].model), tokens)
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
                  hashes: array.array[int] | None = None,
                  say: Callable[[str], None] = lambda message: None,
                  holds: Callable[[Task], bool] | None = None) -> RunStats:
    """Make sure every task has a cached answer, calling the API only for those that don't.

    Returns the run's counters; failed tasks are in `failures`, never in the cache. `hashes`:
    the key hashes of tasks the caller already counted as cache hits (see
    RunStats.settle_repeats), so that their repeats among `tasks` count as repeats. `say`
    tells the user of a cache disk that is full and of the answers held meanwhile
    (runner.execute.commits). `holds`: asked of each task to send as a worker takes it (see
    _unheld).
    """
    stats = stats if stats is not None else RunStats(total=total)  # or add to a run's counters
    stop = stop or asyncio.Event()
    pool = _Pool(cache, session, endpoints, limits, stop, stats, on_progress, say)
    # One stream of the tasks to call, pulled by every worker: a plain generator (no await
    # inside, so one worker's `next` ends before another's starts). A dispatcher task feeding
    # a queue cost a task switch per answer at zero latency.
    todo = _to_call(tasks, pool, offline=offline, budget=budget,
                    hashes=array.array("q") if hashes is None else hashes)
    if holds is not None:
        todo = _unheld(todo, pool, holds, budget)

    async def worker() -> None:
        unproven = pool.breaker.unproven
        for task in todo:
            if task is None:  # the cache's database away: dispatch waits until it is back
                await pool.commits.until_room(stop)
                continue
            release = await pool.prefixes.enter(task) if task.prefix else None
            try:
                if task.model in unproven:
                    await pool.probe(task)
                else:  # called directly: a coroutine level costs at every resumption
                    await pool.run_task(task)
            finally:
                if release is not None:  # the prefix is written: its other requests go
                    release()
        while (later := await pool.claims.deferred()) is not None:  # another run's claims
            if not pool.afford([later], budget):
                continue
            await (pool.probe(later) if later.model in unproven else pool.run_task(later))

    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(limits.concurrency):
                group.create_task(worker())
        pool.commits.flush()
        await pool.commits.until_room(stop)  # the last answers held: the disk's room awaited
    except ExceptionGroup as group:
        raise _ours(group) from None
    finally:
        pool.commits.flush()  # answers received in the last turn, or before a cancel
        pool.commits.settle()  # held while the disk is full: written elsewhere
        pool.commits.fold()
        pool.claims.close()
        pool.commits.close()
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
             hashes: array.array[int]) -> Iterator[Task | None]:
    """The tasks to send, in order: cache hits and repeated keys counted and skipped; once the
    run stops (or is offline, or over budget) the rest are listed as missing, not sent. None
    when a lookup or a claim found the cache's database away (commits.hold_off): the worker
    waits for it to be back, and the next pull asks again.

    Memory stays flat over a cached run: only keys not in the cache (sent or missing) are kept
    in a set, to never send one twice. A repeat of a cached key is told apart afterwards from
    a 64-bit hash of every key, appended to `hashes` (RunStats.settle_repeats)."""
    stats, uncached = pool.stats, set()
    repeats_of_uncached, checked = 0, False
    for batch, flags in cached_flag_batches(pool.cache, tasks, task_key, pool.away, ahead=False):
        if not batch:
            yield None
            continue
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
            to_send.append(task)
        if to_send and not checked:
            pool.commits.check_room()
            checked = True
        while True:
            try:
                sent = pool.claims.take(to_send)  # claimed by another run: deferred
                break
            except CacheAwayError as exc:
                if not pool.away(exc):
                    stats.missing.extend(task.key for task in to_send)
                    sent = []
                    break
                yield None
        yield from pool.afford(sent, budget)
    # Repeats found cached (of a cached key, or of one stored since it was sent) were counted
    # as hits: they are repeats.
    stats.settle_repeats(hashes, repeats_of_uncached)


def _unheld(todo: Iterator[Task | None], pool: _Pool, holds: Callable[[Task], bool],
            budget: float | None) -> Iterator[Task | None]:
    """The tasks to send but those `holds` holds (--until-ci: a judge whose CIs are narrow
    enough), which are listed as not run and taken off the budget's committed spend. Asked
    as a worker takes the task, not when `_to_call` looks its batch up (LOOKUP_BATCH tasks
    ahead), so that `holds` sees the answers stored up to the task's dispatch."""
    stats = pool.stats
    for task in todo:
        if task is None or not holds(task):  # None: the cache's database away (_to_call)
            yield task
            continue
        stats.missing.append(task.key)  # its claim is given back with the others' at the end
        if budget is not None:
            stats.committed_cost -= _reserved_cost(pool, task)


def _reserved_cost(pool: _Pool, task: Task) -> float:
    """What --budget counts a task at when it is dispatched: its price at its token estimate
    and max_tokens (0 for a model without a price: check_budget refuses those)."""
    return estimate_cost(pool.endpoints[task.model].model, task.prompt_tokens,
                         task.max_tokens) or 0.0
