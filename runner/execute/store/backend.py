"""What the rest of judge-runner needs from a response cache, and the one way to open one.

Two backends keep the same records under the same keys (see runner/execute/store/cache.py for
the record): `Cache`, a diskcache folder on one machine (the default), and `PgCache`, one
PostgreSQL table shared by many machines (runner/execute/store/pgcache.py). `open_cache` picks by
the location: a `postgresql://` or `postgres://` URL, or a folder.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from runner.errors import CacheAwayError, ConfigError, redact_url, register_url_password
from runner.execute.store.answers import Answer, of_record
from runner.execute.store.cache import Cache
from runner.execute.store.claimtable import Owner
from runner.execute.store.lease import Lease
from runner.execute.store.reader import Reader, read_here, reader_pays

__all__ = ["CacheBackend", "answers", "cached_flag_batches", "cached_flags", "checked_url",
           "is_url", "open_cache"]

T = TypeVar("T")
LOOKUP_BATCH = 2000  # things per has_many call (each backend chunks its own queries)
SCHEMES = ("postgresql://", "postgres://")


class CacheBackend(Protocol):
    """Response records by cache key: exactly what the pool, the reducer and the cli use."""

    def __contains__(self, key: str) -> bool: ...

    def get(self, key: str) -> dict[str, Any] | None:
        """The record stored under `key`, or None.

        Returns:
            The decoded record, or None.

        Raises:
            CacheError: The record is damaged (the message names the key and the fix).
        """

    def has_many(self, keys: Sequence[str]) -> set[str]:
        """The keys among `keys` that are stored (batched: one query per chunk).

        Returns:
            The stored ones.
        """

    def get_many(self, keys: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Records of the stored keys among `keys`, read in batches.

        Returns:
            The decoded records by key.
        """

    def put(self, key: str, record: Mapping[str, Any]) -> None:
        """Store a record, a plain call (no await: a cancel cannot split answer and store);
        raises CacheError if the store refuses it.

        Args:
            key: the task's cache key.
            record: the answer (store/cache.answer_record's shape).
        """

    def put_many(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        """Store many (key, record) pairs with put's semantics, one transaction per chunk;
        returns how many were given. A kill -9 loses at most the chunk being written; raises
        CacheError if the store refuses a chunk.

        Returns:
            The number of pairs given.
        """

    def append(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
        """Store answers as they arrive (the pool's way): put_many's semantics, durable when
        it returns, visible to this object's reads at once and to other processes after
        `fold` (a diskcache folder journals them first: runner/execute/store/journal.py). Raises
        CacheError if the store refuses them.

        Returns:
            The number of pairs given.
        """

    def keep(self, items: Iterable[tuple[str, Mapping[str, Any]]]) -> Path | None:
        """Keep answers `append` refused (a full disk, a database away past its reconnect
        window) wherever they can go, when the run stops: None if the store took them after
        all, else the spill file's path, which the next open of this cache stores. Raises
        CacheError if nowhere takes them.

        Returns:
            The spill file, or None.
        """

    def fold(self) -> None:
        """Make every appended answer visible to other processes now (a reader process, the
        next stage); raises CacheError if the store refuses them."""

    def keys(self) -> Iterator[str]:
        """Every stored key: what a copy between caches walks (runner/execute/transfer.py).

        Yields:
            The keys, in no set order.
        """

    def stats(self) -> dict[str, int]:
        """{"entries": n, "bytes": size on disk}.

        Returns:
            The number of records and the bytes they take.
        """

    def lease(self, name: str, holder: str) -> Lease:
        """Hold the run lease `name` (store/lease.lease_name: a job and shard) until released or
        this process ends, kill -9 included; raises LeaseHeldError naming the holder (store/
        lease.describe: host, pid, start time, command) when another run holds it, so that two
        runs of one job never call the same task on one cache.

        Args:
            name: the lease's name.
            holder: this run's description, shown to a second run.

        Returns:
            The held lease; releasing it (or the process ending) frees it.
        """

    def claim(self, keys: Sequence[str], owner: Owner, ttl_s: float) -> set[str]:
        """Claim `keys` (distinct) for `owner`'s run, renewing it for `ttl_s`, in one statement:
        the keys it holds now (unclaimed, claimed by it already, or by a run no longer live);
        the others are being bought by another live run (store/claimtable.py, execute/claims.py).

        Args:
            keys: the distinct keys the run is about to buy.
            owner: the run claiming them.
            ttl_s: how long the claims live without a renewal.

        Returns:
            The keys `owner` now holds.
        """

    def renew_claims(self, owner: Owner, ttl_s: float) -> None:
        """Keep `owner`'s claims live for `ttl_s` more.

        Args:
            owner: the run whose claims live on.
            ttl_s: how long they live from now.
        """

    def release_claims(self, owner: Owner, keys: Sequence[str], *, last: bool = False) -> None:
        """Give back `owner`'s claims of `keys`; `last`: and the owner (its run ends).

        Args:
            owner: the run releasing them.
            keys: the keys released.
            last: also remove the owner.
        """

    def close(self) -> None: ...

    def __enter__(self) -> CacheBackend: ...

    def __exit__(self, *exc: object) -> None: ...


def cached_flags(cache: CacheBackend, things: Iterable[T], key: Callable[[T], str]
                 ) -> Iterator[tuple[T, bool]]:
    """Each of `things` with whether its key is stored in `cache`, in order (see
    `cached_flag_batches`, which takes the same arguments): plan's and status's lookup.

    Yields:
        Each thing and whether its answer is stored.
    """
    for batch, flags in cached_flag_batches(cache, things, key):
        yield from zip(batch, map(bool, flags), strict=True)


def cached_flag_batches(cache: CacheBackend, things: Iterable[T], key: Callable[[T], str],
                        away: Callable[[CacheAwayError], bool] | None = None, *,
                        ahead: bool = True) -> Iterator[tuple[list[T], Sequence[bool] | bytes]]:
    """`things` in batches, in order, each with a flag per thing (true or 1: its key is
    stored in `cache`), looked up LOOKUP_BATCH at a time through has_many (one query per chunk,
    where `in` makes one each): the pool's, plan's and status's cache-state lookup, the same
    for every backend. Once a diskcache folder has been asked about reader.MIN_TASKS things,
    the rest are looked up by a reader process (runner.execute.store.reader), batches ahead,
    while the caller makes the next (and if it stops, by this process: nothing is lost).
    `away`: told when a lookup found the database away (the pool's cache, PgCache.wait_aside);
    while it returns true an empty batch comes instead (the caller waits) and the lookup is
    made again, else the batch comes as not stored. `ahead=False`: no reader process, every
    lookup here (the pool's: a reader's start held its event loop; bench/README.md "The
    floors").

    Args:
        cache, things, key: the open cache, the tasks (or anything with a key) in order, and
            each one's cache key.
        away: called when the database is away; true to wait and ask again.
        ahead: from reader.MIN_TASKS things on, a reader process looks the rest up.

    Yields:
        Each batch and its flags, in order.
    """
    batches = _batches(things, LOOKUP_BATCH)
    asked, folder = 0, cache if isinstance(cache, Cache) else None
    for batch in batches:
        keys = [key(t) for t in batch]
        while True:
            try:
                found = cache.has_many(keys)
                break
            except CacheAwayError as exc:
                if away is None:
                    raise
                if not away(exc):
                    found = set()
                    break
                yield [], []
        yield batch, [k in found for k in keys]
        asked += len(batch)
        if ahead and folder is not None and reader_pays(cache, asked):
            break
    if folder is None or (rest := next(batches, None)) is None:  # no process for nothing
        return
    with Reader(folder.directory, folder) as reader:
        yield from reader.marks(itertools.chain([rest], batches), key)


def answers(cache: CacheBackend, things: Iterable[T], key: Callable[[T], str], size: int,
            count: int) -> Generator[tuple[list[T], Mapping[str, Answer]], None, None]:
    """`things` (about `count` of them) in batches of `size`, each with the Answers of its
    stored keys (store/answers.py: what judging reads of a record): judging's read of a run's
    answers. A diskcache folder read for a large job goes through a reader process
    (store/reader.py), started by this call: it starts while the caller goes on (a run's
    reports import their modules meanwhile: ~0.1 s of a 40k-call run, bench/README.md "The
    floors"); otherwise one batched read a batch. A damaged record of a folder comes as an
    Answer saying so (Answer.damaged).

    Args:
        cache, things, key: as cached_flag_batches.
        size: the things per batch.
        count: about how many there are (it decides whether a reader process pays).

    Returns:
        Each batch and its stored keys' Answers; the reader process ends with the iterator
        (read to its end, closed, or dropped unread).
    """
    batches = _batches(things, size)
    if isinstance(cache, Cache) and reader_pays(cache, count):
        reader = Reader(cache.directory, cache)
        read = _through(reader, batches, key)
        weakref.finalize(read, reader.close)  # dropped unread: the child ends all the same
        return read
    return _read_here(cache, batches, key)


def _through(reader: Reader, batches: Iterator[list[T]], key: Callable[[T], str]
             ) -> Generator[tuple[list[T], Mapping[str, Answer]], None, None]:
    with reader:
        yield from reader.batches(batches, key)


def _read_here(cache: CacheBackend, batches: Iterator[list[T]], key: Callable[[T], str]
               ) -> Generator[tuple[list[T], Mapping[str, Answer]], None, None]:
    for batch in batches:
        keys = [key(t) for t in batch]
        yield batch, (read_here(cache, keys) if isinstance(cache, Cache) else
                      {k: of_record(r) for k, r in cache.get_many(keys).items()})


def _batches(things: Iterable[T], size: int) -> Iterator[list[T]]:
    stream = iter(things)
    return iter(lambda: list(itertools.islice(stream, size)), [])


def is_url(location: str | Path) -> bool:
    """Whether a cache location is a shared database's URL rather than a folder.

    Returns:
        True for a `postgresql://` (or `postgres://`) URL.
    """
    return isinstance(location, str) and location.startswith(SCHEMES)


def checked_url(url: str | None) -> str | None:
    """A shared cache's URL (--cache / JUDGE_CACHE_URL), checked to be one; None for none.
    Its password is registered as a secret (see runner.errors.scrub).

    Returns:
        The URL, or None when none (or an empty one) was given.

    Raises:
        ConfigError: `url` is not a PostgreSQL URL (the message shows it without its password).
    """
    if url and not is_url(url):
        raise ConfigError(f"--cache / JUDGE_CACHE_URL {redact_url(url)!r}: expected a "
                          "postgresql://USER@HOST:PORT/DBNAME URL; for a folder use --cache-dir")
    register_url_password(url)  # a driver's message that quotes it is scrubbed too
    return url or None


def open_cache(location: str | Path, *, read_only: bool = False) -> CacheBackend:
    """A PostgreSQL cache for a `postgresql://` URL, else the diskcache folder `location`.
    `read_only`: the caller only reads, so a folder this process may not write (a read-only
    mount, another user's) is opened read-only rather than refused (see Cache).

    Returns:
        The open cache; the caller closes it (it is a context manager).
    """
    if is_url(location):
        # Imported on first use of a URL, not at start-up (and not to dodge a cycle): psycopg
        # takes ~0.25 s to import (pgcache 0.29 s after runner.cli.main, this 2-core box,
        # loaded), which every `judge` command on a diskcache would pay.
        from runner.execute.store.pgcache import PgCache
        return PgCache(str(location))
    return Cache(Path(location), read_only=read_only)
