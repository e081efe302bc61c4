"""bench/run.py's figures file: --merge keeps the other benchmarks' figures and when each was
measured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.run import _merged, _table
from tests.conftest import ROOT


def test_merge_replaces_only_the_benchmarks_run_and_dates_every_figure() -> None:
    old = {"timestamp": "2026-11-22T04:03:47Z",
           "benchmarks": {"cached": {"run_seconds": 6.5},
                          "peers": {"ratio": 3.0, "measured": "2026-11-23T11:23:00Z"}}}
    new = {"timestamp": "2026-11-23T13:24:00Z", "quick": False, "machine": {"cores": 2},
           "benchmarks": {"peers": {"ratio": 8.9, "measured": "2026-11-23T13:24:00Z"}}}
    got = _merged(old, new)
    assert got["benchmarks"] == {
        "cached": {"run_seconds": 6.5, "measured": "2026-11-22T04:03:47Z"},
        "peers": {"ratio": 8.9, "measured": "2026-11-23T13:24:00Z"}}
    assert (got["timestamp"], got["updated"]) == ("2026-11-22T04:03:47Z", "2026-11-23T13:24:00Z")
    assert got["machine"] == {"cores": 2}


def test_the_floors_rows_show_each_whole_process_ratio_beside_its_goal() -> None:
    lines = _table({"floors": {"judge_over_bare": 0.761, "judge_over_bare_median": 0.75,
                               "run_over_floor": 1.18, "rescore_over_floor": 1.22,
                               "target": "all", "pass": False}}).splitlines()
    assert "0.76x" in lines[1] and ">= 0.8x" in lines[1] and "FAIL" in lines[1]
    assert "0.75x" in lines[2] and ">= 0.8x" in lines[2]
    assert "1.18x" in lines[3] and "<= 1.5x" in lines[3]
    assert "1.22x" in lines[4] and "<= 1.5x" in lines[4]


def test_phases_are_split_at_their_stamps_and_a_missing_one_shows_a_dash() -> None:
    from bench.phases import _median, _phase
    run = {"at": {"start": (100.0, 0.0), "imports": (100.2, 0.15), "first": (101.0, None),
                  "end": (109.0, None)}}
    wall, cpu = _phase(run, "start", "imports")
    assert (round(wall or 0, 3), cpu) == (0.2, 0.15)
    assert _phase(run, "start", "first") == (1.0, None)  # the server's clock: no CPU
    assert _phase(run, "imports", "atexit") == (None, None)  # a function renamed since
    assert _median([1.0, 3.0, 2.0]) == "2.000" and _median([1.0, None]) == "-"


@pytest.mark.slow
def test_merge_without_a_figures_file_is_a_usage_error() -> None:
    run = subprocess.run([sys.executable, "bench/run.py", "--only", "cached", "--merge"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2 and "--merge needs --out" in run.stderr


def test_report_sets_compare_every_csv_and_jsonl_and_show_the_first_differing_line(
        tmp_path: Path) -> None:
    from bench.tenm import compare_reports
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, stamp in ((a, "1"), (b, "2")):
        (folder / "history" / stamp).mkdir(parents=True)
        (folder / "history" / stamp / "scores.csv").write_text(stamp)  # earlier runs: not compared
        (folder / "judgments.jsonl").write_text('{"score":1.0}\n{"score":2.0}\n')
        (folder / "manifest.json").write_text(f'{{"started": {stamp}}}')  # times: not compared
        (folder / "report.html").write_text(stamp)
        (folder / "scores.csv").write_text("item,score\ni0,1.0\ni1,2.0\n")
    assert compare_reports(a, b) == {"compared": ["judgments.jsonl", "scores.csv"], "differ": [],
                                     "only_in_first": [], "only_in_second": [],
                                     "identical": True}
    (b / "scores.csv").write_text("item,score\ni0,1.0\ni1,2.5\n")
    (b / "correlations.csv").write_text("value\n")
    got = compare_reports(a, b)
    assert got["differ"] == [{"file": "scores.csv", "line": 3, "first": "i1,2.0",
                              "second": "i1,2.5"}]
    assert (got["only_in_second"], got["identical"]) == (["correlations.csv"], False)
    (b / "scores.csv").write_text("item,score\ni0,1.0\n")  # one line short
    assert compare_reports(a, b)["differ"][0] == {"file": "scores.csv", "line": 3,
                                                  "first": "i1,2.0", "second": None}
