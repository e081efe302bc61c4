"""Which judge a table may call the best, and which judges' figures cannot be read at all.

One rule for every place that names a best judge (the table `judge run` prints last, among its
LLM judges and juries; report.html's bold cells and the paper table's boxes, metrics and the
data's own judge columns too; `judge runs`' "best correlation", LLM judges) so they never
disagree; one for the judges whose scores have no spread (`no_spread`), and one for those
whose scores track length or position (`bias_warnings`). They read the report's CSV rows,
nothing else, so a kept run's files give the same answer as the run did.

A judge is ranked at a level only if at least MIN_PARSED_SHARE of its answers parsed (on that
data set and aspect) and its coefficient rests on at least MIN_POINTS points at that level
(groups at the sample level, items at the dataset level, MIN_SYSTEMS systems at the system
level). A judge that parsed 16 of 60 answers has a sample-level figure on 4 groups: its 95% CI
spans most of [-1, 1], and it must not be crowned over a judge that parsed 60.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from runner.reduce.correlate import MIN_SYSTEMS
from runner.reduce.jury import judge_name

__all__ = ["MIN_PARSED_SHARE", "MIN_POINTS", "NO_SPREAD_SHARE", "best_judges", "bias_warnings",
           "no_spread", "parsed_counts", "points", "ranked"]

MIN_PARSED_SHARE = 0.5
"""A judge most of whose answers did not parse is not ranked: its figure is over the answers
that happened to parse, not over the items."""
MIN_POINTS = 10
"""Fewer points than this and a rank correlation's 95% CI spans more than +-0.5 whatever its
value: ranking on it is ranking on noise (the system level asks MIN_SYSTEMS, its own rule)."""
NO_SPREAD_SHARE = 0.95
"""A judge that gives one score to this share of its parsed answers (19 of 20) says nothing
about the items: its coefficient is undefined, or rests on the one or two answers that differ."""

TRACKS_LENGTH = 0.5
"""|Spearman| of a judge's score with the answer's length from which length may be what it
scores, if controlling for length leaves less than NO_SIGNAL with the humans."""
NO_SIGNAL = 0.1
"""|partial Spearman| with the humans, length held fixed, below which nothing is left."""
TRACKS_POSITION = 0.9
"""First-position win rate (or 1 minus it) from which the order decides the verdict."""

_POINTS = {"sample": "n_groups", "dataset": "n_items", "system": "n_systems"}

Column = tuple[str, str, str, str, str]
"""(dataset, aspect, level, method, subset): one column of a correlation table."""


def points(row: Mapping[str, Any]) -> int:
    """What a correlations.csv row's coefficient is computed over at its level: groups
    (sample), items (dataset), systems (system); 0 where the row does not say.

    Args:
        row: a correlations.csv row.

    Returns:
        The number of points.
    """
    value = row.get(_POINTS.get(str(row["level"]), "n_items"))
    return int(float(value)) if value not in (None, "") else 0


def ranked(correlations: Iterable[Mapping[str, Any]],
           summary: Sequence[Mapping[str, Any]]) -> dict[Column, dict[str, float]]:
    """The judges that may be ranked in each column (the rule: the module docstring).

    Args:
        correlations: correlations.csv rows (values as numbers or as the CSV's text), those
            of the judges the caller shows: the terminal's table, LLM judges and juries;
            report.html, metrics and the data's own judge columns too.
        summary: summary.csv rows: the parsed share of each judge with a row there (a metric
            or a data column has none: nothing of it failed to parse).

    Returns:
        (dataset, aspect, level, method, subset) -> judge -> its coefficient; never `iaa`
        (annotator against annotator: not a judge).
    """
    parsed = parsed_counts(summary)
    out: dict[Column, dict[str, float]] = {}
    for row in correlations:
        key = (row["dataset"], row["aspect"], row["judge"])
        value = _number(row["value"])
        if row["judge"] == "iaa" or value is None:
            continue
        scored, answered = parsed.get(key, (1, 1))
        least = MIN_SYSTEMS if row["level"] == "system" else MIN_POINTS
        if scored >= MIN_PARSED_SHARE * answered and points(row) >= least:
            column = (row["dataset"], row["aspect"], row["level"], row["method"], row["subset"])
            out.setdefault(column, {})[row["judge"]] = value
    return out


def best_judges(correlations: Sequence[Mapping[str, Any]],
                summary: Sequence[Mapping[str, Any]]) -> dict[Column, str]:
    """The best judge of each column that at least two judges have a coefficient in (one
    judge is not "best" of anything): the highest among the column's ranked judges.

    Args:
        correlations, summary: correlations.csv rows (values as numbers or as the CSV's
            text) and summary.csv rows.

    Returns:
        (dataset, aspect, level, method, subset) -> the judge's name.
    """
    competing: dict[Column, int] = {}
    for row in correlations:
        if row["judge"] != "iaa" and _number(row["value"]) is not None:
            column = (row["dataset"], row["aspect"], row["level"], row["method"], row["subset"])
            competing[column] = competing.get(column, 0) + 1
    return {column: max(values, key=values.__getitem__)
            for column, values in ranked(correlations, summary).items()
            if competing[column] > 1}


def no_spread(summary: Sequence[Mapping[str, Any]]) -> list[tuple[str, str, str, int, int, str]]:
    """The judges that give one score to at least NO_SPREAD_SHARE of their parsed answers.

    Args:
        summary: summary.csv rows (`top_score`, `top_count`: the commonest score and how many
            parsed answers gave it).

    Returns:
        (judge, dataset, aspect, top_count, scored, top_score as text) per such judge, data
        set and aspect with at least MIN_POINTS parsed answers (fewer alike may be chance:
        two answers on a 1-5 scale agree one time in five; and the judge is named as mostly
        unparsed already).
    """
    out = []
    for row in summary:
        scored, top = int(row["scored"]), int(row.get("top_count") or 0)
        if scored >= MIN_POINTS and top >= NO_SPREAD_SHARE * scored:
            score = float(row["top_score"])
            out.append((judge_name(row["model"], row["prompt"]), row["dataset"], row["aspect"],
                        top, scored, f"{score:g}"))
    return out


def parsed_counts(summary: Sequence[Mapping[str, Any]]
                  ) -> dict[tuple[str, str, str], tuple[int, int]]:
    """(dataset, aspect, judge) -> (parsed answers, answers) from summary.csv's rows (API
    failures are not answers).

    Args:
        summary: summary.csv's rows.

    Returns:
        The counts per data set, aspect and judge.
    """
    out: dict[tuple[str, str, str], tuple[int, int]] = {}
    for row in summary:
        key = (row["dataset"], row["aspect"], judge_name(row["model"], row["prompt"]))
        scored, answered = out.get(key, (0, 0))
        out[key] = (scored + int(row["scored"]),
                    answered + int(row["n"]) - int(row.get("api_failures") or 0))
    return out


def _number(value: Any) -> float | None:
    """A coefficient as a finite float (a CSV's text or a number), else None."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def bias_warnings(reliability: Sequence[Mapping[str, Any]]) -> list[str]:
    """One `warning:` line per judge, data set and aspect whose scores track length or position
    rather than the humans, from reliability.csv's rows (over at least MIN_POINTS items or
    decisive pairs; position also asks the binomial test's p < 0.05).

    Args:
        reliability: reliability.csv rows (dataset, aspect, figure, a, b, statistic, value, n,
            p_value).

    Returns:
        The lines, in the rows' order.
    """
    value = {(r["dataset"], r["aspect"], r["a"], r["b"], r["statistic"]): r for r in reliability
             if r["figure"] in ("length", "position")}
    out = []
    for (dataset, aspect, judge, b, statistic), row in value.items():
        v, n = _number(row["value"]), int(row.get("n") or 0)
        if v is None or n < MIN_POINTS or "/" not in judge:
            continue
        if statistic == "first_position_win_rate" and max(v, 1 - v) >= TRACKS_POSITION and \
                (_number(row.get("p_value")) or 1.0) < 0.05:
            shown = "first" if v >= 0.5 else "second"
            out.append(f"warning: judge {judge} on {dataset} / {aspect}: the output shown "
                       f"{shown} wins {max(v, 1 - v):.0%} of {n} decisive pairs: its verdicts "
                       "track position (see reliability.csv)")
        if (b, statistic) == ("length (chars)", "spearman") and abs(v) >= TRACKS_LENGTH:
            left = value.get((dataset, aspect, judge, "human | length (chars)",
                              "partial_spearman"))
            rest = _number(left["value"]) if left else None
            if rest is not None and abs(rest) < NO_SIGNAL:
                out.append(f"warning: judge {judge} on {dataset} / {aspect}: its scores track "
                           f"answer length (spearman {v:.2f} over {n} items); length held "
                           f"fixed, its spearman with the humans is {rest:.2f} (see "
                           "reliability.csv)")
    return out
