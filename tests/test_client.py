"""Tests for runner.execute.client against the fake server on 127.0.0.1: status mapping, waits,
faults."""

from __future__ import annotations

import email.utils
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict

from runner import errors
from runner.errors import (
    APIError,
    AuthError,
    ConnectError,
    RequestError,
    RetryableError,
    scrub,
)
from runner.execute.client import MAX_WAIT_S, Response, retry_after, send, timeout_of
from tests.fakeserver import ThreadedServer

BODY = {"model": "judge", "messages": [{"role": "user", "content": "Rate {this}."}],
        "temperature": 0}
RAW = orjson.dumps(BODY)


async def post_chat(session: aiohttp.ClientSession, url: str, body: bytes, *,
                    api_key: str | None, timeout_s: float) -> Response:
    """One chat-completions request through `send`, as an OpenAI-compatible provider's route
    sends it (a Bearer key when there is one)."""
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return await send(session, url, body, headers=headers, timeout=timeout_of(timeout_s))


def _error_body(message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error"}})


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _post(server: ThreadedServer, session: aiohttp.ClientSession, *,
                api_key: str | None = None, timeout_s: float = 5.0) -> dict[str, object]:
    response = await post_chat(session, server.url + "/chat/completions", RAW, api_key=api_key,
                               timeout_s=timeout_s)
    return response.data


async def _fails(server: ThreadedServer, session: aiohttp.ClientSession,
                 timeout_s: float = 5.0) -> APIError:
    with pytest.raises(APIError) as info:
        await _post(server, session, timeout_s=timeout_s)
    return info.value


async def test_ok(server: ThreadedServer, session: aiohttp.ClientSession) -> None:
    started = time.monotonic()
    response = await post_chat(session, server.url + "/chat/completions", RAW, api_key=None,
                               timeout_s=5)
    assert 0 <= response.latency_s <= time.monotonic() - started
    assert response.data["choices"][0]["message"]["content"].endswith(" stars")
    assert response.data["usage"]["completion_tokens"] == 3
    assert server.state.bodies[server.state.body_key(BODY)] == 1  # the body arrived as sent


@pytest.mark.parametrize(("status", "kind"), [
    (400, RequestError), (404, RequestError), (422, RequestError), (418, RequestError),
    (401, AuthError), (403, AuthError),
    (408, RetryableError), (409, RetryableError), (429, RetryableError),
    (500, RetryableError), (502, RetryableError), (503, RetryableError), (504, RetryableError),
])
async def test_status_mapping(server: ThreadedServer, session: aiohttp.ClientSession,
                              status: int, kind: type[APIError]) -> None:
    server.state.script.raw = [(status, {}, _error_body(f"the server says {status}"))]
    error = await _fails(server, session)
    assert type(error) is kind
    assert error.status == status and error.kind == str(status)
    assert str(error).startswith(f"HTTP {status}: the server says {status}")
    assert error.retry_after is None
    assert server.state.requests == 1


async def test_auth_error_says_what_to_check(server: ThreadedServer,
                                             session: aiohttp.ClientSession) -> None:
    server.state.script.queue = ["401"]
    error = await _fails(server, session)
    assert isinstance(error, AuthError) and "fake 401" in str(error) and "API key" in str(error)


@pytest.mark.parametrize(("body", "shown"), [
    (b"<html>Bad Gateway</html>\n", "<html>Bad Gateway</html>"),
    (b"", "(empty body)"),
    (b'{"detail": "no such model"}', "no such model"),
])
async def test_error_message_without_openai_shape(server: ThreadedServer,
                                                  session: aiohttp.ClientSession,
                                                  body: bytes, shown: str) -> None:
    server.state.script.raw = [(502, {}, body)]
    assert str(await _fails(server, session)) == f"HTTP 502: {shown}"


@pytest.mark.parametrize(("headers", "wait"), [
    ({"Retry-After": "2"}, 2.0),
    ({"Retry-After": "0.5"}, 0.5),
    ({"retry-after-ms": "250"}, 0.25),
    ({"retry-after-ms": "250", "Retry-After": "9"}, 0.25),       # the finer one wins
    ({"x-ratelimit-reset-requests": "6m0s"}, 360.0),
    ({"x-ratelimit-reset-tokens": "20ms"}, 0.02),
    ({"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "9m3.5s"}, 543.5),
    ({"x-ratelimit-reset-tokens": "1h2m3.5s"}, 3723.5),         # as asked: the pool caps it
    ({"Retry-After": "inf"}, float("inf")),
    ({"Retry-After": "soon"}, None),                             # unreadable: no advice
    ({}, None),
])
async def test_retry_after_from_429(server: ThreadedServer, session: aiohttp.ClientSession,
                                    headers: dict[str, str], wait: float | None) -> None:
    server.state.script.raw = [(429, headers, _error_body("Rate limit reached"))]
    error = await _fails(server, session)
    assert isinstance(error, RetryableError) and error.status == 429
    assert error.retry_after == pytest.approx(wait)


async def test_reset_headers_are_no_advice_on_5xx(server: ThreadedServer,
                                                 session: aiohttp.ClientSession) -> None:
    server.state.script.raw = [(503, {"x-ratelimit-reset-requests": "6m0s"}, b"busy")]
    error = await _fails(server, session)
    assert isinstance(error, RetryableError) and error.status == 503
    assert error.retry_after is None


async def test_retry_after_http_date(server: ThreadedServer,
                                     session: aiohttp.ClientSession) -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    date = email.utils.format_datetime(when, usegmt=True)
    server.state.script.raw = [(503, {"Retry-After": date}, b"busy")]
    error = await _fails(server, session)
    assert isinstance(error, RetryableError) and error.status == 503
    assert error.retry_after is not None and 28 <= error.retry_after <= 30


@pytest.mark.parametrize(("headers", "wait"), [
    ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),    # in the past: go now
    ({"Retry-After": "-3"}, 0.0),
    ({"retry-after-ms": "x", "Retry-After": "4"}, 4.0),          # a bad header falls through
    ({"RETRY-AFTER": "7"}, 7.0),                                 # header names ignore case
    ({"x-ratelimit-reset-requests": "1.5"}, 1.5),
    ({"x-ratelimit-reset-requests": "later"}, None),
    ({"Retry-After": ""}, None),
    ({"x-ratelimit-reset-tokens": "1h2m3.5s"}, MAX_WAIT_S),     # capped (the Batch API's)
    ({"Retry-After": "inf"}, MAX_WAIT_S),
])
def test_retry_after_edge_cases(headers: dict[str, str], wait: float | None) -> None:
    assert retry_after(CIMultiDict(headers)) == pytest.approx(wait)


@pytest.mark.parametrize("body", [
    b'{"choices": [',
    b"not json at all",
    b'{"choices": []}',
    b'{"id": "x"}',
    b'[{"choices": []}]',
    b'{"choices": [{"index": 0}]}',
    b"\xff\xfe",
])
async def test_malformed_body_is_retryable(server: ThreadedServer,
                                           session: aiohttp.ClientSession, body: bytes) -> None:
    server.state.script.raw = [(200, {"Content-Type": "application/json"}, body)]
    error = await _fails(server, session)
    assert isinstance(error, RetryableError) and error.status is None
    assert "malformed response body" in str(error) and error.kind == "malformed"
    assert error.reason.startswith("malformed: ")


async def test_malformed_fault(server: ThreadedServer, session: aiohttp.ClientSession) -> None:
    server.state.script.queue = ["malformed"]
    assert isinstance(await _fails(server, session), RetryableError)
    assert server.state.status["malformed"] == 1


async def test_timeout_is_retryable(server: ThreadedServer,
                                    session: aiohttp.ClientSession) -> None:
    server.state.script.hang_s = 0.5
    server.state.script.queue = ["hang"]
    started = time.monotonic()
    error = await _fails(server, session, timeout_s=0.1)
    assert time.monotonic() - started < 0.45
    assert isinstance(error, RetryableError) and error.status is None
    assert str(error) == "no answer within 0.1 s"
    assert error.reason == "timeout: no answer within 0.1 s"


async def test_dropped_connection_is_retryable(server: ThreadedServer,
                                               session: aiohttp.ClientSession) -> None:
    server.state.script.queue = ["drop", "ok"]
    error = await _fails(server, session)
    assert isinstance(error, RetryableError) and error.status is None
    assert error.reason.startswith("connection: connection dropped (")
    assert not isinstance(error, ConnectError)  # it connected: no breaker counts this one
    assert (await _post(server, session))["choices"]  # the session recovers


async def test_refused_connection_is_retryable(session: aiohttp.ClientSession) -> None:
    with ThreadedServer() as gone:
        url = gone.url
    with pytest.raises(ConnectError) as info:
        await post_chat(session, url + "/chat/completions", RAW, api_key=None, timeout_s=2)
    port = url.split(":")[2].split("/")[0]
    assert info.value.reason == f"connection: cannot connect to 127.0.0.1:{port} " \
                                "(connection refused)"


async def test_unknown_host_is_a_connect_error(session: aiohttp.ClientSession) -> None:
    with pytest.raises(ConnectError) as info:
        await post_chat(session, "http://no-such-host.invalid/v1/chat/completions", RAW,
                        api_key=None, timeout_s=5)
    assert info.value.reason.endswith("(unknown host)"), info.value.reason


@pytest.mark.parametrize("message", [
    {"role": "assistant", "content": None},
    {"role": "assistant", "content": ""},
    {"role": "assistant"},
])
async def test_a_200_without_an_answer_is_retryable(server: ThreadedServer,
                                                    session: aiohttp.ClientSession,
                                                    message: dict[str, object]) -> None:
    body = orjson.dumps({"choices": [{"index": 0, "finish_reason": "stop", "message": message}]})
    server.state.script.raw = [(200, {"Content-Type": "application/json"}, body)]
    error = await _fails(server, session)
    assert type(error) is RetryableError
    assert error.reason == "empty: the server answered 200 with no content (finish_reason stop)"


@pytest.mark.parametrize("choices", [
    [{"finish_reason": "content_filter", "message": {"role": "assistant", "content": None}}],
    [{"finish_reason": "tool_calls", "message": {"content": None, "tool_calls": [{"id": "1"}]}}],
    [{"finish_reason": "stop", "message": {"content": ""}},
     {"finish_reason": "stop", "message": {"content": "4 stars"}}],
])
async def test_refusals_tool_calls_and_one_answer_of_n_are_answers(
        server: ThreadedServer, session: aiohttp.ClientSession,
        choices: list[dict[str, object]]) -> None:
    body = orjson.dumps({"choices": choices})
    server.state.script.raw = [(200, {"Content-Type": "application/json"}, body)]
    assert (await _post(server, session))["choices"] == choices


@pytest.mark.parametrize("status", [400, 401, 403, 404, 500])
async def test_a_server_that_echoes_the_key_is_scrubbed(server: ThreadedServer,
                                                        session: aiohttp.ClientSession,
                                                        status: int) -> None:
    key = "gw-0123456789abcdef"  # not shaped like any known key: only the header gives it away
    echoed = f"bad request: Authorization: Bearer {key} (key {key}) x-api-key={key}"
    server.state.script.raw = [(status, {}, _error_body(echoed))]
    with pytest.raises(APIError) as info:
        await _post(server, session, api_key=key)
    error = info.value
    for text in (str(error), error.reason, error.detail):
        assert key not in text and "0123456789" not in text, text
    assert "[redacted]" in error.detail


def test_scrub_removes_registered_and_given_secrets_of_six_characters_or_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors, "_SECRETS", set())  # this test's registry, not the process's
    planted = "zq7Yx!p9"  # matches no key shape: only registering it removes it
    for value in (planted, "abc123", "five5", "", None):
        errors.register_secret(value)
    assert scrub(f"echo {planted}, {planted} and abc123.") == \
        "echo [redacted], [redacted] and [redacted]."
    assert scrub("five5 stays: under six characters would blank ordinary words") == \
        "five5 stays: under six characters would blank ordinary words"
    assert scrub("given g1v3n! and shrt", ("g1v3n!", "shrt", "")) == "given [redacted] and shrt"


@pytest.mark.parametrize(("text", "scrubbed"), [
    ("Authorization: Bearer abc.DEF-123", "Authorization: Bearer [redacted]"),
    ("bearer of news", "bearer of news"),
    ("sk-proj-abcdefgh12 and rk-12345678", "[redacted] and [redacted]"),
    ("sk-1234567 is too short", "sk-1234567 is too short"),
    ("AIzaSyA0123456789abcdefghij", "[redacted]"),
    ("GET /v1?key=0123456789abcdef&x=1", "GET /v1?key=***&x=1"),  # a URL's token
    ('{"api_key": "0123456789abcdef"}', '{"api_key": "[redacted]"}'),
    ("access-token: 0123456789ab", "access-token: [redacted]"),
    ("token=short", "token=short"),
    ("the key point: 4 of 5", "the key point: 4 of 5"),
])
def test_scrub_removes_what_is_shaped_like_a_key(text: str, scrubbed: str) -> None:
    assert scrub(text) == scrubbed


async def test_authorization_only_with_a_key(server: ThreadedServer,
                                             session: aiohttp.ClientSession) -> None:
    await _post(server, session, api_key="sk-test-123")
    await _post(server, session, api_key=None)
    await _post(server, session, api_key="")
    assert server.state.auth == ["Bearer sk-test-123", None, None]
