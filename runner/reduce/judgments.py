"""Turn cached responses into judgments: one per task, parsed with the prompt's current parser.

This is the zero-call half of the pipeline: it reads only the cache, so `judge rescore` after a
parser change costs no API call. An answer that does not parse is a failure with its raw text,
never a score; a task with no cached answer is an `api` failure.
"""

from __future__ import annotations

import array
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from runner.data.datasets import Item
from runner.execute.stats import RunStats
from runner.execute.store.answers import Answer
from runner.execute.store.backend import CacheBackend, answers
from runner.expand import Expansion
from runner.expand_ahead import expanded
from runner.job.bill import Tokens
from runner.job.spec import PromptSpec
from runner.parse.parsers import (
    Choice,
    Combined,
    Failure,
    Scores,
    aspect_key,
    check_options,
    combine,
    get_parser,
)
from runner.tasks import Task, task_key

__all__ = ["CachedFirst", "ItemCursor", "Judgment", "choices", "judge"]

READ_BATCH = 128  # answers read from the cache in one query
MEMO_TEXT = 256  # answers up to this long are parsed once per distinct text
MEMO_SIZE = 200_000
LOOK_AHEAD = 64  # items an ItemCursor looks ahead before it asks the expansion's index
ParseFunc = Callable[[Choice, Mapping[str, Any]], "Scores | Failure"]
NOT_CACHED = ("no cached answer: the task was not run yet, failed, or was left out by "
              "--offline/--budget/Ctrl-C; `judge run` calls it")
UNREADABLE = ("cached answer unreadable ({why}): rerun with `judge run --refresh-damaged` to ask "
              "again")


class Judgment(NamedTuple):
    """One task's outcome, ready for the reports (a NamedTuple for the reason Task is one:
    made once a task, in a tenth of a frozen dataclass's time)."""

    task: Task
    item: Item
    score: float | None
    """The score for this task's aspect (mean over parsed samples), None on failure."""
    values: Mapping[str, float]
    """Everything the parser read (several aspects for a form, outputs for a block list)."""
    raw: str | list[str] | None
    error: Mapping[str, str] | None
    """{"type": "api" | "parse" | "refusal", "message": ...} or None."""
    cached: bool
    usage: Mapping[str, Any] | orjson.Fragment | None
    """The response's usage (Answer.usage: as its JSON text when a reader child read it, which
    the judgment line embeds as it is)."""
    n_parsed: int = 0
    n_failed: int = 0
    choice_scores: tuple[float | None, ...] = ()
    """With n > 1 choices in one answer: each choice's own score (None where it failed), in
    choice order, for self-consistency; empty for a single choice."""
    source: str | None = None
    """Where the answer came from: "api", "batch:<batch id>", "import:<file>"; None if none."""
    time: float | None = None
    """When the answer was stored (the cache record's `time`); None without an answer."""
    tokens: Tokens = Tokens()
    """The answer's tokens by kind, from its usage."""


def choices(response: Mapping[str, Any]) -> list[Choice]:
    """The choices of a chat-completions response as parser input.

    Args:
        response: the decoded response body.

    Returns:
        Each choice's text and logprobs, in order.
    """
    return [Choice(text=(c.get("message") or {}).get("content") or "",
                   logprobs=(c.get("logprobs") or {}).get("content"),
                   finish_reason=c.get("finish_reason")) for c in response.get("choices") or []]


def judge(expansion: Expansion, cache: CacheBackend, *, failures: Mapping[str, str] | None = None,
          fresh: frozenset[str] = frozenset(), tasks: Iterable[Task] | None = None,
          count: int | None = None, damaged: dict[str, str] | None = None) -> Iterator[Judgment]:
    """Parse every task's cached answer.

    Args:
        expansion: the job's tasks; cache: where their answers are read.
        failures: why a task has no answer (key -> message), from the run that just ended.
        fresh: the keys answered by this run rather than read from an earlier one.
        tasks: the expansion's tasks if the caller kept them (a run does), else expanded anew
            (by forked children for a large job, which this call starts: expand_ahead.expanded).
        count: how many tasks there are, if known (else counted: it decides how answers are
            read).
        damaged: filled with key -> message of each task whose cached record is damaged (its
            judgment is a failure saying so).

    Yields:
        One Judgment per task and aspect, in task order.
    """
    context = _Context(expansion, {p.name: p for p in expansion.job.prompts}, {},
                       failures or {}, fresh, {} if damaged is None else damaged)
    # a query per READ_BATCH tasks, not one a task; each task's Answer (what judging reads of
    # its record), read by a reader process for a large job (runner.execute.store.reader)
    if count is None:
        count = len(tasks) if isinstance(tasks, Sized) else expansion.count()
    reads = (expanded(cache, expansion, READ_BATCH, count) if tasks is None
             else answers(cache, tasks, task_key, READ_BATCH, count))
    return _judged(context, reads)


class ItemCursor:
    """Finds the items of tasks that come in data order (an item's tasks one after another,
    items in their data set's order) without the expansion's item index: the cursor's item,
    else the next one, else `Expansion.item` (which makes the index once). What it buys: a
    run's judging makes no (data set, item id) dict, ~100 bytes an item (bench/README.md,
    Memory)."""

    __slots__ = ("at", "dataset", "expansion", "listed")

    def __init__(self, expansion: Expansion) -> None:
        self.expansion, self.dataset, self.at = expansion, "", 0
        self.listed: Sequence[Item] = ()

    def item(self, dataset: str, item_id: str) -> Item:
        """The item, as `Expansion.item` finds it.

        Args:
            dataset, item_id: the data set's name and the item's id.

        Returns:
            The item.
        """
        if dataset != self.dataset:
            self.dataset, self.at = dataset, 0
            self.listed = self.expansion.items.get(dataset, ())
            if not isinstance(self.listed, list):  # a streamed data set: no positions
                self.listed = ()
        listed, at = self.listed, self.at
        if at < len(listed) and (it := listed[at]).item_id == item_id:
            return it
        for ahead in range(at + 1, min(at + 1 + LOOK_AHEAD, len(listed))):
            if (it := listed[ahead]).item_id == item_id:  # the next item, or one without tasks
                self.at = ahead
                return it
        return self.expansion.item(dataset, item_id)


def _judged(context: _Context, reads: Iterable[tuple[list[Task], Mapping[str, Answer]]]
            ) -> Iterator[Judgment]:
    item = context.cursor.item
    for batch, stored in reads:
        for task in batch:
            answer = stored.get(task.key)
            if task.members or answer is None:
                yield from context.judged(task, answer)
            else:  # the usual case, without the generator
                yield context.parsed(task, item(task.dataset, task.item_id), answer, None)


class CachedFirst:
    """A run's judgments of its tasks in order while their answers are cached, up to the first
    task without one. Iterating it reads and judges them as rescore does (no pool, no task
    log); then `uncached_onward` is None if every task was cached, else an iterator of that
    first task without an answer and every later one, for the pool and then `judge`, in
    order. Each cached task is counted in `stats` as the pool counts it: a cache hit, its key's
    hash in `hashes` for RunStats.settle_repeats. A run of a partly cached job loses nothing
    by it: the tasks judged here are not called, expanded or judged again."""

    def __init__(self, expansion: Expansion, cache: CacheBackend, stats: RunStats, *,
                 count: int, on_progress: Callable[[RunStats], None] = lambda s: None) -> None:
        self.expansion, self.stats, self.on_progress = expansion, stats, on_progress
        self.hashes: array.array[int] = array.array("q")
        self.uncached_onward: Iterator[Task] | None = None
        self._reads: Generator[tuple[list[Task], Mapping[str, Answer]], None, None]
        head = next(expansion.tasks(), None)
        if head is not None and not cache.has_many([head.key]):
            # A first run: nothing to read, so no reader is started (the forked expanders of
            # a 40k-call run took the second core from this process for ~0.3 s, to be killed)
            self.uncached_onward, self._reads = expansion.tasks(), _nothing()
            return
        # reading starts now (a large job's forked expanders: see expand_ahead.expanded)
        self._reads = expanded(cache, expansion, READ_BATCH, count)

    def __iter__(self) -> Iterator[Judgment]:
        expansion, stats, hashes = self.expansion, self.stats, self.hashes
        context = _Context(expansion, {p.name: p for p in expansion.job.prompts}, {}, {},
                           frozenset(), stats.failures)
        reads, done = self._reads, 0
        for batch, stored in reads:
            self.on_progress(stats)  # a batch at a time: ~0.6 us a task otherwise
            # the batch's tasks up to its first without an answer, counted at once
            cut = next((i for i, t in enumerate(batch) if t.key not in stored), len(batch))
            cached = batch[:cut] if cut < len(batch) else batch
            done += cut
            stats.cache_hits += cut
            hashes.extend([hash(task.key) for task in cached])
            yield from _judged(context, ((cached, stored),))
            if cut < len(batch):
                # from here on, with their bodies (those read ahead are expanded again)
                self.uncached_onward = expansion.tasks(done)
                reads.close()  # ends the reader, if any
                self.on_progress(stats)
                return
        self.on_progress(stats)


def _nothing() -> Generator[tuple[list[Task], Mapping[str, Answer]], None, None]:
    yield from ()


# What a short single-choice answer gives a task, by (prompt, aspect, group size), position,
# text and finish_reason: score, values, error, parsed and failed samples.
_Outcome = tuple[float | None, Mapping[str, float], Mapping[str, str] | None, int, int]


@dataclass(slots=True)
class _Context:
    """What judging every task of a job shares."""

    expansion: Expansion
    prompts: Mapping[str, PromptSpec]
    settings: dict[tuple[str, str, int], tuple[ParseFunc, dict[str, Any]]]
    """Parser and checked, merged options per (prompt, aspect, group size): built once each."""
    failures: Mapping[str, str]
    fresh: frozenset[str]
    damaged: dict[str, str] = field(default_factory=dict)
    """key -> message of each task whose record was damaged (filled as they are judged)."""
    memo: dict[tuple[tuple[str, str, int], str, str | None], Scores | Failure] = field(
        default_factory=dict)
    """Parsers are pure: a short answer seen before ("4 stars") is not parsed again."""
    outcomes: dict[tuple[tuple[str, str, int], int | None, str, str | None], _Outcome] = field(
        default_factory=dict)
    """Nor is what follows from it (combined, score, error) worked out again."""
    cursor: ItemCursor = field(init=False)

    def __post_init__(self) -> None:
        self.cursor = ItemCursor(self.expansion)

    def parse(self, at: tuple[str, str, int], func: ParseFunc, options: Mapping[str, Any],
              choice: Choice) -> Scores | Failure:
        if choice.logprobs is not None or len(choice.text) > MEMO_TEXT:
            return func(choice, options)
        key = (at, choice.text, choice.finish_reason)
        if (result := self.memo.get(key)) is None:
            result = func(choice, options)
            if len(self.memo) < MEMO_SIZE:
                self.memo[key] = result
        return result

    def judged(self, task: Task, answer: Answer | None) -> Iterator[Judgment]:
        """The judgments of one task: one, or one per output of a group."""
        members = task.members or (task.item_id,)
        for position, item_id in enumerate(members, 1):
            item = self.cursor.item(task.dataset, item_id)
            if answer is None:
                message = self.failures.get(task.key, NOT_CACHED)
                yield Judgment(task=task, item=item, score=None, values={}, raw=None,
                               error={"type": "api", "message": message}, cached=False,
                               usage=None)
                continue
            yield self.parsed(task, item, answer, position if task.members else None)

    def parsed(self, task: Task, item: Item, answer: Answer, position: int | None) -> Judgment:
        """The judgment of `task` (of its group's member at `position`) from its Answer."""
        at = (task.prompt, task.aspect, len(task.members))
        if at not in self.settings:
            prompt = self.prompts[task.prompt]
            self.settings[at] = (get_parser(prompt.parser).func,
                                 _checked(prompt, task.aspect, len(task.members)))
        if answer.damaged is not None:
            message = self.damaged[task.key] = UNREADABLE.format(why=answer.damaged)
            return Judgment(task=task, item=item, score=None, values={}, raw=None,
                            error={"type": "api", "message": message}, cached=True, usage=None)
        if answer.choices is None:  # one plain answer: memoised whole
            return self._plain(task, item, at, position, answer)
        choices_ = choices({"choices": answer.choices})
        results = [self.parse(at, *self.settings[at], c) for c in choices_]
        score, values, error, n_parsed, n_failed = _outcome(combine(results), task.aspect,
                                                            position)
        texts = [c.text for c in choices_]
        return Judgment(task=task, item=item, score=score, values=values,
                        raw=texts[0] if len(texts) == 1 else texts, error=error,
                        cached=task.key not in self.fresh, usage=answer.usage,
                        n_parsed=n_parsed, n_failed=n_failed,
                        choice_scores=_choice_scores(results, position, task.aspect),
                        source=answer.source, time=answer.time, tokens=answer.tokens)

    def _plain(self, task: Task, item: Item, at: tuple[str, str, int], position: int | None,
               answer: Answer) -> Judgment:
        """The judgment of one plain answer (one choice, no logprobs): its whole outcome
        remembered by prompt, aspect, group size, position, text and finish_reason."""
        text, finish = answer.text, answer.finish_reason
        key = (at, position, text, finish)
        if len(text) > MEMO_TEXT or (outcome := self.outcomes.get(key)) is None:
            results = [self.parse(at, *self.settings[at], Choice(text, None, finish))]
            outcome = _outcome(combine(results), task.aspect, position)
            if len(text) <= MEMO_TEXT and len(self.outcomes) < MEMO_SIZE:
                self.outcomes[key] = outcome
        score, values, error, n_parsed, n_failed = outcome
        return Judgment(task, item, score, values, text, error, task.key not in self.fresh,
                        answer.usage, n_parsed, n_failed, (), answer.source, answer.time,
                        answer.tokens)


def _outcome(combined: Combined, aspect: str, position: int | None) -> _Outcome:
    """The task's score (its aspect's, or its position's in a group), and why there is none."""
    score = _score(combined.values, aspect, position)
    error = None
    if combined.failure is not None:
        error = {"type": combined.failure.type, "message": combined.failure.message}
    elif score is None:
        error = {"type": "parse", "message": "the answer has no score for aspect "
                 f"{aspect!r} (found: {', '.join(sorted(combined.values)) or 'nothing'})"}
    return (score, combined.values, error, combined.n_parsed,
            combined.n_failed + combined.n_refused)


def _choice_scores(results: list[Scores | Failure], position: int | None,
                   aspect: str) -> tuple[float | None, ...]:
    """Each choice's score when an answer has several (see Judgment.choice_scores)."""
    if len(results) < 2:
        return ()
    return tuple(None if isinstance(r, Failure) else _score(r.values, aspect, position)
                 for r in results)


def parser_options(prompt: PromptSpec, aspect: str, n_members: int) -> dict[str, Any]:
    """The prompt's parser options for one aspect: "{{aspect}}" in a string option becomes the
    aspect (one multi-dimension answer read once per aspect), and a group's `count` of 0
    becomes the number of outputs listed.

    Args:
        prompt, aspect: the prompt that asked and the aspect read.
        n_members: the outputs a group prompt lists (0 for one output).

    Returns:
        The options passed to the prompt's parser.
    """
    merged = {**prompt.parser_options, **prompt.aspect_options.get(aspect, {})}
    options = {k: v.replace("{{aspect}}", aspect) if isinstance(v, str) else v
               for k, v in merged.items()}
    if n_members and not options.get("count") and "count" in get_parser(prompt.parser).options:
        options["count"] = n_members
    return options


def _checked(prompt: PromptSpec, aspect: str, n_members: int) -> dict[str, Any]:
    parser = get_parser(prompt.parser)
    options = parser_options(prompt, aspect, n_members)
    check_options(parser, options)
    return {**parser.options, **options}


def _score(values: Mapping[str, float], aspect: str, position: int | None) -> float | None:
    """The aspect's score in a parser's values, or the group member's at `position`."""
    if position is not None:
        return values.get(str(position))
    if "score" in values:
        return values["score"]
    return values.get(aspect_key(aspect), values.get(aspect))
