"""Read cached answers ahead, in a second process, while this one judges them.

Judging a cached run is reading: every task's record comes out of SQLite and is decoded whole
(~1.1 KB, of which the request, which judging never reads, is ~60%), ~10 us a task, a third of a
cached 100k-task rerun. A `Reader` is a child process (`python -m runner.execute.store.reader DIR`)
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
line on stderr. A child that stops (killed, out of memory) costs nothing but its speed: the
parent reads what it had asked for, and the rest, itself (with the cache it was given), in
order; without one it raises a CacheError.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import os
import queue
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, TypeVar

import orjson

from runner.errors import CacheError
from runner.execute.store.cache import Cache
from runner.execute.store.child import Forked, second_core, spawn
from runner.execute.store.faults import damage
from runner.execute.store.keyindex import KeyIndex, recorded_parts
from runner.expand import Expansion, Task, task_key

__all__ = ["DAMAGED", "Answer", "Expander", "Plain", "Reader", "answer", "answer_of", "records",
           "tokens_of", "usable", "with_key_index"]

T = TypeVar("T")
DEPTH = 4
"""Batches asked for ahead of the one being judged."""
MIN_TASKS = 20_000
"""Below this, starting a process (~0.1 s) costs more than it saves (~10 us a task)."""
_LENGTH = 4
ANSWERS, HAS = b"a", b"h"  # the kinds of request


def _framed(data: bytes) -> bytes:
    """`data` as sent through a pipe here: its 4-byte big-endian length first."""
    return len(data).to_bytes(_LENGTH, "big") + data


def _unframed(pipe: IO[bytes]) -> bytes | None:
    """The next framed message from `pipe`; None at its end, or if it was cut short (the
    writer stopped writing it)."""
    if len(head := pipe.read(_LENGTH)) != _LENGTH:
        return None
    size = int.from_bytes(head, "big")
    return data if len(data := pipe.read(size)) == size else None


Plain = list[Any]
"""A plain answer: [text, finish_reason, usage as JSON text or None, source, time, prompt
tokens, completion tokens]."""
Answer = Plain | dict[str, Any]
"""What a reader sends of a record (see `answer`)."""
DAMAGED = "damaged"
"""The one key of what a damaged record gives instead of an answer: {"damaged": why} (see
faults.damage). Judging makes it its task's failure; the other tasks go on."""


def answer(record: Mapping[str, Any]) -> Answer:
    """What judging reads of a record (runner.reduce.judgments: the response's choices, usage
    and source), all a reader sends back of it. The usual answer, one choice without logprobs
    whose message content is text, goes as a `Plain` list: ~4 objects to decode where the
    record's part is ~14 (nested dicts), and its usage as JSON text that the judgment line
    embeds as it is (orjson.Fragment). Any other goes as a record to judging: the response's
    choices, usage, source and time. Both carry when the answer was stored and its tokens, for
    the reports' provenance (manifest.json's `answers`)."""
    response, usage, source = record["response"], record.get("usage"), record.get("source")
    choices = response.get("choices")
    if isinstance(choices, list) and len(choices) == 1 and isinstance(c := choices[0], dict) \
            and not c.get("logprobs") and isinstance(m := c.get("message") or {}, dict) \
            and isinstance(text := m.get("content") or "", str):
        return [text, c.get("finish_reason"),
                None if usage is None else orjson.dumps(usage).decode(), source,
                record.get("time"), *tokens_of(usage)]
    return {"response": {"choices": choices}, "usage": usage, "source": source,
            "time": record.get("time")}


def tokens_of(usage: Any) -> tuple[int, int]:
    """(prompt, completion) tokens of a response's usage; (0, 0) without one."""
    if not isinstance(usage, dict):
        return 0, 0
    try:
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    except (TypeError, ValueError):
        return 0, 0


_RESPONSE = b',"response":'


def answer_of(raw: bytes) -> Answer:
    """`answer` of a stored record, decoding only its end where that is safe: a record as
    answer_record writes it ends with "response", "usage", ..., "time", "source", after the request
    (~60% of its bytes), which judging never reads.

    `,"response":` cannot occur inside a JSON string (its quotes would be escaped), so its last
    occurrence is a key: the record's own, or one nested in a value after it. Nested, the text
    from there leaves a bracket unclosed before the record's end, and does not decode. So if
    `{` + the text from there decodes with "response", "usage", "time" and "source" in it, those are
    the record's last values for them (orjson, like json, keeps the last of a repeated key).
    Any other record is decoded whole."""
    at = raw.rfind(_RESPONSE)
    if at > 0:
        try:
            tail = orjson.loads(b"{" + raw[at + 1:])
        except orjson.JSONDecodeError:
            tail = None
        if tail and "usage" in tail and "source" in tail and "time" in tail and \
                isinstance(tail.get("response"), dict):
            return answer(tail)
    record = _record(raw)
    return record if DAMAGED in record else answer(record)


def _record(raw: bytes) -> dict[str, Any]:
    """The record `raw`, decoded whole, or {DAMAGED: why} if it is damaged."""
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        record = None
    if isinstance(record, dict) and isinstance(record.get("response"), dict):
        return record
    return {DAMAGED: damage(raw) or "not a cache record"}


def records(cache: Cache, keys: Sequence[str]) -> dict[str, Answer]:
    """get_many's records of the stored keys among `keys`, each damaged one as {DAMAGED: why}
    (judging's read in this process), where get_many raises."""
    return {key: _record(raw) for key, raw in cache.get_many_raw(keys).items()}


def usable(cache: object, tasks: int) -> bool:
    """Whether reading `tasks` answers of `cache` through a Reader pays: a diskcache folder, a
    large job and a second core for the child."""
    return isinstance(cache, Cache) and tasks >= MIN_TASKS and second_core()


class Reader:
    """A child process reading answers of the diskcache folder `directory`, and looking keys up
    in it (see the module docstring); use as a context manager, which always ends the child."""

    def __init__(self, directory: Path, here: Cache | None = None) -> None:
        """`here`: this process's cache of `directory`, to read with if the child stops."""
        self.directory, self._here = directory, here
        self._gone = False  # the child stopped: `here` reads
        self._child = spawn("runner.execute.store.reader", str(directory))

    def batches(self, batches: Iterator[list[T]], key: Callable[[T], str]
                ) -> Iterator[tuple[list[T], Mapping[str, Answer]]]:
        """Each batch with the answers of its stored keys, in order."""
        for batch, keys, reply in self._pipelined(batches, key, ANSWERS):
            got: list[Answer | None] = orjson.loads(reply)
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
            reply = self._receive(kind, keys)
            ask()
            yield batch, keys, reply

    def _send(self, kind: bytes, keys: Sequence[str]) -> None:
        if self._gone:
            return
        data = kind + "\n".join(keys).encode()
        stdin = self._child.stdin
        assert stdin is not None
        try:
            stdin.write(_framed(data))
            stdin.flush()
        except OSError:  # the child is gone (BrokenPipeError)
            self._lost()

    def _receive(self, kind: bytes, keys: Sequence[str]) -> bytes:
        """The reply to the oldest request (of `kind`, for `keys`): the child's, or, once it has
        stopped, read here."""
        stdout = self._child.stdout
        if not self._gone:
            assert stdout is not None
            if (body := _unframed(stdout)) is not None:
                return body
            self._lost()  # EOF, or a reply cut short: the child has stopped
        assert self._here is not None
        return _reply(self._here, kind, keys)

    def _lost(self) -> None:
        """The child stopped: from now on `here` reads (the requests it had not answered
        too), or, without one, the CacheError saying so is raised."""
        if self._here is None:
            raise self._failed()
        self._end()
        self._gone = True

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
            while (request := _unframed(requests)) is not None:
                asked.put(request)
        finally:
            asked.put(None)

    threading.Thread(target=take, daemon=True).start()
    while (data := asked.get()) is not None:
        kind, keys = data[:1], data[1:].decode().split("\n") if len(data) > 1 else []
        replies.write(_framed(_reply(cache, kind, keys)))
        replies.flush()


def _reply(cache: Cache, kind: bytes, keys: Sequence[str]) -> bytes:
    """The reply to a request of `kind` for `keys` (see the module docstring)."""
    if kind == HAS:
        found = cache.has_many(keys)
        return bytes(k in found for k in keys)
    return orjson.dumps(_answers(cache, keys))


def _answers(cache: Cache, keys: Sequence[str]) -> list[Answer | None]:
    """What judging reads of each key's record (`answer_of`), None where none is stored."""
    raws = cache.get_many_raw(keys)
    return [answer_of(r) if (r := raws.get(k)) is not None else None for k in keys]


def main(argv: Sequence[str]) -> NoReturn:
    """The child process: serve, then leave with os._exit. A normal exit would close stdin
    while the thread taking requests may be blocked reading it, holding its lock: Python's
    shutdown then aborts ("could not acquire lock ... possibly due to daemon threads")."""
    # Ctrl-C reaches the whole process group: the parent decides, and ends this child by
    # closing its stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    code = 0
    try:
        with Cache(Path(argv[0]), read_only=True) as cache:
            cache.map_reads()
            serve(cache, sys.stdin.buffer, sys.stdout.buffer)
    except Exception as exc:  # one line for the parent's message, not a traceback
        with contextlib.suppress(OSError):
            os.write(2, f"{type(exc).__name__}: {exc}\n".encode(errors="replace"))
        code = 1
    os._exit(code)


class Expander:
    """Forked children that expand a job's tasks themselves and read their answers, for a
    rescore (or a run's cached-first pass), which otherwise renders and hashes every request
    on its one core (~0.6 s of a 100k-task rescore). The children share the Expansion
    copy-on-write. Tasks are cut in runs of `CHUNK` (see Expansion.part): child 0 takes runs
    0, 2, 4, ..., child 1 runs 1, 3, 5, ..., so that one child renders and reads its next run
    while this process judges the other's (one child alone could not keep up: it does most
    of a rescore's work). Each child sends every batch's keys and answers (`answer`), in task
    order, through a pipe that holds a whole run. This process makes the tasks from
    `Expansion.skeleton()`, which renders nothing. A job read before has its keys in the
    cache folder's key index (runner.execute.store.keyindex): the children then render nothing
    either. Fork only where `forkable()` says so. A child that stops early (killed, out of
    memory) is not an error: the rest is read here."""

    def __init__(self, cache: Cache, expansion: Expansion, size: int, count: int) -> None:
        self.cache, self.expansion, self.size = cache, expansion, size
        self.chunk = _run(size)
        self._children: list[Forked] = []
        # The children end with this object if `batches` never ran to its end or was never
        # started (a caller that failed first), not only when close() is called.
        self.close = weakref.finalize(self, _stop_all, self._children)
        for part in range(PARTS):
            self._children.append(Forked(
                functools.partial(_expand_and_read, directory=cache.directory,
                                  expansion=expansion, size=size, chunk=self.chunk, part=part,
                                  count=count),
                "cache reader", pipe_size=PIPE_SIZE,
                siblings=[c.pipe for c in self._children]))

    def batches(self) -> Generator[tuple[list[Task], Mapping[str, Answer]], None, None]:
        """Every task in batches of `size`, each with the answers of its stored keys; closing
        it (or stopping early) stops the children."""
        try:
            yield from self._batches()
        finally:
            self.close()

    def _batches(self) -> Iterator[tuple[list[Task], Mapping[str, Answer]]]:
        keys_in: collections.deque[str] = collections.deque()  # the skeleton's keys
        skeleton, done = self.expansion.skeleton(iter(keys_in.popleft, None)), 0
        for run in itertools.count():
            pipe, got = self._children[run % PARTS].pipe, 0
            while got < self.chunk and (message := _message(pipe)) is not None:
                keys, answers = message
                keys_in.extend(keys)
                batch = list(itertools.islice(skeleton, len(keys)))
                if keys_in:
                    raise CacheError(f"{self.cache.directory}: the cache reader expanded more "
                                     "tasks than the job has; report this as a bug")
                done += len(batch)
                got += len(batch)
                yield batch, {k: a for k, a in zip(keys, answers, strict=True) if a is not None}
            if got < self.chunk:  # that child has sent all it will
                break
        self.close()
        keys_in.append("")
        if next(skeleton, None) is None:
            return
        # A child stopped early: the rest is expanded and read here.
        stream = self.expansion.tasks(done)
        while batch := list(itertools.islice(stream, self.size)):
            yield batch, records(self.cache, [t.key for t in batch])

    def __enter__(self) -> Expander:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def with_key_index(cache: object, expansion: Expansion, size: int, count: int,
                   tasks: Iterator[Task]) -> Iterator[Task]:
    """`tasks` (every task of `expansion`, `count` of them, in order) passed through; once
    they have all gone by, their keys are stored as the key index that an Expander reading
    this job in batches of `size` finds (runner.execute.store.keyindex): the pool's dispatch of a
    whole job leaves it for the job's first rescore. Only where an Expander could read it."""
    if not isinstance(cache, Cache) or not usable(cache, count):
        return tasks
    return recorded_parts(cache.directory, expansion.fingerprint(), _run(size), PARTS, count,
                          tasks, task_key)


def _run(size: int) -> int:
    """The tasks in a run of an Expander's child: CHUNK, in whole batches of `size`."""
    return max(1, CHUNK // size) * size


def _stop_all(children: list[Forked]) -> None:
    """Stop the children still going (the caller stopped reading), and reap them: an
    Expander's close()."""
    for child in children:
        child.stop()


CHUNK = 2048
"""Tasks in one run of an Expander's child: ~0.6 MB of answers, within PIPE_SIZE."""
PARTS = 2
PIPE_SIZE = 1 << 20  # Linux's default /proc/sys/fs/pipe-max-size


def _message(pipe: IO[bytes]) -> tuple[list[str], list[Answer | None]] | None:
    """A batch's [keys, answers] from an Expander's child; None at the end of its pipe, or if
    it was cut short (the child died writing it)."""
    if (body := _unframed(pipe)) is None:
        return None
    try:
        keys, answers = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return keys, answers


def _expand_and_read(out: IO[bytes], *, directory: Path, expansion: Expansion, size: int,
                     chunk: int, part: int, count: int) -> None:
    """An Expander's child: write every batch's [keys, answers] of its runs to `out`, each as
    soon as it is made (a whole run fits in the pipe: the child goes on with its next run
    while this process reads the other child's). The keys come from the key index when this
    job's are stored there, else from rendering the requests, and are then stored there
    (runner.execute.store.keyindex)."""
    with Cache(directory, read_only=True) as cache:  # its own connection, not the parent's
        cache.map_reads()
        index = KeyIndex(directory, expansion.fingerprint(), chunk, part, PARTS, count)
        stream = index.keys()
        if stream is None:
            stream = index.recorded(t.key for t in expansion.part(chunk, part, PARTS))
        while keys := list(itertools.islice(stream, size)):
            out.write(_framed(orjson.dumps([keys, _answers(cache, keys)])))
            out.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
