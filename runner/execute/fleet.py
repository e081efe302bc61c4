"""The replicas serving one model: routing by free capacity, cool-down, probing, learned limits.

Every model is a fleet of one or more replicas (`endpoints = [...]` in the job file, else its
one `base_url`). Invariants, per replica:

- `in_flight` counts the tasks routed to it that have not finished (waiting in its limiter or on
  the wire); a task is routed to the usable replica with the least `(in_flight + 1) / weight`,
  where the weight is its rpm (set or learned; replicas with none get the mean of the known
  ones, or 1): calls spread by capacity, and a slow replica holds its tasks longer and so gets
  fewer.
- A streak of STREAK failures that say "this replica is unwell" (connection refused or reset,
  timeout, 5xx) takes it out for a cool-down (COOLDOWN_S, doubling to COOLDOWN_CAP_S while it
  keeps failing); after the cool-down it takes one probe request at a time until one succeeds.
  A 429 only rests it for the advised time. While other replicas are usable, a failed task is
  retried on another one at once. With one replica nothing is ever taken out: the pool's own
  backoff and 429 pause apply as before.
- Limits: a replica's own rpm/tpm (or, with none set anywhere, the ones its first response
  announces in rate-limit headers) pace it through its own Limiter; the model's and job's
  limits keep pacing the model as a whole in the pool.

Counts per replica live in `counts` (a dict shared with RunStats.endpoints, for the progress
line and the manifest). Which replica answered never enters the cache key.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runner.errors import RetryableError, redact_url
from runner.execute.limiter import Limiter
from runner.execute.providers import Advertised, Provider, advertised, provider
from runner.job.spec import Limits, ModelSpec

__all__ = ["Fleet", "Replica", "fleet_for"]

STREAK = 3
"""Consecutive connection errors / 5xx that take a replica out."""
COOLDOWN_S = 2.0
COOLDOWN_CAP_S = 60.0
STOP_CHECK_S = 0.5  # how soon a stop (Ctrl-C) is seen while every replica is out


@dataclass(slots=True, eq=False)
class Replica:
    """One endpoint of a fleet and its live state (see the module docstring)."""

    label: str
    """Its base URL, a token in it masked: names it in the cache record, progress line and
    manifest (never a key)."""
    provider: Provider
    api_key: Callable[[], str | None]
    key_env: str = ""
    """The variable its key is read from (never the key), for the message when it is refused."""
    rpm: float | None = None
    """Set (job) or learned requests per minute; None = unknown."""
    tpm: float | None = None
    to_learn: tuple[bool, bool] = (False, False)
    """(rpm, tpm): whether this limit is still to be learned from the response headers."""
    own_limits: tuple[float | None, float | None] = (None, None)
    """(rpm, tpm) of its `endpoints` entry: its own limiter paces these (the model's and
    job's limits pace the whole model in the pool)."""
    limiter: Limiter | None = None
    in_flight: int = 0
    streak: int = 0
    out_until: float = 0.0
    cooldown: float = COOLDOWN_S
    weight: float = 1.0
    """Its share of the fleet's capacity (rpm, or the mean of the known ones)."""
    counts: dict[str, Any] = field(default_factory=dict)

    @property
    def on_probation(self) -> bool:
        """Taken out by a streak of failures: cooling down, or taking one probe at a time."""
        return self.streak >= STREAK

    def routable(self, now: float) -> bool:
        """Whether a request may be routed to it now: up, or back from a cool-down with no
        probe in flight yet.

        Args:
            now: the event loop's time.

        Returns:
            True when it may take a request.
        """
        return self.out_until <= now and not (self.on_probation and self.in_flight > 0)


class Fleet:
    """Route a model's requests over its replicas. Create it inside the running event loop."""

    def __init__(self, replicas: list[Replica]) -> None:
        """A fleet over its replicas.

        Args:
            replicas: one or more; their weights are set here from their rpm.
        """
        assert replicas
        self.replicas = replicas
        self.several = len(replicas) > 1
        self.loop = asyncio.get_running_loop()
        self.replica_freed = asyncio.Event()  # set when a replica frees up or comes back
        self._weights()

    def _weights(self) -> None:
        known = [r.rpm for r in self.replicas if r.rpm]
        default = sum(known) / len(known) if known else 1.0
        for r in self.replicas:
            r.weight = r.rpm or default

    def pick(self, avoid: Replica | None) -> Replica | None:
        """The replica the next request goes to: the routable one with the most free capacity.

        Args:
            avoid: the replica a retry failed on, taken only when no other is routable.

        Returns:
            The replica (a fleet of one: always its replica), or None when all are out. On the
            hot path: one pass, no allocation.
        """
        if not self.several:
            return self.replicas[0]
        now = self.loop.time()
        best, lowest = None, float("inf")
        for r in self.replicas:
            if r is avoid or r.out_until > now or (r.streak >= STREAK and r.in_flight):
                continue
            load = (r.in_flight + 1) / r.weight
            if load < lowest:
                best, lowest = r, load
        if best is None and avoid is not None and avoid.routable(now):
            return avoid  # the only one up: retry where it failed
        return best

    def take(self) -> Replica | None:
        """`acquire` without waiting, for a fleet of one replica without a limiter of its own
        (the usual case: no coroutine an answer).

        Returns:
            The replica, now counting the request in flight until `release`, `succeeded` or
            `failed`; None when `acquire` is needed.
        """
        if self.several or self.replicas[0].limiter is not None:
            return None
        replica = self.replicas[0]  # what pick() gives a fleet of one
        replica.in_flight += 1
        return replica

    async def acquire(self, tokens: int, avoid: Replica | None,
                      stop: asyncio.Event) -> Replica | None:
        """Route one request: wait for a usable replica, then for its limiter.

        Args:
            tokens: the tokens the request reserves in the replica's limiter.
            avoid: the replica a retry failed on (see `pick`).
            stop: set by the pool when the run stops.

        Returns:
            The replica, now counting the request in flight until `release`, `succeeded` or
            `failed`; None when `stop` was set while every replica was out.
        """
        while (replica := self.pick(avoid)) is None:
            if stop.is_set():
                return None
            wait = min(r.out_until for r in self.replicas) - self.loop.time()
            self.replica_freed.clear()
            # a probe that succeeds frees its replica before the earliest cool-down ends
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.replica_freed.wait(),
                                       timeout=min(max(wait, 0.01), STOP_CHECK_S))
        replica.in_flight += 1
        if replica.limiter is not None:
            try:
                await replica.limiter.acquire(tokens)
            except BaseException:
                replica.in_flight -= 1
                raise
        return replica

    def release(self, replica: Replica) -> None:
        """A routed request ended without an answer or an error to book (stop, bad request).

        Args:
            replica: the replica `acquire` or `take` gave.
        """
        replica.in_flight -= 1
        self.replica_freed.set()

    def succeeded(self, replica: Replica, headers: Mapping[str, str], reserved: int,
                  used: int | None) -> None:
        """Book an answer: count it, end a streak when it answered a probe, reconcile its
        limiter, and learn announced limits from the first answer.

        Args:
            replica: the replica that answered.
            headers: the answer's response headers.
            reserved: the tokens `acquire` reserved.
            used: the tokens the answer's `usage` reports, None when it reports none.
        """
        replica.in_flight -= 1
        replica.counts["calls"] += 1
        # An answer to a request sent before the replica was taken out does not bring it
        # back: only a probe after the cool-down does. (Only a streak changes the cool-down
        # and the state: with none, there is nothing to reset.)
        if replica.streak and replica.out_until <= self.loop.time():
            replica.streak, replica.cooldown = 0, COOLDOWN_S
            replica.counts["state"] = "up"
        if replica.limiter is not None:
            replica.limiter.reconcile(reserved, used)
        if replica.to_learn[0] or replica.to_learn[1]:
            self._learn(replica, headers)
        self.replica_freed.set()

    def failed(self, replica: Replica, error: RetryableError) -> bool:
        """Book a retryable failure: a 429 rests the replica for the advised time, a streak of
        connection errors or 5xx takes it out for a cool-down (only in a fleet of several).

        Args:
            replica: the replica that failed.
            error: the failure.

        Returns:
            True when the retry should go to another replica now (one is routable).
        """
        replica.in_flight -= 1
        replica.counts["failures"] += 1
        self.replica_freed.set()
        if not self.several:
            return False
        now = self.loop.time()
        if error.status == 429:
            replica.out_until = max(replica.out_until, now + (error.retry_after or 1.0))
        elif error.status is None or error.status >= 500:
            replica.streak += 1
            if replica.on_probation:
                replica.out_until = now + replica.cooldown
                replica.cooldown = min(replica.cooldown * 2, COOLDOWN_CAP_S)
                replica.counts["state"] = "out"
                replica.counts["cooldowns"] += 1
        return any(r is not replica and r.routable(now) for r in self.replicas)

    def _learn(self, replica: Replica, headers: Mapping[str, str]) -> None:
        """Pace to the limits the first answer announces (only those no one set)."""
        limits = advertised(headers) or Advertised(None, None)
        learn_rpm, learn_tpm = replica.to_learn
        rpm = limits.rpm if learn_rpm else None  # what is learned: announced, set by no one
        tpm = limits.tpm if learn_tpm else None
        for name, learning, value in (("rpm", learn_rpm, rpm), ("tpm", learn_tpm, tpm)):
            if learning:  # the first answer decides: a server that announces nothing has none
                replica.counts[name] = f"{value:.0f} (learned)" if value else "none"
        replica.rpm, replica.tpm = rpm or replica.rpm, tpm or replica.tpm
        replica.to_learn = (False, False)
        if rpm or tpm:
            replica.limiter = Limiter(rpm or replica.own_limits[0], tpm or replica.own_limits[1])
            self._weights()


def fleet_for(model: ModelSpec, base_url: str, api_key: Callable[[], str | None],
              key_reader: Callable[[str], Callable[[], str | None]] | None, limits: Limits,
              counts: dict[str, dict[str, Any]]) -> Fleet:
    """The fleet of a model: its `endpoints`, or one replica at `base_url` with `api_key`.

    Args:
        model: the model.
        base_url: where it is served when it has no `endpoints`.
        api_key: reads the model's key when it has no `endpoints`.
        key_reader: variable name -> a reader of that key, for each endpoint's own
            `api_key_env`; None reads every endpoint's key with `api_key`.
        limits: the job's limits (the model's own rpm/tpm take precedence).
        counts: receives each replica's counters (calls, failures, cooldowns, state, rpm,
            tpm), by label; a label already there keeps its counters.

    Returns:
        The fleet; create it inside the running event loop.
    """
    model_rpm, model_tpm = model.rpm or limits.rpm, model.tpm or limits.tpm
    replicas = []
    urls = [e.base_url for e in model.endpoints]
    targets = [(e.base_url, e.rpm, e.tpm,
                key_reader(e.api_key_env) if key_reader is not None else api_key,
                e.api_key_env,
                # two keys for one URL: the variable's name (never the key) tells them apart
                f" [{e.api_key_env}]" if urls.count(e.base_url) > 1 else "")
               for e in model.endpoints] or [(base_url, None, None, api_key, model.api_key_env,
                                              "")]
    for url, rpm, tpm, key, key_env, suffix in targets:
        label = redact_url(url.rstrip("/")) + suffix
        to_learn = (rpm is None and model_rpm is None, tpm is None and model_tpm is None)
        route = provider(model.kind, url, model=model.model, api_version=model.api_version)
        replica = Replica(label=label, api_key=key, key_env=key_env, rpm=rpm or model_rpm,
                          tpm=tpm or model_tpm, to_learn=to_learn, own_limits=(rpm, tpm),
                          provider=route,
                          cooldown=COOLDOWN_S,  # read here: the tests shorten it
                          limiter=Limiter(rpm, tpm) if rpm or tpm else None)
        replica.counts = counts.setdefault(label, {
            "calls": 0, "failures": 0, "cooldowns": 0, "state": "up",
            "rpm": _shown(rpm, model_rpm, to_learn[0], len(targets)),
            "tpm": _shown(tpm, model_tpm, to_learn[1], len(targets))})
        replicas.append(replica)
    return Fleet(replicas)


def _shown(own: float | None, model: float | None, learning: bool, replicas: int) -> str:
    """A replica's effective limit for the progress line and manifest."""
    if own is not None:
        return f"{own:.0f}"
    if model is not None:  # the model's (or job's) limit: in a fleet, shared by all replicas
        return f"{model:.0f}" + (" (model)" if replicas > 1 else "")
    return "learning" if learning else "none"
