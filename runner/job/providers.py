"""The provider table: one row per kind of endpoint the runner speaks, with everything that
differs between them: default base URL, key variable, wire format, whether the kind has its
own cache identity, and list prices.

Every other module reads a provider's facts here (runner.job.spec its presets and cache
identity, runner.execute.providers its wire format, runner.estimate and the bills their prices),
so a new provider is one row (and a wire format if it speaks a new one). A kind without a row
is an error wherever it is looked up (`row`), never a silent default.

Prices are USD per 1M tokens, list prices as published in November 2025 on the pages named in
`SOURCES` (OpenAI and Azure: standard tier, Azure's Global deployments; Anthropic: the
5-minute cache write; Gemini: the tier of prompts up to 200k tokens). They are not read from
the network: check them against the page before trusting a bill, and set a model's own with
the job's `price = {input = .., output = .., cached_input = .., cache_write = ..}`, which
replaces every field of the table's entry. A model that is not listed has no price (its cost
is unknown, never 0), except on a local server (free).

Prices never enter anything hashed: not the cache key (the request's content), not the key
index's fingerprint (runner.expand digests `IDENTITY`, not this module's source), so editing a
price rebuilds nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from runner.errors import ConfigError
from runner.job.bill import Price

__all__ = ["IDENTITY", "KINDS", "SOURCES", "ProviderKind", "cache_minimum", "price_of", "row"]

SOURCES = {
    "openai": "https://platform.openai.com/docs/pricing",
    "anthropic": "https://docs.anthropic.com/en/docs/about-claude/pricing",
    "gemini": "https://ai.google.dev/gemini-api/docs/pricing",
    "azure": "https://azure.microsoft.com/pricing/details/cognitive-services/openai-service/",
}


def _p(input: float, output: float, cached: float | None = None,
       write: float | None = None) -> Price:
    return Price(input=input, output=output, cached_input=cached, cache_write=write)


def _claude(input: float, output: float) -> Price:
    """Anthropic's rule: a cache write costs 1.25x input, a cache read 0.1x."""
    return _p(input, output, round(input * 0.1, 4), round(input * 1.25, 4))


_OPENAI = {
    "gpt-5": _p(1.25, 10.00, 0.125), "gpt-5-mini": _p(0.25, 2.00, 0.025),
    "gpt-5-nano": _p(0.05, 0.40, 0.005),
    "gpt-4.1": _p(2.00, 8.00, 0.50), "gpt-4.1-mini": _p(0.40, 1.60, 0.10),
    "gpt-4.1-nano": _p(0.10, 0.40, 0.025),
    "gpt-4o": _p(2.50, 10.00, 1.25), "gpt-4o-2024-05-13": _p(5.00, 15.00),
    "gpt-4o-mini": _p(0.15, 0.60, 0.075),
    "o1": _p(15.00, 60.00, 7.50), "o3": _p(2.00, 8.00, 0.50), "o3-mini": _p(1.10, 4.40, 0.55),
    "o4-mini": _p(1.10, 4.40, 0.275),
    "gpt-4-turbo": _p(10.00, 30.00), "gpt-4-0125-preview": _p(10.00, 30.00),
    "gpt-4": _p(30.00, 60.00), "gpt-3.5-turbo": _p(0.50, 1.50),
}
_AZURE = {name: _OPENAI[name] for name in (
    "gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano", "gpt-4o",
    "gpt-4o-mini", "o1", "o3", "o3-mini", "o4-mini")}
_ANTHROPIC = {
    "claude-opus-4-5": _claude(5.00, 25.00), "claude-opus-4-1": _claude(15.00, 75.00),
    "claude-opus-4": _claude(15.00, 75.00), "claude-opus-4-0": _claude(15.00, 75.00),
    "claude-3-opus": _claude(15.00, 75.00),
    "claude-sonnet-4-5": _claude(3.00, 15.00), "claude-sonnet-4": _claude(3.00, 15.00),
    "claude-sonnet-4-0": _claude(3.00, 15.00), "claude-3-7-sonnet": _claude(3.00, 15.00),
    "claude-3-5-sonnet": _claude(3.00, 15.00),
    "claude-haiku-4-5": _claude(1.00, 5.00), "claude-3-5-haiku": _claude(0.80, 4.00),
    "claude-3-haiku": _claude(0.25, 1.25),
}
_GEMINI = {
    "gemini-2.5-pro": _p(1.25, 10.00, 0.31), "gemini-2.5-flash": _p(0.30, 2.50, 0.075),
    "gemini-2.5-flash-lite": _p(0.10, 0.40, 0.025), "gemini-2.0-flash": _p(0.10, 0.40, 0.025),
    "gemini-2.0-flash-lite": _p(0.075, 0.30), "gemini-1.5-pro": _p(1.25, 5.00, 0.3125),
    "gemini-1.5-flash": _p(0.075, 0.30, 0.01875),
}
FREE = _p(0.0, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderKind:
    """One kind of endpoint (a row of `KINDS`)."""

    kind: str
    prefix: str | None
    """The model spec's prefix (`anthropic:NAME`); None: a bare model name."""
    base_url: str | None
    """The default base URL; None: the job names it (azure's resource, a local server's port,
    a bare name's server)."""
    key_env: str = "OPENAI_API_KEY"
    """The default variable holding the key."""
    key_required: bool = True
    """A call without a key is refused before it is sent."""
    wire: str = "chat"
    """"chat" (`{base_url}/chat/completions`, Bearer key), "azure" (the deployment's URL,
    `api-key`) or "messages" (Anthropic's Messages API): runner.execute.providers."""
    own_identity: bool = False
    """The cache key names the kind beside the URL (an Anthropic answer is not an OpenAI answer
    to the same body); False: the URL alone, as OpenAI-compatible servers share answers."""
    batch: bool = False
    """The runner can send this kind through a Batch API."""
    cache_min_tokens: int | None = 1024
    """Shortest prompt prefix the provider caches (documented minimum); None: no caching."""
    prices: Mapping[str, Price] = field(default_factory=dict)
    """Model name -> list price (a dated snapshot `NAME-2024-07-18`, `NAME-20241022` or
    `NAME-latest` takes NAME's)."""
    unlisted: Price | None = None
    """The price of a model not in `prices`; None: unknown."""


KINDS: Mapping[str, ProviderKind] = {r.kind: r for r in (
    ProviderKind(kind="openai", prefix="openai", base_url="https://api.openai.com/v1",
                 batch=True, prices=_OPENAI),
    ProviderKind(kind="anthropic", prefix="anthropic", base_url="https://api.anthropic.com/v1",
                 key_env="ANTHROPIC_API_KEY", wire="messages", own_identity=True, batch=True,
                 prices=_ANTHROPIC),
    ProviderKind(kind="gemini", prefix="gemini",
                 base_url="https://generativelanguage.googleapis.com/v1beta/openai",
                 key_env="GEMINI_API_KEY", own_identity=True, prices=_GEMINI),
    ProviderKind(kind="azure", prefix="azure", base_url=None, key_env="AZURE_OPENAI_API_KEY",
                 wire="azure", own_identity=True, prices=_AZURE),
    # an OpenAI-compatible server (vLLM, Ollama, llama.cpp, a gateway) named by its URL
    ProviderKind(kind="compatible", prefix=None, base_url=None, key_required=False, batch=True,
                 cache_min_tokens=None),
    # llama.cpp started by the runner (runner.execute.local): its identity is the spec
    ProviderKind(kind="local", prefix="local", base_url=None, key_required=False,
                 cache_min_tokens=None, unlisted=FREE),
)}
IDENTITY = tuple((r.kind, r.prefix, r.base_url, r.own_identity) for r in KINDS.values())
"""What of the table decides cache keys (runner.expand's fingerprint digests it)."""
_SNAPSHOT = re.compile(r"(.+?)-(?:\d{4}-\d{2}-\d{2}|\d{8}|latest)$")
# Models whose documented minimum differs from their row's (Anthropic's Haiku models: 2048).
_CACHE_MIN = {("anthropic", name): 2048
              for name in ("claude-haiku-4-5", "claude-3-5-haiku", "claude-3-haiku")}


def row(kind: str) -> ProviderKind:
    """A kind's row.

    Args:
        kind: the endpoint's kind (ModelSpec.kind).

    Returns:
        Its row of `KINDS`.

    Raises:
        ConfigError: the kind has no row (a new provider must be added to the table).
    """
    try:
        return KINDS[kind]
    except KeyError:
        raise ConfigError(f"provider kind {kind!r} has no row in the provider table "
                          f"(runner/job/providers.py; known: {', '.join(KINDS)})") from None


def price_of(kind: str, model: str, override: Price | None = None) -> Price | None:
    """A model's price: the job's, else the table's.

    Args:
        kind: the endpoint's kind.
        model: the model name sent (a dated snapshot takes its model's price).
        override: the job's `price = {...}`.

    Returns:
        The price, or None when it is unknown.
    """
    if override is not None:
        return override
    r = row(kind)
    return r.prices.get(_listed(kind, model)) or r.unlisted


def _listed(kind: str, model: str) -> str:
    """The table's name for a model: itself, or the model a dated snapshot is of."""
    snapshot = _SNAPSHOT.match(model)
    return snapshot.group(1) if snapshot and model not in row(kind).prices else model


def cache_minimum(kind: str, model: str) -> int | None:
    """The shortest prompt prefix a provider caches for a model (its documented minimum).

    Args:
        kind: the endpoint's kind.
        model: the model name sent.

    Returns:
        Tokens, or None when the kind has no prompt caching.
    """
    minimum = row(kind).cache_min_tokens
    return None if minimum is None else _CACHE_MIN.get((kind, _listed(kind, model)), minimum)
