"""The Python API: a study from a notebook or a script, through the functions `judge` itself uses.

    import runner
    job = runner.load_job("examples/two-judges.toml")
    runner.plan(job, models=["gpt-4o-mini"])        # per model: tasks, cached, calls, cost
    done = runner.run(job, models=["gpt-4o-mini"])  # same cache and resume as `judge run`
    frames = runner.results(done)                   # pandas DataFrames of its reports

Every function takes the selection the commands take, as keyword arguments or as one
TaskSelection (see `selection`), with the commands' defaults: `run(job)` and `judge run JOB` in
the same folder share one cache and one `runs/<job>/`. The API runs whole jobs (no `shard`).

Nothing here prints or exits: a problem is a RunnerError (runner/errors.py) with the message
`judge` would print after "Error:". pandas is needed by `results` only (`pip install
judge-runner[pandas]`), imported by runner/report/frames.py alone.

`cli` runs its `run`, `plan`, `rescore`, `report` and `import` through this module
(`selection`, `Run`, `plan`, `rebuild`), so the commands and the API cannot drift apart.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from runner.errors import APIError, ConfigError, register_secret
from runner.execute.stats import RunStats
from runner.job.load import load_job as _load_job
from runner.job.spec import Job
from runner.report.folder import HISTORY, check_out
from runner.report.frames import COLUMNS, Results, import_pandas, read_results
from runner.selection import TaskSelection

# The run's phases (runner/session/). A name imported `as` itself is runner.cli's, not the
# documented API (__all__): the commands reach the session only through this module (the
# import-linter contract "cli: through the API", pyproject.toml).
from runner.session.plan import ModelPlan
from runner.session.plan import all_tasks as all_tasks
from runner.session.plan import estimate as estimate
from runner.session.pool import run_async as run_async
from runner.session.report import BatchAnswers as BatchAnswers
from runner.session.report import rebuild
from runner.session.run import Run as Run
from runner.session.select import Download as Download
from runner.session.select import WorkingSet as WorkingSet
from runner.session.select import derive as derive
from runner.session.select import job_path as job_path
from runner.session.select import key_reader as key_reader
from runner.session.select import open_selected as open_selected
from runner.session.select import select
from runner.session.select import unpriced_model as unpriced_model
from runner.session.select import with_run_limits as with_run_limits

if TYPE_CHECKING:
    from runner.report.headline import Headline  # numpy (correlate): not at start-up
    from runner.report.write import Tables

__all__ = ["COLUMNS", "ModelPlan", "Results", "RunResult", "TaskSelection", "arun", "load_job",
           "plan", "rebuild", "rescore", "results", "run", "selection"]

JobLike = Job | TaskSelection | WorkingSet | str | os.PathLike[str]
"""A Job from load_job, a job file path, a name under jobs/ (`openmeva`), or a TaskSelection
(the job with its selection); the commands pass a WorkingSet they built with `selection`."""

DEFAULT_DATA_DIR = Path.home() / ".cache" / "judge-runner" / "data"


def load_job(path: str | os.PathLike[str]) -> Job:
    """The job file at `path` (or `jobs/NAME.toml` for a bare name), checked as `judge` checks it.

    Args:
        path: a job file path, or a name under jobs/.

    Returns:
        The Job, a frozen value to pass to `plan`, `run` or `rescore`.

    Raises:
        ConfigError: the file is missing or a key is wrong (the message names the key and the
            fix).
    """
    return _load_job(job_path(os.fspath(path)))


def selection(job: JobLike, *, data_dir: str | os.PathLike[str] | None = None,
              environ: Mapping[str, str] | None = None, stream: bool = False,
              download: Download | None = None, **choose: Any) -> WorkingSet:
    """The job, its judge models and items, the cache and the report folder a call works on.

    Args:
        job: a Job, a job file path or a name under jobs/ (with `choose`), or a TaskSelection
            (without). A WorkingSet is returned as it is.
        data_dir: the data sets' folder [default: JUDGE_DATA_DIR, else
            ~/.cache/judge-runner/data].
        environ: where JUDGE_CACHE_DIR, JUDGE_CACHE_URL, OPENAI_BASE_URL and the API keys are
            read [default: os.environ].
        stream: one pass over the tasks is all the caller needs (see runner.prepare.prepare).
        download: fetch missing registered data sets first (`judge run`).
        **choose: the fields of a TaskSelection: models, base_url, limit, sample, seed,
            cache_dir, cache_url, out (and shard, which only `judge run` takes).

    Returns:
        The WorkingSet, the TaskSelection it came from (defaults filled in) as its
        `task_selection`.

    Raises:
        RunnerError: a job, model, data or cache problem; TypeError: an unknown keyword, or
            keywords beside a TaskSelection.
    """
    if isinstance(job, WorkingSet):
        return job
    if isinstance(job, TaskSelection) and choose:
        raise TypeError(f"selection(): {', '.join(sorted(choose))} given beside a "
                        "TaskSelection; set them in the TaskSelection")
    env = os.environ if environ is None else environ
    chosen = job if isinstance(job, TaskSelection) else TaskSelection(job=job, **choose)
    sel = select(chosen.with_environment(env),
                 data_dir=Path(data_dir or env.get("JUDGE_DATA_DIR") or DEFAULT_DATA_DIR),
                 env_base_url=env.get("OPENAI_BASE_URL"), stream=stream, download=download)
    _register_keys(sel.job, env)
    return sel


def _whole(sel: WorkingSet, function: str) -> WorkingSet:
    """`sel`, which must be the whole job: the API runs no shard (a shard writes no reports)."""
    if sel.shard is not None:
        raise ConfigError(f"runner.{function}(shard={str(sel.shard)!r}): the Python API runs "
                          "whole jobs; run a shard with `judge run JOB --shard I/N`, then "
                          "runner.rescore(JOB) over the shared cache")
    return sel


def _register_keys(job: Job, env: Mapping[str, str]) -> None:
    """Every key the job's models read, and every variable named like a key, is scrubbed from
    whatever a server sends back before it is kept or raised."""
    names = {m.api_key_env for m in job.models} | {e.api_key_env for m in job.models
                                                    for e in m.endpoints}
    names |= {n for n in env if n.endswith(("_API_KEY", "_TOKEN", "_SECRET"))}
    for name in names:
        register_secret(env.get(name))


def plan(job: JobLike, **choose: Any) -> list[ModelPlan]:
    """What `run` would do, per judge model. No network; the numbers `judge plan` prints.

    Args:
        job: a Job, a job file path, a name under jobs/, or a TaskSelection.
        **choose: the selection, as for `selection` (and its data_dir, environ).

    Returns:
        One ModelPlan per model: `tasks`, `cached`, `repeats`, `calls`, `prompt_tokens`,
        `completion_tokens` (an upper bound), `cost` (USD online, None when the price is
        unknown) and `bill` (runner.estimate.Estimate: `bill.cost("online" | "caching" |
        "batch")`, `bill.short()` the prompts too short to be cached).
    """
    return estimate(_whole(selection(job, stream=True, **choose), "plan"))


@dataclass(frozen=True, slots=True)
class RunResult:
    """What `run`, `arun` or `rescore` did, and where its reports are."""

    out_dir: Path
    """The report folder (`runs/<job>` by default): its files are the newest report set."""
    run_dir: Path
    """This call's own reports, `out_dir/history/<run id>`: never overwritten."""
    stats: RunStats
    """Counts: total, cache_hits, api_calls, retries, failures (key -> reason), missing (keys
    with no answer), prompt_tokens, completion_tokens, cost."""
    headline: Headline
    """The correlation table `judge` prints (`lines`), judges mostly unparsed (`unparsed`),
    judges with no parsed score at all (`scoreless`), judges without spread (`no_spread`)."""

    @property
    def ok(self) -> bool:
        """Every task has an answer and every judge at least one score and some spread
        (`judge` exits 0)."""
        return not (self.stats.failures or self.stats.missing or self.headline.scoreless
                    or self.headline.no_spread)


def run(job: JobLike, **options: Any) -> RunResult:
    """Call the judges for every task not yet cached, then write the reports: `judge run`.

    Args:
        job: a Job (load_job), a job file path, a name under jobs/, or a TaskSelection.
        **options: the selection (models, base_url, limit, sample, seed, cache_dir, cache_url,
            out, data_dir, environ; see `selection`) and the run's own: concurrency, rpm, tpm,
            max_retries, timeout (seconds), until_ci (W: stop each judge once its 95% CIs
            are narrower, `judge run --until-ci`), offline (no call: report what is cached),
            budget (USD), on_progress (called with the RunStats as the pool goes).

    Returns:
        A RunResult. Failed tasks do not raise: they are in `stats.failures`, in the
        `failures` frame of `results`, and make `ok` False. A second run finds every answer in
        the cache and makes no call.

    Raises:
        RunnerError: a job, data, key or cache problem (before any call), a report folder that
            cannot be written, or an error that stopped the run (e.g. a rejected key).

    Inside a running event loop (a notebook cell) the pool runs on its own loop in a worker
    thread while this call waits; elsewhere on asyncio's loop in this thread.
    """
    # asyncio (~65 ms to import) here and in arun only: plan and rescore never load it
    import asyncio
    import concurrent.futures

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run_async(arun(job, **options))
    stoppers: list[Callable[[], object]] = []  # arun's: each stops its pool from this thread
    worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="judge-run")
    done = worker.submit(lambda: run_async(arun(job, _stoppers=stoppers, **options)))
    try:
        return done.result()
    except KeyboardInterrupt:
        # Jupyter's interrupt, as the CLI's first Ctrl-C: no new request; those in flight
        # finish and are cached, the reports are written, then the interrupt goes on (a
        # second one while this waits leaves the worker to finish alone)
        for stop in stoppers:
            stop()
        done.result()
        raise
    finally:
        worker.shutdown(wait=False)


_RUN_OPTIONS = ("concurrency", "rpm", "tpm", "max_retries", "timeout", "until_ci", "offline",
                "budget", "on_progress", "_stoppers")


async def arun(job: JobLike, **options: Any) -> RunResult:
    """`run` on the caller's event loop: `await runner.arun(job, models=[...])`.

    Args:
        job: as for `run`.
        **options: as for `run`.

    Returns:
        A RunResult, as `run`'s. Loading the job, reading the cache and writing the reports
        block the loop meanwhile.
    """
    import asyncio  # as in run

    started = time.time()
    run_options = {k: options.pop(k) for k in _RUN_OPTIONS if k in options}
    env: Mapping[str, str] = os.environ if options.get("environ") is None else options["environ"]
    sel = _whole(selection(job, **options), "run")
    sel = with_run_limits(sel, run_options)
    check_out(sel.out_dir)
    run = Run(sel, started=started, command=f"runner.run({sel.job.name!r})", environ=env,
              offline=bool(run_options.get("offline")), budget=run_options.get("budget"))
    run.check()
    with run.lease(run.command):
        # the pool's dispatch stops on `stop`, which run's thread sets through `_stoppers`
        stop, loop = asyncio.Event(), asyncio.get_running_loop()
        if (stoppers := run_options.get("_stoppers")) is not None:
            stoppers.append(lambda: loop.call_soon_threadsafe(stop.set))
        with run.serve() as (cache, served):  # local servers for `local:` models
            stats = await run.pool(cache, served, stop=stop,
                                   on_progress=run_options.get("on_progress") or (lambda _: None))
        if stats.fatal:
            raise APIError(f"{stats.fatal}; run stopped, nothing lost: rerun to resume")
        tables = run.report(stats)
    return _result(run.sel, stats, tables)


def rescore(job: JobLike, **choose: Any) -> RunResult:
    """Re-parse every cached answer with the current parsers and rewrite the reports, with no
    network: `judge rescore`.

    Args:
        job: a Job, a job file path, a name under jobs/, or a TaskSelection.
        **choose: the selection, as for `selection`.

    Returns:
        A RunResult; tasks with no cached answer are in `stats.missing` (and make `ok` False).
    """
    sel = _whole(selection(job, **choose), "rescore")
    stats, tables = rebuild(sel, started=time.time(),
                            command=f"runner.rescore({sel.job.name!r})")
    return _result(sel, stats, tables)


def _result(sel: WorkingSet, stats: RunStats, tables: Tables) -> RunResult:
    run_id = orjson.loads((sel.out_dir / "manifest.json").read_bytes()).get("run_id", "")
    return RunResult(out_dir=sel.out_dir, run_dir=sel.out_dir / HISTORY / run_id, stats=stats,
                     headline=tables.headline)


def results(run_folder: str | os.PathLike[str] | RunResult | Job, *,
            out: str | os.PathLike[str] | None = None) -> Results:
    """The reports of a run folder (`runs/<job>`, `runs/<job>/latest`,
    `runs/<job>/history/<run id>`; a RunResult: its own run; a Job, job file or job name: its
    report folder, `out` as for `run`) as DataFrames.

    Args:
        run_folder: a run folder, a RunResult, or a Job, job file or job name.
        out: with a job: its report folder, as given to `run` [default: the job's output_dir].

    Returns:
        Results: the frames scores, correlations, reliability, summary and failures (their
        columns and dtypes: COLUMNS).

    Raises:
        ConfigError: pandas is not installed (pip install judge-runner[pandas]).
        ReportError: the folder holds no reports, or a report is unreadable.
    """
    pd = import_pandas()
    if isinstance(run_folder, RunResult):
        folder = run_folder.run_dir
    elif isinstance(run_folder, Job) or not Path(run_folder).is_dir():
        job = run_folder if isinstance(run_folder, Job) else load_job(run_folder)
        folder = Path(out) if out else job.output_dir
    else:
        folder = Path(run_folder)
    return read_results(pd, folder)
