"""report.html's Reliability section: reliability.csv's rows grouped per data set, with a
note for each figure a data set has no rows for, saying why.

The rows are the ones runner.report.reliability.reliability_rows returned for reliability.csv
(passed in, never recomputed); the page pivots them into tables, judges as rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from runner.expand import Expansion

__all__ = ["FIGURES", "reliability_page"]

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
