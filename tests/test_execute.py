"""Tests for runner.execute.pool: the worker pool against the fake server, with a real cache.

Every run is bounded: `asyncio.timeout` around it, a handful of tasks, small server latencies,
and fast retries (the backoff constants are patched down, Retry-After is a few milliseconds).
"""

from __future__ import annotations

import array
import asyncio
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from runner.errors import CacheError
from runner.estimate import estimate_cost
from runner.execute import pool as execute_module
from runner.execute import stats as stats_module
from runner.execute.pool import Endpoint, RunStats, backoff, execute
from runner.execute.store.answers import of_raw, of_record
from runner.execute.store.cache import Cache
from runner.job.load import load_job
from runner.job.spec import Job, Limits
from runner.prepare import prepare
from runner.tasks import Task
from tests.conftest import ROOT, JobWriter
from tests.fakeserver import ThreadedServer

KEY = "sk-test-7Hq2XbY9secretSECRET0042"
RUN_TIMEOUT_S = 20.0

JOB = """
[[datasets]]
name = "mine"
path = "data.jsonl"
fields = { id = "id", text = { output = "output" } }

[[prompts]]
name = "stars"
template = "prompt.txt"
parser = "stars"
aspects = ["overall"]
params = { temperature = 0, max_tokens = 4 }

[models.judge]
spec = "fake-judge"
base_url = "{url}"
price = { input = 1.0, output = 2.0 }
"""

SECOND_PROMPT = """
[[prompts]]
name = "same-request-other-parser"
template = "prompt.txt"
parser = "number"
aspects = ["overall"]
params = { max_tokens = 4, temperature = 0 }
"""


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries after milliseconds, not seconds; a server's Retry-After still sets the floor."""
    monkeypatch.setattr(execute_module, "BACKOFF_BASE_S", 0.001)
    monkeypatch.setattr(execute_module, "BACKOFF_CAP_S", 0.01)


@pytest.fixture
def cache(cache_dir: Path) -> Iterator[Cache]:
    with Cache(cache_dir) as c:
        yield c


class Study:
    """A job over `n` items of a user JSONL file, aimed at the fake server."""

    def __init__(self, write_job: JobWriter, server: ThreadedServer, n: int,
                 toml: str = JOB) -> None:
        rows = [{"id": f"item{i:03d}", "output": f"Story {i}: {{braces}} stay {'x' * (i % 7)}"}
                for i in range(n)]
        path = write_job(toml.replace("{url}", server.url), rows=rows,
                         files={"prompt.txt": "Rate {{aspect}}: {{output}}"})
        self.job: Job = load_job(path)
        self.expansion = prepare(self.job, ROOT)
        self.server = server
        self.endpoints = {m.name: Endpoint(model=m, base_url=server.url, api_key=lambda: KEY)
                          for m in self.job.models}

    def tasks(self) -> Iterator[Task]:
        return self.expansion.tasks()

    @property
    def keys(self) -> list[str]:
        return [t.key for t in self.tasks()]

    async def run(self, cache: Cache, tasks: Iterable[Task] | None = None,
                  **options: Any) -> RunStats:
        limits = Limits(**{"concurrency": 4, "max_retries": 3, "timeout_s": 5.0,
                           **options.pop("limits", {})})
        async with aiohttp.ClientSession() as session, asyncio.timeout(RUN_TIMEOUT_S):
            return await execute(self.tasks() if tasks is None else tasks, cache=cache,
                                 session=session, endpoints=self.endpoints, limits=limits,
                                 total=self.expansion.count(), **options)


@pytest.fixture
def study(write_job: JobWriter, server: ThreadedServer) -> Callable[..., Study]:
    return lambda n, toml=JOB: Study(write_job, server, n, toml)


def _cache_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def _requests_between(server: ThreadedServer, start: float, end: float) -> list[float]:
    return [arrived for arrived, _, _ in server.state.log if start < arrived < end]


# ------------------------------------------------------------------------- the happy path


async def test_all_answered_cached_and_rerun_makes_no_calls(
        study: Callable[..., Study], server: ThreadedServer, cache: Cache,
        cache_dir: Path) -> None:
    s = study(30)
    server.state.script.latency_s = 0.01
    stats = await s.run(cache)
    assert (stats.total, stats.api_calls, stats.cache_hits, stats.attempts) == (30, 30, 0, 30)
    assert stats.failures == {} and stats.missing == [] and stats.fatal is None
    assert not stats.interrupted and stats.called == set(s.keys)
    assert stats.prompt_tokens > 0 and stats.completion_tokens == 3 * 30
    assert stats.cost == pytest.approx((stats.prompt_tokens + 2 * stats.completion_tokens) / 1e6)
    assert cache.stats()["entries"] == 30
    for task in s.tasks():
        record = cache.get(task.key)
        assert record is not None
        assert record["request"] == json.loads(task.body)
        assert record["endpoint"] == server.url and record["source"] == "api"
        assert record["response"]["choices"][0]["message"]["content"].endswith(" stars")
        assert record["usage"]["completion_tokens"] == 3 and record["latency_s"] > 0
        assert server.state.bodies[server.state.body_key(record["request"])] == 1
    assert 2 <= server.state.max_in_flight <= 4  # the pool's concurrency, and no more
    # The key went to the server, and nowhere into the cache.
    assert set(server.state.auth) == {f"Bearer {KEY}"}
    assert KEY.encode() not in _cache_bytes(cache_dir)

    again = await s.run(cache)
    assert (again.cache_hits, again.api_calls, again.attempts) == (30, 0, 0)
    assert again.done == 30 and server.state.requests == 30


async def test_duplicate_keys_are_called_once(study: Callable[..., Study],
                                              server: ThreadedServer, cache: Cache,
                                              tmp_path: Path) -> None:
    s = study(10, JOB + SECOND_PROMPT)
    tasks = list(s.tasks())
    assert len(tasks) == 20 and len({t.key for t in tasks}) == 10  # parser is not in the key
    stats = await s.run(cache)
    assert (stats.api_calls, stats.duplicates, stats.done) == (10, 10, 20)
    assert server.state.requests == 10 and set(server.state.bodies.values()) == {1}
    # Rerun: the repeats are found cached now, and still counted as repeats, not hits.
    again = await s.run(cache)
    assert (again.cache_hits, again.duplicates, again.api_calls, again.done) == (10, 10, 0, 20)
    # Half the keys stored beforehand: each key is still one hit or one call, plus a repeat.
    with Cache(tmp_path / "half") as half:
        first = {}
        for task in tasks:
            first.setdefault(task.key, task)
        await s.run(half, tasks=list(first.values())[:5])
        mixed = await s.run(half)
        assert (mixed.cache_hits, mixed.api_calls, mixed.duplicates) == (5, 5, 10)


@pytest.mark.parametrize("limit", [0, 10**9])  # numpy's count, then the set's
def test_settle_repeats_counts_each_key_once_whichever_way_it_counts(
        monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    monkeypatch.setattr(stats_module, "SET_LIMIT", limit)
    hashes = array.array("q", [hash(f"k{i % 700}") for i in range(1000)] + [-1, 2**62])
    stats = RunStats(cache_hits=1002)
    stats.settle_repeats(hashes, repeats_of_uncached=50)
    assert (stats.cache_hits, stats.duplicates) == (1002 - 250, 250)


async def test_concurrency_limit_holds(study: Callable[..., Study], server: ThreadedServer,
                                       cache: Cache) -> None:
    s = study(24)
    server.state.script.latency_s = 0.02
    stats = await s.run(cache, limits={"concurrency": 3})
    assert stats.api_calls == 24 and server.state.max_in_flight == 3


async def test_rpm_limit_spaces_requests(study: Callable[..., Study], server: ThreadedServer,
                                         cache: Cache) -> None:
    s = study(13)
    stats = await s.run(cache, limits={"rpm": 600})  # 10 per second, a bucket of 10
    assert stats.api_calls == 13
    arrivals = sorted(arrived for arrived, _, _ in server.state.log)
    # A bucket of 10 goes at once (spaced one by one they would span 0.9 s), then one every
    # 0.1 s: the 13th is due 0.3 s after the first left (allowing for the first's transit).
    assert arrivals[9] - arrivals[0] < 0.5
    assert arrivals[12] - arrivals[0] >= 0.25


async def test_tpm_limit_alone_holds_in_the_pool(study: Callable[..., Study],
                                                 server: ThreadedServer, cache: Cache) -> None:
    """A tokens-per-minute limit without a requests-per-minute one still goes through the
    limiter (the pool skips it only when there is neither)."""
    s = study(12)
    reserved = [t.prompt_tokens + t.max_tokens for t in s.tasks()]
    per_s = sum(reserved) / 6  # 6 s of reserved tokens, about 2.5 s of tokens used
    stats = await s.run(cache, limits={"tpm": 60 * per_s})
    assert stats.api_calls == 12
    arrivals = sorted(arrived for arrived, _, _ in server.state.log)
    # Unused reservations come back as credit (up to one second's worth), and the bucket's
    # one second goes at once: the tokens used take at least 2 s less than they are worth.
    # Unlimited, all 12 arrive within ~0.1 s.
    used = stats.prompt_tokens + stats.completion_tokens
    assert used <= sum(reserved)
    assert arrivals[-1] - arrivals[0] >= (used - 2 * per_s) / per_s >= 0.9


# ------------------------------------------------------------------------- faults


async def test_429_pauses_the_whole_pool(study: Callable[..., Study], server: ThreadedServer,
                                         cache: Cache) -> None:
    s = study(24)
    script = server.state.script
    script.latency_s = 0.02
    script.retry_after = 0.3
    script.queue = ["ok"] * 6 + ["429"]
    stats = await s.run(cache)
    assert stats.api_calls == 24 and stats.retries == 1 and stats.failures == {}
    ((arrived, replied, _),) = [entry for entry in server.state.log if entry[2] == "429"]
    # Requests already on their way may land just after the 429; then nothing for 0.3 s.
    assert _requests_between(server, replied + 0.03, replied + 0.29) == []
    later = _requests_between(server, replied + 0.29, replied + 5)
    assert len(later) >= 1 and arrived < replied


async def test_429_pause_holds_workers_released_by_the_limiter(
        study: Callable[..., Study], server: ThreadedServer, cache: Cache) -> None:
    """Workers waiting in the rpm limiter during a pause must not go when it lets them."""
    s = study(24)
    script = server.state.script
    script.retry_after = 0.4
    script.queue = ["ok"] * 12 + ["429"]  # the 13th request, while others wait in the limiter
    stats = await s.run(cache, limits={"rpm": 600})  # 10 per second
    assert stats.api_calls == 24 and stats.retries == 1
    ((_, replied, _),) = [entry for entry in server.state.log if entry[2] == "429"]
    assert _requests_between(server, replied + 0.03, replied + 0.39) == []


async def test_retries_then_success(study: Callable[..., Study], server: ThreadedServer,
                                    cache: Cache) -> None:
    s = study(3)
    script = server.state.script
    script.hang_s = 0.6
    script.queue = ["500", "drop", "malformed", "hang", "ok"]
    stats = await s.run(cache, limits={"concurrency": 1, "max_retries": 4, "timeout_s": 0.2})
    assert stats.failures == {} and stats.api_calls == 3
    assert (stats.attempts, stats.retries) == (7, 4)
    first = cache.get(s.keys[0])
    assert first is not None
    assert server.state.bodies[server.state.body_key(first["request"])] == 5
    assert server.state.status["500"] == 1 and server.state.status["drop"] == 1
    assert server.state.status["malformed"] == 1 and server.state.status["hang"] == 1


async def test_400_fails_only_that_task_and_is_not_cached(
        study: Callable[..., Study], server: ThreadedServer, cache: Cache) -> None:
    s = study(5)
    server.state.script.queue = ["ok", "400"]
    stats = await s.run(cache, limits={"concurrency": 1})
    bad = s.keys[1]
    assert stats.failures == {bad: "400: fake 400"}
    assert stats.api_calls == 4 and stats.attempts == 5 and stats.retries == 0
    assert bad not in cache and cache.stats()["entries"] == 4 and stats.fatal is None
    rerun = await s.run(cache)
    assert rerun.called == {bad} and rerun.cache_hits == 4 and server.state.requests == 6


async def test_401_stops_the_run(study: Callable[..., Study], server: ThreadedServer,
                                 cache: Cache) -> None:
    s = study(40)
    server.state.script.latency_s = 0.01
    server.state.script.queue = ["401"]
    stop = asyncio.Event()
    stats = await s.run(cache, stop=stop, limits={"concurrency": 3})
    assert stop.is_set() and not stats.interrupted
    assert stats.fatal == f"the server at {server.url} refused the credentials in " \
                          "OPENAI_API_KEY (HTTP 401: fake 401): check the key and its permissions"
    assert list(stats.failures.values()) == ["401: fake 401"]
    assert server.state.requests <= 3 + 2  # what was in flight, not the other 37
    assert stats.api_calls + len(stats.failures) + len(stats.missing) == 40
    assert cache.stats()["entries"] == stats.api_calls


async def test_max_retries_exhausted(study: Callable[..., Study], server: ThreadedServer,
                                     cache: Cache) -> None:
    s = study(4)
    server.state.script.faults = {"500": 1.0}
    stats = await s.run(cache, limits={"concurrency": 2, "max_retries": 2})
    assert stats.failures == {key: "500: fake 500" for key in s.keys}
    assert (stats.api_calls, stats.attempts, stats.retries) == (0, 12, 8)
    assert set(server.state.bodies.values()) == {3} and cache.stats()["entries"] == 0


async def test_timeouts_exhausted_are_listed(study: Callable[..., Study],
                                             server: ThreadedServer, cache: Cache) -> None:
    s = study(1)
    server.state.script.hang_s = 0.5
    server.state.script.queue = ["hang", "hang"]
    stats = await s.run(cache, limits={"max_retries": 1, "timeout_s": 0.1})
    assert stats.failures == {s.keys[0]: "timeout: no answer within 0.1 s"}
    assert s.keys[0] not in cache


# ------------------------------------------------------------------------- not calling


async def test_offline_makes_no_request(study: Callable[..., Study], server: ThreadedServer,
                                        cache: Cache) -> None:
    s = study(10)
    await s.run(cache, tasks=list(s.tasks())[:4])
    assert server.state.requests == 4
    stats = await s.run(cache, offline=True)
    assert server.state.requests == 4
    assert stats.cache_hits == 4 and stats.api_calls == 0 and stats.missing == s.keys[4:]


async def test_budget_stops_dispatch_before_the_estimate(
        study: Callable[..., Study], server: ThreadedServer, cache: Cache) -> None:
    s = study(12)
    model = s.job.models[0]
    costs = [estimate_cost(model, t.prompt_tokens, t.max_tokens) or 0.0 for t in s.tasks()]
    assert len(set(costs)) > 1 and min(costs) > 0  # items differ in length, so in cost
    budget = sum(costs[:7]) + costs[7] / 2
    stats = await s.run(cache, budget=budget)
    assert stats.budget_stopped and stats.api_calls == 7 and server.state.requests == 7
    assert stats.called == set(s.keys[:7]) and stats.missing == s.keys[7:]
    assert stats.committed_cost == pytest.approx(sum(costs[:7])) and stats.committed_cost <= budget


class _Recording(Cache):
    """A real diskcache that records each append call (one per event-loop turn) and can be
    told to refuse every write from the `fail_from`-th call on (and, unless `keeps`, to keep
    nothing of what it refused)."""

    def __init__(self, directory: Path, fail_from: int | None = None,
                 keeps: bool = True) -> None:
        super().__init__(directory)
        self.batches: list[list[str]] = []
        self.fail_from, self.keeps = fail_from, keeps

    def keep(self, items: Iterable[tuple[str, Any]]) -> Path | None:
        if not self.keeps:
            raise CacheError(f"{self.directory}: nowhere to keep them")
        return super().keep(items)

    def append(self, items: Iterable[tuple[str, Any]]) -> int:
        items = list(items)
        self.batches.append([key for key, _ in items])
        if self.fail_from is not None and len(self.batches) >= self.fail_from:
            raise CacheError(f"{self.directory}: could not store {len(items)} answers (disk full)")
        return super().append(items)


async def test_answers_count_only_once_stored_in_one_append_per_turn(
        study: Callable[..., Study], server: ThreadedServer, tmp_path: Path) -> None:
    """Group commit: every progress report sees only answers already in the cache, and answers
    arriving together share one append (one journal write); at the end all are in SQLite."""
    s = study(64)
    server.state.script.latency_s = 0.05
    cache = _Recording(tmp_path / "cache")
    unstored: list[int] = []

    def progress(stats: RunStats) -> None:
        unstored.append(len(stats.called - cache.has_many(list(stats.called))))

    stats = await s.run(cache, on_progress=progress, limits={"concurrency": 16})
    cache.close()
    assert stats.api_calls == 64 and unstored and max(unstored) == 0
    assert sorted(k for batch in cache.batches for k in batch) == sorted(s.keys)
    assert len(cache.batches) < 64  # 16 answers arrive together every 50 ms


async def test_an_answer_is_stored_as_the_server_sent_it(
        study: Callable[..., Study], server: ThreadedServer, cache: Cache) -> None:
    """The record embeds the chat completion's bytes as they came (not a re-serialised copy):
    spacing, key order and escapes kept, and it reads back as the same answer, whole or by
    judging's read of the record's end."""
    s = study(3)
    bodies = [b'{"choices": [{"message": {"role": "assistant", "content": "4 stars"},\n'
              b' "finish_reason": "stop", "index": 0}],\n "usage": {"prompt_tokens": 9,'
              b' "completion_tokens": 2}, "note": "\\u00e9t\\u00e9 \\"q\\""'
              b',"response":{"nested": [1, {"a": null}]}}\n' for _ in range(3)]
    server.state.script.raw = [(200, {"Content-Type": "application/json"}, b) for b in bodies]
    stats = await s.run(cache, limits={"concurrency": 1})
    assert (stats.api_calls, stats.retries, stats.prompt_tokens, stats.completion_tokens) == \
        (3, 0, 27, 6)
    stored = cache.get_many_raw(s.keys)
    for key in s.keys:
        assert bodies[0] in stored[key]
        record = cache.get(key)
        assert record is not None and record["response"] == json.loads(bodies[0])
        assert record["usage"] == {"prompt_tokens": 9, "completion_tokens": 2}
        assert of_raw(stored[key]) == of_record(record)
        assert of_record(record).text == "4 stars"


async def test_every_answer_is_in_sqlite_for_other_readers_when_execute_returns(
        study: Callable[..., Study], server: ThreadedServer, tmp_path: Path) -> None:
    s = study(20)
    with Cache(tmp_path / "cache") as cache:
        stats = await s.run(cache)
        with Cache(tmp_path / "cache") as other:  # a reader process of the next stage
            assert stats.api_calls == 20 and other.has_many(s.keys) == set(s.keys)


@pytest.mark.parametrize("keeps", [True, False])
async def test_a_refused_commit_stops_the_run_and_keeps_what_it_held_where_it_can(
        study: Callable[..., Study], server: ThreadedServer, tmp_path: Path,
        keeps: bool) -> None:
    """A store refused for good (not a full disk: that holds) stops the run; the answers it
    refused are kept elsewhere (CacheBackend.keep) and count, so the rerun buys none of them;
    when nowhere takes them either, they count for nothing and the rerun asks them again."""
    s = study(24)
    server.state.script.latency_s = 0.02
    cache = _Recording(tmp_path / "cache", fail_from=2, keeps=keeps)
    stats = RunStats()
    with pytest.raises(CacheError, match="disk full"):
        await s.run(cache, stats=stats)
    stored = set(cache.batches[0])
    refused = set().union(*map(set, cache.batches[1:]))
    assert refused and not refused & stored
    if keeps:
        stored |= refused
    else:
        assert refused <= set(stats.missing) and not refused & stats.called
    assert stats.called == stored and stats.api_calls == len(stored)
    assert cache.has_many(s.keys) == stored
    cache.close()
    with Cache(tmp_path / "cache") as again:  # the rerun asks for everything not stored
        rerun = await s.run(again)
        assert rerun.cache_hits == len(stored) and rerun.api_calls == 24 - len(stored)


async def test_stop_event_lets_in_flight_finish(study: Callable[..., Study],
                                                server: ThreadedServer, cache: Cache) -> None:
    s = study(20)
    server.state.script.latency_s = 0.1
    stop = asyncio.Event()
    sent_at_stop: list[int] = []

    def progress(stats: RunStats) -> None:
        # The first answer comes alone (the breaker's probe): stop at the next one, with the
        # pool in full flight.
        if stats.api_calls >= 2 and not stop.is_set():
            stop.set()  # the first Ctrl-C, as the second answer is stored
            sent_at_stop.append(stats.attempts)

    stats = await s.run(cache, stop=stop, on_progress=progress)
    assert stats.interrupted and stats.fatal is None and stats.failures == {}
    # Those in flight at the stop finished and were stored; nothing was sent after it.
    sent = sent_at_stop[0]
    assert 4 <= sent < 20 and stats.api_calls == sent == server.state.requests
    assert cache.stats()["entries"] == sent and len(stats.missing) == 20 - sent
    assert set(stats.missing) | stats.called == set(s.keys)
    rerun = await s.run(cache)
    assert rerun.cache_hits == sent and rerun.api_calls == 20 - sent
    assert server.state.requests == 20


async def test_stop_during_a_429_pause(study: Callable[..., Study], server: ThreadedServer,
                                      cache: Cache) -> None:
    """The first Ctrl-C during a long pause: end now, and send nothing when the pause ends."""
    s = study(20)
    script = server.state.script
    script.latency_s = 0.05
    script.retry_after = 5.0
    script.queue = ["ok", "429"]
    stop = asyncio.Event()
    stats = RunStats()

    async def stop_after_429() -> None:
        # A retry is counted as the 429 is taken, with no await before the pause: from then
        # the pool is in the pause.
        while not stats.retries:
            await asyncio.sleep(0.005)
        stop.set()

    started = time.monotonic()
    async with asyncio.timeout(10):
        await asyncio.gather(stop_after_429(), s.run(cache, stop=stop, stats=stats))
    assert time.monotonic() - started < 2
    assert stats.interrupted and stats.failures == {}
    ((_, replied, _),) = [entry for entry in server.state.log if entry[2] == "429"]
    assert _requests_between(server, replied + 0.03, replied + 60) == []
    assert stats.api_calls + len(stats.missing) == 20 and len(stats.missing) >= 15


async def test_cancel_abandons_in_flight_requests(study: Callable[..., Study],
                                                  server: ThreadedServer, cache: Cache) -> None:
    """The second Ctrl-C cancels the caller: it must end at once, not drain the queue."""
    s = study(20)
    server.state.script.latency_s = 1.0
    run = asyncio.ensure_future(s.run(cache, limits={"concurrency": 2}))
    async with asyncio.timeout(5):  # the first answer (the breaker's probe), then two more
        while server.state.requests < 3:
            await asyncio.sleep(0.01)
    started = time.monotonic()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(run, timeout=2)
    assert time.monotonic() - started < 0.5
    assert cache.stats()["entries"] == 1 and server.state.requests == 3


async def test_unexpected_worker_error_ends_the_run(study: Callable[..., Study],
                                                    server: ThreadedServer,
                                                    cache: Cache) -> None:
    """A bug in a worker must surface as an error, never as a hang with a full queue."""
    s = study(10)
    s.endpoints = {}  # every task names a model with no endpoint: KeyError in the worker
    started = time.monotonic()
    with pytest.raises(ExceptionGroup) as info:
        await s.run(cache, limits={"concurrency": 1})
    assert info.group_contains(KeyError)
    assert time.monotonic() - started < 2
    assert server.state.requests == 0


# ------------------------------------------------------------------------- fault mix


async def test_fault_mix(study: Callable[..., Study], server: ThreadedServer, cache: Cache,
                         cache_dir: Path) -> None:
    s = study(200)
    script = server.state.script
    script.faults = {"429": 0.10, "500": 0.05, "drop": 0.02, "malformed": 0.01}  # seed 0
    script.retry_after = 0.01
    first = await s.run(cache, limits={"concurrency": 8, "max_retries": 1})
    seen = server.state.status
    assert all(seen[f] for f in ("429", "500", "drop", "malformed")), seen
    keys = s.keys
    reason = re.compile(r"^(429: Rate limit reached|500: fake 500"
                        r"|connection: connection dropped \(.+\)|malformed: .+)$")
    for key in keys:
        assert (key in cache) != (key in first.failures)
        assert key in first.failures or key in first.called
    assert all(reason.match(r) for r in first.failures.values()), first.failures
    assert cache.stats()["entries"] == first.api_calls
    assert first.api_calls + len(first.failures) == 200 == first.total
    assert first.attempts == server.state.requests == 200 + first.retries
    assert first.missing == [] and first.fatal is None
    assert server.state.max_in_flight <= 8

    failed = set(first.failures)
    before = server.state.requests
    second = await s.run(cache, limits={"concurrency": 8, "max_retries": 6})
    assert second.cache_hits == 200 - len(failed) and second.called | set(second.failures) == failed
    assert second.attempts == server.state.requests - before
    assert cache.stats()["entries"] == 200 - len(second.failures)
    assert KEY.encode() not in _cache_bytes(cache_dir)


def test_backoff_is_capped_with_jitter_and_honours_retry_after() -> None:
    delays = [backoff(attempt) for attempt in range(20) for _ in range(20)]
    assert all(0 < d <= execute_module.BACKOFF_CAP_S for d in delays)
    assert len(set(delays)) > 100  # jitter
    assert backoff(0, retry_after=0.5) >= 0.5 and backoff(0, retry_after=0.0) > 0

