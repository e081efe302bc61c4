"""A run's counters, kept by the pool and read by the progress line, the manifest and rescore:
an answered task counts as a cache hit, an API call or a repeat of an earlier task's key
(`done`); one without an answer is in `failures`, with its reason, or in `missing` (not run).

They live apart from the pool that keeps them: rescore, the progress line and the manifest read
them without importing the pool (and with it aiohttp, ~0.17 s a start)."""

from __future__ import annotations

import array
import time
from dataclasses import dataclass, field
from typing import Any

from runner.job.bill import Bill, Billed

__all__ = ["RunStats"]


@dataclass(slots=True)
class RunStats(Billed):
    """Counters of one run; `failures` maps a task key to "kind: message"."""

    total: int = 0
    cache_hits: int = 0
    api_calls: int = 0
    """Successful calls (answers stored)."""
    attempts: int = 0
    retries: int = 0
    bill: Bill = field(default_factory=Bill)
    """The calls' tokens and cost by kind (online and batch); `cost` of the priced ones,
    `unpriced` the calls of models with no price (their cost unknown, never counted as 0)."""
    committed_cost: float = 0.0
    """Estimated spend of everything dispatched so far (for --budget)."""
    duplicates: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    called: set[str] = field(default_factory=set)
    """Keys answered by the API in this run (the rest of the answers came from the cache)."""
    missing: list[str] = field(default_factory=list)
    """Keys not cached and not called (offline, budget, or interrupted before dispatch)."""
    waiting: int = 0
    """Tasks whose request another live run is buying: this run waits for those answers
    (runner/execute/claims.py)."""
    budget_stopped: bool = False
    until_ci: list[str] = field(default_factory=list)
    """--until-ci: why each judge stopped, with n (runner.reduce.stopping); empty without it."""
    interrupted: bool = False
    terminated: bool = False
    """Stopped by SIGTERM (exit 143), not Ctrl-C (130)."""
    fatal: str | None = None
    notes: list[str] = field(default_factory=list)
    """Lines for the user as the run goes (a server asking for a long wait); the progress
    display prints each once."""
    started: float = field(default_factory=time.time)
    endpoints: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """model -> replica base URL -> calls, failures, cooldowns, state, rpm, tpm (the fleet's)."""

    @property
    def prompt_tokens(self) -> int:
        """The calls' prompt tokens, cached or not."""
        return self.bill.tokens.prompt

    @property
    def completion_tokens(self) -> int:
        """The calls' output tokens."""
        return self.bill.tokens.output

    def cost_text(self, unpriced_model: bool = False) -> str:
        """`~$0.0123`, `cost unknown`, or `~$0.0123 + unknown` (some models have no price).

        Args:
            unpriced_model: one of the run's models has no price, called or not: its cost is
                unknown even where this run made no call of it (a cached rerun says what its
                paid run said, not ~$0).

        Returns:
            The text.
        """
        if not (self.unpriced or unpriced_model):
            return f"~${self.cost:.4f}"
        return f"~${self.cost:.4f} + unknown" if self.cost else "cost unknown"

    @property
    def done(self) -> int:
        """Tasks with an answer: cache hits, API calls and repeats."""
        return self.cache_hits + self.api_calls + self.duplicates

    def endpoint_counts(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The endpoints this run used, for the manifest.

        Returns:
            `endpoints` without the replicas this run never called (an all-cached run has
            none, so its manifest matches what rescore writes).
        """
        used = {model: {url: dict(c) for url, c in replicas.items()
                        if c["calls"] or c["failures"]}
                for model, replicas in self.endpoints.items()}
        return {model: replicas for model, replicas in used.items() if replicas}

    def as_dict(self) -> dict[str, Any]:
        """The counts as the manifest records them.

        Returns:
            tasks, cache_hits, api_calls, attempts, retries, failures, duplicates and not_run.
        """
        return {"tasks": self.total, "cache_hits": self.cache_hits, "api_calls": self.api_calls,
                "attempts": self.attempts, "retries": self.retries,
                "failures": len(self.failures), "duplicates": self.duplicates,
                "not_run": len(self.missing)}

    def settle_repeats(self, hashes: array.array[int], repeats_of_uncached: int = 0) -> None:
        """Count as repeats, not cache hits, the tasks whose key came before.

        Args:
            hashes: a 64-bit hash of every task's key (8 bytes a task; two different keys of a
                10M-task job share one with probability ~3e-6, which would count one task as a
                repeat); a large one is sorted in place.
            repeats_of_uncached: repeats of keys that were not cached, already counted as
                repeats.
        """
        extra = len(hashes) - _distinct(hashes) - repeats_of_uncached
        self.cache_hits -= extra
        self.duplicates += extra


SET_LIMIT = 250_000
"""Up to this many hashes are counted with a set (2 ms for 10k, 16 ms and ~17 MB for 100k),
beyond with numpy (8 bytes a hash, where a set takes ~70). Importing numpy here would stall the
pool's event loop ~0.15 s while the last requests are in flight."""


def _distinct(hashes: array.array[int]) -> int:
    """How many distinct values `hashes` holds; past SET_LIMIT it is sorted in place (its
    caller's last use): numpy.unique's copy and hash table took ~0.3 GB more at the end of a
    10M-task run, a sort in place takes a mask of a byte a hash."""
    if len(hashes) <= SET_LIMIT:
        return len(set(hashes))
    import numpy as np  # here, not at start-up: only a run that reaches its end needs it

    values = np.frombuffer(hashes, dtype=np.int64)
    values.sort()
    return int(np.count_nonzero(values[1:] != values[:-1])) + 1
