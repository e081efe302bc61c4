"""What a run would do, per model, with no network: `judge plan`, `runner.plan` and the
question before paid calls.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from runner.data.seen import Seen, key64
from runner.estimate import Estimate
from runner.execute.store.backend import cached_flags
from runner.expand import Expansion
from runner.job.spec import ModelSpec
from runner.session.select import WorkingSet, open_selected
from runner.tasks import Task, task_key

__all__ = ["ModelPlan", "all_tasks", "estimate"]


@dataclass(slots=True)
class ModelPlan:
    """What a run would do for one model: counts, tokens to spend, and their price."""

    model: ModelSpec
    bill: Estimate
    """The calls' bill online, with prompt caching and batch (runner.estimate)."""
    tasks: int = 0
    cached: int = 0
    repeats: int = 0
    """Tasks that send the same request as an earlier task (answered once)."""
    @property
    def prompt_tokens(self) -> int:
        """The calls' prompt tokens (estimated, runner.estimate)."""
        return self.bill.prompt_tokens

    @property
    def completion_tokens(self) -> int:
        """An upper bound: max_tokens x n for every call."""
        return self.bill.completion_tokens

    @property
    def calls(self) -> int:
        return self.tasks - self.cached - self.repeats

    @property
    def cost(self) -> float | None:
        return self.bill.cost("online")


def all_tasks(expansion: Expansion) -> Iterator[Task]:
    """Every task of an expansion.

    Args:
        expansion: the selection's expansion.

    Returns:
        Generation tasks, then judge tasks (those over generated answers once they exist).
    """
    return itertools.chain(expansion.generation_tasks(), expansion.tasks())


def estimate(sel: WorkingSet) -> list[ModelPlan]:
    """What a run would do, per model. No network.

    Args:
        sel: the selection (with stream=True, one pass is all this needs).

    Returns:
        One ModelPlan per model: tasks, cache hits, repeats, calls to make and their tokens.
    """
    plans = {m.name: ModelPlan(model=m, bill=Estimate(m)) for m in sel.job.models}
    # Repeats are spotted by the keys' first 64 bits, ~12 bytes a task (10M tasks: ~120 MB,
    # where a set of the keys held 1.4 GB); a false repeat among n distinct keys has
    # probability <= n^2 / 2^65 (2.7e-6 at 10M) and would only move one task's count.
    seen = Seen()
    with open_selected(sel, read_only=True) as cache:
        for task, cached in cached_flags(cache, all_tasks(sel.expansion), task_key):
            plan = plans[task.model]
            plan.tasks += 1
            if not seen.add(key64(task.key)):
                plan.repeats += 1
            elif cached:
                plan.cached += 1
            else:
                plan.bill.add(task)
    return list(plans.values())
