"""A job reads a ratings file as human columns; `judge rescore` picks up new ratings, no call."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from runner.data.annotations import Rating, append_rating
from runner.data.loaders import Item
from runner.errors import ConfigError
from runner.job.load import load_job
from runner.prepare import prepare, sample_ids
from runner.selection import rating_queue
from tests.fakeserver import ThreadedServer
from tests.test_cli import clean_env, run_judge

SYSTEMS = ("a", "b", "c")
RATED_JOB = """
[[datasets]]
name = "mine"
path = "data.jsonl"
[datasets.fields]
id = "id"
group = "doc"
system = "model"
text = { source = "source", output = "summary" }
human = { overall = { ratings = "ratings.jsonl" } }

[[prompts]]
name = "stars"
template = "Rate the summary of {{source}} in stars: {{output}}"
parser = "stars"
aspects = ["overall"]

[models.fake]
spec = "fake"
"""


def rated_job(folder: Path, groups: int = 12) -> Path:
    """A data file of `groups` documents x 3 systems, and the job above beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"d{g}-{s}", "doc": f"d{g}", "model": s, "source": f"document {g}",
             "summary": f"summary {g} by {s}"} for g in range(groups) for s in SYSTEMS]
    (folder / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    (folder / "job.toml").write_text(RATED_JOB, "utf-8")
    return folder / "job.toml"


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _human(out: Path) -> dict[str, str]:
    return {r["item_id"]: r["human_score"] for r in _rows(out / "scores.csv")}


def _sample_spearman(out: Path) -> tuple[str, str]:
    row = next(r for r in _rows(out / "correlations.csv")
               if r["level"] == "sample" and r["method"] == "spearman")
    return row["value"], row["n_groups"]


@pytest.mark.slow
def test_rescore_reads_new_ratings_as_human_columns_with_no_call(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    job = rated_job(tmp_path / "study")
    ratings = job.parent / "ratings.jsonl"
    args = ("--base-url", server.url, "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")
    env, out = clean_env(data_dir), tmp_path / "out"
    result = run_judge("run", job, *args, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    calls = server.state.requests
    assert calls == 36 and set(_human(out).values()) == {""}  # no ratings yet: no human score
    assert _rows(out / "correlations.csv") == []

    items = [f"d{g}-{s}" for g in range(12) for s in SYSTEMS]
    for n, item in enumerate(items):  # one annotator, everything but a skipped item
        append_rating(ratings, item=item, aspect="overall", annotator="ana",
                      score=None if item == "d0-a" else n % 5 + 1)
    result = run_judge("rescore", job, *args, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    human = _human(out)
    assert human["d0-a"] == "" and human["d0-b"] == "2.0"  # a skip is not a score
    first = _sample_spearman(out)
    assert first[1] == "12" and "fake/stars" in result.stderr

    for n, item in enumerate(items):  # a second annotator: the mean, and their agreement
        append_rating(ratings, item=item, aspect="overall", annotator="bo", score=(n * 7) % 5 + 1)
    result = run_judge("rescore", job, *args, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    human = _human(out)
    assert human["d0-a"] == "1.0" and human["d0-b"] == str((2 + 3) / 2)
    assert _sample_spearman(out) != first
    alphas = [r for r in _rows(out / "reliability.csv") if r["a"] == "annotators"]
    assert {r["statistic"] for r in alphas} >= {"alpha_interval", "alpha_ordinal"}
    assert server.state.requests == calls  # both rescores: zero calls


@pytest.mark.slow
def test_a_torn_ratings_line_is_a_warning_line_not_an_error(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    job = rated_job(tmp_path / "study", groups=4)
    ratings = job.parent / "ratings.jsonl"
    append_rating(ratings, item="d0-a", aspect="overall", annotator="ana", score=3)
    with ratings.open("ab") as f:
        f.write(b'{"item": "d0-b", "asp')
    result = run_judge("plan", job, "--base-url", server.url, env=clean_env(data_dir),
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"warning: {ratings}:2: skipped a torn line" in result.stderr
    assert "RatingsWarning" not in result.stderr


def test_a_ratings_entry_that_is_not_a_file_name_is_an_error_naming_it(
        tmp_path: Path) -> None:
    job = rated_job(tmp_path / "study", groups=2)
    job.write_text(RATED_JOB.replace('{ ratings = "ratings.jsonl" }', '{ rating = "r.jsonl" }'),
                   "utf-8")
    with pytest.raises(ConfigError, match=r"datasets.mine.fields.human.overall must be "
                                          r"\{ ratings = \"ratings.jsonl\" \}"):
        prepare(load_job(job), tmp_path)


def _items(groups: int) -> list[Item]:
    return [Item(dataset="d", item_id=f"g{g}-{s}", group=f"g{g}", system=s, subset="",
                 fields={}, human={}, annotators={}, metrics={})
            for g in range(groups) for s in SYSTEMS]


def test_the_queue_takes_whole_groups_in_the_sample_draw_and_skips_what_was_rated() -> None:
    items = _items(20)
    queue = rating_queue(items, ["x", "y"], [], "ana", seed=3)
    ids = [item.item_id for item, _ in queue]
    assert sorted(ids) == sorted(it.item_id for it in items)
    assert set(ids[:9]) == sample_ids(items, 9, 3)  # the first 3 groups: --sample 9 --seed 3
    assert all(len({i.split("-")[0] for i in ids[k:k + 3]}) == 1 for k in range(0, 60, 3))
    first = ids[0]
    ratings = [Rating(item=first, aspect="x", annotator="ana", score=None, time="t"),
               Rating(item=first, aspect="y", annotator="ana", score=2, time="t"),
               Rating(item=ids[1], aspect="x", annotator="ana", score=4, time="t"),
               Rating(item=ids[2], aspect="x", annotator="bo", score=4, time="t")]
    again = rating_queue(items, ["x", "y"], ratings, "ana", seed=3)
    assert [(i.item_id, left) for i, left in again[:2]] == [(ids[1], ("y",)),
                                                           (ids[2], ("x", "y"))]
