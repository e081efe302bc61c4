"""The worker pool: cache hit, or limiter -> POST -> store, with retries and a clean stop.

One dispatcher walks the task stream (skipping cache hits and duplicate keys) into a bounded
queue; N workers drain it. A response is stored the moment it arrives, with no `await` between
receiving it and `cache.put`, so a cancel can never leave an answer paid for but not stored.
A 429 pauses dispatch for the whole pool for the advised time. Setting `stop` (the first Ctrl-C)
stops dispatching and retrying; in-flight requests finish. Cancelling the caller (the second
Ctrl-C) cancels them.
"""

from __future__ import annotations

import asyncio
import operator
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from runner.data.seen import KeySet
from runner.errors import APIError, AuthError, RequestError, RetryableError
from runner.execute.backend import CacheBackend, marked
from runner.execute.cache import answer_record
from runner.execute.client import Response, send
from runner.execute.fleet import Fleet, Replica, fleet_for
from runner.execute.limiter import Limiter
from runner.expand import Task, estimate_cost
from runner.job.spec import Limits, ModelSpec

__all__ = ["Endpoint", "RunStats", "backoff", "execute"]

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


@dataclass(slots=True)
class RunStats:
    """Counters of one run; `failures` maps a task key to "kind: message"."""

    total: int = 0
    cache_hits: int = 0
    api_calls: int = 0
    """Successful calls (answers stored)."""
    attempts: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    committed_cost: float = 0.0
    """Estimated spend of everything dispatched so far (for --budget)."""
    duplicates: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    called: set[str] = field(default_factory=set)
    """Keys answered by the API in this run (the rest of the answers came from the cache)."""
    missing: list[str] = field(default_factory=list)
    """Keys not cached and not called (offline, budget, or interrupted before dispatch)."""
    budget_stopped: bool = False
    interrupted: bool = False
    fatal: str | None = None
    started: float = field(default_factory=time.time)
    endpoints: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """model -> replica base URL -> calls, failures, cooldowns, state, rpm, tpm (the fleet's)."""

    @property
    def done(self) -> int:
        return self.cache_hits + self.api_calls + self.duplicates

    def endpoint_counts(self) -> dict[str, dict[str, dict[str, Any]]]:
        """`endpoints` without the replicas this run never called (an all-cached run has none,
        so its manifest matches what rescore writes)."""
        used = {model: {url: dict(c) for url, c in replicas.items()
                        if c["calls"] or c["failures"]}
                for model, replicas in self.endpoints.items()}
        return {model: replicas for model, replicas in used.items() if replicas}

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": self.total, "cache_hits": self.cache_hits, "api_calls": self.api_calls,
                "attempts": self.attempts, "retries": self.retries,
                "failures": len(self.failures), "duplicates": self.duplicates,
                "not_run": len(self.missing)}


def backoff(attempt: int, retry_after: float | None = None) -> float:
    """Capped exponential backoff with full jitter; a server's Retry-After is a floor."""
    delay = random.uniform(0.5, 1.0) * min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2.0**attempt)
    return max(delay, retry_after) if retry_after is not None else delay


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
        self.loop = asyncio.get_running_loop()

    async def wait_pause(self) -> None:
        while (delay := self.resume_at - self.loop.time()) > 0 and not self.stop.is_set():
            await self._sleep_unless_stopped(delay)

    def pause(self, seconds: float) -> None:
        self.resume_at = max(self.resume_at, self.loop.time() + seconds)

    async def run_task(self, task: Task) -> None:
        endpoint, fleet = self.endpoints[task.model], self.fleets[task.model]
        error: APIError | None = None
        avoid: Replica | None = None  # the replica that just failed this task
        for attempt in range(self.limits.max_retries + 1):
            if self.stop.is_set():  # not started, or between retries: left for the rerun
                self.stats.missing.append(task.key)
                return
            replica = await self._route(task, fleet, avoid)
            if replica is None:  # stopped while waiting: send nothing
                self.stats.missing.append(task.key)
                return
            self.stats.attempts += 1
            try:
                response = await self._post(task, replica)
            except RetryableError as exc:
                error, avoid = exc, replica
                elsewhere = fleet.failed(replica, exc)
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
                break
            except AuthError as exc:
                fleet.release(replica)
                self.stats.fatal = str(exc)
                self.stop.set()
                error = exc
                break
            # No await from here to put: a cancel cannot split the answer from its storage.
            self._store(task, endpoint, response.data, response.latency_s, fleet, replica,
                        response.headers)
            return
        assert error is not None
        self.stats.failures[task.key] = f"{error.kind}: {error}"
        self.on_progress(self.stats)

    async def _sleep_unless_stopped(self, delay: float) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), timeout=delay)
        except TimeoutError:
            pass

    async def _route(self, task: Task, fleet: Fleet, avoid: Replica | None) -> Replica | None:
        """Wait for the pool's pause, the model's limiter and a replica (and its limiter);
        None when the run stopped meanwhile."""
        await self.wait_pause()
        await self.limiters[task.model].acquire(task.prompt_tokens + task.max_tokens)
        replica = await fleet.acquire(task.prompt_tokens + task.max_tokens, avoid, self.stop)
        await self.wait_pause()  # a 429 may have come while this worker sat in the limiter
        if self.stop.is_set() and replica is not None:
            fleet.release(replica)
            return None
        return replica

    async def _post(self, task: Task, replica: Replica) -> Response:
        """One attempt at `replica`, in its provider's dialect (runner.execute.providers)."""
        route = replica.provider
        return await send(self.session, route.url, route.encode(task.body),
                          headers=route.headers(replica.api_key()),
                          timeout_s=self.limits.timeout_s, decode=route.decode)

    def _store(self, task: Task, endpoint: Endpoint, data: dict[str, Any],
               latency_s: float, fleet: Fleet, replica: Replica,
               headers: Mapping[str, str]) -> None:
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        assert isinstance(usage, dict)
        self.cache.put(task.key, answer_record(body=task.body,
                                               endpoint=endpoint.model.endpoint,
                                               response=data, usage=usage, latency_s=latency_s,
                                               source="api", replica=replica.label))
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        self.limiters[task.model].reconcile(task.prompt_tokens + task.max_tokens,
                                            prompt + completion if usage else None)
        fleet.succeeded(replica, headers, task.prompt_tokens + task.max_tokens,
                        prompt + completion if usage else None)
        self.stats.api_calls += 1
        self.stats.called.add(task.key)
        self.stats.prompt_tokens += prompt
        self.stats.completion_tokens += completion
        self.stats.cost += estimate_cost(endpoint.model, prompt, completion) or 0.0
        self.on_progress(self.stats)


async def execute(tasks: Iterable[Task], *, cache: CacheBackend, session: aiohttp.ClientSession,
                  endpoints: Mapping[str, Endpoint], limits: Limits,
                  stop: asyncio.Event | None = None, offline: bool = False,
                  budget: float | None = None, total: int = 0, stats: RunStats | None = None,
                  on_progress: Callable[[RunStats], None] = lambda s: None) -> RunStats:
    """Make sure every task has a cached answer, calling the API only for those that don't.

    Returns the run's counters; failed tasks are in `failures`, never in the cache.
    """
    stats = stats if stats is not None else RunStats(total=total)  # or add to a run's counters
    stop = stop or asyncio.Event()
    pool = _Pool(cache, session, endpoints, limits, stop, stats, on_progress)
    queue: asyncio.Queue[Task | None] = asyncio.Queue(maxsize=limits.concurrency * 2)

    async def worker() -> None:
        while (task := await queue.get()) is not None:
            await pool.run_task(task)

    async with asyncio.TaskGroup() as group:
        for _ in range(limits.concurrency):
            group.create_task(worker())
        await _dispatch(tasks, pool, queue, offline=offline, budget=budget)
        # Sentinels only after a normal end. On a cancel or a worker's error the TaskGroup
        # cancels the workers itself; putting into a full queue then would hang (nobody drains
        # it) or wait for in-flight requests the cancel is meant to abandon.
        for _ in range(limits.concurrency):
            await queue.put(None)
    stats.interrupted = stop.is_set() and stats.fatal is None
    return stats


async def _dispatch(tasks: Iterable[Task], pool: _Pool, queue: asyncio.Queue[Task | None], *,
                    offline: bool, budget: float | None) -> None:
    stats, seen = pool.stats, KeySet()  # ~24 bytes a task, where a set of keys held ~150
    for task, cached in marked(pool.cache, tasks, operator.attrgetter("key")):
        if not seen.add(task.key):  # e.g. two parsers over one request: one call serves both
            stats.duplicates += 1
            continue
        if cached:
            stats.cache_hits += 1
            pool.on_progress(stats)
            continue
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
        await queue.put(task)
