"""The folding process (`python -m runner.execute.store.folding FOLDER`, started by
runner.execute.store.journal.Folder): fold each journal named on a line of its input into the cache
folder's SQLite, and answer "ok" or "error: <why>" on a line; at an empty line (the parent is
done) or the end of its input (the parent was killed), fold every journal no live process
holds, and leave."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn

from runner.errors import CacheError
from runner.execute.store.cache import Cache
from runner.execute.store.journal import ORPHAN_WAIT_S, fold_file, recover

NICE = 10  # where there is no SCHED_IDLE


def main(argv: list[str]) -> NoReturn:
    # Ctrl-C reaches the whole process group: the parent decides, and ends this child with an
    # empty line.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _below_everything()
    parent, directory, code = os.getppid(), Path(argv[0]), 0
    try:
        with Cache(directory) as cache:
            done = False
            for line in sys.stdin.buffer:
                if line == b"\n":
                    done = True
                    break
                try:
                    fold_file(Path(os.fsdecode(line.rstrip(b"\n"))), cache.put_raw, wait=True)
                    reply = "ok"
                except CacheError as exc:
                    reply = f"error: {exc}".replace("\n", " ")
                with contextlib.suppress(OSError):  # a killed parent: fold the rest all the same
                    os.write(1, f"{reply}\n".encode())
            if not done:
                _outlive(parent)
            recover(directory, cache.put_raw)
    except (CacheError, OSError) as exc:
        with contextlib.suppress(OSError):
            os.write(2, f"{exc}\n".encode(errors="replace"))
        code = 1
    sys.exit(code)


def _below_everything() -> None:
    """Run only when a core has nothing else to do (Linux's SCHED_IDLE; elsewhere nice 10).
    Then a core running only this process counts as idle to the scheduler, and the run, or a
    model server beside it, is woken there at once instead of waiting for a time slice. This
    work can wait: the run waits for it only when MAX_SENT journals are pending and at the end,
    and then no longer than STARVED_S before folding them itself (runner.execute.store.cache).
    Measured with the throughput benchmark's zero-latency server on 2 cores: runner/bare 0.78-0.80
    against 0.74-0.77 at nice 10 and 0.72 at the run's own priority."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(NICE)


def _outlive(parent: int) -> None:
    """Wait until the parent is gone for good: its input pipe can close before the lock of
    the journal it was writing ends, and only then is this process given another parent."""
    deadline = time.monotonic() + ORPHAN_WAIT_S
    while os.getppid() == parent and time.monotonic() < deadline:
        time.sleep(0.01)


if __name__ == "__main__":
    main(sys.argv[1:])
