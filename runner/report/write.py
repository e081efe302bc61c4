"""Write a run's report set into runs/<job>/: each file atomically (temp file + rename), the
set whole or not at all (runner.report.folder). The files and their columns:
docs/reference/outputs.md.
"""

from __future__ import annotations

import contextlib
import io
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from runner.errors import ConfigError
from runner.execute.localmodels import LOCAL_MODELS
from runner.expand import Expansion
from runner.job.spec import Job
from runner.parse.parsers import get_parser
from runner.reduce.battle import BATTLE_COLUMNS, Battles
from runner.reduce.compare import compare, paired_levels
from runner.reduce.correlate import correlate
from runner.reduce.judge_series import judge_series
from runner.reduce.judgments import Judgment
from runner.reduce.positions import Positions
from runner.reduce.ranking import RANKING_COLUMNS, battle_lines, rank_rows
from runner.reduce.resample import Resamples
from runner.reduce.series import Series
from runner.report.aside import ForkedResult
from runner.report.browser import ItemRows
from runner.report.folder import atomic_file, new_run_id, report_set, write_atomic
from runner.report.headline import headline, system_note
from runner.report.html import render
from runner.report.markdown import battle_markdown, ranking_markdown, reliability_markdown, table
from runner.report.pagedata import page_data
from runner.report.parquet import write_scores_parquet
from runner.report.reliability import (
    RELIABILITY_COLUMNS,
    csv_bytes,
    reliability_page,
    reliability_rows,
)
from runner.report.standing import bias_warnings
from runner.report.tables import (
    Tables,
    collect,
    leaderboard,
    metric_names,
    scores_csv,
    summary,
)

__all__ = ["Tables", "atomic_file", "collect", "comparison", "correlations", "judge_rows",
           "leaderboard", "scores_csv", "summary", "write_atomic", "write_reports"]

CORRELATION_COLUMNS = ["dataset", "aspect", "judge", "level", "method", "subset", "value",
                       "n_groups", "n_items", "ci_low", "ci_high", "n_systems"]
SUMMARY_COLUMNS = ["dataset", "prompt", "aspect", "model", "n", "scored", "mean", "std",
                   "parse_failures", "refusals", "api_failures", "top_score", "top_count"]
JudgeSeries = Mapping[tuple[str, str], Mapping[str, Series]]


def judge_rows(expansion: Expansion, tables: Tables) -> dict[tuple[str, str], dict[str, Series]]:
    """(dataset, aspect) -> judge -> its scores against the human score, for items with a
    human score (runner.reduce.judge_series.judge_series over the tables' cells).

    Args:
        expansion, tables: the job's tasks and the gathered tables.

    Returns:
        The series per data set, aspect and judge.
    """
    return judge_series(expansion, tables.cells)


def correlations(expansion: Expansion, tables: Tables,
                 series: JudgeSeries | None = None) -> list[dict[str, Any]]:
    """Every judge against human, per data set and aspect, as correlations.csv rows.

    Args:
        expansion: the job (levels, methods, bootstrap, seed).
        tables: the collected tables (read only when `series` is None).
        series: judge_rows(expansion, tables) if the caller has it already.

    Returns:
        CORRELATION_COLUMNS rows.
    """
    job, rows = expansion.job, []
    series = judge_rows(expansion, tables) if series is None else series
    resamples = Resamples()  # a data set's judges and aspects resampled on the same draws
    for (dataset, aspect), judges in series.items():
        for judge, data in judges.items():
            for c in correlate(data, policy=job.policy, levels=job.levels, methods=job.methods,
                               n_boot=job.bootstrap, seed=job.seed, resamples=resamples):
                rows.append({"dataset": dataset, "aspect": aspect, "judge": judge,
                             **{k: getattr(c, k) for k in CORRELATION_COLUMNS[3:]}})
    return rows


COMPARE_COLUMNS = ["dataset", "aspect", "a", "b", "level", "method", "subset", "value_a",
                   "value_b", "diff", "ci_low", "ci_high", "p_value", "n_groups"]


def comparison(expansion: Expansion, series: JudgeSeries,
               judges: tuple[str, str]) -> list[dict[str, Any]]:
    """compare.csv's rows (COMPARE_COLUMNS): judge A against judge B, paired bootstrap, per data
    set and aspect, over `series` (judge_rows of the collected tables).

    Args:
        expansion, series: the job and the judges' scores (judge_rows).
        judges: the names of judges A and B.

    Returns:
        The rows.

    Raises:
        ConfigError: A judge is not among those of a data set and aspect.
    """
    job, rows, resamples = expansion.job, [], Resamples()
    levels = paired_levels(job.levels)
    for (dataset, aspect), by_judge in series.items():
        missing = [j for j in judges if j not in by_judge]
        if missing:
            raise ConfigError(f"{job.path}: no judge {missing[0]!r} for {dataset}/{aspect}; "
                              f"judges there: {', '.join(sorted(by_judge))}")
        for c in compare(by_judge[judges[0]], by_judge[judges[1]], policy=job.policy,
                         levels=levels, methods=job.methods, n_boot=job.bootstrap, seed=job.seed,
                         resamples=resamples):
            rows.append({"dataset": dataset, "aspect": aspect, "a": judges[0], "b": judges[1],
                         "level": c.level, "method": c.method, "subset": c.subset,
                         "value_a": c.judge_a, "value_b": c.judge_b, "diff": c.diff,
                         "ci_low": c.ci_low, "ci_high": c.ci_high, "p_value": c.p_value,
                         "n_groups": c.n_groups})
    return rows


def _local_notes(job: Job) -> list[str]:
    """What a small local judge is for, said plainly."""
    return [f"**Judge `{m.name}` ({m.spec}) is {LOCAL_MODELS[m.model].description}**, run "
            "through llama.cpp on this machine. It checks the pipeline end to end (client, "
            "limiter, cache, parser, reducer); it is not a research-grade judge, and its "
            "correlations below are shown as they come out.\n"
            for m in job.models if m.kind == "local" and m.model in LOCAL_MODELS]


def _markdown(expansion: Expansion, corr: list[dict[str, Any]],
              summ: list[dict[str, Any]], notes: Sequence[str]) -> str:
    job = expansion.job
    lines = [f"# {job.name}", "", *notes, *_local_notes(job), ""]
    parsers = sorted({f"{p.parser} {get_parser(p.parser).version}" for p in job.prompts})
    lines += [f"Parsers: {', '.join(parsers)}. Sample-level policy for constant groups: "
              f"`{job.policy}`. 95% bootstrap CIs ({job.bootstrap} resamples) are in "
              "correlations.csv.", ""]
    by_table: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in corr:
        by_table[row["dataset"], row["aspect"]].append(row)
    for (dataset, aspect), rows in by_table.items():
        lines += _table(dataset, aspect, rows)
    lines += ["## Judge answers", "", *table(
        ["dataset", "prompt", "aspect", "model", "n", "scored", "mean", "parse failures",
         "refusals", "API failures"], "llllrrrrrr",
        [[s["dataset"], s["prompt"], s["aspect"], s["model"], s["n"], s["scored"],
          "" if s["mean"] is None else f"{s['mean']:.3f}", s["parse_failures"], s["refusals"],
          s["api_failures"]] for s in summ])]
    return "\n".join(lines) + "\n"


def _table(dataset: str, aspect: str, rows: list[dict[str, Any]]) -> list[str]:
    columns = list(dict.fromkeys((r["level"], r["subset"], r["method"]) for r in rows))
    judges = list(dict.fromkeys(r["judge"] for r in rows))
    cell = {(r["judge"], r["level"], r["subset"], r["method"]): r for r in rows}
    head = [f"{lvl} {m}" + ("" if sub == "all" else f" ({sub})") for lvl, sub, m in columns]
    body: list[list[object]] = []
    for judge in judges:
        values = []
        n = 0
        for lvl, sub, m in columns:
            r = cell.get((judge, lvl, sub, m))
            values.append("" if r is None or r["value"] is None else f"{r['value']:.3f}")
            if r is not None and lvl == "dataset" and sub == "all":
                n = r["n_items"]
        body.append([judge, *values, n])
    note = system_note(rows)
    return [f"## {dataset}: {aspect}", "",
            *table(["judge", *head, "n"], "l" + "r" * (len(head) + 1), body),
            "", *([note, ""] if note else [])]


def _set_aside(expansion: Expansion, tables: Tables, positions: Positions,
               scores: io.BufferedWriter | None, parquet: io.BufferedWriter | None = None
               ) -> list[dict[str, Any]]:
    """The reports' work for the other core: scores.csv and scores.parquet written (from their
    start: a child that died part-way left a part), reliability.csv's rows returned."""
    for file, write in ((scores, scores_csv), (parquet, _parquet)):
        if file is not None:
            file.seek(0)
            file.truncate()
            write(tables, file)
            file.flush()
    return reliability_rows(expansion, tables.cells, positions)


def _parquet(tables: Tables, file: io.BufferedWriter) -> None:
    write_scores_parquet(tables.cells, metric_names(tables.cells), file)


def write_reports(out_dir: Path, expansion: Expansion, judgments: Iterable[Judgment],
                  manifest: Mapping[str, Any] | Callable[[Tables], Mapping[str, Any]],
                  notes: Sequence[str] = ()) -> Tables:
    """Write every report file into `out_dir` as one set (`report_set`): a reader sees the old
    set or the new one.

    Args:
        out_dir, expansion: the report folder and the job's tasks.
        judgments: every judgment, read once.
        manifest: the manifest, or a function making it from the tables (counts known only
            after the pass).
        notes: lines added to report.md.

    Returns:
        The gathered tables.

    Raises:
        ReportError: The reports could not be written.
    """
    run_id = new_run_id()
    with report_set(out_dir, run_id) as stage:
        return _write_set(stage, expansion, judgments, manifest, notes, run_id)


def _write_set(out_dir: Path, expansion: Expansion, judgments: Iterable[Judgment],
               manifest: Mapping[str, Any] | Callable[[Tables], Mapping[str, Any]],
               notes: Sequence[str], run_id: str) -> Tables:
    battles = Battles(expansion)
    positions = Positions(expansion)
    rows = ItemRows()
    with atomic_file(out_dir / "judgments.jsonl") as jsonl:
        tables = collect(expansion, rows.watch(battles.watch(positions.watch(judgments))),
                         jsonl, expansion.job.juries)
    # scores.csv, scores.parquet and reliability.csv's rows on the other core (about half the
    # reports' time) while the others are made here
    with contextlib.ExitStack() as files:
        scores = (files.enter_context(atomic_file(out_dir / "scores.csv"))
                  if expansion.job.scores_csv else None)
        parquet = files.enter_context(atomic_file(out_dir / "scores.parquet"))
        reliable = files.enter_context(ForkedResult(
            lambda: _set_aside(expansion, tables, positions, scores, parquet),
            name="the reports' child (scores.csv, scores.parquet, reliability rows)"))
        series = judge_rows(expansion, tables)
        corr = correlations(expansion, tables, series)  # one Resamples for the set
        write_atomic(out_dir / "correlations.csv", csv_bytes(CORRELATION_COLUMNS, corr))
        summ = summary(tables)
        write_atomic(out_dir / "summary.csv", csv_bytes(SUMMARY_COLUMNS, summ))
        tables.headline = headline(expansion.job.levels, expansion.job.methods, corr, summ,
                                   juries=[j.name for j in expansion.job.juries])
        battle_rows = battles.rows()
        ranking = rank_rows(battle_rows, n_boot=expansion.job.bootstrap, seed=expansion.job.seed)
        tables.headline = replace(tables.headline, battles=battle_lines(battle_rows, ranking))
        board = leaderboard(tables) if expansion.job.leaderboard else None
        if callable(manifest):
            manifest = manifest(tables)
        manifest = {"run_id": run_id, **manifest,
                    "provenance": tables.provenance.as_dict(expansion.job)}
        page = page_data(expansion, series, corr, summ, battle_rows, board, manifest, rows,
                         ranking=ranking)
        reliability = reliable.result()
    # the length and position rows only exist now (the child made them): their warnings join
    # the headline's, printed after the table
    tables.headline = replace(tables.headline, warnings=[
        *bias_warnings(reliability), *tables.headline.warnings])
    write_atomic(out_dir / "report.md", (_markdown(expansion, corr, summ, notes)
                                         + battle_markdown(battle_rows)
                                         + ranking_markdown(ranking)
                                         + reliability_markdown(reliability)).encode())
    write_atomic(out_dir / "reliability.csv", csv_bytes(RELIABILITY_COLUMNS, reliability))
    if battles.enabled:
        write_atomic(out_dir / "battle.csv", csv_bytes(BATTLE_COLUMNS, battle_rows))
        write_atomic(out_dir / "ranking.csv", csv_bytes(RANKING_COLUMNS, ranking))
    if board is not None:
        write_atomic(out_dir / "leaderboard.csv", csv_bytes(*board))
    page["reliability"] = reliability_page(expansion, reliability)  # now that the child made it
    write_atomic(out_dir / "report.html", render(page))
    write_atomic(out_dir / "manifest.json",
                 orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return tables
