"""Stop a run whose endpoint is not there, or no longer there, instead of retrying every task
into a report of failures.

Four faults look like ordinary retryable or per-task errors but fail every task the same way;
the pool asks `failed` after each failed attempt and stops the run (exit 2) with the message it
returns:
- no connection at all (refused, unknown host) from the start: once the first
  `CONNECT_FAILURES` attempts to each replica of a model all failed to connect, before any of
  them answered (a few seconds; retried with backoff, 1,000 tasks took hours);
- an endpoint that dies mid-run: once every replica of the model has done nothing but fail to
  connect for `down_after_s` (limits.down_after_s, 60 s by default: a server restarting
  quicker than that is what retries are for);
- a wrong model name or path (HTTP 404 on every request) and a web page where the API should be
  (HTTP 200 with HTML: a login page, a proxy, a web server at the wrong path): after
  `SAME_FAILURES` identical ones of a model with no answer from it.
Until a model has shown that its endpoint is there (an answer, or any failure other than these
three), the pool sends its tasks one at a time (`unproven`): a wrong model name costs 3
requests, not about the concurrency (52 at 64), for one request's latency at a healthy run's
start.
"""

from __future__ import annotations

from collections import Counter

from runner.errors import APIError, ConnectError

__all__ = ["CONNECT_FAILURES", "SAME_FAILURES", "Breaker", "refused", "too_long"]

CONNECT_FAILURES = 3
"""Failed connections to a replica that never answered, after which it counts as down."""
SAME_FAILURES = 3
"""Identical 404s or HTML pages of a model that never answered, after which the run stops."""


class Breaker:
    """Per model: which replicas answered, their failed connections, and the identical 404s and
    HTML pages seen before any answer.

    Invariants: a model in `answered` is not in `unproven`; `down_since` holds a replica only
    while nothing but failed connections came from it since its last answer.
    """

    def __init__(self, replicas: dict[str, list[str]], names: dict[str, str],
                 down_after_s: float) -> None:
        """A breaker that has seen nothing yet.

        Args:
            replicas: model -> the labels (base URLs) of its replicas.
            names: model -> the model name sent in requests (for the 404 message).
            down_after_s: seconds of only failed connections to every replica of a model
                that answered before, after which the run stops (limits.down_after_s).
        """
        self.replicas, self.names, self.down_after_s = replicas, names, down_after_s
        self.answered: set[str] = set()
        """Models with at least one answer."""
        self.unproven: set[str] = set(replicas)
        """Models whose endpoint has not shown it is there: the pool sends one task at a time."""
        self.connect_failures: Counter[tuple[str, str]] = Counter()
        """(model, replica) -> failed connections before the model's first answer."""
        self.connect_error: dict[tuple[str, str], str] = {}
        """(model, replica) -> the last connection error's detail, for the stop message."""
        self.down_since: dict[tuple[str, str], float] = {}
        """(model, replica) -> when its first failed connection since its last answer came."""
        self.same_count: Counter[tuple[str, str, str]] = Counter()
        """(model, kind, detail) -> how many such 404s or HTML pages."""

    def succeeded(self, model: str, replica: str) -> None:
        """Book an answer: the model is proven, and this replica up.

        Args:
            model: the model's name in the job.
            replica: the label of the replica that answered.
        """
        self.answered.add(model)
        self.unproven.discard(model)
        self.down_since.pop((model, replica), None)

    def failed(self, model: str, replica: str, error: APIError, now: float) -> str | None:
        """Book a failed attempt.

        Args:
            model: the model's name in the job.
            replica: the label (base URL) of the replica it went to.
            error: what went wrong.
            now: the event loop's time.

        Returns:
            The run's stop message when the model's endpoint is not (or no longer) there;
            None otherwise.
        """
        if isinstance(error, ConnectError):
            self.connect_error[model, replica] = error.detail
            if model in self.answered:
                return self._gone(model, now, replica)
            return self._not_reached(model, replica)
        self.down_since.pop((model, replica), None)  # something answered: it is there
        if model in self.answered:
            return None
        if error.status == 404 or error.kind == "html":
            return self._same(model, replica, error)
        self.unproven.discard(model)  # any other failure: the endpoint and model are there
        return None

    def _not_reached(self, model: str, replica: str) -> str | None:
        """The stop message once every replica of a model that never answered has failed to
        connect CONNECT_FAILURES times."""
        self.connect_failures[model, replica] += 1
        down = [r for r in self.replicas[model]
                if self.connect_failures[model, r] >= CONNECT_FAILURES]
        if len(down) < len(self.replicas[model]):
            return None
        if len(down) == 1:
            return f"cannot connect to {down[0]} ({self._cause(model, down[0])}): is the " \
                   f"server running? (model {model}; check --base-url / base_url)"
        each = "; ".join(f"{r}: {self._cause(model, r)}" for r in down)
        return f"cannot connect to any endpoint of model {model} ({each}): are the servers " \
               "running?"

    def _gone(self, model: str, now: float, replica: str) -> str | None:
        """The stop message once every replica of a model that answered before has done
        nothing but fail to connect for down_after_s."""
        self.down_since.setdefault((model, replica), now)
        since = [self.down_since.get((model, r)) for r in self.replicas[model]]
        if any(s is None or now - s < self.down_after_s for s in since):
            return None
        stopped = f"stopped answering: no connection for {self.down_after_s:g} s"
        hint = "(limits.down_after_s sets how long the run waits)"
        down = self.replicas[model]
        if len(down) == 1:
            return f"{down[0]} {stopped} ({self._cause(model, down[0])}): is the server " \
                   f"still running? (model {model}) {hint}"
        each = "; ".join(f"{r}: {self._cause(model, r)}" for r in down)
        return f"every endpoint of model {model} {stopped} ({each}): are the servers still " \
               f"running? {hint}"

    def _same(self, model: str, replica: str, error: APIError) -> str | None:
        """The stop message after SAME_FAILURES identical 404s or HTML pages of a model that
        never answered."""
        self.same_count[model, error.kind, error.detail] += 1
        if self.same_count[model, error.kind, error.detail] < SAME_FAILURES:
            return None
        if error.kind == "html":
            return f"{replica} answers HTML, not the API: check base_url (model {model}; an " \
                   f"OpenAI-compatible base URL ends in /v1; got {error.detail})"
        name = self.names[model]
        if name in error.detail or "model" in error.detail.lower():
            return f"the server at {replica} has no model {name!r} (HTTP 404: " \
                   f"{error.detail}); check --model / base_url (an OpenAI-compatible base " \
                   "URL ends in /v1)"
        return f"the server at {replica} answered HTTP 404 at its chat-completions path " \
               f"({error.detail}): check --base-url / base_url (an OpenAI-compatible base " \
               "URL ends in /v1)"

    def _cause(self, model: str, replica: str) -> str:
        """"connection refused" out of "cannot connect to 127.0.0.1:8000 (connection
        refused)"."""
        detail = self.connect_error[model, replica]
        return detail.rpartition("(")[2].rstrip(")") or detail


def refused(replica: str, key_env: str, key_sent: bool, error: APIError) -> str:
    """The stop message of a 401/403, saying what was sent: a key from an unset variable is no
    key at all (the message named OPENAI_API_KEY as if it had been sent).

    Args:
        replica: the label (base URL) of the replica that refused.
        key_env: the variable the key is read from ("" when none).
        key_sent: whether that variable held a key.
        error: the AuthError.

    Returns:
        The message.
    """
    if not key_env:
        sent = "the credentials"
    elif key_sent:
        sent = f"the credentials in {key_env}"
    else:
        sent = f"the request without a key ({key_env} is not set)"
    return f"the server at {replica} refused {sent} (HTTP {error.status}: {error.detail}): " \
           "check the key and its permissions"


def too_long(replica: str, error: APIError, cap: float) -> str:
    """The stop message when a server asks to wait longer than limits.max_wait_s (a silent
    wait of up to 10 minutes, retried, then the same ask again, was the run's whole day).

    Args:
        replica: the label (base URL) of the replica that asked.
        error: the error whose `retry_after` is over `cap`.
        cap: limits.max_wait_s.

    Returns:
        The message.
    """
    return f"the server at {replica} asks to wait {error.retry_after:.0f} s before the next " \
           f"request ({error.reason}), over limits.max_wait_s = {cap:g} s: rerun later, or " \
           "raise limits.max_wait_s"
