"""scores.parquet: the same frame as scores.csv in pandas, written in every report set, and a
job's `scores_csv = false` leaving scores.csv out (judge diff and runner.results read the
Parquet file then)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from runner.errors import ConfigError
from runner.job.load import load_job
from runner.report import parquet as report_parquet
from runner.report import tables as report_tables
from runner.report.diff import read_scores
from tests.conftest import DATA_DIR, ROOT
from tests.fakeserver import ThreadedServer
from tests.test_cells import _expansion, _items, _judgments

JUDGE = str(Path(sys.executable).parent / "judge")
LABELS = report_parquet.LABELS


def _frames(csv: Path, parquet: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """scores.parquet as pandas reads it, labels as text; scores.csv with the labels as text
    (an item id "007" stays "007"), the numbers parsed back to the same floats."""
    from_parquet = pd.read_parquet(parquet)
    assert all(isinstance(from_parquet[c].dtype, pd.CategoricalDtype) for c in LABELS)
    for c in LABELS:
        from_parquet[c] = from_parquet[c].astype(str)
    numbers = [c for c in from_parquet.columns if c not in LABELS]
    from_csv = pd.read_csv(csv, dtype={c: str for c in LABELS}, keep_default_na=False,
                           na_values={c: [""] for c in numbers})
    return from_parquet, from_csv


@pytest.mark.parametrize(("seed", "row_group"), [(0, 1 << 20), (1, 37)])
def test_parquet_is_the_csv_frame(seed: int, row_group: int, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Random cells (metrics on some items and aspects, failures, juries, subsets, a stray
    item): the same columns, dtypes and values, in one row group or many."""
    from runner.job.spec import JurySpec

    monkeypatch.setattr(report_parquet, "ROW_GROUP", row_group)
    rng = np.random.default_rng(seed)
    items = {"d1": _items(rng, "d1", 30, subsets=False), "d2": _items(rng, "d2", 20, True)}
    juries = (JurySpec(name="panel", judges=("m1/p1", "m2/p1"), method="median", quorum=1),)
    expansion = _expansion(items, juries)
    tables = report_tables.collect(expansion, _judgments(rng, items, True), io.BytesIO(),
                                   juries)
    with open(tmp_path / "scores.csv", "wb") as f:
        report_tables.scores_csv(tables, f)
    with open(tmp_path / "scores.parquet", "wb") as f:
        report_parquet.write_scores_parquet(tables.cells,
                                            report_tables.metric_names(tables.cells), f)
    got, want = _frames(tmp_path / "scores.csv", tmp_path / "scores.parquet")
    assert list(got.columns)[-3:] == ["bert", "bleu", "ter"]
    assert got["judge_score"].isna().any() and got["human_score"].isna().any()
    pd.testing.assert_frame_equal(got, want)


def _openmeva(tmp_path: Path, name: str, first_line: str = "") -> Path:
    """jobs/openmeva.toml under tmp_path/jobs (its prompts linked), `first_line` on top."""
    (tmp_path / "jobs").mkdir(exist_ok=True)
    if not (tmp_path / "prompts").exists():
        os.symlink(ROOT / "prompts", tmp_path / "prompts")  # the job's "../prompts/..."
    job = tmp_path / "jobs" / f"{name}.toml"
    job.write_text(first_line + (ROOT / "jobs" / "openmeva.toml").read_text())
    return job


def test_scores_csv_must_be_true_or_false(tmp_path: Path) -> None:
    job = _openmeva(tmp_path, "bad", 'scores_csv = "no"\n')
    with pytest.raises(ConfigError) as err:
        load_job(job)
    assert str(err.value) == f"{job}: scores_csv must be bool (got 'no')"
    assert load_job(_openmeva(tmp_path, "lean", "scores_csv = false\n")).scores_csv is False
    assert load_job(_openmeva(tmp_path, "full")).scores_csv is True


def _judge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    env["JUDGE_DATA_DIR"] = str(DATA_DIR)
    return subprocess.run([JUDGE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180, check=False)


@pytest.mark.slow
def test_a_run_writes_parquet_and_can_leave_the_csv_out(tmp_path: Path,
                                                        server: ThreadedServer) -> None:
    """openmeva through the CLI: scores.parquet beside scores.csv, the same frame; then the
    job with scores_csv = false: no scores.csv, the same scores.parquet, and judge's readers
    of scores (read_scores for judge diff, runner.results) get the same from it."""
    if not (DATA_DIR / "openmeva").exists():
        pytest.skip(f"no openmeva data in {DATA_DIR}")
    jobs = {"with": _openmeva(tmp_path, "with"),
            "without": _openmeva(tmp_path, "without", "scores_csv = false\n")}
    outs = {}
    for name, job in jobs.items():
        outs[name] = tmp_path / f"out-{name}"
        done = _judge("run", str(job), "--limit", "30", "--model", "fake", "--base-url",
                      server.url, "--cache-dir", str(tmp_path / "cache"), "--out",
                      str(outs[name]), cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    full, lean = outs["with"], outs["without"]
    got, want = _frames(full / "scores.csv", full / "scores.parquet")
    pd.testing.assert_frame_equal(got, want)
    assert len(got) == 30 and "sentence_bleu" in got.columns  # 30 items x 1 aspect, metrics
    assert not (lean / "scores.csv").exists() and not (lean / "latest" / "scores.csv").exists()
    assert (lean / "scores.parquet").read_bytes() == (full / "scores.parquet").read_bytes()
    assert (lean / "latest" / "scores.parquet").is_file()
    assert {k: {j: s.rows() for j, s in v.items()} for k, v in read_scores(lean).items()} == {
        k: {j: s.rows() for j, s in v.items()} for k, v in read_scores(full).items()}
    import runner
    pd.testing.assert_frame_equal(runner.results(lean).scores, runner.results(full).scores)
