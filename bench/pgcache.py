"""Benchmark: the shared PostgreSQL cache against diskcache, and 4 shards on one PostgreSQL.

1. lookups: 100,000 cached records (~1 KiB each; quick: 20,000) stored in a diskcache folder
   and in PostgreSQL on loopback; then, per backend, `cached_flags` over every key (the batched
   cache-state lookup the pool, plan and status make) and `get_many` over every key (what
   rescore reads). Target: PostgreSQL within 3x of diskcache on both.
2. shards: 4 `judge run --shard I/4` processes at once (25,000 tasks each; quick: 2,500)
   against one PostgreSQL and one zero-latency fake server (bench/server.py); the figure is
   the aggregate tasks/s of the four (wall time from the first start to the last exit),
   beside one process running the whole job on PostgreSQL (reports included).

The PostgreSQL server is a private cluster started for the benchmark (tests/pgserver.py) with
fsync off, as a test cluster; the machine has 2 cores shared by everything running.
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg

from bench import common
from runner.execute.store.backend import CacheBackend, cached_flags, open_cache
from tests.pgserver import PgCluster, find_bindir

TARGET_RATIO = 3.0
SHARDS = 4
PAD = "x" * 700  # records of ~1 KiB, as in PERFORMANCE-NOTES


def _record(n: int) -> bytes:
    return orjson.dumps({"request": {"model": "m", "messages": [{"role": "user",
                                                                  "content": f"q{n} {PAD}"}]},
                         "endpoint": "http://127.0.0.1:1/v1", "usage": {}, "latency_s": 0.0,
                         "response": {"choices": [{"index": 0, "message": {
                             "role": "assistant", "content": f"{n % 5 + 1} stars"}}]},
                         "time": 0.0, "source": "api"})


def _fill_pg(url: str, keys: list[str]) -> None:
    open_cache(url).close()  # creates the schema
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        with cur.copy("COPY judge_cache (key, record, source) FROM STDIN") as copy:
            for n, key in enumerate(keys):
                copy.write_row((key, _record(n), "api"))


def _fill_disk(folder: Path, keys: list[str]) -> None:
    with open_cache(folder) as cache:
        for n, key in enumerate(keys):
            cache.put(key, orjson.loads(_record(n)))


def _time(cache: CacheBackend, keys: list[str]) -> dict[str, float]:
    started = time.perf_counter()
    hits = sum(hit for _, hit in cached_flags(cache, keys, lambda k: k))
    marked_s = time.perf_counter() - started
    started = time.perf_counter()
    read = sum(len(cache.get_many(keys[i:i + 1000])) for i in range(0, len(keys), 1000))
    read_s = time.perf_counter() - started
    assert hits == read == len(keys), (hits, read)
    return {"marked_s": round(marked_s, 3), "get_many_s": round(read_s, 3),
            "marked_us_per_key": round(marked_s / len(keys) * 1e6, 2),
            "get_many_us_per_key": round(read_s / len(keys) * 1e6, 2)}


def _lookups(work: Path, url: str, n: int) -> dict[str, Any]:
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(n)]
    _fill_disk(work / "disk", keys)
    _fill_pg(url, keys)
    figures = {}
    for name, location in (("diskcache", work / "disk"), ("postgresql", url)):
        with open_cache(location) as cache:
            _time(cache, keys[:1000])  # warm: connection, prepared plans, page cache
            figures[name] = _time(cache, keys)
    disk, pg = figures["diskcache"], figures["postgresql"]
    ratios = {"marked": round(pg["marked_s"] / disk["marked_s"], 2),
              "get_many": round(pg["get_many_s"] / disk["get_many_s"], 2)}
    return {"records": n, **figures, "pg_over_disk": ratios}


def _shards(work: Path, url: str, alone_url: str, per_shard: int) -> dict[str, Any]:
    items = per_shard * SHARDS
    with common.server(latency=0.0) as fake:
        job = common.write_job(work / "job", items, aspects=("overall",), base_url=fake.url,
                               concurrency=64, max_retries=2)
        # The baseline: the same job in one process on the same kind of cache (fresh database).
        alone = common.run_child([common.JUDGE, "run", str(job), "--cache", alone_url, "--yes",
                                  "--out", str(work / "alone")], cwd=work, timeout_s=900)
        cmd = [common.JUDGE, "run", str(job), "--cache", url, "--yes"]
        started = time.perf_counter()
        procs = [subprocess.Popen([*cmd, "--shard", f"{i}/{SHARDS}"], cwd=work,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for i in range(SHARDS)]
        results = [p.communicate(timeout=900) for p in procs]
        seconds = time.perf_counter() - started
        served = fake.stats()
    codes = [p.returncode for p in procs]
    return {"tasks": items, "shards": SHARDS, "seconds": round(seconds, 2),
            "aggregate_tasks_per_s": round(items / seconds),
            "one_process": {**alone.figures(), "tasks_per_s": round(items / alone.seconds)},
            "exit_codes": codes, "server_requests": served.get("requests"),
            "stderr_tails": [err.strip().splitlines()[-2:] for _, err in results],
            "ok": codes == [0] * SHARDS}


def pg_cache(work: Path, quick: bool) -> dict[str, Any]:
    """The benchmark; an error result when PostgreSQL is not installed."""
    if find_bindir() is None:
        return {"error": "PostgreSQL is not installed (apt-get install postgresql)",
                "pass": False}
    n, per_shard = (20_000, 2_500) if quick else (100_000, 25_000)
    with PgCluster() as cluster:
        lookups = _lookups(work, cluster.url, n)
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE shards")
            conn.execute("CREATE DATABASE alone")
        base = cluster.url.rsplit("/", 1)[0]
        shards = _shards(work, f"{base}/shards", f"{base}/alone", per_shard)
    worst = max(lookups["pg_over_disk"].values())
    return {"lookups": lookups, "shards": shards, "pg_over_disk_worst": worst,
            "shard_tasks_per_s": shards["aggregate_tasks_per_s"],
            "target": f"PostgreSQL lookups within {TARGET_RATIO:g}x of diskcache",
            "pass": None if quick else worst <= TARGET_RATIO and shards["ok"],
            "command": "bench/run.py --only pgcache [--quick]"}
