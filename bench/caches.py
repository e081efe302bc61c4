"""Cache variants for the throughput benchmark, and the cost of storing one answer.

- `WriteBehindCache`: the fix the throughput figures point to, measured here before anyone
  changes runner/. `runner.execute.cache.Cache.put` runs one sqlite transaction per answer on the
  event-loop thread, and every ~1,000 WAL pages sqlite checkpoints and fdatasyncs, stalling
  every request in flight for milliseconds. `WriteBehindCache` keeps the interface but hands
  encoded records to one writer thread that stores them in batches (one transaction each): the
  loop thread only adds to a dict. Pending records answer `in` and `get`, and `close()` drains
  them, so a Ctrl-C or an exception still stores every answer received; only a hard kill loses
  the last `FLUSH_S`.
- `MemoryCache`: a dict, nothing on disk; what the pool costs without any cache.
- `put_cost`: microseconds per stored answer, wall and CPU, one by one and batched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from runner.errors import CacheError
from runner.execute.cache import Cache

FLUSH_S = 0.05  # the writer wakes at least this often
BATCH = 512  # records per transaction, at most


class WriteBehindCache(Cache):
    """`runner.execute.cache.Cache` with `put` moved to a batching writer thread."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self._pending: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = False
        self._failed: BaseException | None = None  # raised to the loop thread by put/close
        self._writer = threading.Thread(target=self._drain, name="cache-writer", daemon=True)
        self._writer.start()

    def __contains__(self, key: str) -> bool:
        return key in self._pending or super().__contains__(key)

    def has_many(self, keys: Sequence[str]) -> set[str]:
        return {k for k in keys if k in self._pending} | super().has_many(keys)

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self._pending.get(key)
        return super().get(key) if raw is None else orjson.loads(raw)

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        if self._failed is not None:
            raise CacheError(f"{self.directory}: the cache writer failed: {self._failed}")
        with self._lock:
            self._pending[key] = orjson.dumps(record)
            if len(self._pending) >= BATCH:
                self._wake.set()

    def _drain(self) -> None:
        try:
            self._drain_batches()
        except BaseException as exc:  # surfaced by the next put() or close()
            self._failed = exc

    def _drain_batches(self) -> None:
        while True:
            self._wake.wait(FLUSH_S)
            self._wake.clear()
            with self._lock:
                batch = list(self._pending.items())[:BATCH]
            if batch:
                with self._disk.transact():
                    for key, raw in batch:
                        self._disk.set(key, raw)
                with self._lock:
                    for key, raw in batch:  # unless put() replaced it meanwhile
                        if self._pending.get(key) is raw:
                            del self._pending[key]
            elif self._closing:
                return

    def close(self) -> None:
        self._closing = True
        self._wake.set()
        self._writer.join()
        super().close()
        if self._failed is not None:
            raise CacheError(f"{self.directory}: the cache writer failed: {self._failed}; "
                             f"{len(self._pending)} answers were not stored")


class MemoryCache(Cache):
    """Answers kept in a dict, nothing on disk: isolates the pool's cost from the cache's."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._records: dict[str, bytes] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._records

    def has_many(self, keys: Sequence[str]) -> set[str]:
        return {k for k in keys if k in self._records}

    def get(self, key: str) -> dict[str, Any] | None:
        raw = self._records.get(key)
        return None if raw is None else orjson.loads(raw)

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        self._records[key] = orjson.dumps(record)

    def close(self) -> None:
        self._records.clear()


def put_cost(directory: Path, records: list[tuple[str, dict[str, Any]]]) -> dict[str, float]:
    """Microseconds per stored answer, wall and CPU: `Cache.put` one by one, then the same
    records in transactions of BATCH (what the writer thread does)."""
    out: dict[str, float] = {}
    half = len(records) // 2
    for name, part in (("put", records[:half]), ("batched", records[half:])):
        with Cache(directory / name) as cache:
            wall, cpu = time.perf_counter(), time.process_time()
            if name == "put":
                for key, record in part:
                    cache.put(key, record)
            else:
                for start in range(0, len(part), BATCH):
                    with cache._disk.transact():
                        for key, record in part[start:start + BATCH]:
                            cache._disk.set(key, orjson.dumps(record))
            out[f"{name}_wall_us"] = round((time.perf_counter() - wall) / len(part) * 1e6, 1)
            out[f"{name}_cpu_us"] = round((time.process_time() - cpu) / len(part) * 1e6, 1)
    return out
