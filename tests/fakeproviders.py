"""A fake of the other providers' dialects on 127.0.0.1, in a thread: Anthropic's Messages API,
Azure OpenAI's deployment routes and Gemini's OpenAI-compatible route, plus an OpenAI-style
server that announces and enforces a request limit.

Every request is recorded (path, query, headers, body) for the tests to assert the exact URL,
headers and body each kind needs. Answers come from tests.fakeserver's deterministic replies.
With `Fake(billing=Biller())` the answers' `usage` is billed as the providers bill prompt
caching (tests/fakebilling.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.fakebilling import Biller, anthropic_usage, openai_usage
from tests.fakeserver import _completion, default_reply

ANTHROPIC_LIMITS = {"anthropic-ratelimit-requests-limit": "50",
                    "anthropic-ratelimit-tokens-limit": "40000",
                    "anthropic-ratelimit-requests-remaining": "49"}


@dataclass
class Seen:
    """One request as it arrived."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Fake:
    """What the server does and what it saw. `raw`: exact replies to serve first."""

    latency_s: float = 0.0
    raw: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    limit_rpm: float | None = None
    """Enforce this many requests a minute as a leaky bucket draining rpm/60 a second that
    holds `burst` requests (APIs enforce a minute's limit over short intervals); over -> 429."""
    burst: float = 20.0
    announce: bool = True
    """Send x-ratelimit-limit-requests/-tokens (and Anthropic's) on every answer."""
    billing: Biller | None = None
    """Bill prompt caching in the answers' usage (and keep the totals)."""
    reply: Callable[[dict[str, Any]], str] = default_reply
    """The answer's text for a request (Messages bodies flattened to text first)."""
    seen: list[Seen] = field(default_factory=list)
    status: dict[int, int] = field(default_factory=dict)
    level: float = 0.0
    last: float = field(default_factory=time.monotonic)

    def over_limit(self) -> bool:
        if self.limit_rpm is None:
            return False
        now = time.monotonic()
        self.level = max(0.0, self.level - (now - self.last) * self.limit_rpm / 60)
        self.last = now
        if self.level + 1 > self.burst:
            return True
        self.level += 1
        return False

    def count(self, status: int) -> None:
        self.status[status] = self.status.get(status, 0) + 1


FAKE = web.AppKey("fake", Fake)


async def _handle(request: web.Request) -> web.Response:
    fake = request.app[FAKE]
    body = orjson.loads(await request.read())
    fake.seen.append(Seen(path=request.path, query=dict(request.query),
                          headers=dict(request.headers), body=body))
    if fake.raw:
        status, headers, payload = fake.raw.pop(0)
        fake.count(status)
        return web.Response(status=status, headers=headers, body=payload,
                            content_type="application/json")
    if fake.over_limit():
        fake.count(429)
        return web.json_response({"error": {"message": "rate limit (rpm)"}}, status=429,
                                 headers={"Retry-After": "0.5"})
    messages = request.path.endswith("/messages")
    billed = None if fake.billing is None else \
        (fake.billing.anthropic if messages else fake.billing.openai)(body)  # on arrival
    if fake.latency_s:
        await asyncio.sleep(fake.latency_s)
    fake.count(200)
    if messages:
        answer = _anthropic(body, fake.reply)
        if billed is not None:
            billed.output = answer["usage"]["output_tokens"]
            answer["usage"] = anthropic_usage(billed, billed.output)
        headers = ANTHROPIC_LIMITS if fake.announce else {}
    else:
        answer = _completion(body, fake.reply(body), False)
        if billed is not None:
            billed.output = answer["usage"]["completion_tokens"]
            answer["usage"] = openai_usage(billed, billed.output)
        headers = {"x-ratelimit-limit-requests": f"{fake.limit_rpm:g}",
                   "x-ratelimit-limit-tokens": "1000000"} if fake.announce and fake.limit_rpm \
            else {}
    if billed is not None:  # seen by the provider's cache from the answer on
        assert fake.billing is not None
        fake.billing.remember(billed)
    return web.Response(body=orjson.dumps(answer), content_type="application/json",
                        headers=headers)


def flat(content: Any) -> str:
    """A Messages content or system field as text: a string, or its text blocks joined."""
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [] if isinstance(b, dict))


def _anthropic(body: dict[str, Any],
               reply: Callable[[dict[str, Any]], str] = default_reply) -> dict[str, Any]:
    """A Messages API answer: content blocks, stop_reason, input/output tokens. After a
    prefilled assistant turn ("{"), the answer continues it: the rest of a JSON object.
    Content sent as blocks (cache_control) is read as its text."""
    body = {**body, "system": flat(body.get("system", "")),
            "messages": [{**m, "content": flat(m["content"])} for m in body["messages"]]}
    prefilled = bool(body["messages"]) and body["messages"][-1]["role"] == "assistant"
    text = reply({**body, "messages": body["messages"][:-1]} if prefilled else body)
    if prefilled:
        text = f' "score": {text.split()[0]}, "reasoning": "as asked"}}'

    tokens = sum(len(m["content"]) for m in body["messages"]) // 4 + len(body.get("system", ""))
    return {"id": "msg_fake", "type": "message", "role": "assistant", "model": body["model"],
            "content": [{"type": "text", "text": text[:2]}, {"type": "text", "text": text[2:]}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": tokens, "output_tokens": 7}}


class ProviderServer:
    """`with ProviderServer() as s:` serves every route on 127.0.0.1 at `s.root` (no /v1)."""

    def __init__(self, fake: Fake | None = None) -> None:
        self.fake = fake or Fake()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.port = 0

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _start(self) -> web.AppRunner:
        app = web.Application()
        app[FAKE] = self.fake
        app.router.add_post("/{tail:.*}", _handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.25)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner

    def __enter__(self) -> ProviderServer:
        self.thread.start()
        self.runner = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
