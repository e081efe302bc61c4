"""The ratings file: appended, never rewritten, read back whole after a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import orjson
import pytest

from runner.data.annotations import (
    Rating,
    RatingsWarning,
    append_rating,
    latest,
    rated,
    read_ratings,
    votes,
    with_ratings,
)
from runner.data.loaders import Item
from runner.errors import DataError


def test_append_then_read_round_trips_every_field(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ratings.jsonl"
    append_rating(path, item="a", aspect="fluency", annotator="ann", score=4)
    append_rating(path, item="b", aspect="fluency", annotator="ann", score=None)
    got = read_ratings(path)
    assert [(r.item, r.aspect, r.annotator, r.score) for r in got] == [
        ("a", "fluency", "ann", 4.0), ("b", "fluency", "ann", None)]
    assert all(r.time.endswith("Z") and len(r.time) == 20 for r in got)
    lines = path.read_bytes().splitlines()
    assert set(orjson.loads(lines[0])) == {"item", "aspect", "annotator", "score", "time"}


def test_appending_never_rewrites_the_earlier_bytes(tmp_path: Path) -> None:
    path = tmp_path / "ratings.jsonl"
    append_rating(path, item="a", aspect="x", annotator="ann", score=1)
    before = path.read_bytes()
    inode = path.stat().st_ino
    append_rating(path, item="a", aspect="x", annotator="ann", score=2)
    assert path.read_bytes().startswith(before)
    assert path.stat().st_ino == inode


def test_a_missing_file_has_no_ratings(tmp_path: Path) -> None:
    assert read_ratings(tmp_path / "none.jsonl") == []


def test_a_torn_last_line_is_skipped_with_a_warning_and_the_next_append_is_kept(
        tmp_path: Path) -> None:
    path = tmp_path / "ratings.jsonl"
    append_rating(path, item="a", aspect="x", annotator="ann", score=1)
    with path.open("ab") as f:
        f.write(b'{"item": "b", "aspect": "x", "annot')  # a crash mid-write
    with pytest.warns(RatingsWarning, match=r"ratings.jsonl:2: skipped a torn line"):
        assert [r.item for r in read_ratings(path)] == ["a"]
    append_rating(path, item="c", aspect="x", annotator="ann", score=3)
    with pytest.warns(RatingsWarning, match=r":2: skipped a torn line"):
        assert [r.item for r in read_ratings(path)] == ["a", "c"]


def test_a_line_that_is_json_but_not_a_rating_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "ratings.jsonl"
    append_rating(path, item="a", aspect="x", annotator="ann", score=1)
    with path.open("ab") as f:
        f.write(b'{"item": "b", "aspect": "x", "annotator": "ann", "score": "high", '
                b'"time": "t"}\n')
    with pytest.raises(DataError, match=r"ratings.jsonl:2: score must be a number or null"):
        read_ratings(path)


@pytest.mark.parametrize("score", [float("nan"), float("inf"), True, "3"])
def test_append_refuses_a_score_that_is_not_a_finite_number(tmp_path: Path,
                                                            score: object) -> None:
    with pytest.raises(DataError, match="finite number or None"):
        append_rating(tmp_path / "r.jsonl", item="a", aspect="x", annotator="ann",
                      score=score)  # type: ignore[arg-type]
    assert not (tmp_path / "r.jsonl").exists()


def test_append_refuses_an_empty_annotator(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="non-empty annotator"):
        append_rating(tmp_path / "r.jsonl", item="a", aspect="x", annotator="", score=1)


def _r(item: str, annotator: str, score: float | None, aspect: str = "x") -> Rating:
    return Rating(item=item, aspect=aspect, annotator=annotator, score=score, time="t")


def test_the_last_rating_wins_and_skips_are_not_scores() -> None:
    ratings = [_r("a", "bo", 1), _r("a", "al", 4), _r("a", "bo", 2), _r("b", "al", None),
               _r("c", "al", 5), _r("c", "al", None), _r("a", "al", 9, aspect="y")]
    assert latest(ratings)[("a", "x", "bo")].score == 2
    assert votes(ratings, "x") == {"a": (4.0, 2.0)}  # al before bo; b skipped; c re-skipped
    assert rated(ratings, "al") == {("a", "x"), ("b", "x"), ("c", "x"), ("a", "y")}


def test_items_gain_the_mean_and_the_votes_of_their_raters() -> None:
    items = [Item(dataset="d", item_id=i, group=i, system="", subset="", fields={},
                  human={"other": 1.0}, annotators={}, metrics={}) for i in ("a", "b")]
    got = list(with_ratings(items, {"x": {"a": (4.0, 2.0)}}))
    assert got[0].human == {"other": 1.0, "x": 3.0}
    assert got[0].annotators == {"x": (4.0, 2.0)}
    assert got[1] is items[1]


_WRITER = """
import sys
from pathlib import Path
from runner.data.annotations import append_rating
path = Path(sys.argv[1])
for n in range(10**6):
    append_rating(path, item=f"i{n}", aspect="x", annotator="ann", score=n % 5)
    print(n, flush=True)
"""


@pytest.mark.slow
def test_a_writer_killed_mid_stream_loses_no_rating_it_finished(tmp_path: Path) -> None:
    path = tmp_path / "ratings.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        done = -1
        while done < 200 and time.monotonic() < deadline:
            done = int(proc.stdout.readline())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()
    assert done >= 200
    torn = not path.read_bytes().endswith(b"\n")
    with pytest.warns(RatingsWarning) if torn else nullcontext():
        items = [r.item for r in read_ratings(path)]
    assert items[:done + 1] == [f"i{n}" for n in range(done + 1)]
