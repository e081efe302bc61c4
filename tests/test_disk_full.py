"""A cache folder whose disk fills during `judge run` (a real small tmpfs, the real CLI in a
subprocess): the answers it cannot write are held, the run waits for space and goes on by
itself, a stop while full writes them elsewhere for the rerun, and no answer is bought twice.
A rerun on a disk still full is one `Error:` line before any call; a fully cached job on a full
disk still reports.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import orjson
import pytest

from runner.execute.store.journal import frames
from tests.fakeserver import ThreadedServer
from tests.processes import Child, Processes, processes_fixture, wait_until  # noqa: F401  (fixture)
from tests.test_cli import (
    JOB,
    SUBPROCESS_TIMEOUT_S,
    clean_env,
    judge_cmd,
    judgments,
    manifest,
    run_judge,
    write_job,
)
from tests.test_store_faults import _error_line, _stored_bodies

pytestmark = pytest.mark.slow  # real CLI processes, a tmpfs or PostgreSQL

TASKS = 300  # ~1.1 KB an answer: ~330 KB, more than is left free
FREE = 250_000
HELD = "cache disk full at "


@pytest.fixture
def full_disk(small_disk: Path, server: ThreadedServer, tmp_path: Path, data_dir: Path
              ) -> dict[str, Any]:
    """A cache folder on the small disk with FREE bytes left beside a filler file, the run's
    arguments (its reports and spill folder elsewhere) and environment."""
    from runner.execute.store.cache import Cache

    cache = small_disk / "cache"
    Cache(cache).close()
    filler = small_disk / "filler"
    stat = os.statvfs(small_disk)
    filler.write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - FREE))
    job = write_job(tmp_path / "job", JOB)
    args = ["run", job, "--limit", TASKS, "--base-url", server.url, "--model", "fake",
            "--cache-dir", cache, "--out", tmp_path / "out", "--concurrency", 8, "--yes"]
    (tmp_path / "tmp").mkdir()
    env = clean_env(data_dir, TMPDIR=str(tmp_path / "tmp"))
    server.state.script.latency_s = 0.02  # answers in flight when the disk refuses
    return {"cache": cache, "filler": filler, "args": args, "env": env, "disk": small_disk}


def _complete(out: Path) -> None:
    lines = judgments(out)
    assert len(lines) == TASKS
    assert all(j["error"] is None and j["score"] is not None for j in lines)


def _start(processes: Processes, full_disk: dict[str, Any], tmp_path: Path) -> Child:
    return processes.start(judge_cmd(*full_disk["args"]), env=full_disk["env"], cwd=tmp_path)


def test_a_disk_that_fills_and_is_freed_mid_run_costs_no_answer_twice(
        full_disk: dict[str, Any], server: ThreadedServer, processes: Processes,
        tmp_path: Path) -> None:
    run = _start(processes, full_disk, tmp_path)
    line = run.wait_for(HELD).rstrip("\n")
    assert line == (f"{HELD}{full_disk['cache']}: free space; the run continues by itself "
                    "(Ctrl-C to stop, nothing is lost)"), line
    full_disk["filler"].unlink()  # space freed: the held answers are written, the run goes on
    code, _, stderr = run.finish(timeout=SUBPROCESS_TIMEOUT_S)
    assert code == 0, stderr
    assert stderr.count(HELD) == 1 and "Traceback" not in stderr, stderr
    assert f"cache disk at {full_disk['cache']}: room again, " in stderr
    assert server.state.requests == TASKS
    assert all(n == 1 for n in server.state.bodies.values())
    _complete(tmp_path / "out")
    assert manifest(tmp_path / "out")["counts"]["api_calls"] == TASKS


def test_a_stop_while_the_disk_is_full_keeps_the_held_answers_for_the_rerun(
        full_disk: dict[str, Any], server: ThreadedServer, processes: Processes,
        tmp_path: Path) -> None:
    run = _start(processes, full_disk, tmp_path)
    run.wait_for(HELD)
    run.signal(signal.SIGINT)
    code, _, stderr = run.finish(timeout=SUBPROCESS_TIMEOUT_S)
    assert code == 130, stderr
    assert "Traceback" not in stderr, stderr
    spilled = [li for li in stderr.splitlines() if "held answers written to " in li]
    assert len(spilled) == 1, stderr
    where = Path(spilled[0].split("held answers written to ")[1].split(";")[0])
    assert where.is_file() and where.is_relative_to(tmp_path / "tmp"), spilled
    stored = _stored_bodies(full_disk["cache"], server.state)
    stored |= {server.state.body_key(orjson.loads(raw)["request"])
               for _, raw in frames(where.read_bytes())}
    assert stored == set(server.state.bodies)  # every answer bought is read by the rerun
    full_disk["filler"].unlink()
    done = run_judge(*full_disk["args"], env=full_disk["env"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert server.state.requests == TASKS
    assert all(n == 1 for n in server.state.bodies.values())
    _complete(tmp_path / "out")
    assert not where.exists()  # folded into the cache, and removed


def test_a_kill_9_while_the_disk_is_full_loses_no_answer_held(
        full_disk: dict[str, Any], server: ThreadedServer, processes: Processes,
        tmp_path: Path) -> None:
    """An answer held while the disk is full is also written at once where a kill -9 cannot
    take it (a spill file outside the folder): killed during the wait, the run has lost none,
    and the rerun buys again only what was in flight at the kill."""
    run = _start(processes, full_disk, tmp_path)
    run.wait_for(HELD)

    def kept() -> set[str]:  # the answers on a disk: the cache folder's and the spill files'
        stored = _stored_bodies(full_disk["cache"], server.state)
        for spilled in (tmp_path / "tmp").rglob("*.log"):
            stored |= {server.state.body_key(orjson.loads(raw)["request"])
                       for _, raw in frames(spilled.read_bytes())}
        return stored

    wait_until(lambda: server.state.in_flight == 0 and kept() == set(server.state.bodies),
               "every answer bought kept on a disk while the run waits for room")
    run.signal(signal.SIGKILL)
    run.finish(timeout=SUBPROCESS_TIMEOUT_S)
    # The disk may take a few answers in the meantime and the run send a few more requests:
    # those in flight at the kill (bought, never received) are the only ones asked again.
    on_disk, bought = kept(), set(server.state.bodies)
    assert len(bought) < TASKS  # killed during the wait, not after the end
    full_disk["filler"].unlink()
    done = run_judge(*full_disk["args"], env=full_disk["env"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert all(server.state.bodies[body] == 1 for body in on_disk)
    assert server.state.requests == TASKS + len(bought - on_disk)
    _complete(tmp_path / "out")
    assert not [*(tmp_path / "tmp").rglob("*.log")]  # the spill files stored, and removed


def _fill(disk: Path) -> None:
    """Take every last block of `disk` (a filler file beside the cache)."""
    with open(disk / "filler", "ab", buffering=0) as filler:
        with pytest.raises(OSError):
            while True:
                filler.write(b"\0" * 65536)
        with pytest.raises(OSError):
            while True:
                filler.write(b"\0" * 4096)


@pytest.mark.parametrize("cached", [0, 100])
def test_a_rerun_on_a_disk_still_full_is_one_error_line_before_any_call(
        full_disk: dict[str, Any], server: ThreadedServer, tmp_path: Path, cached: int) -> None:
    full_disk["filler"].unlink()
    args, env = full_disk["args"], full_disk["env"]
    if cached:  # a part cached with room, then the disk full
        limit = args.index("--limit") + 1
        done = run_judge(*args[:limit], cached, *args[limit + 1:], env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    _fill(full_disk["disk"])
    before = server.state.requests
    for _ in range(3):
        done = run_judge(*args, env=env, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        line = _error_line(done.stderr)
        assert line.startswith(f"Error: {full_disk['cache']}: the disk is full ("), line
        assert line.endswith("free space, then rerun to resume"), line
        assert server.state.requests == before


def test_a_fully_cached_job_on_a_full_disk_still_reports(
        full_disk: dict[str, Any], server: ThreadedServer, tmp_path: Path) -> None:
    full_disk["filler"].unlink()
    args, env = full_disk["args"], full_disk["env"]
    assert run_judge(*args, env=env, cwd=tmp_path).returncode == 0
    made = judgments(tmp_path / "out")
    _fill(full_disk["disk"])
    before = server.state.requests
    for _ in range(2):
        done = run_judge(*args, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        assert server.state.requests == before
        assert [{**j, "cached": False} for j in judgments(tmp_path / "out")] == \
            [{**j, "cached": False} for j in made]
