"""scores.parquet: scores.csv's table as Parquet, read by pandas or polars in one line
(`pandas.read_parquet("runs/NAME/scores.parquet")`).

The same rows in the same order and the same columns: dataset, item_id, group, system, subset,
prompt, aspect, model as dictionary-encoded strings (pandas reads them as categoricals; each
name is stored once), judge_score, human_score and every metric column as float64 with nulls
where scores.csv has an empty cell. Written from the cells' columns a row group of
ROW_GROUP cells at a time, so it never holds more than one group's arrays beside the cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from runner.reduce.cells import Cells

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ROW_GROUP", "write_scores_parquet"]

ROW_GROUP = 1 << 20
"""Cells per Parquet row group (~50 MB of arrays at a time)."""
LABELS = ("dataset", "item_id", "group", "system", "subset", "prompt", "aspect", "model")


def _codes(names: Sequence[str]) -> tuple[npt.NDArray[np.int32], pa.Array]:
    """Each name's code into the distinct names (a dictionary's values must be unique)."""
    import pyarrow as pa

    distinct: dict[str, int] = {}
    codes = np.array([distinct.setdefault(n, len(distinct)) for n in names] or [0],
                     dtype=np.int32)
    return codes, pa.array(list(distinct), type=pa.string())


def _metric_values(cells: Cells, names: Sequence[str], aspects: Sequence[str]
                   ) -> npt.NDArray[np.float64]:
    """(items x aspects, metrics): each item's metric values for an aspect, NaN for none."""
    out = np.full((len(cells.items) * max(len(aspects), 1), len(names)), np.nan)
    where = {m: k for k, m in enumerate(names)}
    for i, it in enumerate(cells.items):
        if not it.metrics:
            continue
        for a, aspect in enumerate(aspects):
            for m, v in {**it.metrics.get("*", {}), **it.metrics.get(aspect, {})}.items():
                if (k := where.get(m)) is not None:
                    out[i * len(aspects) + a, k] = v
    return out


def write_scores_parquet(cells: Cells, metric_names: Sequence[str], file: IO[bytes]) -> None:
    """scores.parquet into `file` (left open): scores.csv's rows and columns.

    Args:
        cells: the collected cells.
        metric_names: scores.csv's metric columns (runner.report.tables.metric_names).
        file: a binary file to write to (the report set's temp file).
    """
    # here, not at start-up: pyarrow.parquet takes 0.1-0.2 s to import, and this runs in the
    # reports' forked child (runner.report.aside) while the main process writes the others
    import pyarrow as pa
    import pyarrow.parquet as pq

    aspects, aspect_of = cells.aspect_codes()
    items = cells.items
    # per item: its data set, id, group, system, subset codes; per judge: prompt, aspect, model
    item_codes = [_codes([cells.datasets[d] for d in cells.item_dataset.tolist()]),
                  *(_codes([getattr(it, f) for it in items])
                    for f in ("item_id", "group", "system", "subset"))]
    judge_codes = [_codes([j[k] for j in cells.judges]) for k in range(3)]
    human = np.full((len(items), max(len(aspects), 1)), np.nan)
    where = {a: k for k, a in enumerate(aspects)}
    for i, it in enumerate(items):
        for aspect, value in it.human.items():
            if (k := where.get(aspect)) is not None:
                human[i, k] = value
    metrics = _metric_values(cells, metric_names, aspects) if metric_names else None
    fields = [pa.field(n, pa.dictionary(pa.int32(), pa.string())) for n in LABELS]
    fields += [pa.field(n, pa.float64()) for n in ("judge_score", "human_score",
                                                   *metric_names)]
    schema = pa.schema(fields)
    with pq.ParquetWriter(file, schema) as writer:
        for start in range(0, max(len(cells), 1), ROW_GROUP):
            part = slice(start, start + ROW_GROUP)
            item, judge = cells.item[part], cells.judge[part]
            columns: list[Any] = [pa.DictionaryArray.from_arrays(pa.array(c[item]), d)
                                  for c, d in item_codes]
            columns += [pa.DictionaryArray.from_arrays(pa.array(c[judge]), d)
                        for c, d in judge_codes]
            at = aspect_of[judge] if len(aspects) else np.zeros(len(judge), np.int32)
            floats = [cells.score[part], human[item, at]]
            if metrics is not None:
                floats += list((metrics[item.astype(np.int64) * len(aspects) + at]).T)
            columns += [pa.array(f, type=pa.float64(), mask=np.isnan(f)) for f in floats]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
