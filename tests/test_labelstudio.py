"""Ratings to and from Label Studio's documented JSON format, and back again unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from runner.data.annotations import Rating, append_rating, latest, read_ratings
from runner.data.labelstudio import from_label_studio, to_label_studio
from runner.errors import DataError
from tests.test_cli import clean_env, run_judge


def _r(item: str, aspect: str, who: str, score: float | None, time: str = "2026-11-27T10:00:00Z"
       ) -> Rating:
    return Rating(item=item, aspect=aspect, annotator=who, score=score, time=time)


RATINGS = [_r("a", "fluency", "ana", 4), _r("a", "coherence", "ana", 2.5),
           _r("a", "fluency", "bo", 1), _r("a", "fluency", "bo", 3),  # bo changed his mind
           _r("a", "coherence", "bo", 5), _r("b", "fluency", "ana", None),
           _r("b", "coherence", "ana", None), _r("b", "fluency", "bo", 2),
           _r("b", "coherence", "bo", 2)]


def _kept(ratings: list[Rating]) -> dict[tuple[str, str, str], float | None]:
    return {key: r.score for key, r in latest(ratings).items()}


def test_the_export_has_the_documented_shape() -> None:
    tasks = to_label_studio(RATINGS, {"a": {"output": "text a"}})
    assert [t["data"]["item"] for t in tasks] == ["a", "b"]
    assert tasks[0]["data"] == {"item": "a", "output": "text a",
                                "annotators": {"1": "ana", "2": "bo"}}
    ana, bo = tasks[0]["annotations"]
    assert (ana["completed_by"], bo["completed_by"]) == (1, 2)
    assert ana["was_cancelled"] is False
    assert ana["result"] == [
        {"id": "a-fluency", "from_name": "fluency", "to_name": "output", "type": "rating",
         "value": {"rating": 4}},
        {"id": "a-coherence", "from_name": "coherence", "to_name": "output", "type": "rating",
         "value": {"rating": 2.5}}]
    assert bo["result"][0]["value"] == {"rating": 3}
    skipped = tasks[1]["annotations"][0]
    assert skipped["was_cancelled"] is True and skipped["result"] == []


def test_export_then_import_gives_the_same_ratings() -> None:
    tasks = orjson.loads(orjson.dumps(to_label_studio(RATINGS)))
    assert _kept(from_label_studio(tasks)) == _kept(RATINGS)


# A project exported by Label Studio: the task format of its documentation (data, annotations
# with result, completed_by, was_cancelled; "completions" before 1.0), a Choices tag whose
# choices are numbers, a Number tag, a comment box (no score), a cancelled annotation.
EXPORT: list[dict[str, Any]] = [
    {"id": 1, "data": {"text": "first output", "ref_id": "x1"}, "project": 83,
     "annotations": [
         {"id": 1001, "completed_by": 10, "was_cancelled": False,
          "created_at": "2021-03-09T22:16:08.728353Z", "updated_at": "2021-03-09T22:16:09Z",
          "result": [
              {"id": "r1", "from_name": "fluency", "to_name": "text", "type": "choices",
               "value": {"choices": ["4"]}},
              {"id": "r2", "from_name": "coherence", "to_name": "text", "type": "number",
               "value": {"number": 3}},
              {"id": "r3", "from_name": "notes", "to_name": "text", "type": "textarea",
               "value": {"text": ["fine"]}}]},
         {"id": 1002, "completed_by": {"id": 11, "email": "bo@lab.org"},
          "was_cancelled": True, "result": [], "created_at": "2021-03-10T08:00:00Z"}]},
    {"id": 2, "data": {"text": "second output", "ref_id": "x2"},
     "completions": [
         {"id": 1003, "completed_by": 10, "created_at": "2021-03-10T09:00:00Z",
          "result": [{"id": "r4", "from_name": "fluency", "to_name": "text", "type": "rating",
                      "value": {"rating": 2}}]}]},
]


def test_a_label_studio_export_reads_as_ratings() -> None:
    got = from_label_studio(EXPORT, item_field="ref_id")
    assert [(r.item, r.aspect, r.annotator, r.score, r.time) for r in got] == [
        ("x1", "fluency", "user 10", 4.0, "2021-03-09T22:16:09Z"),
        ("x1", "coherence", "user 10", 3.0, "2021-03-09T22:16:09Z"),
        ("x1", "coherence", "bo@lab.org", None, "2021-03-10T08:00:00Z"),
        ("x1", "fluency", "bo@lab.org", None, "2021-03-10T08:00:00Z"),
        ("x2", "fluency", "user 10", 2.0, "2021-03-10T09:00:00Z")]


def test_a_task_without_the_item_field_or_a_word_choice_is_an_error_naming_it() -> None:
    with pytest.raises(DataError, match=r"task 0 \(id 1\): no data.item \(the item id\); .*"
                                        r"--item-field"):
        from_label_studio(EXPORT)
    bad = orjson.loads(orjson.dumps(EXPORT))
    bad[0]["annotations"][0]["result"][0]["value"] = {"choices": ["good"]}
    with pytest.raises(DataError, match=r"the choices result of 'fluency' holds 'good', not "
                                        r"one score"):
        from_label_studio(bad, item_field="ref_id", where="x.json")


@pytest.mark.slow
def test_judge_ratings_export_and_import_round_trip(tmp_path: Path, data_dir: Path) -> None:
    ratings = tmp_path / "ratings.jsonl"
    for r in RATINGS:
        append_rating(ratings, item=r.item, aspect=r.aspect, annotator=r.annotator,
                      score=r.score)
    env = clean_env(data_dir)
    out = run_judge("ratings", "export", ratings, "--format", "label-studio", "--out",
                    tmp_path / "tasks.json", env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    back = tmp_path / "back.jsonl"
    result = run_judge("ratings", "import", tmp_path / "tasks.json", back, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"imported 8 ratings into {back} (0 already there)")
    assert _kept(read_ratings(back)) == _kept(RATINGS)
    again = run_judge("ratings", "import", tmp_path / "tasks.json", back, env=env, cwd=tmp_path)
    assert again.stdout.startswith("imported 0 ratings") and "(8 already there)" in again.stdout
    bad = run_judge("ratings", "import", tmp_path / "tasks.json", back, "--item-field", "id",
                    env=env, cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1].startswith(f"Error: {tmp_path / 'tasks.json'}: "
                                                           "task 0 (id 1): no data.id")


@pytest.mark.slow
def test_the_export_carries_the_items_text_from_the_job(tmp_path: Path, data_dir: Path) -> None:
    from tests.test_ratings import rated_job

    job = rated_job(tmp_path / "study", groups=2)
    ratings = job.parent / "ratings.jsonl"
    append_rating(ratings, item="d1-b", aspect="overall", annotator="ana", score=5)
    done = run_judge("ratings", "export", ratings, "--job", job, env=clean_env(data_dir),
                     cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (task,) = orjson.loads(done.stdout)
    assert task["data"] == {"item": "d1-b", "source": "document 1", "output": "summary 1 by b",
                            "annotators": {"1": "ana"}}
