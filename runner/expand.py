"""Expand a job into tasks: (item x prompt x aspect x model x sample), streamed in a fixed order.

Each task carries the exact request body it sends and its cache key: the sha256 of the
canonical JSON (orjson, sorted keys) of the endpoint, the request body (model, messages and
every request parameter) and the sample index. The key never covers the API key, the parser,
timeouts, retries or concurrency: those do not change the answer.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import os
import random
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple, overload

import orjson

from runner.data import datasets
from runner.data.datasets import FieldMap, Item
from runner.errors import ConfigError, DataError
from runner.job.spec import PLACEHOLDER, GenerateSpec, Job, ModelSpec, PromptSpec, placeholders
from runner.parse import metrics

__all__ = ["Expansion", "Task", "cache_key", "estimate_cost", "groups_drawn", "new_task",
           "prepare", "render", "sample_ids", "task_key"]

# Rough prompt-token estimate (no tokenizer download needed offline); the limiter reconciles
# every reservation with the response's `usage`, so an estimate only shifts timing a little.
CHARS_PER_TOKEN = 4
DEFAULT_MAX_TOKENS = 256  # reservation when a request sets no max_tokens
_END = 1 << 62  # past any task's index
_PARSER_FIELDS = frozenset({"parser", "parser_options", "aspect_options"})  # not in any key
# Group mode's {{output_N}}: the N-th member's output (1-based), in the order of the request.
OUTPUT_N = re.compile(r"output_([1-9][0-9]*)")
# (anchor item, template values, group members, prompt, aspect, template): one request's parts;
# the values None where they were not joined (see Expansion._units).
_Unit = tuple[Item, dict[str, str] | None, tuple[str, ...], PromptSpec, str, str]

# USD per 1M tokens (input, output), public list prices of common models; a job overrides with
# [models.NAME] price = {input = .., output = ..}. Unknown models are estimated at 0 and flagged.
PRICES: Mapping[str, tuple[float, float]] = {
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-2024-05-13": (5.00, 15.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4.1-nano": (0.10, 0.40),
    "gpt-4-turbo": (10.00, 30.00),
    "gpt-4-0125-preview": (10.00, 30.00),
    "gpt-4": (30.00, 60.00),
    "gpt-3.5-turbo": (0.50, 1.50),
    "gpt-3.5-turbo-0125": (0.50, 1.50),
    "o3-mini": (1.10, 4.40),
    "o4-mini": (1.10, 4.40),
}


class Task(NamedTuple):
    """One request to send (or find in the cache).

    A NamedTuple, not a frozen dataclass: as immutable, but made in 0.35 us where a frozen
    dataclass's __init__ (an object.__setattr__ per field) took 3 us, and a cached 100k-task
    run makes a Task two or three times a task. Made by `new_task`, every field by name."""

    key: str
    dataset: str
    item_id: str
    prompt: str
    aspect: str
    model: str
    sample: int
    body: bytes
    """The JSON request body, exactly as sent."""
    prompt_tokens: int
    """Estimated prompt tokens."""
    max_tokens: int
    """Completion tokens reserved: max_tokens x n."""
    members: tuple[str, ...] = ()
    """Group mode: the item ids listed as Output 1..n (item_id is then the group)."""

    def without_body(self) -> Task:
        """This task without its request body, to keep many in memory."""
        return new_task(key=self.key, dataset=self.dataset, item_id=self.item_id,
                        prompt=self.prompt, aspect=self.aspect, model=self.model,
                        sample=self.sample, body=b"", prompt_tokens=self.prompt_tokens,
                        max_tokens=self.max_tokens, members=self.members)


_tuple_new = tuple.__new__


def new_task(*, key: str, dataset: str, item_id: str, prompt: str, aspect: str, model: str,
             sample: int, body: bytes, prompt_tokens: int, max_tokens: int,
             members: tuple[str, ...] = ()) -> Task:
    """The one way to make a Task: every field by name (Task's fields say what each holds).

    Args:
        key: the cache key (64 hex digits), or "" where the caller has none (skeleton).
        dataset, item_id, prompt, aspect, model, sample: which task it is.
        body: the JSON request body, exactly as sent (b"" where it is not kept).
        prompt_tokens: estimated prompt tokens; max_tokens: completion tokens reserved.
        members: group mode's item ids, listed as Output 1..n.

    Returns:
        The Task. As cheap as Task(...) with positional arguments (a NamedTuple's own __new__
        is this same tuple.__new__, and keywords to Task itself cost twice as much): 10M tasks
        in a large study are made here (bench figure in the commit that made it).
    """
    return _tuple_new(Task, (key, dataset, item_id, prompt, aspect, model, sample, body,
                             prompt_tokens, max_tokens, members))


def task_key(task: Task) -> str:
    """A task's cache key: the key function of the cache lookups and reads over tasks."""
    return task.key


@dataclass(frozen=True, slots=True)
class Expansion:
    """A job with its items loaded: ready to stream tasks, any number of times."""

    job: Job
    items: Mapping[str, Sequence[Item]]
    """data set name -> its items, in file order (after --limit)."""
    index: Mapping[tuple[str, str], Item]
    """(data set, item id) -> item."""
    lower_is_better: Mapping[str, frozenset[str]]
    """data set name -> metric names where lower is better (the reducer negates them)."""

    def __repr__(self) -> str:
        # Not the dataclass's: that one spells out every item (35 MB for 25k items).
        counts = ", ".join(f"{name!r}: {len(items)}" for name, items in self.items.items())
        return f"Expansion(job={self.job.name!r}, items={{{counts}}})"

    def prompts_for(self, dataset: str, per: str) -> list[PromptSpec]:
        return [p for p in self.job.prompts
                if p.per == per and (not p.datasets or dataset in p.datasets)]

    def judges(self, prompt: PromptSpec) -> list[ModelSpec]:
        """The models that judge with `prompt`: its own list, else every non-generator."""
        if prompt.models:
            return [m for m in self.job.models if m.name in prompt.models]
        generators = {name for g in self.job.generate for name in g.models}
        return [m for m in self.job.models if m.name not in generators]

    def _units(self, render: bool = True) -> Iterator[_Unit]:
        """(anchor item, template values, group members, prompt, aspect, template) in task
        order, for every (item or group) x prompt x aspect that has a template. `render`
        False: the values only where choosing the template reads them, else None (for
        callers that render few units or none: ~0.5 us a unit)."""
        names = [d.name for d in self.job.datasets] + [
            g.name for g in self.job.generate if g.name in self.items]
        for name in names:
            prompts = [(p, _chooser(p), render or bool(p.requires or p.when_empty))
                       for p in self.prompts_for(name, "item")]
            for item in self.items[name]:
                for prompt, choose, wanted in prompts:
                    values = _joined(prompt, item.fields) if wanted else None
                    for aspect in prompt.aspects:
                        if (template := choose(aspect, item.subset, values)) is not None:
                            yield item, values, (), prompt, aspect, template
            group_prompts = self.prompts_for(name, "group")
            for members in (self.groups(name) if group_prompts else []):
                for prompt in group_prompts:
                    yield from _group_units(members, prompt)

    def tasks(self, start: int = 0) -> Iterator[Task]:
        """Every judge task, in order: data set, item (then group), prompt, aspect, model,
        sample; from the `start`-th on (the ones before are not rendered)."""
        return self._spans(iter([(start, _END)]))

    def part(self, size: int, part: int, parts: int) -> Iterator[Task]:
        """Of tasks() cut in runs of `size`, the `part`-th run, then every `parts`-th after it
        (part 0 of 2: runs 0, 2, 4, ...), in order; the other runs are not rendered. The
        parts of one `size` and `parts` are each task once."""
        return self._spans((k * size, (k + 1) * size) for k in itertools.count(part, parts))

    def _spans(self, spans: Iterator[tuple[int, int]]) -> Iterator[Task]:
        """The tasks whose index (in tasks() order) falls in `spans`: increasing, disjoint
        [start, stop) ranges. Units outside every span are counted, not rendered."""
        judges = {p.name: self.judges(p) for p in self.job.prompts}
        frames = _Frames()
        start, stop = next(spans, (_END, _END))
        at = 0  # the index of the unit's first task
        for item, values, members, prompt, aspect, template in self._units(render=False):
            n = len(judges[prompt.name]) * prompt.samples
            while stop <= at:
                start, stop = next(spans, (_END, _END))
            if start == _END:
                return
            if start >= at + n:  # the unit ends before the span
                at += n
                continue
            made = _tasks(item, _joined(prompt, item.fields) if values is None else values,
                          members, prompt, aspect, template, judges[prompt.name], frames)
            for i, task in enumerate(made, at):
                while stop <= i:
                    start, stop = next(spans, (_END, _END))
                if i >= start:
                    yield task
            at += n

    def fingerprint(self) -> str:
        """A digest of everything that decides tasks()' keys and their order: the code that
        renders requests (this module's and the job spec's source, orjson's version), the
        prompts but for their parsers, the models, the generation stages, and every data
        set's items in order (id, group, subset, fields). Two expansions with one fingerprint
        have the same keys in the same order: runner.execute.store.keyindex relies on it. A parser
        change keeps the fingerprint (a rescore's usual reason)."""
        digest = hashlib.sha256(_code_digest())
        prompts = [[(f.name, getattr(p, f.name)) for f in dataclasses.fields(p)
                    if f.name not in _PARSER_FIELDS] for p in self.job.prompts]
        digest.update(repr((prompts, self.job.models, self.job.generate)).encode())
        for name, items in self.items.items():
            digest.update(orjson.dumps(name))
            stream = iter(items)  # a thousand at a time: never a copy of a large data set
            while chunk := [(it.item_id, it.group, it.subset, it.fields)
                            for it in islice(stream, 1000)]:
                digest.update(orjson.dumps(chunk, default=dict))  # fields not a dict: as one
        return digest.hexdigest()

    def skeleton(self, keys: Iterator[str] | None = None) -> Iterator[Task]:
        """Every judge task, in the order of tasks(), without rendering or hashing a request:
        key the next of `keys` (computed elsewhere; default ""), body b"" and token estimates
        0. The other fields are tasks()'s."""
        judges = {p.name: self.judges(p) for p in self.job.prompts}
        key = (keys if keys is not None else itertools.repeat("")).__next__
        for item, _, members, prompt, aspect, _ in self._units(render=False):
            item_id = item.group if members else item.item_id
            for model in judges[prompt.name]:
                for sample in range(prompt.samples):
                    yield new_task(key=key(), dataset=item.dataset, item_id=item_id,
                                   prompt=prompt.name, aspect=aspect, model=model.name,
                                   sample=sample, body=b"", prompt_tokens=0, max_tokens=0,
                                   members=members)

    def count(self) -> int:
        """Number of judge tasks, without building their requests."""
        judges = {p.name: len(self.judges(p)) * p.samples for p in self.job.prompts}
        return sum(judges[unit[3].name] for unit in self._units(render=False))

    def generation_tasks(self) -> Iterator[Task]:
        """The generation stages' requests: every source item x candidate model."""
        for spec in self.job.generate:
            prompt = spec.prompt()
            models = [m for m in self.job.models if m.name in spec.models]
            frames = _Frames()
            for item in self.items[spec.dataset]:
                values = _joined(prompt, item.fields)
                if (template := prompt.template("answer", item.subset, values)) is not None:
                    yield from _tasks(item, values, (), prompt, "answer", template, models,
                                      frames)

    def with_generated(self, answer: Callable[[Task], str | None]) -> tuple[Expansion, int]:
        """This expansion plus the generated data sets, from `answer` (the cached text of a
        generation task, or None). Returns it and the number of answers still missing."""
        items = dict(self.items)
        missing = 0
        derived: dict[str, list[Item]] = {g.name: [] for g in self.job.generate}
        specs = {f"generate:{g.name}": g for g in self.job.generate}
        for task in self.generation_tasks():
            spec, text = specs[task.prompt], answer(task)
            if text is None:
                missing += 1
                continue
            src = self.index[spec.dataset, task.item_id]
            derived[spec.name].append(_answer_item(spec, src, task.model, text))
        items.update(derived)
        lower = {**self.lower_is_better, **{name: frozenset[str]() for name in derived}}
        return Expansion(job=self.job, items=items, index=ItemIndex(items),
                         lower_is_better=lower), missing

    def groups(self, dataset: str) -> list[list[Item]]:
        """The data set's items by group, groups in order of first appearance."""
        by_group: dict[str, list[Item]] = {}
        for item in self.items[dataset]:
            by_group.setdefault(item.group, []).append(item)
        return list(by_group.values())

    def item(self, dataset: str, item_id: str) -> Item:
        try:
            return self.index[dataset, item_id]
        except KeyError:
            raise ConfigError(f"data set {dataset!r} has no item {item_id!r} (within --limit)"
                              ) from None


class ItemIndex(Mapping[tuple[str, str], Item]):
    """(data set, item id) -> item over held data sets, the dict made on its first lookup: a
    run's judging and reports find their items in data order without it
    (runner.reduce.judgments.ItemCursor), so a fully cached run never makes it (~100 bytes an
    item, 25 MB of a 1M-task run of 250k items; bench/README.md, Memory)."""

    def __init__(self, items: Mapping[str, Sequence[Item]]) -> None:
        self._items = items
        self._made: dict[tuple[str, str], Item] | None = None

    def _dict(self) -> dict[tuple[str, str], Item]:
        if self._made is None:
            self._made = {(it.dataset, it.item_id): it for its in self._items.values()
                          for it in its}
        return self._made

    def __getitem__(self, key: tuple[str, str]) -> Item:
        return self._dict()[key]

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._dict())

    def __len__(self) -> int:
        return len(self._dict())


class _ItemsFromFile(Sequence[Item]):
    """A data set read again from its file on every pass, never held in memory (`plan` over
    a million tasks). Indexing reads up to the item; len() reads it all. `kept`: the item ids
    of a --sample draw (None: every item, up to `limit`)."""

    def __init__(self, read: Callable[[], Iterable[Item]], limit: int | None,
                 kept: frozenset[str] | None = None) -> None:
        self.read, self.limit, self.kept = read, limit, kept

    def __iter__(self) -> Iterator[Item]:
        stream = iter(self.read())
        if self.kept is not None:
            kept = self.kept
            stream = (it for it in stream if it.item_id in kept)
        return islice(stream, self.limit) if self.limit is not None else stream

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @overload
    def __getitem__(self, i: int) -> Item: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Item]: ...
    def __getitem__(self, i: int | slice) -> Item | Sequence[Item]:
        if isinstance(i, slice) or i < 0:
            return list(self)[i]
        return next(islice(iter(self), i, None))


def _no_items(job: Job, position: int, path: Path | None,
              options: Mapping[str, Any]) -> DataError:
    """An empty data set: a run of it would replace the last reports with empty ones."""
    where = f"{path}" if path is not None else f"{job.path}: datasets[{position}]"
    kept = f" with {dict(options)}" if options else ""
    return DataError(f"{where}: no items{kept}; check the file is the one you meant and not "
                     "empty" + (", and the subsets/systems options" if options else ""))


def sample_ids(items: Iterable[Item], n: int, seed: int) -> frozenset[str]:
    """The item ids of `judge ... --sample N --seed S`: N items drawn at random, whole groups
    at a time where the data set has groups (the unit of the dataset-level correlation: a
    group cut in two would count its items in neither), so at least N items unless the data
    set has fewer. The same items, data and seed give the same draw on every command and
    machine (the first groups of `groups_drawn`)."""
    kept: list[str] = []
    for ids in groups_drawn(items, seed):
        if len(kept) >= n:
            break
        kept += ids
    return frozenset(kept)


def groups_drawn(items: Iterable[Item], seed: int) -> list[list[str]]:
    """The item ids of every group (an item without one is its own), groups in the order
    --sample draws them: random.Random(seed) over the groups in file order. Any first groups
    of it are a --sample draw (the rating queue of `judge serve` walks it so)."""
    groups: dict[str, list[str]] = {}
    for it in items:
        groups.setdefault(it.group or it.item_id, []).append(it.item_id)
    order = list(groups)
    random.Random(seed).shuffle(order)
    return [groups[g] for g in order]


def prepare(job: Job, data_dir: Path, *, limit: int | None = None,
            stream: bool = False, sample: tuple[int, int] | None = None,
            keep: Callable[[str, str], bool] | None = None) -> Expansion:
    """Load every data set of the job and check each template against its fields.

    `limit`: the first N items of each data set, in file order; `sample`: (N, seed), N items
    of each drawn at random, whole groups at a time (`sample_ids`).

    `keep`: (data set, group) -> whether that group's items are loaded (`judge run --shard`:
    runner.execute.shard.Shard.owns), after `limit` and `sample`; the other items are dropped
    as they are read, never held, indexed or rendered. Generated data sets derive from the
    items kept.

    With `stream`, a job with no group prompts and no generation stage keeps no item in
    memory: every pass over the tasks reads the files again, and `item()` lookups are not
    available (for `plan` and `status`, which make one pass). Not with `keep`: the kept items
    are held.
    """
    stream = stream and keep is None and not job.generate and all(
        p.per == "item" for p in job.prompts)
    items: dict[str, Sequence[Item]] = {}
    lower: dict[str, frozenset[str]] = {}
    for position, spec in enumerate(job.datasets):
        if spec.path is not None:
            if spec.path.is_dir():
                raise ConfigError(f"{job.path}: datasets[{position}].path points to {spec.path}, "
                                  "which is a folder; give the data file itself (.jsonl, .csv "
                                  "or .json)")
            if not spec.path.is_file():
                raise ConfigError(f"{job.path}: datasets[{position}].path points to {spec.path}, "
                                  "which does not exist; fix the path (relative to the job file)")
            fields = _field_map(job, spec.name, spec.fields)
            lower[spec.name] = frozenset(fields.lower_is_better)
            read = functools.partial(datasets.load_file, spec.path, fields, dataset=spec.name)
        else:
            if spec.name not in datasets.REGISTRY:
                known = ", ".join(sorted(datasets.REGISTRY))
                raise ConfigError(f"{job.path}: datasets: {spec.name!r} is not a registered data "
                                  f"set ({known}); or give path = \"your.jsonl\" and fields")
            lower[spec.name] = datasets.REGISTRY[spec.name].lower_is_better
            read = functools.partial(datasets.load, spec.name, data_dir, options=spec.options)
        kept = None if sample is None else sample_ids(read(), *sample)
        source = _ItemsFromFile(read, limit, kept)
        items[spec.name] = _loaded(source, spec.name, stream, keep)
        if stream or keep is not None:  # a shard may hold none of its items: is the file empty?
            empty = next(iter(source), None) is None
        else:
            empty = not items[spec.name]
        if empty:
            raise _no_items(job, position, spec.path, spec.options)
    _check_templates(job, items)
    index: Mapping[tuple[str, str], Item] = {} if stream else ItemIndex(items)
    return Expansion(job=job, items=items, index=index, lower_is_better=lower)


def _loaded(source: Sequence[Item], dataset: str, stream: bool,
            keep: Callable[[str, str], bool] | None) -> Sequence[Item]:
    """A data set's items as prepare holds them: `source` itself (streamed), or a list of its
    items (those `keep` accepts)."""
    if stream:
        return source
    if keep is None:  # not list(source): list() asks a sequence its len(), a whole read more
        return list(iter(source))
    return list(_kept(source, dataset, keep))


def _kept(items: Iterable[Item], dataset: str, keep: Callable[[str, str], bool]
          ) -> Iterator[Item]:
    """The items whose (data set, group) `keep` accepts, in order; `keep` is asked once for a
    run of items of one group (a group's items are usually consecutive)."""
    group, kept = None, False
    for item in items:
        if item.group != group:
            group, kept = item.group, keep(dataset, item.group)
        if kept:
            yield item


def _answer_item(spec: GenerateSpec, src: Item, model: str, text: str) -> Item:
    """A generated answer as an item of the derived data set, with its automatic metrics."""
    fields = {**src.fields, spec.into: text}
    reference = next((src.fields[f] for f in spec.reference if src.fields.get(f, "").strip()),
                     "")
    if spec.reference:
        fields["reference"] = reference
    scores = metrics.compute(spec.metric_names(src.subset), text, reference, spec.language)
    return Item(dataset=spec.name, item_id=f"{src.item_id}:{model}", group=src.group,
                system=model, subset=src.subset, fields=fields, human=src.human,
                annotators=src.annotators, metrics={"*": scores} if scores else {},
                extra=src.extra)


def _field_map(job: Job, name: str, fields: Mapping[str, Any]) -> FieldMap:
    allowed = {"id", "group", "system", "subset", "text", "human", "metrics", "lower_is_better",
               "format", "answer"}
    for key in fields:
        if key not in allowed:
            raise ConfigError(f"{job.path}: datasets.{name}.fields.{key} is not a known key; use "
                              f"one of: {', '.join(sorted(allowed))}")
    if not isinstance(fields.get("text"), dict) or not fields["text"]:
        raise ConfigError(f"{job.path}: datasets.{name}.fields.text is missing: map template "
                          "fields to columns, e.g. text = {output = \"hypothesis\"}")
    human = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.get("human", {}).items()}
    if (answer := fields.get("answer")) is not None and answer not in fields["text"]:
        raise ConfigError(f"{job.path}: datasets.{name}.fields.answer names {answer!r}, which is "
                          "not a text field; use one of: " + ", ".join(fields["text"]))
    return FieldMap(id=fields.get("id"), group=fields.get("group"), system=fields.get("system"),
                    subset=fields.get("subset"), text=dict(fields["text"]), human=human,
                    metrics=tuple(fields.get("metrics", ())),
                    lower_is_better=tuple(fields.get("lower_is_better", ())),
                    format=fields.get("format"), answer=answer)


def _check_templates(job: Job, items: Mapping[str, Sequence[Item]]) -> None:
    first = {name: next(iter(its), None) for name, its in items.items()}
    fields = {name: set(it.fields) for name, it in first.items() if it is not None}
    for g in job.generate:
        fields[g.name] = fields.get(g.dataset, set()) | {g.into} | (
            {"reference"} if g.reference else set())
    checks = [(f"prompts[{i}]", p, p.datasets or tuple(d.name for d in job.datasets))
              for i, p in enumerate(job.prompts)]
    checks += [(f"generate[{i}]", g.prompt(), (g.dataset,)) for i, g in enumerate(job.generate)]
    for where, prompt, names in checks:
        for name in names:
            if name not in fields:
                continue  # an empty data set: nothing to render
            have = fields[name] | {"aspect"} | set(prompt.join) | (
                {"outputs"} if prompt.per == "group" else set())
            absent = set(prompt.requires) - have
            if absent:
                raise ConfigError(f"{job.path}: {where}.requires names {', '.join(sorted(absent))}"
                                  f", which data set {name!r} does not have")
            texts = [*prompt.templates.values(), *prompt.when_empty.values()]
            for text in [*texts, *([prompt.system] if prompt.system else [])]:
                unknown = {u for u in placeholders(text) - have
                           if not (prompt.per == "group" and OUTPUT_N.fullmatch(u))}
                if unknown:
                    raise ConfigError(
                        f"{job.path}: {where}.template uses "
                        f"{', '.join('{{' + u + '}}' for u in sorted(unknown))}, which data set "
                        f"{name!r} does not have; its fields are {', '.join(sorted(have))}")


def render(template: str, values: Mapping[str, str]) -> str:
    """Fill `{{name}}` placeholders in one pass: braces inside the values pass through as is."""
    return _compiled(template).format_map(values)


@functools.lru_cache(maxsize=1024)
def _compiled(template: str) -> str:
    """The template as a str.format string: `{{ name }}` -> `{name}`, every other brace
    doubled. format_map fills it in C and, like one re.sub pass, never reads a brace inside a
    value (4-6x faster than re.sub with a function, and the prompt is rendered per task)."""
    pieces = PLACEHOLDER.split(template)  # literal, name, literal, ..., literal
    return "".join(p.replace("{", "{{").replace("}", "}}") if i % 2 == 0 else f"{{{p}}}"
                   for i, p in enumerate(pieces))


def _chooser(prompt: PromptSpec) -> Callable[[str, str, Mapping[str, str] | None], str | None]:
    """prompt.template, remembered per (aspect, subset) when the item's fields cannot change
    the answer (no `requires`, no `when_empty`): the usual case, asked once per unit."""
    if prompt.requires or prompt.when_empty:
        return prompt.template
    memo: dict[tuple[str, str], str | None] = {}

    def choose(aspect: str, subset: str, fields: Mapping[str, str] | None) -> str | None:
        try:
            return memo[aspect, subset]
        except KeyError:
            found = memo[aspect, subset] = prompt.template(aspect, subset)
            return found

    return choose


def _outputs(members: Sequence[Item], prompt: PromptSpec) -> str:
    """Group mode's {{outputs}}: "Output 1: <text>" lines, in file order."""
    return "\n".join(f"Output {i}: {m.fields[prompt.output_field]}"
                     for i, m in enumerate(members, 1))


def _joined(prompt: PromptSpec, fields: Mapping[str, str]) -> dict[str, str]:
    """The item's template values plus the prompt's joined fields (empty parts left out)."""
    values = dict(fields)
    for name, (parts, sep) in prompt.join.items():
        values[name] = sep.join(fields[p] for p in parts if fields.get(p, "") != "")
    return values


@functools.lru_cache(maxsize=256)
def _slots(template: str) -> int:
    """The highest N of the template's {{output_N}} placeholders (0 if none)."""
    return max((int(m.group(1)) for p in placeholders(template)
                if (m := OUTPUT_N.fullmatch(p))), default=0)


def _group_units(members: Sequence[Item], prompt: PromptSpec
                 ) -> Iterator[_Unit]:
    """A group's units: the members in data order and, with order = "both", reversed too. A
    template listing more {{output_N}} than the group has members skips the group."""
    orders = [members]
    if prompt.order == "both" and len(members) > 1:
        orders.append(members[::-1])
    for ordered in orders:
        values = {**_joined(prompt, ordered[0].fields), "outputs": _outputs(ordered, prompt)}
        values.update({f"output_{i}": m.fields[prompt.output_field]
                       for i, m in enumerate(ordered, 1)})
        ids = tuple(m.item_id for m in ordered)
        for aspect in prompt.aspects:
            template = prompt.template(aspect, ordered[0].subset, values)
            if template is not None and _slots(template) <= len(ordered):
                yield ordered[0], values, ids, prompt, aspect, template


def request_body(prompt: PromptSpec, model: ModelSpec, values: Mapping[str, str],
                 aspect: str, subset: str = "") -> dict[str, Any]:
    """The chat-completions request body for one (item or group, prompt, aspect, model)."""
    messages = []
    if prompt.system:
        messages.append({"role": "system", "content": render(prompt.system, values)})
    template = prompt.template(aspect, subset, values)
    assert template is not None, "tasks exist only where a template does"
    messages.append({"role": "user", "content": render(template, values)})
    return {"model": model.model, "messages": messages, **model.params, **prompt.params}


def cache_key(endpoint: str, body: Mapping[str, Any], sample: int) -> str:
    """sha256 of what determines the answer: endpoint, full request body, sample index."""
    canonical = orjson.dumps({"endpoint": endpoint, "request": body, "sample": sample},
                             option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


@functools.cache
def _code_digest() -> bytes:
    """What of the code decides a key: the source of this module and of the job spec (template
    choice, placeholders), and orjson's version (the bytes hashed)."""
    from runner.job import spec
    digest = hashlib.sha256(orjson.__version__.encode())
    for module in (__file__, spec.__file__):
        try:
            digest.update(Path(module).read_bytes())
        except OSError:  # no source to read: a digest no index will ever match
            digest.update(os.urandom(16))
    return digest.digest()


def _key(endpoint: bytes, canonical_body: bytes, sample: int) -> str:
    """cache_key from the body's canonical bytes (sorted keys), without serialising it again:
    the same bytes orjson writes for {"endpoint", "request", "sample"} with sorted keys."""
    return hashlib.sha256(b'{"endpoint":%s,"request":%s,"sample":%d}'
                          % (endpoint, canonical_body, sample)).hexdigest()


@dataclass(frozen=True, slots=True)
class _Frame:
    """One (prompt, model)'s request body as bytes around its message contents: the body is
    parts[0] + content_1 + parts[1] (+ content_2 + parts[2]), each content serialised as orjson
    writes a string. Only the contents change from task to task, so the rest of the body
    (model, parameters, sorted keys) is serialised once, not per task."""

    parts: tuple[bytes, ...]
    endpoint: bytes
    """orjson of the model's endpoint, as the key has it."""
    reserve: int
    """Completion tokens reserved: max_tokens x n."""


# Stand-ins for the message contents while a frame is cut: they must not occur elsewhere in a
# body (checked: a frame whose body holds one twice is not used).
_MARKS = ("\x00judge-runner content 0\x00", "\x00judge-runner content 1\x00")


class _Frames(dict[tuple[str, str], "_Frame | None"]):
    """(prompt name, model name) -> its frame, built on first use; None if it cannot be cut
    (then the body is built and serialised whole, as request_body does)."""

    def get_frame(self, prompt: PromptSpec, model: ModelSpec) -> _Frame | None:
        key = (prompt.name, model.name)
        if key not in self:
            self[key] = _frame(prompt, model)
        return self[key]


def _frame(prompt: PromptSpec, model: ModelSpec) -> _Frame | None:
    marks = _MARKS if prompt.system else _MARKS[1:]
    messages = [{"role": "system", "content": marks[0]}] if prompt.system else []
    messages.append({"role": "user", "content": marks[-1]})
    body = {"model": model.model, "messages": messages, **model.params, **prompt.params}
    raw = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    parts: list[bytes] = []
    for mark in (orjson.dumps(m) for m in marks):
        if raw.count(mark) != 1:
            return None
        head, raw = raw.split(mark)
        parts.append(head)
    return _Frame(parts=(*parts, raw), endpoint=orjson.dumps(model.endpoint),
                  reserve=_reserve(body))


def _reserve(body: Mapping[str, Any]) -> int:
    return int(body.get("max_tokens") or body.get("max_completion_tokens")
               or DEFAULT_MAX_TOKENS) * int(body.get("n", 1))


def _tasks(item: Item, values: Mapping[str, str], members: tuple[str, ...],
           prompt: PromptSpec, aspect: str, template: str, models: Sequence[ModelSpec],
           frames: _Frames) -> Iterator[Task]:
    item_id = item.group if members else item.item_id
    values = {**values, "aspect": aspect}
    # Rendered and serialised once for every model: only the frame around them differs.
    texts = [render(prompt.system, values)] if prompt.system else []
    texts.append(render(template, values))
    contents = [orjson.dumps(t) for t in texts]
    tokens = sum(map(len, texts)) // CHARS_PER_TOKEN + 8
    for model in models:
        frame = frames.get_frame(prompt, model)
        if frame is None:  # sent with sorted keys too: one serialisation, request and key
            body = request_body(prompt, model, values, aspect, item.subset)
            raw, reserve = orjson.dumps(body, option=orjson.OPT_SORT_KEYS), _reserve(body)
            endpoint = orjson.dumps(model.endpoint)
        else:
            p = frame.parts
            raw = (p[0] + contents[0] + p[1] if len(p) == 2 else
                   b"".join((p[0], contents[0], p[1], contents[1], p[2])))
            reserve, endpoint = frame.reserve, frame.endpoint
        for sample in range(prompt.samples):
            yield new_task(key=_key(endpoint, raw, sample), dataset=item.dataset,
                           item_id=item_id, prompt=prompt.name, aspect=aspect, model=model.name,
                           sample=sample, body=raw, prompt_tokens=tokens, max_tokens=reserve,
                           members=members)


def estimate_cost(model: ModelSpec, prompt_tokens: int, completion_tokens: int) -> float | None:
    """USD for the given tokens, or None when the model's price is unknown."""
    price = model.price or PRICES.get(model.model)
    if price is None:
        return 0.0 if model.kind == "local" else None
    return (prompt_tokens * price[0] + completion_tokens * price[1]) / 1e6
