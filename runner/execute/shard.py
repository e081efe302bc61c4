"""One of N shards of a job: the groups that fall in it, and its share of the limits.

N processes on N machines (a SLURM array, a Kubernetes indexed Job) each run `--shard I/N`
against one shared cache. The split is by group: an item's data set and group (the source that
several systems' outputs share; an item without one is its own group), hashed with blake2b (not
Python's salted hash), so it is the same on every machine whatever the order. It is known
before anything is rendered: `Shard.share` drops the other shards' items from the expansion, so
a shard renders and hashes only its own requests (a fully cached 40k-task job on one cache
folder, 8 shards: see bench/README.md, "Shards", for each shard's CPU, peak RSS and wall time
against one process running all). Whole groups, because a group prompt needs every member and
tasks that send one request (aspects of one form, several parsers over one prompt) are nearly
always of one item. A generated data set's items count under their source data set's name: a
shard judges the answers it generated itself.

Disjoint, and together the whole job: every (data set, group) falls in exactly one shard, so
every task does (the tasks of N shards are the job's, each once).

Cross-shard duplicates: two tasks of groups in different shards that render the very same
request (one model, one message text: e.g. two items with the same text under a template that
reads only that text, one data set listed twice, a source repeated under two group ids) are one
cache key asked by two shards. The pool looks every key up in the shared cache just before it
sends it (runner.execute.pool, a lookup batch ahead), so the shard that comes second reads the
first one's answer: such a request is paid twice only when both shards look it up before either
has stored its answer (run at the same time, at the same point of their share); never when the
shards run one after another. A shard cannot count them: it would have to render the other
shards' items, the very cost this split removes. `judge plan` over the whole job counts every
repeated request (its `repeats`), whichever shards they fall in. With `--batch`, a key held by
another shard's open batch is never submitted again (runner.execute.batch).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import overload

from runner.data.datasets import Item
from runner.errors import ConfigError
from runner.expand import Expansion
from runner.job.spec import Job

__all__ = ["Shard", "split_limits"]

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True, slots=True)
class Shard:
    """Shard `index` (0-based) of `count`."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """`I/N` with 0 <= I < N, e.g. "0/4" .. "3/4"; raises ConfigError otherwise."""
        match = _SPEC.match(text)
        if not match or int(match[2]) < 1 or int(match[1]) >= int(match[2]):
            raise ConfigError(f"--shard {text!r}: write I/N with 0 <= I < N, e.g. --shard 0/4 "
                              "for the first of four (SLURM: $SLURM_ARRAY_TASK_ID/"
                              "$SLURM_ARRAY_TASK_COUNT with --array=0-3)")
        return cls(int(match[1]), int(match[2]))

    def owns(self, dataset: str, group: str) -> bool:
        """Whether the items of `group` in data set `dataset` are this shard's.

        Args:
            dataset: the data set's name in the job (a generated data set: its source's).
            group: the item's group (its own id when the data set has no groups).
        Returns:
            True for exactly one shard of `count`, the same on every machine."""
        text = b"%s\x00%s" % (dataset.encode("utf-8", "surrogatepass"),
                              group.encode("utf-8", "surrogatepass"))
        digest = hashlib.blake2b(text, digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.count == self.index

    def share(self, expansion: Expansion) -> Expansion:
        """This shard's part of a job.

        Args:
            expansion: the whole job, its items loaded (a list each, or streamed).
        Returns:
            The same expansion over this shard's items only (`owns`), in their order; its
            tasks(), count(), generation_tasks() and groups() are this shard's, and the other
            items are never rendered. `index` (item lookups) stays whole."""
        source = {g.name: g.dataset for g in expansion.job.generate}
        items = {name: _share(its, source.get(name, name), self.owns)
                 for name, its in expansion.items.items()}
        return replace(expansion, items=items)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def _owned(items: Iterable[Item], dataset: str, owns: Callable[[str, str], bool]
           ) -> Iterator[Item]:
    """The items of `items` whose group `owns` accepts, in order; a group's items are
    usually consecutive, so each run of one group is hashed once."""
    group, kept = None, False
    for item in items:
        if item.group != group:
            group, kept = item.group, owns(dataset, item.group)
        if kept:
            yield item


def _share(items: Sequence[Item], dataset: str, owns: Callable[[str, str], bool]
           ) -> Sequence[Item]:
    if isinstance(items, list):
        return list(_owned(items, dataset, owns))
    return _Streamed(items, dataset, owns)


class _Streamed(Sequence[Item]):
    """A streamed data set's share (expand.prepare's `stream`): filtered again on every pass,
    never held in memory."""

    def __init__(self, items: Sequence[Item], dataset: str,
                 owns: Callable[[str, str], bool]) -> None:
        self.items, self.dataset, self.owns = items, dataset, owns

    def __iter__(self) -> Iterator[Item]:
        return _owned(self.items, self.dataset, self.owns)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    @overload
    def __getitem__(self, i: int) -> Item: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Item]: ...
    def __getitem__(self, i: int | slice) -> Item | Sequence[Item]:
        return list(self)[i]


def _split(value: float | None, count: int) -> float | None:
    return None if value is None else value / count


def split_limits(job: Job, count: int) -> Job:
    """The job with every rpm and tpm (its [limits], each model's and each fleet replica's)
    divided by `count`: N shards together then stay within what one process was allowed.
    Limits a replica announces in its headers (learned limits) are learned by each process on
    its own: with --shard, set rpm/tpm in the job to split them."""
    models = tuple(replace(m, rpm=_split(m.rpm, count), tpm=_split(m.tpm, count),
                           endpoints=tuple(replace(e, rpm=_split(e.rpm, count),
                                                   tpm=_split(e.tpm, count))
                                           for e in m.endpoints))
                   for m in job.models)
    return job.with_models(models).with_limits(rpm=_split(job.limits.rpm, count),
                                               tpm=_split(job.limits.tpm, count))
