"""Rating items by hand in the desk (`judge serve --annotator NAME`).

The queue walks each data set's items whole groups at a time, in the order `--sample` draws
them (runner.selection.rating_queue) with the --seed of the job's latest run (0 if it gave
none): after rating the first N items an annotator has rated exactly the items of that run's
`judge run --sample N --seed S`, so a few hundred ratings already give
sample-level correlations (which need several outputs of each group). Each aspect is rated on
the scale the job's prompt declares for it (its parser's min and max); a skip is recorded
too (score null), so a skipped item does not come back.

An aspect's ratings go to the file the job declares for it (`human = { fluency = { ratings =
"ratings.jsonl" } }`), else to the data set's own (`ratings_path`; docs/how-to/desk.md),
appended and fsynced one by one through runner.data.annotations (never rewritten: a crash
loses nothing already rated).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runner.data.annotations import Rating, append_rating, human_columns, read_ratings
from runner.data.loaders import Item
from runner.data.readers import number
from runner.errors import ConfigError
from runner.expand import Expansion
from runner.job.spec import Job
from runner.parse.parsers import get_parser
from runner.reduce.judgments import parser_options
from runner.selection import rating_queue

__all__ = ["SKIP", "Next", "Scale", "next_item", "ratings_path", "record", "scales"]

SKIP = "skip"
"""The form's value of a skipped aspect."""
STEPS = 11
"""A scale of at most this many whole numbers is offered as buttons, a wider one as a box."""


@dataclass(frozen=True, slots=True)
class Scale:
    """An aspect's scale: the parser's min and max for it in the job."""

    low: float
    high: float

    def steps(self) -> list[int]:
        """The whole-number choices (stars, 1-10), or [] for a box taking any number."""
        if self.low.is_integer() and self.high.is_integer() and \
                self.high - self.low < STEPS:
            return list(range(int(self.low), int(self.high) + 1))
        return []


@dataclass(frozen=True, slots=True)
class Next:
    """The next item an annotator rates, and how far they are."""

    dataset: str
    item: Item
    scales: dict[str, Scale]
    done: int
    """Items of the data set this annotator has rated (or skipped) on every aspect."""
    total: int


def scales(job: Job, dataset: str) -> dict[str, Scale]:
    """aspect -> its scale, for the aspects the job's prompts score on `dataset` (the first
    prompt scoring an aspect gives its scale).

    Args:
        job, dataset: the loaded job and the data set's name.

    Returns:
        Each aspect scored on `dataset` and its scale.
    """
    out: dict[str, Scale] = {}
    for p in job.prompts:
        if p.datasets and dataset not in p.datasets:
            continue
        for aspect in p.aspects:
            options = {**get_parser(p.parser).options, **parser_options(p, aspect, 0)}
            out.setdefault(aspect, Scale(float(options["min"]), float(options["max"])))
    return out


def ratings_path(job: Job, dataset: str) -> Path:
    """Where the ratings of `dataset` go unless the job declares a file: beside the data file,
    `<data file stem>.ratings.jsonl`; for a registered data set, beside the job file,
    `<job stem>.<data set>.ratings.jsonl`.

    Args:
        job, dataset: the loaded job and the data set's name.

    Returns:
        The default ratings file of `dataset`.
    """
    spec = next(d for d in job.datasets if d.name == dataset)
    if spec.path is not None:
        return spec.path.with_name(f"{spec.path.stem}.ratings.jsonl")
    return job.path.with_name(f"{job.path.stem}.{dataset}.ratings.jsonl")


def _ratings_paths(job: Job, dataset: str) -> dict[str, Path]:
    """aspect -> the file its ratings go to: the job's declared one, else the data set's
    default (ratings_path)."""
    spec = next(d for d in job.datasets if d.name == dataset)
    _, declared = human_columns(spec.fields.get("human", {}), job.path.parent,
                                f"{job.path}: datasets.{dataset}.fields.human")
    default = ratings_path(job, dataset)
    return {aspect: declared.get(aspect, default) for aspect in scales(job, dataset)}


def _ratings(paths: Mapping[str, Path]) -> list[Rating]:
    return [r for path in set(paths.values()) for r in read_ratings(path)
            if paths.get(r.aspect) == path]


def next_item(expansion: Expansion, annotator: str, seed: int = 0) -> Next | None:
    """The first item of the queue `annotator` has not rated on every aspect (None: done).

    Args:
        expansion, annotator: the job's items (its whole data) and who rates.
        seed: the --seed of the --sample draw the queue follows (the job's latest run's).

    Returns:
        The item with its data set, scales and the annotator's progress there.
    """
    job = expansion.job
    for dataset, items in expansion.items.items():
        aspects = scales(job, dataset)
        if not aspects:
            continue
        ratings = _ratings(_ratings_paths(job, dataset))
        left = rating_queue(items, list(aspects), ratings, annotator, seed=seed)
        if left:
            return Next(dataset, left[0][0], aspects, len(items) - len(left), len(items))
    return None


def record(expansion: Expansion, annotator: str, dataset: str, item: str,
           answers: Mapping[str, str]) -> int:
    """Append one rating per aspect of `item` (SKIP, or no answer, records a skip).

    Args:
        expansion, annotator: the job's items and who rated.
        dataset, item: the item's data set and id.
        answers: aspect -> the form's value (a number on the aspect's scale, or SKIP).

    Returns:
        How many ratings were appended.

    Raises:
        ConfigError: no such item, or a value off its aspect's scale (nothing appended).
    """
    if (dataset, item) not in expansion.index:
        raise ConfigError(f"{dataset}/{item}: no such item in {expansion.job.name}'s data")
    aspects, scores = scales(expansion.job, dataset), {}
    for aspect, scale in aspects.items():
        text = answers.get(aspect, SKIP).strip() or SKIP
        score = None if text == SKIP else number(text)  # NaN for text not a number
        if score is not None and not scale.low <= score <= scale.high:
            raise ConfigError(f"{aspect}={text!r}: rate on the job's scale, "
                              f"{scale.low:g} to {scale.high:g}, or skip")
        scores[aspect] = score
    paths = _ratings_paths(expansion.job, dataset)
    for aspect, score in scores.items():
        append_rating(paths[aspect], item=item, aspect=aspect, annotator=annotator,
                      score=score)
    return len(scores)
