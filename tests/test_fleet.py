"""Tests for fleets (runner.execute.fleet): one model served by several fake servers on 127.0.0.1.

Routing by capacity, a replica killed mid-run (its work moves to the others, nothing lost, no
duplicate calls beyond what was in flight), keys that ignore which replica answered, limits
learned from rate-limit headers, and the per-endpoint counts in the manifest and progress line
through the real `judge` CLI. Every run is bounded by `asyncio.timeout` or a subprocess timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from runner.execute import fleet as fleet_module
from runner.execute import pool as pool_module
from runner.execute.pool import Endpoint, RunStats, execute
from runner.execute.store.cache import Cache
from runner.job.load import load_job
from runner.job.spec import Job, Limits
from runner.prepare import prepare
from tests.conftest import ROOT, JobWriter
from tests.fakeproviders import Fake, ProviderServer
from tests.fakeserver import Script, ThreadedServer
from tests.test_cli import clean_env, run_judge

RUN_TIMEOUT_S = 30.0

JOB = """
[[datasets]]
name = "mine"
path = "data.jsonl"
fields = {{ id = "id", text = {{ output = "output" }} }}

[[prompts]]
name = "stars"
template = "prompt.txt"
parser = "stars"
aspects = ["overall"]
params = {{ temperature = 0, max_tokens = 4 }}

[models.judge]
spec = "fleet-judge"
endpoints = [{endpoints}]
"""


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "BACKOFF_BASE_S", 0.001)
    monkeypatch.setattr(pool_module, "BACKOFF_CAP_S", 0.01)


def stop(server: ThreadedServer) -> None:
    """Stop a fake server unless it was already stopped (killed mid-run)."""
    if not server.loop.is_closed():
        server.__exit__(None, None, None)


@contextlib.contextmanager
def servers(n: int, latency_s: float) -> Iterator[list[ThreadedServer]]:
    with contextlib.ExitStack() as stack:
        started = []
        for _ in range(n):
            server = ThreadedServer(Script(latency_s=latency_s)).__enter__()
            stack.callback(stop, server)
            started.append(server)
        yield started


def fleet_job(write_job: JobWriter, entries: list[str], n: int, toml: str = JOB) -> Job:
    rows = [{"id": f"item{i:04d}", "output": f"Story {i}"} for i in range(n)]
    path = write_job(toml.format(endpoints=", ".join(entries)), rows=rows,
                     files={"prompt.txt": "Rate {{aspect}} in stars: {{output}}"})
    return load_job(path)


async def run(job: Job, cache: Cache, stop: asyncio.Event | None = None,
              **limits: Any) -> RunStats:
    expansion = prepare(job, ROOT)
    endpoints = {m.name: Endpoint(model=m, base_url=m.base_url or "",
                                  key_reader=lambda name: lambda: None) for m in job.models}
    async with aiohttp.ClientSession() as session, asyncio.timeout(RUN_TIMEOUT_S):
        return await execute(expansion.tasks(), cache=cache, session=session,
                             endpoints=endpoints,
                             limits=Limits(**{"concurrency": 12, "max_retries": 6, **limits}),
                             total=expansion.count(), stop=stop)


async def test_four_replicas_one_killed_mid_run(write_job: JobWriter, cache_dir: Path) -> None:
    n = 240
    with servers(4, latency_s=0.02) as fleet:
        rpms = [6000, 6000, 3000, 3000]
        job = fleet_job(write_job, [f'{{base_url = "{s.url}", rpm = {r}}}'
                                    for s, r in zip(fleet, rpms, strict=True)], n)
        killed = fleet[3]

        async def kill_when_a_third_is_done() -> None:
            while sum(s.state.answered for s in fleet) < n // 3:
                await asyncio.sleep(0.005)
            await asyncio.to_thread(stop, killed)

        with Cache(cache_dir) as cache:
            killer = asyncio.create_task(kill_when_a_third_is_done())
            stats = await run(job, cache)
            await killer
            got = [cache.get(t.key) for t in prepare(job, ROOT).tasks()]
        answered = [s.state.answered for s in fleet]
        requests = sum(s.state.requests for s in fleet)
    # The run completes: every task answered and stored, none lost.
    assert (stats.api_calls, stats.failures, stats.missing) == (n, {}, [])
    assert all(r is not None for r in got)
    assert {r["replica"] for r in got if r} <= {s.url for s in fleet}
    assert {r["endpoint"] for r in got if r} == {"fleet:compatible"}
    # No duplicate calls beyond the requests in flight at the killed replica.
    assert n <= requests <= n + 12
    assert sum(answered) - n <= 12
    # Spread by capacity among the replicas that lived through the run (2 : 2 : 1).
    big, big2, small = answered[:3]
    assert 0.7 < big / big2 < 1.4, answered
    assert big > 1.4 * small and big2 > 1.4 * small, answered
    assert killed.state.answered >= n // 30  # it served its share (~13) until killed
    counts = stats.endpoints["judge"]
    assert counts[killed.url]["cooldowns"] >= 1 and counts[killed.url]["failures"] >= 3
    assert [counts[s.url]["calls"] for s in fleet[:3]] == answered[:3]


async def test_the_replica_is_not_in_the_key(write_job: JobWriter, tmp_path: Path,
                                             cache_dir: Path) -> None:
    """A fleet change (other replicas, other count) keeps every cached answer."""
    with servers(2, latency_s=0.0) as (a, b):
        first = fleet_job(write_job, [f'{{base_url = "{a.url}"}}', f'{{base_url = "{b.url}"}}'],
                          12)
        with Cache(cache_dir) as cache:
            stats = await run(first, cache)
            assert stats.api_calls == 12 and a.state.answered > 0 and b.state.answered > 0
            (tmp_path / "job" / "job.toml").unlink()
            second = fleet_job(write_job, [f'{{base_url = "{b.url}", rpm = 600}}'], 12)
            again = await run(second, cache)
    assert (again.cache_hits, again.api_calls) == (12, 0)
    assert a.state.requests + b.state.requests == 12


async def test_learned_limits_keep_a_600_rpm_server_free_of_429s(
        write_job: JobWriter, cache_dir: Path) -> None:
    n = 40
    toml = JOB.replace('spec = "fleet-judge"\nendpoints = [{endpoints}]',
                       'spec = "fleet-judge"\nbase_url = "{endpoints}"')
    with ProviderServer(Fake(limit_rpm=600, burst=20, latency_s=0.01)) as server:
        job = fleet_job(write_job, [server.root + "/v1"], n, toml)
        started = time.monotonic()
        with Cache(cache_dir) as cache:
            stats = await run(job, cache, concurrency=8)
        elapsed = time.monotonic() - started
    assert (stats.api_calls, stats.failures) == (n, {})
    assert server.fake.status.get(429, 0) == 0 and stats.retries == 0
    assert elapsed >= (n - 20) / 10 - 0.5  # paced at 10/s after the first burst
    replica = stats.endpoints["judge"][server.root + "/v1"]
    assert (replica["rpm"], replica["tpm"]) == ("600 (learned)", "1000000 (learned)")


async def test_without_learning_the_same_server_answers_429(
        write_job: JobWriter, cache_dir: Path) -> None:
    """The control: the server above does enforce its limit on a client that does not pace."""
    toml = JOB.replace('spec = "fleet-judge"\nendpoints = [{endpoints}]',
                       'spec = "fleet-judge"\nbase_url = "{endpoints}"')
    with ProviderServer(Fake(limit_rpm=600, burst=20, latency_s=0.01, announce=False)) as server:
        job = fleet_job(write_job, [server.root + "/v1"], 40, toml)
        with Cache(cache_dir) as cache:
            await run(job, cache, concurrency=8, max_retries=0)
    assert server.fake.status.get(429, 0) > 0


async def test_limits_set_in_the_job_are_never_exceeded(write_job: JobWriter,
                                                        cache_dir: Path) -> None:
    """The server announces 6000 rpm; the job's 120 rpm per replica still paces (2 a second
    after the one-second bucket's burst)."""
    with ProviderServer(Fake(limit_rpm=6000, burst=1000)) as server:
        job = fleet_job(write_job, [f'{{base_url = "{server.root}/v1", rpm = 120}}'], 6)
        started = time.monotonic()
        with Cache(cache_dir) as cache:
            stats = await run(job, cache, concurrency=6)
        elapsed = time.monotonic() - started
    assert stats.api_calls == 6 and elapsed >= 1.5  # 2 at once, then 2/s: >= 2 s
    assert stats.endpoints["judge"][server.root + "/v1"]["rpm"] == "120"


@pytest.mark.slow
def test_cli_run_shows_and_records_per_endpoint_counts(write_job: JobWriter, tmp_path: Path,
                                                       data_dir: Path) -> None:
    with servers(2, latency_s=0.0) as (a, b):
        job = fleet_job(write_job, [f'{{base_url = "{a.url}", rpm = 6000}}',
                                    f'{{base_url = "{b.url}"}}'], 10)
        result = run_judge("run", job.path, "--cache-dir", tmp_path / "cache", "--out",
                           tmp_path / "out", env=clean_env(data_dir), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = orjson.loads((tmp_path / "out" / "manifest.json").read_bytes())
    counts = manifest["endpoints"]["judge"]
    assert set(counts) == {a.url, b.url}
    assert counts[a.url]["calls"] + counts[b.url]["calls"] == 10
    assert counts[a.url]["calls"] == a.state.answered and counts[a.url]["rpm"] == "6000"
    # The last progress line: calls per replica and effective limits (the fake server announces
    # none, so nothing was learned).
    assert f"judge[127.0.0.1:{a.port} {a.state.answered} rpm=6000, " \
           f"127.0.0.1:{b.port} {b.state.answered}]" in result.stderr


@pytest.mark.slow
def test_cli_names_a_missing_replica_key_before_any_call(write_job: JobWriter, tmp_path: Path,
                                                        data_dir: Path) -> None:
    with servers(1, latency_s=0.0) as (a,):
        toml = JOB.replace('spec = "fleet-judge"', 'spec = "openai:gpt-4o-mini"')
        job = fleet_job(write_job, [f'{{base_url = "{a.url}", api_key_env = "KEY_A"}}',
                                    f'{{base_url = "{a.url}", api_key_env = "KEY_B"}}'], 3, toml)
        result = run_judge("run", job.path, "--cache-dir", tmp_path / "cache",
                           env=clean_env(data_dir, KEY_A="sk-a"), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"Error: {job.path}: model 'judge' endpoint {a.url} needs "
                                     "an API key: set KEY_B (no call was made)")
    assert a.state.requests == 0


async def test_a_failing_replica_cools_down_and_is_probed_back(
        write_job: JobWriter, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_module, "COOLDOWN_S", 0.3)
    with servers(2, latency_s=0.02) as (a, b):
        a.state.script.queue = ["500"] * 3  # a 5xx streak, then healthy again
        job = fleet_job(write_job, [f'{{base_url = "{a.url}"}}', f'{{base_url = "{b.url}"}}'],
                        160)
        with Cache(cache_dir) as cache:
            stats = await run(job, cache, concurrency=4)
    assert (stats.api_calls, stats.failures) == (160, {})
    counts = stats.endpoints["judge"][a.url]
    assert (counts["failures"], counts["cooldowns"], counts["state"]) == (3, 1, "up")
    out_at = max(replied for _, replied, outcome in a.state.log if outcome == "500")
    arrivals = sorted(t for t, _, _ in a.state.log)
    # Nothing sent during the cool-down (a request already on its way may land just after).
    assert not [t for t in arrivals if out_at + 0.02 < t < out_at + 0.25]
    back = [t for t in arrivals if t >= out_at + 0.25]
    assert len(back) >= 10  # probed back, then routed to again
    assert sum(1 for t in back if t < back[0] + 0.015) == 1  # one probe first (20 ms latency)


async def test_stop_while_every_replica_is_out_sends_nothing_more(
        write_job: JobWriter, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_module, "COOLDOWN_S", 30.0)
    monkeypatch.setattr(fleet_module, "STOP_CHECK_S", 0.05)
    with servers(2, latency_s=0.0) as (a, b):
        for s in (a, b):
            s.state.script.faults = {"500": 1.0}
        job = fleet_job(write_job, [f'{{base_url = "{a.url}"}}', f'{{base_url = "{b.url}"}}'],
                        6)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.5, stop.set)
        started = time.monotonic()
        with Cache(cache_dir) as cache:
            stats = await run(job, cache, concurrency=2, stop=stop)
    assert time.monotonic() - started < 3  # not the 30 s cool-down
    assert stats.interrupted and stats.api_calls == 0
    assert a.state.requests + b.state.requests <= 2 * (fleet_module.STREAK + 1)
    assert {c["state"] for c in stats.endpoints["judge"].values()} == {"out"}


async def test_a_429_rests_only_that_replica(write_job: JobWriter, cache_dir: Path) -> None:
    with servers(2, latency_s=0.01) as (a, b):
        a.state.script.queue = ["429"]
        a.state.script.retry_after = 0.4
        job = fleet_job(write_job, [f'{{base_url = "{a.url}"}}', f'{{base_url = "{b.url}"}}'],
                        60)
        with Cache(cache_dir) as cache:
            stats = await run(job, cache, concurrency=2)
    assert (stats.api_calls, stats.failures) == (60, {})
    limited = next(replied for _, replied, outcome in a.state.log if outcome == "429")
    assert not [t for t, _, _ in a.state.log if limited + 0.02 < t < limited + 0.35]
    # b kept answering meanwhile: no pool-wide pause
    assert len([t for t, _, _ in b.state.log if limited < t < limited + 0.35]) >= 5
    assert stats.endpoints["judge"][a.url]["cooldowns"] == 0


async def test_effective_limits_say_where_they_come_from(write_job: JobWriter) -> None:
    job = fleet_job(write_job, ['{base_url = "http://127.0.0.1:9/v1", rpm = 60}',
                                '{base_url = "http://127.0.0.1:10/v1"}'], 1,
                    JOB + "rpm = 600\n")
    counts: dict[str, dict[str, Any]] = {}
    fleet_module.fleet_for(job.models[0], "", lambda: None, lambda name: lambda: None,
                           Limits(tpm=1000), counts)
    assert [(c["rpm"], c["tpm"]) for c in counts.values()] == [
        ("60", "1000 (model)"), ("600 (model)", "1000 (model)")]


async def test_take_routes_a_lone_unpaced_replica_without_waiting_and_defers_the_rest() -> None:
    from runner.execute.limiter import Limiter
    from runner.execute.providers import provider

    def replica(url: str, limiter: Limiter | None = None) -> fleet_module.Replica:
        return fleet_module.Replica(label=url, provider=provider("openai", url),
                                    api_key=lambda: None, limiter=limiter,
                                    counts={"calls": 0, "failures": 0})

    lone = fleet_module.Fleet([replica("http://127.0.0.1:9/v1")])
    first = lone.take()
    assert first is lone.replicas[0] and lone.take() is first and first.in_flight == 2
    lone.succeeded(first, {}, 10, None)
    lone.release(first)
    assert first.in_flight == 0
    paced = fleet_module.Fleet([replica("http://127.0.0.1:9/v1", Limiter(600, None))])
    several = fleet_module.Fleet([replica("http://127.0.0.1:9/v1"),
                                  replica("http://127.0.0.1:10/v1")])
    assert paced.take() is None and several.take() is None  # acquire() routes these
    assert all(r.in_flight == 0 for r in paced.replicas + several.replicas)


async def test_each_replica_knows_the_variable_its_key_comes_from() -> None:
    """The message for a refused key names the replica's own variable: two keys for one URL
    (labels `URL [K1]`, `URL [K2]`) and a URL that is a prefix of another are told apart."""
    from runner.job.models import parse_model_spec
    from runner.job.spec import EndpointSpec
    base = "http://127.0.0.1:1/v1"
    fleet = (EndpointSpec(base_url=base, api_key_env="K1"),
             EndpointSpec(base_url=base, api_key_env="K2"),
             EndpointSpec(base_url=base + "beta", api_key_env="K3"))
    model = parse_model_spec("m", name="judge", base_url=base, endpoints=fleet)
    built = fleet_module.fleet_for(model, base, lambda: None, lambda name: lambda: None,
                                   Limits(), {})
    assert [(r.label, r.key_env) for r in built.replicas] == [
        (f"{base} [K1]", "K1"), (f"{base} [K2]", "K2"), (f"{base}beta", "K3")]
    single = fleet_module.fleet_for(parse_model_spec("m", base_url=base, api_key_env="MINE"),
                                    base, lambda: None, None, Limits(), {})
    assert [r.key_env for r in single.replicas] == ["MINE"]


async def test_a_replica_asking_for_a_day_is_left_out_and_the_fleet_goes_on(
        write_job: JobWriter, cache_dir: Path) -> None:
    """A Retry-After over limits.max_wait_s stops a run only when no other replica is up: in a
    fleet, the replica that asked sits out and the others answer every task."""
    with servers(2, latency_s=0.01) as (a, b):
        a.state.script.queue = ["429"]
        a.state.script.retry_after = 86400
        job = fleet_job(write_job, [f'{{base_url = "{a.url}"}}', f'{{base_url = "{b.url}"}}'],
                        30)
        with Cache(cache_dir) as cache:
            stats = await run(job, cache, concurrency=2)
    assert stats.fatal is None and (stats.api_calls, stats.failures) == (30, {})
    assert any(outcome == "429" for _, _, outcome in a.state.log)  # it did ask
