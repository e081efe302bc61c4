"""The first request of a cacheable prefix goes alone: the others that share it wait for its
answer, so the provider has written the prefix before they read it.

Sent together, N requests with one new prefix are N cache writes (1.25x the input price at
Anthropic); sent after the first one's answer, one write and N - 1 reads (0.1x). On G-Eval's
long documents the pool's 16 workers otherwise start a document's first 16 requests before any
has written its prefix (bench/billing.py, G-Eval: 27,251 of 115,132 prefix tokens written
without the gate, 7,326 with it, in the same calls' time).
Only requests that carry a `cache_control` marker are held (runner.execute.providers), each
for at most the first request's own time; the workers meanwhile hold no limiter slot, and the
other prefixes' requests keep the pool busy.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

import orjson

from runner.execute.providers import anthropic_body, cache_marks
from runner.tasks import Task

__all__ = ["PrefixGate"]

KEPT = 100_000
"""Prefixes remembered as written; past that the oldest are forgotten (their caches have long
expired: a provider keeps one minutes)."""


class PrefixGate:
    """Which cacheable prefixes have a request in flight or answered.

    Invariant: `written` maps a prefix's digest to a future that is done once the first
    request with that prefix has finished (answered, failed or stopped)."""

    def __init__(self, kinds: dict[str, str]) -> None:
        """Args:
            kinds: model name -> its endpoint's kind; only anthropic models are held."""
        self.kinds = kinds
        self.written: dict[str, asyncio.Future[None]] = {}

    async def enter(self, task: Task) -> tuple[bytes | None, Callable[[], None] | None]:
        """Wait while another request is writing this task's prefix.

        Args:
            task: the task about to be sent (its `prefix` is not 0).

        Returns:
            The body to send, for an anthropic model (its body decoded once, for the prefix
            and the Messages body both), else None; and for the first request of a marked
            prefix, the call that lets the others go (call it once the request has finished,
            whatever the outcome), else None.
        """
        if self.kinds.get(task.model) != "anthropic":
            return None, None
        request = orjson.loads(task.body)
        body = anthropic_body(request, task.prefix)
        if not cache_marks(request["model"], task.prefix):
            return body, None
        text = "".join(m["content"] for m in request["messages"]
                       if isinstance(m.get("content"), str))
        digest = hashlib.sha256(f"{request['model']}\x00{text[:task.prefix]}".encode()).hexdigest()
        future = self.written.get(digest)
        if future is None:
            future = self.written[digest] = asyncio.get_running_loop().create_future()
            if len(self.written) > KEPT:
                oldest = next(iter(self.written))
                if self.written[oldest].done():
                    del self.written[oldest]
            return body, lambda: None if future.done() else future.set_result(None)
        if not future.done():
            await future
        return body, None
