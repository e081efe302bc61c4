"""The answers' journal (runner/execute/store/journal.py) behind `Cache.append`: read at once, in
SQLite after a fold, kept through a kill -9 and folded by the next open, never touched while
its writer lives, read up to its last whole frame, and never half-written."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from runner.errors import CacheError
from runner.execute.store import cache as cache_module
from runner.execute.store import journal
from runner.execute.store.cache import Cache
from tests.conftest import ROOT
from tests.processes import DEADLINE_S, Child, Processes, processes_fixture  # noqa: F401


def _records(n: int, tag: str = "a") -> dict[str, dict[str, Any]]:
    return {f"{tag}{i:063d}": {"request": {"i": i}, "response": {"text": f"answer {i}"},
                               "source": "api"} for i in range(n)}


def _in_sqlite(folder: Path) -> int:
    """Rows in the folder's SQLite, read without the Cache (which would fold first)."""
    with sqlite3.connect(folder / "cache.db") as db:
        return int(db.execute("SELECT count(*) FROM Cache").fetchone()[0])


def _journals(folder: Path) -> list[Path]:
    return sorted((folder / journal.FOLDER).glob("*"))


def test_appended_answers_are_read_at_once_and_reach_sqlite_on_fold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "FOLD_S", 3600.0)
    records = _records(30)
    items = list(records.items())
    cache = Cache(tmp_path)
    assert cache.append(items[:10]) == 10 and cache.append(items[10:]) == 20
    (log,) = _journals(tmp_path)
    assert _in_sqlite(tmp_path) == 0 and log.stat().st_size > 30 * 60
    keys = list(records)
    assert cache.get_many(keys) == records and cache.has_many(keys + ["x" * 64]) == set(keys)
    assert keys[3] in cache and cache.get(keys[3]) == records[keys[3]]
    assert _in_sqlite(tmp_path) == 0  # read from the journal's rows, not folded
    cache.fold()
    assert _in_sqlite(tmp_path) == 30 and log.stat().st_size == 0
    assert cache.get_many(keys) == records and not cache._unfolded
    cache.append(_records(2, "b").items())
    assert f"b{1:063d}" in cache and cache.stats()["entries"] == 32  # stats folds first
    cache.close()
    assert _journals(tmp_path) == [] and _in_sqlite(tmp_path) == 32


def test_a_fold_comes_with_fold_rows_answers_or_after_fold_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "FOLD_ROWS", 8)
    monkeypatch.setattr(cache_module, "FOLD_S", 3600.0)
    items = list(_records(12).items())
    with Cache(tmp_path) as cache:
        cache.append(items[:7])
        assert _in_sqlite(tmp_path) == 0
        cache.append(items[7:9])
        assert _in_sqlite(tmp_path) == 9
        monkeypatch.setattr(cache_module, "FOLD_S", 0.0)
        cache.append(items[9:])
        assert _in_sqlite(tmp_path) == 12


def _children() -> list[int]:
    """The pids of this process's children still running."""
    mine = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                fields = stat.rsplit(")", 1)[1].split()
                if int(fields[1]) == os.getpid() and fields[0] != "Z":
                    mine.append(int(entry.name))
    return mine


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_a_run_folds_its_journal_itself_without_a_child_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Folding in a child process bought nothing as a whole `judge run` (0.77-0.99x, bench/
    README.md): the answers go into SQLite in this process, FOLD_ROWS a transaction."""
    monkeypatch.setattr(cache_module, "FOLD_ROWS", 300)
    monkeypatch.setattr(cache_module, "FOLD_S", 3600.0)
    records = _records(600)
    items = list(records.items())
    before = _children()
    with Cache(tmp_path) as cache:
        for start in range(0, 600, 10):
            cache.append(items[start:start + 10])
        assert _in_sqlite(tmp_path) == 600 and not cache._unfolded
        assert _children() == before
        (log,) = _journals(tmp_path)
        assert log.stat().st_size == 0  # emptied by the fold, kept open for the next turns
    assert _journals(tmp_path) == []
    with Cache(tmp_path) as again:
        assert again.get_many(list(records)) == records


def test_a_put_many_after_an_append_of_the_same_key_wins(tmp_path: Path) -> None:
    with Cache(tmp_path) as cache:
        cache.append([("k" * 64, {"n": 1})])
        cache.put_many([("k" * 64, {"n": 2})])
    with Cache(tmp_path) as again:
        assert again.get("k" * 64) == {"n": 2}


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from runner.execute.store import cache as cache_module
    from runner.execute.store.cache import Cache
    cache_module.FOLD_S = 3600.0
    cache = Cache(Path(sys.argv[1]))
    for i in range(5):
        cache.append([(f"w{i}{j:062d}", {"turn": i, "answer": j}) for j in range(10)])
    print("appended", flush=True)
    sys.stdin.read()  # until killed, or told to close
    cache.close()
""")


def _writer(folder: Path, processes: Processes) -> Child:
    proc = processes.start([sys.executable, "-c", WRITER, str(folder)], cwd=ROOT)
    proc.wait_for("appended", stream="out")
    return proc


@pytest.mark.slow
def test_a_live_writers_journal_is_left_alone_and_a_killed_ones_is_folded(
        tmp_path: Path, processes: Processes) -> None:
    keys = [f"w{i}{j:062d}" for i in range(5) for j in range(10)]
    proc = _writer(tmp_path, processes)
    (log,) = _journals(tmp_path)
    with Cache(tmp_path) as reader:  # the writer is alive: its answers are its own
        assert reader.has_many(keys) == set() and log.exists()
    proc.signal(signal.SIGKILL)
    assert proc.finish()[0] == -signal.SIGKILL and log.stat().st_size > 0
    with Cache(tmp_path) as after:
        records = after.get_many(keys)
    assert len(records) == 50 and records[keys[23]] == {"turn": 2, "answer": 3}
    assert _journals(tmp_path) == []


@pytest.mark.slow
def test_a_writer_that_closes_leaves_every_answer_in_sqlite_and_no_journal(
        tmp_path: Path, processes: Processes) -> None:
    proc = _writer(tmp_path, processes)
    assert proc.proc.stdin is not None
    proc.proc.stdin.close()
    assert proc.finish()[0] == 0, "".join(proc.err)
    assert _in_sqlite(tmp_path) == 50 and _journals(tmp_path) == []


def _frames(rows: list[tuple[str, bytes]]) -> list[bytes]:
    return [journal._framed([row]) for row in rows]


def test_a_journal_is_read_up_to_its_last_whole_and_sound_frame(tmp_path: Path) -> None:
    rows = [(key, orjson.dumps(record)) for key, record in _records(3).items()]
    one, two, three = _frames(rows)
    damaged = bytearray(two)
    damaged[-3] ^= 0xFF
    (tmp_path / journal.FOLDER).mkdir()
    (tmp_path / journal.FOLDER / "1-1.log").write_bytes(one + two + three[:-5])
    (tmp_path / journal.FOLDER / "2-2.log").write_bytes(three + bytes(damaged) + one)
    with Cache(tmp_path) as cache:
        assert cache.has_many([key for key, _ in rows]) == {rows[0][0], rows[1][0], rows[2][0]}
    assert journal.frames(one + two + three[:-5]) == rows[:2]
    assert journal.frames(three + bytes(damaged) + one) == rows[2:]
    assert journal.frames(b"") == [] and _journals(tmp_path) == []
    # Zeroed blocks (a machine crash) read as frames without a key: the journal ends there.
    assert journal.frames(one + bytes(4096) + two) == rows[:1]


def test_a_refused_write_raises_and_leaves_the_journal_as_it_was(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = list(_records(4, "a").items()), list(_records(4, "b").items())
    cache = Cache(tmp_path)
    cache.append(first)
    (log,) = _journals(tmp_path)
    size = log.stat().st_size
    real = os.write

    def full(fd: int, data: bytes) -> int:
        if fd == cache._journal._fd:  # type: ignore[union-attr]
            return real(fd, data[:len(data) // 2])  # a short write, as on a full disk
        return real(fd, data)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(CacheError, match="could not store 4 answers.*free space, then rerun"):
        cache.append(second)
    monkeypatch.setattr(os, "write", real)
    assert log.stat().st_size == size
    assert journal.frames(log.read_bytes()) == [(k, orjson.dumps(r)) for k, r in first]
    cache.close()
    with Cache(tmp_path) as again:
        assert again.has_many([k for k, _ in first + second]) == {k for k, _ in first}


def test_a_write_that_cannot_be_cut_back_stops_every_later_append(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = list(_records(6).items())
    cache = Cache(tmp_path)
    cache.append(records[:2])
    real_write, real_truncate = os.write, os.ftruncate
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:7]))
    monkeypatch.setattr(os, "ftruncate", lambda fd, size: (_ for _ in ()).throw(OSError(5, "EIO")))
    with pytest.raises(CacheError, match="short write"):
        cache.append(records[2:4])
    monkeypatch.setattr(os, "write", real_write)
    monkeypatch.setattr(os, "ftruncate", real_truncate)
    with pytest.raises(CacheError, match="an earlier write failed"):
        cache.append(records[4:])
    (log,) = _journals(tmp_path)
    assert journal.frames(log.read_bytes()) == [(k, orjson.dumps(r)) for k, r in records[:2]]
    cache.close()


def test_a_refused_fold_keeps_the_journal_for_the_next_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = _records(6)
    cache = Cache(tmp_path)

    def refuse(rows: object) -> int:
        raise CacheError(f"{tmp_path}: could not store answers (disk full)")

    monkeypatch.setattr(cache, "put_raw", refuse)
    monkeypatch.setattr(cache_module, "FOLD_S", 0.0)
    with pytest.raises(CacheError, match="disk full"):  # stored in the journal, not in SQLite
        cache.append(records.items())
    with pytest.raises(CacheError, match="disk full"):
        cache.fold()
    cache.close()  # does not raise: the answers are safe in the journal
    assert len(_journals(tmp_path)) == 1 and _in_sqlite(tmp_path) == 0
    with Cache(tmp_path) as again:
        assert again.get_many(list(records)) == records
    assert _journals(tmp_path) == []


def _appended(folder: Path, monkeypatch: pytest.MonkeyPatch, n: int
              ) -> tuple[Cache, dict[str, dict[str, Any]], Path]:
    """A Cache with `n` answers appended and not folded, and its journal."""
    monkeypatch.setattr(cache_module, "FOLD_S", 3600.0)
    records = _records(n)
    cache = Cache(folder)
    cache.append(records.items())
    (log,) = _journals(folder)
    return cache, records, log


@pytest.mark.slow
def test_a_forked_child_neither_folds_nor_removes_its_parents_journal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, records, log = _appended(tmp_path, monkeypatch, 5)
    assert cache._journal is not None
    pid = os.fork()
    if pid == 0:  # the child: open the folder, then fold and close the parent's journal
        code = 1
        try:
            with Cache(tmp_path) as own:
                seen = own.has_many(list(records))
            cache.fold()
            cache._journal.close(remove=True)
            code = 0 if not seen and log.exists() and _in_sqlite(tmp_path) == 0 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert log.exists() and _in_sqlite(tmp_path) == 0
    cache.close()
    assert _in_sqlite(tmp_path) == 5 and _journals(tmp_path) == []


def test_a_second_cache_in_the_same_process_leaves_the_first_ones_journal_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, _, log = _appended(tmp_path, monkeypatch, 4)
    Cache(tmp_path).close()
    assert log.exists() and log.stat().st_size > 0 and _in_sqlite(tmp_path) == 0
    first.close()
    assert _in_sqlite(tmp_path) == 4 and _journals(tmp_path) == []


def test_a_journal_made_but_never_named_is_removed_once_stale(tmp_path: Path) -> None:
    folder = tmp_path / journal.FOLDER
    folder.mkdir()
    stale, fresh = folder / "1-1.new", folder / "2-2.new"
    stale.write_bytes(b"")
    fresh.write_bytes(b"")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    Cache(tmp_path).close()
    assert not stale.exists() and fresh.exists()


def test_an_unwritable_journal_folder_is_a_one_line_cache_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        (tmp_path / journal.FOLDER).write_text("not a folder")  # root writes anywhere
    else:
        (tmp_path / journal.FOLDER).mkdir()
        (tmp_path / journal.FOLDER).chmod(0o500)
    with Cache(tmp_path) as cache, \
            pytest.raises(CacheError, match="cannot write the answers' journal") as err:
        cache.append([("k" * 64, {"n": 1})])
    assert "\n" not in str(err.value)


def test_a_spill_folder_another_user_could_write_is_neither_read_nor_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spill folder's name is easy to guess, and the temporary folder is shared: one that
    others may enter (as if another user had made it first) is passed over both ways."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    cache, rows = tmp_path / "cache", [("k1", orjson.dumps({"answer": 1}))]
    first = journal.spill(cache, rows)
    assert first.is_relative_to(tmp_path / "tmp")  # the temporary folder first, for a folder
    os.chmod(first.parent.parent, 0o777)  # the user's spill folder, open to anyone
    stored: list[Any] = []
    assert journal.recover(cache, stored.extend) == 0 and stored == [] and first.exists()
    second = journal.spill(cache, rows)  # not written there either: the next folder
    assert second.is_relative_to(tmp_path / "home")
    os.chmod(first.parent.parent, 0o700)
    assert journal.recover(cache, stored.extend) == 2 and stored == rows + rows
