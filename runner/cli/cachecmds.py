"""`judge cache`: stats, check, explain, and export|import between folders, PostgreSQL and
JSONL archives. Registered on the group in runner/cli/main.py.

`--cache URL` (or JUDGE_CACHE_URL) points every command at a PostgreSQL cache instead of the
`--cache-dir` folder (both declared once, in runner/cli/options.py).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import click
import orjson

from runner.api import WorkingSet, all_tasks, open_selected
from runner.cli.options import cache_location, resolve, task_selection
from runner.errors import ConfigError, redact_url
from runner.execute.store.backend import CacheBackend, is_url, open_cache
from runner.execute.store.cache import Cache
from runner.execute.transfer import (
    copy_cache,
    is_archive,
    load_archive,
    write_archive,
)
from runner.selection import DEFAULT_CACHE_DIR, CacheLocation, TaskSelection

__all__ = ["cache", "job_keys"]


@click.group()
def cache() -> None:
    """Inspect the response cache; copy it between folders, PostgreSQL and JSONL archives."""


def _open_other(location: str) -> CacheBackend:
    if not is_url(location) and not Path(location).is_dir():
        raise ConfigError(f"{location}: no cache folder here; pass a cache folder, a "
                          "postgresql:// URL or a .jsonl / .jsonl.gz archive")
    return open_cache(location, read_only=True)


def _shown_other(location: str) -> str:
    """Another cache's location as given (a URL without its password)."""
    return redact_url(location) if is_url(location) else location


@cache.command("export")
@click.argument("dest")
@cache_location
def export_command(dest: str, cache_location: CacheLocation) -> None:
    """Copy the cache to DEST: a .jsonl or .jsonl.gz archive, a folder, or a PostgreSQL URL.

    Keys DEST has already are left as they are. To publish a study's answers next to its
    paper: `judge cache export --cache-dir cache study-answers.jsonl.gz`; to fill a shared
    database from a laptop's cache: `judge cache export postgresql://judge@db.lab/judge`.
    """
    here = cache_location.with_environment(os.environ)
    with open_cache(here.location(), read_only=True) as src:
        if is_archive(dest):
            written = write_archive(src, Path(dest))
            click.echo(f"exported {written} records from {here.shown()} to {dest}", err=True)
            return
        if not is_url(dest):
            Path(dest).mkdir(parents=True, exist_ok=True)
        with open_cache(dest) as dst:
            stats = copy_cache(src, dst)
    click.echo(f"exported {stats.copied} records from {here.shown()} to {_shown_other(dest)} "
               f"({stats.already} already there)", err=True)


@cache.command("import")
@click.argument("source")
@cache_location
def import_command(source: str, cache_location: CacheLocation) -> None:
    """Load SOURCE into the cache: a .jsonl / .jsonl.gz archive, a folder or a PostgreSQL URL.

    Keys the cache has already are left as they are. An archive is checked line by line before
    anything is stored. A reader of a paper: `judge cache import study-answers.jsonl.gz`, then
    `judge rescore JOB` rebuilds the study's reports without a single API call.
    """
    here = cache_location.with_environment(os.environ)
    with open_cache(here.location()) as dst:
        if is_archive(source):
            stats = load_archive(Path(source), dst)
        else:
            with _open_other(source) as src:
                stats = copy_cache(src, dst)
    click.echo(f"imported {stats.copied} records from {_shown_other(source)} into {here.shown()} "
               f"({stats.already} already there)", err=True)


@cache.command("stats")
@cache_location
def cache_stats(cache_location: CacheLocation) -> None:
    """Entries and size of the cache."""
    here = cache_location.with_environment(os.environ)
    if here.cache_url is None and not Path(here.location()).exists():
        raise ConfigError(f"{here.shown()}: no cache here; pass --cache-dir or set "
                          "JUDGE_CACHE_DIR")
    with open_cache(here.location(), read_only=True) as c:
        s = c.stats()
    click.echo(f"{here.shown()}: {s['entries']} entries, {s['bytes'] / 1e6:.1f} MB")


@cache.command("check")
@task_selection(job_required=False)
@click.option("--drop", is_flag=True,
              help="Remove the damaged records: the next `judge run` asks them again.")
def cache_check(task_selection: TaskSelection | CacheLocation, drop: bool) -> None:
    """List the records of the cache folder that are damaged on disk (JOB's, or all of them).

    A damaged record fails its task in `judge run` and `judge rescore` ("cached answer
    unreadable"); the other tasks go on. --drop removes them, e.g.
    `judge cache check openmeva --drop`, then `judge run openmeva` asks them again. Exit 1
    when damaged records are left in the folder.
    """
    if task_selection.cache_url is not None:
        raise ConfigError("cache check: only a cache folder (--cache-dir) is checked; drop "
                          "--cache")
    path = task_selection.cache_dir or Path(os.environ.get("JUDGE_CACHE_DIR") or DEFAULT_CACHE_DIR)
    if not (path / "cache.db").exists():
        raise ConfigError(f"{path}: no cache here; pass --cache-dir or set JUDGE_CACHE_DIR")
    keys = None
    if isinstance(task_selection, TaskSelection):
        keys = job_keys(resolve(task_selection))
    with Cache(path, read_only=not drop) as c:
        found = list(c.damaged(keys))
        for key, why in found:
            click.echo(f"damaged {key}: {why}")
        if drop:
            c.drop([key for key, _ in found])
    done = "dropped; `judge run` asks them again" if drop else "--drop removes them"
    click.echo(f"{path}: {len(found)} damaged records" + (f" ({done})" if found else ""),
               err=True)
    if found and not drop:
        sys.exit(1)


def job_keys(sel: WorkingSet) -> list[str]:
    """The selection's distinct cache keys, in task order (generation stage first).

    Returns:
        The keys, each once.
    """
    return list(dict.fromkeys(t.key for t in all_tasks(sel.expansion)))


@cache.command("explain")
@task_selection()
@click.option("--item", "item_id", required=True, help="Item id, as in judgments.jsonl.")
def cache_explain(task_selection: TaskSelection, item_id: str) -> None:
    """Print each task of one item: the parts of its cache key, the key, and whether it is cached.

    Two runs that should share answers but don't: compare these lines between them.
    """
    sel = resolve(task_selection)
    found = False
    with open_selected(sel, read_only=True) as c:
        endpoints = {m.name: m.endpoint for m in sel.job.models}
        for task in sel.expansion.tasks():
            if task.item_id != item_id:
                continue
            found = True
            body = orjson.loads(task.body)
            params = {k: v for k, v in body.items() if k not in ("messages", "model")}
            click.echo(f"{task.dataset} {task.item_id} prompt={task.prompt} aspect={task.aspect} "
                       f"model={task.model} sample={task.sample}")
            click.echo(f"  endpoint: {endpoints[task.model]}")
            click.echo(f"  model:    {body['model']}")
            click.echo(f"  params:   {orjson.dumps(params, option=orjson.OPT_SORT_KEYS).decode()}")
            digest = hashlib.sha256(orjson.dumps(body["messages"])).hexdigest()[:16]
            click.echo(f"  messages: {len(body['messages'])}, sha256 {digest}")
            click.echo(f"  key:      {task.key}  {'cached' if task.key in c else 'NOT cached'}")
    if not found:
        raise ConfigError(f"{sel.job.path}: no task has item id {item_id!r} (ids look like "
                          f"{next(iter(sel.expansion.index.values())).item_id!r})")
