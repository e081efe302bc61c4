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
        """A breaker that has seen nothing yet.

        Args:
            replicas: model -> the labels (base URLs) of its replicas.
            names: model -> the model name sent in requests (for the 404 message).
        """
        self.replicas, self.names = replicas, names
        self.answered: set[str] = set()
        """Models with at least one answer."""
        self.connect_failures: Counter[tuple[str, str]] = Counter()
        """(model, replica) -> failed connections."""
        self.connect_error: dict[tuple[str, str], str] = {}
        """(model, replica) -> the last connection error's detail, for the stop message."""
        self.not_found_count: Counter[tuple[str, str]] = Counter()
        """(model, the 404's detail) -> how many such 404s."""

    def succeeded(self, model: str) -> None:
        """Book an answer: the model is never judged dead again.

        Args:
            model: the model's name in the job.
        """
        self.answered.add(model)

    def connect_failed(self, model: str, replica: str, error: APIError) -> str | None:
        """Book a failed connection.

        Args:
            model: the model's name in the job.
            replica: the label (base URL) of the replica that failed.
            error: the ConnectError, whose detail names the cause.

        Returns:
            The run's stop message once every replica of a model that never answered has
            failed CONNECT_FAILURES times; None until then.
        """
        if model in self.answered:
            return None
        self.connect_failures[model, replica] += 1
        self.connect_error[model, replica] = error.detail
        down = [r for r in self.replicas[model]
                if self.connect_failures[model, r] >= CONNECT_FAILURES]
        if len(down) < len(self.replicas[model]):
            return None
        if len(down) == 1:
            cause = _cause(self.connect_error[model, down[0]])
            return f"cannot connect to {down[0]} ({cause}): is the server running? " \
                   f"(model {model}; check --base-url / base_url)"
        each = "; ".join(f"{r}: {_cause(self.connect_error[model, r])}" for r in down)
        return f"cannot connect to any endpoint of model {model} ({each}): are the servers " \
               "running?"

    def not_found(self, model: str, replica: str, error: APIError) -> str | None:
        """Book a failed request, counting it when it is a 404.

        Args:
            model: the model's name in the job.
            replica: the label (base URL) of the replica that answered 404.
            error: the request's error; only a 404 counts.

        Returns:
            The run's stop message after NOT_FOUND identical 404s of a model that never
            answered; None until then.
        """
        if error.status != 404 or model in self.answered:
            return None
        self.not_found_count[model, error.detail] += 1
        if self.not_found_count[model, error.detail] < NOT_FOUND:
            return None
        return f"the server at {replica} has no model {self.names[model]!r} (HTTP 404: " \
               f"{error.detail}); check --model / base_url (an OpenAI-compatible base URL " \
               "ends in /v1)"


def _cause(detail: str) -> str:
    """"connection refused" out of "cannot connect to 127.0.0.1:8000 (connection refused)"."""
    return detail.rpartition("(")[2].rstrip(")") or detail

