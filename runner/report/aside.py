"""Work set aside: a report computed in a forked child on the machine's other core while this
process writes the others.

The reports of a large run are built from tables of ~100 bytes a task that only a fork shares
for free (copy-on-write): sending them to a fresh process would cost more than the work. So
`ForkedResult` forks where runner.children.forkable says it is safe (Linux, one thread, memory
for twice this process: `judge` starts with OPENBLAS_NUM_THREADS=1, runner.cli.main, so that
numpy and scipy start no threads of their own), and computes in place where it is not. The
child (a runner.children.Forked) pickles its result or exception to a pipe; a child that dies
without a result (killed, out of memory) is not an error: the work is done again in place.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import IO, Generic, TypeVar

from runner.children import Forked, forkable

__all__ = ["ForkedResult"]

T = TypeVar("T")


class ForkedResult(Generic[T]):
    """`work()` computed in a forked child from now on, or in place when `result` is asked for
    if forking is not safe. `result` returns it, or raises what it raised. As a context
    manager, a child whose result was never asked for (the caller failed first) is killed
    and reaped on the way out."""

    def __init__(self, work: Callable[[], T], *, name: str = "forked work",
                 fork: bool | None = None) -> None:
        """`name`: the child's, first on the line it writes if it fails."""
        self._work = work
        self._child: Forked | None = None
        if fork if fork is not None else forkable():
            self._child = Forked(self._send, name)

    def _send(self, pipe: IO[bytes]) -> None:
        """In the child: the work's result, or what it raised, pickled (nothing if that fails:
        the parent redoes the work)."""
        try:
            outcome: tuple[bool, object] = (True, self._work())
        except BaseException as exc:
            outcome = (False, exc)
        try:
            data = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # an unpicklable result or exception
            data = b""
        pipe.write(data)

    def __enter__(self) -> ForkedResult[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()

    def cancel(self) -> None:
        """Stop the child, if its result has not been taken."""
        if self._child is not None:
            self._child.stop()
            self._child = None

    def result(self) -> T:
        if self._child is None:
            return self._work()
        data = self._child.pipe.read()
        self._child.reap()
        self._child = None
        if not data:  # the child died or could not send it: do the work here
            return self._work()
        ok, value = pickle.loads(data)
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        result: T = value  # what work() returned
        return result
