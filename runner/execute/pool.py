"""The worker pool: cache hit, or limiter -> POST -> store, with retries and a clean stop.

N workers pull from one stream of the tasks to call (runner.execute.dispatch). A response is
handed to the store the moment it arrives, with no `await` in between, and counts as done (in
the counters, the progress line and the manifest) only once stored (group commit,
runner.execute.commits: a kill -9 loses at most the answers of the turn in progress, never
counted). A cancel or an error stores whatever was received before `execute` returns or raises,
and every answer is in SQLite (`fold`) when it does (on a full disk: in the journal, or a spill
file the next open folds). A 429 pauses dispatch for the whole pool for the advised time.
Setting `stop` (the first Ctrl-C) stops dispatching and retrying; in-flight requests finish.
Cancelling the caller (the second Ctrl-C) cancels them.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import aiohttp
import orjson

from runner.errors import (
    APIError,
    AuthError,
    RequestError,
    RetryableError,
    RunnerError,
    redact_url,
)
from runner.estimate import model_price
from runner.execute.breaker import Breaker, refused, too_long
from runner.execute.client import Response, send, timeout_of
from runner.execute.commits import Commits, Pending
from runner.execute.dispatch import Dispatch
from runner.execute.fleet import Fleet, Replica, fleet_for
from runner.execute.limiter import Limiter
from runner.execute.prefixes import PrefixGate
from runner.execute.stats import RunStats
from runner.execute.store.backend import CacheBackend
from runner.execute.store.cache import answer_record
from runner.job.bill import Tokens
from runner.job.spec import Limits, ModelSpec
from runner.tasks import Task

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


def backoff(attempt: int, retry_after: float | None = None) -> float:
    """Capped exponential backoff with full jitter; a server's Retry-After is a floor.

    Args:
        attempt: the failed attempt's number, from 0.
        retry_after: the server's Retry-After in seconds, if it sent one.

    Returns:
        The seconds to wait before the next attempt.
    """
    delay = random.uniform(0.5, 1.0) * min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0**attempt)
    return max(delay, retry_after) if retry_after is not None else delay


class _Pool:
    """Shared state of the workers: endpoints, limiters, the pool-wide 429 pause."""

    def __init__(self, cache: CacheBackend, session: aiohttp.ClientSession,
                 endpoints: Mapping[str, Endpoint], limits: Limits, stop: asyncio.Event,
                 stats: RunStats, on_progress: Callable[[RunStats], None],
                 say: Callable[[str], None], budget: float | None) -> None:
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
        self.dispatch = Dispatch(cache, stats, self.commits, stop, on_progress,
                                 {name: e.model for name, e in endpoints.items()}, budget)
        self.claims = self.dispatch.claims
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

    async def work(self, todo: Iterator[Task | None]) -> None:
        """One worker: sends the tasks it pulls from `todo` (shared by every worker) until it is
        empty, then those deferred to another run's claims that this run takes over.

        Args:
            todo: the stream of tasks to send (Dispatch.to_call).
        """
        unproven = self.breaker.unproven
        for task in todo:
            if task is None:  # the cache's database away: dispatch waits until it is back
                await self.commits.until_room(self.stop)
                continue
            body, release = await self.prefixes.enter(task) if task.prefix else (None, None)
            try:
                if task.model in unproven:
                    await self.probe(task, body)
                else:  # called directly: a coroutine level costs at every resumption
                    await self.run_task(task, body)
            finally:
                if release is not None:  # the prefix is written: its other requests go
                    release()
        while (later := await self.claims.deferred()) is not None:  # another run's claims
            if self.dispatch.afford([later]):
                await (self.probe(later) if later.model in unproven else self.run_task(later))

    def close(self) -> None:
        """Store the answers received in the last turn or before a cancel (those held while
        the disk is full: elsewhere), fold them into SQLite, give the claims back."""
        self.commits.flush()
        self.commits.settle()
        self.commits.fold()
        self.claims.close()
        self.commits.close()

    async def probe(self, task: Task, sent: bytes | None = None) -> None:
        """`run_task` for a model whose endpoint has not yet shown it is there (see
        runner.execute.breaker): one such task at a time."""
        async with self.probes[task.model]:
            if task.model in self.breaker.unproven:
                await self.run_task(task, sent)
                return
        await self.run_task(task, sent)

    async def run_task(self, task: Task, sent: bytes | None = None) -> None:
        """Send `task` (`sent`: its body as encoded already by the prefix gate) and store its
        answer, with retries."""
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
                (sent or route.encode(task.body, task.prefix), route.decode)
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
                    if exc.status == 429 and not fleet.several:  # the whole pool waits
                        self.resume_at = max(self.resume_at, self.loop.time() + delay)
                    if not elsewhere:  # another replica is up: retry there at once
                        await self._sleep_unless_stopped(delay)
                continue
            except (RequestError, AuthError) as exc:  # asking again gets the same
                fleet.release(replica)
                error = exc
                self._fatal(refused(replica.label, replica.key_env, replica.api_key() is not None,
                                    exc) if isinstance(exc, AuthError)
                            else self._verdict(task, replica, exc, elsewhere=False))
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
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), timeout=delay)

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

    Args:
        tasks: the tasks, in order.
        cache: the open cache.
        session: the HTTP session the requests go through.
        endpoints: model name -> where it is served.
        limits: the job's limits (concurrency, retries, rates, timeouts).
        stop: set to stop dispatching and retrying (the first Ctrl-C).
        offline: send nothing: the uncached tasks are listed as missing.
        budget: --budget in dollars, None without one.
        total: the task count, for new counters.
        stats: a run's counters to add to, instead of new ones.
        on_progress: called with the counters when they change.
        hashes: the key hashes of tasks the caller already counted as cache hits (see
            RunStats.settle_repeats), so that their repeats among `tasks` count as repeats.
        say: tells the user of a cache disk that is full and of the answers held meanwhile
            (runner.execute.commits).
        holds: asked of each task to send as a worker takes it (Dispatch.unheld).

    Returns:
        The run's counters; failed tasks are in `failures`, never in the cache.
    """
    stats = stats if stats is not None else RunStats(total=total)  # or add to a run's counters
    stop = stop or asyncio.Event()
    pool = _Pool(cache, session, endpoints, limits, stop, stats, on_progress, say, budget)
    todo = pool.dispatch.to_call(tasks, offline=offline,
                                 hashes=array.array("q") if hashes is None else hashes)
    if holds is not None:
        todo = pool.dispatch.unheld(todo, holds)
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(limits.concurrency):
                group.create_task(pool.work(todo))  # one stream, pulled by every worker
        pool.commits.flush()
        await pool.commits.until_room(stop)  # the last answers held: the disk's room awaited
    except ExceptionGroup as group:
        raise _ours(group) from None
    finally:
        pool.close()
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
