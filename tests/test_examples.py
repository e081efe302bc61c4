"""Every job in examples/ runs as its comment says: the real `judge` in a subprocess against the
fake server, a real cache, real reports. The README and the docs send newcomers here first."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fakeserver import ThreadedServer

JUDGE = str(Path(sys.executable).parent / "judge")
EXAMPLES = ROOT / "examples"
MODEL = "gpt-4o-mini"


def _judge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return subprocess.run([JUDGE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def _run(job: str, server: ThreadedServer, tmp_path: Path, *more: str) -> Path:
    """`judge run` of an example as a user types it (no --out: runs/<name> under cwd)."""
    done = _judge("run", str(EXAMPLES / job), "--model", MODEL, "--base-url", server.url,
                  "--yes", *more, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return tmp_path / "runs"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_every_example_job_is_tested() -> None:
    jobs = {str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.toml")}
    assert jobs == {"my-data/job.toml", "two-judges.toml", "geval-cot.toml", "battle/job.toml"}


def test_own_data_is_twenty_rows_rated_by_two_people() -> None:
    rows = [json.loads(line) for line in
            (EXAMPLES / "my-data" / "outputs.jsonl").read_text().splitlines()]
    assert len(rows) == 20 and len({r["id"] for r in rows}) == 20
    assert all({"rater1", "rater2", "source", "summary", "doc", "system"} <= set(r) for r in rows)


@pytest.mark.slow
def test_own_data_runs_prints_the_result_and_reruns_from_the_cache(
        server: ThreadedServer, tmp_path: Path) -> None:
    args = ["run", str(EXAMPLES / "my-data" / "job.toml"), "--model", MODEL, "--base-url",
            server.url, "--yes"]
    first = _judge(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    printed = first.stderr  # counts, report folder and result go to stderr, like progress
    assert "20 tasks: 0 cached, 20 called" in printed
    assert "correlation with the human scores (spearman, 95% CI" in printed
    assert f"{MODEL}/stars" in printed and "news / fluency" in printed
    out = tmp_path / "runs" / "my-data"
    judgments = (out / "judgments.jsonl").read_text().splitlines()
    assert len(judgments) == 20 and all(json.loads(j)["score"] is not None for j in judgments)
    judges = {r["judge"] for r in _rows(out / "correlations.csv")}
    assert {f"{MODEL}/stars", "length", "iaa"} <= judges
    calls = server.state.answered
    again = _judge(*args, cwd=tmp_path)
    assert again.returncode == 0 and server.state.answered == calls  # all from the cache
    view = _judge("view", str(EXAMPLES / "my-data" / "job.toml"), "--print", cwd=tmp_path)
    assert view.returncode == 0 and view.stdout.strip().endswith("runs/my-data/report.html")


@pytest.mark.slow
def test_two_judges_then_compare_writes_williams_test(server: ThreadedServer,
                                                      tmp_path: Path) -> None:
    runs = _run("two-judges.toml", server, tmp_path)
    calls = server.state.answered
    assert calls == 40
    done = _judge("compare", str(EXAMPLES / "two-judges.toml"), "--model", MODEL,
                  "--base-url", server.url, "--judges", f"{MODEL}/rubric", f"{MODEL}/stars",
                  "--permutations", "200", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert server.state.answered == calls  # compare never calls
    rows = _rows(runs / "two-judges" / "compare.csv")
    dataset = [r for r in rows if r["level"] == "dataset"]
    assert dataset and all(r["williams_p"] and r["permutation_p"] for r in dataset)


@pytest.mark.slow
def test_geval_style_judge_samples_and_reports_self_consistency(server: ThreadedServer,
                                                                tmp_path: Path) -> None:
    runs = _run("geval-cot.toml", server, tmp_path)
    lines = [json.loads(x) for x in (runs / "geval-cot" / "judgments.jsonl").read_text()
             .splitlines()]
    assert len(lines) == 20 and all(1 <= line["score"] <= 5 for line in lines)
    sent = json.dumps(lines[0]["raw"])
    assert sent  # the answer text is kept
    figures = {r["figure"] for r in _rows(runs / "geval-cot" / "reliability.csv")}
    assert "self_consistency" in figures


@pytest.mark.slow
def test_battle_in_both_orders_writes_battle_csv(server: ThreadedServer,
                                                  tmp_path: Path) -> None:
    done = _judge("run", str(EXAMPLES / "battle" / "job.toml"), "--model", MODEL,
                  "--base-url", server.url, "--yes", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    runs = tmp_path / "runs"
    assert server.state.answered == 20  # 10 questions x 2 orders
    lines = done.stderr.splitlines()  # the result, on the terminal too
    at = lines.index("battles (both orders; a win or tie only when the two orders agree):")
    assert lines[at + 1].startswith(f"  {MODEL}/battle on answers / battle: model-a vs model-b:")
    assert lines[at + 2] == "ranking (Bradley-Terry strength, 95% CI; ranking.csv):"
    assert lines[at + 3].startswith("   1. model-")
    (row,) = _rows(runs / "battle" / "battle.csv")
    assert (row["model_a"], row["model_b"], row["n"]) == ("model-a", "model-b", "10")
    outcomes = sum(int(row[k]) for k in ("a_wins", "ties", "b_wins", "inconsistent"))
    assert outcomes == 10
    figures = {r["figure"] for r in _rows(runs / "battle" / "reliability.csv")}
    assert "position" in figures


def test_readme_runs_the_own_data_example() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "judge run examples/my-data/job.toml" in readme
    assert len(readme.splitlines()) <= 260


@pytest.mark.parametrize("recipe", ["slurm-array.sh", "k8s-indexed-job.yaml"])
def test_cluster_recipes_are_still_there(recipe: str) -> None:
    assert (EXAMPLES / recipe).exists()
