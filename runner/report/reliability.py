"""reliability.csv and report.html's Reliability section: the figures of
runner.reduce.reliability laid out per data set and aspect (the columns:
docs/reference/outputs.md).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from runner.data.datasets import REGISTRY, Item
from runner.expand import Expansion
from runner.job.spec import Job
from runner.reduce.cells import Cells, grouped
from runner.reduce.judge_series import humans
from runner.reduce.positions import Positions
from runner.reduce.reliability import (
    LEVELS,
    Values,
    agreement,
    alpha,
    correlation,
    partial,
    weighted_kappa,
)

__all__ = ["RELIABILITY_COLUMNS", "csv_bytes", "reliability_page", "reliability_rows"]

RELIABILITY_COLUMNS = ["dataset", "aspect", "figure", "a", "b", "statistic", "value", "n",
                       "p_value"]
# The judged text where the data set does not name its field: the first of these an item has.
ANSWER_FIELDS = ("output", "answer", "response", "summary")
_Scored = tuple[npt.NDArray[np.int32], npt.NDArray[np.float64]]
"""One judge's scored cells of a data set and aspect: item indices (into Cells.items) and
scores, in the cells' order."""


def csv_bytes(columns: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> bytes:
    """A CSV table; None (and NaN) is an empty cell, floats keep full precision.

    Args:
        columns: the header; other keys of the rows are left out.
        rows: the rows.

    Returns:
        The CSV's bytes.
    """
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for row in rows:
        w.writerow({k: "" if v is None or (isinstance(v, float) and math.isnan(v)) else
                    repr(v) if isinstance(v, float) else v for k, v in row.items()})
    return out.getvalue().encode()


def _row(dataset: str, aspect: str, figure: str, a: str, b: str, statistic: str,
         value: float | None, n: int, p: float | None = None) -> dict[str, Any]:
    return {"dataset": dataset, "aspect": aspect, "figure": figure, "a": a, "b": b,
            "statistic": statistic, "value": value, "n": n, "p_value": p}


def _agreement(dataset: str, aspect: str, a: str, b: str, x: npt.NDArray[np.float64],
               y: npt.NDArray[np.float64]) -> list[dict[str, Any]]:
    """alpha (ordinal, interval) and, on integer scales, quadratic-weighted kappa of `a`'s
    scores `x` and `b`'s `y` of the same units."""
    ordinal, interval, kappa = agreement(x, y)
    out = [_row(dataset, aspect, "agreement", a, b, f"alpha_{level}", value, len(x))
           for level, value in zip(LEVELS[1:3], (ordinal, interval), strict=True)]
    if kappa is not None:
        out.append(_row(dataset, aspect, "agreement", a, b, "kappa_quadratic", kappa, len(x)))
    return out


_PART = 1 << 20  # cells looked at a time by _scored_pairs


def _scored_pairs(cells: Cells) -> list[tuple[str, str]]:
    """The (dataset, aspect) pairs that have a scored cell, in the cells' order. The cells
    are read _PART at a time: at ten million cells, every cell's pair code and their sort
    at once took ~0.3 GB more of the reports' child."""
    aspects, aspect_of = cells.aspect_codes()
    first = np.full(len(cells.datasets) * len(aspects), len(cells), dtype=np.int64)
    for start in range(0, len(cells), _PART):
        at = np.flatnonzero(cells.scored[start:start + _PART]) + start
        pair = (cells.item_dataset[cells.item[at]].astype(np.int64) * len(aspects)
                + aspect_of[cells.judge[at]])
        codes, where = np.unique(pair, return_index=True)
        np.minimum.at(first, codes, at[where])
    present = np.flatnonzero(first < len(cells))
    return [(cells.datasets[p // len(aspects)], aspects[p % len(aspects)])
            for p in present[np.argsort(first[present], kind="stable")].tolist()]


def _by_judge(cells: Cells, dataset: str, aspect: str) -> dict[str, _Scored]:
    """One data set and aspect's LLM judges (and juries), each with its scored cells' items
    (indices into cells.items) and scores, in the cells' order. Built for one pair at a time
    from the columns: a few arrays, not the dicts of (item, score) per task that peaked at
    ~190 bytes a task."""
    codes = [c for c, (_, a, _) in enumerate(cells.judges) if a == aspect]
    if dataset not in cells.datasets or not codes:
        return {}
    d = cells.datasets.index(dataset)
    at = np.flatnonzero(cells.scored & np.isin(cells.judge, codes) & (cells.dataset() == d))
    names, name_of = cells.names()
    return {names[n]: (cells.item[at[rows]], cells.score[at[rows]])
            for n, rows in zip(*grouped(name_of[cells.judge[at]], len(names)), strict=True)}


def _annotator_rows(dataset: str, aspect: str, items: Sequence[Item]) -> list[dict[str, Any]]:
    """The data's own agreement: every annotator together (alpha), and kappa for two."""
    votes = [it.annotators[aspect] for it in items if len(it.annotators.get(aspect, ())) >= 2]
    if not votes:
        return []
    k = max(len(v) for v in votes)
    table = [[v[c] if c < len(v) else None for v in votes] for c in range(k)]
    out = [_row(dataset, aspect, "agreement", "annotators", f"{k} annotators", f"alpha_{lvl}",
                alpha(table, lvl), len(votes)) for lvl in LEVELS[1:3]]
    first, second = ([v for v in col if v is not None] for col in table[:2])
    if k == 2 and (kappa := weighted_kappa(first, second)) is not None:
        out.append(_row(dataset, aspect, "agreement", "annotators", "2 annotators",
                        "kappa_quadratic", kappa, len(votes)))
    return out


class _Humans:
    """One aspect's human scores and annotators' votes by item (indices into Cells.items), as
    arrays: what every judge of it is compared with. `human` and `has` are the aspect's
    columns of runner.reduce.judge_series.humans."""

    def __init__(self, items: Sequence[Item], aspect: str, human: npt.NDArray[np.float64],
                 has: npt.NDArray[np.bool_]) -> None:
        self.human, self.has = human, has
        votes = [it.annotators.get(aspect, ()) for it in items]
        self.n_votes = np.array([len(v) for v in votes], dtype=np.int64)
        k = int(self.n_votes.max(initial=0))
        self.votes = np.zeros((len(items), k))
        for i, v in enumerate(votes):
            if v:
                self.votes[i, :len(v)] = v


def _judge_agreement(dataset: str, aspect: str, judges: Mapping[str, _Scored],
                     people: _Humans) -> list[dict[str, Any]]:
    out = []
    for judge, (ids, scores) in judges.items():
        n_votes = people.n_votes[ids]
        for c in range(int(n_votes.max(initial=0))):
            rated = n_votes > c
            out += _agreement(dataset, aspect, judge, f"annotator {c + 1}", scores[rated],
                              people.votes[ids[rated], c])
        if (has := people.has[ids]).any():
            out += _agreement(dataset, aspect, judge, "human", scores[has],
                              people.human[ids[has]])
    names = sorted(judges)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (ia, sa), (ib, sb) = judges[a], judges[b]
            order = np.argsort(ib, kind="stable")
            at = np.minimum(np.searchsorted(ib[order], ia), max(len(ib) - 1, 0))
            found = (ib[order][at] == ia) if len(ib) else np.zeros(len(ia), dtype=bool)
            out += _agreement(dataset, aspect, a, b, sa[found], sb[order[at[found]]])
    return out


def _answer_field(job: Job, dataset: str) -> str | None:
    """The field holding a data set's judged text: a registered set's `answer`, a file set's
    `fields.answer`, a generation stage's `field`; None = the first of ANSWER_FIELDS found."""
    for spec in job.datasets:
        if spec.name == dataset:
            if spec.path is not None:
                return spec.fields.get("answer")
            return REGISTRY[dataset].answer if dataset in REGISTRY else None
    return next((g.into for g in job.generate if g.name == dataset), None)


def _length(item: Item, field: str | None) -> tuple[float, float] | None:
    """The answer's (characters, whitespace tokens); None when the item has no answer field."""
    fields = (field,) if field is not None else ANSWER_FIELDS
    text = next((item.fields[f] for f in fields if item.fields.get(f)), None)
    return None if text is None else (float(len(text)), float(len(text.split())))


class _Lengths:
    """Each item's answer length (characters, whitespace tokens; NaN where it has no answer),
    worked out once an item, for the items asked for: every judge and aspect asks again."""

    def __init__(self, items: Sequence[Item]) -> None:
        self.items = items
        self.done = np.zeros(len(items), dtype=bool)
        self.sizes = np.full((len(items), 2), math.nan)

    def of(self, ids: npt.NDArray[np.int32], field: str | None) -> npt.NDArray[np.float64]:
        """The (characters, tokens) rows of the items `ids`."""
        for i in np.unique(ids[~self.done[ids]]).tolist():
            if (size := _length(self.items[i], field)) is not None:
                self.sizes[i] = size
            self.done[i] = True
        return self.sizes[ids]


def _length_rows(dataset: str, aspect: str, judges: Mapping[str, _Scored], people: _Humans,
                 lengths: _Lengths, field: str | None) -> list[dict[str, Any]]:
    """Spearman of score with answer length (characters, whitespace tokens), the human's
    alongside, and the judge-human Pearson / Spearman before and after controlling for length."""
    out = []
    human_done = False
    for judge, (ids, scores) in judges.items():
        sizes = lengths.of(ids, field)
        keep = people.has[ids] & ~np.isnan(sizes[:, 0])
        if keep.sum() < 3:
            continue
        score, human = scores[keep], people.human[ids[keep]]
        chars, tokens = sizes[keep, 0], sizes[keep, 1]
        series = [(judge, score)] + ([] if human_done else [("human", human)])
        human_done = True
        corr = _remembered()  # the partial correlations ask again for ones already computed
        for name, values in series:
            for unit, length in (("chars", chars), ("tokens", tokens)):
                out.append(_row(dataset, aspect, "length", name, f"length ({unit})",
                                "spearman", corr("spearman", values, length), len(score)))
        for method in ("pearson", "spearman"):
            out.append(_row(dataset, aspect, "length", judge, "human", method,
                            corr(method, score, human), len(score)))
            out.append(_row(dataset, aspect, "length", judge, "human | length (chars)",
                            f"partial_{method}", partial(method, score, human, chars, corr),
                            len(score)))
    return out


def _remembered() -> Callable[[str, Values, Values], float | None]:
    """`correlation`, computed once per (method, x, y) for lists that stay alive meanwhile
    (keyed by identity)."""
    seen: dict[tuple[str, int, int], float | None] = {}

    def corr(method: str, x: Values, y: Values) -> float | None:
        key = (method, id(x), id(y))
        if key not in seen:
            seen[key] = correlation(method, x, y)
        return seen[key]

    return corr


def reliability_rows(expansion: Expansion, cells: Cells,
                     positions: Positions) -> list[dict[str, Any]]:
    """Every reliability.csv row: agreement, self-consistency, position, length.

    Args:
        expansion: the job and its items (annotators, lengths).
        cells: the collected cells (runner.report.tables.collect).
        positions: what the judgments' stream kept for position and self-consistency.
    Returns:
        RELIABILITY_COLUMNS rows, data set and aspect by data set and aspect.
    """
    out: list[dict[str, Any]] = []
    scored = _scored_pairs(cells)
    lengths = _Lengths(cells.items)
    aspects = cells.aspect_codes()[0]
    human, has = humans(cells, aspects)
    by_aspect: dict[str, _Humans] = {}  # the same for every data set
    keys = list(dict.fromkeys([*scored, *_annotated(expansion)]))
    for dataset, aspect in keys:
        items = expansion.items.get(dataset, [])
        out += _annotator_rows(dataset, aspect, items)
        judges = _by_judge(cells, dataset, aspect) if (dataset, aspect) in scored else {}
        if judges:
            if aspect not in by_aspect:
                k = aspects.index(aspect)
                by_aspect[aspect] = _Humans(cells.items, aspect, human[:, k], has[:, k])
            out += _judge_agreement(dataset, aspect, judges, by_aspect[aspect])
            out += _length_rows(dataset, aspect, judges, by_aspect[aspect], lengths,
                                _answer_field(expansion.job, dataset))
    for (judge, dataset, aspect), table in positions.samples.tables():
        for level in LEVELS[1:3]:
            units = sum(sum(v is not None for v in col) >= 2 for col in zip(*table, strict=True))
            out.append(_row(dataset, aspect, "self_consistency", judge, f"{len(table)} samples",
                            f"alpha_{level}", alpha(table, level), units))
    return out + positions.position_rows()


def _annotated(expansion: Expansion) -> Iterator[tuple[str, str]]:
    """(dataset, aspect) pairs whose items carry two or more annotators (with repeats)."""
    return ((dataset, aspect) for dataset, items in expansion.items.items() for it in items
            for aspect, votes in it.annotators.items() if len(votes) >= 2)


FIGURES = ("agreement", "self_consistency", "position", "length")
_WHY = {
    "agreement": "no item has two or more annotators or a human rating a judge scored: no "
    "agreement to compute",
    "self_consistency": "one sample per judgment (set n > 1 on a prompt or model): no "
    "self-consistency",
    "position": "no item was judged with its outputs in more than one order: no position bias",
    "length": "no scored item has both a human rating and an answer text (output, answer, "
    "response or summary field), or fewer than 3 do: no length bias",
}
_ONE_ANNOTATOR = "one annotator per item: no inter-annotator agreement"


def reliability_page(
    expansion: Expansion, rows: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Per data set (the job's order, then any other the rows name): its rows and notes.

    Args:
        expansion: the job, for its data sets' order.
        rows: reliability.csv's rows.

    Returns:
        One entry per data set for report.html's reliability section.
    """
    names = list(dict.fromkeys([*expansion.items, *(r["dataset"] for r in rows)]))
    out = []
    for name in names:
        mine = [dict(r) for r in rows if r["dataset"] == name]
        notes = [
            f"{figure}: {_WHY[figure]}"
            for figure in FIGURES
            if not any(r["figure"] == figure for r in mine)
        ]
        agreement = [r for r in mine if r["figure"] == "agreement"]
        if agreement and not any(r["a"] == "annotators" for r in agreement):
            notes.append(f"agreement: {_ONE_ANNOTATOR}")
        out.append({"dataset": name, "rows": mine, "notes": notes})
    return out
