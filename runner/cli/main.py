"""The `judge` command. The only module that imports click, reads the environment, prints or exits.

Exit codes: 0 all tasks done, 1 some tasks failed (listed), 2 usage or configuration error,
130 interrupted by Ctrl-C, 143 stopped by SIGTERM (rerun the same command to resume).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import io
import os
import shlex
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from runner import api
from runner.children import one_process
from runner.cli import TERM_EXIT, Terminated, views
from runner.cli.batches import (
    MAX_BATCH_REQUESTS,
    BatchAnswers,
    Batched,
    batch_stage,
    batches,
    merge,
)
from runner.cli.cachecmds import cache_option, cache_url, export_command, import_command
from runner.data import datasets
from runner.errors import ConfigError, DataError, RunnerError, scrub
from runner.execute.imports import import_answers
from runner.execute.shard import Shard, split_limits
from runner.execute.store.backend import CacheBackend, cached_flags, is_url, open_cache, redact
from runner.execute.store.cache import Cache
from runner.execute.store.lease import describe, lease_name
from runner.expand import task_key
from runner.job.spec import Job
from runner.reduce.judgments import CachedFirst, Judgment, judge
from runner.report.folder import check_out
from runner.session import (
    Download,
    Selection,
    TaskLog,
    all_tasks,
    check_budget,
    check_keys,
    estimate,
    job_path,
    key_reader,
    manifest,
    open_selected,
    run_async,
    run_pool,
    serving,
    with_run_limits,
)

if TYPE_CHECKING:
    from runner.cli.progress import Progress
    from runner.execute.stats import RunStats
    from runner.report.headline import Headline

# The reports (numpy, ~0.15 s to import), the pool (aiohttp, ~0.15 s) and the progress bar
# (tqdm) are imported inside the commands that use them, not here: `judge --help`, `plan`,
# `status`, `datasets` and `cache` never pay for them.

DEFAULT_DATA_DIR = Path.home() / ".cache" / "judge-runner" / "data"


class UsageError(click.ClickException):
    """A RunnerError as one `Error:` line; exit 2 for job, data and configuration errors."""

    exit_code = 2



def _data_dir() -> Path:
    return Path(os.environ.get("JUDGE_DATA_DIR") or DEFAULT_DATA_DIR)


def _select(job_arg: str, models: tuple[str, ...], base_url: str | None, limit: int | None,
            cache_dir: str | None, out: str | None, stream: bool = False,
            download: Download | None = None) -> Selection:
    ctx = click.get_current_context(silent=True)
    meta = ctx.meta if ctx is not None else {}
    sample = meta.get("judge_sample")
    return api.selection(job_path(job_arg), models=models, base_url=base_url, limit=limit,
                         sample=sample, seed=meta.get("judge_seed"), cache_dir=cache_dir,
                         cache_url=cache_url(), out=out, data_dir=_data_dir(), stream=stream,
                         download=download)


async def _run_async(sel: Selection, served: Job, cache: CacheBackend, opts: dict[str, Any],
                     progress: Progress, judged: TaskLog,
                     after: CachedFirst | None = None) -> tuple[RunStats, Selection]:
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
        stats, sel = await run_pool(sel, served, cache, stop=stop,
                                    key_reader=key_reader(os.environ),
                                    offline=opts["offline"], budget=opts["budget"],
                                    on_progress=progress.update, judged=judged,
                                    hold=opts.get("hold", frozenset()), after=after)
        stats.terminated = bool(terminated)
        return stats, sel
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


TERM_GRACE_S = 5.0
"""After SIGTERM, how long requests in flight may take before they are cancelled (docker stop
sends SIGKILL after 10 s)."""


PARTIAL_HELP = ("Exit 0 although some tasks have no cached answer (the reports leave them "
                "out); without it that is exit 1, e.g. after shards that did not all run.")


def _kept(name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    """A callback keeping an option's value in the context, for _select (an option every
    command takes without a parameter of its own)."""
    def keep(ctx: click.Context, _: click.Parameter, value: Any) -> None:
        if value is not None:
            ctx.meta[name] = value
    return keep


def _common(f: Callable[..., Any]) -> Callable[..., Any]:
    """Options that select the tasks: every command that reads the cache takes them."""
    options = [
        click.argument("job"),
        click.option("--model", "models", multiple=True, metavar="SPEC",
                     help="Judge model, replacing the job's: openai:NAME, anthropic:NAME, "
                          "gemini:NAME, azure:DEPLOYMENT (with --base-url RESOURCE_URL), "
                          "local:NAME, or a NAME served at --base-url. Repeatable, e.g. "
                          "--model anthropic:claude-3-5-haiku-latest --model openai:gpt-4o-mini."),
        click.option("--base-url", help="OpenAI-compatible endpoint for bare model names, "
                                        "e.g. http://127.0.0.1:8000/v1 [env OPENAI_BASE_URL]."),
        click.option("--limit", type=click.IntRange(min=1),
                     help="Only the first N items of each data set, in file order."),
        click.option("--sample", type=click.IntRange(min=1), metavar="N", expose_value=False,
                     callback=_kept("judge_sample"),
                     help="N items of each data set drawn at random, whole groups at a time "
                          "(a pilot study); the same draw on every command with the same "
                          "--seed, e.g. --sample 50 --seed 1."),
        click.option("--seed", type=int, metavar="S", expose_value=False,
                     callback=_kept("judge_seed"),
                     help="Seed of the --sample draw [default 0] (the job's `seed` is the "
                          "bootstrap's)."),
        click.option("--cache-dir", help="Response cache folder [env JUDGE_CACHE_DIR; "
                                         "default ./cache]."),
        click.option("--out", help="Report folder [default: the job's output_dir, "
                                   "runs/<job>]."),
        cache_option,
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _processes(environ: Mapping[str, str]) -> None:
    """JUDGE_PROCESSES=1: every command in one process (runner.children)."""
    value = environ.get("JUDGE_PROCESSES", "").strip()
    if value not in ("", "1"):
        raise ConfigError(f"JUDGE_PROCESSES must be 1 (every command in one process) or unset "
                          f"(got {value!r})")
    one_process(value == "1")


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            _processes(os.environ)
            return super().invoke(ctx)
        except RunnerError as exc:
            raise UsageError(scrub(str(exc))) from None
        except KeyboardInterrupt as exc:
            command = " ".join(["judge", *sys.argv[1:]])
            term = isinstance(exc, Terminated)
            click.echo(f"{'terminated' if term else 'interrupted'}; rerun to resume: {command}",
                       err=True)
            sys.exit(TERM_EXIT if term else 130)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
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


@cli.command()
@_common
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
@click.option("--yes", "-y", is_flag=True, help="Do not ask before paid calls.")
@click.option("--shard", metavar="I/N",
              help="Run only shard I of N (0-based, split by cache key) against a shared "
                   "--cache; rpm/tpm of the job are divided by N (--rpm/--tpm are this "
                   "shard's own). Then build the reports once with `judge rescore`. "
                   "E.g. --shard 0/4.")
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
def run(job: str, models: tuple[str, ...], base_url: str | None, limit: int | None,
        cache_dir: str | None, out: str | None, **opts: Any) -> None:
    """Call the judge for every task not yet cached, then write the reports.

    Exit 0 when no task failed (tasks left out by --offline or --budget are listed), 1 when
    some failed (listed), 2 on a configuration error (before any call), 130 when
    interrupted: rerun the same command to resume. At a terminal it asks before paid calls
    unless --yes.
    """
    started = time.time()
    sel = _select(job, models, base_url, limit, cache_dir, out,
                  download=Download(mirror=os.environ.get("JUDGE_DATA_MIRROR"),
                                    notify=_notify_download))
    if opts["shard"]:
        shard = Shard.parse(opts["shard"])
        sel = dataclasses.replace(sel, shard=shard, job=split_limits(sel.job, shard.count))
    sel = with_run_limits(sel, opts)
    if sel.shard is None:  # a shard writes no reports
        check_out(sel.out_dir)
    if opts["refresh_damaged"]:
        _drop_damaged(sel)
    if opts["offline"]:  # makes no call: needs no lease, as rescore
        _run(sel, opts, started)
        return
    check_keys(sel.job, os.environ)
    check_budget(sel.job, opts["budget"])
    # The run's lease on (cache, job, shard), before any call and before asking: a second run
    # of this job on this cache stops here, naming the first (runner/execute/store/lease.py).
    name = lease_name(sel.job.name, None if sel.shard is None else str(sel.shard))
    with open_selected(sel) as held, held.lease(name, describe()):
        if not opts["yes"] and sys.stdin.isatty():
            _confirm(sel)
        _run(sel, opts, started)


def _run(sel: Selection, opts: dict[str, Any], started: float) -> None:
    """`judge run` once its options are checked (and its lease held): the batch stage, the
    pool, the reports."""
    batched = batch_stage(sel, opts)
    if batched is not None:
        sel, opts["hold"] = batched.sel, batched.hold
    judged = TaskLog()
    if batched is None and (count := _cached_first(sel)):
        _run_cached_first(sel, opts, started, judged, count)
        return
    stats, sel = _execute(sel, opts, judged)
    if batched is not None:
        merge(stats, batched)
    if sel.shard is not None:  # one shard's reports would be partial: rescore builds them
        _summarise_shard(sel, stats, " ".join(["judge", *sys.argv[1:]]))
    _finish(sel, stats, started, " ".join(["judge", *sys.argv[1:]]), judged, batched,
            _partial(opts))


def _summarise_shard(sel: Selection, stats: RunStats, command: str) -> None:
    """A shard's counts and the command that builds the reports; exits like run."""
    click.echo(f"shard {sel.shard}: {_counts(stats)}", err=True)
    if stats.fatal:
        raise UsageError(f"{stats.fatal}; run stopped, nothing lost: rerun to resume")
    for key, reason in list(stats.failures.items())[:20]:
        click.echo(f"failed {key[:12]}: {scrub(reason)}", err=True)
    if stats.interrupted:
        _exit_interrupted(stats, command)
    click.echo(f"no reports written for one shard: when every shard is done, build them with: "
               f"{_rescore_command()}", err=True)
    sys.exit(1 if stats.failures else 0)


RUN_ONLY = frozenset({"concurrency", "rpm", "tpm", "max_retries", "timeout", "offline", "budget",
                      "yes", "shard", "batch", "no_wait", "batch_fallback", "batch_size",
                      "poll_interval", "refresh_damaged"})
"""`judge run`'s options that do not select tasks (rescore has none of them)."""


def _rescore_command() -> str:
    """This `judge run` as the `judge rescore` that reports on the same tasks: every option
    the keys depend on (--model, --base-url, --limit, the cache) kept, the run's own dropped;
    a cache URL's password shown as ***."""
    ctx = click.get_current_context()
    takes_value = {}
    for param in ctx.command.params:
        if isinstance(param, click.Option):
            for opt in param.opts:
                takes_value[opt] = (param.name in RUN_ONLY, not param.is_flag)
    words, args = ["judge", "rescore"], iter(sys.argv[2:])
    for word in args:
        name = word.split("=", 1)[0]
        run_only, valued = takes_value.get(name, (False, False))
        value = next(args, "") if valued and "=" not in word else None
        if run_only:
            continue
        if name == "--cache" and value is not None:
            value = redact(value)
        words += [word] if value is None else [word, value]
    return shlex.join(words)


def _counts(stats: RunStats) -> str:
    """`N tasks: ... cached, ... called, ...`: the five counts add up to N."""
    return (f"{stats.total} tasks: {stats.cache_hits} cached, {stats.api_calls} called, "
            f"{stats.duplicates} repeat an earlier task, {len(stats.failures)} failed, "
            f"{len(stats.missing)} not run ({stats.retries} retries)")


def _exit_interrupted(stats: RunStats, command: str) -> None:
    """The resume line; exit 143 after SIGTERM, 130 after Ctrl-C."""
    word = "terminated" if stats.terminated else "interrupted"
    click.echo(f"{word}: {len(stats.missing)} tasks left; rerun to resume: {command}", err=True)
    sys.exit(TERM_EXIT if stats.terminated else 130)


def _drop_damaged(sel: Selection) -> None:
    """judge run --refresh-damaged: the job's damaged records dropped, for the run to ask
    them again."""
    if sel.cache_url:
        raise ConfigError("--refresh-damaged: only a cache folder (--cache-dir) is checked; "
                          "drop --cache/JUDGE_CACHE_URL or the option")
    with Cache(sel.cache_dir) as cache:
        dropped = cache.drop([key for key, _ in cache.damaged(_job_keys(sel))])
    click.echo(f"{sel.cache_dir}: dropped {dropped} damaged records; asking them again",
               err=True)


def _job_keys(sel: Selection) -> list[str]:
    """The selection's distinct cache keys, in task order (generation stage first)."""
    return list(dict.fromkeys(t.key for t in all_tasks(sel.expansion)))


def _notify_download(name: str, missing: int) -> None:
    click.echo(f"data set {name}: {missing} file(s) not in {_data_dir()}; downloading from "
               "upstream and checking sha256 (first use)", err=True)


def _confirm(sel: Selection) -> None:
    """At a terminal, ask before paid calls (those with a price); --yes skips this."""
    paid = [p for p in estimate(sel) if p.calls and p.model.kind != "local" and p.cost != 0]
    if not paid:
        return
    calls = sum(p.calls for p in paid)
    costs = [p.cost for p in paid]
    spend = "an unknown amount" if None in costs else f"up to ~${sum(c or 0 for c in costs):.2f}"
    if not click.confirm(f"{calls} API calls, {spend}. Continue?", default=True, err=True):
        raise click.Abort()


def _execute(sel: Selection, opts: dict[str, Any], judged: TaskLog,
             after: CachedFirst | None = None) -> tuple[RunStats, Selection]:
    # asyncio (~65 ms) only where the pool runs: rescore and a fully cached run never import it
    import asyncio

    from runner.cli.progress import Progress
    progress = Progress(sys.stderr, total=0)  # grows with each stage's task count
    started = contextlib.nullcontext(sel.job) if opts["offline"] else serving(sel.job)
    with open_selected(sel) as cache, started as served:
        try:
            return run_async(_run_async(sel, served, cache, opts, progress, judged, after))
        except asyncio.CancelledError:
            # The second Ctrl-C cancelled the pool; every answer received is already cached.
            raise KeyboardInterrupt from None
        finally:
            progress.close()


CACHED_FIRST_TASKS = 20_000
"""From this many tasks, a run judges the cached ones first (see _run_cached_first); a smaller
run gains little from it."""


def _cached_first(sel: Selection) -> int:
    """The run's task count if it can judge its cached tasks first (a folder cache, one
    shard-less judge stage, no generation stage, CACHED_FIRST_TASKS tasks or more), else 0."""
    if sel.shard is not None or sel.job.generate or (sel.cache_url and is_url(sel.cache_url)):
        return 0
    count = sel.expansion.count()  # ~0.04 s at 100k tasks: counted once for the whole run
    return count if count >= CACHED_FIRST_TASKS else 0


def _run_cached_first(sel: Selection, opts: dict[str, Any], started: float,
                      judged: TaskLog, count: int) -> None:
    """A run that judges its tasks in order as rescore does while their answers are cached,
    and hands the first task without one, and every later one, to the pool (then judges them
    as a run does). A fully cached run never starts the pool: it took ~1 s of a 100k-task
    rerun (dispatch, the task log, aiohttp). Reports, counts and exit codes are the pool's;
    Ctrl-C while cached answers are read stops without reports (nothing was called)."""
    from runner.cli.progress import Progress
    from runner.execute.stats import RunStats
    stats, command, answers = RunStats(), " ".join(["judge", *sys.argv[1:]]), BatchAnswers()
    stats.total = count
    progress = Progress(sys.stderr, total=count)
    with open_selected(sel) as cache:
        first = CachedFirst(sel.expansion, cache, stats, count=count,
                            on_progress=progress.update)
        # its readers read while the reports' modules load
        from runner.report.write import write_reports

        def judgments() -> Iterator[Judgment]:
            yield from first
            progress.close()
            if first.uncached_onward is None:  # all cached: repeats counted as the pool counts them
                stats.settle_repeats(first.hashes)
                return
            _execute(sel, opts, judged, first)
            yield from api.judged_dispatched(sel, cache, stats, judged)

        tables = write_reports(sel.out_dir, sel.expansion, answers.watch(judgments()),
                               lambda _: {**manifest(sel, stats, started, command),
                                          "batch_answers": answers.answers}, answers.notes)
    _summarise(sel, stats, command, _partial(opts), tables.headline)


def _partial(opts: dict[str, Any]) -> bool:
    """Whether a run's tasks without an answer still make exit 0: online, those are listed
    (held by a batch, over the budget); --offline reports only what is cached, and says so
    with exit 1 unless --partial."""
    return bool(opts["partial"]) or not opts["offline"]


def _finish(sel: Selection, stats: RunStats, started: float, command: str,
            judged: TaskLog, batched: Batched | None = None, partial: bool = True) -> None:
    if stats.fatal:  # no endpoint, no model or no key: the reports would show only that
        _summarise(sel, stats, command)
    batch = {} if batched is None else {"batch": batched.stats.as_dict()}
    tables = api.report_run(sel, stats, judged, started=started, command=command, extra=batch)
    _summarise(sel, stats, command, partial, tables.headline)


def _summarise(sel: Selection, stats: RunStats, command: str, partial: bool = False,
               result: Headline | None = None) -> None:
    """The end of a command that wrote reports: counts, failures, the study's `result` (the
    correlations, last), and the exit code: 1 when a task failed, when a judge has answers
    and not one parsed score, or when some tasks have no answer and the caller did not accept
    a `partial` report."""
    echo = click.echo
    echo(f"{_counts(stats)}; {stats.prompt_tokens + stats.completion_tokens} tokens, "
         f"{stats.cost_text}",
         err=True)
    if stats.fatal:  # before any report: those of a run that could not run are not kept
        raise UsageError(f"{stats.fatal}; run stopped, nothing lost: rerun to resume")
    echo(f"reports: {sel.out_dir}/", err=True)
    for key, reason in list(stats.failures.items())[:20]:
        echo(f"failed {key[:12]}: {scrub(reason)}", err=True)
    if len(stats.failures) > 20:
        echo(f"... and {len(stats.failures) - 20} more (see judgments.jsonl)", err=True)
    if stats.budget_stopped:
        echo(f"--budget reached: {len(stats.missing)} tasks not run", err=True)
    elif stats.missing and not stats.interrupted:
        first = list(dict.fromkeys(k[:12] for k in stats.missing))[:5]
        echo(f"{len(stats.missing)} of {stats.total} tasks have no cached answer, and the "
             f"reports leave them out: `judge run` calls them"
             f"{'' if partial else ', or pass --partial to accept a partial report'} "
             f"(first keys: {', '.join(first)})", err=True)
    if stats.interrupted:
        _exit_interrupted(stats, command)
    for line in (result.lines + result.unparsed + result.warnings) if result else []:
        echo(line, err=True)
    if stats.failures or (stats.missing and not partial and not stats.budget_stopped) or \
            (result and result.scoreless):
        sys.exit(1)


@cli.command()
@_common
@click.option("--partial", is_flag=True, help=PARTIAL_HELP)
def rescore(job: str, models: tuple[str, ...], base_url: str | None, limit: int | None,
            cache_dir: str | None, out: str | None, partial: bool) -> None:
    """Re-parse every cached answer with the current parsers and rewrite every report.

    Never opens a network connection: change a parser, rescore, get new numbers in seconds.
    Exit 0 when every task has an answer, 1 when some failed or have none (unless --partial).
    """
    _rescore(_select(job, models, base_url, limit, cache_dir, out), time.time(),
             partial=partial)


def _rescore(sel: Selection, started: float,
             then: Callable[[], None] = lambda: None, partial: bool = False) -> None:
    """Reports from the cache alone: one pass, the counts taken as the judgments go by;
    `then` runs once they are written, before the summary (which may exit)."""
    command = " ".join(["judge", *sys.argv[1:]])
    stats, tables = api.rebuild(sel, started=started, command=command)
    then()
    _summarise(sel, stats, command, partial, tables.headline)


@cli.command()
@_common
@click.option("--power", nargs=2, metavar="A B",
              help="Sample-size planning from this (pilot) run's cache: items needed to "
                   "separate judges A and B, e.g. --power fake/stars fake/geval --width 0.1. "
                   "Writes power.csv.")
@click.option("--width", type=click.FloatRange(min=0, min_open=True), default=0.1,
              show_default=True, help="With --power: the wanted width of the 95% CI of the "
                                      "difference of the two correlations.")
def plan(job: str, models: tuple[str, ...], base_url: str | None, limit: int | None,
         cache_dir: str | None, out: str | None, power: tuple[str, str] | None,
         width: float) -> None:
    """Show tasks, cache hits, calls to make, estimated tokens and cost. No network.

    Costs come from a built-in table of list prices (USD per 1M tokens) or the job's
    `price = {input = .., output = ..}`; completion tokens are counted at max_tokens x n,
    an upper bound.

    With --power A B (e.g. `judge plan openmeva --power fake/stars fake/geval --width 0.1`),
    plan instead reads the cached pilot run and prints, per data set, aspect and method, how
    many items a study needs for a 95% CI of corr(A) - corr(B) that wide, and for one that
    excludes 0 at the pilot's difference (bootstrap over the pilot's items).
    """
    if power:
        _plan_power(_select(job, models, base_url, limit, cache_dir, out), power, width)
        return
    sel = _select(job, models, base_url, limit, cache_dir, out, stream=True)
    plans = api.plan(sel)
    echo = click.echo
    echo(f"job {sel.job.name}: {sum(len(v) for v in sel.expansion.items.values())} items, "
         f"{len(sel.job.prompts)} prompts, {len(sel.job.models)} models")
    for p in plans:
        price = "price unknown: set price in the job" if p.cost is None else f"~${p.cost:.4f}"
        if p.cost is not None and p.model.kind != "local":
            from runner.execute.batch import batch_cost  # aiohttp: only for a priced model
            price += f", batch ~${batch_cost(p.model, p.cost) or 0:.4f}"
        echo(f"  {p.model.name} ({p.model.spec}): {p.tasks} tasks, {p.cached} cached, "
             f"{p.repeats} repeat an earlier request, {p.calls} to call, ~{p.prompt_tokens} "
             f"prompt + <={p.completion_tokens} completion tokens, {price}")
    costs = [p.cost for p in plans]
    echo("total: " + ("unknown cost" if None in costs else f"~${sum(c or 0 for c in costs):.4f}"))
    if sel.missing_answers:
        echo(f"{sel.missing_answers} generated answers are not cached yet: the judge tasks over "
             "them are not counted until `judge run` has generated them")


@cli.command()
@_common
def status(job: str, models: tuple[str, ...], base_url: str | None, limit: int | None,
           cache_dir: str | None, out: str | None) -> None:
    """How far a job is: tasks cached now, and the last run's manifest counts. No network."""
    sel = _select(job, models, base_url, limit, cache_dir, out, stream=True)
    with open_selected(sel, read_only=True) as cache:
        total = cached = 0
        for _, hit in cached_flags(cache, all_tasks(sel.expansion), task_key):
            total += 1
            cached += hit
    click.echo(f"job {sel.job.name}: {cached}/{total} tasks cached, {total - cached} to call")
    manifest = sel.out_dir / "manifest.json"
    if manifest.exists():
        data = orjson.loads(manifest.read_bytes())
        counts = ", ".join(f"{k} {v}" for k, v in data.get("counts", {}).items())
        click.echo(f"last run {data.get('ended')}: {counts}")
    else:
        click.echo(f"no run yet ({manifest} does not exist)")


@cli.command()
@_common
@click.option("--judges", nargs=2, required=True, metavar="A B",
              help="Two judges as named in correlations.csv: `model/prompt` for LLM judges, or "
                   "a metric column such as rouge1-f.")
@click.option("--permutations", type=click.IntRange(min=0), default=0, metavar="N",
              help="Also a paired permutation test with N permutations at dataset level, "
                   "e.g. --permutations 10000 (column permutation_p).")
def compare(job: str, models: tuple[str, ...], base_url: str | None, limit: int | None,
            cache_dir: str | None, out: str | None, judges: tuple[str, str],
            permutations: int) -> None:
    """Paired bootstrap test of the difference between two judges' correlations with humans.

    Both judges are scored on the same resampled groups (sample and dataset level), from the
    cache only (no network). Writes compare.csv next to the reports and prints the table:
    diff = A - B with its 95% CI and a two-sided p-value. At dataset level, also Williams'
    test of the two dependent correlations with the human (williams_t, williams_p, two-sided)
    and, with --permutations N, a paired permutation test (permutation_p), e.g.
    `judge compare tst-formality --judges gpt35/single gpt35/multi --permutations 10000`.
    """
    from runner.report.reliability import SIGNIFICANCE_COLUMNS, csv_bytes, significance
    from runner.report.write import COMPARE_COLUMNS, collect, comparison, judge_rows, write_atomic
    sel = _select(job, models, base_url, limit, cache_dir, out)
    with open_selected(sel, read_only=True) as c:
        tables = collect(judge(sel.expansion, c), io.BytesIO(), sel.expansion.job.juries)
    series = judge_rows(sel.expansion, tables)
    rows = significance(comparison(sel.expansion, series, judges), series, judges,
                        permutations=permutations, seed=sel.job.seed)
    write_atomic(sel.out_dir / "compare.csv",
                 csv_bytes([*COMPARE_COLUMNS, *SIGNIFICANCE_COLUMNS], rows))
    shown = ["dataset", "aspect", "level", "method", "subset", "value_a", "value_b", "diff",
             "ci_low", "ci_high", "p_value"]
    shown += ["williams_p", *(["permutation_p"] if permutations else [])]
    click.echo(f"A = {judges[0]}, B = {judges[1]}")
    click.echo(" ".join(f"{c:>9}" for c in shown))
    for r in rows:
        click.echo(" ".join(f"{r[c]:>9.3f}" if isinstance(r[c], float) else f"{r[c]!s:>9}"
                            for c in shown))


def _plan_power(sel: Selection, judges: tuple[str, str], width: float) -> None:
    """judge plan --power: power.csv and its table, from the cached pilot."""
    from runner.report.reliability import POWER_COLUMNS, csv_bytes, power_lines, power_rows
    from runner.report.write import collect, judge_rows, write_atomic
    with open_selected(sel, read_only=True) as c:
        tables = collect(judge(sel.expansion, c), io.BytesIO(), sel.expansion.job.juries)
    by_data = judge_rows(sel.expansion, tables)
    for name in judges:
        if not any(name in judges_there for judges_there in by_data.values()):
            found = sorted({j for d in by_data.values() for j in d})
            raise ConfigError(f"{sel.job.path}: --power names no judge {name!r}; judges in "
                              f"the cache: {', '.join(found) or 'none (run the pilot first)'}")
    methods = [m for m in ("pearson", "spearman") if m in sel.job.methods] or ["pearson"]
    rows = power_rows(by_data, judges, width=width, methods=methods, seed=sel.job.seed)
    write_atomic(sel.out_dir / "power.csv", csv_bytes(POWER_COLUMNS, rows))
    for line in power_lines(rows, judges, width):
        click.echo(line)


@cli.command()
@_common
@click.option("--figures", "figures_dir", metavar="DIR",
              help="Also write the key plots as PNG and SVG for a paper into DIR, e.g. "
                   "--figures runs/openmeva/figures.")
@click.option("--partial", is_flag=True, help=PARTIAL_HELP)
def report(job: str, models: tuple[str, ...], base_url: str | None, limit: int | None,
           cache_dir: str | None, out: str | None, figures_dir: str | None,
           partial: bool) -> None:
    """Rebuild every report, report.html included, from the cache alone (no call).

    \b
    Examples:
      judge report openmeva                       rewrite runs/openmeva/ (report.html, CSVs)
      judge report openmeva --figures figs/       ... and figs/*.png, figs/*.svg for a paper
    Takes the same --model/--limit (and --cache) as the run that filled the cache.
    """
    sel = _select(job, models, base_url, limit, cache_dir, out)

    def figures() -> None:
        click.echo(f"report: {sel.out_dir / 'report.html'}", err=True)
        if figures_dir:
            count = views.figures(sel.out_dir, Path(figures_dir))
            click.echo(f"{count} figures in {figures_dir}/ (PNG and SVG)", err=True)

    _rescore(sel, time.time(), figures, partial)


@cli.command("import")
@click.argument("job")
@click.option("--limit", type=click.IntRange(min=1),
              help="Only the first N items of each data set, in file order.")
@click.option("--cache-dir", help="Response cache folder [env JUDGE_CACHE_DIR; default ./cache].")
@click.option("--out", help="Report folder [default: the job's output_dir, runs/<job>].")
@click.option("--force", is_flag=True, help="Overwrite answers already in the cache.")
@cache_option
def import_(job: str, limit: int | None, cache_dir: str | None, out: str | None,
            force: bool) -> None:
    """Store a study's recorded judge answers ([[imports]] in the job) in the cache.

    Each answer is stored under the exact request the job would send, marked as imported
    with its source; then the reports are rebuilt from the cache (as `judge rescore`), so the
    real parsers and reducer run over the study's own answers. No network.
    """
    started = time.time()
    sel = _select(job, (), None, limit, cache_dir, out)
    with open_selected(sel) as c:
        counts = import_answers(sel.expansion, c, force=force)
    click.echo(f"imported {counts.stored} answers ({counts.already_cached} already cached, "
               f"{counts.without_answer} tasks without a recorded answer)", err=True)
    _rescore(sel, started, partial=True)  # a study's recorded answers rarely cover every task


cli.add_command(batches(_common, _select))
cli.add_command(views.view)
cli.add_command(views.runs)
cli.add_command(views.diff)


@cli.group()
def cache() -> None:
    """Inspect the response cache; copy it between folders, PostgreSQL and JSONL archives."""


@cache.command("stats")
@click.option("--cache-dir", help="Response cache folder [env JUDGE_CACHE_DIR; default ./cache].")
@cache_option
def cache_stats(cache_dir: str | None) -> None:
    """Entries and size of the cache."""
    if url := cache_url():
        with open_cache(url, read_only=True) as shared:
            s = shared.stats()
        click.echo(f"{redact(url)}: {s['entries']} entries, {s['bytes'] / 1e6:.1f} MB")
        return
    path = Path(cache_dir or os.environ.get("JUDGE_CACHE_DIR") or "cache")
    if not path.exists():
        raise ConfigError(f"{path}: no cache here; pass --cache-dir or set JUDGE_CACHE_DIR")
    with open_cache(path, read_only=True) as c:
        s = c.stats()
    click.echo(f"{path}: {s['entries']} entries, {s['bytes'] / 1e6:.1f} MB")


cache.add_command(export_command)
cache.add_command(import_command)


@cache.command("check")
@click.argument("job", required=False)
@click.option("--model", "models", multiple=True, metavar="SPEC",
              help="With JOB: its judge models, as given to `judge run`.")
@click.option("--base-url", help="With JOB: the endpoint of bare model names, as for `judge run`.")
@click.option("--limit", type=click.IntRange(min=1), help="With JOB: its first N items only.")
@click.option("--cache-dir", help="Response cache folder [env JUDGE_CACHE_DIR; default ./cache].")
@click.option("--drop", is_flag=True,
              help="Remove the damaged records: the next `judge run` asks them again.")
def cache_check(job: str | None, models: tuple[str, ...], base_url: str | None,
                limit: int | None, cache_dir: str | None, drop: bool) -> None:
    """List the records of the cache folder that are damaged on disk (JOB's, or all of them).

    A damaged record fails its task in `judge run` and `judge rescore` ("cached answer
    unreadable"); the other tasks go on. --drop removes them, e.g.
    `judge cache check openmeva --drop`, then `judge run openmeva` asks them again. Exit 1
    when damaged records are left in the folder.
    """
    path = Path(cache_dir or os.environ.get("JUDGE_CACHE_DIR") or "cache")
    if not (path / "cache.db").exists():
        raise ConfigError(f"{path}: no cache here; pass --cache-dir or set JUDGE_CACHE_DIR")
    keys = None
    if job is not None:
        keys = _job_keys(_select(job, models, base_url, limit, str(path), None))
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


@cache.command("explain")
@_common
@click.option("--item", "item_id", required=True, help="Item id, as in judgments.jsonl.")
def cache_explain(job: str, models: tuple[str, ...], base_url: str | None, limit: int | None,
                  cache_dir: str | None, out: str | None, item_id: str) -> None:
    """Print each task of one item: the parts of its cache key, the key, and whether it is cached.

    Two runs that should share answers but don't: compare these lines between them.
    """
    sel = _select(job, models, base_url, limit, cache_dir, out)
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


@cli.group("datasets")
def datasets_group() -> None:
    """List, download and verify the registered data sets [env JUDGE_DATA_DIR]."""


@datasets_group.command("list")
def datasets_list() -> None:
    """Registered data sets and whether their files are present."""
    for name, info in sorted(datasets.REGISTRY.items()):
        states = {state for _, state in datasets.verify(name, _data_dir())} if info.files else {}
        state = "ok" if states == {"ok"} else ", ".join(sorted(states)) or "-"
        click.echo(f"{name:<16} {state:<10} {info.description}")


@datasets_group.command("fetch")
@click.argument("names", nargs=-1, required=True)
def datasets_fetch(names: tuple[str, ...]) -> None:
    """Download NAMES from their upstream URLs into JUDGE_DATA_DIR and check each sha256."""
    for name in names:
        for path in datasets.fetch(name, _data_dir(), mirror=os.environ.get("JUDGE_DATA_MIRROR")):
            click.echo(f"{name}: {path}")


@datasets_group.command("verify")
@click.argument("names", nargs=-1, required=True)
def datasets_verify(names: tuple[str, ...]) -> None:
    """Check the sha256 of every file of NAMES; exit 2 if any is missing or differs."""
    bad = 0
    for name in names:
        for path, state in datasets.verify(name, _data_dir()):
            click.echo(f"{name}: {path}: {state}")
            bad += state != "ok"
    if bad:
        raise DataError(f"{bad} file(s) missing or corrupt: run `judge datasets fetch "
                        f"{' '.join(names)}`")


def main() -> None:
    """Console entry point."""
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
