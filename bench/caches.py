"""A cache variant for the throughput benchmark, and the cost of storing one answer.

- `MemoryCache`: a dict, nothing on disk; what the pool costs without any cache.
- `put_cost`: microseconds per stored answer, wall and CPU, one by one and batched.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from runner.execute.store.cache import Cache
from runner.execute.store.claimtable import Owner

BATCH = 512  # records per transaction, at most
TURN = 16  # answers a turn of the pool's event loop stores together at zero latency


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

    def put_many(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        stored = 0
        for key, record in items:
            self._records[key] = orjson.dumps(record)
            stored += 1
        return stored

    def append(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        return self.put_many(items)

    def check_room(self) -> None:
        pass  # nothing on disk

    def fold(self) -> None:
        pass

    def claim(self, keys: Sequence[str], owner: Owner, ttl_s: float) -> set[str]:
        return set(keys)  # no other run: every key is this one's

    def renew_claims(self, owner: Owner, ttl_s: float) -> None:
        pass

    def release_claims(self, owner: Owner, keys: Sequence[str], *, last: bool = False) -> None:
        pass

    def close(self) -> None:
        self._records.clear()


def put_cost(directory: Path, records: list[tuple[str, dict[str, Any]]]) -> dict[str, float]:
    """Microseconds per stored answer, wall and CPU: `Cache.put` one by one, then the same
    records in transactions of BATCH (`put_many` of what one event-loop turn receives, at its
    largest), then all of them with `Cache.append` in turns of TURN, as the pool stores them:
    the journal, and SQLite FOLD_ROWS a transaction, the last fold included."""
    out: dict[str, float] = {}
    half = len(records) // 2
    for name, part in (("put", records[:half]), ("batched", records[half:]),
                       ("appended", records)):
        with Cache(directory / name) as cache:
            wall, cpu = time.perf_counter(), time.process_time()
            if name == "put":
                for key, record in part:
                    cache.put(key, record)
            else:
                store, size = (cache.put_many, BATCH) if name == "batched" else (cache.append, TURN)
                for start in range(0, len(part), size):
                    store(part[start:start + size])
                cache.fold()
            out[f"{name}_wall_us"] = round((time.perf_counter() - wall) / len(part) * 1e6, 1)
            out[f"{name}_cpu_us"] = round((time.process_time() - cpu) / len(part) * 1e6, 1)
    return out
