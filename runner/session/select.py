"""The select phase of a run (and of every command): a TaskSelection resolved into the job, its
models and items, the cache and the report folder; the checks before any call. The environment
comes in as a mapping, never read here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runner.data import datasets
from runner.errors import ConfigError, MissingKeyError, register_secret
from runner.estimate import model_price
from runner.execute.shard import Shard, split_limits
from runner.execute.store.backend import CacheBackend, open_cache
from runner.expand import Expansion
from runner.job.load import load_job
from runner.job.models import parse_model_spec, url_problem
from runner.job.spec import Job, ModelSpec
from runner.prepare import prepare
from runner.reduce.judgments import choices
from runner.selection import DEFAULT_CACHE_DIR, TaskSelection

__all__ = ["Download", "WorkingSet", "check_budget", "check_keys", "check_until_ci", "derive",
           "job_path", "key_reader", "open_selected", "resolve_models", "select",
           "unpriced_model", "with_run_limits"]


@dataclass(frozen=True, slots=True)
class WorkingSet:
    """What a command works on, resolved: the job, its models and items, the cache and output
    dirs (a TaskSelection, runner/selection.py, is what was chosen, before it was resolved)."""

    job: Job
    expansion: Expansion
    cache_dir: Path
    out_dir: Path
    task_selection: TaskSelection
    """The selection this was resolved from, its defaults filled in (the manifest's
    `selection`)."""
    missing_answers: int = 0
    """Generation tasks with no cached answer yet (their items are not judged yet)."""
    cache_url: str | None = None
    """A shared cache (postgresql://...) used instead of cache_dir; see open_selected."""
    shard: Shard | None = None
    """`judge run --shard I/N`: `expansion` holds only this shard's items (see `select`)."""


_RUN_LIMITS = (("concurrency", "concurrency"), ("rpm", "rpm"), ("tpm", "tpm"),
              ("max_retries", "max_retries"), ("timeout", "timeout_s"), ("until_ci", "until_ci"))
"""`judge run`'s (and runner.run's) option -> the job's `[limits]` field it replaces."""


def with_run_limits(sel: WorkingSet, options: Mapping[str, Any]) -> WorkingSet:
    """The selection with a run's own limits over the job's.

    Args:
        options: the run's options by name (concurrency, rpm, tpm, max_retries, timeout,
            until_ci); one left out or None keeps the job's.

    Returns:
        `sel` with its job's `[limits]` replaced where an option was given.
    """
    given = {field: options[name] for name, field in _RUN_LIMITS
             if options.get(name) is not None}
    return replace(sel, job=replace(sel.job, limits=replace(sel.job.limits, **given)))


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


def open_selected(sel: WorkingSet, *, read_only: bool = False) -> CacheBackend:
    """The selection's cache, opened.

    Args:
        sel: the selection; read_only: the caller only reads (see open_cache).

    Returns:
        The shared database when a URL was given, else the folder (a context manager).
    """
    return open_cache(sel.cache_url or sel.cache_dir, read_only=read_only)


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
    generators = job.generator_names
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
            m = replace(m, base_url=fallback)
        resolved.append(m)
    return tuple(resolved)


def _answer_text(record: Mapping[str, Any] | None) -> str | None:
    """A generation stage's answer: its record's first choice (None: not cached, no choice)."""
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
           stream: bool = False, download: Download | None = None) -> WorkingSet:
    """Load, resolve and expand a job; generated data sets come from the cache as it is.

    Args:
        chosen: the task selection; its cache location as given (a cache_dir left None is
            ./cache).
        data_dir: where the data sets' files are.
        env_base_url: OPENAI_BASE_URL, the endpoint of bare model names without --base-url.
        stream, download: as for runner.api.selection.

    Returns:
        The WorkingSet: the job (its judges replaced by `chosen.models`, a shard's rpm and tpm
        divided among the shards), its expansion, cache and report folder, and `chosen` with
        its defaults filled in.

    Raises:
        RunnerError: a job, model, data or download problem.
    """
    job = chosen.job if isinstance(chosen.job, Job) else load_job(job_path(chosen.job_name()))
    if download is not None:
        _download(job, data_dir, download)
    job = replace(job, models=resolve_models(job, chosen.models, chosen.base_url, env_base_url))
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
    sel = WorkingSet(job=job, expansion=expansion, cache_dir=cache_dir, out_dir=out_dir,
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


def derive(sel: WorkingSet) -> WorkingSet:
    """The generated data sets rebuilt from the answers now in the cache.

    Args:
        sel: a selection of a job with a generation stage.

    Returns:
        `sel` with the generated items, and the number of generation answers still missing
        (`missing_answers`).
    """
    with open_selected(sel, read_only=True) as cache:
        expansion, missing = sel.expansion.with_generated(
            lambda task: _answer_text(cache.get(task.key)))
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
    return any(model_price(m) is None for m in job.models)


def check_budget(job: Job, budget: float | None) -> None:
    """--budget can be kept: every model has a price.

    Args:
        budget: --budget in USD; None: no budget, nothing to check.

    Raises:
        ConfigError: a model without a price (named, with the price line to add).
    """
    if budget is None:
        return
    for m in job.models:
        if model_price(m) is None:
            raise ConfigError(f"{job.path}: --budget needs a price for model {m.name!r} "
                              f"({m.model}): add [models.{m.name}] price = {{input = USD_PER_1M, "
                              "output = USD_PER_1M}")


def check_until_ci(job: Job, *, sharded: bool, batch: bool) -> None:
    """--until-ci can run this job: one process (a shard would stop on its own groups' CIs),
    online (a batch is bought whole), no generation stage (its calls would all be made first).

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
           else "a generation stage" if job.generate else None)
    if why is not None:
        raise ConfigError(f"{job.path}: --until-ci (limits.until_ci) judges the items of one "
                          f"run group by group and cannot run with {why}; drop one of them")
