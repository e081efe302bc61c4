"""bench/run.py's figures file: --merge keeps the other benchmarks' figures and when each was
measured."""

from __future__ import annotations

import subprocess
import sys

from bench.run import _merged
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


def test_merge_without_a_figures_file_is_a_usage_error() -> None:
    run = subprocess.run([sys.executable, "bench/run.py", "--only", "cached", "--merge"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 2 and "--merge needs --out" in run.stderr
