"""`judge run --shard I/N` against one shared PostgreSQL cache and one fake API server: the real
`judge` script in 4 subprocesses, then `judge rescore` on the shared cache; plus the parsing
of --shard and the split of the limits (runner/execute/shard.py)."""

from __future__ import annotations

import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from runner.errors import ConfigError
from runner.execute.shard import Shard, split_limits
from runner.job.models import parse_model_spec
from runner.job.spec import EndpointSpec, Job, Limits
from tests.fakeserver import ThreadedServer
from tests.test_cli import (
    OPENMEVA,
    SUBPROCESS_TIMEOUT_S,
    clean_env,
    judge_cmd,
    judgments,
    run_judge,
)

LIMIT = 80
SHARDS = 4
CONCURRENCY = 2


# ---------------------------------------------------------------- the split (and
# tests/test_shard_share.py: by group, before rendering)

@pytest.mark.parametrize("text", ["4/4", "-1/4", "1/0", "1", "a/b", "1/2/3", ""])
def test_a_bad_shard_is_a_config_error_with_an_example(text: str) -> None:
    with pytest.raises(ConfigError, match=r"write I/N with 0 <= I < N, e.g. --shard 0/4"):
        Shard.parse(text)


def test_parse_reads_index_and_count() -> None:
    assert Shard.parse(" 3/4 ") == Shard(3, 4) and str(Shard(0, 1)) == "0/1"


def test_split_limits_divides_the_job_and_each_model_rate() -> None:
    models = (parse_model_spec("fake", name="a", base_url="http://127.0.0.1:1/v1", rpm=600),
              parse_model_spec("fake", name="b", base_url="http://127.0.0.1:1/v1"))
    job = Job(path=Path("j.toml"), name="j", models=models, datasets=(), prompts=(),
              output_dir=Path("out"), limits=Limits(rpm=1000, tpm=40_000, concurrency=8))
    split = split_limits(job, 4)
    assert (split.limits.rpm, split.limits.tpm, split.limits.concurrency) == (250, 10_000, 8)
    assert [(m.rpm, m.tpm) for m in split.models] == [(150, None), (None, None)]



def test_split_limits_divides_each_fleet_replica_rate_too() -> None:
    fleet = (EndpointSpec(base_url="http://127.0.0.1:1/v1", api_key_env="K1", rpm=800, tpm=8_000),
             EndpointSpec(base_url="http://127.0.0.1:2/v1", api_key_env="K2"))
    model = parse_model_spec("fake", name="a", base_url="http://127.0.0.1:1/v1", endpoints=fleet)
    job = Job(path=Path("j.toml"), name="j", models=(model,), datasets=(), prompts=(),
              output_dir=Path("out"), limits=Limits())
    (split,) = split_limits(job, 4).models
    assert [(e.rpm, e.tpm) for e in split.endpoints] == [(200, 2_000), (None, None)]
    assert [e.base_url for e in split.endpoints] == [e.base_url for e in fleet]

# ---------------------------------------------------------------- 4 processes, one cache

def _shard_cmd(i: int, server: ThreadedServer, pg_url: str, out: Path) -> list[str]:
    return judge_cmd("run", OPENMEVA, "--limit", LIMIT, "--concurrency", CONCURRENCY,
                     "--base-url", server.url, "--model", "fake", "--cache", pg_url,
                     "--out", out, "--yes", "--shard", f"{i}/{SHARDS}")


def _start(i: int, server: ThreadedServer, pg_url: str, tmp_path: Path,
           env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(_shard_cmd(i, server, pg_url, tmp_path / f"out{i}"), env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    finally:
        _end(proc)
    return proc.returncode, err


def _end(proc: subprocess.Popen[str]) -> None:
    """Killed if still running, and reaped: no shard outlives its test."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def _comparable(out: Path) -> list[dict[str, Any]]:
    """judgments.jsonl without `cached` (a shard's answers are all cached at rescore)."""
    return [{k: v for k, v in j.items() if k != "cached"} for j in judgments(out)]


def _single_run(server: ThreadedServer, tmp_path: Path, data_dir: Path) -> Path:
    """The same job in one process on an empty diskcache (the endpoint is part of the key:
    same server)."""
    out = tmp_path / "single"
    done = run_judge("run", OPENMEVA, "--limit", LIMIT, "--base-url", server.url,
                     "--model", "fake", "--cache-dir", tmp_path / "disk", "--out", out,
                     env=clean_env(data_dir), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"{LIMIT} called" in done.stderr
    return out


@pytest.mark.slow
def test_four_shards_answer_each_task_once_and_rescore_equals_one_process(
        server: ThreadedServer, pg_url: str, tmp_path: Path, data_dir: Path) -> None:
    env = clean_env(data_dir)
    procs = [_start(i, server, pg_url, tmp_path, env) for i in range(SHARDS)]
    try:
        results = [_finish(p) for p in procs]
    finally:
        for p in procs:
            _end(p)
    assert [code for code, _ in results] == [0] * SHARDS, results
    assert server.state.bodies and set(server.state.bodies.values()) == {1}  # each once
    assert len(server.state.bodies) == LIMIT
    called = [int(err.split(" called,")[0].rsplit(" ", 1)[1]) for _, err in results]
    assert sum(called) == LIMIT and all(c > 0 for c in called), results
    hints = [err.strip().splitlines()[-1] for _, err in results]
    lead = "no reports written for one shard: when every shard is done, build them with: "
    assert all(h.startswith(lead) for h in hints), hints
    assert not any((tmp_path / f"out{i}").exists() for i in range(SHARDS))  # no partial reports

    # The hint's command, as printed (every option the keys depend on), builds the reports.
    hint = shlex.split(hints[-1].removeprefix(lead))
    assert hint[:2] == ["judge", "rescore"] and "--shard" not in hint and "--yes" not in hint
    merged = tmp_path / "merged"
    done = run_judge(*hint[1:-2], "--out", merged, env=env, cwd=tmp_path)
    assert hint[-2:] == ["--out", str(tmp_path / "out3")]
    assert done.returncode == 0, done.stderr
    single = _single_run(server, tmp_path, data_dir)
    assert len(judgments(merged)) == LIMIT
    assert _comparable(merged) == _comparable(single)
    for name in ("scores.csv", "correlations.csv", "summary.csv"):
        assert (merged / name).read_bytes() == (single / name).read_bytes(), name


@pytest.mark.slow
def test_kill_9_of_one_shard_then_rerunning_only_it_completes_the_job(
        server: ThreadedServer, pg_url: str, tmp_path: Path, data_dir: Path) -> None:
    # 20 tasks / 2 in flight x 0.3 s: ~3 s per shard, so the victim is still running when a
    # quarter of the job is answered even if the four processes start seconds apart (loaded CI)
    server.state.script.latency_s = 0.3
    env = clean_env(data_dir)
    procs = [_start(i, server, pg_url, tmp_path, env) for i in range(SHARDS)]
    victim = procs[1]
    try:
        deadline = time.monotonic() + 30
        while server.state.answered < LIMIT // 4:
            assert time.monotonic() < deadline, "the shards did not get going within 30 s"
            time.sleep(0.01)
        assert victim.poll() is None, "shard 1 finished before the kill; nothing was tested"
        victim.kill()
        results = [_finish(p) for p in procs]
    finally:
        for p in procs:
            _end(p)
    assert results[1][0] == -9 and [r[0] for i, r in enumerate(results) if i != 1] == [0] * 3
    before = sum(server.state.bodies.values())
    assert len(server.state.bodies) < LIMIT  # shard 1's work is unfinished

    rerun = _start(1, server, pg_url, tmp_path, env)
    code, err = _finish(rerun)
    assert code == 0, err
    assert len(server.state.bodies) == LIMIT  # every task answered now
    # Each at most twice: only what was in flight at the kill is asked again.
    repeats = sum(n - 1 for n in server.state.bodies.values())
    assert repeats <= CONCURRENCY and sum(server.state.bodies.values()) > before

    merged = tmp_path / "merged"
    done = run_judge("rescore", OPENMEVA, "--limit", LIMIT, "--base-url", server.url,
                     "--model", "fake", "--cache", pg_url, "--out", merged, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = judgments(merged)
    assert len(lines) == LIMIT and all(j["error"] is None and j["score"] is not None
                                       for j in lines)
