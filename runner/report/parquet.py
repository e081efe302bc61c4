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
from runner.reduce.judge_series import humans

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ROW_GROUP", "write_scores_parquet"]

ROW_GROUP = 1 << 20
"""Cells per Parquet row group (~50 MB of arrays at a time)."""
LABELS = ("dataset", "item_id", "group", "system", "subset", "prompt", "aspect", "model")


def _codes(names: list[str]) -> tuple[npt.NDArray[np.int32], pa.Array]:
    """Each name's code into the distinct names (a dictionary's values must be unique).
    Hashed with a dict, not pyarrow's dictionary_encode: its first call loads pyarrow's
    compute kernels, 0.3 s."""
    index = {n: i for i, n in enumerate(dict.fromkeys(names))}
    codes = np.fromiter(map(index.__getitem__, names), dtype=np.int32, count=len(names))
    return codes, _strings(list(index))


# Arrays are made from their buffers: pyarrow.array() imports pandas on its first call to
# check for pandas objects (0.35 s), in a process that has no other use for it.

def _strings(names: list[str]) -> pa.Array:
    import pyarrow as pa

    data = [n.encode() for n in names]
    offsets = np.zeros(len(data) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in data], out=offsets[1:])
    if offsets[-1] >= 2 ** 31:
        raise ValueError("scores.parquet: more than 2 GiB of names in one column")
    return pa.Array.from_buffers(pa.string(), len(data), [
        None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(data))])


def _labels(codes: npt.NDArray[np.int32], names: pa.Array) -> pa.Array:
    import pyarrow as pa

    indices = pa.Array.from_buffers(pa.int32(), len(codes), [
        None, pa.py_buffer(np.ascontiguousarray(codes, dtype=np.int32))])
    return pa.DictionaryArray.from_arrays(indices, names)


def _floats(values: npt.NDArray[np.float64]) -> pa.Array:
    """float64, null where NaN."""
    import pyarrow as pa

    missing = np.isnan(values)
    valid = pa.py_buffer(np.packbits(~missing, bitorder="little"))
    return pa.Array.from_buffers(pa.float64(), len(values), [
        valid, pa.py_buffer(np.ascontiguousarray(values, dtype=np.float64))],
        null_count=int(missing.sum()))


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
    datasets = _codes(list(cells.datasets))
    item_codes = [(datasets[0][cells.item_dataset], datasets[1]),
                  *(_codes([getattr(it, f) for it in items])
                    for f in ("item_id", "group", "system", "subset"))]
    judge_codes = [_codes([j[k] for j in cells.judges]) for k in range(3)]
    human, has = humans(cells, aspects)
    human[~has] = np.nan  # null where the item has no human score
    metrics = _metric_values(cells, metric_names, aspects) if metric_names else None
    fields = [pa.field(n, pa.dictionary(pa.int32(), pa.string())) for n in LABELS]
    fields += [pa.field(n, pa.float64()) for n in ("judge_score", "human_score",
                                                   *metric_names)]
    schema = pa.schema(fields)
    with pq.ParquetWriter(file, schema) as writer:
        for start in range(0, max(len(cells), 1), ROW_GROUP):
            part = slice(start, start + ROW_GROUP)
            item, judge = cells.item[part], cells.judge[part]
            columns: list[Any] = [_labels(c[item], d) for c, d in item_codes]
            columns += [_labels(c[judge], d) for c, d in judge_codes]
            at = aspect_of[judge]
            floats = [cells.score[part], human[item, at]]
            if metrics is not None:
                floats += list((metrics[item.astype(np.int64) * len(aspects) + at]).T)
            columns += [_floats(np.asarray(f, dtype=np.float64)) for f in floats]
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
