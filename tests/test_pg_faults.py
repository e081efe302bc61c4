"""A PostgreSQL cache server that restarts, stays down or freezes in the middle of `judge run`
(runner/execute/store/pgcache.py): a restart is ridden out with every answer stored; a server
that stays down or does not answer ends the run with one `Error:` line naming it, exit 2.

These tests start, stop and freeze a private cluster of their own (tests/pgserver.py), never
the session's shared one."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result

from runner.cli.main import cli
from runner.execute.store import backend, pgcache, pglease, pgsession
from tests.fakeserver import ThreadedServer
from tests.pgserver import PgCluster, find_bindir
from tests.test_cli import ENV_KEYS, OPENMEVA, SUBPROCESS_TIMEOUT_S, clean_env, judge_cmd

LIMIT = 40
CONCURRENCY = 2


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    """A server of this module's own, to restart, stop and freeze."""
    if find_bindir() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    with PgCluster() as pg:
        yield pg


@pytest.fixture
def url(cluster: PgCluster) -> Iterator[str]:
    """A fresh database on `cluster`; the server is running again (and thawed) afterwards."""
    name = f"f{os.getpid()}_{time.monotonic_ns()}"
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    yield cluster.url.rsplit("/", 1)[0] + "/" + name
    _signal(cluster, signal.SIGCONT)
    if not (cluster.data / "postmaster.pid").exists():
        _pg_ctl(cluster, "restart")  # started again with its own options (postmaster.opts)


def _pg_ctl(cluster: PgCluster, action: str) -> None:
    # -l: a started server logs to the file, not to the pipe pg_ctl's caller waits on
    cluster._run("pg_ctl", "-D", str(cluster.data), "-l", str(cluster.root / "log"), "-m",
                 "fast", "-w", "-t", "30", action)


def _server_pids(cluster: PgCluster) -> list[int]:
    """The postmaster and every process it started."""
    pid_file = cluster.data / "postmaster.pid"
    if not pid_file.exists():
        return []
    main = int(pid_file.read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == main:
                children.append(int(entry.name))
    return [main, *children]


def _signal(cluster: PgCluster, sig: signal.Signals) -> None:
    for pid in _server_pids(cluster):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.01)


@pytest.fixture
def invoke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data_dir: Path
           ) -> Callable[..., Result]:
    """`judge` in this process (so that a test can lower pgcache's constants), in tmp_path with
    a clean environment; unexpected exceptions raise."""
    monkeypatch.chdir(tmp_path)
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("JUDGE_DATA_DIR", str(data_dir))
    return lambda *args: CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def _stored(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM judge_cache WHERE source = 'api'").fetchone()
    return int(row[0]) if row else 0


def _leases(url: str) -> int:
    """Run leases held on the server now (store/lease.py: session advisory locks)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND "
                           "classid = %s AND database = (SELECT oid FROM pg_database WHERE "
                           "datname = current_database())", (pglease.LEASE_CLASS,)).fetchone()
    return int(row[0]) if row else 0


def _connections(url: str) -> int:
    """Client connections to the database now, this one left out."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                           "current_database() AND pid <> pg_backend_pid() AND "
                           "backend_type = 'client backend'").fetchone()
    return int(row[0]) if row else 0


def _run_args(server: ThreadedServer, url: str, tmp_path: Path) -> list[Any]:
    return ["run", OPENMEVA, "--limit", LIMIT, "--concurrency", CONCURRENCY, "--base-url",
            server.url, "--model", "fake", "--cache", url, "--out", tmp_path / "out", "--yes"]


@pytest.mark.slow
def test_a_restart_mid_run_is_ridden_out_with_every_answer_stored_once(
        server: ThreadedServer, cluster: PgCluster, url: str, tmp_path: Path,
        data_dir: Path) -> None:
    server.state.script.latency_s = 0.1  # ~2 s of calls: the restart lands in the middle
    proc = subprocess.Popen(judge_cmd(*_run_args(server, url, tmp_path)),
                            env=clean_env(data_dir), cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _until(lambda: server.state.answered >= LIMIT // 4, "the run did not get going")
        _pg_ctl(cluster, "restart")  # drops every connection; refuses new ones meanwhile
        assert proc.poll() is None, "the run ended before the restart: nothing was tested"
        # its lease (dropped with its session) is taken again by the run
        _until(lambda: _leases(url) == 1 or proc.poll() is not None, "no lease again")
        assert proc.poll() is None, "the run ended before its lease was seen again"
        server.state.script.latency_s = 0.0
        _, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and f"{LIMIT} called" in err, err
    assert len(server.state.bodies) == LIMIT and set(server.state.bodies.values()) == {1}
    assert _stored(url) == LIMIT


def _meanwhile(server: ThreadedServer, action: Callable[[], None]) -> threading.Thread:
    """`action` once the run has stored a few answers, in a thread (the run is in-process)."""
    def wait_then_act() -> None:
        _until(lambda: server.state.answered >= 5, "the run did not get going")
        action()

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    return thread


def _one_error_line(result: Any) -> str:
    """The run's stderr ends with one `Error:` line and holds no traceback."""
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and lines, result.stderr
    assert [ln for ln in lines if ln.startswith("Error:")] == lines[-1:], result.stderr
    return str(lines[-1])


@pytest.mark.slow
def test_a_server_that_stays_down_ends_the_run_with_one_error_line(
        server: ThreadedServer, cluster: PgCluster, url: str, tmp_path: Path, invoke: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pgsession, "RECONNECT_WINDOW_S", 1.0)
    server.state.script.latency_s = 0.05
    stopper = _meanwhile(server, lambda: _pg_ctl(cluster, "stop"))
    started = time.monotonic()
    result = invoke(*_run_args(server, url, tmp_path))
    stopper.join(timeout=30)
    assert result.exit_code == 2, result.stderr
    line = _one_error_line(result)
    assert line.startswith(f"Error: postgresql://postgres@127.0.0.1:{cluster.port}/"), line
    assert "the PostgreSQL server does not answer" in line, line
    assert "reconnecting failed for 1 s); check that it is running and reachable" in line, line
    assert time.monotonic() - started < SUBPROCESS_TIMEOUT_S
    assert server.state.answered < LIMIT  # stopped mid-run, not after it


@pytest.mark.slow
def test_answers_the_server_did_not_take_are_kept_and_stored_by_the_rerun(
        server: ThreadedServer, cluster: PgCluster, url: str, tmp_path: Path, invoke: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An outage past the reconnect window stops the run, but the answers it held are kept in
    a spill file and stored by the next run: nothing is bought twice (before, the rerun bought
    them again)."""
    monkeypatch.setattr(pgsession, "RECONNECT_WINDOW_S", 1.0)
    server.state.script.latency_s = 0.05
    stopper = _meanwhile(server, lambda: _pg_ctl(cluster, "stop"))
    result = invoke(*_run_args(server, url, tmp_path))
    stopper.join(timeout=30)
    assert result.exit_code == 2, result.stderr
    assert "the PostgreSQL server does not answer" in _one_error_line(result)
    kept = [ln for ln in result.stderr.splitlines() if "the cache did not take are kept" in ln]
    assert len(kept) == 1, result.stderr
    assert server.state.answered < LIMIT  # stopped mid-run
    _pg_ctl(cluster, "restart")  # started again with its own options (postmaster.opts)
    rerun = invoke(*_run_args(server, url, tmp_path))
    assert rerun.exit_code == 0, rerun.stderr
    assert len(server.state.bodies) == LIMIT and set(server.state.bodies.values()) == {1}
    assert _stored(url) == LIMIT


@pytest.mark.slow
def test_a_frozen_server_ends_the_run_with_one_error_line_within_its_deadline(
        server: ThreadedServer, cluster: PgCluster, url: str, tmp_path: Path, invoke: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pgsession, "QUERY_TIMEOUT_S", 1.0)
    monkeypatch.setattr(pgsession, "RECONNECT_WINDOW_S", 1.0)
    monkeypatch.setattr(pgsession, "CONNECT_TIMEOUT_S", 2)
    server.state.script.latency_s = 0.05
    freezer = _meanwhile(server, lambda: _signal(cluster, signal.SIGSTOP))
    try:
        started = time.monotonic()
        result = invoke(*_run_args(server, url, tmp_path))
        took = time.monotonic() - started
    finally:
        freezer.join(timeout=30)
        _signal(cluster, signal.SIGCONT)
    assert result.exit_code == 2, result.stderr
    line = _one_error_line(result)
    assert line.startswith(f"Error: postgresql://postgres@127.0.0.1:{cluster.port}/"), line
    assert "the PostgreSQL server does not answer (no reply to " in line, line
    assert "within 1 s" in line, line
    assert took < 30, took


@pytest.mark.slow
def test_a_server_lost_at_a_lookup_ends_the_run_with_one_error_line(
        server: ThreadedServer, cluster: PgCluster, url: str, tmp_path: Path, invoke: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's lookups run in its workers: a refused one is the run's one error too, not a
    task group's traceback."""
    monkeypatch.setattr(pgsession, "RECONNECT_WINDOW_S", 1.0)
    monkeypatch.setattr(backend, "LOOKUP_BATCH", 8)  # lookups all through the run
    has_many, calls = pgcache.PgCache.has_many, []

    def stopping(self: pgcache.PgCache, keys: Any) -> set[str]:
        calls.append(len(keys))
        if len(calls) == 3:  # mid-run, at a lookup: the server goes away for good
            _pg_ctl(cluster, "stop")
        return has_many(self, keys)

    monkeypatch.setattr(pgcache.PgCache, "has_many", stopping)
    result = invoke(*_run_args(server, url, tmp_path))
    assert result.exit_code == 2, result.stderr
    line = _one_error_line(result)
    assert "the PostgreSQL server does not answer (a lookup: " in line, line
    # the two batches looked up before it (16 tasks), each called once; on a loaded machine the
    # last of them may not have been sent when the error stopped the run
    assert 0 < len(server.state.bodies) <= 16 and set(server.state.bodies.values()) == {1}


@pytest.mark.slow
def test_a_run_holds_its_lease_on_the_connection_its_pool_stores_with(
        server: ThreadedServer, url: str, tmp_path: Path, invoke: Any) -> None:
    """Run.serve serves the cache Run.lease opened: one connection a run, where the lease held
    a second, idle one."""
    server.state.script.latency_s = 0.05
    seen: list[int] = []
    counter = _meanwhile(server, lambda: seen.extend((_connections(url), _leases(url))))
    result = invoke(*_run_args(server, url, tmp_path))
    counter.join(timeout=30)
    assert result.exit_code == 0, result.stderr
    assert seen == [1, 1]
