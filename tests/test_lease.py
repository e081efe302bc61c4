"""A run's lease on (cache, job, shard) (runner/execute/store/lease.py): a second `judge run` of
one job on one cache stops before any call and names the first; a killed holder frees it; other
shards run together. Real `judge` processes, a slow fake server, a real folder and PostgreSQL."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from runner.errors import CacheError
from runner.execute.store import pglease
from runner.execute.store.backend import open_cache
from runner.execute.store.lease import (
    FolderLease,
    LeaseHeldError,
    describe,
    lease_id,
    lease_name,
)
from tests.fakeserver import ThreadedServer
from tests.test_cli import OPENMEVA, SUBPROCESS_TIMEOUT_S, clean_env, error_line, judge_cmd

LIMIT = 30
HELD = re.compile(r"^Error: .*: job openmeva shard (all|0/2) is already running on this cache, "
                  r"held by host \S+ pid (\d+) since \S+: judge run .*; wait for it to finish "
                  r"or stop it, then rerun")

Start = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def start(server: ThreadedServer, tmp_path: Path, data_dir: Path) -> Iterator[Start]:
    """Starts `judge run openmeva` on a cache; every process is ended by the test's end."""
    procs: list[subprocess.Popen[str]] = []

    def run(location: str, *extra: str) -> subprocess.Popen[str]:
        flag = "--cache" if location.startswith("postgresql://") else "--cache-dir"
        cmd = judge_cmd("run", OPENMEVA, "--limit", LIMIT, "--concurrency", 1, "--base-url",
                        server.url, "--model", "fake", flag, location, "--out",
                        tmp_path / f"out{len(procs)}", "--yes", *extra)
        proc = subprocess.Popen(cmd, env=clean_env(data_dir), cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        procs.append(proc)
        return proc

    yield run
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)


def _until(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(0.01)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    return proc.returncode, err


def _refused(second: subprocess.Popen[str], holder: subprocess.Popen[str]) -> None:
    """`second` stopped at once with the one line naming `holder` (still running)."""
    code, err = _finish(second)
    running = holder.poll() is None
    assert code == 2, err
    assert running, "the holder ended before the second run asked: nothing was tested"
    line = error_line(err)
    match = HELD.match(line)
    assert match and int(match[2]) == holder.pid, line


@pytest.mark.slow
def test_a_second_run_of_the_job_stops_before_any_call_naming_the_first(
        server: ThreadedServer, start: Start, location: str) -> None:
    server.state.script.latency_s = 0.2  # the first run takes ~6 s: still running when asked
    first = start(location)
    _until(lambda: server.state.requests > 0, "the first run did not start calling")
    _refused(start(location), first)
    server.state.script.latency_s = 0.0
    assert _finish(first)[0] == 0
    assert len(server.state.bodies) == LIMIT and set(server.state.bodies.values()) == {1}


@pytest.mark.slow
def test_a_killed_holder_frees_the_lease_for_the_next_run(
        server: ThreadedServer, start: Start, location: str) -> None:
    server.state.script.latency_s = 0.2
    first = start(location)
    _until(lambda: server.state.answered > 2, "the first run did not store answers")
    _refused(start(location), first)
    first.kill()  # kill -9: no cleanup runs
    assert _finish(first)[0] == -9
    if location.startswith("postgresql://"):  # the server ends the dead client's session
        _until(lambda: not _lease_locked(location), "the dead run's session did not end")
    server.state.script.latency_s = 0.0
    code, err = _finish(start(location))
    assert code == 0, err
    assert len(server.state.bodies) == LIMIT
    assert sum(server.state.bodies.values()) <= LIMIT + 1  # the one in flight at the kill


@pytest.mark.slow
def test_two_shards_of_one_job_run_together(server: ThreadedServer, start: Start,
                                            location: str) -> None:
    server.state.script.latency_s = 0.2
    shards = [start(location, "--shard", f"{i}/2") for i in range(2)]
    _until(lambda: server.state.requests > 1, "the shards did not start calling")
    _refused(start(location, "--shard", "0/2"), shards[0])  # the same shard again: refused
    server.state.script.latency_s = 0.0
    results = [_finish(p) for p in shards]
    assert [code for code, _ in results] == [0, 0], results
    assert len(server.state.bodies) == LIMIT and set(server.state.bodies.values()) == {1}


def _lease_locked(url: str, name: str = lease_name("openmeva", None)) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND "
                           "classid = %s AND objid = %s", (pglease.LEASE_CLASS,
                                                           lease_id(name))).fetchone()
    return bool(row and row[0])


# ---------------------------------------------------------------- the backends' lease itself

def test_each_backend_lets_one_holder_at_a_time_and_says_who(location: str) -> None:
    name = lease_name("j", "1/4")
    with open_cache(location) as a, open_cache(location) as b:
        with a.lease(name, describe("judge run j --shard 1/4")):
            with pytest.raises(LeaseHeldError, match=r"job j shard 1/4 is already running on "
                               r"this cache, held by host \S+ pid \d+ since \S+: judge run j "
                               r"--shard 1/4; wait"):
                b.lease(name, describe())
            with b.lease(lease_name("j", "2/4"), describe()):  # another shard: free
                pass
        with b.lease(name, describe()):  # released: the next one takes it
            pass


def test_a_lease_is_named_by_job_and_shard_with_an_id_stable_across_versions() -> None:
    """The id names the lock file and the advisory lock: a run of another version of judge
    must find the same one, and PostgreSQL's lock keys are signed 32-bit."""
    assert lease_name("j", None) == "job j shard all" and lease_name("j", "1/4") == \
        "job j shard 1/4"
    assert (lease_id("job j shard all"), lease_id("job j shard 1/4")) == (802999755, 726057208)
    assert all(0 <= lease_id(f"job {i}") < 2 ** 31 for i in range(200))


def test_a_holder_s_description_names_it_without_a_password() -> None:
    line = describe("judge run j --cache postgresql://u:pw@h/db?password=pw2&sslmode=require")
    assert re.fullmatch(r"host \S+ pid \d+ since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ: judge run j "
                        r"--cache postgresql://u:\*\*\*@h/db\?password=\*\*\*&sslmode=require",
                        line), line
    assert describe().endswith(": " + " ".join(["judge", *sys.argv[1:]]))  # this process's


def test_a_released_folder_lease_names_no_holder(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Release empties the lease file: a run that finds the lock taken between another's open
    and write reads "" ("has not written its description yet"), never a finished run."""
    lease = FolderLease(tmp_path, "job j shard all", "host h pid 1 since then: judge run j")
    assert lease.path.read_text() == "host h pid 1 since then: judge run j"
    lease.release()
    closed: list[int] = []
    monkeypatch.setattr(os, "close", closed.append)  # the second release closes nothing
    lease.release()
    monkeypatch.undo()
    assert closed == [] and lease.path.read_bytes() == b""
    assert stat.S_IMODE(lease.path.stat().st_mode) & 0o133 == 0  # rw-r--r-- at most
    with FolderLease(tmp_path, "job j shard all", "pid 2") as again:  # free again
        assert again.path == lease.path and again.path.read_text() == "pid 2"


def test_a_second_holder_quotes_the_first_4_kib_of_the_description(tmp_path: Path) -> None:
    with FolderLease(tmp_path, "job j shard all", "x" * 5000):
        with pytest.raises(LeaseHeldError) as held:
            FolderLease(tmp_path, "job j shard all", "second")
    assert f"held by {'x' * 4096}; wait" in str(held.value)


@pytest.mark.slow
def test_a_lease_taken_by_another_run_while_the_connection_was_down_stops_the_holder(
        pg_url: str) -> None:
    """The session's advisory lock dies with a dropped connection; if another run takes the
    lease before this one reconnects, this one stops rather than call what that one calls.
    The run's pool has a cache of its own (`pool`): its reconnect checks the idle holder's
    lease, and its call stores what it was given, then raises."""
    name = lease_name("j", None)
    with open_cache(pg_url) as held, open_cache(pg_url) as pool:
        held.lease(name, describe("judge run j (first)"))
        pool.put("k0", {"source": "api"})
        with psycopg.connect(pg_url, autocommit=True) as admin:  # both connections drop
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                          "datname = current_database() AND pid <> pg_backend_pid()")
        _until(lambda: not _lease_locked(pg_url, name), "the dropped session did not end")
        other = open_cache(pg_url)  # the second run, while the first is away
        other.lease(name, describe("judge run j (second)"))
        lost = (r"job j shard all: the run's lease was lost while the server was away and "
                r"another run holds it now; this run stops")
        with pytest.raises(CacheError, match=lost):
            pool.put("k1", {"source": "api"})
        assert other.get("k1") == {"source": "api"}  # stored before the run stopped
        with pytest.raises(CacheError, match=lost):
            held.has_many(["k"])
        other.close()
