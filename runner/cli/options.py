"""The options every command shares, declared once, each set collected into one value:
`task_selection` (a TaskSelection) and `cache_location` (a CacheLocation, for the commands
without a job). A new selection option is declared here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from runner import api
from runner.errors import ConfigError
from runner.selection import CacheLocation, TaskSelection

__all__ = ["CACHE_OPTIONS", "PARTIAL_HELP", "SELECTION_OPTIONS",
           "UsageError", "cache_location", "data_dir", "resolve", "task_selection"]

PARTIAL_HELP = ("Exit 0 although some tasks have no cached answer (the reports leave them "
                "out); without it that is exit 1, e.g. after shards that did not all run.")

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


# views: the same command line is accepted, but only JOB and --out say where the reports are
_IGNORED_HELP = "Accepted as every command takes it; the report folder does not depend on it."


class UsageError(click.ClickException):
    """A RunnerError as one `Error:` line; exit 2 for job, data and configuration errors."""

    exit_code = 2


def data_dir() -> Path:
    """The data sets' folder: JUDGE_DATA_DIR, else ~/.cache/judge-runner/data.

    Returns:
        The folder (it may not exist yet).
    """
    return Path(os.environ.get("JUDGE_DATA_DIR") or api.DEFAULT_DATA_DIR)


def _option(*decls: str, ignored: bool = False, **attrs: Any) -> Decorator:
    """click.option, its help _IGNORED_HELP where the command does not use the option."""
    return click.option(*decls, **{**attrs, **({"help": _IGNORED_HELP} if ignored else {})})


def _cache_options(ignored: bool = False) -> list[Decorator]:
    return [
        _option("--cache-dir", metavar="DIR", ignored=ignored,
                help="Response cache folder [env JUDGE_CACHE_DIR; default ./cache]."),
        _option("--cache", "cache_url", metavar="URL", ignored=ignored,
                help="Shared PostgreSQL cache instead of --cache-dir, e.g. "
                     "postgresql://judge@db.lab:5432/judge [env JUDGE_CACHE_URL]."),
    ]


def _selection_options(ignored: bool = False) -> list[Decorator]:
    return [
        _option("--model", "models", multiple=True, metavar="SPEC", ignored=ignored,
                help="Judge model, replacing the job's: openai:NAME, anthropic:NAME, "
                     "gemini:NAME, azure:DEPLOYMENT (with --base-url RESOURCE_URL), local:NAME, "
                     "or a NAME served at --base-url. Repeatable, e.g. --model "
                     "anthropic:claude-3-5-haiku-latest --model openai:gpt-4o-mini."),
        _option("--base-url", metavar="URL", ignored=ignored,
                help="OpenAI-compatible endpoint for bare model names, e.g. "
                     "http://127.0.0.1:8000/v1 [env OPENAI_BASE_URL]."),
        _option("--limit", type=click.IntRange(min=1), metavar="N", ignored=ignored,
                help="Only the first N items of each data set, in file order."),
        _option("--sample", type=click.IntRange(min=1), metavar="N", ignored=ignored,
                help="N items of each data set drawn at random, whole groups at a time (a "
                     "pilot study); the same draw on every command with the same --seed, e.g. "
                     "--sample 50 --seed 1."),
        _option("--seed", type=int, metavar="S", ignored=ignored,
                help="Seed of the --sample draw [default 0] (the job's `seed` is the "
                     "bootstrap's)."),
        *_cache_options(ignored),
        click.option("--out", metavar="DIR",
                     help="Report folder [default: the job's output_dir, runs/<job>]."),
    ]


_SHARD_OPTION = click.option(
    "--shard", metavar="I/N",
    help="Run only shard I of N (0-based) against a shared --cache: the items whose data "
         "set and group hash to I, whole groups, the others never rendered; rpm/tpm of "
         "the job are divided by N (--rpm/--tpm are this shard's own). Then build the "
         "reports once with `judge rescore`. A request that items of two shards both "
         "render is paid twice only if both shards look it up before either has stored "
         "its answer; a shard cannot count these (`judge plan` counts all repeats). E.g. "
         "--shard 0/4.")


CACHE_OPTIONS = tuple(f.name for f in dataclasses.fields(CacheLocation))
"""The parameter names `cache_location` collects: CacheLocation's fields."""
SELECTION_OPTIONS = tuple(f.name for f in dataclasses.fields(TaskSelection) if f.name != "shard")
"""The parameter names `task_selection` collects (and `shard` where asked): TaskSelection's
fields, each an option above (or JOB)."""


def _collected(f: Callable[..., Any], options: list[Decorator], names: tuple[str, ...],
               into: str, build: Callable[..., Any]) -> Callable[..., Any]:
    """`f` with `options` added, their values (parameters `names`) handed to it as one value,
    build(**values), in its parameter `into`."""
    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in names}
        return f(*args, **{into: build(**values)}, **kwargs)

    decorated: Callable[..., Any] = command
    for option in reversed(options):
        decorated = option(decorated)
    return decorated


def cache_location(f: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: the cache options, handed to the command as `cache_location: CacheLocation`.

    Args:
        f: the command function, taking a `cache_location` parameter.

    Returns:
        The function with --cache-dir and --cache, for click.command.
    """
    return _collected(f, _cache_options(), CACHE_OPTIONS, "cache_location", CacheLocation)


def task_selection(*, shard: bool = False, job_required: bool = True,
                   report_folder_only: bool = False) -> Decorator:
    """Decorator: JOB and the task-selection options, handed to the command as one
    `task_selection: TaskSelection`.

    Args:
        shard: also --shard I/N (`judge run`).
        job_required: False: JOB may be left out (`judge cache check`); the command then gets
            a CacheLocation, and a selection option given without JOB is an error.
        report_folder_only: the command reads only the report folder (`judge view`, `runs`,
            `diff`): the other options are accepted, so one command line serves every
            command, and their help says they change nothing.

    Returns:
        The decorator, for a function taking a `task_selection` parameter.
    """
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        options: list[Decorator] = [click.argument("job", required=job_required),
                                    *_selection_options(ignored=report_folder_only)]
        names: tuple[str, ...] = SELECTION_OPTIONS
        if shard:
            options.append(_SHARD_OPTION)
            names += ("shard",)
        return _collected(f, options, names, "task_selection", _selected)
    return decorate


def _selected(job: str | None, **given: Any) -> TaskSelection | CacheLocation:
    """The value the options chose: a TaskSelection, or without JOB the cache location."""
    if job is not None:
        return TaskSelection(job=job, **given)
    for name, value in given.items():
        if name not in CACHE_OPTIONS and value not in (None, ()):
            flag = "--" + ("model" if name == "models" else name.replace("_", "-"))
            raise ConfigError(f"{flag} chooses a job's tasks: give JOB with it")
    return CacheLocation(**{name: given[name] for name in CACHE_OPTIONS})


def resolve(chosen: TaskSelection, *, stream: bool = False,
            download: api.Download | None = None) -> api.WorkingSet:
    """The WorkingSet a command works on, from its task selection and the environment.

    Args:
        chosen: the command's task selection; stream, download: as for api.selection.

    Returns:
        The WorkingSet (runner.api.selection's).
    """
    return api.selection(chosen, data_dir=data_dir(), stream=stream, download=download)
