"""How a command that wrote reports ends: its counts, failures and result, and its exit code.

Shared by `judge run` (runner/cli/runcmd.py) and the commands that rebuild the reports from the
cache (rescore, report, import: runner/cli/studycmds.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from runner import api
from runner.cli import TERM_EXIT
from runner.cli.options import UsageError
from runner.errors import scrub

if TYPE_CHECKING:
    from runner.execute.stats import RunStats
    from runner.report.headline import Headline

__all__ = ["command_line", "counts", "exit_interrupted", "rebuild_reports", "summarise"]


def command_line() -> str:
    """This process's command line as `judge ...` (for resume lines and the manifest).

    Returns:
        `judge` and the arguments it was given, scrubbed: a password or token in a URL of it
        (`--cache postgresql://user:PASSWORD@...`) is masked, any key removed.
    """
    return scrub(" ".join(["judge", *sys.argv[1:]]))


def counts(stats: RunStats) -> str:
    """`N tasks: ... cached, ... called, ...`: the five counts add up to N.

    Args:
        stats: a run's (or a rebuild's) counters.

    Returns:
        The line, without a newline.
    """
    return (f"{stats.total} tasks: {stats.cache_hits} cached, {stats.api_calls} called, "
            f"{stats.duplicates} repeat an earlier task, {len(stats.failures)} failed, "
            f"{len(stats.missing)} not run ({stats.retries} retries)")


def stopped(stats: RunStats, command: str) -> UsageError:
    """The error of a run that stopped on a fatal error (an endpoint not there, a refused key).

    Args:
        stats: the run's counters (`fatal` set); command: the one that ran, which resumes.

    Returns:
        The error to raise (exit 2): the message, and the command that resumes once the cause
        is fixed.
    """
    return UsageError(f"{stats.fatal}; run stopped, nothing lost: rerun to resume: {command}")


def exit_interrupted(stats: RunStats, command: str) -> None:
    """Print the resume line, then exit 143 after SIGTERM, 130 after Ctrl-C.

    Args:
        stats: the interrupted run's counters (`missing`, `terminated`); command: as for
            `stopped`.
    """
    word = "terminated" if stats.terminated else "interrupted"
    click.echo(f"{word}: {len(stats.missing)} tasks left; rerun to resume: {command}", err=True)
    sys.exit(TERM_EXIT if stats.terminated else 130)


def summarise(sel: api.WorkingSet, stats: RunStats, command: str, partial: bool = False,
              result: Headline | None = None) -> None:
    """The end of a command that wrote reports: counts, failures, the study's result (the
    correlations, last), and the exit code.

    Args:
        sel: the selection reported on (its report folder is named).
        stats: the counters.
        command: the command line, for the resume line after an interrupt.
        partial: tasks without an answer still make exit 0 (--partial, or online runs).
        result: the reports' headline; None before any report.

    Exits 1 when a task failed, when a judge has answers and not one parsed score, when a judge
    gives one score to (nearly) all its answers (no spread), or when some
    tasks have no answer and the caller did not accept a `partial` report; 2 (UsageError) when
    the run stopped on a fatal error; returns otherwise.
    """
    echo = click.echo
    echo(f"{counts(stats)}; {stats.prompt_tokens + stats.completion_tokens} tokens, "
         f"{stats.cost_text(api.unpriced_model(sel.job))}",
         err=True)
    if stats.fatal:  # before any report: those of a run that could not run are not kept
        raise stopped(stats, command)
    echo(f"reports: {sel.out_dir}/", err=True)
    for key, reason in list(stats.failures.items())[:20]:
        echo(f"failed {key[:12]}: {scrub(reason)}", err=True)
    if len(stats.failures) > 20:
        echo(f"... and {len(stats.failures) - 20} more (see judgments.jsonl)", err=True)
    if stats.budget_stopped:
        echo(f"--budget reached: {len(stats.missing)} tasks not run", err=True)
    elif stats.until_ci and stats.missing and not stats.interrupted:
        echo(f"--until-ci: {len(stats.missing)} tasks not run (their judges' CIs were narrow "
             "enough); `judge run` without --until-ci judges them", err=True)
    elif stats.missing and not stats.interrupted:
        first = list(dict.fromkeys(k[:12] for k in stats.missing))[:5]
        echo(f"{len(stats.missing)} of {stats.total} tasks have no cached answer, and the "
             f"reports leave them out: `judge run` calls them"
             f"{'' if partial else ', or pass --partial to accept a partial report'} "
             f"(first keys: {', '.join(first)})", err=True)
    if stats.interrupted:
        exit_interrupted(stats, command)
    for line in (result.lines + result.battles + stats.until_ci + result.unparsed
                 + result.no_spread + result.warnings) if result else stats.until_ci:
        echo(line, err=True)
    if stats.failures or (stats.missing and not partial and not stats.budget_stopped) or \
            (result and (result.scoreless or result.no_spread)):
        sys.exit(1)


def rebuild_reports(sel: api.WorkingSet, started: float,
                    then: Callable[[], None] = lambda: None, partial: bool = False) -> None:
    """Reports from the cache alone (rescore, report, import), then the summary.

    Args:
        sel: the selection to report on.
        started: when the command started (seconds since the epoch).
        then: runs once the reports are written, before the summary (which may exit).
        partial: as for `summarise`.
    """
    command = command_line()
    stats, tables = api.rebuild(sel, started=started, command=command)
    then()
    summarise(sel, stats, command, partial, tables.headline)
