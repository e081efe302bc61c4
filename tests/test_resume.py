"""Interrupt a real `judge run` (SIGKILL, Ctrl-C, Ctrl-C twice), rerun, and check that only
what was missing is requested again, that the final reports have every task exactly once, and
that a further run makes no request at all.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.fakeserver import ThreadedServer
from tests.processes import Child, Processes, processes_fixture, wait_until  # noqa: F401
from tests.test_cli import (
    OPENMEVA,
    SUBPROCESS_TIMEOUT_S,
    clean_env,
    judge_cmd,
    judgments,
    manifest,
    run_judge,
)

LIMIT = 60
CONCURRENCY = 4
SLOW_S = 3.0  # latency of the requests a second Ctrl-C must cancel
LATENCY_S = 0.2  # 60 tasks / 4 in flight x 0.2 s: a run takes ~3 s, long enough to interrupt


def _args(server: ThreadedServer, tmp_path: Path) -> tuple[object, ...]:
    return ("run", OPENMEVA, "--limit", LIMIT, "--concurrency", CONCURRENCY,
            "--base-url", server.url, "--model", "fake",
            "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")


@pytest.fixture
def started(server: ThreadedServer, tmp_path: Path, data_dir: Path, processes: Processes
            ) -> tuple[Child, tuple[object, ...]]:
    """A `judge run` in a subprocess, returned once the server has answered 10 requests; the
    `processes` fixture ends it whatever the test does."""
    server.state.script.latency_s = LATENCY_S
    args = _args(server, tmp_path)
    proc = processes.start(judge_cmd(*args), env=clean_env(data_dir), cwd=tmp_path)
    wait_until(lambda: server.state.answered >= 10 or proc.proc.poll() is not None,
               "the run getting going")
    assert proc.proc.poll() is None, "".join(proc.err)
    return proc, args


def _complete(out: Path) -> None:
    """Every task exactly once, all answered."""
    lines = judgments(out)
    assert len(lines) == LIMIT
    assert len({(line["item_id"], line["key"]) for line in lines}) == LIMIT
    assert all(line["error"] is None and line["score"] is not None for line in lines)


@pytest.mark.slow
def test_kill_9_then_rerun_requests_only_what_was_missing(
        started: tuple[Child, tuple[object, ...]], server: ThreadedServer,
        tmp_path: Path, data_dir: Path) -> None:
    proc, args = started
    proc.signal(signal.SIGKILL)
    code, _, _ = proc.finish(timeout=SUBPROCESS_TIMEOUT_S)
    assert code == -signal.SIGKILL
    # the server finishes the requests that were in flight (their answers go nowhere)
    wait_until(lambda: server.state.in_flight == 0, "the in-flight requests ending")
    before = server.state.requests
    assert before < LIMIT, "the run finished before the kill; nothing was tested"
    server.state.script.latency_s = 0

    rerun = run_judge(*args, env=clean_env(data_dir), cwd=tmp_path)

    assert rerun.returncode == 0, rerun.stderr
    _complete(tmp_path / "out")
    bodies = server.state.bodies
    assert len(bodies) == LIMIT
    repeated = [n for n in bodies.values() if n > 1]
    assert len(repeated) <= CONCURRENCY and set(repeated) <= {2}, bodies
    counts = manifest(tmp_path / "out")["counts"]
    assert counts["api_calls"] == server.state.requests - before
    assert counts["cache_hits"] + counts["api_calls"] == LIMIT

    third = run_judge(*args, env=clean_env(data_dir), cwd=tmp_path)

    assert third.returncode == 0, third.stderr
    assert server.state.requests == before + counts["api_calls"]
    assert manifest(tmp_path / "out")["counts"]["cache_hits"] == LIMIT
    _complete(tmp_path / "out")


@pytest.mark.slow
def test_ctrl_c_stops_dispatch_exits_130_and_says_how_to_resume(
        started: tuple[Child, tuple[object, ...]], server: ThreadedServer,
        tmp_path: Path, data_dir: Path) -> None:
    proc, args = started
    proc.signal(signal.SIGINT)
    at_signal = server.state.requests
    code, _, stderr = proc.finish(timeout=SUBPROCESS_TIMEOUT_S)

    assert code == 130, stderr
    assert "Traceback" not in stderr
    command = " ".join(["judge", *map(str, args)])
    assert stderr.splitlines()[-1].endswith(f"rerun to resume: {command}"), stderr
    # In-flight requests finish and are stored; nothing new is sent (a worker that had
    # already taken a task when the signal came may still send it).
    assert server.state.requests - at_signal <= CONCURRENCY
    counts = manifest(tmp_path / "out")["counts"]
    assert counts["failures"] == 0 and counts["not_run"] > 0
    assert counts["api_calls"] + counts["not_run"] == LIMIT
    assert counts["api_calls"] == server.state.requests
    first = server.state.requests
    server.state.script.latency_s = 0

    rerun = run_judge(*args, env=clean_env(data_dir), cwd=tmp_path)

    assert rerun.returncode == 0, rerun.stderr
    _complete(tmp_path / "out")
    assert server.state.requests - first == counts["not_run"]
    assert len(server.state.bodies) == LIMIT and set(server.state.bodies.values()) == {1}


@pytest.mark.slow
def test_second_ctrl_c_cancels_in_flight_requests_without_a_traceback(
        started: tuple[Child, tuple[object, ...]], server: ThreadedServer,
        tmp_path: Path, data_dir: Path) -> None:
    proc, args = started
    sent_before = server.state.requests
    server.state.script.latency_s = SLOW_S  # what is sent from now on is in flight at the 2nd ^C
    wait_until(lambda: server.state.requests > sent_before, "a slow request being sent")
    proc.signal(signal.SIGINT)
    proc.wait_for("stopping: no new requests")  # the first Ctrl-C is taken
    sent = time.monotonic()
    proc.signal(signal.SIGINT)
    code, _, stderr = proc.finish(timeout=SUBPROCESS_TIMEOUT_S)
    exited_after = time.monotonic() - sent
    server.state.script.latency_s = 0

    assert code == 130, stderr
    assert "Traceback" not in stderr
    assert "rerun to resume: judge run " in stderr

    rerun = run_judge(*args, env=clean_env(data_dir), cwd=tmp_path)

    assert rerun.returncode == 0, rerun.stderr
    _complete(tmp_path / "out")
    # Requests in flight at the second Ctrl-C needed >= SLOW_S - 0.5 s more: not waited for.
    assert exited_after < SLOW_S - 0.5, f"the second Ctrl-C waited {exited_after:.1f} s"
