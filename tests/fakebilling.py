"""Prompt-cache billing as the providers do it, for the fakes (tests/fakeproviders.py) and the
prompt-caching benchmark (bench/billing.py).

A `Biller` keeps the prefixes it has seen, per model, for `ttl_s` (five minutes, Anthropic's
and OpenAI's usual lifetime; a hit renews it), and returns each request's usage split:

- OpenAI-style (`/chat/completions`): automatic. A prompt of 1,024 tokens or more is cached in
  steps of 128 tokens; `cached_tokens` is the longest step seen before, reported as
  `usage.prompt_tokens_details.cached_tokens` (`prompt_tokens` counts them too).
- Anthropic (`/v1/messages`): only up to a block marked `cache_control`, and only when that
  prefix reaches the model's minimum (1,024 tokens; 2,048 for Haiku); a seen prefix is
  `cache_read_input_tokens`, a new one `cache_creation_input_tokens`, the rest `input_tokens`.

Tokens are counted as 4 characters each, the runner's own estimate. A prefix counts as seen
once the answer that wrote it was sent (`remember`), as with the providers: requests sent
together before the first answer all miss. bench/billing.py prices the totals with the
provider table's (runner.job.providers).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

CHARS_PER_TOKEN = 4
OPENAI_MIN, OPENAI_STEP = 1024, 128
ANTHROPIC_MIN, ANTHROPIC_MIN_HAIKU = 1024, 2048
TTL_S = 300.0


@dataclass
class Usage:
    """One request's input tokens by kind, and the prefixes to remember once it is answered."""

    input: int = 0
    """Input tokens billed at the full price."""
    cached: int = 0
    """Cache reads."""
    written: int = 0
    """Cache writes (Anthropic)."""
    output: int = 0
    prefixes: list[str] = field(default_factory=list)


@dataclass
class Biller:
    """The prefixes seen (digest -> expiry) and the totals billed since the start."""

    ttl_s: float = TTL_S
    clock: Callable[[], float] = time.monotonic
    seen: dict[str, float] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("requests", "input", "cached", "written", "output"), 0))
    lock: threading.Lock = field(default_factory=threading.Lock)
    span: list[float] = field(default_factory=list)
    """[first request's arrival, last answer's], by `clock`: the calls' wall time."""

    def _hit(self, digest: str) -> bool:
        if not self.span:
            self.span[:] = [self.clock(), self.clock()]
        return self.seen.get(digest, 0.0) > self.clock()

    def openai(self, body: dict[str, Any]) -> Usage:
        """Usage of a chat-completions request: its longest seen 128-token step cached."""
        text = "".join(f"{m['role']}\x00{_flat(m['content'])}\x00" for m in body["messages"])
        tokens = len(text) // CHARS_PER_TOKEN
        usage = Usage(input=tokens)
        with self.lock:
            for step, digest in _steps(body.get("model", ""), text, tokens):
                usage.prefixes.append(digest)
                if self._hit(digest):
                    usage.cached = step
        usage.input -= usage.cached
        return usage

    def anthropic(self, body: dict[str, Any]) -> Usage:
        """Usage of a Messages request: read or written up to its cache_control block."""
        digest, model = hashlib.sha256(body["model"].encode()), body["model"]
        size = marked = 0
        key = ""
        for block in _blocks(body):
            text = block.get("text", "") if isinstance(block, dict) else str(block)
            digest.update(text.encode() + b"\x00")
            size += len(text)
            if isinstance(block, dict) and "cache_control" in block:
                marked, key = size, digest.hexdigest()
        tokens, prefix = size // CHARS_PER_TOKEN, marked // CHARS_PER_TOKEN
        least = ANTHROPIC_MIN_HAIKU if "haiku" in model.lower() else ANTHROPIC_MIN
        with self.lock:
            hit = self._hit(key)
            if prefix < least:
                return Usage(input=tokens)
            if hit:
                return Usage(input=tokens - prefix, cached=prefix, prefixes=[key])
        return Usage(input=tokens - prefix, written=prefix, prefixes=[key])

    def remember(self, usage: Usage) -> None:
        """Count `usage` and keep (or renew) its prefixes: its answer is being sent."""
        with self.lock:
            self.span[1:] = [self.clock()]
            for digest in usage.prefixes:
                self.seen[digest] = self.clock() + self.ttl_s
            self.totals["requests"] += 1
            for kind in ("input", "cached", "written", "output"):
                self.totals[kind] += getattr(usage, kind)


def _flat(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def _blocks(body: dict[str, Any]) -> Iterator[Any]:
    """A Messages body's text in the order Anthropic caches it: system, then each message."""
    for content in [body.get("system", ""), *(m["content"] for m in body["messages"])]:
        yield from ([{"text": content}] if isinstance(content, str) else content)


def _steps(model: str, text: str, tokens: int) -> Iterator[tuple[int, str]]:
    """(tokens, digest) of each cacheable step of an OpenAI prompt: 1,024, 1,152, ..."""
    digest = hashlib.sha256(model.encode() + b"\x00")
    done = 0
    for step in range(OPENAI_MIN, tokens + 1, OPENAI_STEP):
        digest.update(text[done:step * CHARS_PER_TOKEN].encode())
        done = step * CHARS_PER_TOKEN
        yield step, digest.copy().hexdigest()


def openai_usage(usage: Usage, completion: int) -> dict[str, Any]:
    """A chat completion's `usage` for `usage`."""
    prompt = usage.input + usage.cached
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": usage.cached}}


def anthropic_usage(usage: Usage, output: int) -> dict[str, Any]:
    """A Messages answer's `usage` for `usage`."""
    return {"input_tokens": usage.input, "output_tokens": output,
            "cache_read_input_tokens": usage.cached,
            "cache_creation_input_tokens": usage.written}
