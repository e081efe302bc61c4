"""A server that stops being useful stops the run, through the real `judge` CLI in a subprocess:
an endpoint that dies mid-run, a web page where the API should be, a server asking for a day's
wait, a wrong model name at high concurrency. Each ends with one `Error:` line and exit 2, and
the rerun buys only what is missing; failures that are the request's own (400s) never stop it.
The breaker's timing rules (a fleet's live replica, a restart within the window) are tested on
the Breaker itself, with the clock as an argument.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from runner.errors import AuthError, ConnectError, RequestError, RetryableError
from runner.execute.breaker import CONNECT_FAILURES, SAME_FAILURES, Breaker, refused, too_long
from tests.fakeserver import ThreadedServer
from tests.test_cli import JOB, clean_env, judge_cmd, run_judge, write_job

TASKS = 12


def _resume(args: list[str]) -> str:
    """The end of the `Error:` line of a run that stopped: the command that resumes it."""
    return "; run stopped, nothing lost: rerun to resume: " + " ".join(["judge", *args[1:]])


def _job(tmp_path: Path, limits: str = "", model: str = "fake") -> Path:
    text = JOB.replace("timeout_s = 10", "timeout_s = 10\n" + limits)
    return write_job(tmp_path / "jobs", text.replace('spec = "fake"', f'spec = "{model}"'))


def _run(job: Path, tmp_path: Path, data_dir: Path, url: str, *args: object,
         tasks: int = TASKS) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    result = run_judge("run", job, "--limit", tasks, "--cache-dir", tmp_path / "cache",
                       "--out", tmp_path / "out", "--base-url", url, *args,
                       env=clean_env(data_dir), cwd=tmp_path)
    return time.monotonic() - started, result


def _last(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip().splitlines()[-1]


def _wait_for(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ------------------------------------------------------------ an endpoint that dies mid-run

@pytest.mark.slow
def test_an_endpoint_that_dies_mid_run_stops_and_the_rerun_buys_only_the_rest(
        tmp_path: Path, data_dir: Path) -> None:
    tasks = 40
    job = _job(tmp_path, "down_after_s = 2")
    first = ThreadedServer()
    first.state.script.latency_s = 0.05  # the run is still going when the server goes
    with first:
        url, port = first.url, first.port
        args = ("run", job, "--limit", tasks, "--cache-dir", tmp_path / "cache", "--out",
                tmp_path / "out", "--base-url", url, "--concurrency", 2)
        run = subprocess.Popen(judge_cmd(*args), env=clean_env(data_dir), cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait_for(lambda: first.state.answered >= 5 or run.poll() is not None, 30)
        except BaseException:
            run.kill()
            run.communicate()
            raise
    gone = time.monotonic()  # the port is closed: connection refused from now on
    try:
        _, stderr = run.communicate(timeout=40)  # before: retried task by task for hours
    finally:
        run.kill()
        run.communicate()
    took = time.monotonic() - gone

    assert run.returncode == 2, stderr
    assert stderr.strip().splitlines()[-1] == \
        f"Error: {url} stopped answering: no connection for 2 s (connection refused): is the " \
        "server still running? (model fake) (limits.down_after_s sets how long the run " \
        "waits)" + _resume(run.args)
    assert took < 20
    answered = len(first.state.answers)
    assert 5 <= answered < tasks
    with ThreadedServer(port=port) as back:  # the same URL: the same cache keys
        _, rerun = _run(job, tmp_path, data_dir, url, tasks=tasks)
        assert rerun.returncode == 0, rerun.stderr
        assert back.state.requests == tasks - answered  # nothing bought twice
        assert not set(back.state.bodies) & set(first.state.answers)


# ------------------------------------------------------------ a web page where the API is

@pytest.mark.slow
def test_an_html_page_for_an_answer_stops_after_three(server: ThreadedServer, tmp_path: Path,
                                                      data_dir: Path) -> None:
    page = b"<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body></body></html>"
    server.state.script.raw = [(200, {"Content-Type": "text/html"}, page)] * 60

    took, result = _run(_job(tmp_path), tmp_path, data_dir, server.url)

    assert result.returncode == 2, result.stderr
    assert _last(result) == \
        f"Error: {server.url} answers HTML, not the API: check base_url (model fake; an " \
        "OpenAI-compatible base URL ends in /v1; got an HTML page: b'<!DOCTYPE html>\\n" \
        "<html><head><title>Sign in</title></head><body></body></html>')" + \
        _resume(result.args)
    assert server.state.requests == 3  # before: 12 tasks x 4 attempts
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------ Retry-After

@pytest.mark.slow
def test_a_retry_after_over_max_wait_stops_the_run_and_the_rerun_buys_the_rest(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    server.state.script.queue = ["ok"] * 5 + ["429"]
    server.state.script.retry_after = 86400
    job = _job(tmp_path)

    took, result = _run(job, tmp_path, data_dir, server.url, "--concurrency", 1)

    assert result.returncode == 2, result.stderr
    assert _last(result) == \
        f"Error: the server at {server.url} asks to wait 86400 s before the next request " \
        "(429: Rate limit reached), over limits.max_wait_s = 600 s: rerun later, or raise " \
        "limits.max_wait_s" + _resume(result.args)
    assert took < 20  # before: a silent wait of 10 minutes
    assert server.state.answered == 5
    _, rerun = _run(job, tmp_path, data_dir, server.url)
    assert rerun.returncode == 0, rerun.stderr
    assert server.state.requests == 6 + TASKS - 5  # the 5 answers are not bought twice


@pytest.mark.slow
def test_a_long_retry_after_is_told_then_waited(server: ThreadedServer, tmp_path: Path,
                                                data_dir: Path) -> None:
    server.state.script.queue = ["429"]
    server.state.script.retry_after = 6

    took, result = _run(_job(tmp_path), tmp_path, data_dir, server.url, "--concurrency", 1)

    assert result.returncode == 0, result.stderr
    told = [line for line in result.stderr.splitlines() if "asks to wait" in line]
    assert told == [f"the server at {server.url} asks to wait 6 s (429: Rate limit reached): "
                    "waiting"], result.stderr
    assert took >= 6


# ------------------------------------------------------------ 404 and 400

@pytest.mark.slow
@pytest.mark.parametrize("concurrency", [8, 64])
def test_a_wrong_model_name_costs_three_requests_at_any_concurrency(
        server: ThreadedServer, tmp_path: Path, data_dir: Path, concurrency: int) -> None:
    body = orjson.dumps({"error": {"message": "The model `gpt-5x` does not exist."}})
    server.state.script.raw = [(404, {}, body)] * 200
    job = _job(tmp_path, model="gpt-5x")

    _, result = _run(job, tmp_path, data_dir, server.url, "--concurrency", concurrency,
                     tasks=100)

    assert result.returncode == 2, result.stderr
    assert _last(result).startswith(f"Error: the server at {server.url} has no model 'gpt-5x'")
    assert server.state.requests == 3  # before: 10 at 8, 46-52 at 64


@pytest.mark.slow
def test_three_identical_400s_fail_their_tasks_and_the_run_goes_on(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    body = orjson.dumps({"error": {"message": "context length exceeded"}})
    server.state.script.raw = [(400, {}, body)] * 3

    _, result = _run(_job(tmp_path), tmp_path, data_dir, server.url, "--concurrency", 1)

    assert result.returncode == 1, result.stderr
    failed = [line for line in result.stderr.splitlines() if line.startswith("failed ")]
    assert len(failed) == 3, result.stderr
    assert all(line.endswith(": 400: context length exceeded") for line in failed), failed
    assert "no model" not in result.stderr
    assert server.state.answered == TASKS - 3


@pytest.mark.slow
def test_a_404_that_names_no_model_blames_the_path(server: ThreadedServer, tmp_path: Path,
                                                   data_dir: Path) -> None:
    url = server.url.replace("/v1", "/v2")  # the fake server serves /v1 only

    _, result = _run(_job(tmp_path), tmp_path, data_dir, url)

    assert result.returncode == 2, result.stderr
    assert _last(result) == \
        f"Error: the server at {url} answered HTTP 404 at its chat-completions path (404: " \
        "Not Found): check --base-url / base_url (an OpenAI-compatible base URL ends in " \
        "/v1)" + _resume(result.args)
    assert server.state.requests == 0  # the route does not exist: nothing reached it


# ------------------------------------------------------------ 401

@pytest.mark.slow
def test_a_401_without_a_key_says_none_was_sent(server: ThreadedServer, tmp_path: Path,
                                                data_dir: Path) -> None:
    server.state.script.queue = ["401"] * 4

    _, result = _run(_job(tmp_path), tmp_path, data_dir, server.url)

    assert result.returncode == 2, result.stderr
    assert _last(result).startswith(
        f"Error: the server at {server.url} refused the request without a key "
        "(OPENAI_API_KEY is not set) (HTTP 401: fake 401): check the key"), result.stderr
    assert server.state.auth[0] is None


# ------------------------------------------------------------ the breaker's rules, unit by unit

REFUSED = ConnectError("cannot connect to 127.0.0.1:1 (connection refused)", kind="connection")


def test_a_fleet_stops_only_when_every_replica_has_been_down_for_the_window() -> None:
    breaker = Breaker({"m": ["a", "b"]}, {"m": "model"}, down_after_s=10)
    breaker.succeeded("m", "a")
    assert [breaker.failed("m", "a", REFUSED, t) for t in (0, 5, 30)] == [None] * 3
    assert breaker.failed("m", "b", REFUSED, 31) is None  # b is down since 31 only
    breaker.succeeded("m", "b")  # b answers: the live replica keeps the run going
    assert breaker.failed("m", "b", REFUSED, 45) is None
    message = breaker.failed("m", "a", REFUSED, 55)
    assert message is not None and message.startswith("every endpoint of model m stopped "
                                                      "answering: no connection for 10 s")


def test_an_answer_or_any_response_restarts_the_window() -> None:
    breaker = Breaker({"m": ["a"]}, {"m": "model"}, down_after_s=10)
    breaker.succeeded("m", "a")
    assert breaker.failed("m", "a", REFUSED, 0) is None
    breaker.succeeded("m", "a")  # a restart quicker than the window
    assert breaker.failed("m", "a", REFUSED, 11) is None
    assert breaker.failed("m", "a", RetryableError("HTTP 503: busy", status=503), 15) is None
    assert breaker.failed("m", "a", REFUSED, 24) is None  # down since 24, not 11
    assert breaker.failed("m", "a", REFUSED, 34) is not None


def test_only_404s_html_and_refused_connections_keep_a_model_unproven() -> None:
    breaker = Breaker({"m": ["a"]}, {"m": "model"}, down_after_s=10)
    for error in (REFUSED, RequestError("HTTP 404: no", status=404, detail="no"),
                  RetryableError("html", kind="html", detail="an HTML page: b'<html>'")):
        assert breaker.failed("m", "a", error, 0) is None
        assert breaker.unproven == {"m"}
    assert breaker.failed("m", "a", RequestError("HTTP 400: x", status=400, detail="x"), 0) \
        is None
    assert breaker.unproven == set()


UNKNOWN = ConnectError("cannot connect to nowhere:80 (unknown host)", kind="connection")


def _404(detail: str = "model 'judge' not found") -> RequestError:
    return RequestError(f"HTTP 404: {detail}", status=404, detail=detail)


def test_a_model_never_reached_stops_once_every_replica_failed_three_times() -> None:
    """The counts and the messages, replica by replica (the CLI tests see only the line)."""
    one = Breaker({"m": ["a"]}, {"m": "judge"}, down_after_s=10)
    assert [one.failed("m", "a", REFUSED, 0) for _ in range(CONNECT_FAILURES - 1)] == \
        [None] * (CONNECT_FAILURES - 1)
    assert one.failed("m", "a", REFUSED, 0) == (
        "cannot connect to a (connection refused): is the server running? (model m; check "
        "--base-url / base_url)")
    fleet = Breaker({"m": ["a", "b"]}, {"m": "judge"}, down_after_s=10)
    for _ in range(CONNECT_FAILURES + 2):  # a down: b may still answer
        assert fleet.failed("m", "a", REFUSED, 0) is None
    for _ in range(CONNECT_FAILURES - 1):
        assert fleet.failed("m", "b", UNKNOWN, 0) is None
    assert fleet.failed("m", "b", UNKNOWN, 0) == (
        "cannot connect to any endpoint of model m (a: connection refused; b: unknown host): "
        "are the servers running?")


def test_a_connection_error_without_a_cause_in_brackets_is_named_whole() -> None:
    breaker = Breaker({"m": ["a"]}, {"m": "judge"}, down_after_s=10)
    odd = ConnectError("socket closed", kind="connection")
    messages = [breaker.failed("m", "a", odd, 0) for _ in range(CONNECT_FAILURES)]
    assert messages[-1] is not None and messages[-1].startswith("cannot connect to a (socket "
                                                                "closed): ")


def test_a_replica_gone_mid_run_is_named_with_its_cause_after_the_window() -> None:
    breaker = Breaker({"m": ["a"]}, {"m": "judge"}, down_after_s=10)
    breaker.succeeded("m", "a")
    assert breaker.failed("m", "a", REFUSED, 100) is None
    assert breaker.failed("m", "a", REFUSED, 109.9) is None
    assert breaker.failed("m", "a", REFUSED, 110) == (
        "a stopped answering: no connection for 10 s (connection refused): is the server "
        "still running? (model m) (limits.down_after_s sets how long the run waits)")


def test_three_identical_404s_or_pages_stop_a_model_that_never_answered() -> None:
    breaker = Breaker({"m": ["a"]}, {"m": "judge"}, down_after_s=10)
    for n in range(SAME_FAILURES - 1):  # 404s of other details are other faults
        assert breaker.failed("m", "a", _404(f"other {n}"), 0) is None
        assert breaker.failed("m", "a", _404(), 0) is None
    assert breaker.failed("m", "a", _404(), 0) == (
        "the server at a has no model 'judge' (HTTP 404: model 'judge' not found); check "
        "--model / base_url (an OpenAI-compatible base URL ends in /v1)")
    path = Breaker({"m": ["a"]}, {"m": "judge"}, down_after_s=10)
    messages = [path.failed("m", "a", _404("Not Found"), 0) for _ in range(SAME_FAILURES)]
    assert messages == [None] * (SAME_FAILURES - 1) + [
        "the server at a answered HTTP 404 at its chat-completions path (Not Found): check "
        "--base-url / base_url (an OpenAI-compatible base URL ends in /v1)"]
    page = RetryableError("html", kind="html", detail="an HTML page: b'<html>'")
    html = Breaker({"m": ["a"]}, {"m": "judge"}, down_after_s=10)
    messages = [html.failed("m", "a", page, 0) for _ in range(SAME_FAILURES)]
    assert messages[:-1] == [None] * (SAME_FAILURES - 1) and messages[-1] == (
        "a answers HTML, not the API: check base_url (model m; an OpenAI-compatible base URL "
        "ends in /v1; got an HTML page: b'<html>')")


def test_a_model_that_answered_is_never_stopped_by_404s_or_pages() -> None:
    breaker = Breaker({"m": ["a"], "n": ["a"]}, {"m": "judge", "n": "other"}, down_after_s=10)
    breaker.succeeded("m", "a")
    assert "m" not in breaker.unproven and "n" in breaker.unproven
    for _ in range(2 * SAME_FAILURES):
        assert breaker.failed("m", "a", _404(), 0) is None
    messages = [breaker.failed("n", "a", _404("no model"), 0) for _ in range(SAME_FAILURES)]
    assert messages[-1] is not None  # the other model of the same server, judged on its own


def test_a_404_naming_the_model_but_not_the_word_blames_the_model() -> None:
    breaker = Breaker({"m": ["a"]}, {"m": "gpt-5x"}, down_after_s=10)
    messages = [breaker.failed("m", "a", _404("'gpt-5x' does not exist"), 0)
                for _ in range(SAME_FAILURES)]
    assert messages[-1] is not None and messages[-1].startswith("the server at a has no model")


def test_the_counts_are_the_three_the_docs_and_messages_state() -> None:
    assert CONNECT_FAILURES == SAME_FAILURES == 3  # docs/explanation/crash-safety.md


def test_a_refusal_says_what_was_sent_and_a_long_wait_what_was_asked() -> None:
    error = AuthError("HTTP 401: bad key", status=401, detail="bad key")
    tail = "(HTTP 401: bad key): check the key and its permissions"
    assert refused("a", "", False, error) == f"the server at a refused the credentials {tail}"
    assert refused("a", "MY_KEY", True, error) == \
        f"the server at a refused the credentials in MY_KEY {tail}"
    assert refused("a", "MY_KEY", False, error) == \
        f"the server at a refused the request without a key (MY_KEY is not set) {tail}"
    ask = RetryableError("429: slow down", status=429, retry_after=86400.4, kind="429",
                         detail="slow down")
    assert too_long("a", ask, 600) == (
        f"the server at a asks to wait 86400 s before the next request ({ask.reason}), over "
        "limits.max_wait_s = 600 s: rerun later, or raise limits.max_wait_s")
