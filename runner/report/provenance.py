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

from runner.expand import model_price
from runner.job.providers import Tokens
from runner.job.spec import Job

__all__ = ["Provenance"]


@dataclass(slots=True)
class Provenance:
    """Counts over distinct answers (`add` once a cache key): one dict lookup an answer, the
    sums by source kind made once, in `as_dict` (a 100k-task rescore adds ~0.05 s)."""

    by: dict[tuple[str, str | None], list[float]] = field(default_factory=dict)
    """(model, source) -> [answers, prompt tokens, completion tokens, first time, last time]."""

    def add(self, model: str, source: str | None, when: float | None,
            tokens: tuple[int, int]) -> None:
        if (acc := self.by.get((model, source))) is None:
            self.by[model, source] = [1, tokens[0], tokens[1],
                                      math.inf if when is None else when,
                                      -math.inf if when is None else when]
            return
        acc[0] += 1
        acc[1] += tokens[0]
        acc[2] += tokens[1]
        if when is not None:
            if when < acc[3]:
                acc[3] = when
            if when > acc[4]:
                acc[4] = when

    def as_dict(self, job: Job) -> dict[str, Any]:
        """For the manifest: answers by source kind (api, batch, import), tokens, the
        estimated cost of the calls that obtained them (batch answers at the batch price;
        imported ones cost nothing here; null when a model that was called has no price), and
        when the first and last were stored (UTC)."""
        models = {m.name: m for m in job.models}
        sources: dict[str, int] = {}
        tokens: dict[tuple[str, str], list[int]] = {}
        first, last = math.inf, -math.inf
        for (name, source), (count, prompt, completion, early, late) in self.by.items():
            kind = (source or "api").partition(":")[0]
            sources[kind] = sources.get(kind, 0) + int(count)
            sums = tokens.setdefault((name, kind), [0, 0])
            sums[0] += int(prompt)
            sums[1] += int(completion)
            first, last = min(first, early), max(last, late)
        cost: float | None = 0.0
        for (name, kind), (prompt_t, completion_t) in tokens.items():
            model = models.get(name)
            if kind == "import" or model is None or not (prompt_t or completion_t):
                continue
            price = model_price(model)
            if price is None:
                cost = None
            elif cost is not None:
                cost += price.cost(Tokens(prompt_t, 0, 0, completion_t), batch=kind == "batch")
        return {"answers": sources,
                "calls": sum(n for kind, n in sources.items() if kind in ("api", "batch")),
                "prompt_tokens": sum(t[0] for t in tokens.values()),
                "completion_tokens": sum(t[1] for t in tokens.values()),
                "estimated_cost_usd": None if cost is None else round(cost, 6),
                "first_answer": _iso(first if math.isfinite(first) else None),
                "last_answer": _iso(last if math.isfinite(last) else None)}


def _iso(t: float | None) -> str | None:
    return None if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
