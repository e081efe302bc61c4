"""The `judge` command group: its commands registered, its errors mapped, the console entry.

The only package that imports click, reads the environment, prints or exits is runner.cli; the
commands live by theme: runcmd (run), studycmds (rescore, report, plan, status, compare,
import), cachecmds (cache ...), batches, views (view, runs, diff), and the options they share
(options: the task selection, declared once).

Exit codes: 0 all tasks done, 1 some tasks failed (listed), 2 usage or configuration error,
130 interrupted by Ctrl-C, 143 stopped by SIGTERM (rerun the same command to resume).
"""

from __future__ import annotations

import gc
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any

import click

from runner.children import one_process
from runner.cli import TERM_EXIT, Terminated, studycmds, views
from runner.cli.batches import batches
from runner.cli.cachecmds import cache
from runner.cli.initcmd import init
from runner.cli.options import UsageError, data_dir
from runner.cli.outcome import command_line
from runner.cli.ratingcmds import ratings
from runner.cli.runcmd import run
from runner.cli.servecmd import serve
from runner.data import datasets
from runner.data.annotations import RatingsWarning
from runner.errors import ConfigError, DataError, RunnerError, scrub
from runner.execute.store import claimtable, deadline

__all__ = ["cli", "main"]


def _processes(environ: Mapping[str, str]) -> None:
    """JUDGE_PROCESSES=1: every command in one process (runner.children)."""
    value = environ.get("JUDGE_PROCESSES", "").strip()
    if value not in ("", "1"):
        raise ConfigError(f"JUDGE_PROCESSES must be 1 (every command in one process) or unset "
                          f"(got {value!r})")
    one_process(value == "1")


def _seconds(environ: Mapping[str, str]) -> None:
    """JUDGE_CLAIM_TTL_S: how long a killed run's claims on keys outlive it (runner.execute.
    claims; tests make it short). JUDGE_PG_WAIT_S: how long a run waits for its PostgreSQL
    cache server when it goes away (runner.execute.store.pgsession)."""
    for name, least, default, setter in (
            ("JUDGE_CLAIM_TTL_S", 0.3, claimtable.TTL_S, claimtable.set_ttl),
            ("JUDGE_PG_WAIT_S", 1.0, deadline.WAIT_S, deadline.set_wait)):
        value = environ.get(name, "").strip()
        if not value:
            continue
        try:
            seconds = float(value)
        except ValueError:
            seconds = 0.0
        if not least <= seconds <= 86400:
            raise ConfigError(f"{name} must be seconds between {least:g} and 86400 (got "
                              f"{value!r}); unset it for the default, {default:g}")
        setter(seconds)


class _JudgeGroup(click.Group):
    """The `judge` group: a RunnerError becomes one `Error:` line (exit 2), Ctrl-C or SIGTERM
    while no pool runs the resume line (exit 130 or 143)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            _processes(os.environ)
            _seconds(os.environ)
            return super().invoke(ctx)
        except RunnerError as exc:
            raise UsageError(scrub(str(exc))) from None
        except KeyboardInterrupt as exc:
            command = command_line()
            term = isinstance(exc, Terminated)
            click.echo(f"{'terminated' if term else 'interrupted'}; rerun to resume: {command}",
                       err=True)
            sys.exit(TERM_EXIT if term else 130)


@click.group(cls=_JudgeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="judge-runner")
def cli() -> None:
    """Run LLM-as-a-judge studies: cached, rate-limited, resumable judge calls, and reports
    that correlate the judges with human ratings.

    \b
    A job file (jobs/NAME.toml) names data sets, prompts, judge models and limits:
      judge plan openmeva          tasks, cache hits, estimated tokens and cost (no network)
      judge run openmeva           call what is missing, then write runs/openmeva/
      judge rescore openmeva       re-parse cached answers and rewrite reports (no network)
    Rerunning `judge run` after a crash or Ctrl-C calls the API only for what is missing.
    """


for command in (run, studycmds.rescore, studycmds.plan, studycmds.status, studycmds.compare,
                studycmds.report, studycmds.import_, batches, views.view, views.runs, views.diff,
                serve, cache, init, ratings):
    cli.add_command(command)


@cli.group("datasets")
def datasets_group() -> None:
    """List, download and verify the registered data sets [env JUDGE_DATA_DIR]."""


@datasets_group.command("list")
def datasets_list() -> None:
    """Registered data sets and whether their files are present."""
    for name, info in sorted(datasets.REGISTRY.items()):
        states = {state for _, state in datasets.verify(name, data_dir())} if info.files else {}
        state = "ok" if states == {"ok"} else ", ".join(sorted(states)) or "-"
        click.echo(f"{name:<16} {state:<10} {info.description}")


@datasets_group.command("fetch")
@click.argument("names", nargs=-1, required=True)
def datasets_fetch(names: tuple[str, ...]) -> None:
    """Download NAMES from their upstream URLs into JUDGE_DATA_DIR and check each sha256."""
    for name in names:
        for path in datasets.fetch(name, data_dir(), mirror=os.environ.get("JUDGE_DATA_MIRROR")):
            click.echo(f"{name}: {path}")


@datasets_group.command("verify")
@click.argument("names", nargs=-1, required=True)
def datasets_verify(names: tuple[str, ...]) -> None:
    """Check the sha256 of every file of NAMES; exit 2 if any is missing or differs."""
    bad = 0
    for name in names:
        for path, state in datasets.verify(name, data_dir()):
            click.echo(f"{name}: {path}: {state}")
            bad += state != "ok"
    if bad:
        raise DataError(f"{bad} file(s) missing or corrupt: run `judge datasets fetch "
                        f"{' '.join(names)}`")


def _show_warning(message: Warning | str, category: type[Warning], *args: Any,
                  **kwargs: Any) -> None:
    """A RatingsWarning as one `warning:` line; any other warning as Python shows it."""
    if issubclass(category, RatingsWarning):
        click.echo(f"warning: {message}", err=True)
    else:
        _PYTHON_SHOW(message, category, *args, **kwargs)


_PYTHON_SHOW = warnings.showwarning


def main() -> None:
    """Console entry point."""
    warnings.showwarning = _show_warning
    # A job holds hundreds of thousands of small long-lived objects (items, tasks, judgments)
    # and makes few cycles: at the default thresholds the collector rescans them all the
    # time (a fully cached 100k-task run: 7.7 s -> 6.0 s with these).
    gc.set_threshold(100_000, 50, 100)
    # numpy's and scipy's OpenBLAS each start a thread per core, which spin between calls:
    # on a 2-core machine they took as much CPU again as the reports' own work, and a
    # process with threads cannot fork a report onto the other core (runner.report.aside).
    # The bootstrap's matrix products gained nothing from them. A user's setting stands.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        cli()
    finally:
        # The process ends here: the collector's last full pass over everything a large run
        # still holds (~0.05 s at 100k tasks) would find nothing to free. atexit handlers and
        # module teardown still run.
        gc.freeze()
