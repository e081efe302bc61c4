"""The key index (runner.execute.store.keyindex): a job's keys kept in its cache folder, found only
under the fingerprint of everything that decides them (Expansion.fingerprint), so that a
rescore of a job read before renders nothing, and an edited job never reads a stale index."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runner import expand_ahead
from runner.execute.store.cache import Cache
from runner.execute.store.keyindex import DIGEST, KEEP, TID, KeyIndex, part_size, recorded_parts
from runner.execute.store.pgcache import NOWHERE, PgCache
from runner.expand import Expansion
from runner.expand_ahead import expanded
from runner.job.load import load_job
from runner.prepare import prepare
from tests.conftest import ROOT, JobWriter
from tests.test_expand import JOB, ROWS, TEMPLATE


def _expand(write_job: JobWriter, toml: str = JOB, rows: list[dict[str, Any]] = ROWS,
            template: str = TEMPLATE) -> Expansion:
    path = write_job(toml, rows=rows, files={"prompt.txt": template})
    return prepare(load_job(path), ROOT)


@pytest.mark.parametrize("parts", [1, 2, 3])
@pytest.mark.parametrize("run", [1, 4, 7])
@pytest.mark.parametrize("count", [0, 1, 6, 7, 8, 29, 30])
def test_part_size_counts_the_tasks_of_each_part(count: int, run: int, parts: int) -> None:
    runs = [range(i, min(i + run, count)) for i in range(0, count, run)]
    for part in range(parts):
        assert part_size(count, run, part, parts) == sum(len(r) for r in runs[part::parts])


def _keys(n: int) -> list[str]:
    return [f"{i:064x}" for i in range(n)]


def test_an_index_is_stored_once_every_key_went_by(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, "f" * 64, 4, 0, 2, 10)  # part 0 of 10 tasks in runs of 4: 6
    assert index.keys() is None
    assert list(index.recorded(iter(_keys(6)))) == _keys(6)
    assert index.path.stat().st_size == 6 * DIGEST
    assert list(index.keys() or []) == _keys(6)
    assert [p.name for p in index.path.parent.iterdir()] == [index.path.name]  # no temp left


@pytest.mark.parametrize("how", ["stopped early", "too few", "too many"])
def test_an_incomplete_index_is_not_stored(tmp_path: Path, how: str) -> None:
    index = KeyIndex(tmp_path, "f" * 64, 4, 0, 2, 10)
    keys = {"stopped early": _keys(6), "too few": _keys(5), "too many": _keys(7)}[how]
    stream = index.recorded(iter(keys))
    got = [next(stream) for _ in range(3)] if how == "stopped early" else list(stream)
    stream.close()
    assert got == keys[:len(got)]
    assert index.keys() is None
    assert list(index.path.parent.iterdir()) == []


def test_an_index_of_the_wrong_size_is_ignored(tmp_path: Path) -> None:
    index = KeyIndex(tmp_path, "f" * 64, 4, 0, 2, 10)
    index.path.parent.mkdir()
    index.path.write_bytes(b"\0" * (5 * DIGEST))  # a truncated file
    assert index.keys() is None
    assert list(index.recorded(iter(_keys(6)))) == _keys(6)  # replaced
    assert list(index.keys() or []) == _keys(6)


def test_a_folder_it_cannot_write_only_means_no_index(tmp_path: Path) -> None:
    (tmp_path / "keys").write_text("a file where the folder would be")
    index = KeyIndex(tmp_path, "f" * 64, 4, 0, 1, 6)
    assert list(index.recorded(iter(_keys(6)))) == _keys(6)
    assert index.keys() is None


def test_the_newest_indexes_are_kept(tmp_path: Path) -> None:
    for n in range(KEEP + 3):
        index = KeyIndex(tmp_path, f"{n:064x}", 4, 0, 1, 2)
        list(index.recorded(iter(_keys(2))))
        os.utime(index.path, ns=(n * 10**9, n * 10**9))
    left = sorted(p.name[:64] for p in (tmp_path / "keys").iterdir())
    assert left == [f"{n:064x}" for n in range(3, KEEP + 3)]


def test_the_fingerprint_follows_what_decides_the_keys(write_job: JobWriter) -> None:
    base = _expand(write_job)
    same = base.fingerprint()
    assert _expand(write_job).fingerprint() == same
    # a parser or its options: the same requests, the same keys, the same fingerprint
    assert _expand(write_job, JOB.replace('parser = "number"', 'parser = "stars"')
                   ).fingerprint() == same
    changed = {
        "template": _expand(write_job, template=TEMPLATE + "Be brief.\n"),
        "system prompt": _expand(write_job, JOB.replace("You judge", "You rate")),
        "field": _expand(write_job, rows=[{**ROWS[0], "output": "other"}, *ROWS[1:]]),
        "item order": _expand(write_job, rows=ROWS[::-1]),
        "fewer items": _expand(write_job, rows=ROWS[:2]),
        "model": _expand(write_job, JOB.replace("127.0.0.1:9002", "127.0.0.1:9003")),
        "param": _expand(write_job, JOB.replace("top_p = 0.5", "top_p = 0.6")),
        "samples": _expand(write_job, JOB.replace("samples = 2", "samples = 3")),
    }
    for what, expansion in changed.items():
        assert expansion.fingerprint() != same, what
        assert [t.key for t in expansion.tasks()] != [t.key for t in base.tasks()], what


@pytest.mark.slow
def test_the_fingerprint_is_the_same_in_another_process(write_job: JobWriter) -> None:
    expansion = _expand(write_job)
    code = ("import sys; from runner.prepare import prepare; from runner.job.load import load_job;"
            "from pathlib import Path; print(prepare(load_job(Path(sys.argv[1])), "
            "Path(sys.argv[2])).fingerprint())")
    done = subprocess.run([sys.executable, "-c", code, str(expansion.job.path), str(ROOT)],
                          capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == expansion.fingerprint()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the Expander forks")
def test_a_rescore_reads_the_index_and_an_edited_job_does_not(
        write_job: JobWriter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real forked expander: the first read renders and stores the index; the second
    reads it (rendering is broken in the children, and every answer still comes from them);
    after an edit of one item's text, its tasks get their new keys, without answers."""
    monkeypatch.setattr(expand_ahead, "expander_pays", lambda *_: True)
    monkeypatch.setattr(expand_ahead, "forkable", lambda: True)
    monkeypatch.setattr(expand_ahead, "CHUNK", 4)  # runs of 2 batches of 2: both children
    first = _expand(write_job)
    keys = [t.key for t in first.tasks()]
    record = {"response": {"choices": [{"message": {"content": "4 stars"},
                                        "finish_reason": "stop"}]}, "usage": None,
              "source": "api"}
    with Cache(tmp_path / "cache") as cache:
        cache.put_many((k, record) for k in keys)

        def read(expansion: Expansion) -> tuple[list[str], list[Any]]:
            got = list(expanded(cache, expansion, 2, expansion.count()))
            return ([t.key for batch, _ in got for t in batch],
                    [(a.text, a.finish_reason, a.source) for _, answers in got
                     for a in answers.values()])

        assert read(first) == (keys, [("4 stars", "stop", "api")] * len(keys))
        stored = sorted(p.name for p in (tmp_path / "cache" / "keys").iterdir())
        assert stored == [f"{first.fingerprint()}-4-{part}of2" for part in (0, 1)]

        def broken(*args: Any) -> Any:
            raise AssertionError("rendered although the keys are in the index")

        def not_here(*args: Any) -> Any:
            raise AssertionError("read here: a child failed")

        with monkeypatch.context() as m:
            m.setattr(Expansion, "part", broken)  # in the forked children too
            m.setattr(expand_ahead, "read_here", not_here)  # the children's answers, all
            again = read(first)
        assert again == (keys, [("4 stars", "stop", "api")] * len(keys))

        edited = _expand(write_job, rows=[{**ROWS[0], "output": "edited"}, *ROWS[1:]])
        new_keys = [t.key for t in edited.tasks()]
        got_keys, answers = read(edited)
        assert got_keys == new_keys != keys
        changed = {k for k, t in zip(new_keys, edited.tasks(), strict=True) if t.item_id == "a"}
        assert changed.isdisjoint(keys)
        assert len(answers) == len(keys) - len(changed)  # item a's tasks: no answer
        assert len(list((tmp_path / "cache" / "keys").iterdir())) == 4


@pytest.mark.parametrize("given", [9, 10, 11])
def test_every_part_is_stored_from_the_whole_stream_or_none(tmp_path: Path, given: int) -> None:
    """recorded_parts (a pool's dispatch): each part's keys in its own file, the same a child
    of that part would store; none if the stream is not exactly the `count` expected."""
    keys = _keys(given)
    out = list(recorded_parts(tmp_path, "f" * 64, 3, 2, 10, keys, lambda k: k))
    assert out == keys
    parts = [KeyIndex(tmp_path, "f" * 64, 3, part, 2, 10) for part in (0, 1)]
    if given != 10:
        assert [p.keys() for p in parts] == [None, None]
        assert list((tmp_path / "keys").iterdir()) == []
        return
    runs = [keys[i:i + 3] for i in range(0, 10, 3)]
    for part, index in enumerate(parts):
        assert list(index.keys() or []) == [k for run in runs[part::2] for k in run]


def test_a_disk_that_fails_mid_way_passes_every_key_through(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails (a full disk) ends the index, not the stream: the pool still
    dispatches every task, and no index or temporary file is left."""
    from runner.execute.store import keyindex

    class Full:
        def __init__(self, path: Path, mode: str) -> None:
            self.f, self.writes = open(path, mode), 0  # noqa: SIM115

        def write(self, data: bytes) -> int:
            self.writes += 1
            if self.writes > 2:
                raise OSError(28, "No space left on device")
            return self.f.write(data)

        def close(self) -> None:
            self.f.close()

    monkeypatch.setattr(keyindex, "open", Full, raising=False)
    assert list(recorded_parts(tmp_path, "f" * 64, 3, 2, 10, _keys(10), lambda k: k)) == _keys(10)
    index = KeyIndex(tmp_path, "f" * 64, 4, 0, 1, 6)
    assert list(index.recorded(iter(_keys(6)))) == _keys(6)
    assert list((tmp_path / "keys").iterdir()) == []


@pytest.mark.parametrize("missing", [1, 2])
def test_a_located_index_is_kept_with_at_most_one_key_in_a_hundred_unstored(
        tmp_path: Path, missing: int) -> None:
    index = KeyIndex(tmp_path, "f" * 64, 100, 0, 1, 100, located=True)
    entries = [(k, NOWHERE if n < missing else n.to_bytes(TID, "big"))
               for n, k in enumerate(_keys(100))]
    assert list(index.recorded_located(iter(entries), NOWHERE)) == entries
    assert list(index.located() or []) == (entries if missing == 1 else [])
    assert list(index.keys() or []) == (_keys(100) if missing == 1 else [])


def _pg_record(n: int) -> dict[str, Any]:
    return {"response": {"choices": [{"message": {"content": f"{n} stars"},
                                      "finish_reason": "stop"}]}, "usage": None,
            "source": "api"}


@pytest.mark.slow
def test_rows_read_at_their_places_are_the_rows_of_their_keys(pg_url: str) -> None:
    """PostgreSQL's reads by place: the same records as by key, also where a place is stale
    (the row deleted and stored again elsewhere, or another key's row there) or none; and a
    rewritten table is another index folder."""
    keys = _keys(60)
    with PgCache(pg_url) as cache:
        cache.put_many((k, _pg_record(n)) for n, k in enumerate(keys[:50]))  # 50-59: none
        by_key = cache.get_many_raw(keys)
        records, places = cache.get_many_raw_located(keys)
        assert records == by_key and len(by_key) == 50 and set(places) == set(keys[:50])
        assert all(len(p) == TID and p != NOWHERE for p in places.values())
        at = [places.get(k, NOWHERE) for k in keys]
        assert cache.get_many_raw_at(keys, at) == (by_key, 0)
        # keys 0-9 deleted and stored again (new places); 10's place names 11's row; 50 is
        # stored now, after the index was made without it
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DELETE FROM judge_cache WHERE key = ANY(%s)", (keys[:10],))
        cache.put_many((k, _pg_record(100 + n)) for n, k in enumerate(keys[:10]))
        cache.put(keys[50], _pg_record(50))
        stale = [*at[:10], at[11], *at[11:]]
        assert stale[10] == places[keys[11]]
        now = cache.get_many_raw(keys)
        assert len(now) == 51 and now[keys[0]] != by_key[keys[0]]
        assert cache.get_many_raw_at(keys, stale) == (now, 12)  # 0-10 and 50 read by key
        # key 20's place names key 11's row, which is not asked for: not in the answer
        asked = keys[20:30]
        assert cache.get_many_raw_at(asked, [places[keys[11]], *at[21:30]]) == (
            {k: now[k] for k in asked}, 1)
        folder = cache.index_folder()
        assert folder.parent == Path(os.environ["XDG_CACHE_HOME"]) / "judge-runner" / "postgresql"
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("VACUUM FULL judge_cache")
        assert cache.index_folder() != folder
        assert cache.get_many_raw_at(keys, stale)[0] == now


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the Expander forks")
def test_a_rescore_from_postgresql_reads_by_place_the_second_time(
        write_job: JobWriter, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real forked expander on PostgreSQL: the first read renders, reads by key and
    stores the located index in this machine's folder; the second renders nothing and reads
    every answer by place (no read by key at all); after an edit, the new keys are read by
    key again."""
    monkeypatch.setattr(expand_ahead, "expander_pays", lambda *_: True)
    monkeypatch.setattr(expand_ahead, "forkable", lambda: True)
    monkeypatch.setattr(expand_ahead, "CHUNK", 4)  # runs of 2 batches of 2: both children
    first = _expand(write_job)
    keys = [t.key for t in first.tasks()]
    with PgCache(pg_url) as cache:

        def read(expansion: Expansion) -> tuple[list[str], list[str]]:
            got = list(expanded(cache, expansion, 2, expansion.count()))
            return ([t.key for batch, _ in got for t in batch],
                    [answers[t.key].text for batch, answers in got for t in batch
                     if t.key in answers])

        texts = [f"{n} stars" for n in range(len(keys))]
        cache.put_many((k, _pg_record(n)) for n, k in enumerate(keys) if n % 2)
        assert read(first) == (keys, texts[1::2])  # half the job stored: no index kept
        assert not list((cache.index_folder() / "keys").glob("*-located"))
        cache.put_many((k, _pg_record(n)) for n, k in enumerate(keys))
        assert read(first) == (keys, texts)
        stored = sorted(p.name for p in (cache.index_folder() / "keys").iterdir())
        assert stored == [f"{first.fingerprint()}-4-{part}of2-located" for part in (0, 1)]

        def broken(*args: Any) -> Any:
            raise AssertionError("rendered or read by key although the index is stored")

        with monkeypatch.context() as m:
            m.setattr(Expansion, "part", broken)  # in the forked children too
            m.setattr(PgCache, "get_many_raw", broken)
            m.setattr(expand_ahead, "read_here", broken)  # the children's answers, all
            assert read(first) == (keys, texts)

        # one answer stored again elsewhere (more than 1 in 100 of a part): read by key, and
        # the part's index is dropped, to be made again by the next read
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DELETE FROM judge_cache WHERE key = %s", (keys[0],))
        cache.put(keys[0], _pg_record(0))
        indexes = sorted((cache.index_folder() / "keys").glob("*-located"))
        assert read(first) == (keys, texts)
        assert sorted((cache.index_folder() / "keys").glob("*-located")) == indexes[1:]
        assert read(first) == (keys, texts)
        assert sorted((cache.index_folder() / "keys").glob("*-located")) == indexes

        edited = _expand(write_job, rows=[{**ROWS[0], "output": "edited"}, *ROWS[1:]])
        got_keys, answers = read(edited)
        changed = {t.key for t in edited.tasks() if t.item_id == "a"}
        assert got_keys == [t.key for t in edited.tasks()] and changed.isdisjoint(keys)
        assert len(answers) == len(keys) - len(changed)  # item a's tasks: no answer
