"""The Python API: a study from a notebook or a script, through the functions `judge` itself uses.

    import runner
    job = runner.load_job("examples/two-judges.toml")
    runner.plan(job, models=["gpt-4o-mini"])        # per model: tasks, cached, calls, cost
    done = runner.run(job, models=["gpt-4o-mini"])  # same cache and resume as `judge run`
    frames = runner.results(done)                   # pandas DataFrames of its reports

Every function takes the selection the commands take (runner/selection.py), as keyword
arguments: `models` (--model, repeatable), `base_url`, `limit` or `sample` with `seed`,
`cache_dir`, `cache_url` (--cache), `out`; or as one `TaskSelection(job=..., models=...)` in
place of the job (its `shard`, `judge run --shard`'s, is refused: the API runs whole jobs).
And `data_dir` and `environ` (default os.environ), where the commands read JUDGE_DATA_DIR,
JUDGE_CACHE_DIR, JUDGE_CACHE_URL, OPENAI_BASE_URL and the models' API keys. Unset, they mean
what the commands' defaults mean, so `run(job)` and `judge run JOB` in the same folder share one
cache and one `runs/<job>/`.

Nothing here prints or exits: a problem is a RunnerError (runner/errors.py) with the message
`judge` would print after "Error:". `run` works inside a running event loop (Jupyter's): it
runs the pool on its own loop in a worker thread and waits; `await arun(...)` runs it on the
caller's loop instead. pandas is needed by `results` only (`pip install judge-runner[pandas]`),
imported there and nowhere else in the runner.

`cli` calls `selection`, `plan`, `report_run` and `rebuild` for its `run`, `plan`, `rescore`,
`report` and `import`, so the commands and the API cannot drift apart.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from runner.errors import APIError, ConfigError, ReportError, register_secret
from runner.execute.stats import RunStats
from runner.execute.store.backend import CacheBackend
from runner.execute.store.lease import describe, lease_name
from runner.job.load import load_job as _load_job
from runner.job.spec import Job
from runner.reduce.judgments import Judgment, judge
from runner.report.folder import HISTORY, check_out
from runner.selection import TaskSelection
from runner.session import (
    BatchAnswers,
    Download,
    ModelPlan,
    Selection,
    TaskLog,
    check_budget,
    check_keys,
    check_until_ci,
    estimate,
    job_path,
    key_reader,
    manifest,
    open_selected,
    run_async,
    run_pool,
    select,
    serving,
    with_run_limits,
)

if TYPE_CHECKING:
    from pandas import DataFrame

    from runner.report.headline import Headline  # numpy (correlate): not at start-up
    from runner.report.write import Tables

__all__ = ["COLUMNS", "ModelPlan", "Results", "RunResult", "TaskSelection", "arun",
           "judged_dispatched", "load_job", "plan", "rebuild", "report_run", "rescore", "results",
           "run", "selection"]

JobLike = Job | TaskSelection | Selection | str | os.PathLike[str]
"""A Job from load_job, a job file path, a name under jobs/ (`openmeva`), or a TaskSelection
(the job with its selection); the commands pass a Selection they built with `selection`."""

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
              download: Download | None = None, **choose: Any) -> Selection:
    """The job, its judge models and items, the cache and the report folder a call works on.

    Args:
        job: a Job, a job file path or a name under jobs/ (with `choose`), or a TaskSelection
            (without). A Selection is returned as it is.
        data_dir: the data sets' folder [default: JUDGE_DATA_DIR, else
            ~/.cache/judge-runner/data].
        environ: where JUDGE_CACHE_DIR, JUDGE_CACHE_URL, OPENAI_BASE_URL and the API keys are
            read [default: os.environ].
        stream: one pass over the tasks is all the caller needs (see runner.prepare.prepare).
        download: fetch missing registered data sets first (`judge run`).
        **choose: the fields of a TaskSelection: models, base_url, limit, sample, seed,
            cache_dir, cache_url, out (and shard, which only `judge run` takes).

    Returns:
        The Selection, the TaskSelection it came from (defaults filled in) as its
        `task_selection`.

    Raises:
        RunnerError: a job, model, data or cache problem; TypeError: an unknown keyword, or
            keywords beside a TaskSelection.
    """
    if isinstance(job, Selection):
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


def _whole(sel: Selection, function: str) -> Selection:
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
    # asyncio (~65 ms to import) here and in _pool only: plan and rescore never load it
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


def _environ(options: Mapping[str, Any]) -> Mapping[str, str]:
    given: Mapping[str, str] | None = options.get("environ")
    return os.environ if given is None else given


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
    started = time.time()
    run_options = {k: options.pop(k) for k in _RUN_OPTIONS if k in options}
    env = _environ(options)
    sel = _whole(selection(job, **options), "run")
    sel = with_run_limits(sel, run_options)
    check_out(sel.out_dir)
    offline, budget = bool(run_options.get("offline")), run_options.get("budget")
    if not offline:
        check_keys(sel.job, env)
        check_budget(sel.job, budget)
    check_until_ci(sel.job, sharded=False, batch=False)
    command = f"runner.run({sel.job.name!r})"
    lease = lease_name(sel.job.name, None)
    with open_selected(sel) as leased, (contextlib.nullcontext() if offline
                                        else leased.lease(lease, describe(command))):
        dispatched = TaskLog()
        stats, sel = await _pool(sel, env, dispatched, offline=offline, budget=budget,
                                 on_progress=run_options.get("on_progress"),
                                 stoppers=run_options.get("_stoppers"))
        if stats.fatal:
            raise APIError(f"{stats.fatal}; run stopped, nothing lost: rerun to resume")
        tables = report_run(sel, stats, dispatched, started=started, command=command)
    return _result(sel, stats, tables)


async def _pool(sel: Selection, env: Mapping[str, str], dispatched: TaskLog, *, offline: bool,
                budget: float | None, on_progress: Callable[[RunStats], None] | None,
                stoppers: list[Callable[[], object]] | None) -> tuple[RunStats, Selection]:
    """The pool over the selection, local servers started for `local:` models, keys read
    from `env` at call time (never stored); a function that stops its dispatch from any
    thread is added to `stoppers`."""
    import asyncio  # as in run

    stop, loop = asyncio.Event(), asyncio.get_running_loop()
    if stoppers is not None:
        stoppers.append(lambda: loop.call_soon_threadsafe(stop.set))
    servers = contextlib.nullcontext(sel.job) if offline else serving(sel.job)
    with open_selected(sel) as cache, servers as served:
        return await run_pool(sel, served, cache, stop=stop, key_reader=key_reader(env),
                              offline=offline, budget=budget,
                              on_progress=on_progress or (lambda _: None),
                              dispatched=dispatched)


def judged_dispatched(sel: Selection, cache: CacheBackend, stats: RunStats,
                      dispatched: TaskLog) -> Iterator[Judgment]:
    """The judgments of the tasks the pool dispatched.

    Args:
        sel: the run's selection.
        cache: its open cache, to read the answers from.
        stats: the run's counters: its failures (damaged records among them) and the keys
            it called (their judgments are marked fresh).
        dispatched: the tasks the pool dispatched, read once and emptied.

    Returns:
        The judgments, streamed in the order of `dispatched`.
    """
    return judge(sel.expansion, cache, failures=stats.failures, fresh=frozenset(stats.called),
                 tasks=dispatched.drain(), count=len(dispatched), damaged=stats.failures)


def report_run(sel: Selection, stats: RunStats, dispatched: TaskLog, *, started: float,
               command: str, extra: Mapping[str, Any] | None = None) -> Tables:
    """A run's reports, written into sel.out_dir.

    Args:
        sel: the run's selection.
        stats: the run's counters (failures, keys called, tokens, cost).
        dispatched: the tasks the pool dispatched (emptied).
        started: when the run started (seconds since the epoch), for the manifest.
        command: the command line (or API call), for the manifest.
        extra: more manifest keys (the batch stage's).

    Returns:
        The reports' tables (their headline: the correlations `judge` prints).
    """
    from runner.report.write import write_reports  # numpy: only where reports are written
    answers = BatchAnswers()
    # reads only (an offline run's folder may be read-only); the manifest once judged: damaged
    # records are failures
    with open_selected(sel, read_only=True) as cache:
        judgments = judged_dispatched(sel, cache, stats, dispatched)
        return write_reports(sel.out_dir, sel.expansion, answers.watch(judgments),
                             lambda _: {**manifest(sel, stats, started, command),
                                        **(extra or {}), "batch_answers": answers.answers},
                             answers.notes)


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


def rebuild(sel: Selection, *, started: float, command: str) -> tuple[RunStats, Tables]:
    """Reports from the cache alone, in one pass, the counts taken as the judgments go by.

    Args:
        sel: the selection to report on.
        started: when the command started (seconds since the epoch), for the manifest.
        command: the command line (or API call), for the manifest.

    Returns:
        The counts (cache hits, repeats, tasks with no answer, damaged records as failures)
        and the reports' tables.
    """
    stats, answers = RunStats(), BatchAnswers()

    def counted(tables: Tables) -> dict[str, Any]:
        # a damaged record is a failure (stats.failures), not a task never run
        stats.total, stats.duplicates = tables.tasks, tables.tasks - tables.distinct
        stats.missing = [k for k in tables.missing if k not in stats.failures]
        stats.cache_hits = tables.distinct - len(tables.missing)
        return {**manifest(sel, stats, started, command, "rebuild"),
                "batch_answers": answers.answers}

    with open_selected(sel, read_only=True) as cache:
        # a large job's readers start now, and read
        judged = judge(sel.expansion, cache, damaged=stats.failures)
        from runner.report.write import write_reports  # while the reports' modules load
        tables = write_reports(sel.out_dir, sel.expansion, answers.watch(judged), counted,
                               answers.notes)
    return stats, tables


def _result(sel: Selection, stats: RunStats, tables: Tables) -> RunResult:
    run_id = orjson.loads((sel.out_dir / "manifest.json").read_bytes()).get("run_id", "")
    return RunResult(out_dir=sel.out_dir, run_dir=sel.out_dir / HISTORY / run_id, stats=stats,
                     headline=tables.headline)


TEXT, REAL, COUNT = "string", "float64", "Int64"
COLUMNS: dict[str, dict[str, str]] = {
    "scores": {"dataset": TEXT, "item_id": TEXT, "group": TEXT, "system": TEXT,
               "subset": TEXT, "prompt": TEXT, "aspect": TEXT, "model": TEXT,
               "judge_score": REAL, "human_score": REAL},
    "correlations": {"dataset": TEXT, "aspect": TEXT, "judge": TEXT, "level": TEXT,
                     "method": TEXT, "subset": TEXT, "value": REAL, "n_groups": COUNT,
                     "n_items": COUNT, "ci_low": REAL, "ci_high": REAL, "n_systems": COUNT},
    "reliability": {"dataset": TEXT, "aspect": TEXT, "figure": TEXT, "a": TEXT, "b": TEXT,
                    "statistic": TEXT, "value": REAL, "n": COUNT, "p_value": REAL},
    "summary": {"dataset": TEXT, "prompt": TEXT, "aspect": TEXT, "model": TEXT, "n": COUNT,
                "scored": COUNT, "mean": REAL, "std": REAL, "parse_failures": COUNT,
                "refusals": COUNT, "api_failures": COUNT},
    "failures": {"dataset": TEXT, "item_id": TEXT, "prompt": TEXT, "aspect": TEXT,
                 "model": TEXT, "sample": COUNT, "kind": TEXT, "message": TEXT, "raw": TEXT,
                 "key": TEXT},
}
"""Each frame of `results`: its first columns, in order, with their pandas dtypes (text is
"string", missing as <NA>; a missing number is NaN or <NA>). Columns a report adds later come
after them: scores' metric columns (float64), and any other as "string"."""


@dataclass(frozen=True, slots=True)
class Results:
    """A run folder's reports as pandas DataFrames (columns and dtypes: COLUMNS)."""

    scores: DataFrame
    """scores.csv: one row per item, prompt, aspect and model; judge and human score, metrics."""
    correlations: DataFrame
    """correlations.csv: every judge's and metric's correlation with the humans, 95% CI."""
    reliability: DataFrame
    """reliability.csv: agreement, self-consistency, position and length bias."""
    summary: DataFrame
    """summary.csv: per judge, counts, mean, std, parse failures, refusals, API failures."""
    failures: DataFrame
    """judgments.jsonl's failed tasks: `kind` (parse, refusal, api, ...), message, raw answer."""


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
    try:
        import pandas as pd  # the runner's only pandas import: an optional extra
    except ImportError:
        raise ConfigError("results() needs pandas, an optional extra: "
                          "pip install judge-runner[pandas]") from None
    if isinstance(run_folder, RunResult):
        folder = run_folder.run_dir
    elif isinstance(run_folder, Job) or not Path(run_folder).is_dir():
        job = run_folder if isinstance(run_folder, Job) else load_job(run_folder)
        folder = Path(out) if out else job.output_dir
    else:
        folder = Path(run_folder)
    if not (folder / "correlations.csv").is_file():
        raise ReportError(f"{folder}: no reports here (no correlations.csv); pass a run folder: "
                          "runs/<job>, runs/<job>/latest or runs/<job>/history/<run id>")
    # every cell as text first: the dtypes are COLUMNS', not pandas' guesses
    frames = {name: _typed(pd, _read(folder / f"{name}.csv", lambda p: pd.read_csv(
        p, dtype=str, keep_default_na=False)) if name != "scores" or
        (folder / "scores.csv").is_file() or not (folder / "scores.parquet").is_file()
        else _read(folder / "scores.parquet", pd.read_parquet), name)  # scores_csv = false
        for name in ("scores", "correlations", "reliability", "summary")}
    failures = _read(folder / "judgments.jsonl", lambda p: list(_failures(p)))
    return Results(**frames, failures=_typed(
        pd, pd.DataFrame(failures, columns=list(COLUMNS["failures"])), "failures"))


def _read(path: Path, read: Callable[[Path], Any]) -> Any:
    """read(path), or a ReportError saying how to get the file back."""
    if not path.is_file():
        raise ReportError(f"{path}: missing from the run folder; rebuild the reports with "
                          "`judge report JOB` (or runner.rescore)")
    try:
        return read(path)
    except (OSError, ValueError) as exc:  # orjson's and pandas' parse errors are ValueErrors
        raise ReportError(f"{path}: unreadable ({exc}); rebuild the reports with "
                          "`judge report JOB` (or runner.rescore)") from None


def _typed(pd: Any, frame: DataFrame, name: str) -> DataFrame:
    """`frame` with COLUMNS[name] first, in their dtypes; later columns after them (numbers:
    scores' metrics as float64; else "string")."""
    schema = COLUMNS[name]
    out = pd.DataFrame(index=frame.index)
    for column in [*schema, *(c for c in frame.columns if c not in schema)]:
        values = frame[column] if column in frame.columns else pd.Series([""] * len(frame),
                                                                          index=frame.index)
        dtype = schema.get(column, REAL if name == "scores" else TEXT)
        if dtype == TEXT:
            out[column] = values.astype("string").replace("", pd.NA)
        else:
            numbers = pd.to_numeric(values, errors="coerce")  # "" and "nan": NaN
            out[column] = numbers.astype(dtype) if dtype == REAL else \
                numbers.round().astype(COUNT)
    return out


def _failures(path: Path) -> Iterator[dict[str, Any]]:
    """judgments.jsonl's failed tasks, one dict each in COLUMNS["failures"]'s order."""
    with path.open("rb") as f:
        for line in f:
            j = orjson.loads(line)
            error = j.get("error")
            if error is None:
                continue
            raw = j.get("raw")
            yield {"dataset": j["dataset"], "item_id": j["item_id"], "prompt": j["prompt"],
                   "aspect": j["aspect"], "model": j["model"], "sample": j.get("sample"),
                   "kind": error.get("type"), "message": error.get("message"),
                   "raw": raw if raw is None or isinstance(raw, str) else
                   orjson.dumps(raw).decode(), "key": j.get("key")}
