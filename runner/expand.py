"""Expand a job into tasks: (item x prompt x aspect x model x sample), streamed in a fixed order.

runner.prepare loads the data sets into an Expansion; runner.tasks renders each unit's requests
and keys.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import orjson

from runner import tasks as task_module
from runner.data.datasets import Item
from runner.errors import ConfigError
from runner.job import spec as job_spec
from runner.job.providers import IDENTITY
from runner.job.spec import GenerateSpec, Job, ModelSpec, PromptSpec, placeholders
from runner.parse import metrics
from runner.tasks import Frames, Task, new_task, prefix_marked, unit_tasks

__all__ = ["OUTPUT_N", "Expansion", "ItemIndex"]

_END = 1 << 62  # past any task's index
# Not in any key, nor deciding the tasks' order: what the fingerprint leaves out.
_PARSER_FIELDS = frozenset({"parser", "parser_options", "aspect_options", "prefix_until"})
# Group mode's {{output_N}}: the N-th member's output (1-based), in the order of the request.
OUTPUT_N = re.compile(r"output_([1-9][0-9]*)")
# (anchor item, template values, group members, prompt, aspect, template): one request's parts;
# the values None where they were not joined (see Expansion._units).
_Unit = tuple[Item, dict[str, str] | None, tuple[str, ...], PromptSpec, str, str]


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

    def _prompts_for(self, dataset: str, per: str) -> list[PromptSpec]:
        return [p for p in self.job.prompts
                if p.per == per and (not p.datasets or dataset in p.datasets)]

    def judges(self, prompt: PromptSpec) -> list[ModelSpec]:
        """The models that judge with a prompt.

        Args:
            prompt: one of the job's prompts.

        Returns:
            Its own `models`, else every model that is not a generator, in the job's order.
        """
        if prompt.models:
            return [m for m in self.job.models if m.name in prompt.models]
        generators = self.job.generator_names
        return [m for m in self.job.models if m.name not in generators]

    def _units(self) -> Iterator[_Unit]:
        """(anchor item, template values, group members, prompt, aspect, template) in task
        order, for every (item or group) x prompt x aspect that has a template. An item's
        values are joined only where choosing the template reads them, else None (~0.5 us a
        unit spared to callers that render few units or none)."""
        names = [d.name for d in self.job.datasets] + [
            g.name for g in self.job.generate if g.name in self.items]
        for name in names:
            prompts = [(p, _chooser(p), bool(p.requires or p.when_empty))
                       for p in self._prompts_for(name, "item")]
            for item in self.items[name]:
                for prompt, choose, wanted in prompts:
                    values = _joined(prompt, item.fields) if wanted else None
                    for aspect in prompt.aspects:
                        if (template := choose(aspect, item.subset, values)) is not None:
                            yield item, values, (), prompt, aspect, template
            group_prompts = self._prompts_for(name, "group")
            for members in (self.groups(name) if group_prompts else []):
                for prompt in group_prompts:
                    yield from _group_units(members, prompt)

    def tasks(self, start: int = 0) -> Iterator[Task]:
        """Every judge task, in order: data set, item (then group), prompt, aspect, model,
        sample.

        Args:
            start: the index of the first task wanted; the ones before are not rendered.

        Returns:
            The tasks, rendered as they are read.
        """
        return self._spans(iter([(start, _END)]))

    def part(self, size: int, part: int, parts: int) -> Iterator[Task]:
        """One part of tasks() cut in runs: the parts of one `size` and `parts` are each task
        once.

        Args:
            size: tasks in a run; part: the first run of this part; parts: every `parts`-th
                run after it is this part's too (part 0 of 2: runs 0, 2, 4, ...).

        Returns:
            The part's tasks in order; the other runs are not rendered.
        """
        return self._spans((k * size, (k + 1) * size) for k in itertools.count(part, parts))

    def _spans(self, spans: Iterator[tuple[int, int]]) -> Iterator[Task]:
        """The tasks whose index (in tasks() order) falls in `spans`: increasing, disjoint
        [start, stop) ranges. Units outside every span are counted, not rendered."""
        judges = {p.name: self.judges(p) for p in self.job.prompts}
        frames, marks = Frames(), prefix_marked(self.job)
        start, stop = next(spans, (_END, _END))
        at = 0  # the index of the unit's first task
        for item, values, members, prompt, aspect, template in self._units():
            n = len(judges[prompt.name]) * prompt.samples
            while stop <= at:
                start, stop = next(spans, (_END, _END))
            if start == _END:
                return
            if start >= at + n:  # the unit ends before the span
                at += n
                continue
            made = unit_tasks(item, _joined(prompt, item.fields) if values is None else values,
                              members, prompt, aspect, template, judges[prompt.name], frames,
                              marks)
            for i, task in enumerate(made, at):
                while stop <= i:
                    start, stop = next(spans, (_END, _END))
                if i >= start:
                    yield task
            at += n

    def fingerprint(self) -> str:
        """A digest of everything that decides tasks()' keys and their order: the code
        (_code_digest), the prompts but for their parsers, the models but for their prices,
        the generation stages, and every data set's items in order (id, group, subset,
        fields). runner.execute.store.keyindex relies on it; a parser or price change keeps it.

        Returns:
            64 hex digits, the same for two expansions with the same keys in the same order.
        """
        digest = hashlib.sha256(_code_digest())
        prompts = [[(f.name, getattr(p, f.name)) for f in dataclasses.fields(p)
                    if f.name not in _PARSER_FIELDS] for p in self.job.prompts]
        models = [dataclasses.replace(m, price=None, batch_discount=None) for m in self.job.models]
        digest.update(repr((prompts, models, self.job.generate)).encode())
        for name, items in self.items.items():
            digest.update(orjson.dumps(name))
            stream = iter(items)  # a thousand at a time: never a copy of a large data set
            while chunk := [(it.item_id, it.group, it.subset, it.fields)
                            for it in islice(stream, 1000)]:
                digest.update(orjson.dumps(chunk, default=dict))  # fields not a dict: as one
        return digest.hexdigest()

    def skeleton(self, keys: Iterator[str]) -> Iterator[Task]:
        """Every judge task, in the order of tasks(), without rendering or hashing a request.

        Args:
            keys: the tasks' keys in that order, computed elsewhere.

        Returns:
            tasks()'s tasks with body b"" and token estimates 0.
        """
        judges = {p.name: self.judges(p) for p in self.job.prompts}
        key = keys.__next__
        for item, _, members, prompt, aspect, _ in self._units():
            item_id = item.group if members else item.item_id
            for model in judges[prompt.name]:
                for sample in range(prompt.samples):
                    yield new_task(key=key(), dataset=item.dataset, item_id=item_id,
                                   prompt=prompt.name, aspect=aspect, model=model.name,
                                   sample=sample, body=b"", prompt_tokens=0, max_tokens=0,
                                   members=members)

    def count(self) -> int:
        """The number of judge tasks, counted without rendering a request.

        Returns:
            len(list(self.tasks())), without making them.
        """
        judges = {p.name: len(self.judges(p)) * p.samples for p in self.job.prompts}
        return sum(judges[unit[3].name] for unit in self._units())

    def generation_tasks(self) -> Iterator[Task]:
        """The generation stages' requests.

        Returns:
            A task per source item x candidate model, stage by stage.
        """
        frames, marks = Frames(), prefix_marked(self.job)
        for item, values, prompt, template, models in self._generation_units():
            yield from unit_tasks(item, values, (), prompt, "answer", template, models, frames,
                                  marks)

    def generation_count(self) -> int:
        """The number of generation tasks, counted without rendering a request.

        Returns:
            len(list(self.generation_tasks())), without making them.
        """
        return sum(len(models) * prompt.samples
                   for _, _, prompt, _, models in self._generation_units())

    def _generation_units(self) -> Iterator[tuple[Item, dict[str, str], PromptSpec, str,
                                                  list[ModelSpec]]]:
        """(source item, template values, prompt, template, candidate models) per unit."""
        for spec in self.job.generate:
            prompt = spec.prompt()
            models = [m for m in self.job.models if m.name in spec.models]
            for item in self.items[spec.dataset]:
                values = _joined(prompt, item.fields)
                if (template := prompt.template("answer", item.subset, values)) is not None:
                    yield item, values, prompt, template, models

    def with_generated(self, answer: Callable[[Task], str | None]) -> tuple[Expansion, int]:
        """This expansion plus the generated data sets.

        Args:
            answer: a generation task -> its cached answer text, or None.

        Returns:
            (the new expansion, the number of answers still missing).
        """
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
        """A data set's items by group.

        Args:
            dataset: the data set's name.

        Returns:
            Its groups in order of first appearance, each group's items in file order.
        """
        by_group: dict[str, list[Item]] = {}
        for item in self.items[dataset]:
            by_group.setdefault(item.group, []).append(item)
        return list(by_group.values())

    def item(self, dataset: str, item_id: str) -> Item:
        """One item by its ids.

        Args:
            dataset: the data set's name; item_id: the item's id.

        Returns:
            The item.

        Raises:
            ConfigError: no such item (within --limit).
        """
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


@functools.cache
def _code_digest() -> bytes:
    """What of the code decides a key: the source of this module (the order), of runner.tasks
    (the bodies and keys) and of the job spec (template choice, placeholders), the provider
    table's identities (not its prices), and orjson's version (the bytes hashed)."""
    digest = hashlib.sha256(orjson.__version__.encode() + repr(IDENTITY).encode())
    for module in (__file__, task_module.__file__, job_spec.__file__):
        try:
            digest.update(Path(module).read_bytes())
        except OSError:  # no source to read: a digest no index will ever match
            digest.update(os.urandom(16))
    return digest.digest()
