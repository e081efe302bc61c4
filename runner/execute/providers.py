"""What differs between providers, in one place: URL, headers, request body, answer shape;
after the client, nothing knows which provider answered.

Every task carries an OpenAI chat-completions body (its cache key is built from it, together
with the endpoint's kind). Here that body becomes the request each kind expects, and each kind's
answer becomes the chat-completions shape the parsers read, so nothing after the client knows
which provider answered (by the wire format of the kind's row in runner.job.providers):

| kind | URL | auth header |
|---|---|---|
| openai, compatible, local, gemini | `{base_url}/chat/completions` | `Authorization: Bearer` |
| azure | `{resource}/openai/deployments/{deployment}/chat/completions?api-version=V` | `api-key` |
| anthropic | `{base_url}/messages` | `x-api-key` + `anthropic-version` |

Rate-limit headers (OpenAI's `x-ratelimit-limit-*`, Anthropic's `anthropic-ratelimit-*`) are
read here too, for limits learned from the first responses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

from runner.errors import RequestError
from runner.job.bill import Tokens
from runner.job.providers import cache_minimum, row
from runner.tasks import CHARS_PER_TOKEN

__all__ = ["ANTHROPIC_VERSION", "Advertised", "Provider", "advertised", "provider"]

ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_MAX_TOKENS = 256  # the Messages API requires max_tokens; expand reserves the same
# OpenAI parameters with an Anthropic equivalent; any other parameter is sent unchanged.
_ANTHROPIC_RENAMED = {"max_completion_tokens": "max_tokens", "stop": "stop_sequences"}
_ANTHROPIC_DROPPED = frozenset({"n", "model", "messages", "stream", "seed"})
_CACHE_CONTROL = {"type": "ephemeral"}
_FINISH_REASON = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
           "tool_use": "tool_calls", "refusal": "content_filter"}


@dataclass(frozen=True, slots=True)
class Provider:
    """How to reach one replica of one kind: `url`, `headers(key)`, `encode(body)` and
    `decode(answer)` (the answer as chat-completions JSON).

    Args:
        kind: the endpoint's kind (openai, compatible, local, gemini, azure, anthropic).
        url: the full URL requests are posted to (see `provider`).
    """

    kind: str
    url: str
    wire: str = "chat"
    """The kind's wire format (runner.job.providers.ProviderKind.wire)."""

    def headers(self, api_key: str | None) -> dict[str, str]:
        """The request headers of this kind.

        Args:
            api_key: the key, sent in this kind's header; None sends none.

        Returns:
            Content-Type, the key's header, and for anthropic `anthropic-version`.
        """
        headers = {"Content-Type": "application/json"}
        if self.wire == "messages":
            headers["anthropic-version"] = ANTHROPIC_VERSION
            if api_key:
                headers["x-api-key"] = api_key
        elif self.wire == "azure":
            if api_key:
                headers["api-key"] = api_key
        elif api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        return headers

    @property
    def plain(self) -> bool:
        """The task's body is sent as it is and the answer is chat-completions JSON already
        (`encode` and `decode` change nothing): every wire format but messages."""
        return self.wire != "messages"

    def encode(self, body: bytes, prefix: int = 0) -> bytes:
        """The body to send.

        Args:
            body: the task's OpenAI chat-completions body.
            prefix: Task.prefix, the characters its requests share (anthropic marks them).

        Returns:
            The same bytes, except for anthropic (see `anthropic_body`): OpenAI and Gemini
            cache a long prefix unasked, and the task's body already sends it first.

        Raises:
            RequestError: anthropic with n > 1.
        """
        return body if self.plain else anthropic_body(body, prefix)

    def decode(self, data: Any) -> Any:
        """The answer in chat-completions shape (checked afterwards by the client).

        Args:
            data: the decoded answer as the provider sent it.

        Returns:
            An anthropic Messages answer as a chat completion (see `anthropic_answer`); any
            other answer unchanged.
        """
        if not self.plain and isinstance(data, dict) and "content" in data:
            return anthropic_answer(data)
        return data


def provider(kind: str, base_url: str, *, model: str = "", api_version: str | None = None
             ) -> Provider:
    """How to reach one replica.

    Args:
        kind: the endpoint's kind (ModelSpec.kind).
        base_url: the replica's base URL (azure: the resource URL).
        model: the model name; for azure, the deployment, which is part of the URL.
        api_version: azure's api-version query parameter.

    Returns:
        The Provider with the full URL of the table in the module docstring.

    Raises:
        ConfigError: the kind has no row in the provider table.
    """
    root, wire = base_url.rstrip("/"), row(kind).wire
    if wire == "messages":
        return Provider(kind, root + "/messages", wire)
    if wire == "azure":
        return Provider(kind, f"{root}/openai/deployments/{quote(model, safe='')}"
                              f"/chat/completions?api-version={quote(api_version or '')}", wire)
    return Provider(kind, root + "/chat/completions", wire)


def anthropic_body(body: bytes | dict[str, Any], prefix: int = 0) -> bytes:
    """An OpenAI chat-completions body as an Anthropic Messages body: system messages move to
    `system`, `max_tokens` is always set, `stop` becomes `stop_sequences`, and a
    `response_format` asking for JSON becomes a prefilled "{" (the assistant turn begins the
    object; a JSON schema is not enforced: describe the fields in the prompt). A shared
    prefix long enough to be cached ends in a `cache_control` block (`_cache_marked`).

    Args:
        body: an OpenAI chat-completions body, or that body decoded (not changed here).
        prefix: Task.prefix, the characters of the text its requests share; 0: none.

    Returns:
        The Messages body; parameters without an Anthropic name are sent unchanged.

    Raises:
        RequestError: the body asks for n > 1, which the Messages API does not have.
    """
    request = orjson.loads(body) if isinstance(body, bytes) else body
    if int(request.get("n", 1)) != 1:
        raise RequestError("anthropic: the Messages API has no n > 1; use the prompt's "
                           "samples = N instead of params.n")
    system = [m["content"] for m in request["messages"] if m["role"] == "system"]
    out: dict[str, Any] = {"model": request["model"],
                           "messages": [m for m in request["messages"] if m["role"] != "system"]}
    if system:
        out["system"] = "\n\n".join(system)
    for key, value in request.items():
        if key not in _ANTHROPIC_DROPPED:
            out[_ANTHROPIC_RENAMED.get(key, key)] = value
    if _json_wanted(out.pop("response_format", None)):
        # the Messages API has no response_format: a prefilled "{" starts the answer as an
        # object (the json parser reads the continuation as the object's body)
        out["messages"] = [*out["messages"], {"role": "assistant", "content": "{"}]
    if isinstance(out.get("stop_sequences"), str):
        out["stop_sequences"] = [out["stop_sequences"]]
    out.setdefault("max_tokens", ANTHROPIC_MAX_TOKENS)
    if cache_marks(out["model"], prefix):
        _cache_marked(out, prefix)
    return orjson.dumps(out)


def cache_marks(model: str, prefix: int) -> bool:
    """Whether `anthropic_body` marks a shared prefix of `prefix` characters for `model`: from
    Anthropic's documented minimum cacheable prompt (the provider table's: Haiku 2048, Sonnet
    and Opus 1024 tokens) on. A shorter prefix is not cached, and a marker would only risk the
    1.25x price of a cache write. The prefix is estimated at CHARS_PER_TOKEN characters a token.

    Args:
        model: the Anthropic model's name.
        prefix: Task.prefix, the characters its requests share; 0: none.

    Returns:
        True when the prefix is marked (and runner.execute.prefixes holds its other requests).
    """
    return prefix // CHARS_PER_TOKEN >= (cache_minimum("anthropic", model) or 0)


def _cache_marked(out: dict[str, Any], prefix: int) -> None:
    """Cut the Messages body `out` (changed in place) into text blocks where its first `prefix`
    characters (system, then the first message) end, and mark that block `cache_control` (one
    breakpoint: Anthropic caches everything before it, then reads it at a tenth of the input
    price)."""
    system = out.get("system", "")
    if prefix <= len(system):
        out["system"] = _cut(system, prefix)
        return
    first = out["messages"][0] if out["messages"] else None
    if first is not None and isinstance(first.get("content"), str):
        out["messages"][0] = {**first, "content": _cut(first["content"], prefix - len(system))}
    elif system:  # a message of blocks already: the system alone is marked
        out["system"] = _cut(system, len(system))


def _cut(text: str, at: int) -> list[dict[str, Any]]:
    """`text` as text blocks, the first `at` characters marked for the cache (no block of
    whitespace only: the Messages API refuses one)."""
    head, tail = text[:at], text[at:]
    if not tail.strip():
        head, tail = text, ""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": head,
                                     "cache_control": _CACHE_CONTROL}]
    return blocks + ([{"type": "text", "text": tail}] if tail else [])


def _json_wanted(response_format: Any) -> bool:
    """Whether an OpenAI `response_format` asks for JSON (json_object or json_schema)."""
    return isinstance(response_format, Mapping) and response_format.get("type") in (
        "json_object", "json_schema")


def anthropic_answer(data: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages answer as a chat completion: the text blocks joined into one
    choice, stop_reason as finish_reason, input/output tokens as prompt/completion tokens.

    Args:
        data: an Anthropic Messages answer.

    Returns:
        A chat completion with one choice, `usage` (chat-completions fields, the cache reads as
        `prompt_tokens_details.cached_tokens` and the writes as `cache_creation_input_tokens`,
        so runner.job.bill.Tokens reads the split), and a `provider` entry keeping the
        stop_reason and stop_sequence as sent.
    """
    blocks = data.get("content") or []
    text = "".join(b.get("text", "") for b in blocks
                   if isinstance(b, dict) and b.get("type") == "text")
    tokens = Tokens.of(data.get("usage"))
    prompt, completion = tokens.prompt, tokens.output
    reason = data.get("stop_reason")
    return {"id": data.get("id"), "object": "chat.completion", "model": data.get("model"),
            "choices": [{"index": 0, "finish_reason": _FINISH_REASON.get(str(reason), reason),
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion,
                      "prompt_tokens_details": {"cached_tokens": tokens.cached_input},
                      "cache_creation_input_tokens": tokens.cache_write},
            "provider": {"kind": "anthropic", "stop_reason": reason,
                         "stop_sequence": data.get("stop_sequence")}}


@dataclass(frozen=True, slots=True)
class Advertised:
    """Limits a server announced in its response headers (None: not announced).

    Args:
        rpm: requests per minute.
        tpm: tokens per minute (Anthropic's input-token limit when it sends no total).
    """

    rpm: float | None
    tpm: float | None


_LIMIT_HEADERS = (
    ("x-ratelimit-limit-requests", "x-ratelimit-limit-tokens"),
    ("anthropic-ratelimit-requests-limit", "anthropic-ratelimit-tokens-limit"),
)


def advertised(headers: Mapping[str, str]) -> Advertised | None:
    """The request and token limits in a response's headers.

    Args:
        headers: the response headers: OpenAI's (also vLLM gateways, Azure, Gemini) or
            Anthropic's; both are per minute.

    Returns:
        The limits announced, or None when neither is.
    """
    rpm = tpm = None
    for requests, tokens in _LIMIT_HEADERS:
        rpm = rpm or _positive(headers.get(requests))
        tpm = tpm or _positive(headers.get(tokens))
    if tpm is None:  # Anthropic may split tokens into input and output limits
        tpm = _positive(headers.get("anthropic-ratelimit-input-tokens-limit"))
    return None if rpm is None and tpm is None else Advertised(rpm, tpm)


def _positive(value: str | None) -> float | None:
    with contextlib.suppress(ValueError):
        if value is not None and (number := float(value)) > 0:
            return number
    return None
