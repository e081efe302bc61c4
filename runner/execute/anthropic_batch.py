"""Anthropic's Message Batches API behind the same interface as OpenAIBatches, so batch.py's
ledger, polling, ingest and fallback serve both providers unchanged.

Anthropic has no file upload: `upload` only names the request file already written to the
cache folder (the name carries the request count and the time), and `create` sends its lines
as `{"requests": [{"custom_id": KEY, "params": <the Messages body providers.py builds>}]}` to
`POST /v1/messages/batches`. States map to OpenAI's (in_progress -> in_progress, canceling ->
cancelling, ended -> completed, or cancelled / expired when some requests were), and each line
of `results_url` becomes an OpenAI output line: a succeeded message goes through providers.py's
one normaliser (`anthropic_answer`), so the cache record equals an online anthropic answer's;
errored, canceled and expired results become error lines with their reason.

Re-attaching after a kill between create and recording the id: `find` lists
`GET /v1/messages/batches` (newest first) and takes the oldest batch created no earlier than
the request file was named (less CLOCK_SKEW_S) whose request count equals the file's and
whose id the ledger does not already hold.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from runner.errors import RequestError
from runner.execute.batch_api import OpenAIBatches
from runner.execute.batch_files import body_of
from runner.execute.providers import ANTHROPIC_VERSION, anthropic_answer, anthropic_body

__all__ = ["CLOCK_SKEW_S", "MAX_BYTES", "MAX_REQUESTS", "AnthropicBatches"]

MAX_REQUESTS = 100_000
MAX_BYTES = 256 * 1024 * 1024
CLOCK_SKEW_S = 300.0
_LOCAL_ID_PREFIX = "anthropic-"


class AnthropicBatches(OpenAIBatches):
    """One Anthropic endpoint's Message Batches API (base_url ends in /v1)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str,
                 api_key: Callable[[], str | None], files: Path, max_retries: int = 6,
                 known: Callable[[], set[str]] = set) -> None:
        """As `OpenAIBatches`, with `files`, the folder batch.py keeps request files in
        (`create` reads them there), and `known`, the batch ids the ledger already holds
        (`find` skips them)."""
        super().__init__(session, base_url, api_key, max_retries)
        self.files, self.known = files, known

    async def upload(self, path: Path) -> str:
        """As `OpenAIBatches.upload`, but no upload: the file id is a local one,
        `anthropic-<ns>-<request count>`, naming the request file batch.py keeps."""
        with path.open("rb") as f:
            count = sum(1 for line in f if line.strip())
        return f"{_LOCAL_ID_PREFIX}{time.time_ns()}-{count}"

    async def delete_file(self, file_id: str) -> None:
        """As `OpenAIBatches.delete_file`: nothing, as nothing was uploaded (batch.py removes
        the local request file)."""

    async def create(self, file_id: str) -> dict[str, Any]:
        """Send the request file's lines as one Message Batch.

        Args:
            file_id: the local file id `upload` gave; the file is `files/<file_id>.jsonl`.

        Returns:
            The batch as an OpenAI batch object (see `_as_openai`).

        Raises:
            RequestError: the request file is gone, or the batch is over MAX_BYTES or
                MAX_REQUESTS; and as `OpenAIBatches.create`.
        """
        local = self.files / f"{file_id}.jsonl"
        if not local.exists():  # reserved on another machine, or its folder was removed
            raise RequestError(f"{local}: the request file of {file_id} is gone, so its batch "
                               "cannot be created; its requests are submitted again")
        parts = [b'{"requests":[']
        with local.open("rb") as f:
            for line in f:
                if not line.strip():
                    continue
                key, body = body_of(line)
                if len(parts) > 1:
                    parts.append(b",")
                parts += [b'{"custom_id":', orjson.dumps(key), b',"params":',
                          anthropic_body(body), b"}"]
        parts.append(b"]}")
        body = b"".join(parts)
        if len(body) > MAX_BYTES or (len(parts) - 2) // 5 > MAX_REQUESTS:
            raise RequestError(f"{file_id}: {len(body)} bytes is over Message Batches' limit of "
                               f"{MAX_BYTES} (or {MAX_REQUESTS} requests); lower --batch-size")
        return _as_openai(await self._call("POST", "/messages/batches",
                                                json=orjson.Fragment(body)))

    async def get(self, batch_id: str) -> dict[str, Any]:
        """As `OpenAIBatches.get`, the Message Batch as an OpenAI batch object."""
        return _as_openai(await self._call("GET", f"/messages/batches/{batch_id}"))

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        """As `OpenAIBatches.cancel`, the Message Batch as an OpenAI batch object."""
        return _as_openai(await self._call("POST", f"/messages/batches/{batch_id}/cancel"))

    async def find(self, file_id: str, pages: int = 50) -> dict[str, Any] | None:
        """As `OpenAIBatches.find`, matched by request count and creation time (see the module
        docstring); None also when `file_id` is not a local file id."""
        try:
            stamp, count = file_id.removeprefix(_LOCAL_ID_PREFIX).split("-")
            since, requests = int(stamp) / 1e9 - CLOCK_SKEW_S, int(count)
        except ValueError:
            return None
        best: tuple[float, dict[str, Any]] | None = None
        taken = self.known()
        async for batch in self._listed("/messages/batches", "after_id", pages):
            created = _timestamp(batch.get("created_at"))
            total = sum(int(v or 0) for v in (batch.get("request_counts") or {}).values())
            if created is not None and created >= since and total == requests \
                    and batch.get("id") not in taken and (best is None or created < best[0]):
                best = (created, dict(batch))
        return None if best is None else _as_openai(best[1])

    async def lines(self, file_id: str) -> AsyncIterator[bytes]:
        """As `OpenAIBatches.lines`, for a results_url: each line as an OpenAI output line.

        Raises:
            RequestError: `file_id` is not a results URL (an input file is only kept locally).
        """
        if not file_id.startswith(("http://", "https://")):
            raise RequestError(f"{file_id}: the request file of an Anthropic batch is kept only "
                               f"in {self.files}; it is gone, so its answers cannot be matched")
        async for line in self._stream(file_id):
            yield _output_line(orjson.loads(line))

    def _headers(self) -> dict[str, str]:
        key = self.api_key()
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if key:
            headers["x-api-key"] = key
        return headers


def _as_openai(batch: dict[str, Any]) -> dict[str, Any]:
    """A Message Batch as batch.py reads an OpenAI batch: id, status, counts, output file."""
    counts = batch.get("request_counts") or {}
    status = {"in_progress": "in_progress", "canceling": "cancelling"}.get(
        str(batch.get("processing_status")))
    if status is None:  # ended
        status = "cancelled" if counts.get("canceled") else \
            "expired" if counts.get("expired") else "completed"
    failed = sum(int(counts.get(k) or 0) for k in ("errored", "canceled", "expired"))
    return {"id": batch.get("id"), "status": status, "output_file_id": batch.get("results_url"),
            "error_file_id": None,
            "request_counts": {"completed": int(counts.get("succeeded") or 0),
                               "failed": failed}}


def _output_line(obj: dict[str, Any]) -> bytes:
    result = obj.get("result") if isinstance(obj.get("result"), dict) else {}
    assert isinstance(result, dict)
    kind = result.get("type")
    out: dict[str, Any] = {"custom_id": obj.get("custom_id")}
    if kind == "succeeded" and isinstance(result.get("message"), dict):
        out["response"] = {"status_code": 200, "body": anthropic_answer(result["message"])}
    elif kind == "errored":
        error = (result.get("error") or {}).get("error") or result.get("error") or {}
        out["error"] = {"code": error.get("type", "errored"),
                        "message": error.get("message", "the request errored")}
    else:
        out["error"] = {"code": kind, "message": f"the request was {kind} before it ran"}
    return orjson.dumps(out)


def _timestamp(value: Any) -> float | None:
    """An RFC 3339 created_at (or epoch seconds) as epoch seconds."""
    if isinstance(value, int | float):
        return float(value)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
