"""What answers cost: their tokens by how they are billed (`Tokens`), a model's list price by
token kind (`Price`), and the bill of many answers as paid, beside what prompt caching and
batching saved against list price (`Bill`). The prices themselves are the provider table's
(runner.job.providers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

__all__ = ["PRICES_READ", "Bill", "Billed", "Price", "Tokens"]

PRICES_READ = "2025-11"
"""When the table's prices were read (year-month), shown beside every bill."""


class Tokens(NamedTuple):
    """An answer's tokens by how they are billed (a usage split).

    `input` excludes the cached and cache-write tokens: the four add up to what was sent and
    received."""

    input: int = 0
    cached_input: int = 0
    """Prompt tokens read from the provider's prompt cache (billed at `Price.cached_input`)."""
    cache_write: int = 0
    """Prompt tokens written to the provider's prompt cache (Anthropic bills them apart)."""
    output: int = 0

    @classmethod
    def of(cls, usage: Any) -> Tokens:
        """The split of a stored answer's `usage`.

        Args:
            usage: chat-completions usage (`prompt_tokens` including the cached ones,
                `prompt_tokens_details.cached_tokens`, as OpenAI, Azure and Gemini send it,
                and the `cache_creation_input_tokens` runner.execute.providers keeps of an
                Anthropic answer), or Anthropic's own (`input_tokens` without the cached
                ones, `cache_read_input_tokens`, `cache_creation_input_tokens`); anything else
                counts no tokens.

        Returns:
            The tokens by kind.
        """
        if type(usage) is not dict:  # JSON decodes to dict; anything else counts nothing
            return _NONE
        get = usage.get
        write = get("cache_creation_input_tokens")
        write = write if type(write) is int else 0
        if "prompt_tokens" not in usage and "input_tokens" in usage:  # Anthropic's own
            return cls(_int(get("input_tokens")), _int(get("cache_read_input_tokens")), write,
                       _int(get("output_tokens")))
        details = get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if type(details) is dict else 0
        prompt, output = get("prompt_tokens"), get("completion_tokens")
        prompt = prompt if type(prompt) is int else 0
        # a tuple.__new__ of the fields: made once an answer read (a 1M-answer rescore)
        return _new(cls, (max(prompt - cached - write, 0), cached, write,
                          output if type(output) is int else 0))

    def plus(self, other: Tokens) -> Tokens:
        """These tokens and `other`, kind by kind.

        Returns:
            The sum.
        """
        return Tokens(*(a + b for a, b in zip(self, other, strict=True)))

    @property
    def prompt(self) -> int:
        """Every prompt token, cached or not."""
        return self.input + self.cached_input + self.cache_write


def _int(value: Any) -> int:
    return value if type(value) is int else 0


_NONE = Tokens()
_new = tuple.__new__


@dataclass(frozen=True, slots=True, kw_only=True)
class Price:
    """One model's list price, USD per 1M tokens of each kind."""

    input: float
    output: float
    cached_input: float | None = None
    """A prompt-cache read; None: billed as input (the model has no cached-input price)."""
    cache_write: float | None = None
    """A prompt-cache write; None: billed as input (only Anthropic bills writes apart)."""
    batch_discount: float = 0.5
    """Share of every price a Batch API answer saves."""

    @property
    def rates(self) -> tuple[float, float, float, float]:
        """USD per 1M tokens of each kind, in `Tokens`' order (a cache read or write without a
        price of its own at the input price)."""
        return (self.input, self.input if self.cached_input is None else self.cached_input,
                self.input if self.cache_write is None else self.cache_write, self.output)

    def cost(self, tokens: Tokens, *, batch: bool = False) -> float:
        """USD for the tokens.

        Args:
            batch: answered through the Batch API (the discount applies to every kind).

        Returns:
            The cost.
        """
        usd = sum(count * rate for count, rate in zip(tokens, self.rates, strict=True)) / 1e6
        return usd * (1 - self.batch_discount) if batch else usd


@dataclass(slots=True)
class Bill:
    """Answers' tokens and cost by kind of token, as paid, beside what caching and batching
    saved against list price (every prompt token at the input price, online). Kept by a run
    (its calls), the batch stage and a report's provenance (the answers it uses).

    Invariant: `listed - saved_caching - saved_batching == paid`, over priced answers."""

    tokens: Tokens = Tokens()
    """Every answer's tokens, priced or not."""
    paid: list[float] = field(default_factory=lambda: [0.0] * 4)
    """USD by kind, in `Tokens`' order (input, cached input, cache write, output)."""
    listed: float = 0.0
    saved_caching: float = 0.0
    saved_batching: float = 0.0
    unpriced: int = 0
    """Answers of models with no price: the cost is unknown (never counted as 0)."""

    def add(self, price: Price | None, tokens: Tokens, *, batch: bool = False) -> None:
        """Count one answer (or a sum of a model's answers).

        Args:
            price: the model's price; None: unknown.
            tokens: its tokens by kind.
            batch: answered through a Batch API (at the price's discount).
        """
        self.tokens = self.tokens.plus(tokens)
        if price is None:
            self.unpriced += 1
            return
        keep = 1 - price.batch_discount if batch else 1.0
        online = 0.0
        for i, (count, rate) in enumerate(zip(tokens, price.rates, strict=True)):
            online += count * rate / 1e6
            self.paid[i] += count * rate * keep / 1e6
        listed = (tokens.prompt * price.input + tokens.output * price.output) / 1e6
        self.listed += listed
        self.saved_caching += listed - online
        self.saved_batching += online * (1 - keep)

    def merge(self, other: Bill) -> None:
        """Add another bill's answers to this one.

        Args:
            other: a bill over other answers (another shard's, another model's).
        """
        self.tokens = self.tokens.plus(other.tokens)
        self.paid = [a + b for a, b in zip(self.paid, other.paid, strict=True)]
        self.listed += other.listed
        self.saved_caching += other.saved_caching
        self.saved_batching += other.saved_batching
        self.unpriced += other.unpriced

    @property
    def cost(self) -> float:
        """USD paid for the priced answers (see `unpriced`)."""
        return sum(self.paid)

    def as_dict(self, unknown: bool = False) -> dict[str, Any]:
        """The bill as manifests record it.

        Args:
            unknown: the cost is unknown even if every answer counted here had a price (a
                model of the run has none).

        Returns:
            `tokens` by kind; `cost_usd` by kind and `total`, `list_usd`, `saved_usd`
            (`caching`, `batching`): None where a price is unknown; and the `prices_read`
            date of the table.
        """
        known = not (unknown or self.unpriced)
        names = Tokens._fields

        def usd(value: float) -> float | None:
            return round(value, 6) if known else None

        return {"tokens": dict(zip(names, self.tokens, strict=True)),
                "cost_usd": {**{n: usd(v) for n, v in zip(names, self.paid, strict=True)},
                             "total": usd(self.cost)},
                "list_usd": usd(self.listed),
                "saved_usd": {"caching": usd(self.saved_caching),
                              "batching": usd(self.saved_batching)},
                "prices_read": PRICES_READ}


class Billed:
    """Counters keeping a `bill` (a run's, a batch stage's): its cost and unpriced answers
    read as their own."""

    __slots__ = ()
    bill: Bill

    @property
    def cost(self) -> float:
        """USD of the answers with a known price (see `unpriced`)."""
        return self.bill.cost

    @property
    def unpriced(self) -> int:
        """Answers of models with no known price: their cost is unknown, never 0."""
        return self.bill.unpriced
