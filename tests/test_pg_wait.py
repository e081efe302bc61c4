"""A PostgreSQL cache server that goes away while `judge run` (the real CLI, in a subprocess) is
buying answers: the run waits for it without holding its event loop (PgCache.wait_aside,
runner/execute/commits.py), says so in one line when the wait starts and one when it ends,
and loses or buys twice nothing: stopped for 5 s, stopped for longer than the wait (the
answers kept in a spill file, stored by the rerun), or frozen (SIGSTOP) for longer than the
request timeout.

Each request timeout here is shorter than the outage: the old pool, which waited inside the
store call, held its event loop for the whole outage, so the requests in flight timed out when
it woke up and were sent again.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from runner.execute.store.journal import frames
from tests.fakeserver import ThreadedServer
from tests.pgserver import PgCluster
from tests.test_cli import (
    JOB,
    SUBPROCESS_TIMEOUT_S,
    clean_env,
    judge_cmd,
    run_judge,
    write_job,
)
from tests.test_pg_faults import _pg_ctl, _signal, _stored, _until, cluster, url

__all__ = ["cluster", "url"]  # the fixtures, from tests/test_pg_faults.py

LIMIT = 60
WAITING = "unreachable: waiting up to"


def _start(server: ThreadedServer, url: str, tmp_path: Path, data_dir: Path, timeout_s: float,
           **env: str) -> tuple[subprocess.Popen[str], Path]:
    """`judge run` of LIMIT tasks on the cache `url` with requests timing out after
    `timeout_s`; its stderr goes to a file (read while it runs)."""
    job = write_job(tmp_path, JOB.replace("timeout_s = 10", f"timeout_s = {timeout_s:g}"))
    err = tmp_path / f"stderr-{time.monotonic_ns()}"
    with open(err, "w") as file:
        proc = subprocess.Popen(
            judge_cmd("run", job, "--limit", LIMIT, "--base-url", server.url, "--model", "fake",
                      "--cache", url, "--out", tmp_path / "out", "--yes"),
            env=clean_env(data_dir, **env), cwd=tmp_path, text=True, stdout=subprocess.DEVNULL,
            stderr=file)
    return proc, err


def _finish(proc: subprocess.Popen[str], err: Path) -> str:
    """The run's stderr once it has ended (killed if it overran)."""
    try:
        proc.wait(timeout=SUBPROCESS_TIMEOUT_S * 2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return err.read_text()


def _outage(server: ThreadedServer, proc: subprocess.Popen[str], away: Callable[[], None],
            back: Callable[[], None], seconds: float) -> None:
    """Once a quarter of the answers are in: `away`, for `seconds` (the fault's length), then
    `back`."""
    _until(lambda: server.state.answered >= LIMIT // 4 or proc.poll() is not None,
           "the run did not get going")
    assert proc.poll() is None, "the run ended before the outage: nothing was tested"
    away()
    try:
        time.sleep(seconds)  # the outage itself, not a synchronisation
    finally:
        back()


def _restart(cluster: PgCluster) -> None:
    _pg_ctl(cluster, "restart")  # a stopped server started with its own options (postmaster.opts)


def _once(text: str, needle: str) -> str:
    lines = [line for line in text.splitlines() if needle in line]
    assert len(lines) == 1, text
    return lines[0]


def _bought_once(server: ThreadedServer, url: str) -> None:
    """Every task asked once (requests = distinct keys) and stored."""
    assert len(server.state.bodies) == LIMIT, server.state.bodies
    assert set(server.state.bodies.values()) == {1}, server.state.bodies
    assert _stored(url) == LIMIT


@pytest.mark.slow
def test_a_stopped_server_is_waited_for_with_one_line_each_way(
        server: ThreadedServer, cluster: PgCluster, url: str, tmp_path: Path,
        data_dir: Path) -> None:
    server.state.script.latency_s = 0.2
    proc, err = _start(server, url, tmp_path, data_dir, timeout_s=2)
    _outage(server, proc, lambda: _pg_ctl(cluster, "stop"), lambda: _restart(cluster), seconds=5)
    text = _finish(proc, err)
    _bought_once(server, url)  # the old pool: 4 requests timed out while it waited, sent again
    assert proc.returncode == 0, text
    assert "Traceback" not in text and f"{LIMIT} called" in text, text
    place = f"cache database at postgresql://postgres@127.0.0.1:{cluster.port}/{url.rsplit('/')[-1]}"
    assert _once(text, WAITING).endswith(f"{place} unreachable: waiting up to 60 s; nothing is "
                                         "lost"), text
    assert " held answers stored; the run goes on" in _once(text, f"{place}: back after "), text


@pytest.mark.slow
def test_a_server_away_past_the_wait_stops_the_run_and_the_rerun_buys_nothing_twice(
        server: ThreadedServer, cluster: PgCluster, url: str, tmp_path: Path,
        data_dir: Path) -> None:
    server.state.script.latency_s = 0.2
    proc, err = _start(server, url, tmp_path, data_dir, timeout_s=2, JUDGE_PG_WAIT_S="3")
    _until(lambda: server.state.answered >= LIMIT // 4, "the run did not get going")
    _pg_ctl(cluster, "stop")
    text = _finish(proc, err)
    _restart(cluster)
    assert proc.returncode == 2, text
    assert _once(text, WAITING).endswith("waiting up to 3 s; nothing is lost"), text
    assert "answers the cache did not take are kept in " in _once(text, ": gave up after "), text
    assert text.strip().splitlines()[-1].startswith("Error: "), text
    assert server.state.answered < LIMIT  # stopped mid-run
    rerun, err = _start(server, url, tmp_path, data_dir, timeout_s=2)
    text = _finish(rerun, err)
    assert rerun.returncode == 0, text
    _bought_once(server, url)


@pytest.mark.slow
def test_a_server_frozen_longer_than_the_request_timeout_costs_no_request_twice(
        server: ThreadedServer, cluster: PgCluster, url: str, tmp_path: Path,
        data_dir: Path) -> None:
    """SIGSTOP: the statement in flight gets no answer; the pool counts the server away after
    pgsession.AWAY_AFTER_S (5 s, within the 8 s request timeout), not when it thaws."""
    server.state.script.latency_s = 0.2
    proc, err = _start(server, url, tmp_path, data_dir, timeout_s=8)
    _outage(server, proc, lambda: _signal(cluster, signal.SIGSTOP),
            lambda: _signal(cluster, signal.SIGCONT), seconds=12)
    text = _finish(proc, err)
    _bought_once(server, url)  # the old pool: 4 requests timed out while it waited, sent again
    assert proc.returncode == 0, text
    assert "Traceback" not in text and f"{LIMIT} called" in text, text
    _once(text, WAITING)
    _once(text, ": back after ")


@pytest.mark.slow
def test_answers_held_while_the_server_is_away_survive_a_kill(
        server: ThreadedServer, cluster: PgCluster, url: str, tmp_path: Path,
        data_dir: Path) -> None:
    """kill -9 during the wait: the answers held were also written to a spill file on arrival,
    so the rerun stores them and buys none of them again (held in memory only, they were lost
    and bought twice)."""
    server.state.script.latency_s = 0.2
    xdg = tmp_path / "xdg"  # the spill folder of a database: $XDG_CACHE_HOME/judge-runner/spill
    proc, err = _start(server, url, tmp_path, data_dir, timeout_s=30, XDG_CACHE_HOME=str(xdg))

    def spilled() -> set[str]:
        return {key for path in (xdg / "judge-runner" / "spill").glob("*/*")
                if not path.name.endswith(".new") for key, _ in frames(path.read_bytes())}

    try:
        _until(lambda: server.state.answered >= LIMIT // 4, "the run did not get going")
        _pg_ctl(cluster, "stop")
        _until(lambda: len(spilled()) >= 3, "no answer held during the outage reached a file")
    finally:
        proc.kill()
        proc.wait()
        _restart(cluster)
    kept, stored = spilled(), _stored(url)
    rerun, err = _start(server, url, tmp_path, data_dir, timeout_s=30, XDG_CACHE_HOME=str(xdg))
    text = _finish(rerun, err)
    assert rerun.returncode == 0, text
    assert f"{LIMIT} tasks: {stored + len(kept)} cached" in text, (stored, len(kept), text)
    assert _stored(url) == LIMIT
    assert not spilled()  # stored by the rerun's open, and removed


@pytest.mark.slow
def test_a_bad_wait_is_one_error_line(tmp_path: Path, data_dir: Path) -> None:
    done = run_judge("cache", "stats", "--cache-dir", tmp_path / "cache", cwd=tmp_path,
                     env=clean_env(data_dir, JUDGE_PG_WAIT_S="0.5"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "Error: JUDGE_PG_WAIT_S must be seconds between 1 and 86400 (got '0.5'); unset it for "
        "the default, 60")
