"""The faults users meet before any kill -9, each through the real `judge` CLI in a subprocess:
endpoints that are not there, wrong model names, answers that are empty, servers that echo the
key. Each ends with one `Error:` line and the right exit code, or with failed tasks that a rerun
asks again; none with a traceback, a paid call lost, or a key written anywhere."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from tests.fakeserver import ThreadedServer
from tests.test_cli import (
    JOB,
    clean_env,
    closed_port,
    error_line,
    judgments,
    run_judge,
    write_job,
)

TASKS = 12


def _run(job: Path, tmp_path: Path, data_dir: Path, *args: object,
         **env: str) -> tuple[float, object]:
    started = time.monotonic()
    result = run_judge("run", job, "--limit", TASKS, "--cache-dir", tmp_path / "cache",
                       "--out", tmp_path / "out", *args, env=clean_env(data_dir, **env),
                       cwd=tmp_path)
    return time.monotonic() - started, result


def _answer(content: object, finish: str = "stop") -> tuple[int, dict[str, str], bytes]:
    body = {"choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": content}}]}
    return 200, {"Content-Type": "application/json"}, orjson.dumps(body)


# ------------------------------------------------------------ endpoints that are not there

def test_a_server_that_is_not_running_stops_the_run_at_once(tmp_path: Path,
                                                            data_dir: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    job = write_job(tmp_path / "jobs", JOB.replace("max_retries = 3", "max_retries = 8"))

    took, result = _run(job, tmp_path, data_dir, "--base-url", url, "--concurrency", 1)

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    *_, counts, line = result.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert counts.startswith(f"{TASKS} tasks: 0 cached, 0 called, 2 retries, 0 failed, "
                             f"{TASKS} not run"), counts
    assert line == f"Error: cannot connect to {url} (connection refused): is the server " \
                   "running? (model fake; check --base-url / base_url); run stopped, nothing " \
                   "lost: rerun to resume"
    assert took < 20  # three attempts with backoff, not 12 tasks x 9 attempts
    assert not (tmp_path / "out").exists()


def test_a_fleet_with_every_replica_down_stops_the_same_way(tmp_path: Path,
                                                            data_dir: Path) -> None:
    urls = [f"http://127.0.0.1:{closed_port()}/v1" for _ in range(2)]
    fleet = JOB.replace('spec = "fake"', 'spec = "fake"\nendpoints = [' + ", ".join(
        f'{{ base_url = "{u}", api_key_env = "K{i}" }}' for i, u in enumerate(urls)) + "]")
    job = write_job(tmp_path / "jobs", fleet)

    took, result = _run(job, tmp_path, data_dir, K0="a", K1="b")

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    last = result.stderr.strip().splitlines()[-1]  # type: ignore[attr-defined]
    assert last.startswith("Error: cannot connect to any endpoint of model fake ("), last
    assert all(f"{u}: connection refused" in last for u in urls), last
    assert took < 30


def test_a_fleet_with_one_replica_down_works_on_the_other(server: ThreadedServer,
                                                          tmp_path: Path, data_dir: Path) -> None:
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    fleet = JOB.replace('spec = "fake"', 'spec = "fake"\nendpoints = [' +
                        f'{{ base_url = "{dead}", api_key_env = "K0" }}, '
                        f'{{ base_url = "{server.url}", api_key_env = "K1" }}]')
    job = write_job(tmp_path / "jobs", fleet)

    _, result = _run(job, tmp_path, data_dir, K0="a", K1="b")

    assert result.returncode == 0, result.stderr  # type: ignore[attr-defined]
    assert server.state.answered == TASKS


@pytest.mark.parametrize("message", ["The model `gpt-5x` does not exist.",
                                     "404 page not found"])
def test_a_wrong_model_name_stops_after_a_few_identical_404s(
        server: ThreadedServer, tmp_path: Path, data_dir: Path, message: str) -> None:
    body = orjson.dumps({"error": {"message": message, "code": "model_not_found"}})
    server.state.script.raw = [(404, {}, body)] * 50
    job = write_job(tmp_path / "jobs", JOB.replace('spec = "fake"', 'spec = "gpt-5x"'))

    _, result = _run(job, tmp_path, data_dir, "--base-url", server.url, "--concurrency", 1)

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    last = result.stderr.strip().splitlines()[-1]  # type: ignore[attr-defined]
    assert last == f"Error: the server at {server.url} has no model 'gpt-5x' (HTTP 404: " \
                   f"{message}); check --model / base_url (an OpenAI-compatible base URL ends " \
                   "in /v1); run stopped, nothing lost: rerun to resume"
    assert server.state.requests == 3  # not all twelve
    assert not (tmp_path / "out").exists()


def test_a_refused_key_names_the_variable_that_holds_it(server: ThreadedServer,
                                                        tmp_path: Path, data_dir: Path) -> None:
    server.state.script.queue = ["401"] * 4
    job = write_job(tmp_path / "jobs", JOB.replace('spec = "fake"',
                                                   'spec = "fake"\napi_key_env = "MY_GATEWAY_KEY"'))

    _, result = _run(job, tmp_path, data_dir, "--base-url", server.url, MY_GATEWAY_KEY="abc-1")

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    last = result.stderr.strip().splitlines()[-1]  # type: ignore[attr-defined]
    assert last.startswith(f"Error: the server at {server.url} refused the credentials in "
                           "MY_GATEWAY_KEY (HTTP 401: fake 401): check the key"), last


@pytest.mark.parametrize("url", ["htp://127.0.0.1:8000/v1", "http//127.0.0.1:8000/v1",
                                 "http:///v1", "127.0.0.1:8000/v1"])
def test_a_malformed_base_url_is_refused_before_any_call(tmp_path: Path, data_dir: Path,
                                                         url: str) -> None:
    job = write_job(tmp_path / "jobs")

    _, result = _run(job, tmp_path, data_dir, "--base-url", url)

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    line = error_line(result.stderr)  # type: ignore[attr-defined]
    assert line.startswith(f"Error: --base-url {url!r} is not an http(s) URL"), line
    assert not (tmp_path / "cache").exists()


def test_a_malformed_base_url_in_the_job_names_the_field(tmp_path: Path,
                                                         data_dir: Path) -> None:
    job = write_job(tmp_path / "jobs", JOB.replace(
        'spec = "fake"', 'spec = "fake"\nbase_url = "htp://localhost:8000/v1"'))

    _, result = _run(job, tmp_path, data_dir)

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    line = error_line(result.stderr)  # type: ignore[attr-defined]
    assert line.startswith(f"Error: {job}: models.fake.base_url 'htp://localhost:8000/v1' is "
                           "not an http(s) URL"), line


# ------------------------------------------------------------ answers that are not answers

@pytest.mark.parametrize("content", [None, ""])
def test_a_200_without_an_answer_is_retried_then_failed_never_cached(
        server: ThreadedServer, tmp_path: Path, data_dir: Path, content: object) -> None:
    server.state.script.raw = [_answer(content)] * 4  # one task's four attempts (max_retries 3)
    job = write_job(tmp_path / "jobs")

    _, result = _run(job, tmp_path, data_dir, "--base-url", server.url, "--concurrency", 1)

    assert result.returncode == 1, result.stderr  # type: ignore[attr-defined]
    failed = [j for j in judgments(tmp_path / "out") if j["error"] is not None]
    assert [j["error"] for j in failed] == [{"type": "api", "message": "empty: the server "
                                             "answered 200 with no content (finish_reason stop)"}]
    assert server.state.requests == TASKS + 3

    _, rerun = _run(job, tmp_path, data_dir, "--base-url", server.url)

    assert rerun.returncode == 0, rerun.stderr  # type: ignore[attr-defined]
    assert server.state.requests == TASKS + 4  # the empty one was asked again, and only it


def test_a_content_filter_refusal_stays_an_answer(server: ThreadedServer, tmp_path: Path,
                                                  data_dir: Path) -> None:
    server.state.script.raw = [_answer(None, "content_filter")]
    job = write_job(tmp_path / "jobs")

    _, result = _run(job, tmp_path, data_dir, "--base-url", server.url, "--concurrency", 1)

    assert server.state.requests == TASKS, result.stderr  # type: ignore[attr-defined]
    errors = [j["error"]["type"] for j in judgments(tmp_path / "out") if j["error"]]
    assert errors == ["refusal"]


# ------------------------------------------------------------ secrets

SECRET = "gw-live-0123456789abcdef"


@pytest.mark.parametrize("status", [400, 401, 403])
def test_a_server_that_echoes_the_key_leaks_it_nowhere(server: ThreadedServer, tmp_path: Path,
                                                       data_dir: Path, status: int) -> None:
    echo = f"invalid request; headers were Authorization: Bearer {SECRET}; key={SECRET}"
    server.state.script.raw = [(status, {}, orjson.dumps({"error": {"message": echo}}))] * 2
    job = write_job(tmp_path / "jobs")

    _, result = _run(job, tmp_path, data_dir, "--base-url", server.url, "--concurrency", 1,
                     OPENAI_API_KEY=SECRET)

    assert result.returncode in (1, 2), result.stderr  # type: ignore[attr-defined]
    assert "[redacted]" in result.stderr  # type: ignore[attr-defined]
    texts = [result.stdout, result.stderr]  # type: ignore[attr-defined]
    texts += [p.read_bytes().decode("utf-8", "replace") for p in tmp_path.rglob("*")
              if p.is_file()]
    assert not [t for t in texts if "0123456789abcdef" in t]
