"""The shared-cache options and `judge cache export|import`, registered by runner/cli/main.py.

`--cache URL` (or JUDGE_CACHE_URL) points every command at a PostgreSQL cache instead of the
`--cache-dir` folder. The option is stored in the click context rather than passed to each
command, so the commands' signatures stay as they are.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from runner.errors import ConfigError
from runner.execute.store.backend import CacheBackend, checked_url, is_url, open_cache, redact
from runner.execute.transfer import (
    copy_cache,
    is_archive,
    load_archive,
    write_archive,
)

__all__ = ["cache_option", "cache_url", "export_command", "import_command"]

CACHE_HELP = ("Shared PostgreSQL cache instead of --cache-dir, e.g. "
              "postgresql://judge@db.lab:5432/judge [env JUDGE_CACHE_URL].")


def _remember(ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta["judge_cache_url"] = value


# `--cache URL`, kept in the context for cache_url().
cache_option = click.option("--cache", "cache_url", metavar="URL", expose_value=False,
                            callback=_remember, help=CACHE_HELP)


def cache_url() -> str | None:
    """--cache, else JUDGE_CACHE_URL, else None (the diskcache folder); checked."""
    ctx = click.get_current_context(silent=True)
    return checked_url((ctx.meta.get("judge_cache_url") if ctx else None)
                       or os.environ.get("JUDGE_CACHE_URL"))


def _here(cache_dir: str | None) -> str | Path:
    return cache_url() or Path(cache_dir or os.environ.get("JUDGE_CACHE_DIR") or "cache")


def _other(location: str) -> CacheBackend:
    if not is_url(location) and not Path(location).is_dir():
        raise ConfigError(f"{location}: no cache folder here; pass a cache folder, a "
                          "postgresql:// URL or a .jsonl / .jsonl.gz archive")
    return open_cache(location, read_only=True)


def _shown(location: str | Path) -> str:
    return redact(location) if isinstance(location, str) else str(location)


@click.command("export")
@click.argument("dest")
@click.option("--cache-dir", help="Response cache folder [env JUDGE_CACHE_DIR; default ./cache].")
@cache_option
def export_command(dest: str, cache_dir: str | None) -> None:
    """Copy the cache to DEST: a .jsonl or .jsonl.gz archive, a folder, or a PostgreSQL URL.

    Keys DEST has already are left as they are. To publish a study's answers next to its
    paper: `judge cache export --cache-dir cache study-answers.jsonl.gz`; to fill a shared
    database from a laptop's cache: `judge cache export postgresql://judge@db.lab/judge`.
    """
    here = _here(cache_dir)
    with open_cache(here, read_only=True) as src:
        if is_archive(dest):
            written = write_archive(src, Path(dest))
            click.echo(f"exported {written} records from {_shown(here)} to {dest}", err=True)
            return
        if not is_url(dest):
            Path(dest).mkdir(parents=True, exist_ok=True)
        with open_cache(dest) as dst:
            stats = copy_cache(src, dst)
    click.echo(f"exported {stats.copied} records from {_shown(here)} to {_shown(dest)} "
               f"({stats.already} already there)", err=True)


@click.command("import")
@click.argument("source")
@click.option("--cache-dir", help="Response cache folder [env JUDGE_CACHE_DIR; default ./cache].")
@cache_option
def import_command(source: str, cache_dir: str | None) -> None:
    """Load SOURCE into the cache: a .jsonl / .jsonl.gz archive, a folder or a PostgreSQL URL.

    Keys the cache has already are left as they are. An archive is checked line by line before
    anything is stored. A reader of a paper: `judge cache import study-answers.jsonl.gz`, then
    `judge rescore JOB` rebuilds the study's reports without a single API call.
    """
    here = _here(cache_dir)
    with open_cache(here) as dst:
        if is_archive(source):
            stats = load_archive(Path(source), dst)
        else:
            with _other(source) as src:
                stats = copy_cache(src, dst)
    click.echo(f"imported {stats.copied} records from {_shown(source)} into {_shown(here)} "
               f"({stats.already} already there)", err=True)
