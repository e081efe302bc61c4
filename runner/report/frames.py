"""A run folder's reports as pandas DataFrames, in the dtypes COLUMNS names: `runner.results`.

pandas is an optional extra (`pip install judge-runner[pandas]`): `import_pandas` is the runner's
only import of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from runner.errors import ConfigError, ReportError

if TYPE_CHECKING:
    from pandas import DataFrame

__all__ = ["COLUMNS", "Results", "import_pandas", "read_results"]


TEXT, REAL, COUNT = "string", "float64", "Int64"
COLUMNS: dict[str, dict[str, str]] = {
    "scores": {"dataset": TEXT, "item_id": TEXT, "group": TEXT, "system": TEXT,
               "subset": TEXT, "prompt": TEXT, "aspect": TEXT, "model": TEXT,
               "judge_score": REAL, "human_score": REAL},
    "correlations": {"dataset": TEXT, "aspect": TEXT, "judge": TEXT, "level": TEXT,
                     "method": TEXT, "subset": TEXT, "value": REAL, "n_groups": COUNT,
                     "n_items": COUNT, "ci_low": REAL, "ci_high": REAL, "n_systems": COUNT},
    "reliability": {"dataset": TEXT, "aspect": TEXT, "figure": TEXT, "a": TEXT, "b": TEXT,
                    "statistic": TEXT, "value": REAL, "n": COUNT, "p_value": REAL},
    "summary": {"dataset": TEXT, "prompt": TEXT, "aspect": TEXT, "model": TEXT, "n": COUNT,
                "scored": COUNT, "mean": REAL, "std": REAL, "parse_failures": COUNT,
                "refusals": COUNT, "api_failures": COUNT},
    "failures": {"dataset": TEXT, "item_id": TEXT, "prompt": TEXT, "aspect": TEXT,
                 "model": TEXT, "sample": COUNT, "kind": TEXT, "message": TEXT, "raw": TEXT,
                 "key": TEXT},
}
"""Each frame of `results`: its first columns, in order, with their pandas dtypes (text is
"string", missing as <NA>; a missing number is NaN or <NA>). Columns a report adds later come
after them: scores' metric columns (float64), and any other as "string"."""


@dataclass(frozen=True, slots=True)
class Results:
    """A run folder's reports as pandas DataFrames (columns and dtypes: COLUMNS)."""

    scores: DataFrame
    """scores.csv: one row per item, prompt, aspect and model; judge and human score, metrics."""
    correlations: DataFrame
    """correlations.csv: every judge's and metric's correlation with the humans, 95% CI."""
    reliability: DataFrame
    """reliability.csv: agreement, self-consistency, position and length bias."""
    summary: DataFrame
    """summary.csv: per judge, counts, mean, std, parse failures, refusals, API failures."""
    failures: DataFrame
    """judgments.jsonl's failed tasks: `kind` (parse, refusal, api, ...), message, raw answer."""


def import_pandas() -> Any:
    """pandas, imported.

    Returns:
        The pandas module.

    Raises:
        ConfigError: pandas is not installed (pip install judge-runner[pandas]).
    """
    try:
        import pandas as pd  # the runner's only pandas import: an optional extra
    except ImportError:
        raise ConfigError("results() needs pandas, an optional extra: "
                          "pip install judge-runner[pandas]") from None
    return pd


def read_results(pd: Any, folder: Path) -> Results:
    """The reports of one run folder as DataFrames.

    Args:
        pd: the pandas module (import_pandas).
        folder: the run folder.

    Returns:
        Results: the frames scores, correlations, reliability, summary and failures (their
        columns and dtypes: COLUMNS).

    Raises:
        ReportError: the folder holds no reports, or a report is unreadable.
    """
    if not (folder / "correlations.csv").is_file():
        raise ReportError(f"{folder}: no reports here (no correlations.csv); pass a run folder: "
                          "runs/<job>, runs/<job>/latest or runs/<job>/history/<run id>")
    # every cell as text first: the dtypes are COLUMNS', not pandas' guesses
    frames = {name: _typed(pd, _read(folder / f"{name}.csv", lambda p: pd.read_csv(
        p, dtype=str, keep_default_na=False)) if name != "scores" or
        (folder / "scores.csv").is_file() or not (folder / "scores.parquet").is_file()
        else _read(folder / "scores.parquet", pd.read_parquet), name)  # scores_csv = false
        for name in ("scores", "correlations", "reliability", "summary")}
    failures = _read(folder / "judgments.jsonl", lambda p: list(_failures(p)))
    return Results(**frames, failures=_typed(
        pd, pd.DataFrame(failures, columns=list(COLUMNS["failures"])), "failures"))


def _read(path: Path, read: Callable[[Path], Any]) -> Any:
    """read(path), or a ReportError saying how to get the file back."""
    if not path.is_file():
        raise ReportError(f"{path}: missing from the run folder; rebuild the reports with "
                          "`judge report JOB` (or runner.rescore)")
    try:
        return read(path)
    except (OSError, ValueError) as exc:  # orjson's and pandas' parse errors are ValueErrors
        raise ReportError(f"{path}: unreadable ({exc}); rebuild the reports with "
                          "`judge report JOB` (or runner.rescore)") from None


def _typed(pd: Any, frame: DataFrame, name: str) -> DataFrame:
    """`frame` with COLUMNS[name] first, in their dtypes; later columns after them (numbers:
    scores' metrics as float64; else "string")."""
    schema = COLUMNS[name]
    out = pd.DataFrame(index=frame.index)
    for column in [*schema, *(c for c in frame.columns if c not in schema)]:
        values = frame[column] if column in frame.columns else pd.Series([""] * len(frame),
                                                                          index=frame.index)
        dtype = schema.get(column, REAL if name == "scores" else TEXT)
        if dtype == TEXT:
            out[column] = values.astype("string").replace("", pd.NA)
        else:
            numbers = pd.to_numeric(values, errors="coerce")  # "" and "nan": NaN
            out[column] = numbers.astype(dtype) if dtype == REAL else \
                numbers.round().astype(COUNT)
    return out


def _failures(path: Path) -> Iterator[dict[str, Any]]:
    """judgments.jsonl's failed tasks, one dict each in COLUMNS["failures"]'s order."""
    with path.open("rb") as f:
        for line in f:
            j = orjson.loads(line)
            error = j.get("error")
            if error is None:
                continue
            raw = j.get("raw")
            yield {"dataset": j["dataset"], "item_id": j["item_id"], "prompt": j["prompt"],
                   "aspect": j["aspect"], "model": j["model"], "sample": j.get("sample"),
                   "kind": error.get("type"), "message": error.get("message"),
                   "raw": raw if raw is None or isinstance(raw, str) else
                   orjson.dumps(raw).decode(), "key": j.get("key")}

