"""Tests for runner.execute.store.cache: a real diskcache under tmp_path, round trips, reopen, no
eviction."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import diskcache
import orjson
import pytest

from runner.errors import CacheError
from runner.execute.store.cache import NEVER, Cache


def _key(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def _record(n: int, text: str = "4 stars") -> dict[str, Any]:
    return {"request": {"model": "m", "messages": [{"role": "user", "content": f"q{n} {{x}}"}]},
            "endpoint": "http://127.0.0.1:1/v1",
            "response": {"choices": [{"index": 0, "message": {"role": "assistant",
                                                              "content": text}}]},
            "usage": {"prompt_tokens": 12, "completion_tokens": 3}, "latency_s": 0.25,
            "time": 1_700_000_000.5, "source": "api"}


def _bytes_on_disk(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def test_round_trip(cache_dir: Path) -> None:
    with Cache(cache_dir) as cache:
        assert cache.get(_key(1)) is None and _key(1) not in cache
        cache.put(_key(1), _record(1, "é ✓ {\"a\": 1}"))
        assert _key(1) in cache
        assert cache.get(_key(1)) == _record(1, "é ✓ {\"a\": 1}")
        cache.put(_key(1), _record(1, "5 stars"))  # same key: replaced, still one entry
        assert cache.get(_key(1)) == _record(1, "5 stars")
        assert cache.stats()["entries"] == 1 and cache.stats()["bytes"] > 0


def test_persists_across_reopen(cache_dir: Path) -> None:
    big = _record(0, "x" * 100_000)  # past diskcache's inline limit: stored as a file
    with Cache(cache_dir) as cache:
        for n in range(50):
            cache.put(_key(n), _record(n))
        cache.put(_key(999), big)
    with Cache(cache_dir) as cache:
        assert cache.stats()["entries"] == 51
        assert sorted(cache.keys()) == sorted([_key(n) for n in range(50)] + [_key(999)])
        assert all(cache.get(_key(n)) == _record(n) for n in range(50))
        assert cache.get(_key(999)) == big


def test_writes_reach_the_os_without_fsync(cache_dir: Path) -> None:
    """synchronous=OFF: a killed process loses nothing (tests/test_resume.py kills -9); only
    an OS crash could. The setting is persisted for every later handle."""
    with Cache(cache_dir) as cache:
        cache.put(_key(0), _record(0))
    with diskcache.Cache(str(cache_dir)) as raw:
        assert raw.sqlite_synchronous == 0


def test_eviction_is_off(cache_dir: Path) -> None:
    with Cache(cache_dir) as cache:
        cache.put(_key(0), _record(0))
    # The settings diskcache persisted in the cache's own database, read by a fresh handle.
    with diskcache.Cache(str(cache_dir)) as raw:
        assert raw.eviction_policy == "none"
        assert raw.size_limit == NEVER >= 2**60
        assert raw.cull_limit == 0
        assert isinstance(raw, diskcache.Cache) and not isinstance(raw, diskcache.FanoutCache)


def test_no_eviction_past_a_size_limit(cache_dir: Path) -> None:
    """Even with a tiny size limit set on the folder, a Cache keeps every entry it writes."""
    with diskcache.Cache(str(cache_dir), size_limit=10_000, cull_limit=10,
                         eviction_policy="least-recently-stored"):
        pass
    with Cache(cache_dir) as cache:
        for n in range(300):  # ~300 * 300 bytes, well past 10 kB
            cache.put(_key(n), _record(n))
        assert cache.stats()["entries"] == 300
    with Cache(cache_dir) as cache:
        assert all(_key(n) in cache for n in range(300))


def _access_columns(folder: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(folder / "cache.db") as db:
        return db.execute("SELECT key, access_time, access_count FROM Cache").fetchall()


@pytest.mark.parametrize(("policy", "writes"), [(None, False), ("least-recently-used", True)])
def test_reads_do_not_write(cache_dir: Path, policy: str | None, writes: bool) -> None:
    """eviction_policy='none' keeps reads read-only; LRU (the control) makes each a write."""
    with Cache(cache_dir) as cache:
        cache.put(_key(0), _record(0))
        if policy is not None:
            cache._store.reset("eviction_policy", policy)
        before = _access_columns(cache_dir)
        for _ in range(3):
            assert cache.get(_key(0)) == _record(0)
        assert (_access_columns(cache_dir) != before) == writes


def test_only_the_record_is_stored(cache_dir: Path) -> None:
    """What goes to disk is the key and the record's JSON, nothing else (no key material)."""
    record = _record(7)
    with Cache(cache_dir) as cache:
        cache.put(_key(7), record)
        stored = cache._store.get(_key(7))
    assert isinstance(stored, bytes) and stored.startswith(b'{"request":')
    disk = _bytes_on_disk(cache_dir)
    assert _key(7).encode() in disk and b'"content":"q7 {x}"' in disk
    assert b"Authorization" not in disk and b"Bearer" not in disk


def test_unopenable_directory(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CacheError, match=r"cannot open the cache.*--cache-dir"):
        Cache(blocker / "cache")


def test_batched_lookups_agree_with_single_ones(cache_dir: Path) -> None:
    """has_many/get_many read in chunks straight from diskcache's table; they must see what
    `in` and get() see, large records kept as files included."""
    big = _record(0, "x" * 100_000)
    with Cache(cache_dir) as cache:
        for n in range(1, 1200, 2):  # odd keys stored: more than two query chunks
            cache.put(_key(n), _record(n))
        cache.put(_key(0), big)
        asked = [_key(n) for n in range(1200)]
        found = cache.has_many(asked)
        assert found == {k for k in asked if k in cache}
        assert len(found) == 601
        records = cache.get_many(asked)
        assert records.keys() == found
        assert records[_key(0)] == big
        assert all(records[_key(n)] == cache.get(_key(n)) for n in range(1, 1200, 2))
        assert cache.has_many([]) == set() and cache.get_many([]) == {}


def test_put_many_writes_rows_as_diskcache_set_does(cache_dir: Path) -> None:
    """put_many writes inline records with its own upsert: diskcache itself must read them
    back, count them and measure them exactly as if its `set` had stored them, and replacing a
    record kept as a file must remove that file."""
    big = _record(0, "x" * 100_000)
    records = [(_key(n), _record(n)) for n in range(1, 1200)] + [(_key(0), big)]
    with Cache(cache_dir / "set") as reference:
        for key, record in records:
            reference.put(key, record)
        expected = reference.stats()
    with Cache(cache_dir / "many") as cache:
        assert cache.put_many(records) == len(records)
        assert cache.stats() == expected  # entry count and volume kept by diskcache's triggers
        plain = diskcache.Cache(str(cache_dir / "many"))
        try:
            for key, record in records:
                assert orjson.loads(plain.get(key)) == record
        finally:
            plain.close()
        files = list((cache_dir / "many").rglob("*.val"))
        assert len(files) == 1  # the big record, as diskcache stores it
        # A later record of a key replaces the earlier one, within a call and across calls;
        # a small record over a big one removes the big one's file.
        cache.put_many([(_key(5), _record(5, "2 stars")), (_key(5), _record(5, "3 stars")),
                        (_key(0), _record(0, "1 star"))])
        assert cache.get(_key(5)) == _record(5, "3 stars")
        assert cache.get(_key(0)) == _record(0, "1 star")
        assert not files[0].exists() and cache.stats()["entries"] == len(records)


PRIVATE = {"_sql", "_sql_retry", "_con", "_disk", "_txn_id", "_local"}
"""diskcache.Cache's private attributes: a release may change them without notice."""


def test_no_private_attribute_of_diskcache_is_used() -> None:
    """The runner reads and writes the cache through diskcache's public API and its own SQLite
    connection (runner/execute/store/table.py), never through diskcache's internals."""
    import ast
    root = Path(__file__).resolve().parents[1] / "runner"
    used = [f"{path.relative_to(root)}:{node.lineno}: .{node.attr}"
            for path in sorted(root.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Attribute) and node.attr in PRIVATE]
    assert used == []


def test_a_table_laid_out_otherwise_is_read_and_written_through_diskcache_api(
        cache_dir: Path) -> None:
    """A folder whose SQLite table is not laid out as store/table.py expects (here: a column
    more, as another diskcache might make it) is used through diskcache's public API: the
    same answers, counts and replacements, nothing written in a layout it does not know."""
    with Cache(cache_dir) as cache:
        assert cache._batched
        assert cache._db.execute("PRAGMA synchronous").fetchone()[0] == 0  # no fsync: ours too
        cache.put_many((_key(n), _record(n)) for n in range(10))
    with sqlite3.connect(cache_dir / "cache.db") as db:
        db.execute("ALTER TABLE Cache ADD COLUMN extra TEXT")
    with Cache(cache_dir) as cache:
        assert not cache._batched
        keys = [_key(n) for n in range(20)]
        assert cache.has_many(keys) == set(keys[:10])
        assert cache.put_many([(_key(n), _record(n)) for n in range(10, 20)] +
                              [(_key(3), _record(3, "1 star"))]) == 11
        cache.append([(_key(4), _record(4, "2 stars"))])
        cache.fold()
        got = cache.get_many(keys + [_key(99)])
        assert cache.has_many(keys + [_key(99)]) == set(keys)
        assert cache.stats()["entries"] == 20
    assert got == {**{_key(n): _record(n) for n in range(20)}, _key(3): _record(3, "1 star"),
                   _key(4): _record(4, "2 stars")}
    with diskcache.Cache(str(cache_dir)) as plain:
        assert orjson.loads(plain.get(_key(4))) == _record(4, "2 stars")
