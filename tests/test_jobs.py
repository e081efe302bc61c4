"""Every ready-made job in jobs/ plans with a task count and a cost, and runs end to end
against the fake server with --limit: the real CLI in a subprocess, real data, real cache."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.report.html import read_page_data
from tests.conftest import DATA_DIR, ROOT
from tests.fakeserver import ThreadedServer

JUDGE = str(Path(sys.executable).parent / "judge")
JOBS = sorted(p.stem for p in (ROOT / "jobs").glob("*.toml"))
# Items per data set: enough for two groups (a TST group has nine outputs).
LIMITS = {"tst-formality": 18, "summeval": 4, "geval-summeval": 2}


def _judge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    env["JUDGE_DATA_DIR"] = str(DATA_DIR)
    return subprocess.run([JUDGE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_every_job_is_tested() -> None:
    assert {"openmeva", "summeval", "bagel", "geval-summeval", "tst-formality", "korean-chat",
            "korean-chat-readme", "colossalai-en", "colossalai-cn"} <= set(JOBS)


@pytest.mark.slow
@pytest.mark.parametrize("job", JOBS)
def test_plan_shows_tasks_and_cost_without_network(job: str, tmp_path: Path) -> None:
    done = _judge("plan", str(ROOT / "jobs" / f"{job}.toml"), "--cache-dir",
                  str(tmp_path / "cache"), "--base-url", "http://127.0.0.1:9/v1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert " tasks, 0 cached" in done.stdout
    assert "total: ~$" in done.stdout


RUN = [j for j in JOBS if j not in ("korean-chat-readme", "colossalai-en", "colossalai-cn")]


@pytest.mark.slow
@pytest.mark.parametrize("job", RUN)
def test_job_runs_against_the_fake_server(job: str, tmp_path: Path,
                                          server: ThreadedServer) -> None:
    out = tmp_path / "out"
    args = ["run", str(ROOT / "jobs" / f"{job}.toml"), "--limit", str(LIMITS.get(job, 3)),
            "--model", "fake", "--base-url", server.url, "--cache-dir", str(tmp_path / "cache"),
            "--out", str(out)]
    first = _judge(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    calls = server.state.answered
    assert calls > 0
    lines = [json.loads(line) for line in (out / "judgments.jsonl").read_text().splitlines()]
    assert lines and all(line["model"] == "fake" for line in lines)
    scored = [line for line in lines if line["score"] is not None]
    assert len(scored) >= len(lines) / 2, [line["error"] for line in lines][:3]
    for name in ("scores.csv", "correlations.csv", "summary.csv", "report.md", "manifest.json",
                 "report.html"):
        assert (out / name).exists(), name
    page = read_page_data(out / "report.html")
    assert page["job"] and page["datasets"] and len(page["items"]["rows"]) == len(lines)
    prompts = page["items"]["prompts"]  # a run keeps no bodies: the page rebuilt each prompt
    assert all("[user]" in prompts[row[-1]] for row in page["items"]["rows"])
    again = _judge(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert server.state.answered == calls  # the rerun is all cache hits


def _run_job(job: str, limit: int, server: ThreadedServer, tmp_path: Path) -> Path:
    """`judge run jobs/JOB.toml` against the fake server; returns the report folder."""
    out = tmp_path / "out"
    done = _judge("run", str(ROOT / "jobs" / f"{job}.toml"), "--limit", str(limit), "--model",
                  "fake", "--base-url", server.url, "--cache-dir", str(tmp_path / "c"),
                  "--out", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.slow
def test_tst_group_requests_score_every_output(tmp_path: Path, server: ThreadedServer) -> None:
    out = _run_job("tst-formality", 18, server, tmp_path)
    # 2 sources x (3 single-dimension requests + 1 multi-dimension request), each 9 outputs.
    assert server.state.answered == 8
    lines = [json.loads(line) for line in (out / "judgments.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 2 * 3 * 9
    assert all(line["score"] is not None for line in lines)
    rows = list(csv.DictReader((out / "correlations.csv").read_text().splitlines()))
    levels = {(r["level"], r["method"], r["subset"]) for r in rows if r["judge"] == "fake/single"}
    assert ("system", "pairwise_accuracy", "informal->formal") in levels
    assert ("sample", "kendall", "all") in levels


@pytest.mark.slow
def test_korean_chat_generates_then_judges(tmp_path: Path, server: ThreadedServer) -> None:
    out = _run_job("korean-chat", 3, server, tmp_path)
    # 3 instructions x 2 candidates answered, then 6 judge calls (five aspects, one request).
    assert server.state.answered == 12
    board = list(csv.DictReader((out / "leaderboard.csv").read_text().splitlines()))
    assert sorted(r["model"] for r in board) == ["kullm3", "solar"]
    assert all(r["n"] == "3" and r["failed"] == "0" for r in board)
