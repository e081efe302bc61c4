"""Child processes a test starts, each ended by the same test, and waits on a condition.

A test that starts a process through the `processes` fixture (import `processes_fixture`
into the test module) cannot leave it behind: the fixture's finalizer kills what still runs,
reaps it and closes its pipes, even when the test failed or timed out half-way (a Popen
collected while running warns, and under `filterwarnings = error` a later, innocent test
would fail for it). Output is read by threads as it comes, so a test can wait for a line
(`wait_for`) instead of sleeping a fixed time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import pytest

DEADLINE_S = 60.0
"""Default wait for a condition: long enough for a 2-core machine at load 8."""


def wait_until(condition: Callable[[], object], what: str, timeout: float = DEADLINE_S,
               every: float = 0.01) -> None:
    """Poll `condition` until it is true; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g} s")
        time.sleep(every)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class Child:
    """A subprocess whose stdout and stderr are read line by line by two threads."""

    def __init__(self, cmd: Sequence[str], **popen: Any) -> None:
        self.proc = subprocess.Popen(list(cmd), stdin=popen.pop("stdin", subprocess.PIPE),
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, **popen)
        self.pid = self.proc.pid
        self.out: list[str] = []
        self.err: list[str] = []
        self._said = threading.Condition()
        self._readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.proc.stdout, self.out),
                                               (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str], lines: list[str]) -> None:
        for line in stream:
            with self._said:
                lines.append(line)
                self._said.notify_all()
        with self._said:
            self._said.notify_all()

    def wait_for(self, text: str, *, stream: str = "err", timeout: float = DEADLINE_S) -> str:
        """The first line of stderr (or stdout) containing `text`, waited for; fails if the
        process ends or `timeout` passes first."""
        lines = self.err if stream == "err" else self.out
        deadline = time.monotonic() + timeout
        with self._said:
            while True:
                found = next((line for line in lines if text in line), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and self._done()):
                    pytest.fail(f"{text!r} not said by pid {self.pid} within {timeout:g} s "
                                f"(exit {self.proc.returncode}): {''.join(self.err)[-2000:]}")
                self._said.wait(min(left, 0.1))

    def _done(self) -> bool:
        return not any(reader.is_alive() for reader in self._readers)

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def finish(self, timeout: float = DEADLINE_S) -> tuple[int, str, str]:
        """Wait for the end: (exit status, stdout, stderr). Killed if it outlasts `timeout`."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.end()
            pytest.fail(f"pid {self.pid} did not end within {timeout:g} s: "
                        f"{''.join(self.err)[-2000:]}")
        self.end()
        return self.proc.returncode, "".join(self.out), "".join(self.err)

    def end(self) -> None:
        """Kill if running, reap, and close the pipes."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        self.proc.wait()
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        for reader in self._readers:
            reader.join(10)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


class Processes:
    """Every process one test started (`start`) or learnt of (`adopt`: a grandchild)."""

    def __init__(self) -> None:
        self.children: list[Child] = []
        self.adopted: list[int] = []

    def start(self, cmd: Sequence[str], **popen: Any) -> Child:
        child = Child(cmd, **popen)
        self.children.append(child)
        return child

    def adopt(self, pid: int) -> int:
        """A process not ours to reap (a child's child): killed at the end if it still runs."""
        self.adopted.append(pid)
        return pid

    def end_all(self) -> None:
        for child in self.children:
            child.end()
        for pid in self.adopted:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


@pytest.fixture(name="processes")
def processes_fixture() -> Iterator[Processes]:
    """Start processes with `processes.start(cmd)`; all are ended when the test ends."""
    started = Processes()
    try:
        yield started
    finally:
        started.end_all()
