"""`judge run --batch` for `anthropic:` models, end to end: the real CLI in a subprocess against
the fake Message Batches server (tests/fakeanthropicbatch.py) on 127.0.0.1, a real cache and
ledger under tmp_path. The fake counts batch creations per custom_id (= cache key).
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from runner.execute.anthropic_batch import _as_openai, _output_line
from runner.execute.store.cache import Cache
from tests.conftest import JobWriter
from tests.fakeanthropicbatch import AnthropicBatchServer
from tests.test_cli import (
    SUBPROCESS_TIMEOUT_S,
    clean_env,
    judge_cmd,
    judgments,
    manifest,
    run_judge,
)

N = 10
KEY = "sk-ant-test-secret-key"
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
params = {{ temperature = 0 }}

[models.claude]
spec = "anthropic:claude-3-5-haiku-latest"
base_url = "{url}"
price = {{ input = 1.0, output = 5.0 }}
batch_discount = 0.5
"""


@pytest.fixture
def fake() -> Iterator[AnthropicBatchServer]:
    with AnthropicBatchServer() as s:
        yield s


@pytest.fixture
def job(write_job: JobWriter, fake: AnthropicBatchServer) -> Path:
    rows = [{"id": f"item{i}", "output": f"Story {i}"} for i in range(N)]
    return write_job(JOB.format(url=fake.url), rows=rows,
                     files={"prompt.txt": "Rate {{aspect}} in stars: {{output}}"})


def _run(tmp_path: Path, data_dir: Path, job: Path, *extra: object,
         out: str = "out") -> subprocess.CompletedProcess[str]:
    return run_judge(*_args(tmp_path, job, *extra, out=out),
                     env=clean_env(data_dir, ANTHROPIC_API_KEY=KEY), cwd=tmp_path)


def _args(tmp_path: Path, job: Path, *extra: object, out: str = "out") -> tuple[object, ...]:
    return ("run", job, "--cache-dir", tmp_path / "cache", "--out", tmp_path / out,
            "--poll-interval", 0.05, *extra)


def _records(tmp_path: Path, out: str = "out", cache: str = "cache") -> dict[str, Any]:
    with Cache(tmp_path / cache) as c:
        return c.get_many([j["key"] for j in judgments(tmp_path / out)])


@pytest.mark.slow
def test_submit_collect_stores_online_shaped_answers_and_an_online_rerun_calls_nothing(
        fake: AnthropicBatchServer, job: Path, tmp_path: Path, data_dir: Path) -> None:
    first = _run(tmp_path, data_dir, job, "--batch", "--batch-size", 4)

    assert first.returncode == 0, first.stderr
    assert fake.anth.creates == 3 and fake.anth.online == 0  # 10 requests, at most 4 a batch
    assert set(fake.anth.creations.values()) == {1} and len(fake.anth.creations) == N
    assert all(h == {"x-api-key": KEY, "anthropic-version": "2023-06-01", "Authorization": ""}
               for h in fake.anth.headers)
    for params in fake.anth.params:  # the Messages body providers.py builds
        assert params["system"] == "You are a strict judge." and params["max_tokens"] == 256
        assert [m["role"] for m in params["messages"]] == ["user"] and "n" not in params
    records = _records(tmp_path)
    assert len(records) == N
    assert all(r["source"].startswith("batch:msgbatch_") for r in records.values())
    assert all(j["score"] is not None for j in judgments(tmp_path / "out"))
    assert manifest(tmp_path / "out")["batch"]["collected"] == N
    assert KEY not in first.stderr + first.stdout
    assert all(KEY not in orjson.dumps(r).decode() for r in records.values())
    assert not list((tmp_path / "cache" / "batch-files").iterdir())

    online = _run(tmp_path, data_dir, job)  # without --batch: every answer is cached

    assert online.returncode == 0, online.stderr
    assert fake.anth.online == 0 and fake.anth.creates == 3
    assert manifest(tmp_path / "out")["counts"]["cache_hits"] == N

    # The same job online into another cache: the same keys and the same answers.
    fresh = run_judge("run", job, "--cache-dir", tmp_path / "cache2", "--out", tmp_path / "o2",
                      env=clean_env(data_dir, ANTHROPIC_API_KEY=KEY), cwd=tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    assert fake.anth.online == N
    live = _records(tmp_path, "o2", "cache2")
    assert set(live) == set(records)
    for key, record in live.items():
        assert record["response"] == records[key]["response"]
        assert record["usage"] == records[key]["usage"]
        assert record["endpoint"] == records[key]["endpoint"] == f"anthropic:{fake.url}"


@pytest.mark.slow
def test_kill_9_after_submit_then_rerun_reattaches_with_one_creation_per_key(
        fake: AnthropicBatchServer, job: Path, tmp_path: Path, data_dir: Path) -> None:
    fake.anth.hold = True
    args = _args(tmp_path, job, "--batch", "--batch-size", 4)
    proc = subprocess.Popen(judge_cmd(*args), env=clean_env(data_dir, ANTHROPIC_API_KEY=KEY),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 30
        while fake.anth.creates < 3 or fake.anth.polls < 3:  # submitted, polling
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
    fake.anth.hold = False

    rerun = _run(tmp_path, data_dir, job, "--batch", "--batch-size", 4)

    assert rerun.returncode == 0, rerun.stderr
    assert fake.anth.creates == 3, rerun.stderr
    assert set(fake.anth.creations.values()) == {1} and len(fake.anth.creations) == N
    assert manifest(tmp_path / "out")["batch"]["batches_attached"] == 3
    assert all(j["score"] is not None for j in judgments(tmp_path / "out"))
    assert fake.anth.online == 0


@pytest.mark.slow
def test_killed_between_create_and_recording_the_ids_reattaches_each_to_its_own_batch(
        fake: AnthropicBatchServer, job: Path, tmp_path: Path, data_dir: Path) -> None:
    fake.anth.hold = True
    first = _run(tmp_path, data_dir, job, "--batch", "--batch-size", 5, "--no-wait")
    assert first.returncode == 0, first.stderr
    assert fake.anth.creates == 2  # 5 + 5 requests: the same count, told apart by time
    # What a kill right after the create leaves: the rows reserved, their batch ids never written.
    with sqlite3.connect(tmp_path / "cache" / "batches.sqlite") as db:
        ids = db.execute("SELECT file_id, batch_id FROM batches ORDER BY file_id").fetchall()
        db.execute("UPDATE batches SET batch_id = NULL, state = 'submitting'")
    fake.anth.hold = False

    rerun = _run(tmp_path, data_dir, job, "--batch", "--batch-size", 5)

    assert rerun.returncode == 0, rerun.stderr
    assert fake.anth.creates == 2 and set(fake.anth.creations.values()) == {1}
    with sqlite3.connect(tmp_path / "cache" / "batches.sqlite") as db:
        assert db.execute("SELECT file_id, batch_id FROM batches ORDER BY file_id"
                          ).fetchall() == ids  # each row re-attached to its own batch
    assert len({batch for _, batch in ids}) == 2
    assert all(j["score"] is not None for j in judgments(tmp_path / "out"))


@pytest.mark.slow
def test_errored_results_are_failures_and_fall_back(
        fake: AnthropicBatchServer, job: Path, tmp_path: Path, data_dir: Path) -> None:
    fake.anth.error_every = 4  # places 0, 4, 8 of a batch end errored

    kept = _run(tmp_path, data_dir, job, "--batch")

    assert kept.returncode == 1, kept.stderr
    # 3 errored, resubmitted once in a new batch whose place 0 errors again
    assert fake.anth.creates == 2 and fake.anth.online == 0
    failed = [j for j in judgments(tmp_path / "out") if j["error"] is not None]
    assert len(failed) == 1 and failed[0]["score"] is None
    assert "invalid_request_error: fake errored request" in failed[0]["error"]["message"]
    fake.anth.creates = 0
    (tmp_path / "b").mkdir()

    online = _run(tmp_path / "b", data_dir, job, "--batch", "--batch-fallback", "online")

    assert online.returncode == 0, online.stderr
    assert fake.anth.creates == 1 and fake.anth.online == 3
    assert all(j["score"] is not None for j in judgments(tmp_path / "b" / "out"))


@pytest.mark.slow
def test_cancel_then_rerun_submits_the_cancelled_requests_again(
        fake: AnthropicBatchServer, job: Path, tmp_path: Path, data_dir: Path) -> None:
    fake.anth.hold = True
    assert _run(tmp_path, data_dir, job, "--batch", "--no-wait").returncode == 0
    env = clean_env(data_dir, ANTHROPIC_API_KEY=KEY)
    cancel = run_judge("batches", job, "--cache-dir", tmp_path / "cache", "--cancel",
                       env=env, cwd=tmp_path)
    assert cancel.returncode == 0, cancel.stderr
    fake.anth.hold = False

    rerun = _run(tmp_path, data_dir, job, "--batch")

    assert rerun.returncode == 0, rerun.stderr
    assert fake.anth.creates == 2 and set(fake.anth.creations.values()) == {2}
    assert all(j["score"] is not None for j in judgments(tmp_path / "out"))


@pytest.mark.slow
def test_plan_shows_the_batch_price_for_anthropic(
        job: Path, tmp_path: Path, data_dir: Path) -> None:
    plan = run_judge("plan", job, "--cache-dir", tmp_path / "cache",
                     env=clean_env(data_dir, ANTHROPIC_API_KEY=KEY), cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    line = next(x for x in plan.stdout.splitlines() if x.startswith("  claude"))
    online = float(line.split("~$")[1].split()[0].rstrip(","))
    batch = float(line.split("batch ~$")[1].split()[0].rstrip(",)"))
    assert online > 0 and batch == pytest.approx(online / 2, abs=1e-4)


def test_states_and_results_map_to_the_openai_shape() -> None:
    ended = {"id": "b", "processing_status": "ended", "results_url": "http://r",
             "request_counts": {"processing": 0, "succeeded": 3, "errored": 1, "canceled": 0,
                                "expired": 2}}
    assert _as_openai(ended) == {"id": "b", "status": "expired", "output_file_id": "http://r",
                                 "error_file_id": None,
                                 "request_counts": {"completed": 3, "failed": 3}}
    assert _as_openai({**ended, "processing_status": "canceling"})["status"] == "cancelling"
    assert _as_openai({**ended, "request_counts": {"succeeded": 1}})["status"] == "completed"
    expired = orjson.loads(_output_line({"custom_id": "k", "result": {"type": "expired"}}))
    assert expired == {"custom_id": "k", "error": {
        "code": "expired", "message": "the request was expired before it ran"}}
    ok = orjson.loads(_output_line({"custom_id": "k", "result": {"type": "succeeded", "message": {
        "content": [{"type": "text", "text": "4"}], "stop_reason": "max_tokens",
        "usage": {"input_tokens": 5, "output_tokens": 1}}}}))
    body = ok["response"]["body"]
    assert ok["response"]["status_code"] == 200
    assert body["choices"][0]["message"]["content"] == "4"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
                             "prompt_tokens_details": {"cached_tokens": 0},
                             "cache_creation_input_tokens": 0}
