"""`judge run --batch` under `--shard I/N` and on a shared PostgreSQL cache, and a kill between a
batch file's upload and its batch's creation: the real CLI in subprocesses against the fake
Files + Batches server (tests/fakebatch.py), real caches and ledgers.

The fake keeps every uploaded file, so the tests count the request lines it received.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg
import pytest

from runner.execute.shard import Shard
from runner.selection import TaskSelection
from runner.session.select import select
from tests.fakebatch import BatchServer
from tests.test_cli import (
    OPENMEVA,
    SUBPROCESS_TIMEOUT_S,
    clean_env,
    judge_cmd,
    judgments,
    run_judge,
)

LIMIT = 20
SHARDS = 2
SECRET = "sk-shard-secret-0123456789"


@pytest.fixture
def fake() -> Iterator[BatchServer]:
    with BatchServer() as s:
        yield s


def _job(fake: BatchServer) -> tuple[object, ...]:
    return (OPENMEVA, "--limit", LIMIT, "--base-url", fake.url, "--model", "fake")


def _run_args(fake: BatchServer, cache: tuple[object, ...], *extra: object) -> tuple[object, ...]:
    return ("run", *_job(fake), *cache, "--batch", "--poll-interval", 0.05, "--yes", *extra)


def _uploaded(fake: BatchServer) -> list[list[str]]:
    """The custom ids (cache keys) of each file uploaded, in upload order."""
    return [[orjson.loads(line)["custom_id"] for line in fake.batch.files[f].splitlines()
             if line.strip()] for f in fake.batch.uploaded]


def _shards_at_once(fake: BatchServer, cache: tuple[object, ...], dirs: list[Path],
                    env: dict[str, str]) -> list[tuple[int, str]]:
    """Shard i of SHARDS run in dirs[i] (its own working directory: its own machine), all at
    once; each one's exit code and stderr."""
    procs = []
    try:
        for i, cwd in enumerate(dirs):
            cwd.mkdir(parents=True, exist_ok=True)
            procs.append(subprocess.Popen(
                judge_cmd(*_run_args(fake, cache, "--out", cwd / "out", "--shard",
                                     f"{i}/{SHARDS}")),
                env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        errs = [p.communicate(timeout=SUBPROCESS_TIMEOUT_S)[1] for p in procs]
        return [(p.returncode, err) for p, err in zip(procs, errs, strict=True)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=SUBPROCESS_TIMEOUT_S)


def _shard_keys(fake: BatchServer, tmp_path: Path, data_dir: Path) -> list[set[str]]:
    """Each shard's keys: those of the tasks of its share of the job (runner.execute.shard)."""
    return [{t.key for t in select(TaskSelection(
        job=OPENMEVA, models=("fake",), base_url=fake.url, limit=LIMIT,
        cache_dir=tmp_path / "unused", shard=Shard(i, SHARDS)), data_dir=data_dir
    ).expansion.tasks()}
            for i in range(SHARDS)]


def _assert_disjoint_halves(fake: BatchServer, cache: tuple[object, ...], tmp_path: Path,
                            env: dict[str, str], data_dir: Path) -> None:
    """Each uploaded file holds one shard's keys only; no key was sent twice; together they are
    every key of the job (read back by a rescore over the shared cache)."""
    files = _uploaded(fake)
    sent = [key for keys in files for key in keys]
    assert len(sent) == len(set(sent)), f"{len(sent)} lines for {len(set(sent))} keys"
    shards = _shard_keys(fake, tmp_path, data_dir)
    assert not shards[0] & shards[1] and all(shards)
    for keys in files:
        owners = {i for i in range(SHARDS) for k in keys if k in shards[i]}
        assert len(owners) == 1, owners
    assert set(sent) == shards[0] | shards[1]
    assert set(fake.batch.creations.values()) == {1}
    merged = run_judge("rescore", *_job(fake), *cache, "--out", tmp_path / "merged", env=env,
                       cwd=tmp_path)
    assert merged.returncode == 0, merged.stderr
    lines = judgments(tmp_path / "merged")
    assert {j["key"] for j in lines} == set(sent)
    assert all(j["score"] is not None and j["source"].startswith("batch:") for j in lines)
    assert fake.state.requests == 0  # no online call: every answer came from a batch


@pytest.mark.slow
def test_two_shards_on_one_folder_cache_submit_disjoint_halves_of_the_job(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    env, cache = clean_env(data_dir), ("--cache-dir", tmp_path / "cache")

    results = _shards_at_once(fake, cache, [tmp_path / "a", tmp_path / "b"], env)

    assert [code for code, _ in results] == [0] * SHARDS, results
    _assert_disjoint_halves(fake, cache, tmp_path, env, data_dir)


@pytest.mark.slow
def test_two_shards_on_postgresql_submit_disjoint_halves_and_share_one_ledger(
        fake: BatchServer, pg_url: str, tmp_path: Path, data_dir: Path) -> None:
    env, cache = clean_env(data_dir, OPENAI_API_KEY=SECRET), ("--cache", pg_url)

    results = _shards_at_once(fake, cache, [tmp_path / "a", tmp_path / "b"], env)

    assert [code for code, _ in results] == [0] * SHARDS, results
    _assert_disjoint_halves(fake, cache, tmp_path, env, data_dir)
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT * FROM judge_batches").fetchall()
        keys = conn.execute("SELECT count(*) FROM judge_batch_keys").fetchone()
    assert len(rows) == len(fake.batch.uploaded) and keys == (LIMIT,)
    assert all(row[-3] is True for row in rows)  # ingested
    assert SECRET not in repr(rows) and "postgresql://" not in repr(rows)
    assert not list(tmp_path.rglob("batches.sqlite"))  # no ledger in a working directory


@pytest.mark.slow
def test_judge_batches_elsewhere_sees_a_postgresql_caches_open_batches_and_collects_them(
        fake: BatchServer, pg_url: str, tmp_path: Path, data_dir: Path) -> None:
    env, cache = clean_env(data_dir), ("--cache", pg_url)
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    there.mkdir()
    fake.batch.script.hold = True
    submit = run_judge(*_run_args(fake, cache, "--no-wait", "--out", here / "out"), env=env,
                       cwd=here)
    assert submit.returncode == 0, submit.stderr

    listed = run_judge("batches", *_job(fake), *cache, env=env, cwd=there)

    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert len(rows) == 2, listed.stdout
    assert rows[1].split()[1:6] == ["fake", "in_progress", str(LIMIT), "0", "0"], listed.stdout
    fake.batch.script.hold = False
    collect = run_judge(*_run_args(fake, cache, "--out", there / "out"), env=env, cwd=there)
    assert collect.returncode == 0, collect.stderr
    assert fake.batch.creates == 1 and fake.batch.uploads == 1  # collected, not resubmitted
    assert all(j["score"] is not None for j in judgments(there / "out"))


def _kill_at_create(fake: BatchServer, args: tuple[object, ...], cwd: Path,
                    env: dict[str, str]) -> None:
    """Run `args` until the file is uploaded and the create is being refused, then kill -9."""
    fake.batch.script.create_503 = True
    proc = subprocess.Popen(judge_cmd(*args), env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT_S
        while fake.batch.create_failures < 1:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no batch create arrived in time"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == -signal.SIGKILL
    assert fake.batch.uploads == 1 and fake.batch.creates == 0
    fake.batch.script.create_503 = False


@pytest.mark.slow
def test_a_kill_between_upload_and_create_then_a_rerun_creates_over_the_same_file(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    env = clean_env(data_dir)
    args = _run_args(fake, ("--cache-dir", tmp_path / "cache"), "--out", tmp_path / "out")
    _kill_at_create(fake, args, tmp_path, env)

    rerun = run_judge(*args, env=env, cwd=tmp_path)

    assert rerun.returncode == 0, rerun.stderr
    assert fake.batch.uploads == 1 and fake.batch.creates == 1, rerun.stderr
    assert "uploaded by an earlier run that stopped before creating its batch" in rerun.stderr
    assert set(fake.batch.creations.values()) == {1} and len(fake.batch.creations) == LIMIT
    assert all(j["score"] is not None for j in judgments(tmp_path / "out"))
    assert fake.state.requests == 0


@pytest.mark.slow
def test_an_uploaded_file_whose_keys_were_answered_meanwhile_is_deleted_not_submitted(
        fake: BatchServer, pg_url: str, tmp_path: Path, data_dir: Path) -> None:
    env, cache = clean_env(data_dir), ("--cache", pg_url)
    args = _run_args(fake, cache, "--out", tmp_path / "out")
    _kill_at_create(fake, args, tmp_path, env)
    online = run_judge("run", *_job(fake), *cache, "--yes", "--out", tmp_path / "out",
                       env=env, cwd=tmp_path)
    assert online.returncode == 0 and fake.state.requests == LIMIT, online.stderr

    rerun = run_judge(*args, env=env, cwd=tmp_path)

    assert rerun.returncode == 0, rerun.stderr
    assert fake.batch.creates == 0 and fake.batch.uploads == 1
    assert fake.batch.deleted == fake.batch.uploaded  # the unused upload, removed
    assert fake.state.requests == LIMIT
