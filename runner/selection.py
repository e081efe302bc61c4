"""What a command works on, as chosen: the options every command shares, as one value.

`judge` builds a TaskSelection from its shared options (runner/cli/options.py), the Python API
from its keyword arguments; session.select.select resolves it into a WorkingSet, and the
manifest records it as `selection`. Adding a selection option is a field here, its option in
runner/cli/options.py and its use in session.select.select (tests/test_selection.py checks).
A CacheLocation is the part that commands without a job take (`judge cache ...`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Self

from runner.data.annotations import Rating, rated
from runner.data.loaders import Item
from runner.errors import ConfigError, redact_url
from runner.execute.shard import Shard
from runner.execute.store.backend import checked_url
from runner.job.spec import Job
from runner.prepare import drawn_groups

__all__ = ["DEFAULT_CACHE_DIR", "CacheLocation", "TaskSelection", "rating_queue"]

DEFAULT_CACHE_DIR = Path("cache")
"""The cache folder without --cache-dir or JUDGE_CACHE_DIR: ./cache."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheLocation:
    """Where the answers are kept: a cache folder, or a shared PostgreSQL database instead.

    A field left None means the default, which `with_environment` fills in.
    """

    cache_dir: Path | None = None
    """--cache-dir: the cache folder [env JUDGE_CACHE_DIR; default ./cache]. With a cache_url,
    the folder that holds batch request files."""
    cache_url: str | None = None
    """--cache: a postgresql:// URL, used instead of the folder [env JUDGE_CACHE_URL]."""

    def __post_init__(self) -> None:
        if self.cache_dir is not None and not isinstance(self.cache_dir, Path):
            object.__setattr__(self, "cache_dir", Path(self.cache_dir))

    def with_environment(self, environ: Mapping[str, str]) -> Self:
        """This location with its defaults filled in from `environ` (JUDGE_CACHE_DIR,
        JUDGE_CACHE_URL), the URL checked.

        Args:
            environ: the environment to read (os.environ, or the API caller's mapping).

        Returns:
            A copy whose cache_dir is set, and whose cache_url is a checked URL or None.

        Raises:
            ConfigError: the cache URL is not a postgresql:// URL.
        """
        folder = self.cache_dir or Path(environ.get("JUDGE_CACHE_DIR") or DEFAULT_CACHE_DIR)
        url = checked_url(self.cache_url or environ.get("JUDGE_CACHE_URL"))
        return replace(self, cache_dir=folder, cache_url=url)

    def location(self) -> str | Path:
        """The cache to open: the URL if there is one, else the folder (./cache unset)."""
        return self.cache_url or self.cache_dir or DEFAULT_CACHE_DIR

    def shown(self) -> str:
        """The location for messages: a URL without its password."""
        where = self.location()
        return redact_url(where) if isinstance(where, str) else str(where)

    def recorded(self) -> dict[str, Any]:
        """The location as JSON for the manifest: a URL without its password."""
        return {"cache_dir": None if self.cache_dir is None else str(self.cache_dir),
                "cache_url": None if self.cache_url is None else redact_url(self.cache_url)}

    def arguments(self) -> list[str]:
        """The location as `judge` options (a URL without its password)."""
        words = [] if self.cache_dir is None else ["--cache-dir", str(self.cache_dir)]
        return words + ([] if self.cache_url is None else ["--cache", redact_url(self.cache_url)])


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSelection(CacheLocation):
    """The tasks a command works on: the job, its judges and items, its cache and report folder.

    Two commands given equal selections find the same tasks under the same cache keys: `judge
    rescore` reports on what `judge run` stored. A field left None (or empty) means the default
    (the job's models, every item, the job's output_dir, no shard).
    """

    job: str | os.PathLike[str] | Job
    """JOB: a job file path, a name under jobs/ (`openmeva`), or a Job already loaded."""
    models: tuple[str, ...] = ()
    """--model: judge model specs replacing the job's judges (generators stay)."""
    base_url: str | None = None
    """--base-url: the OpenAI-compatible endpoint of bare model names [env OPENAI_BASE_URL]."""
    limit: int | None = None
    """--limit: only the first N items of each data set, in file order."""
    sample: int | None = None
    """--sample: N items of each data set drawn at random, whole groups at a time."""
    seed: int | None = None
    """--seed: the seed of the --sample draw (default 0); not the job's `seed`, which is the
    bootstrap's."""
    out: Path | None = None
    """--out: the report folder [default: the job's output_dir, runs/<job>]."""
    shard: Shard | None = None
    """--shard I/N (`judge run`): only shard I of N of the tasks."""

    def __post_init__(self) -> None:
        CacheLocation.__post_init__(self)
        if isinstance(self.models, str):  # runner.run(job, models="gpt-4o-mini"): one model
            object.__setattr__(self, "models", (self.models,))
        elif not isinstance(self.models, tuple):
            object.__setattr__(self, "models", tuple(str(m) for m in self.models))
        if self.out is not None and not isinstance(self.out, Path):
            object.__setattr__(self, "out", Path(self.out))
        if isinstance(self.shard, str):
            object.__setattr__(self, "shard", Shard.parse(self.shard))
        if self.sample is not None and self.limit is not None:
            raise ConfigError("--limit and --sample choose the items two ways; give one")
        if self.seed is not None and self.sample is None:
            raise ConfigError(f"--seed {self.seed} is the seed of the --sample draw: give "
                              "--sample N with it (the job's `seed` is the bootstrap's)")

    def job_name(self) -> str:
        """The job as given, for messages and the manifest (a Job: its file)."""
        return str(self.job.path) if isinstance(self.job, Job) else os.fspath(self.job)

    def drawn(self) -> tuple[int, int] | None:
        """(N, seed) of the --sample draw, or None without --sample."""
        return None if self.sample is None else (self.sample, self.seed or 0)

    def recorded(self) -> dict[str, Any]:
        """The selection as JSON for the manifest (`selection`): every field, a cache URL and
        a base URL without their passwords."""
        return {"job": self.job_name(), "models": list(self.models),
                "base_url": None if self.base_url is None else redact_url(self.base_url),
                "limit": self.limit, "sample": self.sample, "seed": self.seed,
                **CacheLocation.recorded(self),
                "out": None if self.out is None else str(self.out),
                "shard": None if self.shard is None else str(self.shard)}

    def arguments(self, *, shard: bool = True) -> list[str]:
        """The selection as a `judge` command line's JOB and options (URLs without their
        passwords); `shard` False leaves --shard out (the rescore that follows shards).

        Args:
            shard: keep --shard.

        Returns:
            The words of the command line after `judge COMMAND`.
        """
        words = [self.job_name()]
        for spec in self.models:
            words += ["--model", spec]
        for name, value in (("--base-url", self.base_url and redact_url(self.base_url)),
                            ("--limit", self.limit), ("--sample", self.sample),
                            ("--seed", self.seed)):
            words += [] if value is None else [name, str(value)]
        words += CacheLocation.arguments(self)
        words += [] if self.out is None else ["--out", str(self.out)]
        return words + ([] if self.shard is None or not shard else ["--shard", str(self.shard)])


def rating_queue(items: Iterable[Item], aspects: Sequence[str], ratings: Iterable[Rating],
                 annotator: str, *, seed: int = 0) -> list[tuple[Item, tuple[str, ...]]]:
    """What an annotator rates next: whole groups in the order of the `--sample N --seed S`
    draw, so the first few hundred ratings cover whole groups (a sample-level correlation
    needs every system of a group rated) and are the items `--sample` would judge.

    Args:
        items: One data set's items, in file order.
        aspects: The aspects to rate.
        ratings: The ratings so far (runner.data.annotations.read_ratings).
        annotator: Who rates: what they rated or skipped is left out.
        seed: The --seed of the draw (0, as --sample's default).

    Returns:
        (item, the aspects it still needs from this annotator), in rating order; items with
        none left are not listed.
    """
    done = rated(ratings, annotator)
    queue = []
    for group in drawn_groups(items, seed):
        for item in group:
            left = tuple(a for a in aspects if (item.item_id, a) not in done)
            if left:
                queue.append((item, left))
    return queue
