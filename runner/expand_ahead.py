"""Expanding ahead: forked children that render a large job's tasks and read their answers
while this process judges them (`Expander`), and the key index a run leaves for them
(`with_key_index`). Next to runner.expand, not in the storage layer: the store hands out keys
and bytes (runner.execute.store.reader.sent_of), this module makes tasks of them.

What it buys, as a whole process, with the reader child (runner.execute.store.reader): a fully
cached `judge rescore` took 1.24x as long with JUDGE_PROCESSES=1 (no child) as with them, at
100k and at 1M tasks (bench/mechanisms.py). The key index (runner.execute.store.keyindex) spares
the children rendering and hashing a job they have read before: 1.22-1.25x (its docstring).
From PostgreSQL, the children keep the located index (keyindex; PgCache.get_many_raw_at) and
read rows by place: 1.44x for a 10M-task `judge rescore`, 1.58x for a cached `judge run`
(`python -m bench.located`). Rounds and loads: bench/README.md "What each mechanism buys".
"""

from __future__ import annotations

import collections
import functools
import itertools
import weakref
from collections.abc import Callable, Generator, Iterator, Mapping
from typing import IO, TYPE_CHECKING, TypeGuard, cast

import orjson

from runner.children import Forked, forkable, framed, second_core, unframed
from runner.errors import CacheError
from runner.execute.store import reader
from runner.execute.store.answers import Answer, Sent, received
from runner.execute.store.backend import CacheBackend, answers
from runner.execute.store.cache import Cache
from runner.execute.store.keyindex import KeyIndex, recorded_parts
from runner.execute.store.reader import Rereadable, read_here, sent_of
from runner.expand import Expansion
from runner.tasks import Task, task_key

if TYPE_CHECKING:  # psycopg takes ~0.25 s to import: only a PostgreSQL cache pays it
    from runner.execute.store.pgcache import PgCache

__all__ = ["Expander", "expanded", "expander_pays", "with_key_index"]


def expanded(cache: CacheBackend, expansion: Expansion, size: int, count: int
             ) -> Generator[tuple[list[Task], Mapping[str, Answer]], None, None]:
    """Every task of `expansion` (`count` of them: expansion.count()), in order, in batches of
    `size`, each with the Answers of its stored keys: a rescore's read. For a large job on a
    diskcache folder or PostgreSQL, forked children expand and read while this process judges
    (`Expander`: the tasks then come without their request bodies); they are forked by this
    call, so that they work while the caller prepares. Otherwise a reader process reads, or
    this process (runner.execute.store.backend.answers).

    Args:
        cache: where the answers are read from; expansion: the job's tasks.
        size: the tasks per batch; count: the number of tasks (not counted again here).

    Returns:
        The batches in task order, each a list of tasks and their stored answers by key.
    """
    if expander_pays(cache, count):
        cache.rest()  # a PgCache's watchdog threads end: the next call starts them again
        if forkable():
            return Expander(cache, expansion, size, count).batches()
    return answers(cache, expansion.tasks(), task_key, size, count)


def expander_pays(cache: object, count: int) -> TypeGuard[Rereadable]:
    """Whether an Expander reads `count` tasks' answers of `cache`: a cache folder or
    PostgreSQL, a large job and a second core for the children (where the process may also
    fork now: runner.children.forkable).

    Args:
        cache: the open cache; count: the number of tasks to read.

    Returns:
        True when an Expander would read them.
    """
    return isinstance(cache, Rereadable) and count >= reader.MIN_TASKS and second_core()


class Expander:
    """Forked children that expand a job's tasks themselves and read their answers, for a
    rescore (or a run's cached-first pass), which otherwise renders and hashes every request
    on its one core (~0.6 s of a 100k-task rescore). The children share the Expansion
    copy-on-write. Tasks are cut in runs of `CHUNK` (see Expansion.part): child 0 takes runs
    0, 2, 4, ..., child 1 runs 1, 3, 5, ..., so that one child renders and reads its next run
    while this process judges the other's (one child alone could not keep up). Each child
    sends every batch's keys and answers (runner.execute.store.answers.sent), in task order,
    through a pipe that holds a whole run. This process makes the tasks from
    `Expansion.skeleton()`, which renders nothing. A job read before has its keys in the
    cache folder's key index (runner.execute.store.keyindex): the children then render nothing
    either. Fork only where `forkable()` says so. A child that stops early (killed, out of
    memory) is not an error: the rest is read here."""

    def __init__(self, cache: Rereadable, expansion: Expansion, size: int, count: int) -> None:
        self.cache, self.expansion, self.size = cache, expansion, size
        self.chunk = _run(size)
        self._children: list[Forked] = []
        # The children end with this object if `batches` never ran to its end or was never
        # started (a caller that failed first), not only when close() is called.
        self.close = weakref.finalize(self, _stop_all, self._children)
        for part in range(PARTS):
            self._children.append(Forked(
                functools.partial(_expand_and_read, cache=cache, expansion=expansion,
                                  size=size, chunk=self.chunk, part=part, count=count),
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
                keys, sent_batch = message
                keys_in.extend(keys)
                batch = list(itertools.islice(skeleton, len(keys)))
                if keys_in:
                    raise CacheError(f"{_where(self.cache)}: the cache reader expanded more "
                                     "tasks than the job has; report this as a bug")
                done += len(batch)
                got += len(batch)
                yield batch, {k: received(a) for k, a in zip(keys, sent_batch, strict=True)
                              if a is not None}
            if got < self.chunk:  # that child has sent all it will
                break
        keys_in.append("")
        if next(skeleton, None) is None:  # every task read: the children are ending
            for child in self._children:
                child.reap()  # not killed: each stores its part of the key index as it ends
            self.close()
            return
        self.close()
        # A child stopped early: the rest is expanded and read here.
        stream = self.expansion.tasks(done)
        while batch := list(itertools.islice(stream, self.size)):
            yield batch, read_here(self.cache, [t.key for t in batch])

    def __enter__(self) -> Expander:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _where(cache: Rereadable) -> str:
    return str(cache.directory) if isinstance(cache, Cache) else getattr(cache, "location", "")


def with_key_index(cache: object, expansion: Expansion, size: int, count: int,
                   tasks: Iterator[Task]) -> Iterator[Task]:
    """`tasks` (every task of `expansion`, `count` of them, in order) passed through; once
    they have all gone by, their keys are stored as the key index that an Expander reading
    this job in batches of `size` finds (runner.execute.store.keyindex): the pool's dispatch of a
    whole job leaves it for the job's first rescore. Only where an Expander could read it.

    Args:
        cache: the open cache; only a cache folder keeps a key index.
        expansion, count, tasks: the job, its number of tasks, and every task in order.
        size: the batch size a later Expander reads with.

    Returns:
        The same tasks, recording their keys as they pass where an Expander could use them.
    """
    if not expander_pays(cache, count) or not isinstance(cache, Cache):
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


def _message(pipe: IO[bytes]) -> tuple[list[str], list[Sent | None]] | None:
    """A batch's [keys, answers] from an Expander's child; None at the end of its pipe, or if
    it was cut short (the child died writing it)."""
    if (body := unframed(pipe)) is None:
        return None
    try:
        keys, sent_batch = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return keys, sent_batch


def _expand_and_read(out: IO[bytes], *, cache: Rereadable, expansion: Expansion,
                     size: int, chunk: int, part: int, count: int) -> None:
    """An Expander's child: write every batch's [keys, answers] of its runs to `out`, each as
    soon as it is made (a whole run fits in the pipe: the child goes on with its next run
    while this process reads the other child's). The keys come from the key index when this
    job's are stored (runner.execute.store.keyindex), else from rendering the requests, and
    are then stored: in a cache folder, in its `keys/`; for PostgreSQL, in a folder of this
    machine (PgCache.index_folder), with each row's place in the table, where the next read
    finds it without the key's index (PgCache.get_many_raw_at)."""
    with cache.reopened() as own:  # its own connection, not the parent's
        def send(keys: list[str], raws: Mapping[str, bytes]) -> None:
            out.write(framed(orjson.dumps([keys, sent_of(raws, keys)])))
            out.flush()

        if not isinstance(own, Cache):  # PostgreSQL: the other Rereadable
            pg = cast("PgCache", own)
            _read_located(send, pg, KeyIndex(pg.index_folder(), expansion.fingerprint(),
                                             chunk, part, PARTS, count, located=True),
                          lambda: (t.key for t in expansion.part(chunk, part, PARTS)), size)
            return
        index = KeyIndex(own.directory, expansion.fingerprint(), chunk, part, PARTS, count)
        stream = index.keys()
        if stream is None:
            stream = index.recorded(t.key for t in expansion.part(chunk, part, PARTS))
        while keys := list(itertools.islice(stream, size)):
            send(keys, own.get_many_raw(keys))


def _read_located(send: Callable[[list[str], Mapping[str, bytes]], None], cache: PgCache,
                  index: KeyIndex, render: Callable[[], Iterator[str]], size: int) -> None:
    """_expand_and_read from PostgreSQL: by place where the located index is stored, else by
    key (`render()`, in batches of `size`), storing the index as the keys go by."""
    # not at the top: psycopg (pgcache 0.29 s to import); loaded already, `cache` is a PgCache
    from runner.execute.store.pgcache import NOWHERE

    located = index.located()
    if located is not None:
        moved = 0
        while batch := list(itertools.islice(located, size)):
            keys = [key for key, _ in batch]
            raws, by_key = cache.get_many_raw_at(keys, [place for _, place in batch])
            moved += by_key
            send(keys, raws)
        if moved * 100 > index.expected:  # answers stored since, or rows moved: made anew
            index.path.unlink(missing_ok=True)  # by the next read
        return

    def read_by_key() -> Iterator[tuple[str, bytes]]:
        rendered = render()
        while keys := list(itertools.islice(rendered, size)):
            raws, places = cache.get_many_raw_located(keys)
            send(keys, raws)
            yield from ((key, places.get(key, NOWHERE)) for key in keys)

    collections.deque(index.recorded_located(read_by_key(), NOWHERE), maxlen=0)
