"""Per-model request- and token-per-minute limits on top of aiolimiter: no 60 s window sends
more than `rpm` requests, and tokens are reserved at `tpm` / 60 a second, the reservations
reconciled with the tokens each answer reports.

Buckets are per second (`AsyncLimiter(rpm / 60, 1)`): a per-minute bucket starts full and lets
twice the configured rate through in the first minute. Token acquisition is serialised behind a
lock so large requests are served first-come-first-served (aiolimiter serves the smallest
amount first and would starve big prompts), and a reservation larger than one second's worth is
taken in one-second chunks. After the call, `reconcile` books the difference between the
reservation and the response's `usage`: extra tokens are charged, unused ones are credited to
later requests.
"""

from __future__ import annotations

import asyncio
import collections

from aiolimiter import AsyncLimiter

__all__ = ["Limiter"]

WINDOW_S = 60.0
MARGIN_S = 0.05  # clock skew and transit between our send and the server's count


class Limiter:
    """RPM and TPM for one model. Create it inside the running event loop."""

    def __init__(self, rpm: float | None, tpm: float | None) -> None:
        """Limits for one model; None (or 0) for no limit.

        Args:
            rpm: requests per minute.
            tpm: tokens per minute (prompt and answer, as the answer's `usage` counts them).
        """
        # Under 60 rpm a one-second bucket would hold less than one request and aiolimiter
        # would reject every acquire: stretch the period so the bucket holds exactly one.
        period = max(1.0, 60 / rpm) if rpm else 1.0
        self._requests = AsyncLimiter(rpm * period / 60, period) if rpm else None
        self._tokens = AsyncLimiter(tpm / 60, 1) if tpm else None
        self._token_rate = tpm / 60 if tpm else 0.0
        self._lock = asyncio.Lock()
        # Send times of the last `rpm` requests: the bucket alone admits its capacity on top of
        # the rate (610 in the first minute at 600 rpm), and an API counts any 60 s window.
        self._window = max(1, int(rpm)) if rpm else 0
        self._sent: collections.deque[float] = collections.deque(maxlen=self._window or 1)
        self._window_lock = asyncio.Lock()
        self._credit = 0.0  # > 0: tokens reserved but unused; < 0: tokens used beyond reservations
        self.unlimited = not rpm and not tpm
        """Neither limit: `acquire` never waits (the pool then skips it: a coroutine an answer)."""

    async def acquire(self, tokens: int) -> None:
        """Wait until one request may go, and count it.

        Args:
            tokens: the tokens reserved for the request (its estimate before the answer).
        """
        if self._requests is not None:
            await self._requests.acquire()
        if self._tokens is not None:
            async with self._lock:
                await self._take(tokens)
        if self._window:
            await self._within_window()

    async def _within_window(self) -> None:
        """Wait until fewer than `rpm` requests went out in the last 60 s, then count this one.
        The check and the record have no await between them."""
        loop = asyncio.get_running_loop()
        async with self._window_lock:  # first come, first served
            while len(self._sent) == self._window and \
                    (wait := self._sent[0] + WINDOW_S + MARGIN_S - loop.time()) > 0:
                await asyncio.sleep(wait)
            self._sent.append(loop.time())

    async def _take(self, tokens: float) -> None:
        assert self._tokens is not None
        tokens -= self._credit  # a debt (negative credit) adds to this reservation
        self._credit = max(0.0, -tokens)
        while tokens > 0:
            chunk = min(tokens, self._token_rate)
            await self._tokens.acquire(chunk)
            tokens -= chunk

    def reconcile(self, reserved: int, used: int | None) -> None:
        """Book the real usage of a finished request against its reservation.

        Unused tokens become credit for later requests (at most one second's worth, so old
        credit cannot fund a burst); extra tokens become a debt paid by the next reservation.

        Args:
            reserved: the tokens `acquire` reserved for the request.
            used: the tokens the answer's `usage` reports; None when it reports none (nothing
                is booked).
        """
        if self._tokens is None or used is None:
            return
        self._credit = min(self._credit + reserved - used, self._token_rate)
