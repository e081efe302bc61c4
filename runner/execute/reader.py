"""Read cached answers ahead, in a second process, while this one judges them.

Judging a cached run is reading: every task's record comes out of SQLite and is decoded whole
(~1.1 KB, of which the request, which judging never reads, is ~60%), ~10 us a task, a third of a
cached 100k-task rerun. A `Reader` is a child process (`python -m runner.execute.reader DIR`)
that does that part on the machine's other core: the parent sends batches of keys ahead, the
child reads and decodes their records and sends back only what judging reads of each (`answer`:
the response's choices, usage and source), one small orjson array a batch, which the parent
decodes in ~0.5 us a task.

It also looks keys up (`marks`): the pool's and plan's cache-state lookups of a large job,
made while the parent expands the next tasks.

Protocol, on the child's stdin and stdout: a request is a 4-byte big-endian length, a kind
(b"a": answers, b"h": has) and the keys joined by newlines. The reply is a length and, for
answers, an orjson array, one answer (or null: not cached) per key, in order; for has, one byte
per key, 1 if stored. EOF on stdin ends the child. Any failure in the child ends it with one
line on stderr, which the parent raises as a CacheError.
"""

from __future__ import annotations

import collections
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import orjson

from runner.errors import CacheError
from runner.execute.cache import Cache

__all__ = ["Reader", "answer", "usable"]

T = TypeVar("T")
DEPTH = 4
"""Batches asked for ahead of the one being judged."""
MIN_TASKS = 20_000
"""Below this, starting a process (~0.1 s) costs more than it saves (~10 us a task)."""
_LENGTH = 4
ANSWERS, HAS = b"a", b"h"  # the kinds of request


def answer(record: Mapping[str, Any]) -> dict[str, Any]:
    """What judging reads of a record (runner.reduce.judgments: the response's choices, usage
    and source), itself a record to judging: all a reader sends back of it."""
    return {"response": {"choices": record["response"].get("choices")},
            "usage": record.get("usage"), "source": record.get("source")}


def usable(cache: object, tasks: int) -> bool:
    """Whether reading `tasks` answers of `cache` through a Reader pays: a diskcache folder, a
    large job and a second core for the child."""
    if not isinstance(cache, Cache) or tasks < MIN_TASKS:
        return False
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(
        os.cpu_count() or 1)
    return len(cores) >= 2


class Reader:
    """A child process reading answers of the diskcache folder `directory`, and looking keys up
    in it (see the module docstring); use as a context manager, which always ends the child."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        # This very runner package, whatever the current folder holds: -P keeps the folder off
        # sys.path (a user's own ./runner would shadow it), and PYTHONPATH leads to ours.
        ours = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (ours, os.environ.get("PYTHONPATH")) if p)}
        self._child = subprocess.Popen(
            [sys.executable, "-P", "-m", "runner.execute.reader", str(directory)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)

    def batches(self, batches: Iterator[list[T]], key: Callable[[T], str]
                ) -> Iterator[tuple[list[T], dict[str, dict[str, Any]]]]:
        """Each batch with the answers of its stored keys, in order."""
        for batch, keys, reply in self._pipelined(batches, key, ANSWERS):
            got: list[dict[str, Any] | None] = orjson.loads(reply)
            yield batch, {k: a for k, a in zip(keys, got, strict=True) if a is not None}

    def marks(self, batches: Iterator[list[T]], key: Callable[[T], str]
              ) -> Iterator[tuple[list[T], bytes]]:
        """Each batch with a byte per thing, 1 if its key is stored, in order."""
        for batch, _, reply in self._pipelined(batches, key, HAS):
            yield batch, reply

    def _pipelined(self, batches: Iterator[list[T]], key: Callable[[T], str], kind: bytes
                   ) -> Iterator[tuple[list[T], list[str], bytes]]:
        """Each batch, its keys and the child's reply. DEPTH batches are asked for before a
        reply is read, so the child reads while the caller, and the iterator making the
        batches, work."""
        stream = iter(batches)
        pending: collections.deque[tuple[list[T], list[str]]] = collections.deque()

        def ask() -> None:
            if (batch := next(stream, None)) is not None:
                keys = [key(t) for t in batch]
                self._send(kind, keys)
                pending.append((batch, keys))

        for _ in range(DEPTH):
            ask()
        while pending:
            batch, keys = pending.popleft()
            reply = self._receive()
            ask()
            yield batch, keys, reply

    def _send(self, kind: bytes, keys: Sequence[str]) -> None:
        data = kind + "\n".join(keys).encode()
        stdin = self._child.stdin
        assert stdin is not None
        try:
            stdin.write(len(data).to_bytes(_LENGTH, "big") + data)
            stdin.flush()
        except OSError:  # the child is gone (BrokenPipeError)
            raise self._failed() from None

    def _receive(self) -> bytes:
        stdout = self._child.stdout
        assert stdout is not None
        head = stdout.read(_LENGTH)
        size = int.from_bytes(head, "big")
        body = stdout.read(size) if len(head) == _LENGTH else b""
        if len(head) < _LENGTH or len(body) < size:  # EOF: the child has stopped
            raise self._failed()
        return body

    def _failed(self) -> CacheError:
        """The error to raise for a child that stopped, with the line it left on stderr."""
        self._end()
        stderr = self._child.stderr
        said = stderr.read().decode(errors="replace").strip() if stderr is not None else ""
        self.close()
        last = said.splitlines()[-1] if said else f"exit status {self._child.returncode}"
        return CacheError(f"{self.directory}: the cache reader process stopped ({last}); "
                          "rerun, and if it happens again check the folder with "
                          "`judge cache stats`")

    def _end(self) -> None:
        """End the child: its stdin and stdout closed (EOF ends it; a reply it is still writing
        fails), then a kill if it has not gone within 10 s."""
        for pipe in (self._child.stdin, self._child.stdout):
            if pipe is not None and not pipe.closed:
                try:
                    pipe.close()
                except OSError:  # a write the child never read: it is gone anyway
                    pass
        try:
            self._child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()

    def close(self) -> None:
        """End the child and close every pipe to it."""
        self._end()
        if self._child.stderr is not None:
            self._child.stderr.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(cache: Cache, requests: IO[bytes], replies: IO[bytes]) -> None:
    """The child's loop: answer each request (see the module docstring) until EOF.

    A thread takes the requests off the pipe as they come: the parent writes several before
    it reads a reply, and a child that stopped reading while blocked writing a large reply
    would leave the parent blocked writing to a full pipe (any pipe size: macOS's is 16 KiB,
    Linux's a page once a user holds too many)."""
    asked: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def take() -> None:
        try:
            while len(head := requests.read(_LENGTH)) == _LENGTH:
                asked.put(requests.read(int.from_bytes(head, "big")))
        finally:
            asked.put(None)

    threading.Thread(target=take, daemon=True).start()
    while (data := asked.get()) is not None:
        kind, keys = data[:1], data[1:].decode().split("\n") if len(data) > 1 else []
        if kind == HAS:
            found = cache.has_many(keys)
            body = bytes(k in found for k in keys)
        else:
            records = cache.get_many(keys)
            body = orjson.dumps([answer(r) if (r := records.get(k)) is not None else None
                                 for k in keys])
        replies.write(len(body).to_bytes(_LENGTH, "big") + body)
        replies.flush()


def main(argv: Sequence[str]) -> int:
    # Ctrl-C reaches the whole process group: the parent decides, and ends this child by
    # closing its stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Cache(Path(argv[0])) as cache:
            cache.map_reads()
            serve(cache, sys.stdin.buffer, sys.stdout.buffer)
    except Exception as exc:  # one line for the parent's message, not a traceback
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
