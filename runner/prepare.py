"""Load a job's data sets into an Expansion: from a file or the registry, after --limit,
--sample and --shard, every template checked against the fields before any call.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, overload

from runner.data import datasets
from runner.data.annotations import human_columns, rated_reader
from runner.data.datasets import FieldMap, Item
from runner.errors import ConfigError, DataError
from runner.expand import OUTPUT_N, Expansion, ItemIndex
from runner.job.spec import DatasetSpec, Job, placeholders

__all__ = ["drawn_groups", "prepare", "sample_ids"]


class _ItemsFromFile(Sequence[Item]):
    """A data set read again from its file on every pass, never held in memory (`plan` over
    a million tasks). Indexing reads up to the item; len() reads it all. `kept`: the item ids
    of a --sample draw (None: every item, up to `limit`)."""

    def __init__(self, read: Callable[[], Iterable[Item]], limit: int | None,
                 kept: frozenset[str] | None) -> None:
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
    """The item ids of `judge ... --sample N --seed S`: whole groups at a time where the data
    set has groups (the unit of the dataset-level correlation: a group cut in two would count
    its items in neither); the same draw on every command and machine.

    Args:
        items: the data set's items in file order; n: items wanted; seed: the draw's seed.

    Returns:
        At least n item ids (all of them if the data set has fewer), drawn_groups' first
        groups.
    """
    kept: list[str] = []
    for group in drawn_groups(items, seed):
        if len(kept) >= n:
            break
        kept += (it.item_id for it in group)
    return frozenset(kept)


def drawn_groups(items: Iterable[Item], seed: int) -> list[list[Item]]:
    """The items by group (an item without one alone), in the order the --sample draw takes
    them: random.Random(seed) shuffles the groups in file order.

    Args:
        items: the data set's items in file order; seed: the draw's seed.

    Returns:
        The groups in drawn order, each group's items in file order.
    """
    groups: dict[str, list[Item]] = {}
    for it in items:
        groups.setdefault(it.group or it.item_id, []).append(it)
    order = list(groups.values())
    random.Random(seed).shuffle(order)
    return order


def prepare(job: Job, data_dir: Path, *, limit: int | None = None,
            stream: bool = False, sample: tuple[int, int] | None = None,
            keep: Callable[[str, str], bool] | None = None) -> Expansion:
    """Load every data set of the job and check each template against its fields.

    Args:
        job: the job; data_dir: where the registered data sets are.
        limit: the first N items of each data set, in file order.
        stream: keep no item in memory when the job has no group prompt, no generation stage
            and no `keep`: every pass over the tasks reads the files again and `item()` is not
            available (for `plan` and `status`, which make one pass).
        sample: (N, seed): N items of each data set drawn at random, whole groups at a time
            (`sample_ids`).
        keep: (data set, group) -> whether that group's items are loaded (`judge run
            --shard`: runner.execute.shard.Shard.owns), after `limit` and `sample`; the others
            are dropped as they are read. Generated data sets derive from the items kept.

    Returns:
        The expansion.

    Raises:
        ConfigError: a data set's path, name or field mapping is wrong, or a template names a
            field its data set does not have.
        DataError: a data set has no items.
    """
    stream = stream and keep is None and not job.generate and all(
        p.per == "item" for p in job.prompts)
    items: dict[str, Sequence[Item]] = {}
    lower: dict[str, frozenset[str]] = {}
    for position, spec in enumerate(job.datasets):
        read, lower[spec.name] = _reader(job, position, spec, data_dir)
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


def _reader(job: Job, position: int, spec: DatasetSpec, data_dir: Path
            ) -> tuple[Callable[[], Iterable[Item]], frozenset[str]]:
    """A data set's item reader (from its file or the registry) and its lower-is-better
    metrics."""
    if spec.path is None:
        if spec.name not in datasets.REGISTRY:
            known = ", ".join(sorted(datasets.REGISTRY))
            raise ConfigError(f"{job.path}: datasets: {spec.name!r} is not a registered data "
                              f"set ({known}); or give path = \"your.jsonl\" and fields")
        return (functools.partial(datasets.load, spec.name, data_dir, options=spec.options),
                datasets.REGISTRY[spec.name].lower_is_better)
    if spec.path.is_dir():
        raise ConfigError(f"{job.path}: datasets[{position}].path points to {spec.path}, "
                          "which is a folder; give the data file itself (.jsonl, .csv "
                          "or .json)")
    if not spec.path.is_file():
        raise ConfigError(f"{job.path}: datasets[{position}].path points to {spec.path}, "
                          "which does not exist; fix the path (relative to the job file)")
    fields, ratings = _field_map(job, spec.name, spec.fields)
    return (rated_reader(functools.partial(datasets.load_file, spec.path, fields,
                                           dataset=spec.name), ratings),
            frozenset(fields.lower_is_better))


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


def _field_map(job: Job, name: str, fields: Mapping[str, Any]
               ) -> tuple[FieldMap, dict[str, Path]]:
    """The data set's field mapping, and its aspects' ratings files (relative to the job)."""
    allowed = {"id", "group", "system", "subset", "text", "human", "metrics", "lower_is_better",
               "format", "answer"}
    for key in fields:
        if key not in allowed:
            raise ConfigError(f"{job.path}: datasets.{name}.fields.{key} is not a known key; use "
                              f"one of: {', '.join(sorted(allowed))}")
    if not isinstance(fields.get("text"), dict) or not fields["text"]:
        raise ConfigError(f"{job.path}: datasets.{name}.fields.text is missing: map template "
                          "fields to columns, e.g. text = {output = \"hypothesis\"}")
    human, ratings = human_columns(fields.get("human", {}), job.path.parent,
                                   f"{job.path}: datasets.{name}.fields.human")
    if (answer := fields.get("answer")) is not None and answer not in fields["text"]:
        raise ConfigError(f"{job.path}: datasets.{name}.fields.answer names {answer!r}, which is "
                          "not a text field; use one of: " + ", ".join(fields["text"]))
    return FieldMap(id=fields.get("id"), group=fields.get("group"), system=fields.get("system"),
                    subset=fields.get("subset"), text=dict(fields["text"]), human=human,
                    metrics=tuple(fields.get("metrics", ())),
                    lower_is_better=tuple(fields.get("lower_is_better", ())),
                    format=fields.get("format"), answer=answer), ratings


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
