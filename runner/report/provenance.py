"""Where a report set's answers came from: manifest.json's `provenance`.

A rebuild (rescore, report, import) makes no call, so its own counts say nothing of what the
study cost. The cache records say it: each answer's source (api, batch, import), when it was
stored and its tokens. Gathered over the distinct answers the reports use, they give the
calls, tokens, estimated cost and time span of the runs that obtained them, true for answers
from several runs and batches, and the same whichever command wrote the reports.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runner.expand import estimate_cost
from runner.job.spec import Job

__all__ = ["Provenance"]


@dataclass(slots=True)
class Provenance:
    """Counts over distinct answers (`add` once a cache key)."""

    sources: dict[str, int] = field(default_factory=dict)
    """Answers by where they came from: api, batch, import (the kind, without ids)."""
    tokens: dict[tuple[str, str], list[int]] = field(default_factory=dict)
    """(model, source kind) -> [prompt, completion] tokens."""
    first: float | None = None
    last: float | None = None

    def add(self, model: str, source: str | None, when: float | None,
            tokens: tuple[int, int]) -> None:
        kind = (source or "api").partition(":")[0]
        self.sources[kind] = self.sources.get(kind, 0) + 1
        if (counts := self.tokens.get((model, kind))) is None:
            counts = self.tokens[model, kind] = [0, 0]
        counts[0] += tokens[0]
        counts[1] += tokens[1]
        if when is not None:
            if self.first is None or when < self.first:
                self.first = when
            if self.last is None or when > self.last:
                self.last = when

    def as_dict(self, job: Job) -> dict[str, Any]:
        """For the manifest: answers by source, tokens, the estimated cost of the calls that
        obtained them (batch answers at the batch price; imported ones cost nothing here;
        null when a model that was called has no price), and when the first and last were
        stored (UTC)."""
        models = {m.name: m for m in job.models}
        cost: float | None = 0.0
        for (name, kind), (prompt, completion) in self.tokens.items():
            model = models.get(name)
            if kind == "import" or model is None or not (prompt or completion):
                continue
            each = estimate_cost(model, prompt, completion)
            if each is None:
                cost = None
            elif cost is not None:
                cost += each * ((1 - model.batch_discount) if kind == "batch" else 1)
        return {"answers": dict(self.sources),
                "calls": sum(n for kind, n in self.sources.items() if kind in ("api", "batch")),
                "prompt_tokens": sum(t[0] for t in self.tokens.values()),
                "completion_tokens": sum(t[1] for t in self.tokens.values()),
                "estimated_cost_usd": None if cost is None else round(cost, 6),
                "first_answer": _iso(self.first), "last_answer": _iso(self.last)}


def _iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
