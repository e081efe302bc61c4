"""Tests for the provider kinds (runner.execute.providers, runner.job.models' prefixes): the exact
URL, headers, query and body each kind sends, Anthropic's answers normalised for the parsers,
its errors and rate-limit headers mapped by the client, and keys that carry the endpoint kind.

Runs go through the real pool and a real cache against tests/fakeproviders.py on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from runner.errors import ConfigError
from runner.execute import pool as pool_module
from runner.execute.client import retry_after
from runner.execute.pool import Endpoint, RunStats, execute
from runner.execute.providers import advertised, anthropic_body
from runner.execute.store.cache import Cache
from runner.job.load import load_job
from runner.job.models import parse_model_spec
from runner.job.spec import Job, Limits
from runner.prepare import prepare
from runner.reduce.judgments import choices
from tests.conftest import ROOT, JobWriter
from tests.fakeproviders import Fake, ProviderServer
from tests.test_cli import clean_env, run_judge

KEY = "sk-ant-test-9Zq1secretSECRET"
RUN_TIMEOUT_S = 20.0

JOB = """
[[datasets]]
name = "mine"
path = "data.jsonl"
fields = {{ id = "id", text = {{ output = "output" }} }}

[[prompts]]
name = "stars"
template = "prompt.txt"
system = "You are a strict judge."
parser = "stars"
aspects = ["overall"]
params = {{ temperature = 0 {params} }}

[models.judge]
spec = "{spec}"
base_url = "{url}"
{extra}
"""


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_module, "BACKOFF_BASE_S", 0.001)
    monkeypatch.setattr(pool_module, "BACKOFF_CAP_S", 0.01)


@pytest.fixture
def provider_server() -> Iterator[ProviderServer]:
    with ProviderServer(Fake()) as s:
        yield s


def make_job(write_job: JobWriter, spec: str, url: str, *, n: int = 3, params: str = "",
             extra: str = "") -> Job:
    rows = [{"id": f"item{i}", "output": f"Story {i}"} for i in range(n)]
    path = write_job(JOB.format(spec=spec, url=url, params=params, extra=extra), rows=rows,
                     files={"prompt.txt": "Rate {{aspect}} in stars: {{output}}"})
    return load_job(path)


async def run(job: Job, cache: Cache, **limits: Any) -> RunStats:
    expansion = prepare(job, ROOT)
    endpoints = {m.name: Endpoint(model=m, base_url=m.base_url or "", api_key=lambda: KEY)
                 for m in job.models}
    async with aiohttp.ClientSession() as session, asyncio.timeout(RUN_TIMEOUT_S):
        return await execute(expansion.tasks(), cache=cache, session=session,
                             endpoints=endpoints,
                             limits=Limits(**{"concurrency": 2, "max_retries": 2, **limits}),
                             total=expansion.count())


def records(job: Job, cache: Cache) -> list[dict[str, Any]]:
    out = []
    for task in prepare(job, ROOT).tasks():
        record = cache.get(task.key)
        assert record is not None, task.key
        out.append(record)
    return out


# ------------------------------------------------------------------------ model specs

def test_provider_prefixes_preset_url_key_and_kind() -> None:
    claude = parse_model_spec("anthropic:claude-3-5-haiku-latest")
    assert (claude.kind, claude.model, claude.base_url, claude.api_key_env, claude.key_required) \
        == ("anthropic", "claude-3-5-haiku-latest", "https://api.anthropic.com/v1",
            "ANTHROPIC_API_KEY", True)
    gemini = parse_model_spec("gemini:gemini-2.0-flash")
    assert (gemini.base_url, gemini.api_key_env) == (
        "https://generativelanguage.googleapis.com/v1beta/openai", "GEMINI_API_KEY")
    azure = parse_model_spec("azure:my-gpt4o", base_url="https://res.openai.azure.com")
    assert (azure.kind, azure.model, azure.api_version, azure.api_key_env) == (
        "azure", "my-gpt4o", "2024-10-21", "AZURE_OPENAI_API_KEY")
    assert parse_model_spec("anthropic:x", api_key_env="MY_KEY").api_key_env == "MY_KEY"
    with pytest.raises(ConfigError, match=r"needs base_url = your resource URL"):
        parse_model_spec("azure:my-gpt4o")
    with pytest.raises(ConfigError, match=r"names no model: use anthropic:NAME"):
        parse_model_spec("anthropic:")


def test_cache_key_carries_the_kind_but_not_the_key(write_job: JobWriter, tmp_path: Path
                                                   ) -> None:
    url = "http://127.0.0.1:9/v1"
    keys = {}
    for spec in ("claude-x", "anthropic:claude-x"):
        job = make_job(write_job, spec, url)
        keys[spec] = [t.key for t in prepare(job, ROOT).tasks()]
    assert keys["claude-x"] != keys["anthropic:claude-x"]  # same body and URL, another dialect
    assert parse_model_spec("anthropic:c", base_url=url).endpoint == f"anthropic:{url}"
    assert parse_model_spec("c", base_url=url).endpoint == url  # unchanged: old caches stay


# ------------------------------------------------------------------------ anthropic

async def test_anthropic_messages_url_headers_body_and_normalised_answer(
        write_job: JobWriter, provider_server: ProviderServer, cache_dir: Path) -> None:
    job = make_job(write_job, "anthropic:claude-3-5-haiku-latest",
                   provider_server.root + "/v1", params=", stop = \"END\"")
    with Cache(cache_dir) as cache:
        stats = await run(job, cache)
        assert (stats.api_calls, stats.failures) == (3, {})
        got = records(job, cache)
    seen = provider_server.fake.seen
    assert {s.path for s in seen} == {"/v1/messages"}
    for s in seen:
        assert s.headers["x-api-key"] == KEY and "Authorization" not in s.headers
        assert s.headers["anthropic-version"] == "2023-06-01"
        assert s.body["system"] == "You are a strict judge."
        assert [m["role"] for m in s.body["messages"]] == ["user"]
        assert s.body["max_tokens"] == 256 and s.body["stop_sequences"] == ["END"]
        assert "stop" not in s.body and s.body["temperature"] == 0
    for record in got:
        assert record["endpoint"] == f"anthropic:{provider_server.root}/v1"
        assert record["replica"] == f"{provider_server.root}/v1"
        text = choices(record["response"])[0].text
        assert text.endswith(" stars")  # two content blocks joined into one choice
        assert record["response"]["choices"][0]["finish_reason"] == "stop"
        assert record["usage"]["completion_tokens"] == 7
        assert KEY not in orjson.dumps(record).decode()
    assert stats.completion_tokens == 21 and stats.prompt_tokens > 0


async def test_anthropic_errors_and_rate_limit_headers_are_mapped(
        write_job: JobWriter, provider_server: ProviderServer, cache_dir: Path) -> None:
    error = orjson.dumps({"type": "error", "error": {"type": "rate_limit_error",
                                                     "message": "slow down"}})
    overloaded = orjson.dumps({"type": "error", "error": {"type": "overloaded_error",
                                                          "message": "Overloaded"}})
    provider_server.fake.raw = [(429, {"retry-after": "0.2"}, error), (529, {}, overloaded)]
    job = make_job(write_job, "anthropic:claude-x", provider_server.root + "/v1", n=1)
    started = asyncio.get_running_loop().time()
    with Cache(cache_dir) as cache:
        stats = await run(job, cache, concurrency=1, max_retries=3)
    assert (stats.api_calls, stats.retries, stats.failures) == (1, 2, {})
    assert asyncio.get_running_loop().time() - started >= 0.2  # retry-after honoured
    # Learned from anthropic-ratelimit-* on the first answer: shown as the effective limits.
    replica = stats.endpoints["judge"][provider_server.root + "/v1"]
    assert (replica["rpm"], replica["tpm"]) == ("50 (learned)", "40000 (learned)")


async def test_anthropic_bad_request_fails_the_task_with_the_servers_message(
        write_job: JobWriter, provider_server: ProviderServer, cache_dir: Path) -> None:
    bad = orjson.dumps({"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": "max_tokens: too large"}})
    provider_server.fake.raw = [(400, {}, bad)]
    job = make_job(write_job, "anthropic:claude-x", provider_server.root + "/v1", n=1)
    with Cache(cache_dir) as cache:
        stats = await run(job, cache, concurrency=1)
    assert list(stats.failures.values()) == ["400: max_tokens: too large"]


def test_anthropic_reset_times_and_limits_are_read() -> None:
    reset = {"anthropic-ratelimit-requests-reset": "2999-01-01T00:00:00Z"}
    assert retry_after(reset) == 600.0  # capped
    assert retry_after(reset, rate_limited=False) is None
    limits = advertised({"anthropic-ratelimit-requests-limit": "4000",
                         "anthropic-ratelimit-input-tokens-limit": "400000"})
    assert limits is not None and (limits.rpm, limits.tpm) == (4000, 400000)
    assert advertised({"x-ratelimit-limit-requests": "0"}) is None
    with pytest.raises(Exception, match="no n > 1"):
        anthropic_body(orjson.dumps({"model": "c", "messages": [], "n": 2}))


# ------------------------------------------------------------------------ gemini, azure

async def test_gemini_uses_the_openai_compatible_route_with_a_bearer_key(
        write_job: JobWriter, provider_server: ProviderServer, cache_dir: Path) -> None:
    job = make_job(write_job, "gemini:gemini-2.0-flash",
                   provider_server.root + "/v1beta/openai")
    with Cache(cache_dir) as cache:
        stats = await run(job, cache)
    assert (stats.api_calls, stats.failures) == (3, {})
    for s in provider_server.fake.seen:
        assert s.path == "/v1beta/openai/chat/completions" and s.query == {}
        assert s.headers["Authorization"] == f"Bearer {KEY}"
        assert s.body["model"] == "gemini-2.0-flash"
        assert s.body["messages"][0] == {"role": "system", "content": "You are a strict judge."}


async def test_azure_deployment_route_api_version_and_api_key_header(
        write_job: JobWriter, provider_server: ProviderServer, cache_dir: Path) -> None:
    job = make_job(write_job, "azure:judge-4o", provider_server.root,
                   extra='api_version = "2025-01-01-preview"')
    with Cache(cache_dir) as cache:
        stats = await run(job, cache)
        got = records(job, cache)
    assert (stats.api_calls, stats.failures) == (3, {})
    for s in provider_server.fake.seen:
        assert s.path == "/openai/deployments/judge-4o/chat/completions"
        assert s.query == {"api-version": "2025-01-01-preview"}
        assert s.headers["api-key"] == KEY and "Authorization" not in s.headers
    assert {r["endpoint"] for r in got} == {f"azure:{provider_server.root}"}


# ------------------------------------------------------------------------ job-file errors

@pytest.mark.parametrize(("extra", "message"), [
    ('endpoints = []', r"models\.judge\.endpoints is empty"),
    ('endpoints = [{base_url = "10.0.0.1:8000"}]',
     r"models\.judge\.endpoints\[0\]\.base_url .10\.0\.0\.1:8000. is not an http\(s\) URL"),
    ('endpoints = [{base_url = "http://a/v1", rpm = 0}]',
     r"models\.judge\.endpoints\[0\]\.rpm must be a positive number"),
    ('endpoints = [{base_url = "http://a/v1", region = "eu"}]',
     r"models\.judge\.endpoints\[0\]\.region"),
    ('endpoints = [{base_url = "http://a/v1"}, {base_url = "http://a/v1"}]',
     r"lists the same base_url and api_key_env twice"),
])
def test_bad_endpoints_name_the_field(write_job: JobWriter, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        make_job(write_job, "judge-model", "http://127.0.0.1:9/v1", extra=extra)
    assert str(caught.value).split(": ")[0].endswith("job.toml")  # names the file first


def test_endpoints_default_to_the_models_key_variable(write_job: JobWriter) -> None:
    job = make_job(write_job, "anthropic:claude-x", "http://127.0.0.1:9/v1",
                   extra='endpoints = [{base_url = "http://a/v1"}, '
                         '{base_url = "http://b/v1", api_key_env = "KEY_B", rpm = 60}]')
    fleet = job.models[0].endpoints
    assert [(e.base_url, e.api_key_env, e.rpm) for e in fleet] == [
        ("http://a/v1", "ANTHROPIC_API_KEY", None), ("http://b/v1", "KEY_B", 60)]
    assert job.models[0].endpoint == "fleet:anthropic"


async def test_two_keys_for_one_url_are_two_replicas(
        write_job: JobWriter, provider_server: ProviderServer, cache_dir: Path) -> None:
    url = provider_server.root + "/v1"
    job = make_job(write_job, "anthropic:claude-x", url, n=8,
                   extra=f'endpoints = [{{base_url = "{url}", api_key_env = "KEY_A"}}, '
                         f'{{base_url = "{url}", api_key_env = "KEY_B"}}]')
    expansion = prepare(job, ROOT)
    keys = {"KEY_A": "sk-a-SECRET", "KEY_B": "sk-b-SECRET"}
    endpoints = {m.name: Endpoint(model=m, base_url=m.base_url or "",
                                  key_reader=lambda name: lambda: keys[name])
                 for m in job.models}
    with Cache(cache_dir) as cache:
        async with aiohttp.ClientSession() as session, asyncio.timeout(RUN_TIMEOUT_S):
            stats = await execute(expansion.tasks(), cache=cache, session=session,
                                  endpoints=endpoints, limits=Limits(concurrency=4),
                                  total=expansion.count())
        got = records(job, cache)
    sent = [s.headers["x-api-key"] for s in provider_server.fake.seen]
    assert stats.api_calls == 8 and set(sent) == set(keys.values())
    labels = {f"{url} [KEY_A]", f"{url} [KEY_B]"}
    assert set(stats.endpoints["judge"]) == labels
    assert {r["replica"] for r in got} <= labels
    assert all("SECRET" not in orjson.dumps(r).decode() for r in got)


# ------------------------------------------------------------------------ through the CLI

@pytest.mark.slow
def test_cli_runs_an_anthropic_judge_and_never_writes_its_key(
        write_job: JobWriter, provider_server: ProviderServer, tmp_path: Path,
        data_dir: Path) -> None:
    job = make_job(write_job, "anthropic:claude-3-5-haiku-latest", provider_server.root + "/v1",
                   n=4)
    out, cache = tmp_path / "out", tmp_path / "cache"
    env = {k: v for k, v in clean_env(data_dir).items() if k != "ANTHROPIC_API_KEY"}
    missing = run_judge("run", job.path, "--cache-dir", cache, "--out", out, env=env,
                        cwd=tmp_path)
    assert missing.returncode == 2 and provider_server.fake.seen == []
    assert missing.stderr.strip() == (
        f"Error: {job.path}: model 'judge' (anthropic:claude-3-5-haiku-latest) needs an API "
        "key: set ANTHROPIC_API_KEY (no call was made)")
    result = run_judge("run", job.path, "--cache-dir", cache, "--out", out,
                       env={**env, "ANTHROPIC_API_KEY": KEY}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(provider_server.fake.seen) == 4
    assert {s.headers["x-api-key"] for s in provider_server.fake.seen} == {KEY}
    lines = [orjson.loads(line) for line in (out / "judgments.jsonl").read_bytes().splitlines()]
    assert len(lines) == 4 and all(1 <= line["score"] <= 5 for line in lines)
    assert sum(line["usage"]["completion_tokens"] for line in lines) == 28
    written = b"".join(p.read_bytes() for folder in (out, cache) for p in folder.rglob("*")
                       if p.is_file())
    assert KEY.encode() not in written and KEY not in result.stderr + result.stdout
