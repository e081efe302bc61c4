"""A fake of Anthropic's Messages + Message Batches endpoints on 127.0.0.1, in a thread.

`POST /v1/messages` (online, counted), `POST /v1/messages/batches`, `GET /v1/messages/batches`
(newest first, paginated by after_id), `GET /v1/messages/batches/{id}`, `POST
/v1/messages/batches/{id}/cancel`, `GET /v1/messages/batches/{id}/results` (JSONL). Each poll
moves a batch one step: in_progress -> in_progress -> ended, unless `hold`. Answers are
tests.fakeproviders' Messages answers, so a batch answer equals an online one. It counts batch
creations per custom_id and records the auth headers of every create.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from tests.fakeproviders import _anthropic
from tests.fakeserver import ThreadedServer


@dataclass
class AnthropicBatchState:
    """What the fake does (`hold`, `error_every`) and what it saw."""

    hold: bool = False
    """Keep batches in_progress until set back to False."""
    error_every: int = 0
    """Every request whose place in its batch is a multiple of this ends `errored`."""
    online: int = 0
    """POST /v1/messages calls."""
    creates: int = 0
    polls: int = 0
    creations: collections.Counter[str] = field(default_factory=collections.Counter)
    headers: list[dict[str, str]] = field(default_factory=list)
    """x-api-key, anthropic-version and Authorization of every create."""
    params: list[dict[str, Any]] = field(default_factory=list)
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


STATE = web.AppKey("anthropic_batch", AnthropicBatchState)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


async def _messages(request: web.Request) -> web.Response:
    request.app[STATE].online += 1
    return web.json_response(_anthropic(orjson.loads(await request.read())))


async def _create(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = orjson.loads(await request.read())
    state.headers.append({k: request.headers.get(k, "") for k in
                          ("x-api-key", "anthropic-version", "Authorization")})
    batch_id = f"msgbatch_{next(state.ids):04d}"
    reqs = body["requests"]
    state.requests[batch_id] = reqs
    state.creations.update(r["custom_id"] for r in reqs)
    state.params += [r["params"] for r in reqs]
    state.creates += 1
    state.steps[batch_id] = 0
    state.batches[batch_id] = {
        "id": batch_id, "type": "message_batch", "processing_status": "in_progress",
        "request_counts": {"processing": len(reqs), "succeeded": 0, "errored": 0,
                           "canceled": 0, "expired": 0},
        "created_at": _now(), "ended_at": None, "results_url": None}
    return web.json_response(state.batches[batch_id])


def _end(request: web.Request, batch: dict[str, Any], canceled: bool) -> None:
    counts = batch["request_counts"]
    counts["processing"] = 0
    n = len(request.app[STATE].requests[batch["id"]])
    if canceled:
        counts["canceled"] = n
    else:
        every = request.app[STATE].error_every
        counts["errored"] = len([i for i in range(n) if every and i % every == 0])
        counts["succeeded"] = n - counts["errored"]
    batch["processing_status"] = "ended"
    batch["ended_at"] = _now()
    batch["results_url"] = f"{request.url.origin()}/v1/messages/batches/{batch['id']}/results"


async def _get(request: web.Request) -> web.Response:
    state = request.app[STATE]
    batch = state.batches.get(request.match_info["id"])
    if batch is None:
        return web.json_response({"type": "error", "error": {"type": "not_found_error",
                                                             "message": "no such batch"}},
                                 status=404)
    state.polls += 1
    if batch["processing_status"] == "in_progress" and not state.hold:
        state.steps[batch["id"]] += 1
        if state.steps[batch["id"]] >= 2:
            _end(request, batch, canceled=False)
    elif batch["processing_status"] == "canceling":
        _end(request, batch, canceled=True)
    return web.json_response(batch)


async def _list(request: web.Request) -> web.Response:
    state = request.app[STATE]
    newest = sorted(state.batches.values(), key=lambda b: b["id"], reverse=True)
    after = request.query.get("after_id")
    if after:
        newest = [b for b in newest if b["id"] < after]
    limit = int(request.query.get("limit", "20"))
    page = newest[:limit]
    return web.json_response({"data": page, "has_more": len(newest) > limit,
                              "first_id": page[0]["id"] if page else None,
                              "last_id": page[-1]["id"] if page else None})


async def _cancel(request: web.Request) -> web.Response:
    batch = request.app[STATE].batches[request.match_info["id"]]
    if batch["processing_status"] == "in_progress":
        batch["processing_status"] = "canceling"
    return web.json_response(batch)


async def _results(request: web.Request) -> web.Response:
    state = request.app[STATE]
    batch_id = request.match_info["id"]
    canceled = state.batches[batch_id]["request_counts"]["canceled"]
    lines = []
    for i, req in enumerate(state.requests[batch_id]):
        if canceled:
            result: dict[str, Any] = {"type": "canceled"}
        elif state.error_every and i % state.error_every == 0:
            result = {"type": "errored", "error": {"type": "error", "error": {
                "type": "invalid_request_error", "message": "fake errored request"}}}
        else:
            result = {"type": "succeeded", "message": _anthropic(req["params"])}
        lines.append(orjson.dumps({"custom_id": req["custom_id"], "result": result}))
    return web.Response(body=b"\n".join(lines) + b"\n", content_type="application/binary")


class AnthropicBatchServer(ThreadedServer):
    """`with AnthropicBatchServer() as s: s.url, s.anth` (s.url ends in /v1)."""

    def __init__(self) -> None:
        super().__init__()
        self.anth = AnthropicBatchState()

    async def _start(self) -> web.AppRunner:
        app = web.Application()
        app[STATE] = self.anth
        app.router.add_post("/v1/messages", _messages)
        app.router.add_post("/v1/messages/batches", _create)
        app.router.add_get("/v1/messages/batches", _list)
        app.router.add_get("/v1/messages/batches/{id}", _get)
        app.router.add_post("/v1/messages/batches/{id}/cancel", _cancel)
        app.router.add_get("/v1/messages/batches/{id}/results", _results)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.25)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner
