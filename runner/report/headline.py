"""What a run prints last: the study's result, not only its counts (docs/reference/outputs.md
shows it), built from the rows of correlations.csv and summary.csv. A judge none of whose
answers parsed, or without spread, makes the command fail (exit 1): its panels in the report
would be empty, or its figures noise, without a word.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runner.reduce.correlate import MIN_SYSTEMS
from runner.reduce.jury import judge_name
from runner.report.standing import MIN_PARSED_SHARE, MIN_POINTS, best_judges, no_spread, points

__all__ = ["OUTSIDE", "OUTSIDE_NOTE", "Headline", "headline", "shown_method", "system_note",
           "system_warnings", "unparsed_judges"]

PREFERRED_METHOD = "spearman"
"""The coefficient shown when the job computes it (rank correlation: the studies' headline)."""


def shown_method(methods: Sequence[str]) -> str:
    """The one coefficient a summary shows (the result table, `judge runs`'s best column,
    `judge diff`'s lines): PREFERRED_METHOD where computed, else the first of `methods`.

    Args:
        methods: the methods computed, in the job's order.

    Returns:
        The method's name (pearson for none).
    """
    return PREFERRED_METHOD if PREFERRED_METHOD in methods else (list(methods) or ["pearson"])[0]


@dataclass(frozen=True, slots=True)
class Headline:
    """The lines to print, and the judges that produced no score at all."""

    lines: list[str] = field(default_factory=list)
    unparsed: list[str] = field(default_factory=list)
    """One line per judge whose answers mostly failed to parse."""
    scoreless: list[str] = field(default_factory=list)
    """Judges with answers and not one parsed score (the run fails)."""
    warnings: list[str] = field(default_factory=list)
    """What the numbers rest on where it is too little (system level over few systems), and,
    first, the judges whose scores track length or position (added by write_reports once the
    reliability rows exist: runner.report.standing.bias_warnings)."""
    no_spread: list[str] = field(default_factory=list)
    """One line per judge that gives one score to (nearly) all its answers (the run fails)."""
    battles: list[str] = field(default_factory=list)
    """The battles' verdicts and ranking (runner.reduce.ranking.battle_lines), after the
    table."""


def headline(levels: Sequence[str], methods: Sequence[str],
             correlations: Sequence[Mapping[str, Any]],
             summary: Sequence[Mapping[str, Any]], *, juries: Sequence[str] = ()) -> Headline:
    """The result table and the unparsed-judge lines.

    Args:
        levels, methods: the job's levels and correlation methods, in its order.
        correlations: correlations.csv rows (dataset, aspect, judge, level, method, subset,
            value, ci_low, ci_high, n_systems, ...); only LLM judges (`model/prompt`) and
            `juries` over all items.
        summary: summary.csv rows (dataset, prompt, aspect, model, n, scored, api_failures).

    Returns:
        A Headline (`lines` empty when no LLM judge has a correlation).
    """
    method = shown_method(methods)
    table: dict[tuple[str, str], dict[str, dict[str, Mapping[str, Any]]]] = {}
    shown = [r for r in correlations if "/" in r["judge"] or r["judge"] in juries]
    for row in shown:
        if row["method"] == method and row["subset"] == "all" and _finite(row["value"]):
            cell = table.setdefault((row["dataset"], row["aspect"]), {})
            cell.setdefault(row["judge"], {})[row["level"]] = row
    mostly_failed = unparsed_judges(summary)
    unparsed = [f"judge {judge}: {what}: see report.html#failures"
                for judge, _, _, what in mostly_failed]
    scoreless = [judge for judge, missing, answered, _ in mostly_failed if missing == answered]
    lines: list[str] = []
    if table:
        present = [lv for lv in levels
                   if any(lv in by for j in table.values() for by in j.values())]
        first = present[0] if present else "sample"
        lines.append(f"correlation with the human scores ({method}, 95% CI, n; * best at "
                     f"{first} level):")
        width = max(max(len(f"{d} / {a}"), *(len(j) + 2 for j in judges))
                    for (d, a), judges in table.items()) + 4
        best = best_judges(shown, summary)  # among the judges the table shows
        for (dataset, aspect), judges in table.items():
            lines += _block(dataset, aspect, judges, present, width,
                            best.get((dataset, aspect, first, method, "all")))
        lines.append(f"  n = groups (sample), items (dataset), systems (system); * only among "
                     f"judges with >= {MIN_PARSED_SHARE:.0%} of answers parsed and n >= "
                     f"{MIN_POINTS}")
        if any(OUTSIDE in line for line in lines):
            lines.append(OUTSIDE_NOTE)
    flat = [f"judge {judge}: {top} of {scored} answers are \"{score}\" on {dataset} / {aspect} "
            + ("(no spread): no correlation can be computed" if top == scored else
               "(almost no spread): its correlations rest on the few answers that differ")
            for judge, dataset, aspect, top, scored, score in no_spread(summary)]
    return Headline(lines, unparsed, scoreless, system_warnings(correlations), flat)


def system_note(correlations: Sequence[Mapping[str, Any]]) -> str | None:
    """What one data set and aspect's system level rests on, for report.md and report.html
    (None without a system level).

    Args:
        correlations: one data set and aspect's correlations.csv rows.

    Returns:
        The note, or None.
    """
    counts = [int(r.get("n_systems") or 0) for r in correlations
              if r["level"] == "system" and r["subset"] == "all"]
    if not counts:
        return None
    n = max(counts)
    if n >= MIN_SYSTEMS:
        return (f"System level: {n} systems (the points of its coefficients), 95% CIs from "
                "resampling the groups in correlations.csv. A value near 1 can lie above its CI "
                f"(marked {OUTSIDE}): the CI is the bootstrap's percentiles, and fewer groups "
                "rank the systems less well on most resamples.")
    return (f"System level: only {n} systems, whatever the item count: no CI, and any ranking "
            f"of {n} systems gives a coefficient like that (fewer than {MIN_SYSTEMS}); read the "
            "sample and dataset levels.")


def system_warnings(correlations: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per data set and aspect whose system level rests on fewer than MIN_SYSTEMS
    systems: its coefficients are over a handful of points, whatever the item count (an LLM
    judge's, where there is one: a metric column may cover items the judges did not score).

    Args:
        correlations: correlations.csv's rows.

    Returns:
        The warnings, one per data set and aspect.
    """
    few: dict[tuple[str, str], tuple[int, int]] = {}
    for row in sorted(correlations, key=lambda r: "/" in r["judge"]):  # LLM judges last: win
        n = int(row.get("n_systems") or 0)
        if row["level"] == "system" and row["subset"] == "all" and 0 < n < MIN_SYSTEMS:
            few[row["dataset"], row["aspect"]] = (n, int(row["n_items"]))
    return [f"warning: {dataset} / {aspect}: the system level rests on {n} systems "
            f"(n_items = {items}): no CI, and any ranking of {n} systems gives a coefficient "
            "like that; read the sample and dataset levels" for (dataset, aspect), (n, items)
            in few.items()]


def _block(dataset: str, aspect: str, judges: Mapping[str, Mapping[str, Mapping[str, Any]]],
           levels: Sequence[str], width: int, best: str | None) -> list[str]:
    label = f"{dataset} / {aspect}"
    out = [f"  {label}".ljust(width) + "".join(f"{lv:<{_CELL}}" for lv in levels).rstrip()]
    for judge, by_level in judges.items():
        mark = "*" if judge == best else " "
        cells = "".join(f"{_value(by_level.get(lv)):<{_CELL}}" for lv in levels)
        out.append(f"  {mark} {judge}".ljust(width) + cells.rstrip())
    return out


_CELL = 30
"""A cell's width: `-0.123 [-0.45, -0.67] n=1234` and two spaces."""


OUTSIDE = "^"
"""Marks a value outside its own CI (see OUTSIDE_NOTE)."""
OUTSIDE_NOTE = (f"  {OUTSIDE} the value lies outside its CI: the CI is the bootstrap's percentiles "
                "over resampled groups, and a coefficient near 1 falls on most resamples (fewer "
                "groups rank the systems less well); the value is the estimate, the CI its spread")


def _value(row: Mapping[str, Any] | None) -> str:
    if row is None or not _finite(row["value"]):
        return "n/a"
    value, low, high = float(row["value"]), row.get("ci_low"), row.get("ci_high")
    if not (_finite(low) and _finite(high)):
        return f"{value:.3f} n={points(row)}"
    mark = "" if float(low) <= value <= float(high) else OUTSIDE  # type: ignore[arg-type]
    return f"{value:.3f}{mark} [{low:.2f}, {high:.2f}] n={points(row)}"


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def unparsed_judges(summary: Sequence[Mapping[str, Any]]) -> list[tuple[str, int, int, str]]:
    """(judge, not scored, answered, what) for each judge (`model/prompt`) with most of its
    answers (tasks with one, over every data set and aspect) not scored; `what` says so in the
    words of summary.csv and report.html's failures table ("unparsed", "refusals"). One rule
    and one text for the terminal's lines and report.html's banner, so the two never
    disagree.

    Args:
        summary: summary.csv's rows.

    Returns:
        One tuple per such judge.
    """
    answers: dict[str, list[int]] = {}
    for row in summary:
        if not row["prompt"]:  # a jury: it has no answers of its own
            continue
        judge = judge_name(row["model"], row["prompt"])
        counts = answers.setdefault(judge, [0, 0, 0])
        counts[0] += int(row["n"]) - int(row["api_failures"])
        counts[1] += int(row["scored"])
        counts[2] += int(row.get("refusals") or 0)
    return [(judge, answered - scored, answered, _not_scored(answered - scored, answered, refused))
            for judge, (answered, scored, refused) in answers.items()
            if answered and answered - scored > answered / 2]


def _not_scored(missing: int, answered: int, refused: int) -> str:
    if not refused:
        return f"{missing} of {answered} answers unparsed"
    if refused == missing:
        return f"{missing} of {answered} answers were refusals"
    return (f"{missing} of {answered} answers not scored: {missing - refused} unparsed, "
            f"{refused} refusals")
