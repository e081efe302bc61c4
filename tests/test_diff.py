"""judge diff JOB RUN_A RUN_B: two kept runs' correlations side by side, the change with its CI."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import pytest

from tests.fakeserver import ThreadedServer
from tests.test_cli import JOB, _levels_reply, clean_env, error_line, run_judge, write_job


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_diff_of_a_parser_change(server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    server.state.script.reply = _levels_reply
    job = write_job(tmp_path / "jobs")
    out = tmp_path / "out"
    common = ("--limit", 40, "--base-url", server.url, "--cache-dir", tmp_path / "cache",
              "--out", out)
    env = clean_env(data_dir)
    assert run_judge("run", job, *common, env=env, cwd=tmp_path).returncode == 0
    job.write_text(JOB.replace('"Perfect storyline and grammar" = 5',
                               '"Perfect storyline and grammar" = 1'))
    assert run_judge("rescore", job, *common, env=env, cwd=tmp_path).returncode == 0
    first, second = sorted(p.name for p in (out / "history").iterdir())

    result = run_judge("diff", job, first, "latest", "--out", out, env=env, cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == (f"{first} -> latest (spearman; change = B - A, 95% CI, paired bootstrap; "
                        "n = groups both runs scored):")
    number = r"-?\d\.\d{3}"
    assert all(re.fullmatch(rf"  openmeva / overall  fake/stars -> fake/stars  (sample|dataset): "
                            rf"{number} -> {number}  [+-]\d\.\d{{3}} \[{number}, {number}\]  "
                            rf"p=\d\.\d{{3}}  n=\d+", line) for line in lines[1:]), lines
    diffs = _rows(out / "diff.csv")
    before = {(r["level"], r["method"]): float(r["value"])
              for r in _rows(out / "history" / first / "correlations.csv")
              if r["judge"] == "fake/stars" and r["subset"] == "all"}
    after = {(r["level"], r["method"]): float(r["value"])
             for r in _rows(out / "history" / second / "correlations.csv")
             if r["judge"] == "fake/stars" and r["subset"] == "all"}
    # every level but system (its CI is a bootstrap over systems, not groups), every method
    assert {(r["level"], r["method"]) for r in diffs} == {k for k in before if k[0] != "system"}
    # the groups resampled: those both runs scored
    scored = [{r["group"] for r in _rows(out / "history" / run / "scores.csv")
               if r["judge_score"] != ""} for run in (first, second)]
    for r in diffs:
        assert int(r["n_groups"]) == len(scored[0] & scored[1]) > 1, r
        a, b, change = float(r["value_a"]), float(r["value_b"]), float(r["change"])
        assert math.isclose(a, before[r["level"], r["method"]])
        assert math.isclose(b, after[r["level"], r["method"]])
        assert math.isclose(change, b - a) and change != 0
        assert float(r["ci_low"]) <= change <= float(r["ci_high"])


@pytest.mark.slow
def test_diff_of_an_unknown_run(tmp_path: Path, data_dir: Path) -> None:
    job = write_job(tmp_path / "jobs")
    result = run_judge("diff", job, "nope", "latest", "--out", tmp_path / "out",
                       env=clean_env(data_dir), cwd=tmp_path)
    assert result.returncode == 2
    assert error_line(result.stderr) == (f"Error: {tmp_path / 'out' / 'history' / 'nope'}: no "
                                         f"such run; `judge runs {job}` lists them")
