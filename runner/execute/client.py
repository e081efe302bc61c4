"""POST one chat-completions request with aiohttp and classify what comes back: a checked
answer, or one error of the tree (runner.errors) for every aiohttp exception and HTTP status.

The mapping is here and nowhere else: the client classifies (retryable or not, how long the
server asked us to wait); `execute` decides what to do about it.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import errno
import functools
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import aiohttp
import orjson

from runner.errors import APIError, AuthError, ConnectError, RequestError, RetryableError, scrub

__all__ = ["Response", "retry_after", "send", "timeout_of"]

RETRYABLE_STATUS = frozenset({408, 409, 429})
AUTH_STATUS = frozenset({401, 403})
MAX_WAIT_S = 600.0
"""`retry_after`'s cap (the Batch API's requests): a longer ask is retried after 10 minutes.
An APIError carries the ask uncapped; the pool stops past limits.max_wait_s."""
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_SECONDS_PER_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class Response(NamedTuple):
    """A successful chat completion.

    A NamedTuple, not a frozen dataclass: building one took ~1 us an answer.
    """

    data: dict[str, Any]
    """The chat-completions JSON (after the provider's `decode`), with at least one answer."""
    latency_s: float
    """Seconds from sending the request to the whole body read."""
    headers: Mapping[str, str]
    """The response headers (case-insensitive), e.g. for the limits a server announces."""
    raw: bytes | None = None
    """The body as received when it is `data` itself (no `decode`): valid JSON (it decoded),
    stored as it came instead of serialised again."""


async def send(session: aiohttp.ClientSession, url: str, body: bytes, *,
               headers: Mapping[str, str], timeout: aiohttp.ClientTimeout,
               decode: Callable[[Any], Any] | None = None) -> Response:
    """Send one request to any provider and classify what comes back.

    Args:
        session: the run's aiohttp session.
        url: the full URL (runner.execute.providers builds it).
        body: the request's JSON bytes.
        headers: the request headers, keys included (never kept: see `scrub`).
        timeout: from `timeout_of(seconds)`.
        decode: turns the provider's answer into chat-completions JSON before it is checked;
            None when the answer is chat-completions JSON already.

    Returns:
        The decoded answer: a dict whose choices each have a message, at least one with an
        answer; `raw` is the body itself when there was no `decode`.

    Raises:
        AuthError: 401, 403.
        RequestError: 400, 404, 413, 422 and other 4xx: this request will not succeed.
        RetryableError: 408, 409, 429, 5xx, a timeout, a dropped connection, a body that is
            not a chat completion (kind "html" for a web page) or has no answer;
            `retry_after` set, uncapped, when the server said.
        ConnectError: no connection at all (refused, unknown host).
    """
    started = time.monotonic()
    try:
        async with session.post(url, data=body, headers=headers, timeout=timeout) as resp:
            raw = await resp.read()
            if resp.status != 200:
                raise _status_error(resp.status, raw, resp.headers, _secrets(url, headers))
    except TimeoutError:
        raise RetryableError(f"no answer within {timeout.total:g} s", kind="timeout") from None
    except aiohttp.ClientConnectorError as exc:
        raise _connect_error(exc, _secrets(url, headers)) from None
    except aiohttp.ClientError as exc:
        detail = scrub(f"connection dropped ({exc or type(exc).__name__})", _secrets(url, headers))
        raise RetryableError(detail, kind="connection") from None
    return Response(_checked(raw, decode), time.monotonic() - started, resp.headers,
                    raw if decode is None else None)


def _secrets(url: str, headers: Mapping[str, str]) -> tuple[str, ...]:
    """The values a server could echo that carry a key: every header value with more than a
    content type in it (Authorization, x-api-key, api-key), and the URL's query (Gemini's
    `?key=`)."""
    values = [v for k, v in headers.items() if k.lower() not in ("content-type", "accept")]
    values += [v.split(" ", 1)[1] for v in values if v.lower().startswith("bearer ")]
    query = url.partition("?")[2]
    values += [part.partition("=")[2] for part in query.split("&") if "=" in part]
    return tuple(v for v in values if len(v) >= 6)


def _connect_error(exc: aiohttp.ClientConnectorError, secrets: tuple[str, ...]) -> ConnectError:
    """`connection: refused`, `connection: unknown host`, or the OS's word for it."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        why = "unknown host"
    elif exc.os_error.errno == errno.ECONNREFUSED:
        why = "connection refused"
    else:
        why = exc.os_error.strerror or str(exc.os_error) or type(exc).__name__
    host = f"{exc.host}:{exc.port}"
    return ConnectError(scrub(f"cannot connect to {host} ({why})", secrets), kind="connection")


@functools.lru_cache(maxsize=8)
def timeout_of(total_s: float) -> aiohttp.ClientTimeout:
    """The aiohttp timeout for a total time, one (immutable) object per value.

    Args:
        total_s: seconds for the whole request.

    Returns:
        An aiohttp.ClientTimeout with `total` = total_s, shared by every request with it.
    """
    return aiohttp.ClientTimeout(total=total_s)


def _checked(raw: bytes, decode: Callable[[Any], Any] | None) -> dict[str, Any]:
    """The answer `raw` decoded (then passed through `decode`, if any), checked to be a chat
    completion: a dict whose choices each have a message, and at least one with an answer."""
    try:
        data: dict[str, Any] = orjson.loads(raw)
    except orjson.JSONDecodeError:
        if raw.lstrip()[:1] == b"<":  # a web page where the API should be: the breaker counts
            page = scrub(f"an HTML page: {raw.lstrip()[:80]!r}")
            raise RetryableError(f"malformed response body ({page})", kind="html",
                                 detail=page) from None
        raise _malformed(f"not JSON: {raw[:80]!r}") from None
    if decode is not None:
        data = decode(data)
    choices = data.get("choices") if type(data) is dict else None
    if not choices or type(choices) is not list:
        raise _malformed(f"no choices: {raw[:80]!r}")
    for choice in choices:
        if type(choice) is not dict or type(choice.get("message")) is not dict:
            raise _malformed(f"choice without message: {raw[:80]!r}")
    if not any(_answered(choice) for choice in choices):
        reason = choices[0].get("finish_reason")
        raise RetryableError(f"the server answered 200 with no content (finish_reason "
                             f"{reason})", kind="empty")
    return data


def _answered(choice: dict[str, Any]) -> bool:
    """A choice with text, a tool call, or a content-filter refusal (which is an answer: it
    parses as a failure, and asking again gets the same)."""
    message = choice["message"]
    return bool(message.get("content")) or bool(message.get("tool_calls")) or \
        bool(message.get("function_call")) or choice.get("finish_reason") == "content_filter"


def _malformed(detail: str) -> RetryableError:
    return RetryableError(scrub(f"malformed response body ({detail})"), kind="malformed",
                          detail=scrub(detail))


def _status_error(status: int, raw: bytes, headers: Any,
                  secrets: tuple[str, ...] = ()) -> APIError:
    detail = scrub(_server_message(raw), secrets)
    message = f"HTTP {status}: {detail}"
    if status in AUTH_STATUS:
        return AuthError(message + " (check the API key and its permissions)", status=status,
                         detail=detail)
    if status in RETRYABLE_STATUS or status >= 500:  # the wait as asked: execute caps it
        return RetryableError(message, status=status, detail=detail,
                              retry_after=_advised_wait(headers, status == 429))
    return RequestError(message, status=status, detail=detail)  # 400, 404, 413, 422 ...


def _server_message(raw: bytes) -> str:
    """The server's own error message (OpenAI puts it in error.message), one line."""
    with contextlib.suppress(orjson.JSONDecodeError):
        data = orjson.loads(raw)
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            return str(data["error"].get("message", ""))[:300] or "(no message)"
        if isinstance(data, dict) and "detail" in data:
            return str(data["detail"])[:300]
    text = raw.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:300] or "(empty body)"


def retry_after(headers: Any, *, rate_limited: bool = True) -> float | None:
    """Seconds the server asks us to wait before the next try.

    Read from retry-after-ms, Retry-After (seconds or an HTTP date), and, on a 429 only, the
    x-ratelimit-reset-* and anthropic-ratelimit-*-reset headers (OpenAI sends those on every
    response; they say when a limit refills, not how long an error wants us to wait).

    Args:
        headers: the response headers (any mapping with a case-insensitive `get`).
        rate_limited: whether the response was a 429, which makes the reset headers count.

    Returns:
        The wait in seconds, at most MAX_WAIT_S; None when the server gave no readable advice.
    """
    wait = _advised_wait(headers, rate_limited)
    return None if wait is None else min(wait, MAX_WAIT_S)


def _advised_wait(headers: Any, rate_limited: bool) -> float | None:
    ms = headers.get("retry-after-ms")
    if ms is not None:
        with contextlib.suppress(ValueError):
            return max(0.0, float(ms) / 1000)
    value = headers.get("Retry-After")
    if value is not None:
        try:
            return max(0.0, float(value))
        except ValueError:
            # an HTTP-date; anything else is no advice (and must not crash the worker)
            with contextlib.suppress(TypeError, ValueError):
                when = email.utils.parsedate_to_datetime(value)
                return max(0.0, when.timestamp() - time.time())
    if not rate_limited:
        return None
    resets = [_duration(headers.get(h)) for h in
              ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens")]
    # Anthropic's resets are RFC 3339 times ("2026-11-23T08:00:30Z"), not durations.
    resets += [_until(headers.get(f"anthropic-ratelimit-{h}-reset"))
               for h in ("requests", "tokens", "input-tokens", "output-tokens")]
    known = [r for r in resets if r is not None]
    return max(known) if known else None


def _until(value: str | None) -> float | None:
    """Seconds from now until an RFC 3339 time; None when absent or unreadable."""
    if not value:
        return None
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - time.time())


def _duration(value: str | None) -> float | None:
    """OpenAI's reset format: "1s", "6m0s", "20ms", "1h2m3.5s"."""
    if not value:
        return None
    parts = _DURATION.findall(value)
    if not parts:
        with contextlib.suppress(ValueError):
            return float(value)
        return None
    return sum(float(n) * _SECONDS_PER_UNIT[u] for n, u in parts)
