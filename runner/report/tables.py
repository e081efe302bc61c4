"""The tables every report is built from, gathered in one pass over the judgments (`collect`
streams judgments.jsonl and fills a runner.reduce.cells.Cells, ~23 bytes a cell), and the
reports that read the cells directly: scores.csv, summary.csv, leaderboard.csv.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from runner.data.seen import Seen, key64
from runner.expand import Expansion
from runner.job.spec import JurySpec
from runner.reduce.cells import CellBuilder, Cells, grouped
from runner.reduce.judgments import Judgment
from runner.reduce.jury import judge_name
from runner.report.headline import Headline
from runner.report.provenance import Provenance

__all__ = ["Tables", "collect", "fmt", "leaderboard", "metric_names", "scores_csv", "summary"]


@dataclass(slots=True)
class Tables:
    """What the reports are built from, gathered in one pass over the judgments."""

    cells: Cells
    """One row per item x prompt x aspect x model (and per jury), in order of first
    appearance."""
    judgments: int = 0
    tasks: int = 0
    """Tasks judged (a group task yields one judgment per output, and counts once)."""
    distinct: int = 0
    """Distinct requests among them (two tasks with one cache key make one request)."""
    missing: list[str] = field(default_factory=list)
    """Keys of the tasks that have no cached answer."""
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
        "n_parsed": j.n_parsed, "n_failed": j.n_failed, "source": j.source},
        option=orjson.OPT_APPEND_NEWLINE)


ROWS_A_PART = 1 << 16
"""scores.csv's cells made into Python values this many at a time."""
LINES_A_WRITE = 1024
"""judgments.jsonl's lines joined into one write: a buffered file's write of each ~400-byte
line took ~1.1 us, a join and one write per 1,024 ~0.2 us (1M lines on this machine)."""


def collect(expansion: Expansion, judgments: Iterable[Judgment], jsonl: io.BufferedIOBase,
            juries: Sequence[JurySpec] = ()) -> Tables:
    """Stream judgments to `jsonl` and gather the cells; then each jury's verdicts as cells
    of its own (prompt "", model = the jury's name: judge_name gives its name).

    Args:
        expansion: the job's items and judges (the cells index them).
        judgments: every task's judgments, in task order.
        jsonl: where judgments.jsonl's lines go.
        juries: the job's juries.

    Returns:
        the tables, with the counts and provenance of the tasks.
    """
    builder = CellBuilder(expansion)
    # the keys judged so far, by their first 64 bits (~12 bytes a task; see Seen), dropped
    # with the pass: the reports after it need only the counts
    seen, provenance, add = Seen(), Provenance(), builder.add
    missing: list[str] = []
    judged = tasks = distinct = 0
    last = None
    lines: list[bytes] = []
    for j in judgments:
        lines.append(_judgment_line(j))
        if len(lines) == LINES_A_WRITE:
            jsonl.write(b"".join(lines))
            lines.clear()
        t = j.task
        add(t.dataset, j.item, (t.prompt, t.aspect, t.model), j.score,
            None if j.error is None else j.error["type"])
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
    jsonl.write(b"".join(lines))
    return Tables(builder.finish(juries), judgments=judged, tasks=tasks, distinct=distinct,
                  missing=missing, provenance=provenance)


def metric_names(cells: Cells) -> list[str]:
    """The metric columns of scores.csv: every metric of a cell's item for its aspect.

    Args:
        cells: the judged cells.

    Returns:
        The metric names, sorted.
    """
    with_metrics = np.array([bool(it.metrics) for it in cells.items], dtype=bool)
    if not with_metrics.any():
        return []
    aspects, aspect_of = cells.aspect_codes()
    keep = with_metrics[cells.item]
    pairs = np.unique(cells.item[keep].astype(np.int64) * len(aspects)
                      + aspect_of[cells.judge[keep]])
    at = [divmod(p, len(aspects)) for p in pairs.tolist()]
    return sorted({m for i, a in at for m in cells.items[i].aspect_metrics(aspects[a])})


def scores_csv(tables: Tables, binary: io.BufferedWriter) -> None:
    """scores.csv into `binary` (left open): a row per cell, in order.

    Each item's five label fields and each judge's three are made into CSV text once (by the
    csv module: its quoting) and a row joined from them and the two scores: 0.9-1.0 us a cell
    where a csv.writer row took 1.9-2.0 (500,000 cells, alternated, this machine), ~10 s less
    of a ten-million-cell study's report child. The same bytes: CSV fields are quoted each on
    its own, and a row of more than one field has no special case.

    Args:
        tables, binary: the gathered tables and the open file to write into.
    """
    cells = tables.cells
    names = metric_names(cells)
    out = io.TextIOWrapper(binary, encoding="utf-8", newline="")
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["dataset", "item_id", "group", "system", "subset", "prompt", "aspect", "model",
                "judge_score", "human_score", *names])
    items, judges, datasets = cells.items, cells.judges, cells.datasets
    dataset_of = cells.item_dataset.tolist()
    labels: dict[int, str] = {}  # item index -> its five fields as CSV text
    judge_text = [_csv_text(j) for j in judges]
    text = _ScoreText()
    for start in range(0, len(cells), ROWS_A_PART):  # not 3 lists of ~36 bytes a cell
        part = slice(start, start + ROWS_A_PART)
        lines = []
        for i, j, score in zip(cells.item[part].tolist(), cells.judge[part].tolist(),
                               cells.score[part].tolist(), strict=True):
            it = items[i]
            if (head := labels.get(i)) is None:
                head = labels[i] = _csv_text((datasets[dataset_of[i]], it.item_id, it.group,
                                              it.system, it.subset))
            aspect = judges[j][1]
            line = (f"{head},{judge_text[j]},{text(score)},"
                    f"{text(it.human.get(aspect))}")
            if names:
                metrics = it.aspect_metrics(aspect)
                line += "," + ",".join([fmt(metrics.get(m)) for m in names])  # never quoted
            lines.append(line + "\n")
        out.write("".join(lines))
        if len(labels) > ROWS_A_PART:  # cells come item by item: the last items' are kept
            labels.clear()
    out.flush()
    out.detach()  # the caller's file stays open


def _csv_text(fields: Sequence[object]) -> str:
    """Fields as one CSV row (the csv module's quoting, which quotes a field holding a
    character of the line end: it must be scores.csv's "\n"), without its line end."""
    line = io.StringIO()
    csv.writer(line, lineterminator="\n").writerow(fields)
    return line.getvalue()[:-1]


class _ScoreText:
    """fmt(value), remembered for the few values scores take (judges' and humans' scales)."""

    def __init__(self) -> None:
        self.known: dict[float, str] = {}

    def __call__(self, value: float | None) -> str:
        if type(value) is not float or not value:  # None, an int, 0.0 and -0.0: as they are
            return fmt(value)
        if (got := self.known.get(value)) is None:
            got = fmt(value)
            if len(self.known) < 4096 and value == value:  # NaN is never found again
                self.known[value] = got
        return got


def fmt(value: float | None) -> str:
    """A CSV cell: "" for None or NaN, else the value's repr (floats keep every bit).

    Args:
        value: a score or statistic.

    Returns:
        The cell's text.
    """
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else repr(value)


def summary(tables: Tables) -> list[dict[str, Any]]:
    """summary.csv rows: per data set x prompt x aspect x model.

    Args:
        tables: the gathered tables.

    Returns:
        The rows: tasks, scored ones, the mean, spread and most frequent score.
    """
    cells = tables.cells
    width = max(len(cells.judges), 1)
    keys, where = grouped(cells.dataset() * width + cells.judge,
                          len(cells.datasets) * width)
    rows = []
    for key, at in zip(keys, where, strict=True):
        prompt, aspect, model = cells.judges[key % width]
        scores = cells.score[at][cells.scored[at]].tolist()
        failed = cells.failures[at].sum(axis=0).tolist()
        top = Counter(scores).most_common(1)
        rows.append({"dataset": cells.datasets[key // width], "prompt": prompt,
                     "aspect": aspect, "model": model, "n": int(at.size), "scored": len(scores),
                     "mean": statistics.fmean(scores) if scores else None,
                     "std": statistics.stdev(scores) if len(scores) > 1 else None,
                     **dict(zip(("parse_failures", "refusals", "api_failures"), failed,
                                strict=True)),  # FAILURES' order
                     "top_score": top[0][0] if top else None,
                     "top_count": top[0][1] if top else 0})
    return rows


def leaderboard(tables: Tables) -> tuple[list[str], list[dict[str, Any]]]:
    """Per judge and judged system: n items, items failed, each aspect's mean, then the mean
    of each automatic metric the items carry (Item.metrics["*"], e.g. a generation stage's).

    An item any of whose aspects has no score is counted in `failed` and left out of every
    aspect mean (the Korean chat study's rule), so those columns average the same items. An
    item's aspects are those it has tasks for (per-category aspects: only its category's).
    Metric means cover every item of the system that has the metric.

    Args:
        tables: the gathered tables.

    Returns:
        The columns and the rows of leaderboard.csv.
    """
    cells = tables.cells
    per_item: dict[tuple[int, str, int], dict[str, float | None]] = defaultdict(dict)
    aspects: list[str] = []
    dataset_of = cells.item_dataset.tolist()
    for i, j, score, ok in zip(cells.item.tolist(), cells.judge.tolist(),
                               cells.score.tolist(), cells.scored.tolist(), strict=True):
        prompt, aspect, model = cells.judges[j]
        per_item[dataset_of[i], judge_name(model, prompt), i][aspect] = score if ok else None
        if aspect not in aspects:
            aspects.append(aspect)
    board: dict[tuple[str, str], list[tuple[int, str, int]]] = defaultdict(list)
    for key in per_item:
        board[key[1], cells.items[key[2]].system].append(key)
    metric_names = sorted({m for _, _, i in per_item for m in cells.items[i].metrics.get("*", {})})
    rows = []
    for (judge, system), keys in board.items():
        complete = [per_item[k] for k in keys if None not in per_item[k].values()]
        row: dict[str, Any] = {"judge": judge, "model": system, "n": len(keys),
                               "failed": len(keys) - len(complete)}
        for a in aspects:
            values = [v for s in complete if (v := s.get(a)) is not None]
            row[a] = round(statistics.fmean(values), 4) if values else None
        for m in metric_names:
            values = [v for k in keys
                      if (v := cells.items[k[2]].metrics.get("*", {}).get(m)) is not None]
            row[m] = round(statistics.fmean(values), 4) if values else None
        rows.append(row)
    columns = ["n", "failed", *aspects, *metric_names]
    if len({r["judge"] for r in rows}) == 1:  # one judge: the study's own layout
        for r in rows:
            del r["judge"]
        return ["model", *columns], rows
    return ["judge", "model", *columns], rows
