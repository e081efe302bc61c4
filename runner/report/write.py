"""Write a run's reports into runs/<job>/, each atomically (temp file + rename).

- judgments.jsonl: one line per task (score, raw answer, error, cached, usage).
- scores.csv: one row per item x prompt x aspect x model: judge score, human score, metrics.
- correlations.csv: judge (LLM judges `model/prompt`, every metric column, `iaa`) against
  human at sample, dataset and system level, per subset, with bootstrap CIs.
- summary.csv: per data set x prompt x aspect x model: n, mean, std, failures by type.
- report.md: the correlation tables, judges as rows, failure counts, and any battles.
- battle.csv (a prompt with order = "both"): per judge and model pair, wins, ties and
  inconsistent verdicts over the two orders (runner.reduce.battle); ranking.csv beside it:
  a Bradley-Terry ranking of the systems with bootstrap CIs (runner.reduce.ranking).
- reliability.csv: agreement, self-consistency, position and length bias
  (runner.report.reliability).
- report.html: one self-contained page with plots and an item browser (runner.report.html).
- manifest.json: job sha256, versions, times, counts, usage, estimated cost.

Each set is written whole or not at all (runner.report.folder).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from runner.data.datasets import Item
from runner.data.seen import Seen, key64
from runner.errors import ConfigError
from runner.execute.local import LOCAL_MODELS
from runner.expand import Expansion
from runner.job.spec import Job, JurySpec
from runner.parse.parsers import get_parser
from runner.reduce.battle import BATTLE_COLUMNS, Battles, battle_markdown
from runner.reduce.correlate import Correlation, Row, compare, correlate
from runner.reduce.judgments import Judgment
from runner.reduce.jury import judge_name, verdicts
from runner.reduce.ranking import RANKING_COLUMNS, rank_rows, ranking_markdown
from runner.reduce.reliability import Positions
from runner.report.aside import ForkedResult
from runner.report.browser import ItemRows
from runner.report.folder import atomic_file, new_run_id, report_set, write_atomic
from runner.report.headline import Headline, headline, system_note
from runner.report.html import render
from runner.report.pagedata import page_data, with_reliability
from runner.report.provenance import Provenance
from runner.report.reliability import (
    RELIABILITY_COLUMNS,
    reliability_markdown,
    reliability_rows,
)

__all__ = ["Tables", "atomic_file", "collect", "comparison", "correlations", "judge_rows",
           "write_atomic", "write_reports"]



CORRELATION_COLUMNS = ["dataset", "aspect", "judge", "level", "method", "subset", "value",
                       "n_groups", "n_items", "ci_low", "ci_high", "n_systems"]
SUMMARY_COLUMNS = ["dataset", "prompt", "aspect", "model", "n", "scored", "mean", "std",
                   "parse_failures", "refusals", "api_failures"]


@dataclass(slots=True)
class _Cell:
    """Samples of one item x prompt x aspect x model."""

    item: Item
    scores: list[float] | tuple[()] = field(default_factory=list)
    """The samples' scores while `collect` gathers them; () once settled (only their mean is
    read afterwards, and a job's cells are most of what a run holds)."""
    errors: tuple[str, ...] = ()
    """Each failed sample's error type (most cells have none: no object of their own)."""
    score: float | None = None
    """The mean of `scores` (None if none), set by `collect` once they are all in: every
    report reads it, several times."""

    def settle(self) -> None:
        s = self.scores
        # fmean of one value is that value as a float: the same bits, without the call
        self.score = None if not s else float(s[0]) if len(s) == 1 else statistics.fmean(s)
        self.scores = ()


@dataclass(slots=True)
class Tables:
    """What the reports are built from, gathered in one pass over the judgments."""

    cells: dict[tuple[str, str, str, str, str], _Cell] = field(default_factory=dict)
    """(dataset, item_id, prompt, aspect, model) -> samples."""
    judgments: int = 0
    tasks: int = 0
    """Tasks judged (a group task yields one judgment per output, and counts once)."""
    distinct: int = 0
    """Distinct requests among them (two tasks with one cache key make one request)."""
    missing: list[str] = field(default_factory=list)
    """Keys of the tasks that have no cached answer."""
    seen: Seen = field(default_factory=Seen)
    """The keys judged so far, by their first 64 bits (~12 bytes a task; see Seen)."""
    provenance: Provenance = field(default_factory=Provenance)
    """Where the distinct answers came from, their tokens and times (manifest.json)."""
    headline: Headline = field(default_factory=Headline)
    """What the command prints last (set once the correlations are made)."""


def _judgment_line(j: Judgment) -> bytes:
    t, it = j.task, j.item
    return orjson.dumps({
        "dataset": t.dataset, "item_id": it.item_id, "group": it.group, "system": it.system,
        "subset": it.subset, "prompt": t.prompt, "aspect": t.aspect, "model": t.model,
        "sample": t.sample, "key": t.key, "score": j.score, "values": j.values, "raw": j.raw,
        "error": j.error, "cached": j.cached, "usage": j.usage,
        "n_parsed": j.n_parsed, "n_failed": j.n_failed, "source": j.source}) + b"\n"


def collect(judgments: Iterable[Judgment], jsonl: io.BufferedIOBase,
            juries: Sequence[JurySpec] = ()) -> Tables:
    """Stream judgments to `jsonl` and gather the per-cell scores; then each jury's verdicts
    as cells of its own (prompt "", model = the jury's name: judge_name gives its name)."""
    tables = Tables()
    cells, seen, write, missing = tables.cells, tables.seen, jsonl.write, tables.missing
    provenance = tables.provenance
    judged = tasks = distinct = 0
    last = None
    for j in judgments:
        write(_judgment_line(j))
        t, score = j.task, j.score
        key = (t.dataset, j.item.item_id, t.prompt, t.aspect, t.model)
        if (cell := cells.get(key)) is None:
            cell = cells[key] = _Cell(j.item)
        if score is not None:
            cell.scores.append(score)  # type: ignore[union-attr]  # a list until settled
        if j.error is not None:
            cell.errors += (j.error["type"],)
        judged += 1
        if t is last:  # the next output of a group task
            continue
        last, tasks = t, tasks + 1
        if seen.add(key64(t.key)):
            distinct += 1
            if j.raw is None:
                missing.append(t.key)
            else:
                provenance.add(t.model, j.source, j.time, j.tokens)
    tables.judgments, tables.tasks, tables.distinct = judged, tasks, distinct
    for cell in cells.values():
        cell.settle()
    _add_juries(cells, juries)
    return tables


def _add_juries(cells: dict[tuple[str, str, str, str, str], _Cell],
                juries: Sequence[JurySpec]) -> None:
    if not juries:
        return
    scores = {key: cell.score for key, cell in cells.items()}
    items = {(key[0], key[1]): cell.item for key, cell in cells.items()}
    for jury in juries:
        for (dataset, item_id, aspect), score in verdicts(jury, scores).items():
            cells[dataset, item_id, "", aspect, jury.name] = _Cell(
                items[dataset, item_id], (), (), score)


def _metrics(item: Item, aspect: str) -> dict[str, float]:
    return {**item.metrics.get("*", {}), **item.metrics.get(aspect, {})}


def _scores_csv(tables: Tables, binary: io.BufferedWriter) -> None:
    metric_names = sorted({m for (_, _, _, aspect, _), c in tables.cells.items()
                           if c.item.metrics for m in _metrics(c.item, aspect)})
    out = io.TextIOWrapper(binary, encoding="utf-8", newline="")
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["dataset", "item_id", "group", "system", "subset", "prompt", "aspect", "model",
                "judge_score", "human_score", *metric_names])
    for (dataset, item_id, prompt, aspect, model), cell in tables.cells.items():
        it = cell.item
        row = [dataset, item_id, it.group, it.system, it.subset, prompt, aspect, model,
               _fmt(cell.score), _fmt(it.human.get(aspect))]
        if metric_names:
            metrics = _metrics(it, aspect)
            row += [_fmt(metrics.get(m)) for m in metric_names]
        w.writerow(row)
    out.flush()
    out.detach()  # the caller's file stays open


def _fmt(value: float | None) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else repr(value)


def judge_rows(expansion: Expansion, tables: Tables) -> dict[tuple[str, str], dict[str, list[Row]]]:
    """(dataset, aspect) -> judge -> reducer rows (judge score against the human score), for
    items with a human score: the LLM judges (`model/prompt`) in the cells' order, then each
    metric column and `iaa` (annotator 2 against annotator 1 where a data set released both)
    in the items' order. Rows are built in one pass over the cells (~1 us a cell)."""
    out: dict[tuple[str, str], dict[str, list[Row]]] = {}
    names: dict[tuple[str, str], str] = {}
    for (dataset, _, prompt, aspect, model), cell in tables.cells.items():
        it = cell.item
        if (human := it.human.get(aspect)) is None:
            continue
        if (judges := out.get((dataset, aspect))) is None:
            judges = out[dataset, aspect] = {}
        if (name := names.get((model, prompt))) is None:
            name = names[model, prompt] = judge_name(model, prompt)
        if (rows := judges.get(name)) is None:
            rows = judges[name] = []
        rows.append(Row(it.group, it.system, it.subset, cell.score, human))  # positionally
    for (dataset, aspect), judges in out.items():
        lower = expansion.lower_is_better.get(dataset, frozenset())
        for it in expansion.items[dataset]:
            if aspect not in it.human or not (it.metrics or it.annotators):
                continue
            human = it.human[aspect]
            for name, value in _metrics(it, aspect).items():
                judges.setdefault(name, []).append(Row(
                    it.group, it.system, it.subset, -value if name in lower else value, human))
            votes = it.annotators.get(aspect, ())
            if len(votes) >= 2:
                judges.setdefault("iaa", []).append(Row(it.group, it.system, it.subset,
                                                        votes[1], votes[0]))
    return out


def correlations(expansion: Expansion, tables: Tables,
                 series: Mapping[tuple[str, str], Mapping[str, list[Row]]] | None = None
                 ) -> list[dict[str, Any]]:
    """Every judge against human, per data set and aspect, as correlations.csv rows.
    `series`: judge_rows(expansion, tables) if the caller has it already."""
    job, rows = expansion.job, []
    series = judge_rows(expansion, tables) if series is None else series
    for (dataset, aspect), judges in series.items():
        for judge, data in judges.items():
            for c in correlate(data, policy=job.policy, levels=job.levels, methods=job.methods,
                               n_boot=job.bootstrap, seed=job.seed):
                rows.append({"dataset": dataset, "aspect": aspect, "judge": judge,
                             **_correlation(c)})
    return rows


def _correlation(c: Correlation) -> dict[str, Any]:
    return {"level": c.level, "method": c.method, "subset": c.subset, "value": c.value,
            "n_groups": c.n_groups, "n_items": c.n_items, "ci_low": c.ci_low,
            "ci_high": c.ci_high, "n_systems": c.n_systems}


def summary(tables: Tables) -> list[dict[str, Any]]:
    """summary.csv rows: per data set x prompt x aspect x model."""
    groups: dict[tuple[str, str, str, str], list[_Cell]] = defaultdict(list)
    for (dataset, _, prompt, aspect, model), cell in tables.cells.items():
        groups[dataset, prompt, aspect, model].append(cell)
    rows = []
    for (dataset, prompt, aspect, model), cells in groups.items():
        scores = [s for c in cells if (s := c.score) is not None]
        errors = [e for c in cells for e in c.errors]
        rows.append({"dataset": dataset, "prompt": prompt, "aspect": aspect, "model": model,
                     "n": len(cells), "scored": len(scores),
                     "mean": statistics.fmean(scores) if scores else None,
                     "std": statistics.stdev(scores) if len(scores) > 1 else None,
                     "parse_failures": errors.count("parse"), "refusals": errors.count("refusal"),
                     "api_failures": errors.count("api")})
    return rows


def leaderboard(tables: Tables) -> tuple[list[str], list[dict[str, Any]]]:
    """Per judge and judged system: n items, items failed, each aspect's mean, then the mean
    of each automatic metric the items carry (Item.metrics["*"], e.g. a generation stage's).

    An item any of whose aspects has no score is counted in `failed` and left out of every
    aspect mean (the Korean chat study's rule), so those columns average the same items. An
    item's aspects are those it has tasks for (per-category aspects: only its category's).
    Metric means cover every item of the system that has the metric.
    """
    per_item: dict[tuple[str, str, str], dict[str, float | None]] = defaultdict(dict)
    items: dict[tuple[str, str, str], Item] = {}
    aspects: list[str] = []
    for (dataset, item_id, prompt, aspect, model), cell in tables.cells.items():
        judge = judge_name(model, prompt)
        per_item[dataset, judge, item_id][aspect] = cell.score
        items[dataset, judge, item_id] = cell.item
        if aspect not in aspects:
            aspects.append(aspect)
    board: dict[tuple[str, str], list[tuple[str, str, str]]] = defaultdict(list)
    for key in per_item:
        board[key[1], items[key].system].append(key)
    metric_names = sorted({m for it in items.values() for m in it.metrics.get("*", {})})
    rows = []
    for (judge, system), keys in board.items():
        complete = [per_item[k] for k in keys if None not in per_item[k].values()]
        row: dict[str, Any] = {"judge": judge, "model": system, "n": len(keys),
                               "failed": len(keys) - len(complete)}
        for a in aspects:
            values = [v for s in complete if (v := s.get(a)) is not None]
            row[a] = round(statistics.fmean(values), 4) if values else None
        for m in metric_names:
            values = [v for k in keys if (v := items[k].metrics.get("*", {}).get(m)) is not None]
            row[m] = round(statistics.fmean(values), 4) if values else None
        rows.append(row)
    columns = ["n", "failed", *aspects, *metric_names]
    if len({r["judge"] for r in rows}) == 1:  # one judge: the study's own layout
        for r in rows:
            del r["judge"]
        return ["model", *columns], rows
    return ["judge", "model", *columns], rows


COMPARE_COLUMNS = ["dataset", "aspect", "a", "b", "level", "method", "subset", "value_a",
                   "value_b", "diff", "ci_low", "ci_high", "p_value", "n_groups"]


def comparison(expansion: Expansion, series: Mapping[tuple[str, str], dict[str, list[Row]]],
               judges: tuple[str, str]) -> list[dict[str, Any]]:
    """compare.csv's rows (COMPARE_COLUMNS): judge A against judge B, paired bootstrap, per data
    set and aspect, over `series` (judge_rows of the collected tables)."""
    job, rows = expansion.job, []
    levels = [lvl for lvl in job.levels if lvl != "system"] or ["sample", "dataset"]
    for (dataset, aspect), by_judge in series.items():
        missing = [j for j in judges if j not in by_judge]
        if missing:
            raise ConfigError(f"{job.path}: no judge {missing[0]!r} for {dataset}/{aspect}; "
                              f"judges there: {', '.join(sorted(by_judge))}")
        for c in compare(by_judge[judges[0]], by_judge[judges[1]], policy=job.policy,
                         levels=levels, methods=job.methods, n_boot=job.bootstrap, seed=job.seed):
            rows.append({"dataset": dataset, "aspect": aspect, "a": judges[0], "b": judges[1],
                         "level": c.level, "method": c.method, "subset": c.subset,
                         "value_a": c.judge_a, "value_b": c.judge_b, "diff": c.diff,
                         "ci_low": c.ci_low, "ci_high": c.ci_high, "p_value": c.p_value,
                         "n_groups": c.n_groups})
    return rows


def _csv(columns: Sequence[str], rows: Iterable[Mapping[str, Any]]) -> bytes:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow({k: _fmt(v) if isinstance(v, float) or v is None else v
                    for k, v in row.items()})
    return out.getvalue().encode()


def _local_notes(job: Job) -> list[str]:
    """Say plainly what a small local judge is for."""
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
    lines += ["## Judge answers", "",
              "| dataset | prompt | aspect | model | n | scored | mean | parse failures "
              "| refusals | API failures |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for s in summ:
        mean = "" if s["mean"] is None else f"{s['mean']:.3f}"
        lines.append(f"| {s['dataset']} | {s['prompt']} | {s['aspect']} | {s['model']} | "
                     f"{s['n']} | {s['scored']} | {mean} | {s['parse_failures']} | "
                     f"{s['refusals']} | {s['api_failures']} |")
    return "\n".join(lines) + "\n"


def _table(dataset: str, aspect: str, rows: list[dict[str, Any]]) -> list[str]:
    columns = list(dict.fromkeys((r["level"], r["subset"], r["method"]) for r in rows))
    judges = list(dict.fromkeys(r["judge"] for r in rows))
    cell = {(r["judge"], r["level"], r["subset"], r["method"]): r for r in rows}
    head = " | ".join(f"{lvl} {m}" + ("" if sub == "all" else f" ({sub})")
                      for lvl, sub, m in columns)
    lines = [f"## {dataset}: {aspect}", "", f"| judge | {head} | n |",
             "|---|" + "---:|" * (len(columns) + 1)]
    for judge in judges:
        values = []
        n = 0
        for lvl, sub, m in columns:
            r = cell.get((judge, lvl, sub, m))
            values.append("" if r is None or r["value"] is None else f"{r['value']:.3f}")
            if r is not None and lvl == "dataset" and sub == "all":
                n = r["n_items"]
        lines.append(f"| {judge} | {' | '.join(values)} | {n} |")
    note = system_note(rows)
    return [*lines, "", *([note, ""] if note else [])]


def _set_aside(expansion: Expansion, tables: Tables, positions: Positions,
               scores: io.BufferedWriter) -> list[dict[str, Any]]:
    """The reports' work for the other core: scores.csv written to `scores` (from its start: a
    child that died part-way leaves a part, overwritten when the work is done again in place),
    and reliability.csv's rows, returned."""
    scores.seek(0)
    scores.truncate()
    _scores_csv(tables, scores)
    scores.flush()
    return reliability_rows(expansion, tables.cells, positions)


def write_reports(out_dir: Path, expansion: Expansion, judgments: Iterable[Judgment],
                  manifest: Mapping[str, Any] | Callable[[Tables], Mapping[str, Any]],
                  notes: Sequence[str] = ()) -> Tables:
    """Write every report file into `out_dir` as one set (`report_set`): a reader sees the old
    set or the new one. `manifest` may be built from the gathered tables (counts known only
    after the pass)."""
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
        tables = collect(rows.watch(battles.watch(positions.watch(judgments))), jsonl,
                         expansion.job.juries)
    # scores.csv and reliability.csv's rows on the other core (about half the reports' time)
    # while the others are made here
    with atomic_file(out_dir / "scores.csv") as scores, ForkedResult(
            lambda: _set_aside(expansion, tables, positions, scores)) as reliable:
        series = judge_rows(expansion, tables)
        corr = correlations(expansion, tables, series)
        write_atomic(out_dir / "correlations.csv", _csv(CORRELATION_COLUMNS, corr))
        summ = summary(tables)
        write_atomic(out_dir / "summary.csv", _csv(SUMMARY_COLUMNS, summ))
        tables.headline = headline(expansion.job.levels, expansion.job.methods, corr, summ,
                                   juries=[j.name for j in expansion.job.juries])
        battle_rows = battles.rows()
        ranking = rank_rows(battle_rows, n_boot=expansion.job.bootstrap, seed=expansion.job.seed)
        board = leaderboard(tables) if expansion.job.leaderboard else None
        if callable(manifest):
            manifest = manifest(tables)
        manifest = {"run_id": run_id, **manifest,
                    "provenance": tables.provenance.as_dict(expansion.job)}
        page = page_data(expansion, series, corr, summ, battle_rows, board, manifest, rows,
                         ranking=ranking)
        reliability = reliable.result()
    write_atomic(out_dir / "report.md", (_markdown(expansion, corr, summ, notes)
                                         + battle_markdown(battle_rows)
                                         + ranking_markdown(ranking)
                                         + reliability_markdown(reliability)).encode())
    write_atomic(out_dir / "reliability.csv", _csv(RELIABILITY_COLUMNS, reliability))
    if battles.enabled:
        write_atomic(out_dir / "battle.csv", _csv(BATTLE_COLUMNS, battle_rows))
        write_atomic(out_dir / "ranking.csv", _csv(RANKING_COLUMNS, ranking))
    if board is not None:
        write_atomic(out_dir / "leaderboard.csv", _csv(*board))
    write_atomic(out_dir / "report.html", render(with_reliability(page, expansion, reliability)))
    write_atomic(out_dir / "manifest.json",
                 orjson.dumps(manifest, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return tables
