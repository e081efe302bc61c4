"""A run in progress, as the desk sees it from what the run already writes, read-only.

A `judge run` holds its lease file in the cache folder (runner.execute.store.lease: the
holder's host, pid, start and command, emptied when it ends) and stores every answer in the
cache. The desk reads both and writes neither: the lease's text (a pid on this host that is
gone is a run killed, not running), and the cache opened `never_write` (nothing folded, no
settings written: no second writer touches the cache).

The partial correlations are the report's own (runner.report.tables.collect and
runner.report.write.correlations) over the answers stored so far, parsed as `judge rescore`
parses them, at most every PARTIAL_EVERY_S per job and over at most PARTIAL_TASKS of them
(a bounded read: below runner.execute.store.reader.MIN_TASKS no reader process is started).

The tasks counted are the job's as its file says now, with its newest kept run's selection
(models, --limit, --sample): the run in progress is assumed to be a rerun of that one (a run
with another selection is counted against the last one's tasks). The ETA is the rate seen
since the desk first saw the run.
"""

from __future__ import annotations

import io
import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.api import WorkingSet
from runner.children import alive
from runner.errors import RunnerError
from runner.execute.store.cache import Cache
from runner.execute.store.lease import lease_id, lease_name
from runner.expand import Expansion
from runner.reduce.judgments import judge
from runner.report.diff import number
from runner.report.headline import shown_method
from runner.report.standing import points
from runner.report.tables import collect
from runner.report.write import correlations
from runner.serve.desk import Desk, RunInfo
from runner.tasks import Task

__all__ = ["LiveRuns", "holder"]

_HOLDER = re.compile(r"host (\S+) pid (\d+) ")
PARTIAL_EVERY_S = 10.0
"""The partial correlations of a job are made again at most this often (a bootstrap each)."""
PARTIAL_TASKS = 10_000
"""Answered tasks the partial correlations are made over, at most."""


def holder(cache_dir: Path, job: str) -> str | None:
    """The description of the run of `job` holding its lease on the cache folder, or None
    when no live run holds it (never held, released, or its process is gone).

    Args:
        cache_dir: the cache folder the run's lease is in.
        job: the job's name.

    Returns:
        The lease file's text (host, pid, command), or None.
    """
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
    _expanded: dict[str, tuple[WorkingSet, list[Task]]] = field(default_factory=dict)
    """job -> the selection its tasks were expanded from, and they."""
    _partials: dict[str, tuple[float, list[dict[str, Any]]]] = field(default_factory=dict)
    """job -> (when, its correlations then)."""
    _first: dict[str, tuple[float, int]] = field(default_factory=dict)
    """job -> (when, answered) at the desk's first look at its run in progress."""

    def lines(self, jobs: Mapping[str, list[RunInfo]] | None = None) -> dict[str, str]:
        """One line on each job's run in progress.

        Args:
            jobs: every job's runs if the caller has read them (each reading reads every kept
                run's manifest), else read here.

        Returns:
            job -> its line, for every job with a run in progress.
        """
        if jobs is None:
            jobs = {job: self.desk.runs(job) for job in self.desk.folders()}
        return {job: line for job, runs in jobs.items() if (line := self.line(job, runs))}

    def line(self, job: str, runs: list[RunInfo] | None = None) -> str:
        """One line on `job`'s run in progress.

        Args:
            job: the job's name; runs: its runs if the caller has read them, as for `progress`.

        Returns:
            The line ("" when no run of it is in progress).
        """
        try:
            return str(self.progress(job, runs)["line"])
        except RunnerError as exc:  # the job file moved: say so, the page still shows
            return f"running, but cannot be followed: {exc}"

    def progress(self, job: str, runs: list[RunInfo] | None = None) -> dict[str, Any]:
        """Whether `job` runs now; if so its holder, tasks answered of all, ETA and the
        correlations over the answers so far.

        Args:
            job: the job's name.
            runs: its kept runs if the caller has read them (Desk.runs), else read here.

        Returns:
            {"running", "holder", "tasks", "answered", "eta_s", "correlations", "line"}.
        """
        runs = self.desk.runs(job) if runs is None else runs
        if not runs:  # no run kept yet: no selection to count against
            return {"running": False, "line": ""}
        run = runs[-1].manifest
        cache_dir = Path(str(run.get("cache_dir") or "cache"))
        who = None if run.get("cache_url") else holder(cache_dir, job)
        if who is None:
            self._first.pop(job, None)
            return {"running": False, "line": ""}
        sel = self.desk.selection(job, runs[-1])
        tasks = self._tasks(job, sel)
        with Cache(cache_dir, never_write=True) as cache:
            found = cache.has_many([t.key for t in tasks])
            partial = self._partial(job, sel.expansion, cache,
                                    [t for t in tasks if t.key in found])
        now, answered = time.monotonic(), len(found)
        since, before = self._first.setdefault(job, (now, answered))
        rate = (answered - before) / (now - since) if now > since else 0.0
        eta = (len(tasks) - answered) / rate if rate > 0 else None
        line = (f"running: {answered} of {len(tasks)} tasks answered"
                + (f", about {_duration(eta)} left" if eta is not None else "")
                + f" ({who})" + (f"; so far: {_figures(partial)}" if partial else ""))
        return {"running": True, "holder": who, "tasks": len(tasks), "answered": answered,
                "eta_s": eta, "correlations": partial, "line": line}

    def _tasks(self, job: str, sel: WorkingSet) -> list[Task]:
        """The tasks of the job's selection now (expanded again only when it changes: a new
        kept run, an edited job file)."""
        known = self._expanded.get(job)
        if known is None or known[0] is not sel:
            self._expanded[job] = known = (sel, list(sel.expansion.tasks()))
        return known[1]

    def _partial(self, job: str, expansion: Expansion, cache: Cache,
                 answered: list[Task]) -> list[dict[str, Any]]:
        """The correlations over the answered tasks, made again at most every
        PARTIAL_EVERY_S."""
        made, rows = self._partials.get(job, (0.0, []))
        if time.monotonic() - made < PARTIAL_EVERY_S:
            return rows
        tables = collect(expansion, judge(expansion, cache, tasks=answered[:PARTIAL_TASKS]),
                         io.BytesIO())
        # the LLM judges (`model/prompt`): the data's metric columns are not partial
        rows = [r for r in correlations(expansion, tables)
                if r["subset"] == "all" and "/" in r["judge"]]
        self._partials[job] = (time.monotonic(), rows)
        return rows


def _figures(rows: list[dict[str, Any]]) -> str:
    """`openmeva/overall fake/stars spearman sample 0.123 (n=8)`, ...: spearman where
    computed, else the job's first method (as the run's own table: headline.shown_method)."""
    method = shown_method([r["method"] for r in rows])
    return ", ".join(f"{r['dataset']}/{r['aspect']} {r['judge']} {method} {r['level']} "
                     f"{number(r['value'])} (n={points(r)})"
                     for r in rows if r["method"] == method)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
