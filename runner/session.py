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
from runner.errors import ConfigError, MissingKeyError, register_secret
from runner.execute import local
from runner.execute.shard import Shard
from runner.execute.store.backend import CacheBackend, cached_flags, is_url, open_cache, redact
from runner.expand import Expansion, Task, estimate_cost, prepare, task_key
from runner.expand_ahead import with_key_index
from runner.job.load import load_job
from runner.job.spec import Job, ModelSpec, parse_model_spec, url_problem
from runner.reduce.judgments import READ_BATCH, CachedFirst, Judgment, choices

if TYPE_CHECKING:
    from runner.execute.stats import RunStats

__all__ = ["BatchAnswers", "Download", "ModelPlan", "Selection", "TaskLog", "all_tasks",
           "answer_text", "check_budget", "check_keys", "estimate", "job_path", "key_reader",
           "manifest", "run_async", "run_pool", "select", "serving", "with_run_limits"]

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
    """`judge run --shard I/N`: only this shard's tasks are run."""


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
              ("max_retries", "max_retries"), ("timeout", "timeout_s"))
"""`judge run`'s (and runner.run's) option -> the job's `[limits]` field it replaces."""


def with_run_limits(sel: Selection, options: Mapping[str, Any]) -> Selection:
    """`sel` with the limits a run was given (concurrency, rpm, tpm, max_retries, timeout)
    over the job's; an option left out or None keeps the job's."""
    given = {field: options[name] for name, field in RUN_LIMITS
             if options.get(name) is not None}
    return replace(sel, job=sel.job.with_limits(**given))


def key_reader(environ: Mapping[str, str]) -> Callable[[str], Callable[[], str | None]]:
    """Variable name -> its key's reader, from `environ` at call time (never stored); every key
    read is registered to be scrubbed from whatever a server sends back (runner.errors.scrub)."""
    def reader(name: str) -> Callable[[], str | None]:
        register_secret(environ.get(name))
        return lambda: environ.get(name) or None
    return reader


def job_path(job: str) -> Path:
    """A job file path, or the name of one under jobs/ (`openmeva` -> jobs/openmeva.toml)."""
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
    """The selection's cache: the shared database when a URL was given, else the folder
    (`read_only`: the caller only reads, so a folder it may not write is read as it is)."""
    return open_cache(sel.cache_url if sel.cache_url and is_url(sel.cache_url) else sel.cache_dir,
                      read_only=read_only)


def _with(m: ModelSpec, **changes: Any) -> ModelSpec:
    return ModelSpec(**{**{f.name: getattr(m, f.name) for f in fields(m)}, **changes})


def resolve_models(job: Job, specs: tuple[str, ...], base_url: str | None,
                   env_base_url: str | None) -> tuple[ModelSpec, ...]:
    """--model replaces the judges (generators stay); --base-url / OPENAI_BASE_URL serve bare
    names."""
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
                raise ConfigError(f"{job.path}: model {m.spec!r} needs a server: pass --base-url "
                                  "http://HOST:PORT/v1, set OPENAI_BASE_URL, or use openai:NAME")
            m = _with(m, base_url=fallback)
        resolved.append(m)
    return tuple(resolved)


def answer_text(record: Mapping[str, Any] | None) -> str | None:
    """The first choice's text of a cached record (a generation stage's answer)."""
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


def select(job_path: Path | Job, *, models: tuple[str, ...] = (), base_url: str | None = None,
           limit: int | None = None, cache_dir: Path, out: Path | None = None,
           data_dir: Path, env_base_url: str | None = None, stream: bool = False,
           download: Download | None = None, cache_url: str | None = None,
           sample: tuple[int, int] | None = None) -> Selection:
    """Load, resolve and expand a job; generated data sets come from the cache as it is.
    `stream`: one pass over the tasks is all the caller needs (see expand.prepare);
    `sample`: (N, seed) of --sample; `job_path` may be a Job already loaded."""
    job = job_path if isinstance(job_path, Job) else load_job(job_path)
    if download is not None:
        _download(job, data_dir, download)
    job = job.with_models(resolve_models(job, models, base_url, env_base_url))
    if models:  # prompts' own judge lists name the replaced models
        job = replace(job, prompts=tuple(replace(p, models=()) for p in job.prompts))
    expansion = prepare(job, data_dir, limit=limit, stream=stream, sample=sample)
    sel = Selection(job=job, expansion=expansion, cache_dir=cache_dir,
                    out_dir=out if out is not None else job.output_dir, cache_url=cache_url)
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
    """Rebuild the generated data sets from the answers now in the cache."""
    with open_selected(sel, read_only=True) as cache:
        expansion, missing = sel.expansion.with_generated(
            lambda task: answer_text(cache.get(task.key)))
    return replace(sel, expansion=expansion, missing_answers=missing)


def check_keys(job: Job, environ: Mapping[str, str]) -> None:
    """A model that needs a key and has none is an error before the first call."""
    for m in job.models:
        if m.key_required and not environ.get(m.api_key_env):
            raise MissingKeyError(f"{job.path}: model {m.name!r} ({m.spec}) needs an API key: "
                                  f"set {m.api_key_env} (no call was made)")
        for e in m.endpoints if m.key_required else ():  # a fleet: each replica's own key
            if not environ.get(e.api_key_env):
                raise MissingKeyError(f"{job.path}: model {m.name!r} endpoint {e.base_url} "
                                      f"needs an API key: set {e.api_key_env} (no call was made)")


def check_budget(job: Job, budget: float | None) -> None:
    if budget is None:
        return
    for m in job.models:
        if estimate_cost(m, 1, 1) is None:
            raise ConfigError(f"{job.path}: --budget needs a price for model {m.name!r} "
                              f"({m.model}): add [models.{m.name}] price = {{input = USD_PER_1M, "
                              "output = USD_PER_1M}")


@contextlib.contextmanager
def serving(job: Job) -> Iterator[Job]:
    """Start the embedded local server for `local:` models for the duration of the block."""
    if not any(m.kind == "local" for m in job.models):
        yield job
        return
    with contextlib.ExitStack() as stack:
        models = []
        for m in job.models:
            if m.kind == "local":
                server = stack.enter_context(local.LocalServer(m.model))
                m = _with(m, base_url=server.base_url)
            models.append(m)
        yield job.with_models(tuple(models))


async def run_pool(sel: Selection, served: Job, cache: CacheBackend, *, stop: Any,
                   key_reader: Callable[[str], Callable[[], str | None]], offline: bool,
                   budget: float | None, on_progress: Callable[[RunStats], None],
                   judged: TaskLog, hold: frozenset[str] = frozenset(),
                   after: CachedFirst | None = None) -> tuple[RunStats, Selection]:
    """Generation stage (if any), then every judge task. `served` is sel.job with local
    servers' base URLs. Returns the counters and the selection with generated data sets;
    `judged` logs the judge tasks as they are dispatched; keys in `hold`
    (held by a provider batch) are never called: they count as not run. `after`: the judge
    tasks from `after.uncached_onward` on, with `after.stats`, when a CachedFirst pass judged
    the ones before (a job without a generation stage)."""
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
    stats = RunStats() if after is None else after.stats
    async with aiohttp.ClientSession(connector=connector) as session:
        run = {"cache": cache, "session": session, "endpoints": endpoints, "limits": limits,
               "stop": stop, "offline": offline, "budget": budget, "stats": stats,
               "on_progress": on_progress}
        if sel.job.generate:
            stats.total += sum(1 for _ in _mine(sel, sel.expansion.generation_tasks()))
            await execute(_held(_mine(sel, sel.expansion.generation_tasks()), hold, stats), **run)
            if stop.is_set():
                return stats, sel
            sel = derive(sel)  # judge what the generators answered
        if after is None:
            count = sel.expansion.count() if sel.shard is None else 0
            stats.total += count
            tasks = sel.expansion.tasks()
            if sel.shard is None:  # the job's keys, kept for its rescore
                tasks = with_key_index(cache, sel.expansion, READ_BATCH, count, tasks)
        else:  # counted, and the tasks before it judged, by the CachedFirst pass
            assert after.uncached_onward is not None, "a fully cached pass needs no pool"
            tasks = after.uncached_onward
        await execute(_held(_kept(_mine(sel, tasks, stats), judged), hold, stats), **run,
                      hashes=None if after is None else after.hashes)
    return stats, sel


def _mine(sel: Selection, tasks: Iterator[Task], stats: RunStats | None = None
          ) -> Iterator[Task]:
    """The tasks of this run's shard (all without --shard); with `stats`, each shard task adds
    one to stats.total as it passes (counting them first would expand the job twice)."""
    if sel.shard is None:
        return tasks

    def seen() -> None:
        if stats is not None:
            stats.total += 1

    return sel.shard.tasks(tasks, seen)


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
            # positional: half the cost of keywords for a frozen dataclass
            yield Task(keys[32 * i:32 * i + 32].hex(), dataset, item_id, prompt, aspect, model,
                       sample, b"", 0, 0, members)


def _kept(tasks: Iterator[Task], into: TaskLog) -> Iterator[Task]:
    """Pass tasks through, logging each for the reports (see TaskLog)."""
    for task in tasks:
        into.append(task)
        yield task


def _held(tasks: Iterator[Task], hold: frozenset[str], stats: RunStats) -> Iterator[Task]:
    """Tasks whose key a provider batch holds are left out (not run), the rest pass."""
    for task in tasks:
        if task.key in hold:
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
    tasks: int = 0
    cached: int = 0
    repeats: int = 0
    """Tasks that send the same request as an earlier task (answered once)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    """An upper bound: max_tokens x n for every call."""

    @property
    def calls(self) -> int:
        return self.tasks - self.cached - self.repeats

    @property
    def cost(self) -> float | None:
        return estimate_cost(self.model, self.prompt_tokens, self.completion_tokens)


def all_tasks(expansion: Expansion) -> Iterator[Task]:
    """Generation tasks, then judge tasks (those over generated answers once they exist)."""
    return itertools.chain(expansion.generation_tasks(), expansion.tasks())


def estimate(sel: Selection) -> list[ModelPlan]:
    """Per model: tasks, cache hits, repeats, calls to make and their tokens. No network."""
    plans = {m.name: ModelPlan(model=m) for m in sel.job.models}
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
                plan.prompt_tokens += task.prompt_tokens
                plan.completion_tokens += task.max_tokens
    return list(plans.values())


def manifest(sel: Selection, stats: RunStats | None, started: float,
             command: str, kind: str = "run") -> dict[str, Any]:
    """manifest.json: what ran, with which versions, what it did and cost. Never a key.
    `kind`: "run" (a `judge run`, which may have called), or "rebuild" (rescore, report,
    import: reports from the cache alone, whose counts are of no call)."""
    versions = {}
    for pkg in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[pkg] = importlib.metadata.version(pkg)
    counts = stats.as_dict() if stats else {}
    return {"kind": kind, "job": sel.job.name, "job_file": str(sel.job.path),
            "job_sha256": hashlib.sha256(sel.job.path.read_bytes()).hexdigest(),
            "command": command, "versions": versions, "python": sys.version.split()[0],
            "started": _iso(started), "ended": _iso(time.time()),
            "models": [{"name": m.name, "spec": m.spec, "endpoint": m.endpoint
                        if m.base_url or m.kind == "local" else None} for m in sel.job.models],
            "counts": counts,
            "usage": {"prompt_tokens": stats.prompt_tokens if stats else 0,
                      "completion_tokens": stats.completion_tokens if stats else 0},
            "estimated_cost_usd": None if stats and stats.unpriced else
            round(stats.cost, 6) if stats else 0.0,
            "unpriced_calls": stats.unpriced if stats else 0,
            "endpoints": stats.endpoint_counts() if stats else {},
            "cache_dir": str(sel.cache_dir),
            **({"cache_url": redact(sel.cache_url)} if sel.cache_url else {})}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
