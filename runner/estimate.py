"""`judge plan`'s bill before any call, three ways: online, online with the provider's prompt
caching, and through a Batch API.

Token counts are the expansion's estimate, 4 characters a token (runner.tasks'
CHARS_PER_TOKEN), not a tokenizer: tiktoken, OpenAI's, downloads its vocabulary on first use,
and `judge plan` makes no network call; the same approximation for every provider.
Completion tokens are counted at max_tokens x n, an upper bound.

Prompt caching: the static prefix of a prompt's requests to one model (per prompt and aspect:
the bytes every such request begins with, e.g. the system text and the template before the
item) is cached by the provider when it is at least the model's documented minimum
(runner.job.providers.cache_minimum). The estimate bills it once as a cache write (the input
price, or Anthropic's write price) and at the cached-input price on every later request of
the prompt: the provider's cache is assumed warm from the first request on, as when a
prompt's requests are sent close together. A prefix shorter than the minimum is billed as
plain input, and `short` names it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from runner.job.bill import Price, Tokens
from runner.job.providers import cache_minimum, price_of
from runner.job.spec import ModelSpec
from runner.tasks import CHARS_PER_TOKEN, Task

__all__ = ["Estimate", "estimate_cost", "model_price"]


@dataclass(slots=True)
class Estimate:
    """One model's expected bill (`add` each task to call)."""

    model: ModelSpec
    heads: dict[tuple[str, str], bytes] = field(default_factory=dict)
    """(prompt, aspect) -> the bytes every one of its requests begins with (the first body,
    cut where another differs): its static prefix."""
    calls: dict[tuple[str, str], int] = field(default_factory=dict)
    """(prompt, aspect) -> its requests."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    minimum: int | None = None
    """The shortest prefix the model's provider caches; None: it has no prompt caching, and
    `add` only sums tokens."""

    def __post_init__(self) -> None:
        self.minimum = cache_minimum(self.model.kind, self.model.model)

    def add(self, task: Task) -> None:
        """Count one request to call. For a provider that caches prompts ~1.5 us a task on a
        loaded 2-core VM (a 4 kB prefix; no copy of a body, two dict updates): ~15% more
        than a `judge plan` task's ~10 us (10M tasks in 99 s, docs/explanation/
        performance.md); for the others (local, OpenAI-compatible servers) two additions.

        Args:
            task: the task, with its body.
        """
        self.prompt_tokens += task.prompt_tokens
        self.completion_tokens += task.max_tokens
        if self.minimum is None:
            return
        key = (task.prompt, task.aspect)
        head = self.heads.get(key)
        if head is None:
            self.heads[key], self.calls[key] = task.body, 1
        else:
            self.calls[key] += 1
            if not task.body.startswith(head):
                self.heads[key] = head[:_common(head, task.body)]

    def prefix(self, prompt: str, aspect: str) -> int:
        """A prompt's static prefix, in tokens (4 characters a token).

        Args:
            prompt, aspect: the prompt's name and the aspect it asks about.

        Returns:
            The estimated tokens.
        """
        return len(self.heads[prompt, aspect]) // CHARS_PER_TOKEN

    def cached(self, prompt: str, aspect: str) -> bool:
        """Whether the provider would cache a prompt's prefix (at least its minimum, and read
        again by a later request).

        Args:
            prompt, aspect: as for `prefix`.

        Returns:
            True when the prefix would be read from the provider's cache.
        """
        return self.minimum is not None and self.calls[prompt, aspect] > 1 and \
            self.prefix(prompt, aspect) >= self.minimum

    def tokens(self, caching: bool) -> Tokens:
        """The tokens to buy, by kind.

        Args:
            caching: with the provider's prompt caching (see the module docstring).

        Returns:
            Every call's tokens, the cached prefixes split out when `caching`: the first
            request of a prompt writes its prefix, the later ones read it.
        """
        reads = writes = 0
        for prompt, aspect in self.heads if caching else ():
            if self.cached(prompt, aspect):
                size = self.prefix(prompt, aspect)
                reads += (self.calls[prompt, aspect] - 1) * size
                writes += size
        return Tokens(self.prompt_tokens - reads - writes, reads, writes,
                      self.completion_tokens)

    def cost(self, way: str) -> float | None:
        """USD one way: "online", "caching" (online with prompt caching) or "batch".

        Returns:
            The cost, None when the model's price is unknown.
        """
        price = model_price(self.model)
        if price is None:
            return None
        return price.cost(self.tokens(way == "caching"), batch=way == "batch")

    def short(self) -> list[tuple[str, str, int]]:
        """The prompts too short to be cached: (prompt, aspect, prefix tokens) where the
        provider caches prompts but this one's static prefix is under its minimum."""
        minimum = self.minimum
        return [] if minimum is None else [
            (prompt, aspect, self.prefix(prompt, aspect)) for prompt, aspect in self.heads
            if self.prefix(prompt, aspect) < minimum]


def _common(head: bytes, body: bytes) -> int:
    """How many bytes `body` shares with the start of `head` (binary search over slices: each
    comparison runs in C)."""
    low, high = 0, min(len(head), len(body))
    while low < high:
        mid = (low + high + 1) // 2
        if body[:mid] == head[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def model_price(model: ModelSpec) -> Price | None:
    """A model's price: the job's `price` or the provider table's (runner.job.providers).

    Args:
        model: the model.

    Returns:
        The price, with the job's `batch_discount` if it sets one; None when it is unknown.
    """
    price = price_of(model.kind, model.model, model.price)
    if price is None or model.batch_discount is None:
        return price
    return dataclasses.replace(price, batch_discount=model.batch_discount)


def estimate_cost(model: ModelSpec, prompt_tokens: int, completion_tokens: int) -> float | None:
    """What the given tokens cost, all billed as plain input and output.

    Args:
        model: the model; prompt_tokens, completion_tokens: the tokens.

    Returns:
        USD, or None when the model's price is unknown.
    """
    price = model_price(model)
    return None if price is None else price.cost(Tokens(prompt_tokens, 0, 0, completion_tokens))
