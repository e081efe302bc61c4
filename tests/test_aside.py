"""Reports set aside to a forked child (runner.report.aside): the result or the exception comes
back, a child that dies is redone in place, and no fork happens where it is unsafe."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runner.children import forkable
from runner.report import aside as aside_module
from runner.report.aside import ForkedResult
from tests.conftest import ROOT
from tests.fakeserver import ThreadedServer
from tests.test_cli import clean_env, run_judge

linux_only = pytest.mark.skipif(not hasattr(os, "fork") or not Path("/proc/self").exists(),
                                reason="ForkedResult forks only on Linux")


@pytest.mark.slow
@linux_only
def test_the_child_is_named_by_its_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """The name a failing child's line starts with is the caller's, not one built in."""
    names = []
    real = aside_module.Forked

    def recorded(work: object, name: str, **kwargs: object) -> object:
        names.append(name)
        return real(work, name, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(aside_module, "Forked", recorded)
    assert ForkedResult(lambda: 7, name="scores.csv", fork=True).result() == 7
    assert names == ["scores.csv"]


@pytest.mark.slow
@linux_only
def test_the_child_computes_and_the_result_comes_back() -> None:
    parent = os.getpid()
    work = ForkedResult(lambda: {"pid": os.getpid(), "rows": [{"value": 0.5}] * 3}, fork=True)
    got = work.result()
    assert got["rows"] == [{"value": 0.5}] * 3
    assert got["pid"] != parent  # computed in the child


@pytest.mark.slow
@linux_only
def test_an_exception_in_the_child_is_raised_here() -> None:
    def fail() -> None:
        raise ValueError("bad table in child")

    with pytest.raises(ValueError, match="bad table in child"):
        ForkedResult(fail, fork=True).result()


@pytest.mark.slow
@linux_only
def test_a_child_that_dies_is_redone_in_place() -> None:
    parent = os.getpid()

    def die_in_child() -> int:
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
        return os.getpid()

    assert ForkedResult(die_in_child, fork=True).result() == parent


@pytest.mark.slow
@linux_only
def test_an_unpicklable_result_is_redone_in_place() -> None:
    parent = os.getpid()
    got = ForkedResult(lambda: (os.getpid(), lambda: None), fork=True).result()
    assert got[0] == parent


@pytest.mark.slow
@linux_only
def test_leaving_without_the_result_ends_the_child() -> None:
    """The caller failed before asking (a full disk writing scores.csv): the child is killed
    and reaped, not left running or as a zombie."""
    started = time.monotonic()
    with pytest.raises(OSError, match="disk full"):
        with ForkedResult(lambda: time.sleep(60), fork=True) as work:
            child = work._child.pid
            raise OSError("disk full")
    assert time.monotonic() - started < 10
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)  # already reaped


def test_without_a_fork_the_work_runs_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aside_module, "forkable", lambda: False)
    calls: list[int] = []
    work = ForkedResult(lambda: calls.append(os.getpid()) or len(calls))
    assert calls == []
    assert work.result() == 1 and calls == [os.getpid()]


def test_no_fork_while_another_thread_runs() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert not forkable()
    finally:
        stop.set()
        thread.join()


def _rows(path: Path) -> list[list[str | float]]:
    """A CSV's cells, numbers as floats (BLAS threads change their last bits)."""
    def cell(text: str) -> str | float:
        try:
            return float(text)
        except ValueError:
            return text
    return [[cell(c) for c in row] for row in csv.reader(path.read_text().splitlines())]


@linux_only
@pytest.mark.slow
def test_judge_writes_the_same_reliability_forked_or_not(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    """The real `judge` forks scores.csv and reliability.csv's rows (one thread:
    OPENBLAS_NUM_THREADS=1); with BLAS threads it cannot, and makes them in place. Same rows,
    and the same scores.csv bytes, either way."""
    job = ROOT / "jobs" / "summeval.toml"  # annotators: agreement and length rows
    where = ["--limit", "40", "--base-url", server.url, "--model", "fake", "--cache-dir",
             tmp_path / "cache"]
    ran = run_judge("run", job, *where, "--out", tmp_path / "ran", env=clean_env(data_dir),
                    cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    made, scores = {}, {}
    for threads in ("1", "2"):
        out = tmp_path / f"threads{threads}"
        done = run_judge("rescore", job, *where, "--out", out, cwd=tmp_path,
                         env=clean_env(data_dir, OPENBLAS_NUM_THREADS=threads))
        assert done.returncode == 0, done.stderr
        made[threads] = _rows(out / "reliability.csv")
        scores[threads] = (out / "scores.csv").read_bytes()
    assert scores["1"] == scores["2"] and scores["1"].count(b"\n") == 1 + 40 * 4
    assert not list(tmp_path.glob("threads*/.*.tmp"))
    assert len(made["1"]) > 20
    assert len(made["1"]) == len(made["2"])
    for forked, in_place in zip(made["1"], made["2"], strict=True):
        assert [c if isinstance(c, str) else pytest.approx(c, rel=1e-12, nan_ok=True)
                for c in forked] == in_place


@pytest.mark.slow
@linux_only
def test_no_fork_without_memory_for_a_copy_of_the_process() -> None:
    """A fresh interpreter (one thread) may fork; told that only its own resident size is
    available (less than twice it), it may not."""
    script = ("import runner.children as a\nprint(a.forkable())\nreal = a._fields\n"
              "def low(path):\n    got = real(path)\n"
              "    if path == '/proc/meminfo':\n"
              "        got['MemAvailable'] = real('/proc/self/status')['VmRSS']\n"
              "    return got\n"
              "a._fields = low\nprint(a.forkable())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"]


def test_scores_written_aside_overwrite_what_a_dead_child_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child that died part-way through scores.csv leaves part of it in the file: the work
    done again in place (runner.report.write._set_aside) writes the file from its start."""
    import io
    import types

    from runner.reduce.cells import CellBuilder
    from runner.report import write
    from tests.test_report import _judgment

    expansion = types.SimpleNamespace(items={}, job=types.SimpleNamespace(prompts=[]))
    builder = CellBuilder(expansion)  # type: ignore[arg-type]
    for i in range(3):
        j = _judgment(i, float(i), 2.0)
        builder.add(j.task.dataset, j.item, (j.task.prompt, j.task.aspect, j.task.model),
                    j.score, None)
    tables = write.Tables(builder.finish())
    whole = io.BytesIO()
    write.scores_csv(tables, whole)
    monkeypatch.setattr(write, "reliability_rows", lambda *_: [{"rows": "computed"}])
    with open(tmp_path / "scores.csv", "wb") as f:
        f.write(b"dataset,item_id,group,a half-written row from a child that died" * 20)
        rows = write._set_aside(None, tables, None, f)  # type: ignore[arg-type]
    assert (tmp_path / "scores.csv").read_bytes() == whole.getvalue()
    assert rows == [{"rows": "computed"}]
