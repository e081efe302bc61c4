"""Read cached answers ahead, in a second process, while this one judges them.

Judging a cached run is reading: every task's record comes out of SQLite and is decoded whole
(~1.1 KB, of which the request, which judging never reads, is ~60%), ~10 us a task, a third of a
cached 100k-task rerun. A `Reader` is a child process (`python -m runner.execute.store.reader DIR`,
a runner.children.Spawned) that does that part on the machine's other core: the parent sends
batches of keys ahead, the child reads and decodes their records and sends back only what
judging reads of each (store/answers.py: `sent`), one small orjson array a batch, which the
parent decodes in ~0.5 us a task into `Answer`s. What it buys, as a whole process: with the
forked expanders (runner/expand_ahead.py), the "second-core machinery" of bench/README.md
"What each mechanism buys".

It also looks keys up (`marks`): the pool's and plan's cache-state lookups of a large job,
made while the parent expands the next tasks.

Protocol, in runner.children's frames on the child's stdin and stdout: a request is a kind
(b"a": answers, b"h": has) and the keys joined by newlines. The reply is, for answers, an orjson
array, one answer (or null: not cached) per key, in order; for has, one byte per key, 1 if
stored. EOF on stdin ends the child. Any failure in the child ends it with one line on stderr. A
child that stops (killed, out of memory) costs nothing but its speed: the parent reads what it
had asked for, and the rest, itself (with the cache it was given), in order; without one it
raises a CacheError.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, NoReturn, Protocol, TypeVar, runtime_checkable

import orjson

from runner.children import Spawned, framed, second_core, unframed
from runner.errors import CacheError
from runner.execute.store.answers import Answer, Sent, of_raw, received, sent_of_raw
from runner.execute.store.cache import Cache

__all__ = ["MIN_TASKS", "Reader", "Rereadable", "read_here", "reader_pays", "sent_of"]

T = TypeVar("T")
DEPTH = 4
"""Batches asked for ahead of the one being judged."""
MIN_TASKS = 20_000
"""Below this, starting a process (~0.1 s) costs more than it saves (~10 us a task)."""
ANSWERS, HAS = b"a", b"h"  # the kinds of request


@runtime_checkable
class Rereadable(Protocol):
    """A cache whose stored bytes can be read in batches, and which a forked child can open
    again on a connection of its own: a diskcache folder (Cache) or PostgreSQL
    (runner.execute.store.pgcache.PgCache; runner.expand_ahead forks its readers)."""

    def get_many_raw(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The stored bytes of the stored keys among `keys`.

        Returns:
            The bytes by key.
        """

    def reopened(self) -> Rereadable:
        """The same cache on a connection of its own, for reading (in a forked child)."""

    def rest(self) -> None:
        """End any thread of the cache's own until its next call (before a fork)."""

    def close(self) -> None:
        """Close the connection."""

    def __enter__(self) -> Rereadable: ...

    def __exit__(self, *exc: object) -> None: ...


def read_here(cache: Rereadable, keys: Sequence[str]) -> dict[str, Answer]:
    """The Answers of the stored keys among `keys`, read in this process (a damaged record's
    says so, where get_many raises).

    Returns:
        The stored keys' Answers.
    """
    return {key: of_raw(raw) for key, raw in cache.get_many_raw(keys).items()}


def reader_pays(cache: object, tasks: int) -> bool:
    """Whether reading `tasks` answers of `cache` through a Reader pays: a diskcache folder, a
    large job and a second core for the child.

    Returns:
        True when a reader process would read them.
    """
    return isinstance(cache, Cache) and tasks >= MIN_TASKS and second_core()


class Reader(contextlib.AbstractContextManager["Reader"]):
    """A child process reading answers of the diskcache folder `directory`, and looking keys up
    in it (see the module docstring); use as a context manager, which always ends the child."""

    def __init__(self, directory: Path, here: Cache | None = None) -> None:
        """`here`: this process's cache of `directory`, to read with if the child stops."""
        self.directory, self._here = directory, here
        self._gone = False  # the child stopped: `here` reads
        self._child = Spawned("runner.execute.store.reader", str(directory))

    def batches(self, batches: Iterator[list[T]], key: Callable[[T], str]
                ) -> Iterator[tuple[list[T], Mapping[str, Answer]]]:
        """Each batch with the Answers of its stored keys, in order.

        Args:
            batches, key: the things, in batches, and each one's cache key.

        Yields:
            Each batch and its stored keys' Answers.
        """
        for batch, keys, reply in self._pipelined(batches, key, ANSWERS):
            if isinstance(reply, dict):  # read here: the child stopped
                yield batch, reply
                continue
            got: list[Sent | None] = orjson.loads(reply)
            yield batch, {k: received(a) for k, a in zip(keys, got, strict=True)
                          if a is not None}

    def marks(self, batches: Iterator[list[T]], key: Callable[[T], str]
              ) -> Iterator[tuple[list[T], bytes]]:
        """Each batch with a byte per thing, 1 if its key is stored, in order.

        Args:
            batches, key: the things, in batches, and each one's cache key.

        Yields:
            Each batch and its marks.
        """
        for batch, _, reply in self._pipelined(batches, key, HAS):
            assert isinstance(reply, bytes)
            yield batch, reply

    def _pipelined(self, batches: Iterator[list[T]], key: Callable[[T], str], kind: bytes
                   ) -> Iterator[tuple[list[T], list[str], bytes | dict[str, Answer]]]:
        """Each batch, its keys and the child's reply (or, once it has stopped, the reply read
        here). DEPTH batches are asked for before a reply is read, so the child reads while the
        caller, and the iterator making the batches, work."""
        stream = iter(batches)
        pending: collections.deque[tuple[list[T], list[str]]] = collections.deque()

        def ask() -> None:
            if (batch := next(stream, None)) is not None:
                keys = [key(t) for t in batch]
                if not self._gone and not self._child.send(kind + "\n".join(keys).encode()):
                    self._lost()
                pending.append((batch, keys))

        for _ in range(DEPTH):
            ask()
        while pending:
            batch, keys = pending.popleft()
            reply = self._receive(kind, keys)
            ask()
            yield batch, keys, reply

    def _receive(self, kind: bytes, keys: Sequence[str]) -> bytes | dict[str, Answer]:
        """The reply to the oldest request (of `kind`, for `keys`): the child's, or, once it has
        stopped, read here."""
        if not self._gone:
            if (body := self._child.receive()) is not None:
                return body
            self._lost()  # EOF, or a reply cut short: the child has stopped
        assert self._here is not None
        return _reply(self._here, HAS, keys) if kind == HAS else read_here(self._here, keys)

    def _lost(self) -> None:
        """The child stopped: from now on `here` reads (the requests it had not answered
        too), or, without one, the CacheError saying so is raised."""
        self._child.end()
        self._gone = True
        if self._here is None:
            last = self._child.last_words()
            self.close()
            raise CacheError(f"{self.directory}: the cache reader process stopped ({last}); "
                             "rerun, and if it happens again check the folder with "
                             "`judge cache stats`")

    def close(self) -> None:
        """End the child and close every pipe to it."""
        self._child.close()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(cache: Cache, requests: IO[bytes], replies: IO[bytes]) -> None:
    """The child's loop: answer each request (see the module docstring) until EOF.

    A thread takes the requests off the pipe as they come: the parent writes several before
    it reads a reply, and a child that stopped reading while blocked writing a large reply
    would leave the parent blocked writing to a full pipe (any pipe size: macOS's is 16 KiB,
    Linux's a page once a user holds too many)."""
    asked: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def take() -> None:
        try:
            while (request := unframed(requests)) is not None:
                asked.put(request)
        finally:
            asked.put(None)

    threading.Thread(target=take, daemon=True).start()
    while (data := asked.get()) is not None:
        kind, keys = data[:1], data[1:].decode().split("\n") if len(data) > 1 else []
        replies.write(framed(_reply(cache, kind, keys)))
        replies.flush()


def _reply(cache: Cache, kind: bytes, keys: Sequence[str]) -> bytes:
    """The reply to a request of `kind` for `keys` (see the module docstring)."""
    if kind == HAS:
        found = cache.has_many(keys)
        return bytes(k in found for k in keys)
    return orjson.dumps(sent_of(cache.get_many_raw(keys), keys))


def sent_of(raws: Mapping[str, bytes], keys: Sequence[str]) -> list[Sent | None]:
    """What a child sends of each key's record (answers.sent_of_raw) in `raws` (stored bytes
    by key), None where none is stored, in the order of `keys`.

    Returns:
        One entry per key.
    """
    return [sent_of_raw(r) if (r := raws.get(k)) is not None else None for k in keys]


def main(argv: Sequence[str]) -> NoReturn:
    """The child process: serve, then leave with os._exit. A normal exit would close stdin
    while the thread taking requests may be blocked reading it, holding its lock: Python's
    shutdown then aborts ("could not acquire lock ... possibly due to daemon threads").

    Args:
        argv: the cache folder's path.
    """
    # Ctrl-C reaches the whole process group: the parent decides, and ends this child by
    # closing its stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 0
    try:
        with Cache(Path(argv[0]), read_only=True) as cache:
            _serve(cache, sys.stdin.buffer, sys.stdout.buffer)
    except Exception as exc:  # one line for the parent's message, not a traceback
        with contextlib.suppress(OSError):
            os.write(2, f"{type(exc).__name__}: {exc}\n".encode(errors="replace"))
        code = 1
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
