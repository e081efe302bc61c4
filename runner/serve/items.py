"""The item browser across runs: judgments of one or more kept runs, filtered on the server.

A run's judgments.jsonl holds every judgment (a ten-million-judgment study's is ~4 GB), so the
page is never sent all of them: each request streams the chosen runs' files once and keeps the
LIMIT matching rows of largest disagreement with the humans (a bounded heap), in memory
bounded whatever the files' size; the time is the files' (~5 s a million judgments, 2 cores
at load 10, an ad-hoc measurement; a row is made only for a judgment the heap keeps, which
took it from 7-12 s). The human scores come from the run's scores.csv (its parquet without it), the
request of one judgment from the job's expansion (runner.report.browser.with_bodies: a run
keeps its tasks without their bodies).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from runner.errors import ConfigError
from runner.reduce.jury import judge_name
from runner.report.browser import Row, prompt_text, raw_text, with_bodies
from runner.report.diff import score_rows
from runner.serve.desk import Desk, RunInfo

__all__ = ["FAILED", "LIMIT", "Filters", "find", "judgment"]

LIMIT = 200
"""Rows a page shows at most (the largest disagreements first)."""
FAILED = "failed"
"""The status filter's value for any failure (parse, refusal or API)."""


@dataclass(frozen=True, slots=True)
class Filters:
    """What the item browser keeps ("" = any)."""

    dataset: str = ""
    aspect: str = ""
    judge: str = ""
    status: str = ""
    """"ok", "parse", "refusal", "api", or FAILED (any of the three)."""
    disagree: float | None = None
    """Keep only judgments at least this far from the human score."""
    item: str = ""
    """One item's judgments (the rating page's --show-scores)."""

    @classmethod
    def of(cls, query: Mapping[str, str]) -> Filters:
        """The filters of a page's query string; ConfigError for a bad number.

        Args:
            query: the query string's fields.

        Returns:
            The filters.

        Raises:
            ConfigError: `disagree` is not a number.
        """
        text = query.get("disagree", "").strip()
        try:
            disagree = float(text) if text else None
        except ValueError:
            raise ConfigError(f"disagree={text!r}: give a number (the least |judge - human| "
                              "to show), or leave it empty") from None
        dataset, aspect, judge, status = (query.get(k, "").strip()
                                          for k in ("dataset", "aspect", "judge", "status"))
        return cls(dataset, aspect, judge, status, disagree)

    def keeps(self, line: Mapping[str, Any], diff: float | None) -> bool:
        """Whether a judgments.jsonl line (with its disagreement) passes.

        Args:
            line, diff: a judgments.jsonl line and its |judge - human| (None without both).

        Returns:
            True when the line is shown.
        """
        status = _status(line)
        return ((not self.dataset or line["dataset"] == self.dataset)
                and (not self.item or line["item_id"] == self.item)
                and (not self.aspect or line["aspect"] == self.aspect)
                and (not self.judge or _judge(line) == self.judge)
                and (not self.status or status == self.status
                     or (self.status == FAILED and status != "ok"))
                and (self.disagree is None or (diff is not None and diff >= self.disagree)))


def _judge(line: Mapping[str, Any]) -> str:
    return judge_name(line["model"], line["prompt"])


def _status(line: Mapping[str, Any]) -> str:
    """A judgments.jsonl line's status: its error's type, or "ok"."""
    return line["error"]["type"] if line.get("error") else "ok"


def _humans(run: Path) -> dict[tuple[str, str, str], float]:
    """(dataset, item, aspect) -> the human score, from the run's scores file."""
    return {(r["dataset"], r["item_id"], r["aspect"]): r["human_score"]
            for r in score_rows(run / "scores.csv", run / "scores.parquet")
            if r["human_score"] is not None}


def _lines(run: Path) -> Iterator[dict[str, Any]]:
    path = run / "judgments.jsonl"
    if not path.is_file():
        raise ConfigError(f"{path}: missing; this run kept no judgments")
    with path.open("rb") as f:
        for line in f:
            yield orjson.loads(line)


def find(runs: list[RunInfo], filters: Filters) -> list[dict[str, Any]]:
    """The LIMIT judgments of `runs` that pass `filters`, largest disagreement first.

    Args:
        runs, filters: the kept runs to read and what to keep.

    Returns:
        Rows: run, dataset, item, system, aspect, judge, score, human, diff, status, key.
    """
    kept: list[tuple[float, int, dict[str, Any]]] = []
    n = 0
    for run in runs:
        humans = _humans(run.path)
        for line in _lines(run.path):
            human = humans.get((line["dataset"], line["item_id"], line["aspect"]))
            score = line.get("score")
            diff = None if score is None or human is None else abs(score - human)
            if not filters.keeps(line, diff):
                continue
            n += 1  # arrival order breaks ties: the rows come out in file order
            rank = -1.0 if diff is None else diff
            if len(kept) == LIMIT and (rank, -n) <= kept[0][:2]:
                continue  # the row is made only for a judgment the heap keeps
            entry = (rank, -n, _row(run.id, line, human, diff))
            if len(kept) < LIMIT:
                heapq.heappush(kept, entry)
            else:
                heapq.heapreplace(kept, entry)
    return [row for _, _, row in sorted(kept, reverse=True)]


def _row(run: str, line: Mapping[str, Any], human: float | None,
         diff: float | None) -> dict[str, Any]:
    return {"run": run, "dataset": line["dataset"], "item": line["item_id"],
            "system": line["system"], "aspect": line["aspect"], "judge": _judge(line),
            "score": line.get("score"), "human": human, "diff": diff,
            "status": _status(line), "key": line["key"]}


def judgment(desk: Desk, job: str, run: str, key: str) -> dict[str, Any]:
    """One judgment whole: the request sent (rebuilt from the job's data) and the answer.

    Args:
        desk, job, run: the desk, the job's name and the kept run's id.
        key: the judgment's cache key.

    Returns:
        The judgment's line of judgments.jsonl, with `request` (the messages as text) and
        `answer` (the raw answer, whole).

    Raises:
        ConfigError: no such judgment in the run.
    """
    info = desk.run(job, run)
    line = next((x for x in _lines(info.path) if x["key"] == key), None)
    if line is None:
        raise ConfigError(f"{info.path / 'judgments.jsonl'}: no judgment {key}")
    row = Row(dataset=line["dataset"], item=line["item_id"], system=line["system"],
              aspect=line["aspect"], judge=_judge(line), score=line.get("score"), human=None,
              status="", message="", raw="", key=key, group=line["group"], body=b"",
              grouped=True, sample=line.get("sample", 0))  # grouped: the whole group expanded
    body = with_bodies([row], desk.selection(job, info).expansion)[0].body
    return {**line, "request": prompt_text(body) or "(not rebuilt: the job's data changed)",
            "answer": raw_text(line.get("raw"))}
