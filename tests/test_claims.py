"""In-flight claims (runner/execute/claims.py): runs of different jobs whose tasks render the same
requests, at once on one cache, buy each request once; a killed run's claims lapse. Real
`judge` processes against a slow fake server, a real folder and a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sqlite3
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runner.errors import CacheError
from runner.execute.claims import Claims
from runner.execute.stats import RunStats
from runner.execute.store.backend import open_cache
from runner.execute.store.claimtable import Owner
from tests.fakebatch import BatchServer
from tests.fakeserver import ThreadedServer
from tests.processes import Child, Processes, processes_fixture, wait_until
from tests.test_cli import JOB, clean_env, error_line, judge_cmd, run_judge, write_job

pytestmark = pytest.mark.slow  # real CLI processes, a tmpfs or PostgreSQL

__all__ = ["processes_fixture"]

LIMIT = 40
CONCURRENCY = 2

Start = Callable[..., Child]


@pytest.fixture
def start(server: ThreadedServer, tmp_path: Path, data_dir: Path, processes: Processes,
          location: str) -> Start:
    """Starts `judge run` of job file `name` (the same tasks whatever the name) on the cache."""
    def run(name: str, limit: int = LIMIT, **env: str) -> Child:
        job = write_job(tmp_path, JOB, f"{name}.toml")
        flag = "--cache" if location.startswith("postgresql://") else "--cache-dir"
        return processes.start(
            judge_cmd("run", job, "--limit", limit, "--concurrency", CONCURRENCY, "--base-url",
                      server.url, "--model", "fake", flag, location, "--out",
                      tmp_path / f"out-{name}", "--yes"),
            env=clean_env(data_dir, **env), cwd=tmp_path)
    return run


def _complete(child: Child, out: Path, tasks: int = LIMIT) -> None:
    """The run ended well, its reports written from an answer for every task."""
    code, _, err = child.finish()
    assert code == 0, err
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert counts["tasks"] == tasks and counts["cache_hits"] + counts["api_calls"] == tasks, counts
    assert counts["failures"] == counts["not_run"] == 0, counts


@pytest.mark.parametrize(("runs", "ttl"), [(2, ""), (4, ""), (2, "1.5")],
                         ids=["two", "four", "two-renewing"])
def test_concurrent_jobs_with_the_same_requests_buy_each_request_once(
        server: ThreadedServer, start: Start, tmp_path: Path, runs: int, ttl: str) -> None:
    """Fails without claims: every run buys what it looked up before another stored it. With
    claims that expire in 1.5 s, runs of ~4 s each: only renewal keeps them held."""
    server.state.script.latency_s = 0.2 if ttl else 0.1  # ~2-4 s of calls alone: they overlap
    children = [start(f"study{i}", JUDGE_CLAIM_TTL_S=ttl) for i in range(runs)]
    for i, child in enumerate(children):
        _complete(child, tmp_path / f"out-study{i}")
    assert len(server.state.bodies) == LIMIT
    assert server.state.requests == LIMIT, server.state.bodies.most_common(3)


def test_overlapping_jobs_at_once_buy_each_request_once(
        server: ThreadedServer, start: Start, tmp_path: Path) -> None:
    """Three studies whose tasks overlap (the first 25, 40 and 30 items of one data set)."""
    server.state.script.latency_s = 0.1
    limits = {"small": 25, "large": LIMIT, "middle": 30}
    children = {name: start(name, limit) for name, limit in limits.items()}
    for name, child in children.items():
        _complete(child, tmp_path / f"out-{name}", limits[name])
    assert server.state.requests == len(server.state.bodies) == LIMIT


def test_a_killed_runs_claims_lapse_and_the_next_run_buys_each_missing_request_once(
        server: ThreadedServer, start: Start, tmp_path: Path) -> None:
    """kill -9 mid-way, another job at once: it waits for the dead run's claims to lapse (1 s
    here), then buys what is missing, once; only the requests in flight at the kill were paid
    before and are paid again."""
    server.state.script.latency_s = 0.2
    first = start("first", JUDGE_CLAIM_TTL_S="1")
    wait_until(lambda: server.state.answered >= 6, "the first run did not store answers")
    first.proc.kill()
    first.finish()  # reaped: its pid is gone
    started = time.monotonic()
    server.state.script.latency_s = 0.0
    second = start("second", JUDGE_CLAIM_TTL_S="1")
    _complete(second, tmp_path / "out-second")
    assert time.monotonic() - started < 30
    assert len(server.state.bodies) == LIMIT
    assert server.state.requests <= LIMIT + CONCURRENCY, server.state.bodies.most_common(3)


def _owners(location: str) -> int:
    """How many runs hold claims on the cache now."""
    if location.startswith("postgresql://"):
        with psycopg.connect(location, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM judge_claim_owner").fetchone()
    else:
        path = Path(location) / "claims.db"
        if not path.exists():
            return 0
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
            row = conn.execute("SELECT count(*) FROM owner").fetchone()
    return int(row[0]) if row else 0


def test_a_stopped_run_gives_its_claims_back_and_the_waiting_run_buys_the_rest_at_once(
        server: ThreadedServer, start: Start, tmp_path: Path, location: str) -> None:
    """Ctrl-C: the run finishes what is in flight, gives every claim back as it ends, and the
    run waiting for those answers buys them without waiting for the 60 s expiry. Nothing is
    bought twice."""
    server.state.script.latency_s = 0.5  # the first run alone: ~10 s
    first = start("first")
    wait_until(lambda: server.state.answered >= 2, "the first run did not store answers")
    second = start("second")  # every key not answered yet is the first's: it waits
    wait_until(lambda: _owners(location) == 2, "the second run did not claim")
    first.signal(signal.SIGINT)
    code, _, err = first.finish()
    assert code == 130, err
    stopped = time.monotonic()
    server.state.script.latency_s = 0.0
    _complete(second, tmp_path / "out-second")
    assert time.monotonic() - stopped < 30  # not the expiry: the claims were given back
    assert server.state.requests == len(server.state.bodies) == LIMIT


# ---------------------------------------------------------------- the backends' claims

def test_a_key_is_held_by_one_live_run_and_lapses_with_it(location: str) -> None:
    """Claim, already held, released; a lapsed owner's claims are taken over."""
    a, b = Owner(), Owner(run="other")
    with open_cache(location) as cache:
        assert cache.claim(["k1", "k2"], a, 60) == {"k1", "k2"}
        assert cache.claim(["k2", "k3"], b, 60) == {"k3"}  # k2 is a's
        assert cache.claim(["k1", "k2"], a, 60) == {"k1", "k2"}  # a's own: still a's
        cache.release_claims(a, ["k1"])
        assert cache.claim(["k1", "k2"], b, 60) == {"k1"}
        cache.renew_claims(a, 0.2)  # a stops renewing: its claims lapse
        wait_until(lambda: cache.claim(["k2"], b, 60) == {"k2"}, "a's claim did not lapse")
        cache.release_claims(b, ["k1", "k2", "k3"], last=True)
        assert cache.claim(["k1", "k2", "k3"], a, 60) == {"k1", "k2", "k3"}


def test_a_dead_runs_claims_in_a_folder_lapse_at_once(tmp_path: Path,
                                                      processes: Processes) -> None:
    """A run on this host whose pid is gone (kill -9) holds nothing, whatever its expiry."""
    child = processes.start(["sleep", "60"])
    dead = Owner(pid=child.pid)
    with open_cache(tmp_path / "cache") as cache:
        assert cache.claim(["k"], dead, 3600) == {"k"}
        assert cache.claim(["k"], Owner(), 3600) == set()
        child.end()
        assert not os.path.exists(f"/proc/{child.pid}")
        assert cache.claim(["k"], Owner(), 3600) == {"k"}


def test_a_bad_claim_expiry_is_one_error_line(tmp_path: Path, data_dir: Path) -> None:
    done = run_judge("cache", "stats", "--cache-dir", tmp_path / "cache", cwd=tmp_path,
                     env=clean_env(data_dir, JUDGE_CLAIM_TTL_S="0"))
    assert done.returncode == 2, done.stderr
    assert error_line(done.stderr) == ("Error: JUDGE_CLAIM_TTL_S must be seconds between 0.3 and "
                                       "86400 (got '0'); unset it for the default, 60")


def test_a_run_whose_database_session_ended_holds_nothing(pg_url: str) -> None:
    """PostgreSQL ends a killed client's session: its claims lapse then, not at the expiry."""
    gone = open_cache(pg_url)
    assert gone.claim(["k"], Owner(run="gone"), 3600) == {"k"}
    with open_cache(pg_url) as cache:
        assert cache.claim(["k"], Owner(), 3600) == set()  # its session runs: held
        gone.close()
        wait_until(lambda: cache.claim(["k"], Owner(), 3600) == {"k"},
                   "the claim of a run whose session ended did not lapse")


async def test_a_waiting_run_whose_claims_are_refused_keeps_waiting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key another live run buys is not bought at the cache's first refusal of a claim (a
    full disk): only once the refusals have lasted the claims' life, when that run's have
    lapsed anyway."""
    stop, stats = asyncio.Event(), RunStats()
    task: Any = types.SimpleNamespace(key="k")
    with open_cache(tmp_path / "cache") as cache:
        assert cache.claim(["k"], Owner(run="other"), 60) == {"k"}  # another run buys k
        claims = Claims(cache, stop, stats, lambda s: None)
        assert claims.take([task]) == [] and claims.waiting == {"k": task}

        def refused(*args: Any) -> set[str]:
            raise CacheError("cannot store the claims (disk full)")

        monkeypatch.setattr(cache, "claim", refused)
        assert not claims._settle() and claims.ready == [] and claims.waiting == {"k": task}
        claims.ttl_s = 0.0  # the refusals have lasted the claims' life: bought
        assert claims._settle() and claims.ready == [task]
        claims.close()


def test_a_run_in_another_pid_namespace_is_not_judged_by_its_pid(
        tmp_path: Path, processes: Processes) -> None:
    """Containers that share a host name but not their pids: a live run there whose pid is
    dead here keeps its claims until their expiry."""
    child = processes.start(["sleep", "60"])
    # same host name, another pid namespace (a name alone no longer says "same pids")
    elsewhere = Owner(host=socket.gethostname(), pid=child.pid)
    child.end()
    with open_cache(tmp_path / "cache") as cache:
        assert cache.claim(["k"], elsewhere, 3600) == {"k"}
        assert cache.claim(["k"], Owner(), 3600) == set()
    assert " pidns " in Owner().host


def test_batch_runs_of_jobs_with_the_same_requests_submit_each_request_once(
        location: str, tmp_path: Path, data_dir: Path, processes: Processes) -> None:
    """Two jobs' `--batch` runs at once: each looks up its keys before the other's batch is
    in the ledger (the uploads are slow), so without claims both submitted every request."""
    flag = "--cache" if location.startswith("postgresql://") else "--cache-dir"
    with BatchServer() as fake:
        fake.batch.script.hold = True
        fake.batch.script.upload_s = 3.0
        runs = [processes.start(judge_cmd(
            "run", write_job(tmp_path, JOB, f"batch{i}.toml"), "--limit", LIMIT, "--base-url",
            fake.url, "--model", "fake", flag, location, "--out", tmp_path / f"out{i}",
            "--batch", "--no-wait", "--yes"), env=clean_env(data_dir), cwd=tmp_path)
            for i in range(2)]
        for run in runs:
            code, _, err = run.finish()
            assert code == 0, err
        assert len(fake.batch.creations) == LIMIT
        assert set(fake.batch.creations.values()) == {1}, fake.batch.creations



def test_a_budget_does_not_pay_for_the_requests_another_run_is_buying(
        location: str, server: ThreadedServer, tmp_path: Path, data_dir: Path,
        processes: Processes) -> None:
    """The second run's first 20 tasks are the first run's, claimed by it: their answers cost
    the second nothing, so its $5 (~22 tasks at ~$0.22 reserved each) buys its own 20. Before,
    the deferred tasks kept their reservation and the run stopped at its budget early."""
    server.state.script.latency_s = 0.5  # the first run's 20 take ~5 s at concurrency 2
    flag = "--cache" if location.startswith("postgresql://") else "--cache-dir"

    def start(name: str, limit: int, *extra: object) -> Child:
        job = write_job(tmp_path, JOB + "price = { input = 1000, output = 1000 }\n",
                        f"{name}.toml")  # two jobs, the same requests
        return processes.start(judge_cmd(
            "run", job, "--limit", limit, "--concurrency", CONCURRENCY, "--base-url",
            server.url, flag, location, "--out", tmp_path / name, "--yes", *extra),
            env=clean_env(data_dir), cwd=tmp_path)

    first = start("first", 20)
    wait_until(lambda: server.state.answered >= 2, "the first run's progress")
    second = start("second", 40, "--budget", 5)
    for run in (first, second):
        code, _, err = run.finish()
        assert code == 0, err
    assert "--budget reached" not in err, err
    counts = json.loads((tmp_path / "second" / "manifest.json").read_text())["counts"]
    assert counts["not_run"] == 0 and counts["api_calls"] == 20, counts
    assert len(server.state.bodies) == 40 and set(server.state.bodies.values()) == {1}
