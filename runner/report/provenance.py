"""Where a report set's answers came from: manifest.json's `provenance`.

A rebuild (rescore, report, import) makes no call, so its own counts say nothing of what the
study cost. The cache records say it: each answer's source (api, batch, import), when it was
stored and its tokens. Gathered over the distinct answers the reports use, they give the
calls, tokens, estimated cost and time span of the runs that obtained them, true for answers
from several runs and batches, and the same whichever command wrote the reports.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from runner.estimate import model_price
from runner.job.bill import Bill, Tokens
from runner.job.spec import Job

__all__ = ["Provenance"]


@dataclass(slots=True)
class Provenance:
    """Counts over distinct answers (`add` once a cache key): one dict lookup an answer, the
    sums by source kind made once, in `as_dict` (a 100k-task rescore adds ~0.05 s)."""

    by: dict[tuple[str, str | None], list[float]] = field(default_factory=dict)
    """(model, source) -> [answers, first time, last time, then its tokens by kind (Tokens'
    order)]."""

    def add(self, model: str, source: str | None, when: float | None, tokens: Tokens) -> None:
        """Count one distinct answer.

        Args:
            model, tokens: the model that answered and its usage by kind.
            source: the record's source ("api", "batch", "import:..."), if any.
            when: when it was stored (epoch seconds), if known.
        """
        if (acc := self.by.get((model, source))) is None:
            self.by[model, source] = [1, math.inf if when is None else when,
                                      -math.inf if when is None else when, *tokens]
            return
        acc[0] += 1
        for i, count in enumerate(tokens, 3):
            acc[i] += count
        if when is not None:
            if when < acc[1]:
                acc[1] = when
            if when > acc[2]:
                acc[2] = when

    def as_dict(self, job: Job) -> dict[str, Any]:
        """For the manifest: answers by source kind (api, batch, import), tokens, the
        estimated cost of the calls that obtained them (batch answers at the batch price;
        imported ones cost nothing here; null when a model that was called has no price),
        `bill`: the calls' tokens and cost by kind and what caching and batching saved
        (runner.job.bill.Bill), and when the first and last were stored (UTC).

        Args:
            job: the job, for its models' prices.

        Returns:
            The manifest's `provenance` entry.
        """
        models = {m.name: m for m in job.models}
        sources: dict[str, int] = {}
        everything, bill = Tokens(), Bill()
        first, last = math.inf, -math.inf
        for (name, source), (count, early, late, *counts) in self.by.items():
            kind = (source or "api").partition(":")[0]
            sources[kind] = sources.get(kind, 0) + int(count)
            tokens = Tokens(*map(int, counts))
            everything = everything.plus(tokens)
            first, last = min(first, early), max(last, late)
            if kind != "import" and (model := models.get(name)) is not None and any(tokens):
                bill.add(model_price(model), tokens, batch=kind == "batch")
        paid = bill.as_dict()
        return {"answers": sources,
                "calls": sum(n for kind, n in sources.items() if kind in ("api", "batch")),
                "prompt_tokens": everything.prompt, "completion_tokens": everything.output,
                "estimated_cost_usd": paid["cost_usd"]["total"], "bill": paid,
                "first_answer": _iso(first if math.isfinite(first) else None),
                "last_answer": _iso(last if math.isfinite(last) else None)}


def _iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
