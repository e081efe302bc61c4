"""`judge diff JOB RUN_A RUN_B`: what changed between two kept runs of a study (prompt v1 and
v2, judge A and B, a parser change), as correlations side by side with their difference.

Each run's scores.csv gives, per data set and aspect, each judge's scores with the human
scores; a judge of run A is paired with the same judge in run B (a prompt or parser changed
under one name), or, where each run has one judge there and the names differ, with that one.
The difference's 95% CI and p-value come from `runner.reduce.correlate.compare`: a paired
bootstrap over the groups both runs scored, both coefficients on the same resamples.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from runner.errors import DataError
from runner.reduce.compare import compare
from runner.reduce.jury import judge_name
from runner.reduce.resample import Resamples
from runner.reduce.series import Row, Series

__all__ = ["DIFF_COLUMNS", "diff_runs", "read_scores"]

DIFF_COLUMNS = ["dataset", "aspect", "judge_a", "judge_b", "level", "method", "value_a",
                "value_b", "change", "ci_low", "ci_high", "p_value", "n_groups"]
"""`change` is value_b - value_a (what run B changed), with the 95% CI of that change."""

Scores = dict[tuple[str, str], dict[str, Series]]


def read_scores(run: Path) -> Scores:
    """(dataset, aspect) -> judge (`model/prompt`) -> its rows with a judge and a human score,
    from a kept run's scores.csv (or its scores.parquet, for a job that sets scores_csv =
    false: the same rows and values).

    Args:
        run: the run's report folder.
    Returns:
        the series, in the file's order.
    Raises:
        DataError: the folder has neither file.
    """
    path = run / "scores.csv"
    rows: dict[tuple[str, str], dict[str, list[Row]]] = {}
    for r in _score_rows(path, run / "scores.parquet"):
        if r["judge_score"] is None or r["human_score"] is None:
            continue
        judges = rows.setdefault((r["dataset"], r["aspect"]), {})
        judges.setdefault(judge_name(r["model"], r["prompt"]), []).append(
            Row(r["group"], r["system"], r["subset"], r["judge_score"], r["human_score"]))
    return {where: {judge: Series.of_rows(data) for judge, data in judges.items()}
            for where, judges in rows.items()}


def _score_rows(path: Path, parquet: Path) -> Iterator[dict[str, Any]]:
    """scores.csv's rows with the two scores as floats (None for an empty cell)."""
    if path.is_file():
        with path.open(newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                yield {**r, **{k: float(r[k]) if r[k] else None
                               for k in ("judge_score", "human_score")}}
        return
    if not parquet.is_file():
        raise DataError(f"{path}: missing; the run's report set is incomplete")
    # here, not at start-up: pyarrow takes 0.1-0.2 s to import; only a run without scores.csv
    # needs it
    import pyarrow.parquet as pq

    columns = ["dataset", "group", "system", "subset", "prompt", "aspect", "model",
               "judge_score", "human_score"]
    table = pq.read_table(parquet, columns=columns)
    for batch in table.to_batches():
        yield from batch.to_pylist()


def diff_runs(a: Scores, b: Scores, *, policy: str, levels: Sequence[str],
              methods: Sequence[str], n_boot: int, seed: int) -> list[dict[str, Any]]:
    """DIFF_COLUMNS rows: each pair of judges (see the module docstring) per data set and
    aspect both runs scored, compared at every level but system (a bootstrap over groups)."""
    rows, resamples = [], Resamples()
    kept = [lv for lv in levels if lv != "system"] or ["sample", "dataset"]
    for where in [k for k in a if k in b]:
        for judge_a, judge_b in _pairs(a[where], b[where]):
            # B first: compare's difference is its first judge's minus its second's
            for c in compare(b[where][judge_b], a[where][judge_a], policy=policy, levels=kept,
                             methods=methods, n_boot=n_boot, seed=seed, resamples=resamples):
                if c.subset != "all":
                    continue
                rows.append({"dataset": where[0], "aspect": where[1], "judge_a": judge_a,
                             "judge_b": judge_b, "level": c.level, "method": c.method,
                             "value_a": c.judge_b, "value_b": c.judge_a, "change": c.diff,
                             "ci_low": c.ci_low, "ci_high": c.ci_high, "p_value": c.p_value,
                             "n_groups": c.n_groups})
    return rows


def _pairs(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, str]]:
    same = [(j, j) for j in a if j in b]
    if same:
        return same
    if len(a) == 1 and len(b) == 1:
        return [(next(iter(a)), next(iter(b)))]
    return []
