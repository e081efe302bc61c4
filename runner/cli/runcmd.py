"""`judge run`: its options, the batch stage, the pool under a two-phase Ctrl-C, a shard's
summary; the run itself is an api.Run (runner/session/run.py), `runner.run`'s too. Exit codes:
runner/cli/main.py.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import click

from runner import api
from runner.cli import Terminated
from runner.cli.batches import MAX_BATCH_REQUESTS, batch_models, batch_stage, merge
from runner.cli.cachecmds import job_keys
from runner.cli.options import PARTIAL_HELP, data_dir, resolve, task_selection
from runner.cli.outcome import command_line, counts, exit_interrupted, stopped, summarise
from runner.errors import ConfigError, scrub
from runner.execute.store.backend import CacheBackend
from runner.execute.store.cache import Cache
from runner.job.spec import Job
from runner.reduce.judgments import CachedFirst
from runner.report.folder import check_out
from runner.selection import TaskSelection

if TYPE_CHECKING:
    from runner.cli.progress import Progress
    from runner.execute.stats import RunStats

# The progress bar (tqdm: 37 ms to import after runner.cli.main) and asyncio (46 ms) are
# imported inside the functions that use them: `judge --help`, `plan`, `status`, `datasets` and
# `cache` never pay for them.

__all__ = ["TERM_GRACE_S", "run"]

TERM_GRACE_S = 5.0
"""After SIGTERM, how long requests in flight may take before they are cancelled (docker stop
sends SIGKILL after 10 s)."""


@click.command()
@task_selection(shard=True)
@click.option("--concurrency", type=click.IntRange(min=1), help="Requests in flight.")
@click.option("--rpm", type=click.FloatRange(min=0, min_open=True), help="Requests/minute/model.")
@click.option("--tpm", type=click.FloatRange(min=0, min_open=True), help="Tokens/minute/model.")
@click.option("--max-retries", type=click.IntRange(min=0), help="Retries per task.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True),
              help="Per-request timeout in seconds.")
@click.option("--offline", is_flag=True,
              help="Never touch the network: report from the cache and list the misses "
                   "(exit 1 when some tasks have no answer, unless --partial).")
@click.option("--partial", is_flag=True, help=PARTIAL_HELP)
@click.option("--budget", type=click.FloatRange(min=0), metavar="USD",
              help="Stop dispatching before the estimated spend would pass USD.")
@click.option("--until-ci", type=click.FloatRange(min=0, min_open=True), metavar="W",
              help="Judge whole groups in random order (the --sample draw's) and stop calling "
                   "a judge once each of its 95% CIs is narrower than W, e.g. --until-ci 0.1 "
                   "[job: limits.until_ci].")
@click.option("--yes", "-y", is_flag=True, help="Do not ask before paid calls.")
@click.option("--batch", is_flag=True,
              help="Send what misses the cache through the provider's Batch API (half price, "
                   "answered within 24 h; every model, else only those with mode = \"batch\"), "
                   "e.g. judge run summeval --batch")
@click.option("--no-wait", is_flag=True,
              help="With --batch: submit and exit; a later `judge run JOB --batch` collects "
                   "what is done, e.g. judge run summeval --batch --no-wait")
@click.option("--batch-fallback", type=click.Choice(["batch", "online"]), default="batch",
              show_default=True,
              help="Where requests a batch failed or let expire go: one new batch per run, or "
                   "the online pool, e.g. --batch-fallback online")
@click.option("--batch-size", type=click.IntRange(1, MAX_BATCH_REQUESTS),
              default=MAX_BATCH_REQUESTS, show_default=True,
              help="Most requests per batch file (files are also split at 200 MB), e.g. "
                   "--batch-size 10000")
@click.option("--poll-interval", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, metavar="S",
              help="Seconds between polls of open batches, e.g. --poll-interval 60")
@click.option("--refresh-damaged", is_flag=True,
              help="First drop the job's cached answers whose records are damaged on disk "
                   "(\"cached answer unreadable\"), so that they are asked again.")
def run(task_selection: TaskSelection, **run_options: Any) -> None:
    """Call the judge for every task not yet cached, then write the reports.

    Exit 0 when no task failed (tasks left out by --offline or --budget are listed), 1 when
    some failed (listed), 2 on a configuration error (before any call), 130 when
    interrupted: rerun the same command to resume. At a terminal it asks before paid calls
    unless --yes.
    """
    started = time.time()
    sel = resolve(task_selection, download=api.Download(mirror=os.environ.get("JUDGE_DATA_MIRROR"),
                                                        notify=_notify_download))
    sel = api.with_run_limits(sel, run_options)
    # a shard writes no reports: this builds them once every shard is done
    run_options["rescore_hint"] = shlex.join(["judge", "rescore",
                                       *task_selection.arguments(shard=False)])
    if sel.shard is None:
        check_out(sel.out_dir)
    if run_options["refresh_damaged"]:
        _drop_damaged(sel)
    run = api.Run(sel, started=started, command=command_line(), environ=os.environ,
                  offline=run_options["offline"], budget=run_options["budget"])
    # offline: no key or budget check (no call), but --until-ci's combinations all the same
    run.check(batch=bool(batch_models(run.sel.job, run_options["batch"])))
    with run.lease():  # an offline run takes none: it makes no call, as rescore
        if not (run.offline or run_options["yes"]) and sys.stdin.isatty():
            _confirm(sel)
        _run_checked(run, run_options)


def _run_checked(run: api.Run, run_options: dict[str, Any]) -> None:
    """`judge run` once its options are checked (and its lease held): the batch stage, the
    pool (after the cached tasks, on a large run), the reports."""
    batched = batch_stage(run.sel, run_options, run.opened)
    if batched is not None:
        run.sel, run.in_batches = batched.sel, batched.in_batches
    if batched is None and (count := run.cached_first_count()):
        _run_cached_first(run, run_options, count)
        return
    stats = _execute(run)
    if batched is not None:
        merge(stats, batched)
    if run.sel.shard is not None:  # one shard's reports would be partial: rescore builds them
        _summarise_shard(run.sel, stats, run.command, run_options["rescore_hint"])
    if stats.fatal:  # no endpoint, no model or no key: the reports would show only that
        summarise(run.sel, stats, run.command)
    tables = run.report(stats, extra={} if batched is None else {"batch": batched.stats.as_dict()})
    summarise(run.sel, stats, run.command, _partial(run_options), tables.headline)


def _summarise_shard(sel: api.WorkingSet, stats: RunStats, command: str, rescore_hint: str) -> None:
    """A shard's counts and the command that builds the reports; exits like run."""
    click.echo(f"shard {sel.shard}: {counts(stats)}", err=True)
    if stats.fatal:
        raise stopped(stats, command)
    for key, reason in list(stats.failures.items())[:20]:
        click.echo(f"failed {key[:12]}: {scrub(reason)}", err=True)
    if stats.interrupted:
        exit_interrupted(stats, command)
    click.echo(f"no reports written for one shard: when every shard is done, build them with: "
               f"{rescore_hint}", err=True)
    sys.exit(1 if stats.failures else 0)


def _drop_damaged(sel: api.WorkingSet) -> None:
    """judge run --refresh-damaged: the job's damaged records dropped, for the run to ask
    them again."""
    if sel.cache_url:
        raise ConfigError("--refresh-damaged: only a cache folder (--cache-dir) is checked; "
                          "drop --cache/JUDGE_CACHE_URL or the option")
    with Cache(sel.cache_dir) as cache:
        dropped = cache.drop([key for key, _ in cache.damaged(job_keys(sel))])
    click.echo(f"{sel.cache_dir}: dropped {dropped} damaged records; asking them again",
               err=True)


def _notify_download(name: str, missing: int) -> None:
    click.echo(f"data set {name}: {missing} file(s) not in {data_dir()}; downloading from "
               "upstream and checking sha256 (first use)", err=True)


def _confirm(sel: api.WorkingSet) -> None:
    """At a terminal, ask before paid calls (those with a price); --yes skips this."""
    paid = [p for p in api.estimate(sel) if p.calls and p.model.kind != "local" and p.cost != 0]
    if not paid:
        return
    calls = sum(p.calls for p in paid)
    costs = [p.cost for p in paid]
    spend = "an unknown amount" if None in costs else f"up to ~${sum(c or 0 for c in costs):.2f}"
    if not click.confirm(f"{calls} API calls, {spend}. Continue?", default=True, err=True):
        raise click.Abort()


def _execute(run: api.Run, cached_first: CachedFirst | None = None) -> RunStats:
    """The run's pool, local servers started, a progress bar on stderr."""
    # asyncio (~65 ms) only where the pool runs: rescore and a fully cached run never import it
    import asyncio

    from runner.cli.progress import Progress
    progress = Progress(sys.stderr, total=0)  # grows with each stage's task count
    with run.serve() as (cache, served):
        try:
            return api.run_async(_run_async(run, cache, served, progress, cached_first))
        except asyncio.CancelledError:
            # The second Ctrl-C cancelled the pool; every answer received is already cached.
            raise KeyboardInterrupt from None
        finally:
            progress.close()


async def _run_async(run: api.Run, cache: CacheBackend, served: Job, progress: Progress,
                     cached_first: CachedFirst | None = None) -> RunStats:
    """Run the pool under a two-phase Ctrl-C: stop dispatching, then cancel."""
    import asyncio  # as in _execute
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None

    def on_sigint() -> None:
        if stop.is_set():
            progress.say("second Ctrl-C: cancelling in-flight requests")
            main.cancel()
        else:
            progress.say("stopping: no new requests; in-flight requests finish "
                         "(Ctrl-C again to cancel them)")
            stop.set()

    def on_sigterm() -> None:  # as the first Ctrl-C, with a deadline: SIGKILL may follow
        if not terminated:
            progress.say(f"SIGTERM: no new requests; in-flight requests have {TERM_GRACE_S:g} s "
                         "to finish")
            terminated.append(loop.call_later(TERM_GRACE_S, main.cancel))
            stop.set()

    terminated: list[Any] = []
    before = signal.getsignal(signal.SIGTERM)
    loop.add_signal_handler(signal.SIGINT, on_sigint)
    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        stats = await run.pool(cache, served, stop=stop, on_progress=progress.update,
                               say=progress.say, cached_first=cached_first)
        stats.terminated = bool(terminated)
        return stats
    except asyncio.CancelledError:
        if terminated:  # the grace period ended: what was received is cached
            raise Terminated from None
        raise
    finally:
        for handle in terminated:
            handle.cancel()
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, before)  # remove_signal_handler left the default: death


def _run_cached_first(run: api.Run, run_options: dict[str, Any], count: int) -> None:
    """A large run: its cached tasks judged first, the rest through the pool, as the reports
    are written (see Run.cached_first); Ctrl-C while cached answers are read stops without
    reports (nothing was called)."""
    from runner.cli.progress import Progress
    progress = Progress(sys.stderr, total=count)
    stats, tables = run.cached_first(count, on_progress=progress.update,
                                     cached_done=progress.close,
                                     pool=lambda first: _execute(run, first))
    summarise(run.sel, stats, run.command, _partial(run_options), tables.headline)


def _partial(run_options: dict[str, Any]) -> bool:
    """Whether a run's tasks without an answer still make exit 0: online, those are listed
    (held by a batch, over the budget); --offline reports only what is cached, and says so
    with exit 1 unless --partial."""
    return bool(run_options["partial"]) or not run_options["offline"]
