"""Stop a run whose endpoint is not there, instead of retrying every task into a report of
failures.

Two faults look like ordinary retryable or per-task errors but fail every task the same way:
- no connection at all (refused, unknown host): each task was retried with backoff, 9 tasks
  done after 90 s and an ETA of hours for 1,000; now the run stops after the first
  `CONNECT_FAILURES` attempts to each replica of a model all failed to connect, before any of
  them answered (a few seconds at most: the first attempts of the workers fail at once);
- a wrong model name or path (HTTP 404 on every request): every task was sent and failed; now
  the run stops after `NOT_FOUND` identical 404s of one model with no answer from it.
A replica that has answered once is never judged dead here: a server restarting in the middle
of a run is what retries are for. The pool asks `connect_failed` / `not_found` and, when they
return a message, stops the run with it (exit 2).
"""

from __future__ import annotations

from collections import Counter

from runner.errors import APIError

__all__ = ["CONNECT_FAILURES", "NOT_FOUND", "Breaker"]

CONNECT_FAILURES = 3
"""Failed connections to a replica that never answered, after which it counts as down."""
NOT_FOUND = 3
"""Identical 404s of a model that never answered, after which the run stops."""


class Breaker:
    """Per model: which replicas have answered, how often each failed to connect, and the 404s
    seen before any answer."""

    def __init__(self, replicas: dict[str, list[str]], names: dict[str, str]) -> None:
        """`replicas`: model -> the labels (base URLs) of its replicas; `names`: model -> the
        model name sent in requests (for the 404 message)."""
        self.replicas, self.names = replicas, names
        self.answered: set[str] = set()
        """Models with at least one answer."""
        self.refused: Counter[tuple[str, str]] = Counter()
        self.why: dict[tuple[str, str], str] = {}
        self.missing: Counter[tuple[str, str]] = Counter()

    def succeeded(self, model: str) -> None:
        self.answered.add(model)

    def connect_failed(self, model: str, replica: str, error: APIError) -> str | None:
        """Book a failed connection; the run's stop message once every replica is down."""
        if model in self.answered:
            return None
        self.refused[model, replica] += 1
        self.why[model, replica] = error.detail
        down = [r for r in self.replicas[model] if self.refused[model, r] >= CONNECT_FAILURES]
        if len(down) < len(self.replicas[model]):
            return None
        if len(down) == 1:
            return f"cannot connect to {down[0]} ({_cause(self.why[model, down[0]])}): is the " \
                   f"server running? (model {model}; check --base-url / base_url)"
        each = "; ".join(f"{r}: {_cause(self.why[model, r])}" for r in down)
        return f"cannot connect to any endpoint of model {model} ({each}): are the servers " \
               "running?"

    def not_found(self, model: str, replica: str, error: APIError) -> str | None:
        """Book a 404; the run's stop message after NOT_FOUND identical ones and no answer."""
        if error.status != 404 or model in self.answered:
            return None
        self.missing[model, error.detail] += 1
        if self.missing[model, error.detail] < NOT_FOUND:
            return None
        return f"the server at {replica} has no model {self.names[model]!r} (HTTP 404: " \
               f"{error.detail}); check --model / base_url (an OpenAI-compatible base URL " \
               "ends in /v1)"


def _cause(detail: str) -> str:
    """"connection refused" out of "cannot connect to 127.0.0.1:8000 (connection refused)"."""
    return detail.rpartition("(")[2].rstrip(")") or detail

