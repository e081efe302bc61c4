"""Tests for provider prompt caching (Task.prefix, runner.execute.providers.anthropic_body):
which part of a request is its shared prefix, `cache_control` on Anthropic's block that ends
it (only past the documented minimum, nowhere else), nothing added for OpenAI-style kinds, and
cache keys that do not depend on it: a study cached with caching on re-scores with zero calls
with it off, and the other way round.

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
from runner.execute.pool import Endpoint, RunStats, execute
from runner.execute.providers import anthropic_body
from runner.execute.store.cache import Cache
from runner.job.load import load_job
from runner.job.spec import Job, Limits
from runner.prepare import prepare
from runner.tasks import Task
from tests.conftest import ROOT, JobWriter
from tests.fakeproviders import Fake, ProviderServer

RUN_TIMEOUT_S = 20.0
RUBRIC = "Rubric line that every request repeats word for word.\n" * 120  # 6,600 chars
SYSTEM = "You are a strict judge."

JOB = """
{top}
[[datasets]]
name = "mine"
path = "data.jsonl"
fields = {{ id = "id", group = "doc", text = {{ document = "document", output = "output" }} }}

[[prompts]]
name = "stars"
template = "prompt.txt"
system = "{system}"
parser = "stars"
aspects = ["overall"]
params = {{ temperature = 0 }}
{prompt}

[models.judge]
spec = "{spec}"
base_url = "{url}"
"""


@pytest.fixture
def provider_server() -> Iterator[ProviderServer]:
    with ProviderServer(Fake()) as s:
        yield s


def make_job(write_job: JobWriter, spec: str, url: str = "http://127.0.0.1:9/v1", *,
             template: str = RUBRIC + "Story: {{document}}\nSummary: {{output}}\nStars:",
             top: str = "", prompt: str = "", system: str = SYSTEM) -> Job:
    rows = [{"id": f"item{i}", "doc": f"d{i // 2}", "document": f"Document {i // 2}. " * 5,
             "output": f"Summary {i}"} for i in range(4)]
    path = write_job(JOB.format(spec=spec, url=url, top=top, prompt=prompt, system=system),
                     rows=rows, files={"prompt.txt": template})
    return load_job(path)


def tasks(job: Job) -> list[Task]:
    return list(prepare(job, ROOT).tasks())


async def run(job: Job, cache: Cache, concurrency: int = 2) -> RunStats:
    expansion = prepare(job, ROOT)
    endpoints = {m.name: Endpoint(model=m, base_url=m.base_url or "", api_key=lambda: "k")
                 for m in job.models}
    async with aiohttp.ClientSession() as session, asyncio.timeout(RUN_TIMEOUT_S):
        return await execute(expansion.tasks(), cache=cache, session=session,
                             endpoints=endpoints,
                             limits=Limits(concurrency=concurrency, max_retries=1),
                             total=expansion.count())


def marked(body: dict[str, Any]) -> list[tuple[str, str]]:
    """Where a Messages body carries cache_control: (place, text of the marked block)."""
    places = [("system", body.get("system")), *(
        (f"messages[{i}]", m["content"]) for i, m in enumerate(body["messages"]))]
    return [(place, block["text"]) for place, content in places if isinstance(content, list)
            for block in content if "cache_control" in block]


# ------------------------------------------------------------------------ the prefix

def test_prefix_is_the_system_and_the_template_up_to_its_first_item_placeholder(
        write_job: JobWriter) -> None:
    job = make_job(write_job, "anthropic:claude-sonnet-4-5",
                   template="Judge {{aspect}} well.\n" + RUBRIC + "Story: {{document}}\n"
                   "Summary: {{output}}")
    for task in tasks(job):
        assert task.prefix == len(SYSTEM) + len("Judge overall well.\n" + RUBRIC + "Story: ")


def test_prefix_until_takes_in_the_document_and_prompt_cache_false_sends_none(
        write_job: JobWriter) -> None:
    job = make_job(write_job, "anthropic:claude-sonnet-4-5", prompt='prefix_until = "output"')
    doc = len("Document 0. " * 5)
    assert [t.prefix for t in tasks(job)] == [
        len(SYSTEM) + len(RUBRIC + "Story: \nSummary: ") + doc] * 4
    job = make_job(write_job, "anthropic:claude-sonnet-4-5", top="prompt_cache = false",
                   prompt='prefix_until = "output"')
    assert [t.prefix for t in tasks(job)] == [0] * 4


def test_prefix_until_must_name_a_placeholder_of_the_prompt(write_job: JobWriter) -> None:
    with pytest.raises(ConfigError, match=r"prompts\[0\]\.prefix_until names \{\{summary\}\}, "
                                          r"which no template of the prompt has"):
        make_job(write_job, "anthropic:claude-x", prompt='prefix_until = "summary"')


def test_the_keys_are_the_same_with_prompt_caching_on_and_off(write_job: JobWriter) -> None:
    on = tasks(make_job(write_job, "anthropic:claude-x", prompt='prefix_until = "output"'))
    off = tasks(make_job(write_job, "anthropic:claude-x", top="prompt_cache = false"))
    assert [t.key for t in on] == [t.key for t in off]
    assert [t.body for t in on] == [t.body for t in off]
    assert on[0].prefix > 0 and off[0].prefix == 0
    assert tasks(make_job(write_job, "openai:gpt-4o"))[0].prefix == 0  # told to anthropic only


# ------------------------------------------------------------------------ the wire

def body(system: str, user: str, model: str = "claude-sonnet-4-5") -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "system", "content": system},
                                                      {"role": "user", "content": user}]})


def test_anthropic_marks_the_block_that_ends_a_long_enough_prefix_and_no_other() -> None:
    user = RUBRIC + "Story: it rained."
    sent = orjson.loads(anthropic_body(body(SYSTEM, user), len(SYSTEM) + len(RUBRIC)))
    assert sent["system"] == SYSTEM  # unmarked: the breakpoint after it covers it
    assert sent["messages"][0]["content"] == [
        {"type": "text", "text": RUBRIC, "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Story: it rained."}]
    assert marked(sent) == [("messages[0]", RUBRIC)]
    # A long system alone: the system is the marked block, the message stays a string.
    sent = orjson.loads(anthropic_body(body(RUBRIC, "Story: x"), len(RUBRIC)))
    assert marked(sent) == [("system", RUBRIC)] and sent["messages"][0]["content"] == "Story: x"


def test_anthropic_marks_nothing_under_the_documented_minimum() -> None:
    user = RUBRIC * 2 + "Story: it rained."
    sonnet = 1024 * 4  # CHARS_PER_TOKEN characters a token
    assert marked(orjson.loads(anthropic_body(body("", user), sonnet))) != []
    assert marked(orjson.loads(anthropic_body(body("", user), sonnet - 4))) == []
    haiku = body("", user, model="claude-3-5-haiku-latest")
    assert marked(orjson.loads(anthropic_body(haiku, sonnet))) == []
    assert marked(orjson.loads(anthropic_body(haiku, 2048 * 4))) != []
    assert marked(orjson.loads(anthropic_body(body("", user)))) == []  # prefix 0: none


@pytest.mark.slow
async def test_requests_carry_cache_control_only_for_anthropic_and_reruns_make_no_calls(
        write_job: JobWriter, provider_server: ProviderServer, tmp_path: Path) -> None:
    url = provider_server.root + "/v1"
    seen = provider_server.fake.seen
    for first, second in (("", "prompt_cache = false"), ("prompt_cache = false", "")):
        with Cache(tmp_path / f"cache{len(first)}") as cache:
            on = make_job(write_job, "anthropic:claude-sonnet-4-5", url, top=first)
            seen.clear()
            assert (await run(on, cache)).api_calls == 4
            want = [] if first else [("messages[0]", RUBRIC + "Story: ")]
            assert [marked(s.body) for s in seen] == [want] * 4
            again = make_job(write_job, "anthropic:claude-sonnet-4-5", url, top=second)
            assert (await run(again, cache)).api_calls == 0  # the same keys: all cached
    seen.clear()
    with Cache(tmp_path / "openai") as cache:
        assert (await run(make_job(write_job, "openai:gpt-4o", url), cache)).api_calls == 4
    assert all(b"cache_control" not in orjson.dumps(s.body) for s in seen) and len(seen) == 4
    assert all(s.body["messages"][1]["content"].startswith(RUBRIC) for s in seen)


async def test_an_anthropic_tasks_body_is_decoded_once_for_the_gate_and_the_messages_body(
        write_job: JobWriter, provider_server: ProviderServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    job = make_job(write_job, "anthropic:claude-sonnet-4-5", provider_server.root + "/v1")
    bodies = {t.body for t in tasks(job)}
    decoded: list[bytes] = []
    loads = orjson.loads

    def counting(data: Any) -> Any:
        if isinstance(data, bytes) and data in bodies:
            decoded.append(data)
        return loads(data)

    monkeypatch.setattr(orjson, "loads", counting)
    with Cache(tmp_path / "cache") as cache:
        assert (await run(job, cache)).api_calls == 4
    assert sorted(decoded) == sorted(bodies) and len(bodies) == 4  # each body once
