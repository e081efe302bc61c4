"""runner's Python API (runner/api.py) as a notebook uses it: the real pipeline against the fake
server in a thread, a real cache and real report folders under tmp_path."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

import runner
from runner.api import COLUMNS
from tests.conftest import ROOT
from tests.fakeserver import ThreadedServer, default_reply

TWO_JUDGES = ROOT / "examples" / "two-judges.toml"
MODEL = "gpt-4o-mini"
JUDGES = {f"{MODEL}/stars", f"{MODEL}/rubric"}


def _choose(server: ThreadedServer, tmp_path: Path, **more: Any) -> dict[str, Any]:
    """The selection of every call here: the fake server, a cache and report folder of the
    test's own, and no environment (no key, no JUDGE_* variable of the machine)."""
    return {"models": [MODEL], "base_url": server.url, "cache_dir": tmp_path / "cache",
            "out": tmp_path / "runs", "environ": {}, **more}


def test_run_rerun_then_rescore_share_the_cache_and_print_nothing(
        server: ThreadedServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    job = runner.load_job(TWO_JUDGES)
    [planned] = runner.plan(job, **_choose(server, tmp_path))
    assert (planned.tasks, planned.cached, planned.calls) == (40, 0, 40)
    first = runner.run(job, **_choose(server, tmp_path))
    assert first.ok and first.stats.api_calls == 40 and server.state.answered == 40
    assert (first.run_dir / "correlations.csv").is_file()
    assert first.run_dir.parent == tmp_path / "runs" / "history"
    assert first.headline.lines and not first.headline.scoreless

    again = runner.run(TWO_JUDGES, **_choose(server, tmp_path))  # a path does as well as a Job
    assert server.state.answered == 40  # every answer from the cache: no call
    assert again.ok and again.stats.api_calls == 0 and again.stats.cache_hits == 40
    assert runner.plan(job, **_choose(server, tmp_path))[0].calls == 0

    rescored = runner.rescore(job, **_choose(server, tmp_path))
    assert rescored.ok and rescored.stats.cache_hits == 40 and server.state.answered == 40
    assert len({first.run_dir, again.run_dir, rescored.run_dir}) == 3  # none overwritten
    manifest = orjson.loads((rescored.run_dir / "manifest.json").read_bytes())
    assert manifest["kind"] == "rebuild"
    assert capfd.readouterr() == ("", "")  # no progress bar, no summary: the caller decides


async def test_run_inside_a_running_event_loop(server: ThreadedServer, tmp_path: Path) -> None:
    asyncio.get_running_loop()  # as in a Jupyter cell
    done = runner.run(TWO_JUDGES, **_choose(server, tmp_path, limit=4))
    assert done.ok and done.stats.api_calls == 8 and server.state.answered == 8
    awaited = await runner.arun(TWO_JUDGES, **_choose(server, tmp_path, limit=4))
    assert awaited.ok and awaited.stats.cache_hits == 8 and server.state.answered == 8


async def test_an_interrupt_in_a_running_loop_stops_the_run_and_keeps_its_answers(
        server: ThreadedServer, tmp_path: Path) -> None:
    """Jupyter's interrupt (SIGINT) while `run` waits for its worker: no new request, the
    answers in flight are cached and reported, the interrupt goes on; a rerun calls the rest."""
    sent: list[int] = []

    def interrupt_once(body: dict[str, Any]) -> str:
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)  # delivered to the waiting main thread
        return default_reply(body)

    server.state.script.reply = interrupt_once
    server.state.script.latency_s = 0.05
    # a kernel runs a cell under Python's own SIGINT handler (the test loop's cancels instead)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            runner.run(TWO_JUDGES, **_choose(server, tmp_path, concurrency=2))
    finally:
        signal.signal(signal.SIGINT, previous)
    answered = server.state.answered
    assert 1 <= answered < 40
    kept = runner.results(tmp_path / "runs")  # the stopped run wrote its reports
    assert kept.scores["judge_score"].notna().sum() == answered
    rest = runner.run(TWO_JUDGES, **_choose(server, tmp_path))
    assert rest.ok and rest.stats.api_calls == 40 - answered and server.state.answered == 40


def _dtypes(frame: Any, name: str) -> None:
    schema = COLUMNS[name]
    assert list(frame.columns[:len(schema)]) == list(schema), name
    assert {c: str(frame[c].dtype) for c in schema} == schema, name


def test_results_frames_have_the_documented_columns_and_dtypes(
        server: ThreadedServer, tmp_path: Path) -> None:
    # the rubric judge's answers never parse: the failures frame holds them with their text
    server.state.script.reply = lambda body: (
        "a fine headline" if "copy editor" in body["messages"][-1]["content"]
        else default_reply(body))
    done = runner.run(TWO_JUDGES, **_choose(server, tmp_path))
    assert not done.ok and done.headline.scoreless  # one judge without a single score
    job = runner.load_job(TWO_JUDGES)
    for folder in (done, done.run_dir, tmp_path / "runs", str(tmp_path / "runs" / "latest"),
                   job, TWO_JUDGES):
        frames = runner.results(folder, out=tmp_path / "runs")
        for name in COLUMNS:
            _dtypes(getattr(frames, name), name)
    assert set(frames.correlations["judge"]) >= {f"{MODEL}/stars"}
    assert str(frames.correlations["n_systems"].dtype) == "Int64"  # a count, not text
    assert len(frames.scores) == 40 and frames.scores["judge_score"].notna().sum() == 20
    failures = frames.failures
    assert len(failures) == 20 and set(failures["prompt"]) == {"rubric"}
    assert set(failures["raw"]) == {"a fine headline"} and failures["kind"].notna().all()
    summary = frames.summary.set_index("prompt")
    assert summary.loc["rubric", "parse_failures"] == 20 and summary.loc["stars", "scored"] == 20


def test_errors_are_runner_errors_with_the_fix(server: ThreadedServer, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(runner.ConfigError, match="job file not found"):
        runner.load_job(tmp_path / "nowhere.toml")
    with pytest.raises(runner.ConfigError, match="give one"):
        runner.run(TWO_JUDGES, **_choose(server, tmp_path, limit=4, sample=4))
    with pytest.raises(runner.MissingKeyError, match="set OPENAI_API_KEY"):
        runner.run(TWO_JUDGES, models=["openai:gpt-4o-mini"], cache_dir=tmp_path / "cache",
                   out=tmp_path / "runs", environ={})
    assert server.state.answered == 0
    with pytest.raises(runner.ReportError, match="no reports here"):
        runner.results(tmp_path)
    runner.run(TWO_JUDGES, **_choose(server, tmp_path, limit=2))
    judgments = tmp_path / "runs" / "judgments.jsonl"
    judgments.write_bytes(judgments.read_bytes() + b"{not json\n")
    with pytest.raises(runner.ReportError, match=r"judgments.jsonl: unreadable .*judge report"):
        runner.results(tmp_path / "runs")
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if not installed
    with pytest.raises(runner.ConfigError, match=r"pip install judge-runner\[pandas\]"):
        runner.results(tmp_path / "runs")


def test_the_how_to_documents_every_frame_column_and_dtype() -> None:
    page = (ROOT / "docs" / "how-to" / "notebook.md").read_text(encoding="utf-8")
    for name, schema in COLUMNS.items():
        documented = ", ".join(f"`{c}` {d}" for c, d in schema.items())
        assert f"| `{name}` |" in page and f"| {documented} |" in page, name


@pytest.mark.slow
def test_the_api_loads_on_first_use_not_with_the_package() -> None:
    """Every spawned store process imports `runner`: the API's pipeline modules (~0.1 s) load
    only when a name of it is used."""
    probe = ("import sys, runner.execute.store.reader, runner\n"
             "before = {'runner.api', 'runner.session'} & set(sys.modules)\n"
             "runner.run\n"
             "print(sorted(before), 'runner.api' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == ["[]", "True"]
