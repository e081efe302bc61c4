"""Collecting an ended batch (runner.execute.batch): its answers stored in the cache under
the same keys as online answers, with `answer_record(source="batch:<batch id>")`; every
other request of it a failure with its reason; the bill of what was collected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import redact_url
from runner.estimate import model_price
from runner.execute.batch_api import OpenAIBatches
from runner.execute.batch_files import output_line, request_bodies
from runner.execute.ledger import BatchLedger, BatchRow
from runner.execute.store.backend import CacheBackend
from runner.execute.store.cache import answer_record
from runner.job.bill import Bill, Billed, Tokens
from runner.job.spec import ModelSpec

__all__ = ["BatchStats", "Collector"]

STORE_CHUNK = 2000  # answers handed to put_many at once (a kill -9 loses no more: the batch
# is marked collected only after all are stored, so the next run ingests it again)


@dataclass(slots=True)
class BatchStats(Billed):
    """What the batch stage did in one run."""

    created: list[str] = field(default_factory=list)
    """Batch ids submitted by this run."""
    attached: int = 0
    """Batches from earlier runs found open or ended and not yet collected."""
    collected: set[str] = field(default_factory=set)
    """Keys whose batch answer this run stored in the cache."""
    failures: dict[str, str] = field(default_factory=dict)
    """key -> reason, for requests a batch answered with an error or left unanswered."""
    pending: set[str] = field(default_factory=set)
    """This run's keys still held by a live batch when the run ended."""
    bill: Bill = field(default_factory=Bill)
    """The collected answers' tokens and cost by kind, at the batch price (`unpriced`: answers
    of models with no price, whose cost is unknown, never 0)."""
    def as_dict(self) -> dict[str, Any]:
        """The figures manifest.json records (counts, batch ids, cost; None: unknown)."""
        return {"batches_created": len(self.created), "batch_ids": self.created,
                "batches_attached": self.attached, "collected": len(self.collected),
                "failed": len(self.failures), "pending": len(self.pending),
                "cost_usd": None if self.unpriced else round(self.cost, 6)}


class Collector:
    """Ingests the ended batches of one BatchRun into its cache and stats."""

    def __init__(self, *, cache: CacheBackend, ledger: BatchLedger, files: Path,
                 models: Mapping[str, ModelSpec], stats: BatchStats,
                 say: Callable[[str], None]) -> None:
        self.cache, self.ledger, self.files, self.models = cache, ledger, files, models
        self.stats, self.say = stats, say  # models: by endpoint

    async def ingest(self, api: OpenAIBatches, row: BatchRow) -> None:
        """Store every answered request of an ended batch; record every other one as a
        failure with its reason; mark the batch collected and delete its request file.

        Args:
            api: The Batch API client of the batch's provider.
            row: The batch's ledger row (read again here: the settle may have updated it).
        """
        fresh = next(r for r in self.ledger.rows() if r.file_id == row.file_id)
        keys = set(self.ledger.keys(row.file_id))
        if fresh.state == "abandoned":
            self.ledger.mark_ingested(row.file_id)
            return
        bodies = await request_bodies(self.files / f"{fresh.file_id}.jsonl",
                                      lambda: api.lines(fresh.file_id))
        answered = await self._store_outputs(api, fresh, self.models[fresh.endpoint], bodies)
        for key in keys - answered:
            if key not in self.cache:
                self.stats.failures[key] = f"batch {fresh.batch_id} {fresh.state}: no result " \
                                           "for this request"
        self.ledger.mark_ingested(row.file_id)
        (self.files / f"{row.file_id}.jsonl").unlink(missing_ok=True)
        self.say(f"collected batch {fresh.batch_id} ({fresh.state}): {fresh.completed} "
                 f"answered, {len(keys) - fresh.completed} failed or not run")

    async def _store_outputs(self, api: OpenAIBatches, row: BatchRow, model: ModelSpec,
                             bodies: Mapping[str, bytes]) -> set[str]:
        """Store the answers of the batch's output and error files, STORE_CHUNK per
        put_many (one transaction: a put each made 100k answers take ~60 s); returns the keys
        that had a line. Every answer is stored before this returns, so before the ledger
        marks the batch collected."""
        answered: set[str] = set()
        pending: list[tuple[str, dict[str, Any]]] = []
        for file_id in (row.output_file, row.error_file):
            if file_id:
                async for line in api.lines(file_id):
                    key, record = self._line(line, row, model, bodies)
                    answered.add(key)
                    if record is not None:
                        pending.append((key, record))
                    if len(pending) >= STORE_CHUNK:
                        self.cache.put_many(pending)
                        pending = []
        self.cache.put_many(pending)
        return answered

    def _line(self, line: bytes, row: BatchRow, model: ModelSpec,
              bodies: Mapping[str, bytes]) -> tuple[str, dict[str, Any] | None]:
        """One output line's key and the record to store for it, or None after recording its
        error."""
        key, data, reason = output_line(line)
        if data is None or key not in bodies:
            self.stats.failures[key] = f"batch {row.batch_id}: {reason}"
            return key, None
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        assert isinstance(usage, dict)
        record = answer_record(body=bodies[key], endpoint=redact_url(row.endpoint), response=data,
                               usage=usage, latency_s=0.0, source=f"batch:{row.batch_id}")
        self.stats.failures.pop(key, None)
        self.stats.collected.add(key)
        self.stats.bill.add(model_price(model), Tokens.of(usage), batch=True)
        return key, record
