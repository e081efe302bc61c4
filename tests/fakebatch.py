"""A fake of OpenAI's Files + Batches endpoints on 127.0.0.1, beside the fake chat server.

`POST /v1/files` (multipart, purpose=batch), `GET /v1/files/{id}/content`, `POST /v1/batches`,
`GET /v1/batches/{id}`, `GET /v1/batches` (newest first, paginated), `POST
/v1/batches/{id}/cancel`, `DELETE /v1/files/{id}`, plus everything tests/fakeserver.py serves.
Each poll of a batch moves it one step: validating -> in_progress -> finalizing -> completed
(or `expired`, with part of the requests answered); `hold` keeps every batch in_progress until
released. Answers are the fake chat server's own, so a batch answer equals an online one. It
counts batch creations per custom_id and uploads, and can refuse creates with 429 or 503 or
fail chosen requests. Run alone (for the benchmark) as `python -m tests.fakebatch --port P`.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import time
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from tests.fakeserver import (
    STATE,
    Script,
    State,
    ThreadedServer,
    _chat,
    _completion,
    _models,
    default_reply,
)

STEPS = ("validating", "in_progress", "finalizing", "completed")


@dataclass
class BatchScript:
    """What the batch endpoints do; fields are read per request."""

    hold: bool = False
    """Keep batches in_progress (polls do not advance them) until set back to False."""
    expire: bool = False
    """Batches end `expired` with only the first `expire_done` share of requests answered."""
    expire_done: float = 0.5
    create_429: int = 0
    """Refuse this many creates with 429 (Retry-After 0.05) before accepting."""
    fail_every: int = 0
    """Every request whose place in its batch file is a multiple of this fails (status 400)."""
    fail_all_once: bool = False
    """The next batch to finish answers every request with a 500 error line."""
    upload_500: int = 0
    """Answer this many uploads with 500 (the client uploads again) before accepting."""
    create_503: bool = False
    """Answer every create with 503 (a server in trouble: the client retries) while set."""
    upload_s: float = 0.0
    """Take this long to answer an upload."""


class BatchState:
    """Files, batches and the counters the tests assert on."""

    def __init__(self, script: BatchScript | None = None) -> None:
        self.script = script or BatchScript()
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, list[str]] = {}
        self.creations: collections.Counter[str] = collections.Counter()
        """custom_id -> batches created holding it."""
        self.creates = 0
        self.refused = 0
        self.polls = 0
        self.uploads = 0
        self.uploaded: list[str] = []
        """The file id of every upload, in order."""
        self.deleted: list[str] = []
        """The file id of every DELETE /v1/files/{id}."""
        self.create_failures = 0
        self.auth: list[str | None] = []
        """The Authorization header of every create."""
        self.ids = itertools.count(1)


BATCH = web.AppKey("batch", BatchState)


def _error(status: int, message: str, retry_after: float | None = None) -> web.Response:
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
    return web.Response(status=status, headers=headers, content_type="application/json",
                        body=orjson.dumps({"error": {"message": message, "type": "fake"}}))


async def _upload(request: web.Request) -> web.Response:
    state = request.app[BATCH]
    reader = await request.multipart()
    purpose, data = None, b""
    async for part in reader:
        if part.name == "purpose":
            purpose = (await part.read()).decode()  # type: ignore[union-attr]
        elif part.name == "file":
            chunks = []
            while chunk := await part.read_chunk(1 << 20):  # type: ignore[union-attr]
                chunks.append(chunk)
            data = b"".join(chunks)
    if purpose != "batch" or not data:
        return _error(400, "purpose must be batch and file must be given")
    await asyncio.sleep(state.script.upload_s)
    if state.script.upload_500 > 0:
        state.script.upload_500 -= 1
        return _error(500, "the upload failed; try again")
    file_id = f"file-{next(state.ids)}"
    state.files[file_id] = data
    state.uploads += 1
    state.uploaded.append(file_id)
    return web.json_response({"id": file_id, "object": "file", "bytes": len(data),
                              "purpose": "batch", "created_at": int(time.time())})


async def _content(request: web.Request) -> web.Response:
    data = request.app[BATCH].files.get(request.match_info["id"])
    if data is None:
        return _error(404, "no such file")
    return web.Response(body=data, content_type="application/octet-stream")


async def _delete(request: web.Request) -> web.Response:
    state, file_id = request.app[BATCH], request.match_info["id"]
    if state.files.pop(file_id, None) is None:
        return _error(404, "no such file")
    state.deleted.append(file_id)
    return web.json_response({"id": file_id, "object": "file", "deleted": True})


async def _create(request: web.Request) -> web.Response:
    state = request.app[BATCH]
    if state.script.create_429 > 0:
        state.script.create_429 -= 1
        state.refused += 1
        return _error(429, "Too many batches being created", retry_after=0.05)
    if state.script.create_503:
        state.create_failures += 1
        return _error(503, "The server is overloaded", retry_after=0.05)
    state.auth.append(request.headers.get("Authorization"))
    body = orjson.loads(await request.read())
    data = state.files.get(body.get("input_file_id"))
    if data is None or body.get("endpoint") != "/v1/chat/completions":
        return _error(400, "unknown input_file_id or endpoint")
    keys = [orjson.loads(line)["custom_id"] for line in data.splitlines() if line.strip()]
    batch_id = f"batch_{next(state.ids)}"
    state.keys[batch_id] = keys
    state.creations.update(keys)
    state.creates += 1
    state.batches[batch_id] = {
        "id": batch_id, "object": "batch", "endpoint": body["endpoint"],
        "input_file_id": body["input_file_id"], "completion_window": "24h",
        "status": "validating", "created_at": int(time.time()), "output_file_id": None,
        "error_file_id": None,
        "request_counts": {"total": len(keys), "completed": 0, "failed": 0}}
    return web.json_response(state.batches[batch_id])


def _finish(state: BatchState, batch: dict[str, Any], status: str, share: float) -> None:
    """End a batch: the first `share` of its requests answered (or failed), the rest unrun."""
    lines = [orjson.loads(x) for x in state.files[batch["input_file_id"]].splitlines() if x]
    done = int(len(lines) * share)
    out, err = [], []
    fail_all, state.script.fail_all_once = state.script.fail_all_once, False
    for n, line in enumerate(lines):
        rid = f"batch_req_{batch['id']}_{n}"
        if n >= done:
            err.append({"id": rid, "custom_id": line["custom_id"], "response": None,
                        "error": {"code": "batch_expired", "message": "This request could not "
                                  "be executed before the completion window expired."}})
        elif fail_all or (state.script.fail_every and n % state.script.fail_every == 0):
            code = 500 if fail_all else 400
            err.append({"id": rid, "custom_id": line["custom_id"], "error": None,
                        "response": {"status_code": code, "request_id": rid, "body": {
                            "error": {"message": f"fake {code} for this request"}}}})
        else:
            reply = _completion(line["body"], default_reply(line["body"]), False)
            out.append({"id": rid, "custom_id": line["custom_id"], "error": None,
                        "response": {"status_code": 200, "request_id": rid, "body": reply}})
    for kind, rows in (("output_file_id", out), ("error_file_id", err)):
        if rows:
            file_id = f"file-{next(state.ids)}"
            state.files[file_id] = b"".join(orjson.dumps(r) + b"\n" for r in rows)
            batch[kind] = file_id
    batch["status"] = status
    batch["request_counts"] = {"total": len(lines), "completed": len(out), "failed": len(err)}


def _advance(state: BatchState, batch: dict[str, Any]) -> None:
    status = batch["status"]
    if status == "cancelling":
        _finish(state, batch, "cancelled", 0.5)
    elif status in ("validating", "finalizing") or (status == "in_progress"
                                                     and not state.script.hold):
        nxt = STEPS[STEPS.index(status) + 1]
        if nxt == "finalizing" and state.script.expire:
            _finish(state, batch, "expired", state.script.expire_done)
        elif nxt == "completed":
            _finish(state, batch, "completed", 1.0)
        else:
            batch["status"] = nxt


def run_all(state: BatchState) -> None:
    """Advance every batch to its end now, as 24 hours would (call while the server is idle)."""
    for batch in state.batches.values():
        for _ in STEPS:
            _advance(state, batch)


async def _get(request: web.Request) -> web.Response:
    state = request.app[BATCH]
    batch = state.batches.get(request.match_info["id"])
    if batch is None:
        return _error(404, "no such batch")
    state.polls += 1
    _advance(state, batch)
    return web.json_response(batch)


async def _list(request: web.Request) -> web.Response:
    state = request.app[BATCH]
    limit = int(request.query.get("limit", "20"))
    newest = list(reversed(state.batches.values()))
    if after := request.query.get("after"):
        ids = [b["id"] for b in newest]
        newest = newest[ids.index(after) + 1:] if after in ids else []
    page = newest[:limit]
    return web.json_response({"object": "list", "data": page,
                              "has_more": len(newest) > limit})


async def _cancel(request: web.Request) -> web.Response:
    batch = request.app[BATCH].batches.get(request.match_info["id"])
    if batch is None:
        return _error(404, "no such batch")
    if batch["status"] in ("validating", "in_progress", "finalizing"):
        batch["status"] = "cancelling"
    return web.json_response(batch)


def make_app(state: State, batch: BatchState) -> web.Application:
    app = web.Application(client_max_size=1 << 30)
    app[STATE] = state
    app[BATCH] = batch
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/files", _upload)
    app.router.add_get("/v1/files/{id}/content", _content)
    app.router.add_delete("/v1/files/{id}", _delete)
    app.router.add_post("/v1/batches", _create)
    app.router.add_get("/v1/batches", _list)
    app.router.add_get("/v1/batches/{id}", _get)
    app.router.add_post("/v1/batches/{id}/cancel", _cancel)
    return app


class BatchServer(ThreadedServer):
    """The fake chat + batch server in a thread: `with BatchServer() as s: s.url, s.batch`."""

    def __init__(self, script: BatchScript | None = None) -> None:
        super().__init__()
        self.batch = BatchState(script)

    async def _start(self) -> web.AppRunner:
        runner = web.AppRunner(make_app(self.state, self.batch), access_log=None,
                               shutdown_timeout=0.25)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return runner


async def _stats(request: web.Request) -> web.Response:
    b, s = request.app[BATCH], request.app[STATE]
    return web.json_response({"creates": b.creates, "uploads": b.uploads, "polls": b.polls,
                              "chat_requests": s.requests,
                              "keys_created_twice": sum(n > 1 for n in b.creations.values())})


def main() -> None:
    parser = argparse.ArgumentParser(description="fake Files + Batches server on 127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = make_app(State(Script()), BatchState())
    app.router.add_get("/bench/stats", _stats)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=lambda *a: None)


if __name__ == "__main__":
    main()
