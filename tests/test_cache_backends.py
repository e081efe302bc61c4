"""The cache contract, run against both backends: a real diskcache under tmp_path and a real
PostgreSQL server on 127.0.0.1 (tests/pgserver.py), plus what only the PostgreSQL one does."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from runner.errors import CacheError
from runner.execute.store import pgcache
from runner.execute.store.backend import CacheBackend, cached_flags, open_cache
from runner.execute.store.cache import TRANSACTION, Cache
from runner.execute.store.pgcache import PgCache

Opener = Callable[[], CacheBackend]


def _key(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def _record(n: int, text: str = "4 stars", source: str = "api") -> dict[str, Any]:
    return {"request": {"model": "m", "messages": [{"role": "user", "content": f"q{n}"}]},
            "endpoint": "http://127.0.0.1:1/v1",
            "response": {"choices": [{"index": 0, "message": {"role": "assistant",
                                                              "content": text}}]},
            "usage": {"prompt_tokens": 12, "completion_tokens": 3}, "latency_s": 0.25,
            "time": 1_700_000_000.5, "source": source}


@pytest.fixture(params=["diskcache", pytest.param("postgresql", marks=pytest.mark.slow)])
def opener(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    """Opens the same cache again each call: a folder, or a fresh PostgreSQL database."""
    location: str | Path = (tmp_path / "cache" if request.param == "diskcache"
                            else request.getfixturevalue("pg_url"))
    return lambda: open_cache(location)


def test_open_cache_picks_the_backend_by_location(opener: Opener) -> None:
    with opener() as cache:
        assert isinstance(cache, (Cache, PgCache))
        assert cache.get(_key(0)) is None and _key(0) not in cache


def test_round_trip_keeps_every_character(opener: Opener) -> None:
    # NUL is legal in a model's output; JSONB would refuse it, bytea keeps it.
    text = "é ✓ {\"a\": 1} \x00 end \U0001F600"
    with opener() as cache:
        cache.put(_key(1), _record(1, text))
        assert _key(1) in cache
        assert cache.get(_key(1)) == _record(1, text)
        assert cache.get(_key(2)) is None


def test_batched_lookups_across_chunks(opener: Opener) -> None:
    """has_many, cached_flags and get_many past one query's chunk (500 disk, 2000 PostgreSQL)."""
    keys = [_key(n) for n in range(4500)]
    with opener() as cache:
        for n in range(0, 4500, 3):
            cache.put(keys[n], _record(n))
        stored = set(keys[::3])
        assert cache.has_many(keys) == stored
        flagged = list(cached_flags(cache, range(4500), lambda n: keys[n]))
        assert [n for n, _ in flagged] == list(range(4500))  # order kept
        assert [n for n, hit in flagged if hit] == list(range(0, 4500, 3))
        got = cache.get_many(keys[:3000])
        assert set(got) == {k for k in keys[:3000] if k in stored}
        assert got[keys[2997]] == _record(2997)
        assert cache.has_many([]) == set() and cache.get_many([]) == {}


def test_batched_lookups_of_keys_that_are_not_digests(opener: Opener) -> None:
    """PostgreSQL's batched reads send the keys as one text split by the server; a key holding
    the separator (or a comma, a quote, a brace) is found all the same, and a near miss is not."""
    odd = ["a\x1fb", "c,d", 'e"f', "{g}", "h i", "é\\"]
    with opener() as cache:
        for n, key in enumerate(odd):
            cache.put(key, _record(n))
        asked = [*odd, "a", "b", "c", "a\x1f"]
        assert cache.has_many(asked) == set(odd)
        assert cache.get_many(asked) == {key: _record(n) for n, key in enumerate(odd)}
        assert cache.has_many(["c,d", _key(1)]) == {"c,d"}  # the joined path, with a comma


def test_persists_across_reopen_with_every_key_listed(opener: Opener) -> None:
    with opener() as cache:
        for n in range(2100):  # past one PostgreSQL page of keys()
            cache.put(_key(n), _record(n))
        cache.put(_key(9999), _record(9999, "x" * 100_000))  # a large record
    with opener() as cache:
        assert sorted(cache.keys()) == sorted([_key(n) for n in range(2100)] + [_key(9999)])
        assert cache.stats()["entries"] == 2101 and cache.stats()["bytes"] > 100_000
        assert cache.get(_key(9999)) == _record(9999, "x" * 100_000)


def test_two_writers_of_the_same_keys_leave_whole_records(opener: Opener) -> None:
    """Two workers (own handles, own threads) answering the same 300 keys: every key ends
    with one of the two complete records, never a mix, nothing lost."""
    def write(text: str) -> None:
        with opener() as cache:
            for n in range(300):
                cache.put(_key(n), _record(n, text))

    threads = [threading.Thread(target=write, args=(t,)) for t in ("A", "B")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with opener() as cache:
        got = cache.get_many([_key(n) for n in range(300)])
        assert len(got) == 300
        assert all(got[_key(n)] in (_record(n, "A"), _record(n, "B")) for n in range(300))


# ---------------------------------------------------------------- PostgreSQL only

@pytest.mark.slow
def test_pg_first_answer_wins_and_source_is_a_column(pg_url: str) -> None:
    with PgCache(pg_url) as cache:
        cache.put(_key(1), _record(1, "first", source="import:x/y"))
        cache.put(_key(1), _record(1, "second"))  # ON CONFLICT DO NOTHING
        assert cache.get(_key(1)) == _record(1, "first", source="import:x/y")
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT key, source FROM judge_cache").fetchall()
        version = conn.execute("SELECT value FROM judge_cache_meta "
                               "WHERE name = 'schema_version'").fetchone()
    assert rows == [(_key(1), "import:x/y")]
    assert version == (str(pgcache.SCHEMA_VERSION),)


@pytest.mark.slow
def test_pg_schema_of_another_version_is_refused(pg_url: str) -> None:
    PgCache(pg_url).close()  # creates the schema
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE judge_cache_meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(CacheError, match=r"schema version 99, this judge-runner reads "
                                         r"version 1; upgrade judge-runner"):
        PgCache(pg_url)


@pytest.mark.slow
def test_pg_many_openers_at_once_create_the_schema_once(pg_url: str) -> None:
    """Shards start together: concurrent first opens must not collide creating the tables."""
    errors: list[BaseException] = []

    def open_close() -> None:
        try:
            PgCache(pg_url).close()
        except BaseException as exc:  # noqa: BLE001 - collected for the assert below
            errors.append(exc)

    threads = [threading.Thread(target=open_close) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


@pytest.mark.slow
def test_pg_reconnects_once_when_the_server_drops_the_connection(pg_url: str) -> None:
    """A server restart or failover mid-run: the next put and read go through on a new
    connection, and nothing is lost."""
    with PgCache(pg_url) as cache:
        cache.put(_key(1), _record(1))
        for round_ in range(2):
            with psycopg.connect(pg_url, autocommit=True) as admin:
                killed = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchone()
            assert killed == (1,)
            call = (lambda: cache.put(_key(2), _record(2))) if round_ == 0 else \
                (lambda: cache.get_many([_key(1), _key(2)]))
            call()
        assert cache.get_many([_key(1), _key(2)]) == {_key(1): _record(1), _key(2): _record(2)}


@pytest.mark.slow
def test_pg_unreachable_server_is_one_line_without_the_password(pg_cluster: Any) -> None:
    from tests.pgserver import free_port
    url = f"postgresql://judge:hunter2@127.0.0.1:{free_port()}/judge"
    with pytest.raises(CacheError) as info:
        PgCache(url)
    message = str(info.value)
    assert "hunter2" not in message and "\n" not in message
    assert message.startswith(f"postgresql://judge:***@127.0.0.1:{url.split(':')[3].split('/')[0]}"
                              "/judge: cannot connect to the cache")
    assert "check --cache / JUDGE_CACHE_URL" in message


# ---------------------------------------------------------------- put_many (both backends)

def _chunk(cache: CacheBackend) -> int:
    """Records per put_many transaction of this backend."""
    return pgcache.CHUNK if isinstance(cache, PgCache) else TRANSACTION


def _refuse(cache: CacheBackend, key: str) -> None:
    """A trigger in the store itself that refuses to insert `key`: a real refused write."""
    if isinstance(cache, PgCache):
        with psycopg.connect(cache._url, autocommit=True) as conn:
            conn.execute("CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN "
                         "RAISE EXCEPTION 'refused by test'; END $$ LANGUAGE plpgsql")
            conn.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON judge_cache FOR EACH ROW "
                         f"WHEN (NEW.key = '{key}') EXECUTE FUNCTION refuse()")
    else:
        assert isinstance(cache, Cache)
        cache._db.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON Cache WHEN NEW.key = '{key}' "
                          "BEGIN SELECT RAISE(ABORT, 'refused by test'); END")


def test_put_many_round_trips_across_chunk_boundaries(opener: Opener) -> None:
    with opener() as cache:
        size = _chunk(cache)
        for total in (0, 1, size - 1, size, size + 1):
            base = 100_000 * (total + 1)
            given = cache.put_many((_key(base + n), _record(base + n)) for n in range(total))
            assert given == total
            keys = [_key(base + n) for n in range(total)]
            assert cache.get_many(keys) == {_key(base + n): _record(base + n)
                                            for n in range(total)}
        cache.put_many([(_key(7), _record(7, "é \x00 ✓"))])
    with opener() as cache:  # committed: still there after reopening
        assert cache.get(_key(7)) == _record(7, "é \x00 ✓")
        assert cache.stats()["entries"] == 3 * _chunk(cache) + 2  # 0+1+(c-1)+c+(c+1), and 7


def test_put_many_duplicates_within_one_call_follow_put(opener: Opener) -> None:
    """diskcache replaces (the last record of a key stays), PostgreSQL keeps the first: the
    same as two puts."""
    with opener() as cache:
        cache.put(_key(1), _record(1, "stored before"))
        cache.put_many([(_key(1), _record(1, "A")), (_key(2), _record(2, "A")),
                        (_key(2), _record(2, "B")), (_key(3), _record(3, "A"))])
        got = cache.get_many([_key(1), _key(2), _key(3)])
        if isinstance(cache, PgCache):
            assert got == {_key(1): _record(1, "stored before"), _key(2): _record(2, "A"),
                           _key(3): _record(3, "A")}
        else:
            assert got == {_key(1): _record(1, "A"), _key(2): _record(2, "B"),
                           _key(3): _record(3, "A")}
        assert cache.stats()["entries"] == 3


@pytest.mark.slow
def test_pg_put_many_first_answer_wins_across_calls(pg_url: str) -> None:
    with PgCache(pg_url) as cache:
        cache.put_many((_key(n), _record(n, "first", source="batch:b1")) for n in range(3000))
        cache.put_many((_key(n), _record(n, "second")) for n in range(2500, 3500))
        got = cache.get_many([_key(n) for n in range(3500)])
    assert all(got[_key(n)] == _record(n, "first", source="batch:b1") for n in range(3000))
    assert all(got[_key(n)] == _record(n, "second") for n in range(3000, 3500))
    with psycopg.connect(pg_url) as conn:
        sources = dict(conn.execute("SELECT source, count(*) FROM judge_cache "
                                    "GROUP BY source").fetchall())
    assert sources == {"batch:b1": 3000, "api": 500}


def test_put_many_refused_write_is_a_cache_error_and_keeps_earlier_chunks(
        opener: Opener) -> None:
    """A refused record fails its whole chunk (one transaction) with a CacheError naming the
    cache; chunks committed before it stay stored."""
    with opener() as cache:
        size = _chunk(cache)
        _refuse(cache, _key(size + 5))
        with pytest.raises(CacheError) as info:
            cache.put_many((_key(n), _record(n)) for n in range(3 * size))
        location = cache.location if isinstance(cache, PgCache) else str(cache.directory)
        assert str(info.value).startswith(f"{location}: ")
        assert "refused by test" in str(info.value) and "rerun" in str(info.value)
        assert "\n" not in str(info.value)
        stored = cache.has_many([_key(n) for n in range(3 * size)])
    assert stored == {_key(n) for n in range(size)}
