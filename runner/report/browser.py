"""The item browser's rows: chosen while the judgments stream by, with the prompt sent.

A job of 100,000 judgments cannot embed every row (and its prompt) in one page that opens
fast, so `ItemRows` keeps at most `cap` rows: every row when the job is small, else the
largest judge-human disagreements, the failures and a seeded sample of the rest. The page
says which. Rows keep their task's request body when the judgments carry it (`judge
rescore`, `judge report`); a run keeps its tasks without bodies, so the bodies of the kept
rows are rebuilt from the expansion, over the kept rows' groups only.
"""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from runner.expand import Expansion
from runner.reduce.judgments import Judgment

__all__ = ["ItemRows", "Row"]

RAW_CHARS = 4000  # a raw answer is cut here in the page (judgments.jsonl has it whole)
EXAMPLES = 3  # example raw answers per (dataset, prompt, aspect, model, failure type)


@dataclass(slots=True)
class Row:
    """One judgment as the item browser shows it."""

    dataset: str
    item: str
    system: str
    aspect: str
    judge: str
    score: float | None
    human: float | None
    status: str  # "ok" | "parse" | "refusal" | "api"
    message: str
    raw: str
    key: str
    group: str
    body: bytes

    @property
    def diff(self) -> float | None:
        if self.score is None or self.human is None:
            return None
        return abs(self.score - self.human)


def _row(j: Judgment) -> Row:
    t, it = j.task, j.item
    raw = j.raw if isinstance(j.raw, str) or j.raw is None else "\n\n---\n\n".join(j.raw)
    return Row(dataset=t.dataset, item=it.item_id, system=it.system, aspect=t.aspect,
               judge=f"{t.model}/{t.prompt}", score=j.score, human=it.human.get(t.aspect),
               status=j.error["type"] if j.error else "ok",
               message=j.error["message"] if j.error else "", raw=(raw or "")[:RAW_CHARS],
               key=t.key, group=it.group, body=t.body)


@dataclass(slots=True)
class ItemRows:
    """Keeps the rows the page embeds; see the module docstring for which."""

    cap: int = 2000
    seed: int = 0
    seen: int = 0
    everything: list[Row] = field(default_factory=list)
    """All rows while there are at most `cap`; then emptied into the three pools."""
    top: list[tuple[float, int, Row]] = field(default_factory=list)
    """Min-heap of (|judge - human|, arrival, row): the largest disagreements."""
    failures: list[Row] = field(default_factory=list)
    sample: list[Row] = field(default_factory=list)
    """Reservoir sample of the scored rows."""
    examples: dict[tuple[str, str, str, str, str], list[str]] = field(default_factory=dict)
    """(dataset, prompt, aspect, model, failure type) -> the first raw answers."""
    _rng: random.Random = field(default_factory=random.Random)
    _pooled: int = 0
    """Rows pooled so far: the heap's tie-breaker (rows themselves do not compare)."""

    def watch(self, judgments: Iterable[Judgment]) -> Iterator[Judgment]:
        """Pass the judgments through, keeping rows as they go by."""
        self._rng.seed(self.seed)
        for j in judgments:
            self.add(j)
            yield j

    def add(self, j: Judgment) -> None:
        row = _row(j)
        self.seen += 1
        if row.status != "ok":
            t = j.task
            got = self.examples.setdefault((t.dataset, t.prompt, t.aspect, t.model, row.status),
                                           [])
            if len(got) < EXAMPLES:
                got.append(row.raw[:600] if row.raw else row.message)
        if self.seen <= self.cap:
            self.everything.append(row)
            return
        if self.everything:
            pending, self.everything = self.everything, []
            for r in pending:
                self._pool(r)
        self._pool(row)

    def _pool(self, row: Row) -> None:
        quarter = self.cap // 4
        if row.status != "ok":
            if len(self.failures) < quarter:
                self.failures.append(row)
            return
        self._pooled += 1
        diff = row.diff
        if diff is not None:
            entry = (diff, self._pooled, row)
            if len(self.top) < self.cap - 2 * quarter:
                heapq.heappush(self.top, entry)
            elif entry[:2] > self.top[0][:2]:
                heapq.heapreplace(self.top, entry)
        if len(self.sample) < quarter:
            self.sample.append(row)
        elif (i := self._rng.randrange(self._pooled)) < quarter:
            self.sample[i] = row

    def rows(self) -> list[Row]:
        """The kept rows, largest disagreement first, each once."""
        if self.everything or self.seen <= self.cap:
            kept = list(self.everything)
        else:
            kept = [r for _, _, r in self.top] + self.failures + self.sample
        unique = list({id(r): r for r in kept}.values())  # a row can be in two pools
        unique.sort(key=lambda r: (-(r.diff if r.diff is not None else -1.0), r.status == "ok"))
        return unique

    @property
    def capped(self) -> bool:
        return self.seen > self.cap


def with_bodies(rows: list[Row], expansion: Expansion) -> list[Row]:
    """Fill in the request bodies a run did not keep, expanding only the rows' groups."""
    missing = {(r.dataset, r.group) for r in rows if not r.body}
    if not missing:
        return rows
    items = {name: [it for it in items if (name, it.group) in missing]
             for name, items in expansion.items.items()}
    partial = dataclasses.replace(expansion, items=items)
    bodies = {t.key: t.body for t in partial.tasks()}
    return [r if r.body else dataclasses.replace(r, body=bodies.get(r.key, b"")) for r in rows]


def prompt_text(body: bytes) -> str:
    """The messages of a request body as the reader wants to see them: role, then content."""
    if not body:
        return ""
    request: dict[str, Any] = orjson.loads(body)
    parts = []
    for m in request.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list):
            content = "\n".join(str(c.get("text", "")) for c in content if isinstance(c, dict))
        parts.append(f"[{m.get('role', '?')}]\n{content}")
    params = {k: v for k, v in request.items() if k != "messages"}
    return "\n\n".join(parts) + "\n\n[parameters] " + orjson.dumps(
        params, option=orjson.OPT_SORT_KEYS).decode()
