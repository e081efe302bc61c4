"""`judge run --offline` reads what `rescore` reads: a cache folder on a read-only mount reports,
and a bare model name without its URL says that offline needs the URL too, to find the
answers (it is part of their cache keys), not a server to call."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import runner
from runner.cli import main as cli_main
from runner.session import run as session_run
from tests.fakeserver import ThreadedServer
from tests.test_cli import clean_env, error_line, judgments, run_judge, write_job

LIMIT = 8


@pytest.fixture
def read_only_cache(server: ThreadedServer, tmp_path: Path, data_dir: Path
                    ) -> Iterator[tuple[Path, Path]]:
    """A cache of every task of a small job, seen through a read-only bind mount (read-only
    for root too, as a study handed over on a read-only share), unmounted at the test's end.
    The job and the mounted cache; the first run's reports are in tmp_path/out."""
    job = write_job(tmp_path / "jobs")
    filled = run_judge("run", job, "--limit", LIMIT, "--model", "fake", "--base-url", server.url,
                       "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out",
                       env=clean_env(data_dir), cwd=tmp_path)
    assert filled.returncode == 0, filled.stderr
    mounted = tmp_path / "ro"
    mounted.mkdir()
    steps = (["mount", "--bind", str(tmp_path / "cache"), str(mounted)],
             ["mount", "-o", "remount,bind,ro", str(mounted)])
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "-l", str(mounted)], capture_output=True, check=False)
            reason = f"cannot bind-mount read-only here (root needed): {done.stderr.strip()}"
            if os.environ.get("CI") == "true":
                pytest.fail(reason)
            pytest.skip(reason)
    try:
        assert not os.access(mounted, os.W_OK)
        yield job, mounted
    finally:
        subprocess.run(["umount", "-l", str(mounted)], check=False)


def _read_from_the_cache(out: Path, tmp_path: Path, server: ThreadedServer, before: int
                         ) -> None:
    """`out` holds the filling run's judgments, each read from the cache, and nothing was
    called since `before` (the server's request count)."""
    assert judgments(out) == [{**j, "cached": True} for j in judgments(tmp_path / "out")]
    assert server.state.requests == before


@pytest.mark.slow
def test_an_offline_run_reports_from_a_read_only_cache_as_rescore_does(
        read_only_cache: tuple[Path, Path], server: ThreadedServer, tmp_path: Path,
        data_dir: Path) -> None:
    job, cache = read_only_cache
    before = server.state.requests
    common = ("--limit", LIMIT, "--model", "fake", "--base-url", server.url, "--cache-dir", cache)
    rescored = run_judge("rescore", job, *common, "--out", tmp_path / "rescored",
                         env=clean_env(data_dir), cwd=tmp_path)
    assert rescored.returncode == 0, rescored.stderr

    offline = run_judge("run", job, "--offline", *common, "--out", tmp_path / "offline",
                        env=clean_env(data_dir), cwd=tmp_path)

    assert offline.returncode == 0, offline.stderr
    assert "Traceback" not in offline.stderr
    assert any(line.startswith(f"{LIMIT} tasks: {LIMIT} cached, 0 called")
               for line in offline.stderr.splitlines()), offline.stderr
    _read_from_the_cache(tmp_path / "offline", tmp_path, server, before)
    _read_from_the_cache(tmp_path / "rescored", tmp_path, server, before)
    # a run that would call still needs to write the cache: one line, as before
    online = run_judge("run", job, *common, "--limit", LIMIT + 2, "--out", tmp_path / "more",
                       "--yes", env=clean_env(data_dir), cwd=tmp_path)
    assert online.returncode == 2
    assert error_line(online.stderr).startswith(f"Error: {cache}: the cache folder is not "
                                                "writable; ")
    assert server.state.requests == before


@pytest.mark.slow
@pytest.mark.parametrize("command", [("run", "--offline", "--partial"), ("rescore",)])
def test_a_bare_model_without_its_url_offline_says_the_url_finds_its_answers(
        tmp_path: Path, data_dir: Path, command: tuple[str, ...]) -> None:
    """The cache key of a bare name's request holds its base URL: without it no cached answer
    can be found, so the command asks for that URL, and says why even offline."""
    job = write_job(tmp_path / "jobs")

    done = run_judge(*command, job, "--limit", LIMIT, "--model", "fake", "--cache-dir",
                     tmp_path / "cache", "--out", tmp_path / "out", env=clean_env(data_dir),
                     cwd=tmp_path)

    assert done.returncode == 2, done.stderr
    assert error_line(done.stderr) == (
        f"Error: {job}: model 'fake' needs its server's URL, even offline (its answers are "
        "cached under it): pass --base-url http://HOST:PORT/v1, set OPENAI_BASE_URL, or use "
        "openai:NAME")


@pytest.mark.slow
def test_an_offline_run_judging_cached_tasks_first_reads_a_read_only_cache(
        read_only_cache: tuple[Path, Path], server: ThreadedServer, tmp_path: Path,
        data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path a large job takes (Run.cached_first), here from one task on."""
    job, cache = read_only_cache
    monkeypatch.setattr(session_run, "CACHED_FIRST_TASKS", 1)
    monkeypatch.setenv("JUDGE_DATA_DIR", str(data_dir))
    monkeypatch.chdir(tmp_path)
    before = server.state.requests

    done = CliRunner().invoke(cli_main.cli, [str(a) for a in (
        "run", job, "--offline", "--limit", LIMIT, "--model", "fake", "--base-url", server.url,
        "--cache-dir", cache, "--out", tmp_path / "offline")], catch_exceptions=False)

    assert done.exit_code == 0, done.output
    _read_from_the_cache(tmp_path / "offline", tmp_path, server, before)


@pytest.mark.slow
def test_the_api_offline_run_reads_a_read_only_cache_as_the_cli_does(
        read_only_cache: tuple[Path, Path], server: ThreadedServer, tmp_path: Path,
        data_dir: Path) -> None:
    """runner.run(offline=True) takes no lease, so it opens the cache only to read it."""
    job, cache = read_only_cache
    before = server.state.requests

    done = runner.run(job, offline=True, limit=LIMIT, models=["fake"], base_url=server.url,
                      cache_dir=cache, out=tmp_path / "api", data_dir=data_dir, environ={})

    assert done.ok and done.stats.cache_hits == LIMIT and done.stats.api_calls == 0
    _read_from_the_cache(tmp_path / "api", tmp_path, server, before)
