"""report.md's sections after the correlations: battles, ranking, reliability. Each is a title,
a paragraph and a table, or nothing where there is no row."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["battle_markdown", "ranking_markdown", "reliability_markdown", "table"]


def table(columns: Sequence[str], align: str, rows: Sequence[Sequence[object]]) -> list[str]:
    """A Markdown table.

    Args:
        columns, rows: the header cells, and the cells (one sequence a row).
        align: one letter a column: l (left) or r (right).

    Returns:
        The table's lines.
    """
    rule = "".join("---:|" if a == "r" else "---|" for a in align)
    return [f"| {' | '.join(columns)} |", f"|{rule}",
            *(f"| {' | '.join(map(str, row))} |" for row in rows)]


def _section(title: str, intro: str, columns: Sequence[str], align: str,
             rows: Sequence[Sequence[object]]) -> str:
    """A titled paragraph and table; empty without rows."""
    if not rows:
        return ""
    return "\n".join(["", f"## {title}", "", intro, "", *table(columns, align, rows)]) + "\n"


def battle_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """report.md's battle section.

    Args:
        rows: battle.csv's rows (runner.reduce.battle).

    Returns:
        The Markdown, empty when there is no battle.
    """
    return _section(
        "Battles (both orders)",
        "A question counts as a win or a tie only when both orders agree; `inconsistent` = the "
        "two orders disagree; `failed` = an order has no score (not in n).",
        ["judge", "aspect", "model A", "model B", "n", "A wins", "ties", "B wins",
         "inconsistent", "failed", "A mean", "B mean"], "llll" + "r" * 8,
        [[r["judge"], r["aspect"], r["model_a"], r["model_b"], r["n"], r["a_wins"], r["ties"],
          r["b_wins"], r["inconsistent"], r["failed"],
          *("" if r[k] is None else f"{r[k]:.2f}" for k in ("a_mean", "b_mean"))]
         for r in rows])


def ranking_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """report.md's ranking section.

    Args:
        rows: ranking.csv's rows (runner.reduce.ranking.rank_rows).

    Returns:
        The Markdown, empty when there is no battle.
    """
    return _section(
        "Ranking (Bradley-Terry over the battles)",
        "Strength: log odds against the average system (a tie or an inconsistent verdict is "
        "half a win each); 95% CIs from resampling the battles. All of it is in ranking.csv.",
        ["judge", "aspect", "rank", "model", "strength", "95% CI", "wins", "ties", "losses"],
        "llrlrlrrr",
        [[r["judge"], r["aspect"], r["rank"], r["model"], f"{r['strength']:.2f}",
          "" if r["ci_low"] is None else f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]",
          r["wins"], r["ties"], r["losses"]] for r in rows])


def reliability_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """report.md's reliability section.

    Args:
        rows: reliability.csv's rows (runner.report.reliability.reliability_rows).

    Returns:
        The Markdown, empty when there is nothing to show.
    """
    return _section(
        "Reliability",
        "Agreement: Krippendorff's alpha and quadratic-weighted kappa; self-consistency: alpha "
        "across a judge's samples; position: verdict flips when the order is swapped, "
        "first-position win rate (binomial test against 1/2), mean score by position; length: "
        "score vs answer length, and judge-human correlation controlling for length. All of "
        "it is in reliability.csv.",
        ["dataset", "aspect", "figure", "a", "b", "statistic", "value", "n", "p"], "llllllrrr",
        [[r["dataset"], r["aspect"], r["figure"], r["a"], r["b"], r["statistic"],
          "" if r["value"] is None else f"{r['value']:.3f}", r["n"],
          "" if r["p_value"] is None else f"{r['p_value']:.3g}"] for r in rows])
