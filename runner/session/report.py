"""The report phase of a run: its manifest, and the count of the answers that came from a
provider batch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from runner.errors import redact_url, scrub
from runner.reduce.judgments import Judgment
from runner.session.select import WorkingSet, unpriced_model

if TYPE_CHECKING:
    from runner.execute.stats import RunStats

__all__ = ["PACKAGES", "BatchAnswers", "manifest"]


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


def manifest(sel: WorkingSet, stats: RunStats | None, started: float,
             command: str, kind: str = "run") -> dict[str, Any]:
    """manifest.json: what ran, with which versions, what it did and cost. Never a key.

    Args:
        sel: the selection reported on; its task selection is recorded as `selection`.
        stats: the counters (None: no call, no count).
        started: when the command started (seconds since the epoch).
        command: the command line (or API call) that ran.
        kind: "run" (a `judge run`, which may have called), or "rebuild" (rescore, report,
            import: reports from the cache alone, whose counts are of no call).

    Returns:
        The manifest as JSON-ready values; URLs without their passwords.
    """
    versions = {}
    for pkg in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[pkg] = importlib.metadata.version(pkg)
    counts = stats.as_dict() if stats else {}
    return {"kind": kind, "job": sel.job.name, "job_file": str(sel.job.path),
            "job_sha256": hashlib.sha256(sel.job.path.read_bytes()).hexdigest(),
            "command": scrub(command), "versions": versions, "python": sys.version.split()[0],
            "started": _iso(started), "ended": _iso(time.time()),
            "models": [{"name": m.name, "spec": m.spec, "endpoint": redact_url(m.endpoint)
                        if m.base_url or m.kind == "local" else None} for m in sel.job.models],
            "counts": counts,
            "usage": {"prompt_tokens": stats.prompt_tokens if stats else 0,
                      "completion_tokens": stats.completion_tokens if stats else 0},
            "estimated_cost_usd": None if (stats and stats.unpriced) or unpriced_model(sel.job)
            else round(stats.cost, 6) if stats else 0.0,
            "unpriced_calls": stats.unpriced if stats else 0,
            "endpoints": stats.endpoint_counts() if stats else {},
            "cache_dir": str(sel.cache_dir),
            **({"cache_url": redact_url(sel.cache_url)} if sel.cache_url else {}),
            "selection": None if sel.task_selection is None else sel.task_selection.recorded()}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
