"""The API key goes to the server and nowhere else: not the cache, not the reports, not the
terminal, also when requests fail (400, 429, 500) and when the server refuses the key (401).
A cache URL's password goes to PostgreSQL and nowhere else either.
"""

from __future__ import annotations

import shlex
import signal
import stat
import subprocess
from collections.abc import Iterable
from pathlib import Path

import orjson
import pandas as pd
import pytest

from tests.fakeserver import ThreadedServer
from tests.pgserver import free_port
from tests.processes import Processes, processes_fixture, wait_until  # noqa: F401
from tests.test_cli import (
    JOB,
    OPENMEVA,
    SUBPROCESS_TIMEOUT_S,
    clean_env,
    error_line,
    judge_cmd,
    manifest,
    run_judge,
    write_job,
)

SECRET = "sk-test-SECRET123"
NEEDLES = (SECRET.encode(), b"SECRET123")
PG_PASSWORD = "PgPass9Zq"
"""A cache URL's password: no key shape (no sk-, no key=), so only redaction can hide it."""


def _leaks(folder: Path, needles: Iterable[bytes] = NEEDLES,
           runs: Iterable[subprocess.CompletedProcess[str]] = ()) -> list[str]:
    """Where under `folder` (every file, a Parquet file also decoded) and in the runs' stdout and
    stderr any of `needles` is."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            texts = [path.read_bytes()]
            if path.suffix == ".parquet":  # compressed columns: look at the values too
                texts.append(pd.read_parquet(path).to_csv().encode())
            found += [f"{path}: {n!r}" for n in needles for data in texts if n in data]
    for i, run in enumerate(runs):
        found += [f"run {i} {name}: {n!r}" for name, text in (("stdout", run.stdout),
                                                              ("stderr", run.stderr))
                  for n in needles if n.decode() in text]
    return found


@pytest.mark.slow
def test_the_api_key_is_sent_but_never_stored_or_printed(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    env = clean_env(data_dir, OPENAI_API_KEY=SECRET)
    server.state.script.queue = ["400", "429", "500", "ok", "drop"]

    result = run_judge("run", OPENMEVA, "--limit", 20, "--model", "fake", "--base-url",
                       server.url, "--cache-dir", cache, "--out", out, env=env, cwd=tmp_path)

    assert result.returncode == 1, result.stderr  # the 400 is a failure, listed
    assert "400: fake 400" in result.stderr
    assert server.state.auth and set(server.state.auth) == {f"Bearer {SECRET}"}
    assert manifest(out)["counts"]["api_calls"] == 19

    server.state.script.queue = ["401"]
    refused = run_judge("run", OPENMEVA, "--limit", 25, "--model", "fake", "--base-url",
                        server.url, "--cache-dir", cache, "--out", out, env=env, cwd=tmp_path)

    assert refused.returncode == 2, refused.stderr
    assert "refused the credentials" in refused.stderr
    assert cache.is_dir() and any(cache.iterdir()) and (out / "judgments.jsonl").exists()
    # the cache, the reports, and anything else written in cwd; the terminal
    assert _leaks(tmp_path, runs=(result, refused)) == []


@pytest.mark.slow
def test_a_cache_url_password_is_in_no_file_and_no_line(
        server: ThreadedServer, tmp_path: Path, data_dir: Path, pg_url: str) -> None:
    # Trust auth accepts any password: the URL works and carries a secret to leak.
    url = pg_url.replace("postgres@", f"postgres:{PG_PASSWORD}@")
    out = tmp_path / "out"
    env = clean_env(data_dir, OPENAI_API_KEY=SECRET)
    via_env = clean_env(data_dir, OPENAI_API_KEY=SECRET, JUDGE_CACHE_URL=url)
    common = (OPENMEVA, "--limit", 6, "--model", "fake", "--base-url", server.url, "--out", out)
    runs = [run_judge("run", *common, "--cache", url, "--shard", "1/2", env=env, cwd=tmp_path),
            run_judge("run", *common, "--cache", url, env=env, cwd=tmp_path),
            run_judge("rescore", *common, env=via_env, cwd=tmp_path),
            run_judge("status", *common, env=via_env, cwd=tmp_path),
            run_judge("runs", OPENMEVA, "--out", out, env=via_env, cwd=tmp_path),
            run_judge("cache", "stats", "--cache", url, env=env, cwd=tmp_path)]
    assert [r.returncode for r in runs] == [0] * len(runs), [r.stderr for r in runs]
    masked = pg_url.replace("postgres@", "postgres:***@")
    hint = f"judge rescore {OPENMEVA}"  # the shard's hint, quoted for a shell
    assert hint in runs[0].stderr and f"--cache {shlex.quote(masked)}" in runs[0].stderr
    assert manifest(out)["cache_url"] == pg_url.replace("postgres@", "postgres:***@")
    commands = [manifest(run)["command"] for run in sorted((out / "history").iterdir())]
    assert f"--cache {masked}" in commands[0]
    unreachable = url.replace(pg_url.split(":")[2].split("/")[0], str(free_port()))
    refused = run_judge("run", *common, "--cache", unreachable, env=env, cwd=tmp_path)
    assert refused.returncode == 2 and "cannot connect" in error_line(refused.stderr)
    runs.append(refused)

    leaks = _leaks(tmp_path, (PG_PASSWORD.encode(), *NEEDLES), runs)
    assert leaks == []
    assert len(commands) == 2  # the run's and the rescore's copies were looked at


@pytest.mark.slow
def test_credentials_in_a_base_url_are_refused_before_any_call(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    with_userinfo = server.url.replace("://", f"://judge:{PG_PASSWORD}@")
    env, work = clean_env(data_dir, OPENAI_API_KEY=SECRET), tmp_path / "work"
    work.mkdir()
    fleet = write_job(tmp_path / "jobs", JOB + f'endpoints = [{{base_url = "{with_userinfo}"}}]\n')
    runs = [run_judge("run", OPENMEVA, "--limit", 2, "--model", "fake", "--base-url",
                      with_userinfo, env=env, cwd=work),
            run_judge("run", OPENMEVA, "--limit", 2, "--model", "fake",
                      env={**env, "OPENAI_BASE_URL": with_userinfo}, cwd=work),
            run_judge("run", fleet, "--limit", 2, env=env, cwd=work)]
    for run, where in zip(runs, ("--base-url", "OPENAI_BASE_URL", "models.fake.endpoints[0]"),
                          strict=True):
        assert run.returncode == 2, run.stderr
        line = error_line(run.stderr)
        assert where in line and "has credentials in it" in line and "api_key_env" in line
    assert server.state.requests == 0
    assert _leaks(work, (PG_PASSWORD.encode(), *NEEDLES), runs) == []


@pytest.mark.slow
def test_a_malformed_cache_url_is_one_line_without_its_password(
        tmp_path: Path, data_dir: Path) -> None:
    bad = f"postgres://judge:{PG_PASSWORD}@[bad/db"
    runs = [run_judge("run", OPENMEVA, "--limit", 2, "--model", "fake", "--base-url",
                      "http://127.0.0.1:9/v1", "--cache", bad, env=clean_env(data_dir),
                      cwd=tmp_path),
            run_judge("cache", "stats", env=clean_env(data_dir, JUDGE_CACHE_URL=bad),
                      cwd=tmp_path)]
    for run in runs:
        assert run.returncode == 2, run.stderr
        assert "JUDGE_CACHE_URL" in error_line(run.stderr)
    assert _leaks(tmp_path, (PG_PASSWORD.encode(),), runs) == []


PLANTED = "correct horse battery staple"
"""A key of no known shape, in the variable a job names: only its registration hides it."""


@pytest.mark.slow
def test_a_key_of_no_known_shape_echoed_by_the_server_is_in_no_output(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    job = write_job(tmp_path / "jobs", JOB + f'base_url = "{server.url}"\n'
                    'api_key_env = "GATEWAY_CRED"\n')
    work = tmp_path / "work"
    work.mkdir()
    echo = orjson.dumps({"error": {"message": f"credential {PLANTED} lacks this model"}})
    server.state.script.raw = [(400, {"Content-Type": "application/json"}, echo),
                               (500, {"Content-Type": "application/json"}, echo)]
    env = clean_env(data_dir, GATEWAY_CRED=PLANTED)
    runs = [run_judge("run", job, "--limit", 6, env=env, cwd=work),
            run_judge("rescore", job, "--limit", 6, env=env, cwd=work)]

    assert [r.returncode for r in runs] == [1, 1], [r.stderr for r in runs]  # the 400 failed
    assert server.state.auth and set(server.state.auth) == {f"Bearer {PLANTED}"}
    assert "credential [redacted] lacks this model" in runs[0].stderr
    # the cache, the reports (Parquet decoded), history/, both manifests, the terminal
    assert _leaks(work, (PLANTED.encode(), b"horse battery"), runs) == []
    assert len(list((work / "runs").rglob("manifest.json"))) >= 3


@pytest.mark.slow
def test_reports_are_readable_by_others_under_umask_022(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    # A report is meant to be shared: under the usual umask the others may read every file
    # of the set and of its history copy (hard links: the same files).
    out = tmp_path / "out"
    done = subprocess.run(judge_cmd("run", OPENMEVA, "--limit", 3, "--model", "fake",
                                    "--base-url", server.url, "--cache-dir", tmp_path / "cache",
                                    "--out", out),
                          env=clean_env(data_dir), cwd=tmp_path, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, check=False, umask=0o022)
    assert done.returncode == 0, done.stderr
    files = [p for p in out.rglob("*") if p.is_file() and not p.is_symlink()]
    assert {p.name for p in files} >= {"manifest.json", "report.html", "scores.parquet"}
    assert {p.relative_to(out).as_posix(): oct(stat.S_IMODE(p.stat().st_mode))
            for p in files if stat.S_IMODE(p.stat().st_mode) != 0o644} == {}


@pytest.mark.slow
def test_the_resume_line_masks_a_cache_url_password(
        server: ThreadedServer, tmp_path: Path, data_dir: Path, pg_url: str,
        processes: Processes) -> None:
    url = pg_url.replace("postgres@", f"postgres:{PG_PASSWORD}@")
    server.state.script.latency_s = 0.2  # 60 tasks, 4 at a time: ~3 s, time to interrupt
    args = ("run", OPENMEVA, "--limit", 60, "--concurrency", 4, "--model", "fake",
            "--base-url", server.url, "--cache", url, "--out", tmp_path / "out")
    proc = processes.start(judge_cmd(*args), env=clean_env(data_dir), cwd=tmp_path)
    wait_until(lambda: server.state.answered >= 4 or proc.proc.poll() is not None,
               "the run getting going")
    proc.signal(signal.SIGINT)
    code, stdout, stderr = proc.finish()

    assert code == 130, stderr
    masked = " ".join(map(str, args)).replace(PG_PASSWORD, "***")
    assert stderr.splitlines()[-1].endswith(f"rerun to resume: judge {masked}"), stderr
    run = subprocess.CompletedProcess(args, code, stdout, stderr)
    assert _leaks(tmp_path, (PG_PASSWORD.encode(),), [run]) == []
