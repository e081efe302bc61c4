"""The key index: a job's cache keys in task order, kept in a diskcache folder, so that a rescore
(or a run's cached-first pass) of a job it has read before finds its answers without rendering
and hashing every request again (about half of a forked expander's work: ~6 us a task).

What it buys, as a whole process (a fully cached `judge rescore`, wall time without the index
over with it; bench/mechanisms.py): 1.22x at 1M tasks and 1.25x at 100k at load ~3-4, under
1x at heavier load: at the 1.2x line, kept (the rounds: bench/README.md "What each mechanism
buys").

A key depends only on what `Expansion.fingerprint()` digests (the prompts but for their parsers,
the models, the items, the code that renders requests), and an index is found only under its
fingerprint: an index can be missing, never stale. A parser change keeps the fingerprint.

Each child of a forked expander (runner.expand_ahead.Expander) keeps the keys of its own
part of the tasks (its runs: Expansion.part) in `keys/<fingerprint>-<run size>-<part>of<parts>`, 32
bytes (the sha256 digest) a key, in its order. It writes them as it renders them to a temporary
file, renamed into place when the part is complete and has as many keys as expected. A run
whose pool dispatched every task of a job stores the same files (`recorded_parts`), so that the
job's first rescore finds them. An index of the wrong size is ignored (and replaced). The newest
KEEP indexes are kept. Every failure to read or write an index only means rendering: the index
is never needed.

From PostgreSQL, the children keep a located index instead (`...-located`, 38 bytes a key):
each key with its row's place in the table (`TID`), in a folder of the reading machine named
for the table (PgCache.index_folder), so that the next read asks the server for rows by place,
not through the key's btree (PgCache.get_many_raw_at). A place can be stale, never wrong: a
row is taken for the key it holds, and a key not found at its place is read by key. What it
buys is in runner/expand_ahead.py's docstring.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, TypeVar

__all__ = ["DIGEST", "KEEP", "TID", "KeyIndex", "part_size", "recorded_parts"]

T = TypeVar("T")

DIGEST = 32  # bytes of a sha256 key
KEEP = 8  # index files kept (a part each, two a job version): the newest
TID = 6  # bytes of a row's place in a PostgreSQL table (its ctid: block and offset)
STALE = 3600


def part_size(count: int, run: int, part: int, parts: int) -> int:
    """Tasks in `part` of `count` tasks cut in runs of `run`, every `parts`-th run a part's.

    Args:
        count: the job's tasks.
        run: the length of a run of consecutive tasks.
        part: the part's number.
        parts: the number of parts.

    Returns:
        The number of tasks in the part.
    """
    full, rest = divmod(count, run)
    runs = full + (rest > 0)
    mine = len(range(part, runs, parts))
    last_is_mine = rest > 0 and (runs - 1) % parts == part
    return mine * run - (run - rest if last_is_mine else 0)


class KeyIndex:
    """One part's keys in a cache folder (see the module docstring). A `located` index keeps
    beside each key where PostgreSQL's table holds its row (`TID` bytes, NOWHERE for none; see
    runner.execute.store.pgcache.PgCache.get_many_raw_at)."""

    def __init__(self, directory: Path, fingerprint: str, run: int, part: int, parts: int,
                 count: int, *, located: bool = False) -> None:
        self.path = (directory / "keys"
                     / f"{fingerprint}-{run}-{part}of{parts}{'-located' if located else ''}")
        self.expected = part_size(count, run, part, parts)
        self.width = DIGEST + (TID if located else 0)

    def keys(self) -> Iterator[str] | None:
        """The part's keys in order, if a complete index of them is stored; else None."""
        entries = self._entries()
        return None if entries is None else (entry[:DIGEST].hex() for entry in entries)

    def located(self) -> Iterator[tuple[str, bytes]] | None:
        """A located index's keys in order, each with its row's place; None as `keys`."""
        entries = self._entries()
        return None if entries is None else ((e[:DIGEST].hex(), e[DIGEST:]) for e in entries)

    def _entries(self) -> Iterator[bytes] | None:
        try:
            f = open(self.path, "rb")  # noqa: SIM115  # closed by the generator
        except OSError:
            return None
        try:
            if os.fstat(f.fileno()).st_size != self.width * self.expected:
                f.close()
                return None
        except OSError:
            f.close()
            return None
        return _read(f, self.width)

    def recorded(self, keys: Iterable[str]) -> Iterator[str]:
        """`keys` passed through, stored as this part's index once all have gone by (if
        there are as many as expected); nothing is stored if the caller stops early."""
        return _recorded([self.path], self.expected, keys, bytes.fromhex, lambda _: 0)

    def recorded_located(self, entries: Iterable[tuple[str, bytes]],
                         nowhere: bytes) -> Iterator[tuple[str, bytes]]:
        """`recorded` for a located index: (key, place) pairs, `nowhere` the place of a key
        not stored (pgcache's NOWHERE, which this module may not import). Stored only if at
        most 1% of the keys have no place: an index made while a job was still uncached would
        send those keys by key for good, so the next read, once they are stored, makes it."""
        missing = 0

        def entry(e: tuple[str, bytes]) -> bytes:
            nonlocal missing
            missing += e[1] == nowhere
            return bytes.fromhex(e[0]) + e[1]

        return _recorded([self.path], self.expected, entries, entry, lambda _: 0,
                         lambda: missing * 100 <= self.expected)


def recorded_parts(directory: Path, fingerprint: str, run: int, parts: int, count: int,
                   things: Iterable[T], key: Callable[[T], str]) -> Iterator[T]:
    """`things` (every task of a job, `count` of them, in task order) passed through, their
    keys stored as the index of each of `parts` parts once all have gone by: what the children
    of a forked expander would have stored (a run that called the API leaves the index its
    first rescore reads). Nothing is stored if the caller stops early.

    Args:
        directory: the cache folder the index goes in.
        fingerprint: the job's (Expansion.fingerprint), naming the index.
        run: the length of a run of consecutive tasks.
        parts: the number of parts.
        count: the job's tasks.
        things: every task, in order.
        key: each one's cache key.

    Returns:
        The same things, passed through.
    """
    paths = [KeyIndex(directory, fingerprint, run, part, parts, count).path
             for part in range(parts)]
    return _recorded(paths, count, things, lambda t: bytes.fromhex(key(t)),
                     lambda i: i // run % parts)


def _recorded(paths: list[Path], expected: int, things: Iterable[T],
              entry: Callable[[T], bytes], route: Callable[[int], int],
              keep: Callable[[], bool] = lambda: True) -> Iterator[T]:
    """`things` passed through, the entry of the i-th written to a temporary file beside
    paths[route(i)]; each put in place once all `expected` have gone by, if `keep()` then. A
    folder it cannot write to, or a full disk, only means no index: every thing still goes
    by."""
    temps = [p.with_name(f"{p.name}.{os.getpid()}.tmp") for p in paths]
    outs: list[IO[bytes]] = []
    stored = False
    try:
        try:
            paths[0].parent.mkdir(parents=True, exist_ok=True)
            outs.extend(open(t, "wb") for t in temps)  # noqa: SIM115  # closed below
            recording = True
        except OSError:
            recording = False
        seen = 0
        for thing in things:
            if recording:
                try:
                    outs[route(seen)].write(entry(thing))
                except OSError:
                    recording = False
            seen += 1
            yield thing
        if recording and seen == expected and keep():
            with contextlib.suppress(OSError):
                for out in outs:
                    out.close()
                for temp, path in zip(temps, paths, strict=True):
                    os.replace(temp, path)
                stored = True
    finally:
        for out in outs:
            with contextlib.suppress(OSError):
                out.close()
        if not stored:
            for temp in temps:
                with contextlib.suppress(OSError):
                    temp.unlink()
    if stored:
        _prune(paths[0].parent)


def _read(f: IO[bytes], width: int) -> Iterator[bytes]:
    with f:
        while data := f.read(width << 11):  # 2,048 whole entries
            yield from (data[i:i + width] for i in range(0, len(data), width))


def _prune(folder: Path) -> None:
    """Keep the KEEP newest index files; remove temporary files a killed child left (those
    older than STALE seconds: a live child's is younger)."""
    with contextlib.suppress(OSError):
        files = [(p, p.stat().st_mtime) for p in folder.iterdir()]
        done = sorted(((p, t) for p, t in files if not p.name.endswith(".tmp")),
                      key=lambda pt: pt[1], reverse=True)
        now = time.time()
        for old, _ in itertools.islice(done, KEEP, None):
            old.unlink(missing_ok=True)
        for temp, made in files:
            if temp.name.endswith(".tmp") and now - made > STALE:
                temp.unlink(missing_ok=True)
