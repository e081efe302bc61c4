"""A run in progress, as the desk sees it from what the run already writes, read-only.

A `judge run` holds its lease file in the cache folder (runner.execute.store.lease: the
holder's host, pid, start and command, emptied when it ends) and stores every answer in the
cache (journal, then SQLite, folded about every second). The desk reads both and writes
neither: the lease's text (a pid on this host that is gone is a run killed, not running), and
the cache through a read-only SQLite connection (store.faults.ReadOnlyDisk: no lock file, no
-wal of its own) plus the journals' frames left where they are. No second writer touches the
cache; nothing is folded.

The tasks counted are the job's as its file says now, with its newest kept run's selection
(models, --limit, --sample): the run in progress is assumed to be a rerun of that one (a run
with another selection is counted against the last one's tasks). The ETA is the rate seen
since the desk first saw the run.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.children import alive
from runner.errors import RunnerError
from runner.execute.store.faults import ReadOnlyDisk
from runner.execute.store.journal import unfolded
from runner.execute.store.lease import lease_id, lease_name
from runner.execute.store.table import chunks, stored_keys
from runner.serve.desk import Desk

__all__ = ["LiveRuns", "holder"]

_HOLDER = re.compile(r"host (\S+) pid (\d+) ")


def holder(cache_dir: Path, job: str) -> str | None:
    """The description of the run of `job` holding its lease on the cache folder, or None
    when no live run holds it (never held, released, or its process is gone)."""
    path = cache_dir / f"lease-{lease_id(lease_name(job, None)):08x}.lock"
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return None
    m = _HOLDER.match(text)
    if not text or (m and m[1] == socket.gethostname() and not alive(int(m[2]))):
        return None
    return text


@dataclass
class LiveRuns:
    """The runs in progress of the desk's jobs, and the rate each goes at."""

    desk: Desk
    _keys: dict[str, list[str]] = field(default_factory=dict)
    """job -> its tasks' cache keys (expanded once)."""
    _first: dict[str, tuple[float, int]] = field(default_factory=dict)
    """job -> (when, answered) at the desk's first look at its run in progress."""

    def lines(self) -> dict[str, str]:
        """job -> one line on its run in progress, for every job with one."""
        out = {}
        for job in self.desk.folders():
            p = self.progress(job)
            if p["running"]:
                out[job] = p["line"]
        return out

    def progress(self, job: str) -> dict[str, Any]:
        """Whether `job` runs now; if so its holder, tasks answered of all, and ETA.

        Args:
            job: the job's name.

        Returns:
            {"running", "holder", "tasks", "answered", "eta_s", "line"}.
        """
        run = self.desk.run(job, "latest").manifest
        cache_dir = Path(str(run.get("cache_dir") or "cache"))
        who = None if run.get("cache_url") else holder(cache_dir, job)
        if who is None:
            self._first.pop(job, None)
            return {"running": False, "line": ""}
        keys = self._tasks(job)
        answered = _answered(cache_dir, keys)
        now = time.monotonic()
        since, before = self._first.setdefault(job, (now, answered))
        rate = (answered - before) / (now - since) if now > since else 0.0
        eta = (len(keys) - answered) / rate if rate > 0 else None
        line = (f"running: {answered} of {len(keys)} tasks answered"
                + (f", about {_duration(eta)} left" if eta is not None else "")
                + f" ({who})")
        return {"running": True, "holder": who, "tasks": len(keys), "answered": answered,
                "eta_s": eta, "line": line}

    def _tasks(self, job: str) -> list[str]:
        if job not in self._keys:
            latest = self.desk.run(job, "latest").id
            expansion = self.desk.selection(job, latest).expansion
            self._keys[job] = [t.key for t in expansion.tasks()]
        return self._keys[job]


def _answered(cache_dir: Path, keys: list[str]) -> int:
    """How many of `keys` have an answer in the cache folder, read without writing."""
    found = {key for key, _ in unfolded(cache_dir)}
    with contextlib.suppress(RunnerError, OSError):  # no database yet: only the journal
        disk = ReadOnlyDisk(cache_dir)
        try:
            for chunk in chunks(keys):
                found |= stored_keys(disk.connection, chunk)
        finally:
            disk.connection.close()
    return len(found & set(keys))


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
