"""One of N shards of a job: the groups that fall in it, and its share of the limits.

N processes on N machines (a SLURM array, a Kubernetes indexed Job) each run `--shard I/N`
against one shared cache. The split is by group: an item's data set and group (the source that
several systems' outputs share; an item without one is its own group), hashed with blake2b (not
Python's salted hash), so it is the same on every machine whatever the order. It is known
before anything is rendered: `Shard.owns` is the `keep` of runner.prepare.prepare
(runner.session.select with `shard`), so a shard drops the other shards' items as it reads the
data files, and holds, renders, hashes and looks up only its own: a shard of 8 of a fully cached
40k-task job, 0.63 s of CPU and 90 MB peak RSS, against 0.93 s and 121 MB (1.48x, 1.34x) when
every shard rendered the whole job (bench/README.md, "Shards").

Whole groups, because a group prompt needs every member and tasks that send one request
(aspects of one form, several parsers over one prompt) are nearly always of one item. A
generation stage's data sets derive from the items kept: a shard generates the answers of its
own items and judges them itself.

Disjoint, and together the whole job: every (data set, group) falls in exactly one shard, so
every task does (the tasks of N shards are the job's, each once).

Cross-shard duplicates: two tasks of groups in different shards that render the very same
request (one model, one message text: e.g. two items with the same text under a template that
reads only that text, one data set listed twice, a source repeated under two group ids) are one
cache key asked by two shards: the claims (runner.execute.claims) have it bought once, online
or in a batch. A shard cannot count them: it would have to render the other shards' items, the
very cost this split removes; `judge plan` over the whole job counts every repeated request (its
`repeats`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace

from runner.errors import ConfigError
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
            dataset: the data set's name in the job.
            group: the item's group (its own id when the data set has no groups).
        Returns:
            True for exactly one shard of `count`, the same on every machine."""
        text = b"%s\x00%s" % (dataset.encode("utf-8", "surrogatepass"),
                              group.encode("utf-8", "surrogatepass"))
        digest = hashlib.blake2b(text, digest_size=8).digest()
        return int.from_bytes(digest, "big") % self.count == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def _split(value: float | None, count: int) -> float | None:
    return None if value is None else value / count


def split_limits(job: Job, count: int) -> Job:
    """The job with every rpm and tpm (its [limits], each model's and each fleet replica's)
    divided by `count`: N shards together then stay within what one process was allowed.
    Limits a replica announces in its headers (learned limits) are learned by each process on
    its own: with --shard, set rpm/tpm in the job to split them.

    Args:
        job: the loaded job.
        count: the number of shards.

    Returns:
        The job with its limits divided.
    """
    models = tuple(replace(m, rpm=_split(m.rpm, count), tpm=_split(m.tpm, count),
                           endpoints=tuple(replace(e, rpm=_split(e.rpm, count),
                                                   tpm=_split(e.tpm, count))
                                           for e in m.endpoints))
                   for m in job.models)
    limits = replace(job.limits, rpm=_split(job.limits.rpm, count),
                     tpm=_split(job.limits.tpm, count))
    return replace(job, models=models, limits=limits)
