"""`judge run --batch` end to end: the real CLI in a subprocess against the fake Files + Batches
server (tests/fakebatch.py) on 127.0.0.1, a real cache and ledger under tmp_path.

The fake counts batch creations per custom_id (= cache key): a key is submitted exactly once
unless its batch failed it, whatever happens to the process in between.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from runner.cli.batches import MAX_BATCH_REQUESTS, batch_models
from runner.cli.main import cli
from runner.errors import ConfigError
from runner.estimate import model_price
from runner.execute.batch_files import MAX_REQUESTS, body_of, request_line, write_files
from runner.execute.store.cache import Cache
from runner.job.load import load_job
from runner.job.spec import ModelSpec
from runner.session import select
from runner.tasks import Task
from tests.conftest import JobWriter
from tests.fakebatch import BatchServer, run_all
from tests.fakeserver import ThreadedServer
from tests.test_cli import (
    ENV_KEYS,
    OPENMEVA,
    SUBPROCESS_TIMEOUT_S,
    clean_env,
    error_line,
    judge_cmd,
    judgments,
    manifest,
    run_judge,
    write_job,
)

LIMIT = 20


@pytest.fixture
def fake() -> Iterator[BatchServer]:
    with BatchServer() as s:
        yield s


def _args(fake: BatchServer, tmp_path: Path, *extra: object) -> tuple[object, ...]:
    return ("run", OPENMEVA, "--limit", LIMIT, "--base-url", fake.url, "--model", "fake",
            "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out", "--batch",
            "--poll-interval", 0.05, *extra)


def _run(tmp_path: Path, data_dir: Path, *args: object) -> subprocess.CompletedProcess[str]:
    return run_judge(*args, env=clean_env(data_dir), cwd=tmp_path)


def _sources(tmp_path: Path) -> dict[str, str]:
    with Cache(tmp_path / "cache") as cache:
        records = cache.get_many([j["key"] for j in judgments(tmp_path / "out")])
    return {k: r["source"] for k, r in records.items()}


@pytest.mark.slow
def test_batch_run_splits_files_stores_answers_and_an_online_rerun_calls_nothing(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    first = _run(tmp_path, data_dir, *_args(fake, tmp_path, "--batch-size", 8))

    assert first.returncode == 0, first.stderr
    assert fake.batch.creates == 3  # 20 requests, at most 8 a file
    assert "fake: 20 requests in 3 batch file(s)" in first.stderr
    assert "batch: 3 batch(es) made this run, 0 from earlier runs; 20 answers collected, " \
           "0 failed, 0 pending" in first.stderr
    assert set(fake.batch.creations.values()) == {1} and len(fake.batch.creations) == LIMIT
    assert fake.state.requests == 0  # no online call
    lines = judgments(tmp_path / "out")
    assert len(lines) == LIMIT and all(j["score"] is not None for j in lines)
    assert all(not j["cached"] for j in lines)
    sources = _sources(tmp_path)
    assert len(sources) == LIMIT and all(s.startswith("batch:batch_") for s in sources.values())
    batch = manifest(tmp_path / "out")["batch"]
    assert batch["batches_created"] == 3 and batch["collected"] == LIMIT
    assert batch["pending"] == 0 and batch["failed"] == 0
    assert manifest(tmp_path / "out")["batch_answers"] == LIMIT
    assert {j["source"] for j in lines} == set(sources.values())
    assert not list((tmp_path / "cache" / "batch-files").iterdir())  # removed once collected
    assert "20 judgments read answers from 3 provider batch(es)" in \
        (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    scores = [j["score"] for j in lines]

    online = _run(tmp_path, data_dir, *_args(fake, tmp_path)[:-3])  # the same, without --batch

    assert online.returncode == 0, online.stderr
    assert fake.state.requests == 0 and fake.batch.creates == 3
    assert manifest(tmp_path / "out")["counts"]["cache_hits"] == LIMIT
    rescore = _run(tmp_path, data_dir, "rescore", OPENMEVA, "--limit", LIMIT, "--base-url",
                   fake.url, "--model", "fake", "--cache-dir", tmp_path / "cache", "--out",
                   tmp_path / "out")
    assert rescore.returncode == 0, rescore.stderr
    assert [j["score"] for j in judgments(tmp_path / "out")] == scores
    assert manifest(tmp_path / "out")["batch_answers"] == LIMIT


@pytest.mark.slow
def test_kill_9_after_submit_then_rerun_reattaches_and_submits_nothing_twice(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    fake.batch.script.hold = True
    args = _args(fake, tmp_path, "--batch-size", 8)
    proc = subprocess.Popen(judge_cmd(*args), env=clean_env(data_dir), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while fake.batch.creates < 3 or fake.batch.polls < 3:  # submitted, polling
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the batches were not submitted within 30 s"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=SUBPROCESS_TIMEOUT_S)
    assert proc.returncode == -signal.SIGKILL
    fake.batch.script.hold = False

    rerun = _run(tmp_path, data_dir, *args)

    assert rerun.returncode == 0, rerun.stderr
    assert fake.batch.creates == 3, rerun.stderr
    assert set(fake.batch.creations.values()) == {1} and len(fake.batch.creations) == LIMIT
    assert manifest(tmp_path / "out")["batch"]["batches_attached"] == 3
    assert all(j["score"] is not None for j in judgments(tmp_path / "out"))
    assert fake.state.requests == 0


@pytest.mark.slow
def test_the_key_reaches_the_provider_and_nothing_else(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    secret = "sk-batch-secret-0123456789"

    run = run_judge(*_args(fake, tmp_path), env=clean_env(data_dir, OPENAI_API_KEY=secret),
                    cwd=tmp_path)

    assert run.returncode == 0, run.stderr
    assert fake.batch.auth == [f"Bearer {secret}"]
    assert secret not in run.stdout + run.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "batches.sqlite" for p in written)
    assert not [p for p in written if secret.encode() in p.read_bytes()]


@pytest.mark.slow
def test_killed_between_create_and_ledger_update_attaches_to_the_created_batch(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    fake.batch.script.hold = True
    first = _run(tmp_path, data_dir, *_args(fake, tmp_path, "--no-wait"))
    assert first.returncode == 0, first.stderr
    # What a kill right after the create leaves: the row reserved, its batch id never written.
    with sqlite3.connect(tmp_path / "cache" / "batches.sqlite") as db:
        db.execute("UPDATE batches SET batch_id = NULL, state = 'submitting'")
    fake.batch.script.hold = False

    rerun = _run(tmp_path, data_dir, *_args(fake, tmp_path))

    assert rerun.returncode == 0, rerun.stderr
    assert fake.batch.creates == 1 and set(fake.batch.creations.values()) == {1}
    assert all(j["score"] is not None for j in judgments(tmp_path / "out"))


@pytest.mark.slow
def test_no_wait_submits_and_exits_then_a_later_run_collects(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    fake.batch.script.hold = True
    submit = _run(tmp_path, data_dir, *_args(fake, tmp_path, "--no-wait"))

    assert submit.returncode == 0, submit.stderr
    assert "20 requests are in open batches" in submit.stderr
    assert manifest(tmp_path / "out")["batch"]["pending"] == LIMIT
    assert manifest(tmp_path / "out")["counts"]["not_run"] == LIMIT
    listed = _run(tmp_path, data_dir, "batches", OPENMEVA, "--limit", LIMIT, "--base-url",
                  fake.url, "--model", "fake", "--cache-dir", tmp_path / "cache")
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert rows[0].split()[:4] == ["batch", "model", "state", "requests"]
    assert rows[1].split()[1:6] == ["fake", "in_progress", "20", "0", "0"], listed.stdout
    again = _run(tmp_path, data_dir, *_args(fake, tmp_path, "--no-wait"))
    assert again.returncode == 0 and fake.batch.creates == 1, again.stderr  # held: not resent
    fake.batch.script.hold = False

    collect = _run(tmp_path, data_dir, *_args(fake, tmp_path))

    assert collect.returncode == 0, collect.stderr
    assert fake.batch.creates == 1
    assert manifest(tmp_path / "out")["batch"]["collected"] == LIMIT
    assert all(j["score"] is not None for j in judgments(tmp_path / "out"))


@pytest.mark.slow
def test_expired_batch_keeps_its_finished_part_and_falls_back_to_one_new_batch(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    fake.batch.script.expire = True  # every batch answers the first half, then expires

    run = _run(tmp_path, data_dir, *_args(fake, tmp_path))

    assert run.returncode == 1, run.stderr
    assert fake.batch.creates == 2  # the batch, then one fallback batch for its unrun half
    assert sorted(fake.batch.creations.values()) == [1] * 10 + [2] * 10
    lines = judgments(tmp_path / "out")
    scored = [j for j in lines if j["score"] is not None]
    failed = [j for j in lines if j["error"] is not None]
    assert len(scored) == 15 and len(failed) == 5
    assert all(j["score"] is None and "batch_expired" in j["error"]["message"] for j in failed)
    assert run.stderr.count("batch_expired") >= 5


@pytest.mark.slow
def test_per_request_errors_are_failures_and_fall_back_online(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    fake.batch.script.fail_every = 4  # places 0, 4, 8, 12, 16 answer with a 400 error line

    kept = _run(tmp_path, data_dir, *_args(fake, tmp_path / "a"))

    assert kept.returncode == 1, kept.stderr
    failed = [j for j in judgments(tmp_path / "a" / "out") if j["error"] is not None]
    # the fallback batch holds the 5; its places 0 and 4 fail again
    assert len(failed) == 2 and fake.batch.creates == 2
    assert all("fake 400 for this request" in j["error"]["message"] and j["score"] is None
               for j in failed)
    fake.batch.creates = 0

    online = _run(tmp_path, data_dir, *_args(fake, tmp_path / "b", "--batch-fallback", "online"))

    assert online.returncode == 0, online.stderr
    assert fake.batch.creates == 1 and fake.state.requests == 5
    assert all(j["score"] is not None for j in judgments(tmp_path / "b" / "out"))


@pytest.mark.slow
def test_a_429_on_create_is_retried(fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    fake.batch.script.create_429 = 2

    run = _run(tmp_path, data_dir, *_args(fake, tmp_path))

    assert run.returncode == 0, run.stderr
    assert fake.batch.refused == 2 and fake.batch.creates == 1
    assert set(fake.batch.creations.values()) == {1}


def test_an_upload_is_tried_again_and_leaves_no_file_open(
        fake: BatchServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch file whose upload fails once is opened again and sent whole the second time,
    and every handle the attempts opened on it is closed."""
    import asyncio
    import os

    import aiohttp

    from runner.execute.batch_api import OpenAIBatches

    path = tmp_path / "requests.jsonl"
    path.write_bytes(b'{"custom_id": "a"}\n' * 1000)
    fake.batch.script.upload_500 = 1
    handles, real_open = [], Path.open

    def recorded(self: Path, *args: Any, **kwargs: Any) -> Any:
        handle = real_open(self, *args, **kwargs)
        handles.append(handle)
        return handle

    monkeypatch.setattr(Path, "open", recorded)

    def open_on_it() -> list[str]:
        fds = Path("/proc/self/fd")
        return [f.name for f in fds.iterdir()
                if os.path.realpath(f) == str(path.resolve())] if fds.exists() else []

    async def upload() -> str:
        async with aiohttp.ClientSession() as session:
            batches = OpenAIBatches(session, fake.url, lambda: "sk-test",
                                    max_retries=2)
            return await batches.upload(path)

    file_id = asyncio.run(upload())
    assert fake.batch.uploads == 1 and fake.batch.script.upload_500 == 0
    assert len(handles) == 2 and all(h.closed for h in handles)  # one an attempt
    assert fake.batch.files[file_id] == path.read_bytes()
    assert open_on_it() == []


@pytest.mark.slow
def test_cancel_then_rerun_keeps_the_finished_part_and_submits_the_rest(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    fake.batch.script.hold = True
    assert _run(tmp_path, data_dir, *_args(fake, tmp_path, "--no-wait")).returncode == 0
    common = (OPENMEVA, "--limit", LIMIT, "--base-url", fake.url, "--model", "fake",
              "--cache-dir", tmp_path / "cache")

    cancel = _run(tmp_path, data_dir, "batches", *common, "--cancel")

    assert cancel.returncode == 0, cancel.stderr
    assert "cancel requested for 1 live batch(es)" in cancel.stdout
    fake.batch.script.hold = False
    rerun = _run(tmp_path, data_dir, *_args(fake, tmp_path))
    assert rerun.returncode == 0, rerun.stderr
    assert fake.batch.creates == 2  # the cancelled one (half answered), then the other half
    assert sorted(fake.batch.creations.values()) == [1] * 10 + [2] * 10
    sources = set(_sources(tmp_path).values())
    assert len(sources) == 2
    listed = _run(tmp_path, data_dir, "batches", *common)
    states = [line.split()[2] for line in listed.stdout.splitlines()[1:]]
    assert states == ["cancelled", "completed"], listed.stdout


@pytest.mark.slow
def test_mode_batch_in_the_job_file_and_plan_shows_the_batch_price(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    text = OPENMEVA.read_text(encoding="utf-8")
    job = _job_with_model(tmp_path, text, f'spec = "fake"\nbase_url = "{fake.url}"\n'
                          'mode = "batch"\nprice = { input = 1.0, output = 2.0 }\n'
                          "batch_discount = 0.5\n")
    plan = _run(tmp_path, data_dir, "plan", job, "--limit", LIMIT,
                "--cache-dir", tmp_path / "cache")
    assert plan.returncode == 0, plan.stderr
    online, batch = _prices(plan.stdout)
    assert batch == pytest.approx(online / 2, abs=1e-4) and online > 0

    run = _run(tmp_path, data_dir, "run", job, "--limit", LIMIT, "--poll-interval", 0.05,
               "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")

    assert run.returncode == 0, run.stderr
    assert fake.batch.creates == 1 and fake.state.requests == 0


def _job_with_model(tmp_path: Path, text: str, model: str) -> Path:
    head = text.split("[models.")[0]
    body = head.replace('template = "../prompts/', f'template = "{OPENMEVA.parent.parent}/prompts/')
    return write_job(tmp_path / "job", body + "[models.judge]\n" + model)


def _prices(stdout: str) -> tuple[float, float]:
    line = next(x for x in stdout.splitlines() if x.startswith("  judge"))
    online = float(line.split("~$")[1].split()[0].rstrip(","))
    batch = float(line.split("batch ~$")[1].split()[0].rstrip(",)"))
    return online, batch


@pytest.mark.slow
def test_batch_mode_for_a_local_model_is_a_configuration_error(
        tmp_path: Path, data_dir: Path) -> None:
    run = _run(tmp_path, data_dir, "run", OPENMEVA, "--limit", 2, "--model", "local:smollm2",
               "--batch", "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")

    assert run.returncode == 2, run.stderr
    line = error_line(run.stderr)
    assert "local model, which has no Batch API" in line and "drop --batch" in line


_MINI = """
[[datasets]]
name = "mine"
path = "data.jsonl"
fields = { id = "id", text = { output = "output" }, human = { overall = "score" } }

[[prompts]]
name = "stars"
template = "prompt.txt"
parser = "stars"
aspects = ["overall"]

[models.judge]
spec = "openai:gpt-4o-mini"
"""


def test_job_file_reads_mode_and_batch_discount(write_job: JobWriter) -> None:
    path = write_job(_MINI + 'mode = "batch"\nbatch_discount = 0.25\n',
                     rows=[{"id": "a", "output": "x", "score": 1}],
                     files={"prompt.txt": "Rate {{output}}."})
    model = load_job(path).models[0]
    assert (model.mode, model.batch_discount) == ("batch", 0.25)
    assert model_price(model).batch_discount == 0.25  # type: ignore[union-attr]
    default = load_job(write_job(_MINI)).models[0]
    assert (default.mode, default.batch_discount) == ("online", None)  # the price's: 0.5


@pytest.mark.parametrize(("line", "message"), [
    ('mode = "async"', 'models.judge.mode must be "online" or "batch" (got \'async\')'),
    ("batch_discount = 1", "models.judge.batch_discount must be the share of the online price "
                           "saved, from 0 up to (not including) 1"),
])
def test_bad_batch_settings_name_the_key_and_the_fix(write_job: JobWriter, line: str,
                                                     message: str) -> None:
    path = write_job(_MINI + line + "\n", rows=[{"id": "a", "output": "x", "score": 1}],
                     files={"prompt.txt": "Rate {{output}}."})
    with pytest.raises(ConfigError) as err:
        load_job(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_request_lines_carry_the_exact_body_and_split_at_the_byte_limit(
        tmp_path: Path) -> None:
    body = b'{"messages":[{"content":"x \\"quoted\\"","role":"user"}],"model":"m"}'
    task = Task(dataset="d", item_id="1", prompt="p", aspect="a", model="judge", sample=0,
                key="k" * 64, body=body, prompt_tokens=1, max_tokens=1)
    line = request_line(task)
    parsed = orjson.loads(line)
    assert parsed["custom_id"] == "k" * 64 and parsed["url"] == "/v1/chat/completions"
    assert orjson.dumps(parsed["body"]) == body
    assert body_of(line) == ("k" * 64, body)
    tasks = [Task(**{**_fields(task), "key": f"{i:064d}"}) for i in range(7)]
    parts = list(write_files(tmp_path, "judge", tasks, max_requests=100,
                             max_bytes=3 * len(line)))
    counted = list(write_files(tmp_path, "judge", tasks, max_requests=2))
    assert [len(keys) for _, keys in parts] == [3, 3, 1]
    assert all(path.stat().st_size <= 3 * len(line) for path, _ in parts)
    assert b"".join(p.read_bytes() for p, _ in parts) == b"".join(map(request_line, tasks))
    assert [len(keys) for _, keys in counted] == [2, 2, 2, 1]


def _fields(task: Task) -> dict[str, object]:
    return task._asdict()


@pytest.mark.slow
def test_a_server_without_a_batch_api_is_a_configuration_error(
        tmp_path: Path, data_dir: Path) -> None:
    with ThreadedServer() as plain:  # chat completions only: /v1/files is a 404
        run = _run(tmp_path, data_dir, "run", OPENMEVA, "--limit", 2, "--base-url", plain.url,
                   "--model", "fake", "--batch", "--cache-dir", tmp_path / "cache",
                   "--out", tmp_path / "out")
        assert plain.state.requests == 0

    assert run.returncode == 2, run.stderr
    line = error_line(run.stderr.split("\n", 1)[1])  # after the "N requests in 1 file" line
    assert "cannot run in batch mode, the server refused the batch file upload" in line
    assert "HTTP 404" in line and "run it online" in line


GENERATE_JOB = """
[[datasets]]
name = "qs"
path = "data.jsonl"
fields = {{ id = "id", text = {{ question = "question" }} }}

[[generate]]
name = "answers"
dataset = "qs"
models = ["cand"]
template = "q.txt"

[[prompts]]
name = "rate"
template = "rate.txt"
parser = "stars"
aspects = ["overall"]
datasets = ["answers"]
models = ["judge"]

[models.cand]
spec = "cand"
base_url = "{url}"

[models.judge]
spec = "judge"
base_url = "{url}"
"""
"""Questions answered by a generation stage (model `cand`), the answers judged by `judge`; both
at the server {url}: fill it with str.format."""


@pytest.mark.slow
def test_a_generation_stage_then_its_judges_both_go_through_batches(
        fake: BatchServer, write_job: JobWriter, tmp_path: Path, data_dir: Path) -> None:
    job = write_job(GENERATE_JOB.format(url=fake.url),
                    rows=[{"id": f"q{i}", "question": f"What is {i} + {i}?"} for i in range(6)],
                    files={"q.txt": "{{question}}", "rate.txt": "Rate in stars: {{output}}"})

    run = _run(tmp_path, data_dir, "run", job, "--batch", "--poll-interval", 0.05,
               "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")

    assert run.returncode == 0, run.stderr
    assert fake.batch.creates == 2 and fake.state.requests == 0  # answers, then their judges
    lines = judgments(tmp_path / "out")
    assert len(lines) == 6 and all(j["score"] is not None for j in lines)
    # 6 answers; judge requests that repeat (two answers alike) are one request
    assert len(fake.batch.creations) == 6 + len({j["key"] for j in lines})
    assert set(fake.batch.creations.values()) == {1}
    assert all(j["source"].startswith("batch:") for j in lines)


@pytest.mark.slow
def test_a_collect_that_resubmits_expired_requests_reports_them_pending_not_failed(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    fake.batch.script.expire = True
    assert _run(tmp_path, data_dir, *_args(fake, tmp_path, "--no-wait")).returncode == 0
    run_all(fake.batch)  # the batch expires with half of its requests answered
    fake.batch.script.expire = False

    collect = _run(tmp_path, data_dir, *_args(fake, tmp_path, "--no-wait"))

    assert collect.returncode == 0, collect.stderr  # the unrun half is in a new batch
    assert fake.batch.creates == 2
    batch = manifest(tmp_path / "out")["batch"]
    assert (batch["collected"], batch["pending"], batch["failed"]) == (10, 10, 0)
    last = _run(tmp_path, data_dir, *_args(fake, tmp_path))
    assert last.returncode == 0, last.stderr
    assert fake.batch.creates == 2
    assert all(j["score"] is not None for j in judgments(tmp_path / "out"))


@pytest.mark.slow
def test_budget_with_batch_mode_is_refused_before_anything_is_sent(
        fake: BatchServer, tmp_path: Path, data_dir: Path) -> None:
    job = _job_with_model(tmp_path, OPENMEVA.read_text(encoding="utf-8"),
                          f'spec = "fake"\nbase_url = "{fake.url}"\nmode = "batch"\n'
                          "price = { input = 1.0, output = 2.0 }\n")

    run = _run(tmp_path, data_dir, "run", job, "--limit", 2, "--budget", 1,
               "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")

    assert run.returncode == 2, run.stderr
    assert "--budget is not supported with batch mode yet" in error_line(run.stderr)
    assert fake.batch.uploads == 0 and fake.state.requests == 0


def test_gemini_and_azure_models_get_a_not_yet_error_for_batch_mode(write_job: JobWriter) -> None:
    job = load_job(write_job(_MINI, rows=[{"id": "a", "output": "x", "score": 1}],
                             files={"prompt.txt": "Rate {{output}}."}))
    claude = ModelSpec(name="claude", spec="anthropic:claude-3-5-haiku", model="claude-3-5-haiku",
                       kind="anthropic", base_url="https://api.anthropic.com/v1")
    gemini = ModelSpec(name="gemini", spec="gemini:gemini-2.0-flash", model="gemini-2.0-flash",
                       kind="gemini", base_url="https://example.invalid/v1beta/openai")
    mixed = replace(job, models=(*job.models, claude, gemini))

    assert batch_models(job, everyone=True) == ("judge",)
    assert batch_models(replace(job, models=(*job.models, claude)), everyone=True) == (
        "judge", "claude")  # anthropic: Message Batches
    with pytest.raises(ConfigError, match="batch mode is not yet supported for gemini models"):
        batch_models(mixed, everyone=True)
    assert batch_models(mixed, everyone=False) == ()  # no model asks for batch mode


def test_the_batch_size_option_allows_what_a_batch_file_holds() -> None:
    """`judge run --batch-size` is bounded without importing runner.execute.batch (aiohttp)
    at start-up: its limit must stay the batch module's."""
    assert MAX_BATCH_REQUESTS == MAX_REQUESTS


def test_the_batch_stage_and_the_pool_share_the_cache_the_lease_opened(
        fake: BatchServer, tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """One writable cache a run (api.Run.opened): what the batch stage stored, the pool reads
    from the same object, and a shared database gives the run one connection. Before, the
    lease, the batch stage and the pool each opened their own."""
    writable: list[object] = []
    real = select.open_cache

    def counted(location: Any, *, read_only: bool = False) -> Any:
        if not read_only:
            writable.append(location)
        return real(location, read_only=read_only)

    monkeypatch.setattr(select, "open_cache", counted)
    monkeypatch.chdir(tmp_path)
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("JUDGE_DATA_DIR", str(data_dir))
    result = CliRunner().invoke(cli, [str(a) for a in _args(fake, tmp_path)],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert fake.batch.creates == 1 and fake.state.requests == 0
    assert writable == [tmp_path / "cache"]
