"""A fake OpenAI-compatible chat-completions server on 127.0.0.1, scriptable per test.

It answers `POST /v1/chat/completions` and `GET /v1/models`, and can inject latency, 429 with
Retry-After, 5xx, dropped connections, hangs past the client's timeout, malformed JSON, slow
bodies, empty answers (`content: ""`) and 401, drawn per request or per body and attempt; it
enforces an optional requests-per-minute limit the way a real API does, and counts requests
per distinct body. Used by the tests (in a thread, so a CLI subprocess can call it) and by
the benchmarks (`python tests/fakeserver.py --port 0`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import random
import re
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

FAULTS = ("429", "500", "502", "503", "drop", "malformed", "hang", "slow", "empty", "401", "400")


_OUTPUT_LINE = re.compile(r"^Output (\d+):", re.MULTILINE)
_FORM_LINE = re.compile(r"^- ([A-Z][A-Za-z ]+) \(1-5\):", re.MULTILINE)


def default_reply(body: dict[str, Any]) -> str:
    """A deterministic answer, from the hash of the user message, in the shape the prompt asks
    for: "Output N ... Score:" blocks (TST), a filled "- Metric (1-5):" form (Korean chat),
    two scores on the first line (battles), or "N stars" (1-5) otherwise."""
    text = body["messages"][-1]["content"]
    digest = int(hashlib.sha256(text.encode()).hexdigest(), 16)
    if "stars" not in text:  # generation stages: two candidates must not answer alike
        digest ^= int(hashlib.sha256(str(body.get("model")).encode()).hexdigest(), 16)
    stars = digest % 5 + 1
    outputs = sorted({int(n) for n in _OUTPUT_LINE.findall(text)})
    if outputs:
        return "\n".join(
            f"Output {n}\nScore: {(digest >> n) % 101}\nContent: {(digest >> n) % 97}\n"
            f"Style: {(digest >> n) % 89}\nFluency: {(digest >> n) % 83}\nExplanation: fine"
            for n in outputs)
    fields = list(dict.fromkeys(_FORM_LINE.findall(text)))
    if "scores ONLY" in text and len(fields) > 1:
        return "\n".join(f"- {name} (1-5): {(digest >> i) % 5 + 1}"
                         for i, name in enumerate(fields))
    if "AI助手" in text or "Assistant 1" in text or "AI assistant" in text.lower():
        return f"{digest % 10 + 1} {(digest >> 4) % 10 + 1}\nBoth answers were considered."
    return f"{stars} stars"


@dataclass
class Script:
    """What the server does. Change fields between requests; all are read per request."""

    latency_s: float = 0.0
    reply: Callable[[dict[str, Any]], str] = default_reply
    faults: dict[str, float] = field(default_factory=dict)
    """fault name -> probability, drawn per request (seeded)."""
    fault_for: Callable[[str, int], str] | None = None
    """(body key, attempt) -> fault name, attempt 1 being the first request of that body: a
    fault mix that two runs see alike whatever order their requests come in. Replaces
    `faults` when set (`queue` and `raw` still come first)."""
    slow_s: float = 0.3
    """How long a "slow" answer takes to send its body, in pieces."""
    queue: list[str] = field(default_factory=list)
    """Faults to serve first, one per request, in order ("ok" = a normal answer)."""
    raw: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)
    """Exact replies (status, headers, body) to serve before anything else, one per request."""
    retry_after: float | None = 0.05
    rpm: float | None = None
    """Server-side limit: over this many requests in any 60 s window -> 429."""
    hang_s: float = 30.0
    seed: int = 0
    logprobs: bool = False
    usage: Callable[[dict[str, Any], dict[str, Any]], None] | None = None
    """(request body, the reply's usage) -> None, changing the usage in place: e.g. report
    `prompt_tokens_details.cached_tokens` as a provider's prompt cache would."""


class State:
    """Counters the tests assert on."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.rng = random.Random(script.seed)
        self.bodies: collections.Counter[str] = collections.Counter()
        self.answers: collections.Counter[str] = collections.Counter()
        """Body key -> 200 answers with a text (not "empty") sent for it."""
        self.requests = 0
        self.answered = 0
        self.status: collections.Counter[str] = collections.Counter()
        self.auth: list[str | None] = []
        self.window: collections.deque[float] = collections.deque()
        self.in_flight = 0
        self.max_in_flight = 0
        self.log: list[tuple[float, float, str]] = []
        """(arrived, replied, outcome) per request, in time.monotonic() seconds."""

    def body_key(self, body: dict[str, Any]) -> str:
        return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()

    def fault(self, key: str = "") -> str:
        if self.script.queue:
            return self.script.queue.pop(0)
        if self.script.fault_for is not None:
            return self.script.fault_for(key, self.bodies[key])
        for name, p in self.script.faults.items():
            if self.rng.random() < p:
                return name
        return "ok"

    def over_rpm(self) -> bool:
        if self.script.rpm is None:
            return False
        now = time.monotonic()
        while self.window and now - self.window[0] >= 60:
            self.window.popleft()
        if len(self.window) >= self.script.rpm:
            return True
        self.window.append(now)
        return False


STATE = web.AppKey("state", State)


# A reply made of texts joined by CHOICE_SEP gives each of the n choices its own text, in turn.
CHOICE_SEP = "\x1e"


def _completion(body: dict[str, Any], text: str, logprobs: bool) -> dict[str, Any]:
    n = int(body.get("n", 1))
    texts = text.split(CHOICE_SEP)
    prompt_tokens = sum(len(m["content"]) for m in body["messages"]) // 4
    choices = []
    for i in range(n):
        text = texts[i % len(texts)]
        choice: dict[str, Any] = {"index": i, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": text}}
        if logprobs or body.get("logprobs"):
            first = text.split()[0] if text.split() else text
            choice["logprobs"] = {"content": [{"token": first, "logprob": -0.1, "top_logprobs": [
                {"token": first, "logprob": -0.1}, {"token": "3", "logprob": -2.5}]}]}
        choices.append(choice)
    return {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model", "fake"), "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 3 * n,
                      "total_tokens": prompt_tokens + 3 * n}}


async def _chat(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    script = state.script
    arrived = time.monotonic()
    state.requests += 1
    state.auth.append(request.headers.get("Authorization"))
    raw = await request.read()
    body = orjson.loads(raw)
    key = state.body_key(body)
    state.bodies[key] += 1
    state.in_flight += 1
    state.max_in_flight = max(state.max_in_flight, state.in_flight)
    outcome = "429"
    try:
        if state.over_rpm():
            return _status(state, 429, "rate limit (rpm)", retry_after=1.0)
        if script.raw:
            status, headers, payload = script.raw.pop(0)
            outcome = f"raw {status}"
            state.status[str(status)] += 1
            return web.Response(status=status, headers=headers, body=payload)
        outcome = fault = state.fault(key)
        if script.latency_s:
            await asyncio.sleep(script.latency_s)
        return await _serve(request, state, body, fault, key)
    finally:
        state.in_flight -= 1
        state.log.append((arrived, time.monotonic(), outcome))


async def _serve(request: web.Request, state: State, body: dict[str, Any],
                 fault: str, key: str = "") -> web.StreamResponse:
    script = state.script
    if fault == "429":
        return _status(state, 429, "Rate limit reached", retry_after=script.retry_after)
    if fault in ("500", "502", "503", "401", "400"):
        return _status(state, int(fault), f"fake {fault}")
    if fault == "drop":
        state.status["drop"] += 1
        assert request.transport is not None
        request.transport.close()
        return web.Response(status=500)
    if fault == "hang":
        state.status["hang"] += 1
        await asyncio.sleep(script.hang_s)
    if fault == "malformed":
        state.status["malformed"] += 1
        return web.Response(body=b'{"choices": [', content_type="application/json")
    state.status["200"] += 1
    state.answered += 1
    text = "" if fault == "empty" else script.reply(body)
    if fault == "empty":
        state.status["empty"] += 1
    else:
        state.answers[key] += 1
    completion = _completion(body, text, script.logprobs)
    if script.usage is not None:
        script.usage(body, completion["usage"])
    payload = orjson.dumps(completion)
    if fault == "slow":
        return await _slowly(request, state, payload)
    return web.Response(body=payload, content_type="application/json")


async def _slowly(request: web.Request, state: State, payload: bytes) -> web.StreamResponse:
    """A whole answer whose body comes in four pieces over `slow_s` seconds."""
    state.status["slow"] += 1
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(payload)
    await response.prepare(request)
    piece = -(-len(payload) // 4)
    try:
        for start in range(0, len(payload), piece):
            await asyncio.sleep(state.script.slow_s / 4)
            await response.write(payload[start:start + piece])
        await response.write_eof()
    except ConnectionResetError:  # the client went away half-way (killed): nobody to tell
        pass
    return response


def _status(state: State, status: int, message: str,
            retry_after: float | None = None) -> web.Response:
    state.status[str(status)] += 1
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
    return web.Response(status=status, headers=headers, content_type="application/json",
                        body=orjson.dumps({"error": {"message": message, "type": "fake"}}))


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})


def make_app(state: State) -> web.Application:
    app = web.Application()
    app[STATE] = state
    with warnings.catch_warnings():  # bench/server.py still reads the plain string key
        warnings.simplefilter("ignore", web.NotAppKeyWarning)
        app["state"] = state
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    return app


class ThreadedServer:
    """The fake server on 127.0.0.1 in a background thread: `with ThreadedServer() as s: s.url`."""

    def __init__(self, script: Script | None = None, port: int = 0) -> None:
        """A server to start with `with`; `port` 0 takes a free one (a given one: a server
        back on the port of one that stopped, for the same cache keys)."""
        self.state = State(script or Script())
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _start(self) -> web.AppRunner:
        # Teardown cancels handlers still hanging or sleeping instead of waiting 60 s for them.
        runner = web.AppRunner(make_app(self.state), access_log=None, shutdown_timeout=0.25)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner

    def __enter__(self) -> ThreadedServer:
        self.thread.start()
        self.runner = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _stop(self) -> None:
        await self.runner.cleanup()
        # Handlers still sleeping (hang, latency) past the shutdown timeout: end them here, or
        # closing the loop leaves them pending ("Task was destroyed but it is pending!").
        rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in rest:
            task.cancel()
        await asyncio.gather(*rest, return_exceptions=True)

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="fake OpenAI-compatible server on 127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--rpm", type=float)
    args = parser.parse_args()
    state = State(Script(latency_s=args.latency, rpm=args.rpm))
    web.run_app(make_app(state), host="127.0.0.1", port=args.port, access_log=None,
                print=lambda *a: None)


if __name__ == "__main__":
    main()
