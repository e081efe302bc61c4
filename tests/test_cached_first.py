"""A run that judges its cached tasks first (runner.session.run.Run.cached_first, used from
CACHED_FIRST_TASKS tasks on) writes what the pool-first run writes: the same reports, counts and
exit code, and calls exactly the tasks without a cached answer, whether none, some at the
start, a hole in the middle or all of them are cached, with repeated requests among them."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from runner import expand_ahead
from runner.cli import main as cli_main
from runner.execute.stats import RunStats
from runner.execute.store import reader as reader_module
from runner.execute.store.answers import of_record
from runner.execute.store.cache import Cache
from runner.expand_ahead import Expander
from runner.reduce import judgments
from runner.selection import TaskSelection
from runner.session import run as session_run
from runner.session import select as select_module
from runner.session.select import WorkingSet, select
from tests.fakeserver import ThreadedServer
from tests.test_cli import JOB, clean_env, write_job

# JOB with a second prompt sending the very same request (its own prompt block under another
# name, same body): each item's second task repeats the first one's key.
REPEATED = JOB + ("[[prompts]]" + JOB.split("[[prompts]]")[1].split("[models.fake]")[0]
                  ).replace('name = "stars"', 'name = "again"')
REPORTS = ("judgments.jsonl", "scores.csv", "correlations.csv", "summary.csv",
           "reliability.csv", "report.md")


def _run(job: Path, cache: Path, out: Path, server: ThreadedServer, *, first: int,
         monkeypatch: pytest.MonkeyPatch, limit: int = 40) -> Any:
    monkeypatch.setattr(session_run, "CACHED_FIRST_TASKS", first)
    return CliRunner().invoke(cli_main.cli, [
        "run", str(job), "--limit", str(limit), "--base-url", server.url, "--model", "fake",
        "--cache-dir", str(cache), "--out", str(out), "--yes"], catch_exceptions=False)


def _isolated(monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    """The data sets read from `data_dir`; no API key, base URL or cache folder from the shell."""
    monkeypatch.setenv("JUDGE_DATA_DIR", str(data_dir))
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "JUDGE_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)


def _called(job: Path, cache: Path, out: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch,
            *, limit: int) -> WorkingSet:
    """A pool-first run of the first `limit` items of `job` against the fake server, which
    answers every task; the selection of the same items, with the same endpoint."""
    with ThreadedServer() as server:
        done = _run(job, cache, out, server, first=10**9, monkeypatch=monkeypatch, limit=limit)
        assert done.exit_code == 0, done.output
        return select(TaskSelection(job=job, models=("fake",), base_url=server.url,
                                    limit=limit, cache_dir=cache), data_dir=data_dir)


def _outputs(out: Path) -> dict[str, Any]:
    made: dict[str, Any] = {name: (out / name).read_bytes() for name in REPORTS}
    made["counts"] = orjson.loads((out / "manifest.json").read_bytes())["counts"]
    return made


def _hole(cache: Path, out: Path, items: set[str]) -> int:
    """Remove the cached answers of `items` (read from a run's judgments.jsonl)."""
    keys = {j["key"] for line in (out / "judgments.jsonl").read_bytes().splitlines()
            if (j := orjson.loads(line))["item_id"] in items}
    with Cache(cache) as c:
        for key in keys:
            assert c._store.delete(key)
    return len(keys)


@pytest.mark.slow
@pytest.mark.parametrize("cached", ["none", "first half", "hole", "all"])
@pytest.mark.parametrize("text", [JOB, REPEATED], ids=["distinct", "repeated"])
@pytest.mark.parametrize("reader", [False, True], ids=["direct", "reader"])
def test_cached_first_writes_what_the_pool_first_run_writes(
        cached: str, text: str, reader: bool, tmp_path: Path, data_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # batches of 3 tasks: the first task without an answer falls inside a batch, with more
    # batches read ahead (by a reader process: 4 of them) that must go to the pool in order
    monkeypatch.setattr(judgments, "READ_BATCH", 3)
    if reader:
        monkeypatch.setattr(reader_module, "MIN_TASKS", 1)
        monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    _isolated(monkeypatch, data_dir)
    job = write_job(tmp_path / "job", text)
    warm = tmp_path / "warm"
    with ThreadedServer() as server:
        if cached != "none":
            done = _run(job, warm, tmp_path / "warmed", server, first=10**9,
                        monkeypatch=monkeypatch, limit=20 if cached == "first half" else 40)
            assert done.exit_code == 0, done.output
        holes = 0
        if cached == "hole":
            items = [orjson.loads(line)["item_id"] for line in
                     (tmp_path / "warmed" / "judgments.jsonl").read_bytes().splitlines()]
            holes = _hole(warm, tmp_path / "warmed", set(list(dict.fromkeys(items))[10:20]))
            assert holes > 0
        made, calls = {}, {}
        for way, first in (("pool first", 10**9), ("cached first", 1)):
            cache = tmp_path / way / "cache"
            if warm.exists():
                shutil.copytree(warm, cache)
            before = server.state.requests
            done = _run(job, cache, tmp_path / way / "out", server, first=first,
                        monkeypatch=monkeypatch)
            assert done.exit_code == 0, done.output
            calls[way] = server.state.requests - before
            made[way] = _outputs(tmp_path / way / "out")
    assert made["cached first"] == made["pool first"]
    assert calls["cached first"] == calls["pool first"]
    counts = made["cached first"]["counts"]
    expected_calls = {"none": 40, "first half": 20, "hole": 10, "all": 0}[cached]
    assert counts["api_calls"] == calls["cached first"] == expected_calls
    assert counts["duplicates"] == (40 if text == REPEATED else 0)
    assert counts["cache_hits"] + counts["api_calls"] + counts["duplicates"] == counts["tasks"]


# The real `judge` in a fresh interpreter (one thread: it may fork), with the thresholds down
# to this small job and a marker for each forked Expander.
FORCED = """import sys
import runner.cli.main as m
import runner.session.run as run
import runner.execute.store.backend as b
import runner.expand_ahead as e
import runner.reduce.judgments as j
from runner.execute.stats import RunStats
from runner.execute.store.cache import Cache
forced = sys.argv.pop(1) == "forced"
run.CACHED_FIRST_TASKS = 1
j.READ_BATCH, e.CHUNK = 3, 6  # runs of 2 batches: the expander's children take turns
b.reader_pays = lambda cache, count: forced and isinstance(cache, Cache)
e.expander_pays = lambda cache, count: forced
start = e.Expander.__init__
def announced(self, *args):
    print("expander forked", file=sys.stderr)
    start(self, *args)
e.Expander.__init__ = announced
sys.argv[0] = "judge"
m.main()
"""


@pytest.mark.slow
@pytest.mark.parametrize("command", ["rescore", "run"])
def test_a_forked_expander_reads_what_judge_reads_itself(
        command: str, tmp_path: Path, data_dir: Path) -> None:
    """rescore, and a run's cached-first pass with a hole of uncached tasks, through a forked
    Expander (the child expands and reads; the tasks come from the skeleton): the same
    reports, counts and calls as without it."""
    job = write_job(tmp_path / "job", REPEATED)
    env = {**clean_env(data_dir)}
    with ThreadedServer() as server:
        where = ["--limit", "40", "--base-url", server.url, "--model", "fake"]
        warm = tmp_path / "warm"
        done = subprocess.run([sys.executable, "-c", FORCED, "plain", "run", str(job), *where,
                               "--cache-dir", str(warm), "--out", str(tmp_path / "warmed"),
                               "--yes"], env=env, cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        if command == "run":
            items = [orjson.loads(line)["item_id"] for line in
                     (tmp_path / "warmed" / "judgments.jsonl").read_bytes().splitlines()]
            assert _hole(warm, tmp_path / "warmed", set(list(dict.fromkeys(items))[5:15])) > 0
        made, calls = {}, {}
        for way in ("plain", "forced"):
            cache = tmp_path / way / "cache"
            shutil.copytree(warm, cache)
            before = server.state.requests
            done = subprocess.run(
                [sys.executable, "-c", FORCED, way, command, str(job), *where, "--cache-dir",
                 str(cache), "--out", str(tmp_path / way / "out"),
                 *(["--yes"] if command == "run" else [])],
                env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                check=False)
            assert done.returncode == 0, done.stderr
            assert ("expander forked" in done.stderr) == (way == "forced"), done.stderr
            calls[way] = server.state.requests - before
            made[way] = _outputs(tmp_path / way / "out")
    assert made["forced"] == made["plain"]
    assert calls["forced"] == calls["plain"] == (10 if command == "run" else 0)


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the Expander forks")
@pytest.mark.parametrize("command", ["rescore", "run"])
def test_a_forked_expander_reads_postgresql_as_judge_reads_it(
        command: str, tmp_path: Path, data_dir: Path, pg_url: str) -> None:
    """From PostgreSQL too (the children open connections of their own; the watchdog thread
    is ended before the fork and starts again after): the same reports and no calls, for a
    rescore and a fully cached run."""
    job = write_job(tmp_path / "job", REPEATED)
    env = {**clean_env(data_dir)}
    with ThreadedServer() as server:
        where = ["--limit", "40", "--base-url", server.url, "--model", "fake", "--cache",
                 pg_url]
        done = subprocess.run([sys.executable, "-c", FORCED, "plain", "run", str(job), *where,
                               "--out", str(tmp_path / "warmed"), "--yes"], env=env,
                              cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 0, done.stderr
        made, before = {}, server.state.requests
        for way in ("plain", "forced"):
            done = subprocess.run(
                [sys.executable, "-c", FORCED, way, command, str(job), *where, "--out",
                 str(tmp_path / way / "out"), *(["--yes"] if command == "run" else [])],
                env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                check=False)
            assert done.returncode == 0, done.stderr
            assert ("expander forked" in done.stderr) == (way == "forced"), done.stderr
            made[way] = _outputs(tmp_path / way / "out")
        assert server.state.requests == before  # every answer was in the cache
    assert made["forced"] == made["plain"]
    assert made["forced"]["counts"]["cache_hits"] > 0


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the Expander forks")
@pytest.mark.parametrize("dies", [0, 1])
def test_an_expander_whose_child_dies_is_finished_in_place(
        tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, dies: int) -> None:
    """One of a forked expander's children killed after the first batch (out of memory, say):
    the batches go on, expanded and read here, every task once and in order, with its
    answer."""
    _isolated(monkeypatch, data_dir)
    job, cache = write_job(tmp_path / "job", REPEATED), tmp_path / "cache"
    # 800 tasks in runs of 30: their replies (~200 KB) outgrow the pipes (64 KiB), so the
    # children cannot have sent them all before one is killed, and the rest must be read here
    monkeypatch.setattr(expand_ahead, "CHUNK", 30)
    monkeypatch.setattr(expand_ahead, "PIPE_SIZE", 0)
    sel = _called(job, cache, tmp_path / "out", data_dir, monkeypatch, limit=400)
    expected = list(sel.expansion.tasks())
    with Cache(cache) as c, Expander(c, sel.expansion, 3, len(expected)) as expander:
        stream = expander.batches()
        got = [next(stream)]
        os.kill(expander._children[dies].pid, signal.SIGKILL)
        got += list(stream)
        stored = c.get_many([t.key for t in expected])
    assert [t.key for batch, _ in got for t in batch] == [t.key for t in expected]
    assert [t.item_id for batch, _ in got for t in batch] == [t.item_id for t in expected]
    # what judging reads of each: the child sends only that, the reads here whole records
    # what judging reads of each, whether a child sent it (its usage as JSON text) or it was
    # read here (its usage a dict)
    read = {k: a._replace(usage=orjson.loads(orjson.dumps(a.usage)))
            for _, records in got for k, a in records.items()}
    assert read == {k: of_record(r) for k, r in stored.items()}
    assert any(isinstance(a.usage, dict) for _, records in got for a in records.values())
    assert len(stored) == 400  # one answer per item: the second prompt repeats the request


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the Expander forks")
@pytest.mark.parametrize("way", ["never read", "read in part"])
def test_an_expander_dropped_unfinished_stops_its_children(
        tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch, way: str) -> None:
    """judge() forks a large job's expanders when it is called, before anything reads them:
    a caller that fails before reading, or stops part-way, must not leave them running."""
    import gc

    from runner.expand_ahead import expanded
    monkeypatch.setenv("JUDGE_DATA_DIR", str(data_dir))
    monkeypatch.setattr(expand_ahead, "CHUNK", 30)
    monkeypatch.setattr(expand_ahead, "PIPE_SIZE", 0)  # children blocked on full pipes
    job, cache = write_job(tmp_path / "job", REPEATED), tmp_path / "cache"
    sel = select(TaskSelection(job=job, models=("fake",), base_url="http://127.0.0.1:9/v1",
                               limit=400, cache_dir=cache), data_dir=data_dir)
    pids = []
    real = expand_ahead.Forked

    def recorded(*args: Any, **kwargs: Any) -> Any:
        child = real(*args, **kwargs)
        pids.append(child.pid)
        return child

    monkeypatch.setattr(expand_ahead, "Forked", recorded)
    with Cache(cache) as c:
        monkeypatch.setattr(expand_ahead, "expander_pays", lambda *_: True)
        monkeypatch.setattr(expand_ahead, "forkable", lambda: True)
        reads = expanded(c, sel.expansion, 3, 800)
        assert len(pids) == 2 and all(_alive(p) for p in pids)  # forked by the call
        if way == "read in part":
            next(reads)
        del reads
        gc.collect()
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    """Whether `pid` is a child not yet reaped (a reaped one is gone; a zombie is not)."""
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


@pytest.mark.slow
def test_a_run_through_the_pool_leaves_the_key_index_for_the_rescore(
        tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose pool dispatched every task stores their keys as the index the forked
    expanders of its rescore read (runs of 4 tasks over two parts); a run stopped before the
    end stores none."""
    from runner.execute.store.keyindex import KeyIndex
    from runner.session import pool
    monkeypatch.setattr(reader_module, "MIN_TASKS", 1)
    monkeypatch.setattr(expand_ahead, "CHUNK", 4)
    monkeypatch.setattr(pool, "READ_BATCH", 2)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    _isolated(monkeypatch, data_dir)
    job, cache = write_job(tmp_path / "job", JOB), tmp_path / "cache"
    sel = _called(job, cache, tmp_path / "out", data_dir, monkeypatch, limit=15)
    keys = [t.key for t in sel.expansion.tasks()]
    assert len(keys) == 15
    for part in (0, 1):
        index = KeyIndex(cache, sel.expansion.fingerprint(), 4, part, 2, len(keys))
        assert list(index.keys() or ["missing"]) == [
            k for i, k in enumerate(keys) if i // 4 % 2 == part]

    with Cache(tmp_path / "other") as other:  # dispatch stopped after 3 tasks
        stream = expand_ahead.with_key_index(other, sel.expansion, 2, len(keys),
                                             sel.expansion.tasks())
        assert [t.key for t in itertools.islice(stream, 3)] == keys[:3]
        stream.close()
    assert list((tmp_path / "other" / "keys").iterdir()) == []


def test_a_first_run_starts_no_reader_and_hands_every_task_to_the_pool(
        tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing cached at the start: no forked expander or reader process is started (they were
    killed as soon as their first batch came back empty), and the pool gets every task."""
    monkeypatch.setattr(reader_module, "MIN_TASKS", 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    _isolated(monkeypatch, data_dir)

    def started(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a reader was started for an empty cache")

    monkeypatch.setattr(expand_ahead, "Expander", started)
    monkeypatch.setattr(expand_ahead, "answers", started)
    job = write_job(tmp_path / "job", JOB)
    sel = select(TaskSelection(job=job, models=("fake",), base_url="http://127.0.0.1:9/v1",
                               limit=40, cache_dir=tmp_path / "cache"), data_dir=data_dir)
    stats = RunStats()
    with Cache(tmp_path / "cache") as cache:
        first = judgments.CachedFirst(sel.expansion, cache, stats, count=40)
        assert list(first) == []
        assert first.uncached_onward is not None
        assert [t.key for t in first.uncached_onward] == [t.key for t in sel.expansion.tasks()]
    assert stats.cache_hits == 0 and len(first.hashes) == 0


@pytest.mark.parametrize("backend", ["folder", pytest.param("postgresql", marks=pytest.mark.slow)])
def test_a_cached_first_run_opens_its_cache_once(backend: str, tmp_path: Path, data_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 request: pytest.FixtureRequest) -> None:
    """Leased, a run that judges its cached tasks first, then pools the rest, reads and stores
    through the one cache its lease opened (Run.opened), as a pool-first run does: no second
    connection beside it."""
    _isolated(monkeypatch, data_dir)
    job = write_job(tmp_path / "job")
    where = (["--cache-dir", str(tmp_path / "cache")] if backend == "folder" else
             ["--cache", str(request.getfixturevalue("pg_url"))])
    opened: list[str] = []
    real = select_module.open_cache

    def counted(location: Any, **kwargs: Any) -> Any:
        opened.append(str(location))
        return real(location, **kwargs)

    def run(limit: int) -> Any:
        return CliRunner().invoke(cli_main.cli, [
            "run", str(job), "--limit", str(limit), "--base-url", server.url, "--model", "fake",
            *where, "--out", str(tmp_path / "out"), "--yes"], catch_exceptions=False)

    with ThreadedServer() as server:
        assert run(20).exit_code == 0
        monkeypatch.setattr(session_run, "CACHED_FIRST_TASKS", 1)
        monkeypatch.setattr(select_module, "open_cache", counted)
        done = run(40)
        assert done.exit_code == 0, done.output
        assert server.state.requests == 40  # 20, then the 20 items not cached yet: pooled
    assert opened == [where[1]]
    assert _outputs(tmp_path / "out")["counts"]["cache_hits"] == 20
