"""Ratings to and from Label Studio's JSON format, for teams that rate there.

The format is Label Studio's list of tasks, as its documentation gives it ("Label Studio JSON
format of annotated tasks", https://labelstud.io/guide/task_format, the same text as
HumanSignal/label-studio docs/source/includes/task_format.md; the import side in
docs/source/guide/tasks.md, "Basic Label Studio JSON format"): each task has `data` (free-form
fields) and `annotations`, each annotation a `result` list and `completed_by` (a user id) and
`was_cancelled` (the annotator skipped the task); each result has `from_name` (the control tag:
here the aspect), `to_name` (the object tag: here "output"), `type` and `value`. A `<Rating>`
tag's value is `{"rating": 4}`, a `<Choices>` tag's `{"choices": ["4"]}`, a `<Number>` tag's
`{"number": 4}` (Label Studio's own test data, web/libs/editor/tests/.../per-item.js).

Export: one task per rated item, `data` = {"item": the item id, the item's text fields when
given, "annotators": {user id: name}} (Label Studio keeps other `data` keys as they are: its
user ids are numbers, the names come back through this map), one annotation per annotator with
their latest scores as "rating" results; an annotator who skipped every aspect of an item is an
annotation with `was_cancelled` true. Import reads "rating", "choices" (a numeric choice) and
"number" results (other result types, e.g. a comment box, are left out), names `completed_by`
through `data.annotators`, else by its email, else "user N", and turns a cancelled annotation
into skips of the aspects the file rates. An aspect skipped while others were scored leaves no
trace in Label Studio's format: it is left out of the export.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from runner.data.annotations import Rating, latest
from runner.data.readers import number
from runner.errors import DataError

__all__ = ["from_label_studio", "to_label_studio"]

TO_NAME = "output"  # the object tag the ratings point at: <Text name="output" value="$output"/>


def to_label_studio(ratings: Iterable[Rating],
                    fields: Mapping[str, Mapping[str, str]] | None = None) -> list[dict[str, Any]]:
    """Ratings as Label Studio tasks.

    Args:
        ratings: Ratings in file order (the last of each item, aspect and annotator is kept).
        fields: Item id -> its text fields, put in each task's `data` (none when None).

    Returns:
        One task per rated item, in order of the item's first rating.
    """
    last = latest(ratings)
    users = {name: n for n, name in enumerate(sorted({a for _, _, a in last}), start=1)}
    by_item: dict[str, dict[str, list[Rating]]] = {}
    for (item, _, annotator), r in last.items():
        by_item.setdefault(item, {}).setdefault(annotator, []).append(r)
    tasks = []
    for task_id, (item, by_annotator) in enumerate(by_item.items(), start=1):
        annotations: list[dict[str, Any]] = []
        for annotator in sorted(by_annotator):
            rs = by_annotator[annotator]
            scored = [r for r in rs if r.score is not None]
            annotations.append({
                "id": len(annotations) + 1, "completed_by": users[annotator],
                "created_at": max(r.time for r in rs), "was_cancelled": not scored,
                "result": [{"id": f"{item}-{r.aspect}", "from_name": r.aspect,
                            "to_name": TO_NAME, "type": "rating",
                            "value": {"rating": _number(r.score)}}
                           for r in scored if r.score is not None]})
        data = {"item": item, **(fields or {}).get(item, {}),
                "annotators": {str(users[a]): a for a in sorted(by_annotator)}}
        tasks.append({"id": task_id, "data": data, "annotations": annotations})
    return tasks


def _number(score: float) -> float | int:
    """A whole score as an int: Label Studio's Rating values are whole stars."""
    return int(score) if float(score).is_integer() else score


def from_label_studio(tasks: Any, *, item_field: str = "item", where: str = "the file"
                      ) -> list[Rating]:
    """Ratings from Label Studio tasks (an export, or tasks with annotations to import).

    Args:
        tasks: The decoded JSON: a list of tasks, or one task.
        item_field: The `data` key holding the item id.
        where: The file, for messages.

    Returns:
        The ratings, task by task, annotation by annotation.

    Raises:
        DataError: Not tasks, a task without the item id, or a score that is not a number.
    """
    if isinstance(tasks, dict):
        tasks = [tasks]
    if not isinstance(tasks, list):
        raise DataError(f"{where}: expected Label Studio's JSON export (a list of tasks), "
                        f"got a {type(tasks).__name__}")
    aspects = sorted({str(r["from_name"]) for t in tasks if isinstance(t, dict)
                      for a in _annotations(t) for r in a.get("result", [])
                      if isinstance(r, dict) and r.get("type") in _READERS
                      and isinstance(r.get("from_name"), str) and r["from_name"]})
    out = []
    for n, task in enumerate(tasks):
        here = f"{where}: task {n}" + (f" (id {task['id']})" if isinstance(task, dict)
                                       and "id" in task else "")
        data = task.get("data") if isinstance(task, dict) else None
        if not isinstance(data, dict) or data.get(item_field) in (None, ""):
            raise DataError(f"{here}: no data.{item_field} (the item id); give the data key "
                            "that holds your item ids with --item-field")
        item = str(data[item_field])
        names: Mapping[str, Any] = data["annotators"] if isinstance(data.get("annotators"),
                                                                     dict) else {}
        for annotation in _annotations(task):
            who = _annotator(annotation.get("completed_by"), names)
            time = _time(annotation)
            if annotation.get("was_cancelled"):
                out += [Rating(item=item, aspect=a, annotator=who, score=None, time=time)
                        for a in aspects]
                continue
            for result in annotation.get("result", []):
                score = _score(result, here)
                if score is not None:
                    out.append(Rating(item=item, aspect=str(result["from_name"]),
                                      annotator=who, score=score, time=time))
    return out


def _annotations(task: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A task's annotations ("completions" before Label Studio 1.0)."""
    found = task.get("annotations", task.get("completions", []))
    return [a for a in found if isinstance(a, dict)] if isinstance(found, list) else []


def _annotator(completed_by: Any, names: Mapping[str, Any]) -> str:
    if isinstance(completed_by, dict):  # some exports expand the user: id, email, names
        if completed_by.get("email"):
            return str(completed_by["email"])
        completed_by = completed_by.get("id")
    if isinstance(completed_by, str) and completed_by:
        return completed_by
    if completed_by is None:
        return "unknown"
    return str(names.get(str(completed_by)) or f"user {completed_by}")


def _time(annotation: Mapping[str, Any]) -> str:
    for key in ("updated_at", "created_at", "completed_at"):
        if isinstance(annotation.get(key), str) and annotation[key]:
            return str(annotation[key])
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _from_choices(value: Mapping[str, Any]) -> Any:
    choices = value.get("choices")
    return choices[0] if isinstance(choices, list) and len(choices) == 1 else choices


# result type -> its score in the result's `value`
_READERS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "rating": lambda value: value.get("rating"), "choices": _from_choices,
    "number": lambda value: value.get("number")}


def _score(result: Any, here: str) -> float | None:
    """A result's score; None for a result type that holds none (a comment, a label)."""
    if not isinstance(result, dict) or result.get("type") not in _READERS:
        return None
    value = result.get("value")
    raw = _READERS[result["type"]](value) if isinstance(value, dict) else None
    score = number(raw)
    if not math.isfinite(score) or not isinstance(result.get("from_name"), str) \
            or not result["from_name"]:
        raise DataError(f"{here}: the {result['type']} result of {result.get('from_name')!r} "
                        f"holds {raw!r}, not one score; rate with a Rating, Number or Choices "
                        "tag whose choices are numbers")
    return score
