"""The result a run prints last: the correlation table with CIs and the best judge marked, the
judges whose answers did not parse, and exit 1 for a judge with no parsed score at all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runner.report.headline import headline, system_note
from tests.fakeserver import ThreadedServer
from tests.test_cli import JOB, clean_env, run_judge, write_job


def _corr(judge: str, level: str, value: float, low: float = float("nan"),
          high: float = float("nan"), method: str = "spearman",
          subset: str = "all", n: int = 12) -> dict[str, Any]:
    return {"dataset": "d", "aspect": "overall", "judge": judge, "level": level,
            "method": method, "subset": subset, "value": value, "ci_low": low, "ci_high": high,
            "n_groups": n, "n_items": 4 * n, "n_systems": 5}


def _summ(model: str, n: int, scored: int, api: int = 0) -> dict[str, Any]:
    return {"dataset": "d", "prompt": "p", "aspect": "overall", "model": model, "n": n,
            "scored": scored, "api_failures": api}


def test_the_table_marks_the_best_judge_and_shows_cis() -> None:
    rows = [_corr("a/p", "sample", 0.41, 0.3, 0.5), _corr("a/p", "dataset", 0.2, 0.1, 0.3),
            _corr("b/p", "sample", 0.52, 0.4, 0.6), _corr("b/p", "dataset", float("nan")),
            _corr("rouge1", "sample", 0.9),  # a baseline metric: not a judge of the table
            _corr("a/p", "sample", 0.99, method="pearson"),
            _corr("a/p", "sample", 0.99, subset="x")]

    result = headline(["sample", "dataset", "system"], ["pearson", "spearman"], rows,
                      [_summ("a", 10, 10), _summ("b", 10, 9)])

    assert result.lines == [
        "correlation with the human scores (spearman, 95% CI, n; * best at sample level):",
        "  d / overall  sample                        dataset",
        "    a/p        0.410 [0.30, 0.50] n=12       0.200 [0.10, 0.30] n=48",
        "  * b/p        0.520 [0.40, 0.60] n=12       n/a",
        FOOTNOTE]
    assert result.unparsed == [] and result.scoreless == [] and result.no_spread == []


FOOTNOTE = ("  n = groups (sample), items (dataset), systems (system); * only among judges with "
            ">= 50% of answers parsed and n >= 10")


def test_no_best_mark_for_a_judge_mostly_unparsed_or_on_few_groups() -> None:
    # b's figure is the highest, on 16 of 60 answers; c's on 4 groups; a parsed every answer
    rows = [_corr("a/p", "sample", 0.41), _corr("b/p", "sample", 0.9),
            _corr("c/p", "sample", 0.8, n=4)]
    result = headline(["sample"], ["spearman"], rows,
                      [_summ("a", 60, 60), _summ("b", 60, 16), _summ("c", 60, 60)])
    marked = [line.split()[1] for line in result.lines[2:5] if line.startswith("  *")]
    assert marked == ["a/p"], result.lines
    assert result.lines[4].split()[-1] == "n=4"


def test_the_first_method_when_spearman_is_not_computed_and_no_mark_for_one_judge() -> None:
    result = headline(["sample"], ["kendall"], [_corr("a/p", "sample", 0.3, method="kendall")],
                      [])
    assert result.lines == [
        "correlation with the human scores (kendall, 95% CI, n; * best at sample level):",
        "  d / overall  sample", "    a/p        0.300 n=12", FOOTNOTE]


def test_judges_whose_answers_mostly_failed_to_parse_are_named() -> None:
    result = headline(["sample"], ["spearman"], [], [
        _summ("a", 10, 10), _summ("b", 10, 4), _summ("c", 10, 0, api=2),
        _summ("d", 10, 0, api=10), _summ("e", 10, 5)])
    assert result.lines == []
    assert result.unparsed == ["judge b/p: 6 of 10 answers unparsed: see report.html#failures",
                               "judge c/p: 8 of 8 answers unparsed: see report.html#failures"]
    assert result.scoreless == ["c/p"]  # d had no answer at all: it failed, it did not parse


def test_refusals_are_called_refusals_as_in_the_report() -> None:
    refused = {**_summ("r", 44, 0), "refusals": 44}
    mixed = {**_summ("m", 10, 2), "refusals": 3}
    result = headline(["sample"], ["spearman"], [], [refused, mixed, _summ("u", 10, 1)])
    assert result.unparsed == [
        "judge r/p: 44 of 44 answers were refusals: see report.html#failures",
        "judge m/p: 8 of 10 answers not scored: 5 unparsed, 3 refusals: see report.html#failures",
        "judge u/p: 9 of 10 answers unparsed: see report.html#failures"]
    assert result.scoreless == ["r/p"]


def test_a_value_above_its_own_ci_is_marked_and_said_why() -> None:
    rows = [_corr("a/p", "system", 0.999, 0.942, 0.998, n=8),
            _corr("b/p", "system", 0.80, 0.5, 0.9, n=8)]
    result = headline(["system"], ["spearman"], rows, [_summ("a", 60, 60), _summ("b", 60, 60)])
    cells = {judge: line for line in result.lines for judge in ("a/p", "b/p") if judge in line}
    assert "0.999^ [0.94, 1.00] n=5" in cells["a/p"] and "0.800 [0.50, 0.90]" in cells["b/p"]
    assert result.lines[-1].startswith("  ^ the value lies outside its CI: the CI is the "
                                       "bootstrap's percentiles")
    inside = headline(["system"], ["spearman"], rows[1:], [_summ("b", 60, 60)])
    assert not any("outside its CI" in line for line in inside.lines)
    assert "marked ^" in (system_note(rows) or "")


@pytest.mark.slow
def test_a_run_ends_with_its_result(server: ThreadedServer, tmp_path: Path,
                                   data_dir: Path) -> None:
    job = write_job(tmp_path / "jobs")
    result = run_judge("run", job, "--limit", 30, "--base-url", server.url, "--cache-dir",
                       tmp_path / "cache", "--out", tmp_path / "out", env=clean_env(data_dir),
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    at = lines.index("correlation with the human scores (spearman, 95% CI, n; * best at "
                     "sample level):")
    assert lines[at + 1].split() == ["openmeva", "/", "overall", "sample", "dataset", "system"]
    assert lines[at + 2].split()[0] == "fake/stars" and lines[at + 3] == FOOTNOTE
    assert len(lines) == at + 4


@pytest.mark.slow
def test_a_judge_with_no_parsed_score_fails_the_run(server: ThreadedServer, tmp_path: Path,
                                                    data_dir: Path) -> None:
    server.state.script.reply = lambda body: "I would rather not say."
    job = write_job(tmp_path / "jobs", JOB)
    args = ("--limit", 12, "--base-url", server.url, "--cache-dir", tmp_path / "cache",
            "--out", tmp_path / "out")
    env = clean_env(data_dir)

    for command in ("run", "rescore"):
        result = run_judge(command, job, *args, env=env, cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip().splitlines()[-1] == \
            "judge fake/stars: 12 of 12 answers unparsed: see report.html#failures"
    assert server.state.requests == 12
