"""One command's working set, and the run itself: selection, local servers, the two-stage pool.

`cli` and `api` read the environment and hand in what they found (a mapping, never read here
directly);
this module resolves the job's models, loads and expands the job (with any generated data sets
derived from the cache), starts local servers, runs the pool (generation stage first, then the
judges), and builds the manifest. It prints nothing and never exits.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import itertools
import sys
import time
from array import array
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from runner.data import datasets
from runner.data.seen import Seen, key64
from runner.errors import ConfigError, MissingKeyError, redact_url, register_secret, scrub
from runner.estimate import Estimate, estimate_cost
from runner.execute import local
from runner.execute.shard import Shard, split_limits
from runner.execute.store.backend import CacheBackend, cached_flags, is_url, open_cache
from runner.expand import Expansion
from runner.expand_ahead import with_key_index
from runner.job.load import load_job
from runner.job.models import parse_model_spec, url_problem
from runner.job.providers import Bill
from runner.job.spec import Job, ModelSpec
from runner.prepare import prepare
from runner.reduce.judgments import READ_BATCH, CachedFirst, Judgment, choices
from runner.selection import DEFAULT_CACHE_DIR, TaskSelection
from runner.tasks import Task, new_task, task_key

if TYPE_CHECKING:
    from runner.execute.stats import RunStats
    from runner.reduce.stopping import UntilCI

__all__ = ["BatchAnswers", "Download", "ModelPlan", "Selection", "TaskLog", "all_tasks",
           "answer_text", "check_budget", "check_keys", "check_until_ci", "estimate", "job_path",
           "key_reader", "manifest", "run_async", "run_pool", "select", "serving",
           "unpriced_model", "with_run_limits"]

PACKAGES = ("judge-runner", "aiohttp", "openai", "aiolimiter", "diskcache", "orjson", "scipy",
            "click")


@dataclass(frozen=True, slots=True)
class Selection:
    """What a command works on: the job, its models and items, the cache and output dirs."""

    job: Job
    expansion: Expansion
    cache_dir: Path
    out_dir: Path
    missing_answers: int = 0
    """Generation tasks with no cached answer yet (their items are not judged yet)."""
    cache_url: str | None = None
    """A shared cache (postgresql://...) used instead of cache_dir; see open_selected."""
    shard: Shard | None = None
    """`judge run --shard I/N`: `expansion` holds only this shard's items (see `select`)."""
    task_selection: TaskSelection | None = None
    """The selection this was resolved from, its defaults filled in (the manifest's
    `selection`)."""


T = TypeVar("T")


def run_async(work: Awaitable[T]) -> T:
    """`asyncio.run(work)` on asyncio's own event loop, without handing asyncio its result.
    (uvloop's loop was tried and removed: 0.97x at 0 ms and 0.99x at 200 ms as a whole `judge
    run`, bench/README.md "What each mechanism buys".)

    On Python 3.11, asyncio.run formats the repr of its main task, result included, when it
    restores its SIGINT handler (signal.getsignal tries the handler, a partial holding the
    task, as a signal.Handlers value and builds the ValueError's message). Results hold sets
    of keys and Selections: a Selection of 25k items took 0.5 s and 70 MB to format."""
    import asyncio  # here: ~65 ms that rescore and a fully cached run never need

    box: list[T] = []

    async def main() -> None:
        box.append(await work)

    with asyncio.Runner() as runner:
        runner.run(main())
    return box[0]


RUN_LIMITS = (("concurrency", "concurrency"), ("rpm", "rpm"), ("tpm", "tpm"),
              ("max_retries", "max_retries"), ("timeout", "timeout_s"), ("until_ci", "until_ci"))
"""`judge run`'s (and runner.run's) option -> the job's `[limits]` field it replaces."""


def with_run_limits(sel: Selection, options: Mapping[str, Any]) -> Selection:
    """The selection with a run's own limits over the job's.

    Args:
        sel: the selection.
        options: the run's options by name (concurrency, rpm, tpm, max_retries, timeout,
            until_ci); one left out or None keeps the job's.

    Returns:
        `sel` with its job's `[limits]` replaced where an option was given.
    """
    given = {field: options[name] for name, field in RUN_LIMITS
             if options.get(name) is not None}
    return replace(sel, job=sel.job.with_limits(**given))


def key_reader(environ: Mapping[str, str]) -> Callable[[str], Callable[[], str | None]]:
    """Readers of the API keys in `environ`, each read at call time (never stored).

    Args:
        environ: the environment the keys are read from.

    Returns:
        Variable name -> its key's reader (None where unset). Every key read is registered
        to be scrubbed from whatever a server sends back (runner.errors.scrub).
    """
    def reader(name: str) -> Callable[[], str | None]:
        register_secret(environ.get(name))
        return lambda: environ.get(name) or None
    return reader


def job_path(job: str) -> Path:
    """The job file a command names.

    Args:
        job: a job file path, or the name of one under jobs/ (`openmeva`).

    Returns:
        The path (`openmeva` -> jobs/openmeva.toml).

    Raises:
        ConfigError: a folder, or no such file and no jobs/NAME.toml.
    """
    path = Path(job)
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.toml"))[:3]
        hint = f" ({', '.join(found)} there)" if found else ""
        raise ConfigError(f"{job}: is a folder, not a job file; pass the job's .toml file"
                          f"{hint}")
    if path.suffix == ".toml" or path.exists():
        return path
    named = Path("jobs") / f"{job}.toml"
    if not named.exists():
        raise ConfigError(f"{job}: no such job file, and no jobs/{job}.toml; pass a path or a "
                          "name under jobs/")
    return named


def open_selected(sel: Selection, *, read_only: bool = False) -> CacheBackend:
    """The selection's cache, opened.

    Args:
        sel: the selection.
        read_only: the caller only reads, so a folder it may not write is read as it is.

    Returns:
        The shared database when a URL was given, else the folder (a context manager).
    """
    return open_cache(sel.cache_url if sel.cache_url and is_url(sel.cache_url) else sel.cache_dir,
                      read_only=read_only)


def _model_with(m: ModelSpec, **changes: Any) -> ModelSpec:
    return ModelSpec(**{**{f.name: getattr(m, f.name) for f in fields(m)}, **changes})


def resolve_models(job: Job, specs: tuple[str, ...], base_url: str | None,
                   env_base_url: str | None) -> tuple[ModelSpec, ...]:
    """The job's models after --model and --base-url.

    Args:
        job: the job as loaded.
        specs: --model's specs: they replace the judges (generators stay); none: the job's.
        base_url: --base-url, the endpoint of bare model names.
        env_base_url: OPENAI_BASE_URL, the endpoint without --base-url.

    Returns:
        The models, bare names given their endpoint.

    Raises:
        ConfigError: a bad URL, or a bare name with no endpoint.
    """
    for where, url in (("--base-url", base_url), ("OPENAI_BASE_URL", env_base_url)):
        if url and (problem := url_problem(url)):
            raise ConfigError(f"{where} {problem}")
    fallback = base_url or env_base_url
    generators = {name for g in job.generate for name in g.models}
    models = job.models
    if specs:
        kept = tuple(m for m in job.models if m.name in generators)
        models = kept + tuple(parse_model_spec(s, base_url=base_url) for s in specs)
    resolved = []
    for m in models:
        if m.kind == "compatible" and (base_url or m.base_url is None):
            if not fallback:
                # the URL is part of its cache keys (ModelSpec.endpoint): a command that
                # calls nothing (rescore, run --offline) finds no answer without it either
                raise ConfigError(f"{job.path}: model {m.spec!r} needs its server's URL, even "
                                  "offline (its answers are cached under it): pass --base-url "
                                  "http://HOST:PORT/v1, set OPENAI_BASE_URL, or use openai:NAME")
            m = _model_with(m, base_url=fallback)
        resolved.append(m)
    return tuple(resolved)


def answer_text(record: Mapping[str, Any] | None) -> str | None:
    """A generation stage's answer.

    Args:
        record: a cached record (None: not cached).

    Returns:
        The text of its first choice; None when not cached or without a choice.
    """
    if record is None:
        return None
    got = choices(record["response"])
    return got[0].text if got else None


@dataclass(frozen=True, slots=True)
class Download:
    """Fetch missing registered data sets before expanding (`judge run`, first use)."""

    mirror: str | None
    notify: Callable[[str, int], None]
    """Called with the data set's name and its number of missing files, before fetching."""


def select(chosen: TaskSelection, *, data_dir: Path, env_base_url: str | None = None,
           stream: bool = False, download: Download | None = None) -> Selection:
    """Load, resolve and expand a job; generated data sets come from the cache as it is.

    Args:
        chosen: the task selection; its cache location as given (see
            CacheLocation.with_environment: a cache_dir left None is ./cache).
        data_dir: where the data sets' files are.
        env_base_url: OPENAI_BASE_URL, the endpoint of bare model names without --base-url.
        stream: one pass over the tasks is all the caller needs (see runner.prepare.prepare).
        download: fetch the job's missing registered data sets first (`judge run`).

    Returns:
        The Selection: the job (its judges replaced by `chosen.models`, a shard's rpm and tpm
        divided among the shards), its expansion, cache and report folder, and `chosen` with
        its defaults filled in.

    Raises:
        RunnerError: a job, model, data or download problem.
    """
    job = chosen.job if isinstance(chosen.job, Job) else load_job(job_path(chosen.job_name()))
    if download is not None:
        _download(job, data_dir, download)
    job = job.with_models(resolve_models(job, chosen.models, chosen.base_url, env_base_url))
    if chosen.models:  # prompts' own judge lists name the replaced models
        job = replace(job, prompts=tuple(replace(p, models=()) for p in job.prompts))
    if chosen.shard is not None:
        job = split_limits(job, chosen.shard.count)
    expansion = prepare(job, data_dir, limit=chosen.limit, stream=stream, sample=chosen.drawn(),
                        keep=None if chosen.shard is None else chosen.shard.owns)
    out_dir = chosen.out if chosen.out is not None else job.output_dir
    cache_dir = chosen.cache_dir or DEFAULT_CACHE_DIR
    with_defaults = replace(chosen, cache_dir=cache_dir, out=out_dir,
                            seed=None if chosen.sample is None else chosen.seed or 0)
    sel = Selection(job=job, expansion=expansion, cache_dir=cache_dir, out_dir=out_dir,
                    cache_url=chosen.cache_url, shard=chosen.shard, task_selection=with_defaults)
    return derive(sel) if job.generate else sel


def _download(job: Job, data_dir: Path, download: Download) -> None:
    """Registered data sets of the job with files missing from `data_dir`: fetched from their
    pinned upstream URLs, every file checked against its sha256."""
    for name in [d.name for d in job.datasets if d.path is None and d.name in datasets.REGISTRY]:
        missing = [f for f in datasets.REGISTRY[name].files if not (data_dir / f.path).is_file()]
        if missing:
            download.notify(name, len(missing))
            datasets.fetch(name, data_dir, mirror=download.mirror)


def derive(sel: Selection) -> Selection:
    """The generated data sets rebuilt from the answers now in the cache.

    Args:
        sel: a selection of a job with a generation stage.

    Returns:
        `sel` with the generated items, and the number of generation answers still missing
        (`missing_answers`).
    """
    with open_selected(sel, read_only=True) as cache:
        expansion, missing = sel.expansion.with_generated(
            lambda task: answer_text(cache.get(task.key)))
    return replace(sel, expansion=expansion, missing_answers=missing)


def check_keys(job: Job, environ: Mapping[str, str]) -> None:
    """Every key the job's models need is set, before the first call.

    Args:
        job: the job (its models and fleet endpoints name their key variables).
        environ: the environment the keys are read from.

    Raises:
        MissingKeyError: a model or endpoint that needs a key has none (named).
    """
    for m in job.models:
        if m.key_required and not environ.get(m.api_key_env):
            raise MissingKeyError(f"{job.path}: model {m.name!r} ({m.spec}) needs an API key: "
                                  f"set {m.api_key_env} (no call was made)")
        for e in m.endpoints if m.key_required else ():  # a fleet: each replica's own key
            if not environ.get(e.api_key_env):
                raise MissingKeyError(f"{job.path}: model {m.name!r} endpoint {e.base_url} "
                                      f"needs an API key: set {e.api_key_env} (no call was made)")


def unpriced_model(job: Job) -> bool:
    """Whether one of the job's models has no price (a local model costs nothing).

    Args:
        job: the job (as selected: its judges and generators).

    Returns:
        True when a cost involving that model is unknown: a run or rebuild of the job says
        `cost unknown` (null in its manifest) even where it called nothing, as its paid run
        did, rather than ~$0.
    """
    return any(estimate_cost(m, 0, 0) is None for m in job.models)


def check_budget(job: Job, budget: float | None) -> None:
    """--budget can be kept: every model has a price.

    Args:
        job: the job.
        budget: --budget in USD; None: no budget, nothing to check.

    Raises:
        ConfigError: a model without a price (named, with the price line to add).
    """
    if budget is None:
        return
    for m in job.models:
        if estimate_cost(m, 1, 1) is None:
            raise ConfigError(f"{job.path}: --budget needs a price for model {m.name!r} "
                              f"({m.model}): add [models.{m.name}] price = {{input = USD_PER_1M, "
                              "output = USD_PER_1M}")


def check_until_ci(job: Job, *, sharded: bool, batch: bool) -> None:
    """--until-ci can run this job: one process, online, item prompts, no generation stage.

    Args:
        job: the job, its limits with until_ci.
        sharded: the run is one shard (--shard).
        batch: the run goes through a provider batch (--batch, or a model in batch mode).

    Raises:
        ConfigError: the combination, named, with what to drop.
    """
    if job.limits.until_ci is None:
        return
    why = ("--shard" if sharded else "--batch (a batch is bought whole)" if batch
           else "a generation stage" if job.generate
           else "group prompts (per = \"group\")" if any(p.per == "group" for p in job.prompts)
           else None)
    if why is not None:
        raise ConfigError(f"{job.path}: --until-ci (limits.until_ci) judges the items of one "
                          f"run group by group and cannot run with {why}; drop one of them")


@contextlib.contextmanager
def serving(job: Job) -> Iterator[Job]:
    """Start the embedded local server for `local:` models for the duration of the block.

    Args:
        job: the job.

    Yields:
        The job with each `local:` model's base URL set to its server's (the job as it is
        when it has none).
    """
    if not any(m.kind == "local" for m in job.models):
        yield job
        return
    with contextlib.ExitStack() as stack:
        models = []
        for m in job.models:
            if m.kind == "local":
                server = stack.enter_context(local.LocalServer(m.model))
                m = _model_with(m, base_url=server.base_url)
            models.append(m)
        yield job.with_models(tuple(models))


async def run_pool(sel: Selection, served: Job, cache: CacheBackend, *, stop: Any,
                   key_reader: Callable[[str], Callable[[], str | None]], offline: bool,
                   budget: float | None, on_progress: Callable[[RunStats], None],
                   dispatched: TaskLog, in_batches: frozenset[str] = frozenset(),
                   cached_first: CachedFirst | None = None,
                   say: Callable[[str], None] = lambda message: None
                   ) -> tuple[RunStats, Selection]:
    """Generation stage (if any), then every judge task, through the pool.

    Args:
        sel: the selection (with --shard: only its shard's tasks run).
        served: sel.job with the base URLs of the local servers `serving` started.
        cache: the selection's open cache.
        stop: an asyncio.Event: set, the pool dispatches nothing more.
        key_reader: variable name -> its API key's reader (see `key_reader`).
        offline: no call: what is not cached is counted as not run.
        budget: stop dispatching before the estimated spend passes this many USD.
        on_progress: called with the counters as the pool goes.
        dispatched: logs the judge tasks as they are dispatched, for the reports.
        in_batches: keys a live provider batch holds: never called, counted as not run.
        cached_first: a CachedFirst pass that judged the tasks before `cached_first.uncached_onward`
            (a job without a generation stage): the pool runs the rest, with its counters.
        say: prints a line for the user (a full cache disk, and when it has room again).

    Returns:
        The counters, and the selection with the generated data sets derived from the
        generators' answers.
    """
    # Here, not at the top: aiohttp costs ~0.15 s to import, which plan, status and the
    # report commands would pay for nothing.
    import aiohttp

    from runner.execute.pool import Endpoint, execute
    from runner.execute.stats import RunStats
    endpoints = {m.name: Endpoint(model=m, base_url=m.base_url or "",
                                  api_key=key_reader(m.api_key_env), key_reader=key_reader)
                 for m in served.models}
    limits = sel.job.limits
    connector = aiohttp.TCPConnector(limit=limits.concurrency, limit_per_host=0)
    stats = RunStats() if cached_first is None else cached_first.stats
    async with aiohttp.ClientSession(connector=connector) as session:
        run = {"cache": cache, "session": session, "endpoints": endpoints, "limits": limits,
               "stop": stop, "offline": offline, "budget": budget, "stats": stats,
               "on_progress": on_progress, "say": say}
        if sel.job.generate:
            stats.total += sum(1 for _ in sel.expansion.generation_tasks())
            generation = sel.expansion.generation_tasks()
            await execute(_not_in_batches(generation, in_batches, stats), **run)
            if stop.is_set():
                return stats, sel
            sel = derive(sel)  # judge what the generators answered
        until = _until_ci(sel, cache, stats) if cached_first is None else None
        if cached_first is None:
            count = sel.expansion.count()
            stats.total += count
            tasks = sel.expansion.tasks() if until is None else until.tasks()
            if sel.shard is None and until is None:  # the job's keys, kept for its rescore
                tasks = with_key_index(cache, sel.expansion, READ_BATCH, count, tasks)
        else:  # counted, and the tasks before its uncached_onward judged, by that pass
            assert cached_first.uncached_onward is not None, "a fully cached pass needs no pool"
            tasks = cached_first.uncached_onward
        logged = _logged(tasks, dispatched)
        await execute(_not_in_batches(logged, in_batches, stats), **run,
                      hashes=None if cached_first is None else cached_first.hashes,
                      holds=None if until is None else until.holds)
    if until is not None:
        stats.until_ci = until.verdicts(stopped=stop.is_set())
    return stats, sel


def _until_ci(sel: Selection, cache: CacheBackend, stats: RunStats) -> UntilCI | None:
    """The --until-ci rule of the run (limits.until_ci), its order the --sample draw's."""
    # here, not at the top: it imports numpy (~0.15 s, and BLAS threads, which would keep
    # runner.expand_ahead from forking) for every command that imports this module
    from runner.reduce.stopping import UntilCI
    width = sel.job.limits.until_ci
    seed = sel.task_selection.seed if sel.task_selection is not None else None
    return None if width is None else UntilCI(sel.expansion, cache, stats, width, seed or 0)


class TaskLog:
    """The judge tasks a run dispatched, in order, for the reports to judge afterwards instead
    of expanding the job a second time: ~42 bytes a task where a list of Tasks without bodies
    held ~230 (10M tasks: ~0.4 GB instead of 2.3 GB).

    Per task: its sha256 key as 32 bytes, the index of its (data set, item id, members) and the
    index of its (prompt, aspect, model, sample). Consecutive tasks of one item share the first
    (one tuple an item), and a job has few of the second. Tasks come back without their bodies
    and token estimates (body b"", prompt_tokens and max_tokens 0): the reports read neither.
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._keys = bytearray()
        self._units: list[tuple[str, str, tuple[str, ...]]] = []
        self._unit_of = array("I")
        self._kinds: list[tuple[str, str, str, int]] = []
        self._kind_index: dict[tuple[str, str, str, int], int] = {}
        self._kind_of = array("H")

    def __len__(self) -> int:
        return len(self._unit_of)

    def append(self, task: Task) -> None:
        """Log `task` (its key, item and kind; not its body)."""
        self._keys += bytes.fromhex(task.key)
        unit = (task.dataset, task.item_id, task.members)
        if not self._units or self._units[-1] != unit:
            self._units.append(unit)
        self._unit_of.append(len(self._units) - 1)
        kind = (task.prompt, task.aspect, task.model, task.sample)
        index = self._kind_index.get(kind)
        if index is None:
            index = self._kind_index[kind] = len(self._kinds)
            self._kinds.append(kind)
        self._kind_of.append(index)

    def drain(self) -> Iterator[Task]:
        """The tasks once, in order; the log is emptied when they have all been read (the
        reports read it once, and hold their own tables after it)."""
        yield from self
        self.clear()

    def __iter__(self) -> Iterator[Task]:
        keys, units, kinds = memoryview(self._keys), self._units, self._kinds
        for i, (unit, kind) in enumerate(zip(self._unit_of, self._kind_of, strict=True)):
            dataset, item_id, members = units[unit]
            prompt, aspect, model, sample = kinds[kind]
            yield new_task(key=keys[32 * i:32 * i + 32].hex(), dataset=dataset,
                           item_id=item_id, prompt=prompt, aspect=aspect, model=model,
                           sample=sample, body=b"", prompt_tokens=0, max_tokens=0,
                           members=members)


def _logged(tasks: Iterator[Task], log: TaskLog) -> Iterator[Task]:
    """Pass tasks through, appending each to `log` for the reports (see TaskLog)."""
    for task in tasks:
        log.append(task)
        yield task


def _not_in_batches(tasks: Iterator[Task], in_batches: frozenset[str], stats: RunStats
                    ) -> Iterator[Task]:
    """The tasks whose key no live provider batch holds; the others are counted as not run
    (stats.missing)."""
    for task in tasks:
        if task.key in in_batches:
            stats.missing.append(task.key)
        else:
            yield task


class BatchAnswers:
    """Counts, as the reports stream the judgments by, the answers that came from a batch."""

    def __init__(self) -> None:
        self.answers = 0
        self.batches: set[str] = set()
        self.notes: list[str] = []
        """report.md's notes: filled once the judgments have all gone by, which write_reports
        does before it writes report.md."""

    def watch(self, judgments: Iterable[Judgment]) -> Iterator[Judgment]:
        """Pass `judgments` through, counting those whose answer came from a batch.

        Args:
            judgments: the judgments the reports read.

        Returns:
            The same judgments, in order; once they have all gone by, `notes` says how many
            came from which batches.
        """
        for j in judgments:
            if j.source is not None and j.source.startswith("batch:"):
                self.answers += 1
                self.batches.add(j.source[6:])
            yield j
        if self.answers:
            self.notes.append(f"{self.answers} judgments read answers from {len(self.batches)} "
                              "provider batch(es) (Batch API, batch price); `source` in "
                              "judgments.jsonl says which.")


@dataclass(slots=True)
class ModelPlan:
    """What a run would do for one model: counts, tokens to spend, and their price."""

    model: ModelSpec
    bill: Estimate
    """The calls' bill online, with prompt caching and batch (runner.estimate)."""
    tasks: int = 0
    cached: int = 0
    repeats: int = 0
    """Tasks that send the same request as an earlier task (answered once)."""
    @property
    def prompt_tokens(self) -> int:
        """The calls' prompt tokens (estimated, runner.estimate)."""
        return self.bill.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        """An upper bound: max_tokens x n for every call."""
        return self.bill.completion_tokens

    @property
    def calls(self) -> int:
        return self.tasks - self.cached - self.repeats

    @property
    def cost(self) -> float | None:
        return estimate_cost(self.model, self.prompt_tokens, self.completion_tokens)


def all_tasks(expansion: Expansion) -> Iterator[Task]:
    """Every task of an expansion.

    Args:
        expansion: the selection's expansion.

    Returns:
        Generation tasks, then judge tasks (those over generated answers once they exist).
    """
    return itertools.chain(expansion.generation_tasks(), expansion.tasks())


def estimate(sel: Selection) -> list[ModelPlan]:
    """What a run would do, per model. No network.

    Args:
        sel: the selection (with stream=True, one pass is all this needs).

    Returns:
        One ModelPlan per model: tasks, cache hits, repeats, calls to make and their tokens.
    """
    plans = {m.name: ModelPlan(model=m, bill=Estimate(m)) for m in sel.job.models}
    # Repeats are spotted by the keys' first 64 bits, ~12 bytes a task (10M tasks: ~120 MB,
    # where a set of the keys held 1.4 GB); a false repeat among n distinct keys has
    # probability <= n^2 / 2^65 (2.7e-6 at 10M) and would only move one task's count.
    seen = Seen()
    with open_selected(sel, read_only=True) as cache:
        for task, cached in cached_flags(cache, all_tasks(sel.expansion), task_key):
            plan = plans[task.model]
            plan.tasks += 1
            if not seen.add(key64(task.key)):
                plan.repeats += 1
            elif cached:
                plan.cached += 1
            else:
                plan.bill.add(task)
    return list(plans.values())


def manifest(sel: Selection, stats: RunStats | None, started: float,
             command: str, kind: str = "run") -> dict[str, Any]:
    """manifest.json: what ran, with which versions, what it did and cost. Never a key.

    Args:
        sel: the selection reported on; its task selection is recorded as `selection`.
        stats: the counters (None: no call, no count).
        started: when the command started (seconds since the epoch).
        command: the command line (or API call) that ran.
        kind: "run" (a `judge run`, which may have called), or "rebuild" (rescore, report,
            import: reports from the cache alone, whose counts are of no call).

    Returns:
        The manifest as JSON-ready values; URLs without their passwords.
    """
    versions = {}
    for pkg in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[pkg] = importlib.metadata.version(pkg)
    counts = stats.as_dict() if stats else {}
    return {"kind": kind, "job": sel.job.name, "job_file": str(sel.job.path),
            "job_sha256": hashlib.sha256(sel.job.path.read_bytes()).hexdigest(),
            "command": scrub(command), "versions": versions, "python": sys.version.split()[0],
            "started": _iso(started), "ended": _iso(time.time()),
            "models": [{"name": m.name, "spec": m.spec, "endpoint": redact_url(m.endpoint)
                        if m.base_url or m.kind == "local" else None} for m in sel.job.models],
            "counts": counts,
            "usage": {"prompt_tokens": stats.prompt_tokens if stats else 0,
                      "completion_tokens": stats.completion_tokens if stats else 0},
            "estimated_cost_usd": None if (stats and stats.unpriced) or unpriced_model(sel.job)
            else round(stats.cost, 6) if stats else 0.0,
            "unpriced_calls": stats.unpriced if stats else 0,
            "bill": (stats.bill if stats else Bill()).as_dict(unknown=unpriced_model(sel.job)),
            "endpoints": stats.endpoint_counts() if stats else {},
            **({"until_ci": stats.until_ci} if stats and stats.until_ci else {}),
            "cache_dir": str(sel.cache_dir),
            **({"cache_url": redact_url(sel.cache_url)} if sel.cache_url else {}),
            "selection": None if sel.task_selection is None else sel.task_selection.recorded()}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
