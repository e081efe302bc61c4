"""The report phase of a run: the judgments of what it dispatched, its reports and manifest, and
the count of the answers that came from a provider batch; and the reports rebuilt from the cache
alone (rescore, report, import).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from runner.errors import redact_url, scrub
from runner.execute.stats import RunStats
from runner.execute.store.backend import CacheBackend
from runner.reduce.judgments import Judgment, judge
from runner.session.pool import TaskLog
from runner.session.select import WorkingSet, open_selected, unpriced_model

if TYPE_CHECKING:
    from runner.report.write import Tables

__all__ = ["PACKAGES", "BatchAnswers", "judged_dispatched", "manifest", "rebuild",
           "write_run_reports"]


PACKAGES = ("judge-runner", "aiohttp", "openai", "aiolimiter", "diskcache", "orjson", "scipy",
            "click")


class BatchAnswers:
    """Counts, as the reports stream the judgments by, the answers that came from a batch."""

    def __init__(self) -> None:
        self.answers = 0
        self.batches: set[str] = set()
        self.notes: list[str] = []
        """report.md's notes: filled once the judgments have all gone by, which write_reports
        does before it writes report.md."""

    def watch(self, judgments: Iterable[Judgment]) -> Iterator[Judgment]:
        """Pass `judgments` through, counting those whose answer came from a batch.

        Args:
            judgments: the judgments the reports read.

        Returns:
            The same judgments, in order; once they have all gone by, `notes` says how many
            came from which batches.
        """
        for j in judgments:
            if j.source is not None and j.source.startswith("batch:"):
                self.answers += 1
                self.batches.add(j.source[6:])
            yield j
        if self.answers:
            self.notes.append(f"{self.answers} judgments read answers from {len(self.batches)} "
                              "provider batch(es) (Batch API, batch price); `source` in "
                              "judgments.jsonl says which.")


def manifest(sel: WorkingSet, stats: RunStats, started: float,
             command: str, kind: str = "run") -> dict[str, Any]:
    """manifest.json: what ran, with which versions, what it did and cost. Never a key.

    Args:
        sel: the selection reported on; its task selection is recorded as `selection`.
        stats: the counters.
        started, command: when the command started (seconds since the epoch), and its command
            line (or API call).
        kind: "run" (a `judge run`, which may have called), or "rebuild" (rescore, report,
            import: reports from the cache alone, whose counts are of no call).

    Returns:
        The manifest as JSON-ready values; URLs without their passwords.
    """
    versions = {}
    for pkg in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[pkg] = importlib.metadata.version(pkg)
    return {"kind": kind, "job": sel.job.name, "job_file": str(sel.job.path),
            "job_sha256": hashlib.sha256(sel.job.path.read_bytes()).hexdigest(),
            "command": scrub(command), "versions": versions, "python": sys.version.split()[0],
            "started": _iso(started), "ended": _iso(time.time()),
            "models": [{"name": m.name, "spec": m.spec, "endpoint": redact_url(m.endpoint)
                        if m.base_url or m.kind == "local" else None} for m in sel.job.models],
            "counts": stats.as_dict(),
            "usage": {"prompt_tokens": stats.prompt_tokens,
                      "completion_tokens": stats.completion_tokens},
            "estimated_cost_usd": None if stats.unpriced or unpriced_model(sel.job)
            else round(stats.cost, 6),
            "unpriced_calls": stats.unpriced,
            "bill": stats.bill.as_dict(unknown=unpriced_model(sel.job)),
            "endpoints": stats.endpoint_counts(),
            **({"until_ci": stats.until_ci} if stats.until_ci else {}),
            "cache_dir": str(sel.cache_dir),
            **({"cache_url": redact_url(sel.cache_url)} if sel.cache_url else {}),
            "selection": sel.task_selection.recorded()}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def judged_dispatched(sel: WorkingSet, cache: CacheBackend, stats: RunStats,
                      dispatched: TaskLog) -> Iterator[Judgment]:
    """The judgments of the tasks the pool dispatched.

    Args:
        sel: the run's selection.
        cache: its open cache, to read the answers from.
        stats: the run's counters: its failures (damaged records among them) and the keys
            it called (their judgments are marked fresh).
        dispatched: the tasks the pool dispatched, read once and emptied.

    Returns:
        The judgments, streamed in the order of `dispatched`.
    """
    return judge(sel.expansion, cache, failures=stats.failures, fresh=frozenset(stats.called),
                 tasks=dispatched.drain(), count=len(dispatched), damaged=stats.failures)


def write_run_reports(sel: WorkingSet, stats: RunStats, judgments: Iterable[Judgment], *,
                      started: float, command: str,
                      extra: Mapping[str, Any] | None = None) -> Tables:
    """A run's reports of `judgments`, written into sel.out_dir, with its manifest.

    Args:
        sel: the run's working set.
        stats: the run's counters, read for the manifest once the judgments have gone by.
        judgments: the run's judgments, read once.
        started, command: for the manifest (see `manifest`).
        extra: more manifest keys (the batch stage's).

    Returns:
        The reports' tables.
    """
    return _write(sel, judgments, lambda _: {**manifest(sel, stats, started, command),
                                             **(extra or {})})


def rebuild(sel: WorkingSet, *, started: float, command: str) -> tuple[RunStats, Tables]:
    """Reports from the cache alone, in one pass, the counts taken as the judgments go by.

    Args:
        sel: the selection to report on.
        started, command: for the manifest (see `manifest`).

    Returns:
        The counts (cache hits, repeats, tasks with no answer, damaged records as failures)
        and the reports' tables.
    """
    stats = RunStats()

    def counted(tables: Tables) -> dict[str, Any]:
        # a damaged record is a failure (stats.failures), not a task never run
        stats.total, stats.duplicates = tables.tasks, tables.tasks - tables.distinct
        stats.missing = [k for k in tables.missing if k not in stats.failures]
        stats.cache_hits = tables.distinct - len(tables.missing)
        return manifest(sel, stats, started, command, "rebuild")

    with open_selected(sel, read_only=True) as cache:
        # a large job's readers start now, and read while the reports' modules load
        tables = _write(sel, judge(sel.expansion, cache, damaged=stats.failures), counted)
    return stats, tables


def _write(sel: WorkingSet, judgments: Iterable[Judgment],
           manifest_of: Callable[[Tables], dict[str, Any]]) -> Tables:
    """The reports of `judgments`, their manifest manifest_of(tables) with the batch answers'
    count."""
    from runner.report.write import write_reports  # numpy, 0.42 s: where reports are written
    answers = BatchAnswers()
    return write_reports(sel.out_dir, sel.expansion, answers.watch(judgments),
                         lambda tables: {**manifest_of(tables), "batch_answers": answers.answers},
                         answers.notes)
