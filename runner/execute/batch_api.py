"""OpenAI's Files and Batches endpoints over aiohttp: upload, create, get, find, cancel, read;
also any OpenAI-compatible server that implements them (vLLM's batch runner, LiteLLM's proxy).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from runner.errors import APIError, AuthError, RequestError, RetryableError
from runner.execute.client import retry_after
from runner.execute.pool import backoff

__all__ = ["CHAT_URL", "OpenAIBatches"]

CHAT_URL = "/v1/chat/completions"
COMPLETION_WINDOW = "24h"
_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=300)


class OpenAIBatches:
    """One endpoint's Files + Batches API (base_url ends in /v1).

    Every call below returns the server's JSON object, or raises AuthError on 401 or 403;
    RequestError on any other refusal, with the server's message; RetryableError on 408, 409,
    429, 5xx, a connection error or a malformed body, still so after `max_retries` retries with
    capped backoff (Retry-After a floor).
    """

    def __init__(self, session: aiohttp.ClientSession, base_url: str,
                 api_key: Callable[[], str | None], max_retries: int = 6) -> None:
        """One endpoint's API.

        Args:
            session: the run's aiohttp session.
            base_url: the endpoint's base URL, ending in /v1.
            api_key: reads the key at each call (never kept here).
            max_retries: retries of a retryable failure before it is raised.
        """
        self.session, self.base = session, base_url.rstrip("/")
        self.api_key, self.max_retries = api_key, max_retries

    async def upload(self, path: Path) -> str:
        """Upload a request file (purpose "batch"), streamed from disk.

        Args:
            path: the request file.

        Returns:
            The provider's file id.
        """

        def form(files: contextlib.ExitStack) -> aiohttp.FormData:
            data = aiohttp.FormData()
            data.add_field("purpose", "batch")
            data.add_field("file", files.enter_context(path.open("rb")), filename=path.name,
                           content_type="application/jsonl")
            return data

        got = await self._call("POST", "/files", form=form)
        return str(got["id"])

    async def create(self, file_id: str) -> dict[str, Any]:
        """Create a batch over an uploaded request file (chat completions, 24 h window).

        Args:
            file_id: the uploaded file's id.

        Returns:
            The batch object: id, status, request_counts, output_file_id, error_file_id.
        """
        return await self._call("POST", "/batches", json={
            "input_file_id": file_id, "endpoint": CHAT_URL,
            "completion_window": COMPLETION_WINDOW})

    async def get(self, batch_id: str) -> dict[str, Any]:
        """A batch as the provider now reports it.

        Args:
            batch_id: the batch's id.

        Returns:
            The batch object, as `create` returns it.
        """
        return await self._call("GET", f"/batches/{batch_id}")

    async def delete_file(self, file_id: str) -> None:
        """Delete an uploaded file no batch will use (best effort: a file left over costs
        storage quota, not money, so a refusal here never stops a run).

        Args:
            file_id: the uploaded file's id.

        Raises:
            AuthError: 401, 403 (other failures are ignored).
        """
        try:
            await self._call("DELETE", f"/files/{file_id}")
        except (RequestError, RetryableError):
            pass

    async def cancel(self, batch_id: str) -> dict[str, Any]:
        """Ask the provider to cancel the batch `batch_id` (it ends as "cancelled", answered
        requests kept).

        Returns:
            The batch object, as `get` returns it.
        """
        return await self._call("POST", f"/batches/{batch_id}/cancel")

    async def find(self, file_id: str, pages: int = 50) -> dict[str, Any] | None:
        """The batch created over an uploaded file, for a run killed between create and
        recording the batch's id.

        Args:
            file_id: the uploaded file's id.
            pages: pages of the batch list (newest first, 100 a page) to look through.

        Returns:
            The batch object, or None when no batch within `pages` uses the file.
        """
        async for batch in self._listed("/batches", "after", pages):
            if batch.get("input_file_id") == file_id:
                return dict(batch)
        return None

    async def _listed(self, path: str, after: str, pages: int) -> AsyncIterator[dict[str, Any]]:
        """The objects of a list endpoint, newest first, 100 a page, at most `pages` pages;
        `after`: the query parameter naming the last object of the page before."""
        last: str | None = None
        for _ in range(pages):
            query = "?limit=100" + (f"&{after}={last}" if last else "")
            page = await self._call("GET", path + query)
            for batch in page.get("data") or []:
                yield batch
            if not page.get("has_more") or not page.get("data"):
                return
            last = str(page["data"][-1]["id"])

    async def lines(self, file_id: str) -> AsyncIterator[bytes]:
        """The lines of a file (output, error or input), streamed.

        Args:
            file_id: the file's id.

        Returns:
            An async iterator of its non-blank lines, without the newline.
        """
        async for line in self._stream(f"{self.base}/files/{file_id}/content"):
            yield line

    async def _stream(self, url: str) -> AsyncIterator[bytes]:
        """The non-empty lines of a GET `url`, streamed, retried like the other calls."""
        for attempt in range(self.max_retries + 1):
            try:
                async with self.session.get(url, headers=self._headers(),
                                            timeout=_TIMEOUT) as resp:
                    if resp.status != 200:
                        raise _error(resp.status, await resp.read(), resp.headers)
                    buffer = b""
                    async for chunk in resp.content.iter_chunked(1 << 20):
                        buffer += chunk
                        *done, buffer = buffer.split(b"\n")
                        for line in done:
                            if line.strip():
                                yield line
                    if buffer.strip():
                        yield buffer
                    return
            except (aiohttp.ClientError, TimeoutError) as exc:
                if attempt == self.max_retries:
                    raise RetryableError(f"{url}: {exc}") from None
            except RetryableError as exc:
                if attempt == self.max_retries:
                    raise
                await asyncio.sleep(backoff(attempt, exc.retry_after))

    def _headers(self) -> dict[str, str]:
        key = self.api_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _call(self, method: str, path: str, *, json: Any = None,
                    form: Callable[[contextlib.ExitStack], aiohttp.FormData] | None = None
                    ) -> dict[str, Any]:
        for attempt in range(self.max_retries):
            try:
                return await self._once(method, path, json, form)
            except RetryableError as exc:
                await asyncio.sleep(backoff(attempt, exc.retry_after))
        return await self._once(method, path, json, form)  # the last try: its error is raised

    async def _once(self, method: str, path: str, json: Any,
                    form: Callable[[contextlib.ExitStack], aiohttp.FormData] | None
                    ) -> dict[str, Any]:
        """One request; `form` makes a multipart body, its files opened in the stack it is
        given, closed when the request ends (each attempt opens them again)."""
        headers = self._headers()
        data: Any = None
        with contextlib.ExitStack() as files:
            if json is not None:
                data, headers["Content-Type"] = orjson.dumps(json), "application/json"
            elif form is not None:
                data = form(files)
            try:
                async with self.session.request(method, self.base + path, data=data,
                                                headers=headers, timeout=_TIMEOUT) as resp:
                    raw = await resp.read()
                    if resp.status != 200:
                        raise _error(resp.status, raw, resp.headers, f"{method} {path}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise RetryableError(f"{method} {self.base}{path}: connection error: "
                                     f"{type(exc).__name__}: {exc}") from None
        try:
            got = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise RetryableError(f"{method} {path}: malformed body {raw[:80]!r}") from None
        if not isinstance(got, dict):
            raise RetryableError(f"{method} {path}: malformed body {raw[:80]!r}")
        return got


def _error(status: int, raw: bytes, headers: Any, what: str = "") -> APIError:
    try:
        body = orjson.loads(raw)
        message = str(body["error"]["message"]) if isinstance(body, dict) else str(body)
    except (orjson.JSONDecodeError, KeyError, TypeError):
        message = raw.decode("utf-8", "replace")[:300]
    text = f"{what}: HTTP {status}: {message}".lstrip(": ")
    if status in (401, 403):
        return AuthError(text + " (check the API key and its permissions)", status=status)
    if status in (408, 409, 429) or status >= 500:
        return RetryableError(text, status=status,
                              retry_after=retry_after(headers, rate_limited=status == 429))
    return RequestError(text, status=status)
