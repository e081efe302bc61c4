"""A run finds its items without a per-item dict (bench/README.md, Memory): judging and the
cells follow the data order with a cursor, the (data set, item id) index is made only when a
lookup leaves that order, and a job without battles keeps no item positions. The answers are
those of the dicts: the same items, the same cells and reports. Equal human scores of a
user's file are one dict."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from bench.common import write_job
from bench.memory import ASPECTS, _compact
from runner.data.datasets import FieldMap, load_file
from runner.errors import ConfigError
from runner.execute.store.cache import Cache
from runner.expand import Expansion, ItemIndex
from runner.job.load import load_job
from runner.prepare import prepare
from runner.reduce import judgments
from runner.reduce.judgments import ItemCursor, judge
from runner.report.write import write_reports


def _cached(tmp_path: Path, items: int) -> tuple[Expansion, Cache]:
    """A synthetic job of `items` x 4 aspects with every answer in a cache folder."""
    job = write_job(tmp_path, items, aspects=ASPECTS, base_url="http://127.0.0.1:9/v1")
    expansion = prepare(load_job(job), tmp_path)
    cache = Cache(tmp_path / "cache")
    cache.put_many((t.key, _compact(t)) for t in expansion.tasks())
    return expansion, cache


def test_a_cached_run_s_reports_make_no_item_index_nor_item_dicts(tmp_path: Path) -> None:
    expansion, cache = _cached(tmp_path, 40)
    with cache:
        tables = write_reports(tmp_path / "out", expansion, judge(expansion, cache), {})
    assert isinstance(expansion.index, ItemIndex)
    assert expansion.index._made is None  # never asked: judging found every item in order
    assert (tmp_path / "out" / "scores.csv").read_text().count("\n") == 40 * 4 + 1
    assert len(tables.cells) == 40 * 4


def test_the_cursor_finds_what_the_index_finds_in_any_order(tmp_path: Path) -> None:
    expansion, cache = _cached(tmp_path, 200)
    cache.close()
    ids = [it.item_id for it in expansion.items["synth"]]
    cursor = ItemCursor(expansion)
    # in order, each item several times; then items skipped (no tasks), within the look-ahead
    for item_id in [i for i in ids[:10] for _ in range(4)] + ids[10:60:7]:
        assert cursor.item("synth", item_id) is expansion.items["synth"][ids.index(item_id)]
    assert expansion.index._made is None  # type: ignore[attr-defined]
    # past the look-ahead, and backwards: the index, made once, gives the same items
    far = ids[60 + judgments.LOOK_AHEAD + 5]
    for item_id in (far, ids[3], ids[199], ids[0]):
        assert cursor.item("synth", item_id) is expansion.item("synth", item_id)
    assert expansion.index._made is not None  # type: ignore[attr-defined]


def test_an_item_the_data_set_lacks_is_still_an_error(tmp_path: Path) -> None:
    expansion, cache = _cached(tmp_path, 5)
    cache.close()
    with pytest.raises(ConfigError, match="has no item 'nope'"):
        ItemCursor(expansion).item("synth", "nope")


def test_equal_human_scores_are_one_dict_and_a_zero_keeps_its_sign(tmp_path: Path) -> None:
    human = (2.0, 2.0, 0.0, -0.0)
    rows = [{"id": i, "out": i, "h": h, "k": 3.0} for i, h in zip("abcd", human, strict=True)]
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    mapping = FieldMap(id="id", text={"output": "out"}, human={"h": "h", "k": "k"})
    a, b, c, d = load_file(data, mapping, dataset="d")
    assert a.human is b.human and a.human == {"h": 2.0, "k": 3.0}
    assert c.human is not d.human
    assert math.copysign(1, c.human["h"]) == 1 and math.copysign(1, d.human["h"]) == -1
