"""A damaged or unreachable folder cache costs one task, never the study: a damaged record is
its task's failure (and `judge cache check` / `judge run --refresh-damaged` mend it), a cache
that cannot be opened is one `Error:` line, a read-only folder is read, the reader process's
death is absorbed, and a full disk stops the run without buying an answer twice.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from runner.cli import main as cli_main
from runner.execute.store import reader as reader_module
from runner.reduce import judgments as judgments_module
from tests.fakeserver import ThreadedServer
from tests.test_cli import JOB, judgments, manifest, write_job

LIMIT = 12


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, data_dir: Path, tmp_path: Path) -> None:
    """The data sets read from `data_dir`; no API key, base URL or cache from the shell."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JUDGE_DATA_DIR", str(data_dir))
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "JUDGE_CACHE_DIR", "JUDGE_CACHE_URL"):
        monkeypatch.delenv(name, raising=False)


def _judge(*args: Any) -> Result:
    return CliRunner().invoke(cli_main.cli, [str(a) for a in args], catch_exceptions=False)


def _run_args(job: Path, cache: Path, out: Path, server: ThreadedServer) -> list[Any]:
    return ["run", job, "--limit", LIMIT, "--base-url", server.url, "--model", "fake",
            "--cache-dir", cache, "--out", out, "--yes"]


def _damage(cache: Path, how: str, which: int = 0) -> str:
    """Damage the stored bytes of one record of `cache` (its `which`-th key); its key."""
    with sqlite3.connect(cache / "cache.db") as con:
        key, value = con.execute("SELECT key, value FROM Cache ORDER BY key LIMIT 1 OFFSET ?",
                                 (which,)).fetchone()
        damaged = value[:len(value) // 2] if how == "truncated" else os.urandom(len(value))
        con.execute("UPDATE Cache SET value = ? WHERE key = ?", (damaged, key))
    return str(key)


@pytest.fixture
def filled(server: ThreadedServer, tmp_path: Path) -> tuple[Path, Path, list[Any]]:
    """A cache of every task of a small job (the job, the cache, the run's arguments)."""
    job = write_job(tmp_path / "job", JOB)
    args = _run_args(job, tmp_path / "cache", tmp_path / "out", server)
    done = _judge(*args)
    assert done.exit_code == 0, done.output
    return job, tmp_path / "cache", args


@pytest.mark.parametrize("how", ["truncated", "random"])
@pytest.mark.parametrize("way", ["direct", "reader", "cached first"])
def test_a_damaged_record_fails_its_task_alone_in_run_and_rescore(
        filled: tuple[Path, Path, list[Any]], server: ThreadedServer, how: str, way: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job, cache, args = filled
    key = _damage(cache, how)
    if way == "reader":  # read by a reader process (this test's threads: no fork)
        monkeypatch.setattr(reader_module, "MIN_TASKS", 1)
        monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
        monkeypatch.setattr(judgments_module, "READ_BATCH", 3)
    if way == "cached first":
        monkeypatch.setattr(cli_main, "CACHED_FIRST_TASKS", 1)
    before = server.state.requests
    for command in (args, ["rescore", *args[1:-1]]):
        done = _judge(*command)
        assert done.exit_code == 1, done.output
        assert f"failed {key[:12]}: cached answer unreadable (" in done.output
        assert "rerun with `judge run --refresh-damaged` to ask again" in done.output
        lines = judgments(tmp_path / "out")
        assert len(lines) == LIMIT
        failed = [j for j in lines if j["error"] is not None]
        assert [j["key"] for j in failed] == [key]
        assert failed[0]["error"]["message"].startswith("cached answer unreadable")
        assert all(j["score"] is not None for j in lines if j["key"] != key)
        assert manifest(tmp_path / "out")["counts"]["failures"] == 1
    assert server.state.requests == before  # nothing asked again without being told


def test_cache_check_lists_damaged_records_and_drop_removes_them(
        filled: tuple[Path, Path, list[Any]], server: ThreadedServer, tmp_path: Path) -> None:
    job, cache, args = filled
    keys = sorted([_damage(cache, "truncated", 0), _damage(cache, "random", 3)])
    done = _judge("cache", "check", "--cache-dir", cache)
    assert done.exit_code == 1, done.output
    assert sorted(line.split()[1].rstrip(":") for line in done.stdout.splitlines()
                  if line.startswith("damaged ")) == keys
    assert f"{cache}: 2 damaged records (--drop removes them)" in done.output
    # scoped to a job's tasks: the same two
    scoped = _judge("cache", "check", job, "--limit", LIMIT, "--model", "fake", "--base-url",
                    server.url, "--cache-dir", cache)
    assert scoped.exit_code == 1, scoped.output
    assert scoped.stdout == done.stdout
    dropped = _judge("cache", "check", "--cache-dir", cache, "--drop")
    assert dropped.exit_code == 0, dropped.output
    assert "2 damaged records (dropped; `judge run` asks them again)" in dropped.output
    clean = _judge("cache", "check", "--cache-dir", cache)
    assert clean.exit_code == 0, clean.output
    assert f"{cache}: 0 damaged records" in clean.output
    before = server.state.requests
    rerun = _judge(*args)
    assert rerun.exit_code == 0, rerun.output
    assert server.state.requests - before == 2


def test_run_refresh_damaged_asks_the_damaged_answers_again(
        filled: tuple[Path, Path, list[Any]], server: ThreadedServer, tmp_path: Path) -> None:
    _, cache, args = filled
    key = _damage(cache, "random", 5)
    before = server.state.requests
    done = _judge(*args, "--refresh-damaged")
    assert done.exit_code == 0, done.output
    assert f"{cache}: dropped 1 damaged records; asking them again" in done.output
    assert server.state.requests - before == 1
    assert all(j["error"] is None for j in judgments(tmp_path / "out"))
    assert key in {j["key"] for j in judgments(tmp_path / "out")}
