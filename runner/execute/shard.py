"""One of N shards of a job: the tasks whose cache key falls in it, and its share of the limits.

N processes on N machines (a SLURM array, a Kubernetes indexed Job) each run `--shard I/N`
against one shared cache. The split is by cache key (a sha256, so uniform), which makes it
deterministic on every machine whatever the task order, and keeps tasks that send the same
request (aspects of one form) in the same shard, so no request is paid for twice.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace

from runner.errors import ConfigError
from runner.expand import Task
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

    def owns(self, key: str) -> bool:
        """Whether the task with this cache key (64 hex digits) is this shard's."""
        return int(key[:16], 16) % self.count == self.index

    def tasks(self, tasks: Iterable[Task], seen: Callable[[], None] = lambda: None
              ) -> Iterator[Task]:
        """This shard's tasks of `tasks`, in order; `seen` is called once for each."""
        for task in tasks:
            if self.owns(task.key):
                seen()
                yield task

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def _share(value: float | None, count: int) -> float | None:
    return None if value is None else value / count


def split_limits(job: Job, count: int) -> Job:
    """The job with every rpm and tpm (its [limits], each model's and each fleet replica's)
    divided by `count`: N shards together then stay within what one process was allowed.
    Limits a replica announces in its headers (learned limits) are learned by each process on
    its own: with --shard, set rpm/tpm in the job to split them."""
    models = tuple(replace(m, rpm=_share(m.rpm, count), tpm=_share(m.tpm, count),
                           endpoints=tuple(replace(e, rpm=_share(e.rpm, count),
                                                   tpm=_share(e.tpm, count))
                                           for e in m.endpoints))
                   for m in job.models)
    return job.with_models(models).with_limits(rpm=_share(job.limits.rpm, count),
                                               tpm=_share(job.limits.tpm, count))
