"""The job's value objects: frozen, keyword-only dataclasses, each field documented where it
is declared. `runner.job.load` builds them from a job file; every later stage reads them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.job.bill import Price
from runner.job.providers import row

__all__ = ["LEVELS", "DEFAULT_METHODS", "METHODS", "PLACEHOLDER", "POLICIES", "DatasetSpec",
           "EndpointSpec", "GenerateSpec", "ImportSpec", "JURY_METHODS", "Job", "JurySpec",
           "Limits", "ModelSpec", "PromptSpec", "placeholders"]

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
# Request parameters the runner sets itself: a job may not override them.
RESERVED_PARAMS = frozenset({"model", "messages", "stream"})
POLICIES = ("skip", "zero")
LEVELS = ("sample", "dataset", "system")
METHODS = ("pearson", "spearman", "kendall", "ccc")
"""The statistics a job's `methods` may name (runner.reduce.statistics defines each)."""
DEFAULT_METHODS = ("pearson", "spearman", "kendall")
JURY_METHODS = ("mean", "median", "majority")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """How hard the runner may push one endpoint. None of these enter the cache key."""

    concurrency: int = 16
    """Requests in flight at once (workers in the pool)."""
    rpm: float | None = None
    """Requests per minute per model; None = unlimited."""
    tpm: float | None = None
    """Tokens per minute per model (prompt estimate + max_tokens x n); None = unlimited."""
    max_retries: int = 6
    """Retries per task after the first attempt, for retryable failures."""
    timeout_s: float = 60.0
    """Per-request timeout in seconds."""
    down_after_s: float = 60.0
    """Seconds of nothing but failed connections to every replica of a model that answered
    before, after which the run stops (exit 2, rerun to resume)."""
    max_wait_s: float = 600.0
    """Longest wait a server may ask for (Retry-After); a longer ask stops the run (exit 2)."""
    until_ci: float | None = None
    """Judge whole groups in a random order and stop once every 95% CI of a judge's
    correlation (each level and method the job reports) is narrower than this (`judge run
    --until-ci`); None = judge every item."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointSpec:
    """One replica of a model's fleet (`endpoints = [{base_url = ..., ...}]`). Which replica
    answers never enters the cache key: the cache record names it instead."""

    base_url: str
    """Endpoint root (ending in /v1 for OpenAI-compatible servers; the resource URL for azure)."""
    api_key_env: str
    """Environment variable holding this replica's key (never the key itself)."""
    rpm: float | None = None
    """Requests per minute this replica may take; None = learn it from its rate-limit headers."""
    tpm: float | None = None
    """Tokens per minute this replica may take; None = learn it from its rate-limit headers."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A judge model and where it is served."""

    name: str
    """The job's name for this judge (table key), used in reports as `name/prompt`."""
    spec: str
    """`openai:NAME`, `local:NAME`, or a bare model name served at `base_url`."""
    model: str
    """The model name sent in the request body."""
    kind: str
    """Its row of the provider table (runner.job.providers.KINDS): "openai", "local", ..."""
    base_url: str | None
    """Endpoint root ending in /v1; None for local models until their server starts."""
    api_key_env: str = "OPENAI_API_KEY"
    """Name of the environment variable holding the key (never the key itself)."""
    key_required: bool = False
    params: Mapping[str, Any] = field(default_factory=dict)
    """Request parameters for every prompt sent to this model (prompt params win)."""
    rpm: float | None = None
    tpm: float | None = None
    price: Price | None = None
    """The job's `price = {...}`; None = the provider table's (runner.job.providers)."""
    mode: str = "online"
    """"online" (the pool) or "batch" (the provider's Batch API; `judge run --batch` for all)."""
    batch_discount: float | None = None
    """Share of the online price a batch answer saves; unset (None): the price's, 0.5 for
    every provider in the table."""
    endpoints: tuple[EndpointSpec, ...] = ()
    """A fleet serving this model (several replicas, keys or regions); empty = `base_url`."""
    api_version: str | None = None
    """azure: the `api-version` query parameter."""

    @property
    def endpoint(self) -> str:
        """The endpoint's identity in cache keys: stable even when a local port changes, and
        the same whichever replica of a fleet answers; a kind whose provider table row has
        `own_identity` carries its kind.

        Raises:
            ConfigError: the kind has no row in the provider table."""
        own = row(self.kind).own_identity
        if self.kind == "local":
            return self.spec
        if self.endpoints:
            return f"fleet:{self.kind}"
        assert self.base_url is not None
        if own:
            return f"{self.kind}:{self.base_url.rstrip('/')}"
        return self.base_url.rstrip("/")


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetSpec:
    """A registered data set by name, or a user's own file with a field mapping."""

    name: str
    path: Path | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptSpec:
    """A prompt template with its parser, aspects and request parameters."""

    name: str
    templates: Mapping[str, str]
    """Template text by key: "aspect", "aspect@subset", "*@subset" or "*" (most specific wins)."""
    system: str | None
    parser: str
    parser_options: Mapping[str, Any]
    aspect_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """aspect -> parser options that override parser_options for that aspect."""
    aspects: tuple[str, ...]
    datasets: tuple[str, ...]
    """Data sets this prompt applies to (names); empty = every data set of the job."""
    params: Mapping[str, Any]
    models: tuple[str, ...] = ()
    """Judge models for this prompt (names); empty = every model that is not a generator."""
    samples: int = 1
    """Independent calls per task (each its own cache key); use params.n for one call."""
    per: str = "item"
    """"item": one request per output; "group": one request scoring all outputs of a group,
    listed as {{outputs}} ("Output 1: ..."), parsed back per output (parser `outputs`)."""
    output_field: str = "output"
    """In group mode, the item field listed in {{outputs}}."""
    when_empty: Mapping[str, str] = field(default_factory=dict)
    """field -> template text used instead when that item field is empty."""
    order: str = "given"
    """Group mode: "given" lists the members in data order; "both" also sends the request with
    the members reversed (a position swap: another body, another key, its own task)."""
    join: Mapping[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    """template field -> (fields, separator): the non-empty ones of `fields` joined, e.g.
    ColossalAI's question = instruction, plus "\\n" + input when there is an input."""
    requires: tuple[str, ...] = ()
    """Fields that must be non-empty (after `join`) for the prompt to apply to an item."""
    prefix_until: str | None = None
    """The placeholder that ends the requests' cacheable prefix (e.g. "summary": the text
    before {{summary}}, the source document included, is what requests of one document
    share); None: the prefix ends at the first placeholder other than {{aspect}}."""

    def template(self, aspect: str, subset: str = "",
                 fields: Mapping[str, str] | None = None) -> str | None:
        """The template for one aspect and subset.

        Keys are tried from the most to the least specific: "aspect@subset", "*@subset",
        "aspect", "*".

        Args:
            subset: the item's subset ("" when the data set has none).
            fields: the item's fields; None skips the `requires` and `when_empty` rules.

        Returns:
            The template text, or None when this aspect does not apply there (e.g. templates
            keyed "correctness@closed_qa" only, or a required field is empty).
        """
        if fields is not None and any(not fields.get(f, "").strip() for f in self.requires):
            return None
        for name, text in self.when_empty.items():
            if fields is not None and not fields.get(name, "x").strip():
                return text
        for key in (f"{aspect}@{subset}", f"*@{subset}", aspect, "*"):
            if key in self.templates:
                return self.templates[key]
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerateSpec:
    """A generation stage: candidate models answer a data set's items through the same runner
    and cache; their answers become a new data set (`name`) that prompts can judge."""

    name: str
    """The derived data set: one item per (source item, candidate model), system = model."""
    dataset: str
    templates: Mapping[str, str]
    """As a prompt's templates: "*" or "*@subset" (e.g. one per category)."""
    system: str | None
    models: tuple[str, ...]
    into: str = "output"
    """The template field the answer lands in (`field` in the job file)."""
    params: Mapping[str, Any] = field(default_factory=dict)
    when_empty: Mapping[str, str] = field(default_factory=dict)
    join: Mapping[str, tuple[tuple[str, ...], str]] = field(default_factory=dict)
    metrics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Automatic metrics of each answer (runner.parse.metrics names) by subset, "*" = any other."""
    language: str = "en"
    """Tokenization of the metrics: "en" or "zh"."""
    reference: tuple[str, ...] = ()
    """Source fields whose first non-empty one is the answer's reference: the metrics compare
    against it, and generated items carry it as the `reference` field (when set)."""

    def prompt(self) -> PromptSpec:
        """The generation request as a prompt, for the expander.

        Returns:
            A PromptSpec named "generate:<name>" with one aspect, "answer", over `dataset`;
            its parser ("number") is never used.
        """
        return PromptSpec(name=f"generate:{self.name}", templates=self.templates,
                          system=self.system, parser="number", parser_options={},
                          aspects=("answer",), datasets=(self.dataset,), params=self.params,
                          when_empty=self.when_empty, join=self.join)

    def metric_names(self, subset: str) -> tuple[str, ...]:
        """The automatic metrics of an answer in one subset.

        Args:
            subset: the source item's subset.

        Returns:
            The metric names listed for the subset, else for "*", else none.
        """
        return self.metrics.get(subset, self.metrics.get("*", ()))


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportSpec:
    """Recorded judge answers to store under the job's own requests (`judge import`)."""

    dataset: str
    prompt: str
    model: str
    field: str
    """The item field (Item.extra) holding the recorded answer text."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JurySpec:
    """A virtual judge pooling several judges' scores, with zero calls (runner.reduce.jury)."""

    name: str
    """The jury's judge name in every report (the table key: `[juries.panel]` -> panel)."""
    judges: tuple[str, ...]
    """Its members, as `model/prompt` judge names (at least two), e.g. ["gpt/stars",
    "claude/stars"]."""
    method: str = "mean"
    """How the members' scores become the jury's: "mean", "median" or "majority" (the most
    frequent score; a tie is the median of the tied scores)."""
    quorum: int = 0
    """Members that must have scored an item for the jury to score it; 0 = all of them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A whole job, validated."""

    name: str
    path: Path
    datasets: tuple[DatasetSpec, ...]
    prompts: tuple[PromptSpec, ...]
    models: tuple[ModelSpec, ...]
    limits: Limits
    output_dir: Path
    policy: str = "skip"
    """Sample-level treatment of a group where one side is constant: skip or zero."""
    bootstrap: int = 1000
    seed: int = 0
    levels: tuple[str, ...] = LEVELS
    """Correlation levels to report: sample, dataset, system."""
    methods: tuple[str, ...] = DEFAULT_METHODS
    """Correlation coefficients: pearson, spearman, kendall by default, and ccc (Lin's
    concordance); system level adds pairwise_accuracy."""
    imports: tuple[ImportSpec, ...] = ()
    generate: tuple[GenerateSpec, ...] = ()
    leaderboard: bool = False
    """Also write leaderboard.csv: per judged system, the mean of each aspect."""
    scores_csv: bool = True
    """Write scores.csv beside scores.parquet (which is always written); false for a large
    study, whose scores.csv would be gigabytes of text."""
    juries: tuple[JurySpec, ...] = ()
    """Virtual judges made of the judges' scores (`[juries.NAME]`), reported like any judge."""
    prompt_cache: bool = True
    """Mark each request's static prefix for the provider's prompt cache (Anthropic's
    cache_control); false sends the bodies of earlier versions byte for byte."""

    @property
    def generator_names(self) -> frozenset[str]:
        """The models of the generation stages (they judge nothing unless a prompt names them)."""
        return frozenset(name for g in self.generate for name in g.models)


def placeholders(template: str) -> set[str]:
    """The placeholders of a template.

    Returns:
        The names written as `{{name}}`.
    """
    return set(PLACEHOLDER.findall(template))
