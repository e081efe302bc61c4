"""The cache reader process (runner.execute.store.reader): the same answers as reading the cache
directly, in order, for every kind of record; a child that fails or dies is a CacheError naming
why, never a hang or a silent gap; and a rescore through it writes the same reports."""

from __future__ import annotations

import gc
import hashlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.cli.main import cli
from runner.errors import CacheError
from runner.execute.store import backend
from runner.execute.store import reader as reader_module
from runner.execute.store.answers import Answer, of_record, received, sent, sent_of_raw
from runner.execute.store.backend import answers, cached_flags
from runner.execute.store.cache import Cache
from runner.execute.store.reader import Reader, reader_pays
from tests.conftest import DATA_DIR, ROOT
from tests.fakeserver import ThreadedServer
from tests.processes import Processes, processes_fixture, wait_until  # noqa: F401


def _same(got: dict[str, Answer]) -> dict[str, Answer]:
    """Answers comparable with ==: a usage sent as JSON text (an orjson.Fragment) decoded."""
    return {k: a._replace(usage=orjson.loads(orjson.dumps(a.usage))) for k, a in got.items()}


def _key(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def _record(n: int, text: str = "") -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": text or f"{n} stars"}}
    choices = [choice]
    if n % 5 == 0:  # several samples, one with logprobs
        choices = [choice, {"index": 1, "finish_reason": "length",
                            "logprobs": {"content": [{"token": "4", "logprob": -0.1}]},
                            "message": {"role": "assistant", "content": "4"}}]
    return {"request": {"model": "m", "messages": [{"role": "user", "content": f"q{n}"}]},
            "endpoint": "http://127.0.0.1:1/v1",
            "response": {"id": f"c{n}", "model": "m", "choices": choices},
            "usage": {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1},
            "latency_s": 0.1, "time": 1.0, "source": "api" if n % 3 else f"import:{n}.jsonl"}


@pytest.fixture
def filled(tmp_path: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    """A cache with every third of 600 keys missing, and one record kept as a file."""
    stored = {_key(n): _record(n) for n in range(600) if n % 3 != 1}
    stored[_key(0)] = _record(0, "x" * 100_000)  # over diskcache's 32 KiB: stored as a file
    with Cache(tmp_path / "cache") as cache:
        cache.put_many(stored.items())
    return tmp_path / "cache", stored


@pytest.mark.slow
def test_batches_come_back_in_order_with_what_judging_reads(
        filled: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    folder, stored = filled
    asked = [_key(n) for n in range(600)]
    batches = [asked[i:i + 7] for i in range(0, len(asked), 7)]  # many more than DEPTH
    with Reader(folder) as reader:
        got = list(reader.batches(iter(batches), lambda k: k))
    assert [b for b, _ in got] == batches
    for batch, records in got:
        assert _same(records) == {k: of_record(stored[k]) for k in batch if k in stored}
    assert records[_key(597)].text == "597 stars" and records[_key(597)].choices is None
    several = of_record(stored[_key(0)]).choices  # two choices: read as they are
    assert several is not None and several[0]["message"]["content"] == "x" * 100_000
    assert several[1]["logprobs"] is not None
    # on the pipe, one plain choice: [text, finish_reason, usage as JSON text, source, time,
    # tokens by kind (input, cached input, cache write, output)]
    assert sent(stored[_key(2)]) == [
        "2 stars", "stop", '{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}', "api",
        stored[_key(2)].get("time"), 2, 0, 0, 1]


@pytest.mark.slow
def test_answers_reads_through_the_reader_only_when_it_pays(
        filled: tuple[Path, dict[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    folder, stored = filled
    asked = [_key(n) for n in range(600)]
    with Cache(folder) as cache:
        direct = list(answers(cache, asked, lambda k: k, 64, len(asked)))
        assert direct[0][1] == {k: of_record(r) for k, r in cache.get_many(asked[:64]).items()}
        monkeypatch.setattr(reader_module, "MIN_TASKS", 100)
        monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
        through = list(answers(cache, asked, lambda k: k, 64, len(asked)))
    assert [b for b, _ in through] == [b for b, _ in direct]
    assert [_same(r) for _, r in through] == [r for _, r in direct]


@pytest.mark.slow
def test_cached_flags_looks_up_through_the_reader_once_the_job_is_large(
        filled: tuple[Path, dict[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The first MIN_TASKS things are looked up here, the rest by a reader process: every
    thing comes back once, in order, marked as has_many marks it."""
    folder, stored = filled
    things = [(n, _key(n)) for n in range(600)] + [(n, _key(n)) for n in range(0, 600, 4)]
    monkeypatch.setattr(backend, "LOOKUP_BATCH", 16)
    monkeypatch.setattr(reader_module, "MIN_TASKS", 100)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    started: list[Path] = []
    real = backend.Reader

    def counted(directory: Path, here: Cache | None = None) -> Reader:
        started.append(directory)
        return real(directory, here)

    monkeypatch.setattr(backend, "Reader", counted)
    with Cache(folder) as cache:
        got = list(cached_flags(cache, things, lambda t: t[1]))
        assert started == [folder]
        assert got == [(t, t[1] in stored) for t in things]
        assert sum(flag for _, flag in got) == len(stored) + sum(
            _key(n) in stored for n in range(0, 600, 4))
        assert list(cached_flags(cache, things[:112], lambda t: t[1])) == got[:112]
        assert started == [folder]  # 112 things: asked here, no process started for nothing


@pytest.mark.slow
def test_answers_starts_its_reader_when_called_and_ends_it_if_never_read(
        filled: tuple[Path, dict[str, dict[str, Any]]], monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader process starts with the call, so that it starts while the caller goes on
    (a run's reports import their modules); an iterator dropped unread ends it all the same."""
    folder, _ = filled
    asked = [_key(n) for n in range(600)]
    monkeypatch.setattr(reader_module, "MIN_TASKS", 100)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    started: list[Reader] = []
    real = backend.Reader

    def counted(directory: Path, here: Cache | None = None) -> Reader:
        started.append(real(directory, here))
        return started[-1]

    monkeypatch.setattr(backend, "Reader", counted)
    with Cache(folder) as cache:
        read = answers(cache, asked, lambda k: k, 64, len(asked))
        assert len(started) == 1  # before any batch was asked for
        process = started[0]._child.process
        del read
        gc.collect()
        wait_until(lambda: process.poll() is not None, "the unread reader to end")


@pytest.mark.slow
def test_the_pools_lookups_start_no_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    """The pool looks keys up itself: a reader process started mid-run blocked its event loop
    while it started (its first keys waiting in a full pipe)."""
    monkeypatch.setenv("JUDGE_DATA_DIR", str(DATA_DIR))
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "JUDGE_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(backend, "LOOKUP_BATCH", 4)
    monkeypatch.setattr(reader_module, "MIN_TASKS", 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    looked_up: list[int] = []
    real = Reader.marks

    def marks(self: Reader, *args: Any) -> Any:
        looked_up.append(1)
        return real(self, *args)

    monkeypatch.setattr(Reader, "marks", marks)
    job = ROOT / "jobs" / "openmeva.toml"
    with ThreadedServer() as server:
        ran = CliRunner().invoke(cli, ["run", str(job), "--limit", "30", "--cache-dir",
                                       str(tmp_path / "cache"), "--base-url", server.url,
                                       "--model", "fake", "--out", str(tmp_path / "out"),
                                       "--yes"], catch_exceptions=False)
        assert ran.exit_code == 0, ran.output
        assert server.state.requests >= 30
    assert looked_up == []


def test_reader_pays_needs_a_folder_cache_a_large_job_and_two_cores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    with Cache(tmp_path / "cache") as cache:
        assert reader_pays(cache, reader_module.MIN_TASKS)
        assert not reader_pays(cache, reader_module.MIN_TASKS - 1)
        assert not reader_pays(object(), 10**7)  # another backend (PostgreSQL): read directly
        monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0}, raising=False)
        assert not reader_pays(cache, 10**7)


@pytest.mark.slow
def test_a_runner_package_in_the_current_folder_does_not_shadow_ours(
        filled: tuple[Path, dict[str, dict[str, Any]]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m` would put the current folder first on sys.path: a study folder with its
    own `runner` package must not replace judge-runner's in the reader."""
    folder, stored = filled
    decoy = tmp_path / "study" / "runner"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the study folder\'s own runner')\n")
    monkeypatch.chdir(decoy.parent)
    with Reader(folder) as reader:
        got = list(reader.batches(iter([[_key(2), _key(1)]]), lambda k: k))
    assert [(b, _same(r)) for b, r in got] == [([_key(2), _key(1)],
                                                {_key(2): of_record(stored[_key(2)])})]


@pytest.mark.slow
def test_a_child_that_cannot_open_the_cache_says_why(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with Reader(blocker / "cache") as reader, pytest.raises(
            CacheError, match=r"reader process stopped \(CacheError: .*cannot open the cache"):
        list(reader.batches(iter([[_key(1)]]), lambda k: k))


@pytest.mark.slow
def test_a_killed_child_is_an_error_not_a_hang_or_a_gap(
        filled: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    folder, _ = filled
    batches = iter([[_key(n)] for n in range(100)])
    with Reader(folder) as reader:
        stream = reader.batches(batches, lambda k: k)
        next(stream)
        reader._child.process.kill()
        with pytest.raises(CacheError, match="reader process stopped"):
            list(stream)


@pytest.mark.slow
def test_leaving_early_ends_the_child(filled: tuple[Path, dict[str, dict[str, Any]]]) -> None:
    """Replies the parent never reads fill the pipe; closing must still end the child at once
    (its blocked write fails), not after the 10 s it is given before a kill."""
    folder, _ = filled
    reader = Reader(folder)
    stream = reader.batches(iter([[_key(n)] * 400 for n in range(50)]), lambda k: k)
    next(stream)
    stream.close()
    started = time.monotonic()
    reader.close()
    assert time.monotonic() - started < 5
    assert reader._child.process.returncode in (0, 1)  # ended itself: not killed (-9)


@pytest.mark.slow
def test_rescore_through_the_reader_writes_the_same_reports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = ROOT / "jobs" / "openmeva.toml"
    monkeypatch.setenv("JUDGE_DATA_DIR", str(DATA_DIR))
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "JUDGE_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    where = ["--limit", "30", "--cache-dir", str(tmp_path / "cache")]
    with ThreadedServer() as server:
        ran = CliRunner().invoke(cli, ["run", str(job), *where, "--base-url", server.url,
                                       "--model", "fake", "--out", str(tmp_path / "ran"),
                                       "--yes"], catch_exceptions=False)
        assert ran.exit_code == 0, ran.output
        called, made = server.state.requests, {}
        for name, minimum in (("direct", 10**9), ("reader", 1)):
            monkeypatch.setattr(reader_module, "MIN_TASKS", minimum)
            monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
            out = tmp_path / name
            done = CliRunner().invoke(cli, ["rescore", str(job), *where, "--model", "fake",
                                            "--base-url", server.url, "--out", str(out)],
                                      catch_exceptions=False)
            assert done.exit_code == 0, done.output
            made[name] = {f.name: f.read_bytes() for f in out.iterdir()
                          if f.suffix in {".csv", ".jsonl"}}
        assert server.state.requests == called > 0  # rescoring calls nothing
    assert made["reader"] == made["direct"]
    assert len(made["reader"]["judgments.jsonl"].splitlines()) >= 30


def _running(pid: int) -> bool:
    """Whether `pid` is alive (a zombie nobody has reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_reader_does_not_outlive_a_killed_parent(
        filled: tuple[Path, dict[str, dict[str, Any]]], processes: Processes) -> None:
    """kill -9 of `judge` leaves no reader behind: EOF on its stdin ends it."""
    folder, _ = filled
    parent = processes.start(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from runner.execute.store.reader import Reader\nreader = Reader(Path(sys.argv[1]))\n"
         "print(reader._child.process.pid, flush=True)\ntime.sleep(60)\n", str(folder)], cwd=ROOT)
    child = processes.adopt(int(parent.wait_for("", stream="out")))  # killed if it outlives
    assert _running(child)
    parent.signal(signal.SIGKILL)
    parent.finish()
    wait_until(lambda: not _running(child), "the reader ending after its parent's kill")


_text = st.text(alphabet=st.sampled_from('ab",:{}[]\\\\ \n\u00e9response'), max_size=20)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["response", "usage", "source", "content", "x"]) | _text, inner,
        max_size=3),
    max_leaves=12)


_choice = st.fixed_dictionaries({}, optional={
    "index": st.integers(0, 2), "finish_reason": st.none() | st.sampled_from(["stop", "length"]),
    "logprobs": st.none() | st.just({}) | st.just({"content": [
        {"token": "4", "logprob": -0.1,
         "top_logprobs": [{"token": "4", "logprob": -0.1}, {"token": "3", "logprob": -2.3}]}]}),
    "message": st.none() | _text | st.fixed_dictionaries({}, optional={
        "role": st.just("assistant"),
        "content": st.none() | _text | st.sampled_from(["4 stars", "", "Rating: 3"])
        | st.lists(_text, max_size=2)})})


@st.composite
def _records(draw: st.DrawFn) -> dict[str, Any]:
    """Records in answer_record's key order or shuffled, with fields missing, and "response"
    keys and look-alike text nested anywhere (the request, the response, values after it);
    the choices of the usual shapes (one or two, with and without logprobs, a message or
    none, text or other content) or anything."""
    response = draw(st.dictionaries(st.sampled_from(["choices", "id", "response", "x"]), _json,
                                    max_size=3))
    if draw(st.booleans()):
        response["choices"] = draw(st.lists(_choice, min_size=1, max_size=2))
    fields = {"request": draw(_json), "endpoint": draw(_text), "response": response,
              "usage": draw(_json), "latency_s": 0.5, "time": 1.0, "source": draw(_text),
              "replica": draw(_json)}
    names = [n for n in fields if n == "response" or draw(st.booleans())]
    if draw(st.booleans()):
        names = draw(st.permutations(names))
    return {n: fields[n] for n in names}


@settings(max_examples=400, deadline=None)
@given(_records())
def test_answer_of_the_stored_bytes_is_the_answer_of_the_whole_record(
        record: dict[str, Any]) -> None:
    """The reader decodes only a record's end when that is safe: it must give what decoding
    the whole record gives, for any record."""
    assert sent_of_raw(orjson.dumps(record)) == sent(record)


def _line(answer: Callable[[], Answer], parser: str) -> bytes | str:
    """The judgments.jsonl line of one task whose Answer `answer()` makes (of a record, or
    of what a reader sent of it) judged with `parser`, or the error that raised."""
    from runner.data.datasets import Item
    from runner.job.spec import PromptSpec
    from runner.reduce.judgments import _Context
    from runner.report.tables import _judgment_line
    from runner.tasks import new_task

    prompt = PromptSpec(name="p", templates={"*": "rate"}, system=None, parser=parser,
                        parser_options={}, aspects=("a",), datasets=(), params={})
    item = Item(dataset="d", item_id="i", group="g", system="s", subset="", fields={},
                human={"a": 3.0}, annotators={}, metrics={})
    task = new_task(key=_key(1), dataset="d", item_id="i", prompt="p", aspect="a", model="m",
                    sample=0, body=b"", prompt_tokens=0, max_tokens=0)
    context = _Context(None, {"p": prompt}, {}, {}, frozenset())  # type: ignore[arg-type]
    try:
        return _judgment_line(context.parsed(task, item, answer(), None))
    except Exception as exc:  # judged the same way, it fails the same way
        return type(exc).__name__


@settings(max_examples=400, deadline=None)
@given(_records(), st.sampled_from(["stars", "logprob"]))
def test_judging_a_readers_answer_is_judging_the_record(record: dict[str, Any],
                                                        parser: str) -> None:
    """A reader sends a plain answer as a list and its usage as JSON text: the judgment line
    must be the one judging the whole record gives, byte for byte."""
    piped = orjson.loads(orjson.dumps(sent_of_raw(orjson.dumps(record))))  # through the pipe
    assert _line(lambda: received(piped), parser) == _line(lambda: of_record(record), parser)
