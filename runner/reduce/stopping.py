"""`judge run --until-ci W`: stop judging once the answer is known.

A study exists for a few correlations; once their 95% CIs are narrow, more items buy little.
`UntilCI` hands the pool the judge tasks whole groups at a time, in the order of the
`--sample` draw (runner.prepare.drawn_groups): a group's item prompts' tasks, then its group
prompts' (per = "group": one task judges every output of the group, and its answer counts for
all of them once parsed). Every `every` groups it computes each
judge's CIs from the answers stored so far, exactly as the report does (the same cells, series
and bootstrap: runner.reduce.correlate with the job's levels, methods, policy, resamples and
seed). A judge whose every CI (each aspect, level and method, over all items) is narrower
than W is held: the pool calls none of its later tasks (`holds`, the pool's hook), lists them
as not run, and the judges not yet held go on. Answers already cached are still read: only
calls are saved. Tasks in flight when a judge is held finish and are stored.

What it buys: calls. Its cost: a check judges the data set's tasks dispatched so far again
(about as long as `judge rescore` of them) and bootstraps their CIs; at most `MAX_CHECKS` a
data set, none before `FIRST_CHECK` groups. The statistics page says what stopping on a CI's
width does to the CI's coverage (docs/explanation/statistics.md, tools/untilci_coverage.py).
"""

from __future__ import annotations

import bisect
import heapq
import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from runner.execute.stats import RunStats
from runner.execute.store.backend import CacheBackend
from runner.expand import Expansion
from runner.prepare import drawn_groups
from runner.reduce.cells import CellBuilder, Cells
from runner.reduce.correlate import MIN_SYSTEMS, Correlation, correlate
from runner.reduce.judge_series import judge_series
from runner.reduce.judgments import judge
from runner.reduce.jury import judge_name
from runner.tasks import Task

__all__ = ["FIRST_CHECK", "MAX_CHECKS", "Precision", "UntilCI", "check_every", "precision_of"]

FIRST_CHECK = 10
"""Groups of a data set judged before its first check: a bootstrap CI of a handful of groups
is too narrow as often as not (and a precision rule would stop on it)."""
MAX_CHECKS = 50
"""At most this many checks a data set: every max(FIRST_CHECK, groups / MAX_CHECKS) groups."""


@dataclass(frozen=True, slots=True)
class Precision:
    """One judge's CIs on one data set, as the report would give them now."""

    width: float | None
    """The widest of its 95% CIs (None: some aspect has none yet)."""
    n_items: int
    n_groups: int
    widest: str = ""
    """Which CI is the widest: `aspect level method`."""


class UntilCI:
    """The judge tasks of a run in drawn order, and which judges are held (see the module).

    Args:
        expansion: the run's items and judges (the report's order of items, for its series).
        cache: the run's open cache, read at each check.
        stats: the run's counters (failures explain missing answers; `until_ci` gets the
            verdicts).
        width: W: a judge is held once every one of its CIs is narrower.
        seed: the seed of the drawn order (the --sample draw's).
    """

    def __init__(self, expansion: Expansion, cache: CacheBackend, stats: RunStats,
                 width: float, seed: int = 0) -> None:
        self.expansion, self.cache, self.stats, self.width = expansion, cache, stats, width
        self.drawn = replace(expansion, items={
            name: [it for group in drawn_groups(items, seed) for it in group]
            for name, items in expansion.items.items()})
        self.held: set[tuple[str, str]] = set()
        """(data set, judge) whose calls stop."""
        self.seen: dict[str, tuple[list[Task], array[int]]] = {}
        """data set -> its tasks handed to the pool so far (without bodies), and each one's
        group's place in the drawn order (from 1, increasing), for the checks."""
        self.ordinal: dict[str, int] = {}
        """task key -> its (first) task's group's place in its data set's drawn order."""
        self.next_check: dict[str, int] = {}
        """data set -> the group after which it is checked next."""

    def tasks(self) -> Iterator[Task]:
        """Every judge task, a data set's groups in drawn order: each group's item prompts'
        tasks, then its group prompts' (which name the group by its members)."""
        place: dict[tuple[str, str], tuple[int, int]] = {}
        for d, (name, items) in enumerate(self.drawn.items.items()):
            first: dict[str, int] = {}  # group -> its place
            for it in items:
                place[name, it.item_id] = (d, first.setdefault(it.group or it.item_id, len(first)))

        def where(task: Task) -> tuple[int, int]:
            return place[task.dataset, task.members[0] if task.members else task.item_id]

        unit: tuple[int, int] | None = None
        groups = 0
        # an Expansion lists a data set's item prompts' tasks, then its group prompts': the two
        # streams, each in drawn order, merged group by group
        for task in heapq.merge(*(e.tasks() for e in _by_kind(self.drawn)), key=where):
            here = where(task)
            if here != unit:
                groups = groups + 1 if unit is not None and unit[0] == here[0] else 1
                unit = here
            self.ordinal.setdefault(task.key, groups)
            seen, places = self.seen.setdefault(task.dataset, ([], array("i")))
            seen.append(task.without_body())
            places.append(groups)
            yield task

    def holds(self, task: Task) -> bool:
        """The pool's hook, asked as a task is about to be sent: True when its judge is held
        on its data set. Once the task's group is past the next check (every `every` groups of
        the drawn order, from FIRST_CHECK), the data set is checked first, over the answers
        stored so far: the groups before are all handed out (called or cached), all but the
        calls in flight answered. A rerun checks at its first call, over what is cached.

        Args:
            task: the task about to be sent.

        Returns:
            True when it is held (not sent in this run).
        """
        group, dataset = self.ordinal[task.key], task.dataset
        if group > self.next_check.setdefault(dataset, FIRST_CHECK):
            self._check(dataset, group - 1)
            every = check_every(len({it.group or it.item_id
                                     for it in self.drawn.items[dataset]}))
            self.next_check[dataset] = (group - 1) // every * every + every
        return (dataset, judge_name(task.model, task.prompt)) in self.held

    def _check(self, dataset: str, groups: int) -> None:
        """Hold the judges of `dataset` whose CIs are all narrower than W, and say so."""
        for name, p in self.precision(dataset, groups).items():
            if (dataset, name) in self.held or p.width is None or p.width >= self.width:
                continue
            self.held.add((dataset, name))
            self.stats.notes.append(
                f"--until-ci {self.width:g}: {dataset} / {name}: every 95% CI narrower than "
                f"{self.width:g} (widest {p.width:.3f}, {p.widest}) over the {p.n_items} items "
                f"of {p.n_groups} answered groups ({groups} sent): no more of its calls")

    def precision(self, dataset: str, upto: int | None = None) -> dict[str, Precision]:
        """Each LLM judge's precision on `dataset` from the answers stored now.

        Args:
            dataset: the data set.
            upto: only its first `upto` groups in the drawn order (None: all handed out).

        Returns:
            Judge (`model/prompt`) -> its widest CI and n, computed as the report computes
            its correlations, over the groups whose tasks are all settled (answered, failed
            or not run).
        """
        job = self.expansion.job
        aspects = {judge_name(m.name, p.name): len(p.aspects) for p in job.prompts
                   for m in self.expansion.judges(p)}
        found: dict[str, list[Precision]] = {}
        for (ds, aspect), series in judge_series(self.expansion,
                                                 self._cells(dataset, upto)).items():
            for name, data in series.items() if ds == dataset else ():
                if name in aspects:  # not a metric column, nor iaa
                    rows = correlate(data, policy=job.policy, levels=job.levels,
                                     methods=job.methods, n_boot=job.bootstrap, seed=job.seed)
                    found.setdefault(name, []).append(precision_of(rows, aspect))
        return {name: _widest(got, aspects[name]) for name, got in found.items()}

    def _cells(self, dataset: str, upto: int | None) -> Cells:
        """The cells of `dataset`'s first `upto` groups whose tasks are all settled, judged
        from the cache as the report judges them."""
        tasks, places = self.seen.get(dataset, ([], array("i")))
        if upto is not None:
            tasks = tasks[:bisect.bisect_right(places, upto)]
        judged = list(judge(self.expansion, self.cache, failures=self.stats.failures, tasks=tasks))
        # a judgment a task, one per member for a group prompt's: each with its group's place
        at = [g for t, g in zip(tasks, places, strict=False) for _ in t.members or (g,)]
        # whole groups only: a group with a call in flight would enter its sample-level
        # coefficient with some of its items (two of three: +-1)
        settled = set(self.stats.failures).union(self.stats.missing)
        open_ = {g for j, g in zip(judged, at, strict=True)
                 if j.raw is None and j.task.key not in settled}
        builder = CellBuilder(self.expansion)
        for j, g in zip(judged, at, strict=True):
            if g not in open_:
                t = j.task
                builder.add(t.dataset, j.item, (t.prompt, t.aspect, t.model), j.score, None)
        return builder.finish()

    def verdicts(self, stopped: bool) -> list[str]:
        """Why each judge stopped, with n: what `judge run` prints last.

        Args:
            stopped: the run stopped before its tasks ran out (Ctrl-C, a fatal error).

        Returns:
            One line per data set and judge: `ci reached`, `budget`, `stopped` or `data
            exhausted`, with its n and widest CI as the report has them.
        """
        lines = [f"--until-ci {self.width:g} (every 95% CI of a judge narrower than "
                 f"{self.width:g}; whole groups in random order):"]
        for dataset in self.seen:
            for name, p in self.precision(dataset).items():
                reason = ("ci reached" if (dataset, name) in self.held
                          else "budget" if self.stats.budget_stopped
                          else "stopped" if stopped else "data exhausted")
                width = "no CI" if p.width is None else f"widest CI {p.width:.3f} ({p.widest})"
                lines.append(f"  {dataset} / {name}: {reason}, n = {p.n_items} items in "
                             f"{p.n_groups} groups, {width}")
        return lines


def _by_kind(expansion: Expansion) -> list[Expansion]:
    """The expansion, or, when its job has both item and group prompts, one expansion of each
    kind (their tasks, keys and order the same: a task is rendered from its own prompt)."""
    kinds = [tuple(p for p in expansion.job.prompts if p.per == per) for per in ("item", "group")]
    if not all(kinds):
        return [expansion]
    return [replace(expansion, job=replace(expansion.job, prompts=k)) for k in kinds]


def check_every(groups: int) -> int:
    """Groups between two checks of a data set of `groups` groups (the first after
    FIRST_CHECK): at most MAX_CHECKS checks.

    Args:
        groups: the data set's number of groups.

    Returns:
        The groups between two checks.
    """
    return max(FIRST_CHECK, math.ceil(groups / MAX_CHECKS))


def _width(c: Correlation) -> float:
    """A CI's width; infinite where it has none (yet)."""
    return math.inf if c.ci_low is None or c.ci_high is None else c.ci_high - c.ci_low


def precision_of(rows: Sequence[Correlation], aspect: str) -> Precision:
    """One aspect's Precision from its correlations (runner.reduce.correlate's): the widest
    CI over all items (subset "all"). A system level over fewer than MIN_SYSTEMS systems, or
    over subsets (its "all" is the mean of the subsets' values), never has a CI (the report
    leaves it empty): it does not count, else it would hold no judge of such a study (Lai et
    al.'s, two transfer directions) ever. A CI over fewer than FIRST_CHECK
    groups is no width at all: a bootstrap of a handful of groups is too narrow (of one
    group, it is 0: every resample is that group).

    Args:
        rows: the aspect's correlations, every level and method.
        aspect: its name, for `widest`.

    Returns:
        Its Precision; width None while some row has no CI.
    """
    subsets = any(c.subset != "all" for c in rows)
    kept = [c for c in rows if c.subset == "all"
            and not (c.level == "system" and (subsets or c.n_systems < MIN_SYSTEMS))]
    top = max(kept, key=_width, default=None)
    n_items, n_groups = max((c.n_items for c in kept), default=0), max(
        (c.n_groups for c in kept), default=0)
    if top is None or math.isinf(_width(top)) or min(c.n_groups for c in kept) < FIRST_CHECK:
        return Precision(None, n_items, n_groups)
    return Precision(_width(top), n_items, n_groups, f"{aspect} {top.level} {top.method}")


def _widest(got: list[Precision], aspects: int) -> Precision:
    """A judge's Precision from its aspects': no width until each of its `aspects` has one."""
    n_items, n_groups = max(p.n_items for p in got), max(p.n_groups for p in got)
    if len(got) < aspects or any(p.width is None for p in got):
        return Precision(None, n_items, n_groups)
    top = max(got, key=lambda p: p.width or 0.0)
    return replace(top, n_items=n_items, n_groups=n_groups)
