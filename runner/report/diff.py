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
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.errors import DataError
from runner.job.spec import Job
from runner.reduce.compare import compare, paired_levels
from runner.reduce.jury import judge_name
from runner.reduce.resample import Resamples
from runner.reduce.series import Row, Series
from runner.report.folder import read_csv
from runner.report.headline import shown_method
from runner.report.standing import MIN_PARSED_SHARE, parsed_counts

__all__ = ["DIFF_COLUMNS", "RunDiff", "diff_folders", "number", "read_scores", "score_rows"]

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
    for r in score_rows(path, run / "scores.parquet"):
        if r["judge_score"] is None or r["human_score"] is None:
            continue
        judges = rows.setdefault((r["dataset"], r["aspect"]), {})
        judges.setdefault(judge_name(r["model"], r["prompt"]), []).append(
            Row(r["group"], r["system"], r["subset"], r["judge_score"], r["human_score"]))
    return {where: {judge: Series.of_rows(data) for judge, data in judges.items()}
            for where, judges in rows.items()}


def score_rows(path: Path, parquet: Path) -> Iterator[dict[str, Any]]:
    """scores.csv's rows (else scores.parquet's) with the two scores as floats (None for an
    empty cell).

    Args:
        path: the run's scores.csv.
        parquet: its scores.parquet, read when there is no scores.csv.

    Returns:
        The rows, in the file's order.

    Raises:
        DataError: neither file is there.
    """
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


def _diff_runs(a: Scores, b: Scores, job: Job) -> list[dict[str, Any]]:
    """DIFF_COLUMNS rows: each pair of judges (see the module docstring) per data set and
    aspect both runs scored, compared at every level but system (a bootstrap over groups)."""
    rows, resamples = [], Resamples()
    kept = paired_levels(job.levels)
    for where in [k for k in a if k in b]:
        for judge_a, judge_b in _pairs(a[where], b[where]):
            # B first: compare's difference is its first judge's minus its second's
            for c in compare(b[where][judge_b], a[where][judge_a], policy=job.policy,
                             levels=kept, methods=job.methods, n_boot=job.bootstrap,
                             seed=job.seed, resamples=resamples):
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


@dataclass(frozen=True, slots=True)
class RunDiff:
    """Two kept runs compared: what `judge diff` prints and writes, and what `judge serve`'s
    side-by-side page shows (one computation, so the two cannot differ)."""

    rows: list[dict[str, Any]]
    """DIFF_COLUMNS rows, every method and level (diff.csv)."""
    method: str
    """The method the lines show: spearman where the job computes it, else its first."""
    lines: list[str]
    """One line per pair of judges and level at `method` (see _diff_lines)."""


def diff_folders(run_a: Path, run_b: Path, job: Job) -> RunDiff:
    """Compare two kept runs of `job` (their report folders).

    Args:
        run_a, run_b: the two runs' folders (history/RUN, or latest).
        job: the job, whose levels, methods, policy, bootstrap and seed the comparison uses.

    Returns:
        The rows (empty: no data set and aspect with a judge in both) and the lines.

    Raises:
        DataError: a run has neither scores.csv nor scores.parquet.
    """
    rows = _diff_runs(read_scores(run_a), read_scores(run_b), job)
    method = shown_method(job.methods)
    parsed = [parsed_counts(read_csv(run / "summary.csv")) for run in (run_a, run_b)]
    return RunDiff(rows, method, _diff_lines([r for r in rows if r["method"] == method], *parsed))


Parsed = dict[tuple[str, str, str], tuple[int, int]]


def _diff_lines(rows: list[dict[str, Any]], parsed_a: Parsed, parsed_b: Parsed) -> list[str]:
    """`judge diff`'s lines: one per diff row with its n; one per data set and aspect the two
    runs share no group of (every value n/a: other items, e.g. another --sample or --limit);
    and a note on a judge that parsed fewer than MIN_PARSED_SHARE of its answers in both runs
    (runner.report.standing does not rank it). `parsed_*`: each run's parsed and answered
    counts per judge."""
    lines, shared = [], {(r["dataset"], r["aspect"]) for r in rows if r["n_groups"]}
    for r in rows:
        where = (r["dataset"], r["aspect"])
        few = [f"{s} of {n}" for s, n in (parsed_a.get((*where, r["judge_a"]), (0, 0)),
                                          parsed_b.get((*where, r["judge_b"]), (0, 0)))
               if n and s < MIN_PARSED_SHARE * n]
        lines.append(f"  {r['dataset']} / {r['aspect']}  {r['judge_a']} -> {r['judge_b']}  "
                     f"{r['level']}: {number(r['value_a'])} -> {number(r['value_b'])}  "
                     f"{number(r['change'], sign=True)} [{number(r['ci_low'])}, "
                     f"{number(r['ci_high'])}]  p={number(r['p_value'])}  n={r['n_groups']}"
                     + (f"  (few answers parsed in both runs: {few[0]}, {few[1]})"
                        if len(few) == 2 else ""))
    for dataset, aspect in dict.fromkeys((r["dataset"], r["aspect"]) for r in rows):
        if (dataset, aspect) not in shared:
            lines.append(f"  {dataset} / {aspect}: the two runs share no scored group (other "
                         "items: another --sample, --limit or data file): nothing to compare")
    return lines


def number(value: float | None, sign: bool = False) -> str:
    """A coefficient as the commands and the served pages print it: 3 decimals, `n/a` for
    none (a NaN: no spread).

    Args:
        value: the coefficient, or None.
        sign: print a + before a positive value (a change).

    Returns:
        The text.
    """
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:+.3f}" if sign else f"{value:.3f}"
