"""Coverage of the CI at which `judge run --until-ci W` stops, simulated on real data sets.

The rule stops on the width of a bootstrap CI (runner/reduce/stopping.py): optional stopping on
the precision, not the estimate. This measures what that does to the final CI. For each data
set and aspect, a simulated judge is the human score plus noise (a part shared by a group's
items, a part per item; fixed for the data set, seed 1), so its correlation with the humans over
the whole data set is a known answer. Each replication draws the groups in a new random order
(runner.prepare.drawn_groups, seed = the replication), applies the rule at its checkpoints
(runner.reduce.stopping: FIRST_CHECK, then every check_every groups; the widest CI over the
levels and the method, computed by runner.reduce.correlate as the report does) and records
whether the CI at the stop holds the known answer, and the estimate there. For comparison, the
same replications at a fixed size (the rule's median stop) give the bootstrap's own coverage
without optional stopping.

    JUDGE_DATA_DIR=../shared/datasets python tools/untilci_coverage.py            # ~2 min CPU
    JUDGE_DATA_DIR=../shared/datasets python tools/untilci_coverage.py --reps 50  # quick look

Prints one line per data set, level and rule, cited in docs/explanation/statistics.md.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from runner.data.datasets import Item, load
from runner.prepare import drawn_groups
from runner.reduce.correlate import Correlation, Row, correlate
from runner.reduce.stopping import FIRST_CHECK, check_every, precision_of

STUDIES = (("summeval", "coherence", 0.15, False), ("openmeva", "overall", 0.15, False),
           ("tst_formality", "content", 0.25, True))
"""(registered data set, aspect, W, annotators): W such that the rule stops well before the
data runs out; annotators: the judge is the data set's second annotator and the human its
first (no simulation at all), else the simulated judge."""
LEVELS = ("sample", "dataset")
METHOD = "spearman"
N_BOOT = 1000  # the jobs' default `bootstrap`


def _judged(items: Sequence[Item], aspect: str, seed: int,
            annotators: bool) -> dict[str, list[Row]]:
    """group -> its items' rows: the human score, and a simulated judge's (human + a noise its
    group shares, half the humans' standard deviation, + a noise of its own, as large as the
    humans' spread: a judge correlating about 0.6 with the humans, as LLM judges do); with
    `annotators`, annotator 2 against annotator 1."""
    if annotators:
        rows: dict[str, list[Row]] = {}
        for it in items:
            votes = it.annotators.get(aspect, ())
            if len(votes) >= 2:
                group = it.group or it.item_id
                rows.setdefault(group, []).append(Row(group, it.system, "", votes[1], votes[0]))
        return rows
    rng = random.Random(seed)
    humans = [it.human[aspect] for it in items]
    sd = statistics.pstdev(humans)
    shared: dict[str, float] = {}
    rows = {}
    for it, h in zip(items, humans, strict=True):
        group = it.group or it.item_id
        g = shared.setdefault(group, rng.gauss(0, 0.5 * sd))
        rows.setdefault(group, []).append(Row(group, it.system, "", h + g + rng.gauss(0, sd), h))
    return rows


def _correlations(rows: list[Row], seed: int) -> dict[str, Correlation]:
    return {c.level: c for c in correlate(rows, levels=LEVELS, methods=(METHOD,), n_boot=N_BOOT,
                                          seed=seed) if c.subset == "all"}


def _covers(c: Correlation, known: float) -> bool:
    return c.ci_low is not None and c.ci_high is not None and c.ci_low <= known <= c.ci_high


def _stop(order: list[list[Row]], width: float) -> int:
    """The groups at which the rule stops over `order` (all of them: data exhausted)."""
    every, n = check_every(len(order)), FIRST_CHECK
    while n < len(order):
        rows = [r for group in order[:n] for r in group]
        p = precision_of(correlate(rows, levels=LEVELS, methods=(METHOD,), n_boot=N_BOOT), "")
        if p.width is not None and p.width < width:
            return n
        n += every
    return len(order)


def study(dataset: str, aspect: str, width: float, annotators: bool, reps: int,
          data_dir: Path) -> list[str]:
    """The coverage lines of one data set and aspect."""
    items = [it for it in load(dataset, data_dir) if aspect in it.human]
    by_group = _judged(items, aspect, 1, annotators)
    items = [it for it in items if (it.group or it.item_id) in by_group]
    known = {lv: c.value for lv, c in _correlations(
        [r for rows in by_group.values() for r in rows], 0).items()}
    orders = [[by_group[g[0].group or g[0].item_id] for g in drawn_groups(items, r)]
              for r in range(reps)]
    stops = [_stop(order, width) for order in orders]
    fixed = int(statistics.median(stops))
    lines = []
    for name, sizes in ((f"--until-ci {width}", stops), (f"fixed {fixed} groups", [fixed] * reps)):
        got = [_correlations([r for g in order[:n] for r in g], 0)
               for order, n in zip(orders, sizes, strict=True)]
        judge = "annotator 2 vs 1" if annotators else "simulated judge"
        for lv in LEVELS:
            cover = sum(_covers(c[lv], known[lv] or 0.0) for c in got) / reps
            bias = statistics.fmean((c[lv].value or 0.0) - (known[lv] or 0.0) for c in got)
            lines.append(f"{dataset}/{aspect}, {judge}, {lv} {METHOD} (known {known[lv]:.3f}): "
                         f"{name}: "
                         f"coverage {cover:.1%} of {reps}, mean bias {bias:+.4f}, groups "
                         f"median {statistics.median(sizes):g} [{min(sizes)}, {max(sizes)}] of "
                         f"{len(by_group)}, exhausted {sum(n == len(by_group) for n in sizes)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200, help="replications per data set")
    args = parser.parse_args()
    data_dir = Path(os.environ.get("JUDGE_DATA_DIR", "data"))
    started = time.process_time()
    for dataset, aspect, width, annotators in STUDIES:
        for line in study(dataset, aspect, width, annotators, args.reps, data_dir):
            print(line, flush=True)
    print(f"CPU {time.process_time() - started:.0f} s, {N_BOOT} bootstrap resamples a CI")


if __name__ == "__main__":
    main()
