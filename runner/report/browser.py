"""The item browser's rows: chosen while the judgments stream by, with the prompt sent.

A study of ten million judgments cannot embed every row (and its prompt) in a page that opens
in seconds, so `ItemRows` never holds more than `cap` rows (2,000: ~10 MB at most, whatever
the study's size). While at most `cap` judgments have gone by it keeps them all, and the page
shows every one, as a small study expects. Past that it keeps three bounded pools, all from
one seeded generator (the same rows for the same judgments in the same order):

- a uniform random sample of every judgment (reservoir sampling, `Reservoir`, `cap` // 2
  rows), which the page states as such ("1,000 of 10,000,000 judgments, drawn uniformly at
  random") and can show alone, so the browser's rows can be read as the study in small;
- the largest judge-human disagreements (a min-heap, `cap` // 4 rows);
- a uniform random sample of the failures (another reservoir, `cap` // 4 rows).

Rows keep their task's request body when the judgments carry it (`judge rescore`, `judge
report`); a run keeps its tasks without bodies, so the bodies of the kept rows are rebuilt
from the expansion, over the kept rows' groups only.
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

__all__ = ["ItemRows", "Reservoir", "Row", "prompt_text", "raw_text", "with_bodies"]

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
    grouped: bool = False  # the task listed the whole group (its members) in one prompt
    sample: int = 0  # the task's sample index (prompts with `samples` > 1 ask k times)

    @property
    def diff(self) -> float | None:
        if self.score is None or self.human is None:
            return None
        return abs(self.score - self.human)


def raw_text(raw: str | list[str] | None) -> str:
    """A judgment's raw answer as one text (the answers of a prompt with `samples` joined).

    Args:
        raw: the judgment's raw answer, or its samples' answers.

    Returns:
        The text shown; "" without an answer.
    """
    return raw if isinstance(raw, str) else "\n\n---\n\n".join(raw or [])


def _made(row_of: Row | Judgment) -> Row:
    return row_of if isinstance(row_of, Row) else _row(row_of)


def _row(j: Judgment) -> Row:
    t, it = j.task, j.item
    raw = raw_text(j.raw)
    return Row(dataset=t.dataset, item=it.item_id, system=it.system, aspect=t.aspect,
               judge=f"{t.model}/{t.prompt}", score=j.score, human=it.human.get(t.aspect),
               status=j.error["type"] if j.error else "ok",
               message=j.error["message"] if j.error else "", raw=(raw or "")[:RAW_CHARS],
               key=t.key, group=it.group, body=t.body, grouped=bool(t.members),
               sample=t.sample)


@dataclass(slots=True)
class Reservoir:
    """Which items of a stream a uniform random sample of `size` keeps, drawn as they go by
    (Vitter's Algorithm R: the n-th item replaces a random slot with chance size / n; Li's
    more complex Algorithm L was no faster here, 1.2-2.7 us a judgment either way).

    Invariant: after `seen` items, every one of them is in the sample with probability
    size / seen (all of them while seen <= size)."""

    size: int
    rng: random.Random
    seen: int = 0

    def offer(self) -> int | None:
        """One more item: the slot it takes (a new one, `seen` - 1, while the sample fills;
        else the slot it replaces), or None if the sample passes it by."""
        self.seen += 1
        if self.seen <= self.size:
            return self.seen - 1
        slot = int(self.rng.random() * self.seen)  # randrange: 5x slower
        return slot if slot < self.size else None


@dataclass(slots=True)
class ItemRows:
    """Keeps the rows the page embeds; see the module docstring for which.

    Invariants: `everything` holds a row per judgment while `seen` <= `cap`, then is empty
    for good; `sample`, `top` and `failures` hold at most `cap` rows together; a row may be
    in two pools (a sampled failure), never twice in one."""

    cap: int = 2000
    seed: int = 0
    seen: int = 0
    """Judgments gone by."""
    failed: int = 0
    """Of them, failures (an API failure, a refusal or an answer that did not parse)."""
    everything: list[Row] = field(default_factory=list)
    """All rows while there are at most `cap`; then emptied into the three pools."""
    sample: list[Row] = field(default_factory=list)
    """Reservoir sample of every judgment: `cap` // 2 rows."""
    top: list[tuple[float, int, Row]] = field(default_factory=list)
    """Min-heap of (|judge - human|, arrival, row): the largest disagreements."""
    failures: list[Row] = field(default_factory=list)
    """Reservoir sample of the failures: `cap` // 4 rows."""
    examples: dict[tuple[str, str, str, str, str], list[str]] = field(default_factory=dict)
    """(dataset, prompt, aspect, model, failure type) -> the first raw answers."""
    _rng: random.Random = field(default_factory=random.Random)
    _sampler: Reservoir = field(init=False)
    """Picks `sample`'s slots among every judgment offered to the pools."""
    _failure_sampler: Reservoir = field(init=False)
    """Picks `failures`' slots among the failures offered."""

    def __post_init__(self) -> None:
        self._rng.seed(self.seed)
        self._sampler = Reservoir(self.cap // 2, self._rng)
        self._failure_sampler = Reservoir(self.cap // 4, self._rng)

    def watch(self, judgments: Iterable[Judgment]) -> Iterator[Judgment]:
        """Pass the judgments through, keeping rows as they go by.

        Args:
            judgments: every judgment, read once.

        Yields:
            The same judgments.
        """
        for j in judgments:
            self.add(j)
            yield j

    def add(self, j: Judgment) -> None:
        """Count one judgment, and keep its row if a pool wants it.

        Args:
            j: one judgment.
        """
        self.seen += 1
        error = j.error
        if error is not None:
            self.failed += 1
            t, kind = j.task, error["type"]
            got = self.examples.setdefault((t.dataset, t.prompt, t.aspect, t.model, kind), [])
            if len(got) < EXAMPLES:
                got.append(raw_text(j.raw)[:600] or error["message"])
        if self.seen <= self.cap:
            self.everything.append(_row(j))
            return
        if self.everything:
            pending, self.everything = self.everything, []
            for r in pending:
                self._place(r.status, r.diff, r)
        human = j.item.human.get(j.task.aspect)
        diff = None if j.score is None or human is None else abs(j.score - human)
        self._place("ok" if error is None else error["type"], diff, j)

    def _place(self, status: str, diff: float | None, row_of: Row | Judgment) -> None:
        """Offer a row to the pools; a judgment's row is built only if one takes it (most
        judgments of a large study go by without a row)."""
        row = None
        if (slot := self._sampler.offer()) is not None:
            row = _made(row_of)
            if slot < len(self.sample):
                self.sample[slot] = row
            else:
                self.sample.append(row)
        if status != "ok":
            if (slot := self._failure_sampler.offer()) is not None:
                row = row or _made(row_of)
                if slot < len(self.failures):
                    self.failures[slot] = row
                else:
                    self.failures.append(row)
            return
        if diff is None:
            return
        if len(self.top) < self.cap - self.cap // 2 - self.cap // 4:
            heapq.heappush(self.top, (diff, self._sampler.seen, row or _made(row_of)))
        elif diff > self.top[0][0]:
            heapq.heapreplace(self.top, (diff, self._sampler.seen, row or _made(row_of)))

    def kept(self) -> list[tuple[Row, str]]:
        """The kept rows, each once, largest disagreement first, with why each was kept:
        "" while every row is kept, else the pools it is in ("random", "disagreement",
        "failure"), space-separated."""
        if not self.capped:
            rows = [(r, "") for r in self.everything]
        else:
            why: dict[int, tuple[Row, list[str]]] = {}  # by id: a row in two pools is one
            pools = (("random", self.sample), ("disagreement", [r for _, _, r in self.top]),
                     ("failure", self.failures))
            for reason, pool in pools:
                for r in pool:
                    why.setdefault(id(r), (r, []))[1].append(reason)
            rows = [(r, " ".join(reasons)) for r, reasons in why.values()]
        rows.sort(key=lambda rw: (-(rw[0].diff if rw[0].diff is not None else -1.0),
                                  rw[0].status == "ok"))
        return rows

    @property
    def capped(self) -> bool:
        """Whether more judgments went by than the page holds (the pools are in use)."""
        return self.seen > self.cap

    def counts(self) -> dict[str, int]:
        """What the page says of the kept rows: judgments seen and failed, the pools' sizes
        and the seed."""
        return {"seen": self.seen, "failed": self.failed, "cap": self.cap, "seed": self.seed,
                "sample": len(self.sample) if self.capped else 0, "disagreements": len(self.top),
                "failures": len(self.failures)}


def with_bodies(rows: list[Row], expansion: Expansion) -> list[Row]:
    """Fill in the request bodies a run did not keep, expanding only the rows' items (and the
    whole group of a row whose prompt listed its group).

    Args:
        rows: the browser's rows, some without a body.
        expansion: the job, to expand the rows' items again.

    Returns:
        The rows, each with its request body.
    """
    missing = [r for r in rows if not r.body]
    if not missing:
        return rows
    wanted = {(r.dataset, r.item) for r in missing if not r.grouped}
    groups = {(r.dataset, r.group) for r in missing if r.grouped}
    items = {name: [it for it in items
                    if (name, it.item_id) in wanted or (name, it.group) in groups]
             for name, items in expansion.items.items()}
    partial = dataclasses.replace(expansion, items=items)
    bodies = {t.key: t.body for t in partial.tasks()}
    return [r if r.body else dataclasses.replace(r, body=bodies.get(r.key, b"")) for r in rows]


def prompt_text(body: bytes) -> str:
    """The messages of a request body as the reader wants to see them: role, then content.

    Args:
        body: a request body (JSON); empty when not kept.

    Returns:
        Each message's role and content, then the request's other parameters.
    """
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
