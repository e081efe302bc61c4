"""The batch side of `judge run` (--batch, mode = "batch"), and the `judge batches` command.

`batch_stage` runs before the online pool: it settles the ledger, submits what misses the
cache for the batch-mode models, and (unless --no-wait) polls and collects. It returns the keys
the online pool must leave alone: those still in a live batch, and failed ones unless
--batch-fallback online hands them to the pool.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click

from runner.api import WorkingSet, derive, key_reader, open_selected, run_async
from runner.cli.options import resolve, task_selection
from runner.errors import ConfigError, scrub
from runner.execute.ledger import FILES, BatchLedger, Ledger
from runner.execute.store.backend import CacheBackend
from runner.job.providers import row
from runner.job.spec import Job
from runner.selection import TaskSelection

if TYPE_CHECKING:
    from runner.execute.batch import BatchOptions, Provider
    from runner.execute.batch_collect import BatchStats
    from runner.execute.stats import RunStats

# runner.execute.batch (and with it aiohttp: 0.51 s to import after runner.cli.main, this 2-core
# box, loaded) is imported by the functions that run batches, not here: every `judge` command
# imports this module to register `judge batches`.
MAX_BATCH_REQUESTS = 50_000
"""runner.execute.batch_files.MAX_REQUESTS (tests/test_batch.py checks): the --batch-size limit."""

__all__ = ["MAX_BATCH_REQUESTS", "Batched", "batch_models", "batch_stage", "batches", "merge"]


def batch_models(job: Job, everyone: bool) -> tuple[str, ...]:
    """The models whose tasks go through a Batch API.

    Args:
        everyone: --batch: every model; else those with mode = "batch".

    Returns:
        Their names.

    Raises:
        ConfigError: such a model has no Batch API (local) or one not supported yet.
    """
    names = []
    for m in job.models:
        if not (everyone or m.mode == "batch"):
            continue
        if m.kind == "local":
            raise ConfigError(f"{job.path}: model {m.name!r} ({m.spec}) is a local model, which "
                              "has no Batch API: drop --batch and set mode = \"batch\" only on "
                              "API models")
        if not row(m.kind).batch:
            raise ConfigError(f"{job.path}: model {m.name!r} ({m.spec}): batch mode is not yet "
                              f"supported for {m.kind} models (only openai:, anthropic: and "
                              "OpenAI-compatible ones); run it online (drop --batch / mode)")
        names.append(m.name)
    return tuple(names)


def _providers(job: Job, names: tuple[str, ...]) -> dict[str, Provider]:
    from runner.execute.batch import Provider  # 0.51 s (see the top)
    read = key_reader(os.environ)  # each key read at call time, never stored
    return {m.name: Provider(model=m, base_url=m.base_url or "", api_key=read(m.api_key_env))
            for m in job.models if m.name in names}


@dataclass(slots=True)
class Batched:
    """The batch stage's outcome for the rest of `judge run`."""

    stats: BatchStats
    sel: WorkingSet
    in_batches: frozenset[str]
    """Keys the online pool must not call: in a live batch, or failed by one (unless
    --batch-fallback online)."""


def _open_ledger(sel: WorkingSet) -> BatchLedger:
    """The batch ledger beside the selection's answers, to open with `with`: in the PostgreSQL
    database of a `--cache` URL (request files then kept in the local cache folder), else in
    the cache folder."""
    if sel.cache_url:  # a postgresql:// URL: api.selection checked it
        from runner.execute.pgledger import PgLedger  # psycopg, 0.10 s: PostgreSQL only
        return PgLedger(sel.cache_url, sel.cache_dir / FILES)
    return Ledger(sel.cache_dir)


def _run_batches(sel: WorkingSet, names: tuple[str, ...], options: BatchOptions,
                 opened: Callable[[], AbstractContextManager[CacheBackend]]) -> Batched:
    """The batch stage of the models `names` on the cache opened(): the generation stage, then
    the judges (over what the generators have answered so far), each through the providers'
    Batch APIs."""
    from runner.execute.batch import BatchRun  # 0.51 s (see the top)
    from runner.execute.batch_collect import BatchStats  # imported with batch (above)
    stats = BatchStats()

    def say(line: str) -> None:
        click.echo(f"batch: {line}", err=True)

    with opened() as cache, _open_ledger(sel) as ledger:
        run = BatchRun(cache=cache, ledger=ledger, providers=_providers(sel.job, names),
                       job=sel.job.name, options=options, say=say, stats=stats, shard=sel.shard)
        if sel.job.generate:
            run_async(run.run(sel.expansion.generation_tasks()))
            sel = derive(sel)
        run_async(run.run(sel.expansion.tasks()))
    say(f"{len(stats.created)} batch(es) made this run, {stats.attached} from earlier runs; "
        f"{len(stats.collected)} answers collected, {len(stats.failures)} failed, "
        f"{len(stats.pending)} pending; " + (
            "cost unknown (no price for the model)" if stats.unpriced and not stats.cost else
            f"~${stats.cost:.4f} at the batch price" + (" + unknown" if stats.unpriced else "")))
    in_batches = set(stats.pending)
    if options.fallback == "batch":
        in_batches |= set(stats.failures)
    if stats.pending:
        say(f"{len(stats.pending)} requests are in open batches; `judge run {sel.job.path} "
            "--batch` collects them when they are done (`judge batches` shows their state)")
    return Batched(stats=stats, sel=sel, in_batches=frozenset(in_batches))


def batch_stage(sel: WorkingSet, run_options: dict[str, Any],
                opened: Callable[[], AbstractContextManager[CacheBackend]]) -> Batched | None:
    """`judge run`'s batch stage from its options.

    Args:
        sel: the run's selection.
        run_options: `judge run`'s options by name (batch, budget, offline, no_wait, batch_fallback,
            poll_interval, batch_size).
        opened: opens the run's cache (api.Run.opened).

    Returns:
        What _run_batches returns; None when no model runs in batch mode (or --offline).

    Raises:
        ConfigError: --budget with batch models, or --no-wait without any.
    """
    names = batch_models(sel.job, run_options["batch"])
    if names and run_options["budget"] is not None and not run_options["offline"]:
        raise ConfigError(f"{sel.job.path}: --budget is not supported with batch mode yet (a "
                          "batch is paid as a whole); drop --budget, or check `judge plan` first")
    if not names or run_options["offline"]:
        if run_options["no_wait"] and not names:
            raise ConfigError(f"{sel.job.path}: --no-wait needs --batch or a model with mode = "
                              "\"batch\"; e.g. judge run JOB --batch --no-wait")
        return None
    from runner.execute.batch import BatchOptions  # 0.51 s (see the top)
    return _run_batches(sel, names, BatchOptions(
        wait=not run_options["no_wait"], fallback=run_options["batch_fallback"],
        poll_s=run_options["poll_interval"], max_requests=run_options["batch_size"],
        max_retries=sel.job.limits.max_retries), opened)


def merge(stats: RunStats, batched: Batched) -> None:
    """Fold the batch stage into the run's counters.

    Args:
        stats: the run's counters, changed in place: tasks the pool left alone because a batch
            failed them become failures with the batch's reason; answers collected from a batch
            in this run count as fresh (not cached before), their tokens and cost at the batch
            price.
        batched: the batch stage's outcome.
    """
    b = batched.stats
    missing = set(stats.missing)
    for key, reason in b.failures.items():
        if key in missing:
            stats.failures.setdefault(key, scrub(reason))  # a batch's error file: server text
    stats.missing = [k for k in stats.missing if k not in stats.failures]
    stats.called |= b.collected
    stats.bill.merge(b.bill)


def _age(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


@click.command("batches")
@task_selection()
@click.option("--cancel", is_flag=True, help="Cancel every live batch of the job (their "
              "finished requests are still collected by the next `judge run --batch`).")
def batches(task_selection: TaskSelection, cancel: bool) -> None:
    """List the job's provider batches: id, model, state, requests, completed, failed, age.

    Live batches are refreshed from the provider first. The ledger lives beside the
    answers: batches.sqlite in the cache directory, or tables in the --cache database.

    \b
    Example:
      judge batches summeval             state of every batch `judge run --batch` made
      judge batches summeval --cancel    cancel the live ones
    """
    from runner.execute.batch import BatchOptions, BatchRun  # 0.51 s (see the top)
    sel = resolve(task_selection)
    names = tuple(m.name for m in sel.job.models if row(m.kind).batch)
    with open_selected(sel) as cache, _open_ledger(sel) as ledger:
        run = BatchRun(cache=cache, ledger=ledger, providers=_providers(sel.job, names),
                       job=sel.job.name, options=BatchOptions(), say=lambda s: None)
        live_before = sum(r.live for r in ledger.rows(sel.job.name))
        rows = run_async(run.status(cancel=cancel))
    if not rows:
        click.echo(f"job {sel.job.name}: no batches in {ledger.location}")
        return
    click.echo(f"{'batch':<32} {'model':<16} {'state':<12} {'requests':>8} "
               f"{'completed':>9} {'failed':>6} {'age':>6} collected")
    now = time.time()
    for r in rows:
        click.echo(f"{r.batch_id or '(submitting)':<32} {r.model:<16} {r.state:<12} "
                   f"{r.requests:>8} {r.completed:>9} {r.failed:>6} "
                   f"{_age(now - r.created):>6} {'yes' if r.ingested else 'no'}")
    if cancel:
        click.echo(f"cancel requested for {live_before} live batch(es)")

