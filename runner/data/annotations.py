"""Human ratings collected by hand: an append-only JSONL file, read as a data set's human columns.

One line a rating (`Rating`). Appends are a single `write` on a file opened `O_APPEND`, fsynced,
and nothing ever rewrites the file, so a crash loses at most the line being written, and that
line is torn, not a good line damaged; `read_ratings` skips a torn line, and the next append
starts on a new line, so a torn line never glues onto a good one. The last line of an item,
aspect and annotator wins (`latest`), a skip included.

A job reads the file as human columns (`human = { fluency = { ratings = "ratings.jsonl" } }`):
an item's human score is the mean of its annotators' latest scores, its `annotators` votes
(Krippendorff's alpha, the "annotator N" rows of reliability.csv) those scores in annotator-name
order (alpha does not depend on which coder gave which vote).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from runner.data.loaders import Item
from runner.errors import ConfigError, DataError

__all__ = ["Rating", "RatingsWarning", "append_rating", "append_ratings", "human_columns",
           "latest", "rated", "rated_reader", "read_ratings", "votes", "with_ratings"]

_FIELDS = ("item", "aspect", "annotator", "score", "time")


class RatingsWarning(UserWarning):
    """A ratings file line that was skipped (torn by a crash while it was written)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Rating:
    """One line of a ratings file."""

    item: str  # the item id within its data set
    aspect: str
    annotator: str  # who rated (`judge serve --annotator NAME`)
    score: float | None  # None = skipped: seen, not scored
    time: str  # when, ISO 8601 in UTC, e.g. "2026-11-27T09:52:18Z"


def append_rating(path: Path, *, item: str, aspect: str, annotator: str,
                  score: float | None) -> None:
    """Append one rating to a ratings file (created with its folder if absent) and fsync it.

    Args:
        path: The ratings file.
        item, aspect, annotator: The item id, the aspect rated and who rated.
        score: The score, or None for a skip.

    Raises:
        DataError: An empty item, aspect or annotator, a score that is not a finite number,
            or the file cannot be written.
    """
    time = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    append_ratings(path, [Rating(item=item, aspect=aspect, annotator=annotator, score=score,
                                 time=time)])


def append_ratings(path: Path, ratings: Iterable[Rating]) -> None:
    """Append ratings as they are (their times kept: an import) in one write, and fsync.

    Args:
        path: The ratings file (created with its folder if absent).

    Raises:
        DataError: As append_rating; nothing is written then.
    """
    lines = b"".join(orjson.dumps(_checked(path, r)) + b"\n" for r in ratings)
    if not lines:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            # a torn last line (a crash mid-write) ends without a newline: end it first
            torn = size > 0 and os.pread(fd, 1, size - 1) != b"\n"
            os.write(fd, (b"\n" if torn else b"") + lines)  # one write: appended whole
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise DataError(f"{path}: cannot append the rating ({exc.strerror}); check the folder "
                        "is writable") from None


def _is_score(value: Any) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool)
                             and math.isfinite(value))


def _checked(path: Path, r: Rating) -> dict[str, Any]:
    for name in ("item", "aspect", "annotator", "time"):
        value = getattr(r, name)
        if not isinstance(value, str) or not value:
            raise DataError(f"{path}: a rating needs a non-empty {name} (got {value!r})")
    score = r.score
    if not _is_score(score):
        raise DataError(f"{path}: a rating's score must be a finite number or None for a skip "
                        f"(got {score!r})")
    return {"item": r.item, "aspect": r.aspect, "annotator": r.annotator,
            "score": None if score is None else float(score), "time": r.time}


def read_ratings(path: Path) -> list[Rating]:
    """Every rating in a ratings file, in file order. A missing file has none (yet).

    Args:
        path: The ratings file.

    Returns:
        The ratings; a line that is not valid JSON (torn by a crash) is skipped with a
        `RatingsWarning` naming it.

    Raises:
        DataError: The file cannot be read, or a line is JSON but not a rating (names the
            line and what is wrong).
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise DataError(f"{path}: cannot read the ratings ({exc.strerror})") from None
    out = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            warnings.warn(f"{path}:{number}: skipped a torn line (a crash while it was "
                          "written); the ratings before and after it are read",
                          RatingsWarning, stacklevel=2)
            continue
        out.append(_rating(f"{path}:{number}", record))
    return out


def _rating(where: str, record: Any) -> Rating:
    fix = "fix or delete that line"
    if not isinstance(record, dict) or set(record) != set(_FIELDS):
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise DataError(f"{where}: a rating has exactly the keys {', '.join(_FIELDS)} "
                        f"(got {keys}); {fix}")
    for name in ("item", "aspect", "annotator", "time"):
        if not isinstance(record[name], str) or not record[name]:
            raise DataError(f"{where}: {name} must be non-empty text (got {record[name]!r}); "
                            f"{fix}")
    score = record["score"]
    if not _is_score(score):
        raise DataError(f"{where}: score must be a number or null (got {score!r}); {fix}")
    return Rating(item=record["item"], aspect=record["aspect"], annotator=record["annotator"],
                  score=None if score is None else float(score), time=record["time"])


def latest(ratings: Iterable[Rating]) -> dict[tuple[str, str, str], Rating]:
    """Each (item, aspect, annotator)'s last rating, a skip included: a new line replaces.

    Args:
        ratings: Ratings in file order.

    Returns:
        The last rating by (item, aspect, annotator), in order of first appearance.
    """
    return {(r.item, r.aspect, r.annotator): r for r in ratings}


def rated(ratings: Iterable[Rating], annotator: str) -> set[tuple[str, str]]:
    """The (item, aspect) pairs an annotator has rated or skipped: what their queue leaves out.

    Args:
        ratings: Ratings in file order.
        annotator: The annotator's name.

    Returns:
        The (item id, aspect) pairs.
    """
    return {(r.item, r.aspect) for r in ratings if r.annotator == annotator}


def votes(ratings: Iterable[Rating], aspect: str) -> dict[str, tuple[float, ...]]:
    """One aspect's scores by item: each annotator's latest score, in annotator-name order.

    Skips are not scores: an item whose annotators all skipped it has no entry.

    Args:
        ratings: Ratings in file order.

    Returns:
        Item id -> the scores (one per annotator who scored it).
    """
    by_item: dict[str, list[tuple[str, float]]] = {}
    for (item, asp, annotator), r in latest(ratings).items():
        if asp == aspect and r.score is not None:
            by_item.setdefault(item, []).append((annotator, r.score))
    return {item: tuple(score for _, score in sorted(scored)) for item, scored in by_item.items()}


def with_ratings(items: Iterable[Item], columns: Mapping[str, Mapping[str, tuple[float, ...]]]
                 ) -> Iterator[Item]:
    """Items with human columns from ratings: the mean of each aspect's votes, and the votes.

    Args:
        items: The data set's items.
        columns: Aspect -> item id -> votes (`votes` of the aspect's ratings file).

    Returns:
        The items, each with `human` and `annotators` of the aspects it was rated on added
        (an item nobody scored on an aspect has no human score for it).
    """
    for item in items:
        found = {aspect: by_item[item.item_id] for aspect, by_item in columns.items()
                 if item.item_id in by_item}
        if not found:
            yield item
            continue
        yield item._replace(
            human={**item.human, **{a: sum(v) / len(v) for a, v in found.items()}},
            annotators={**item.annotators, **found})


def human_columns(human: Mapping[str, Any], base: Path, where: str
                  ) -> tuple[dict[str, str | tuple[str, ...]], dict[str, Path]]:
    """A file data set's `fields.human`, split into its columns and its ratings files.

    Args:
        human: Aspect -> a column, a list of annotator columns, or `{ratings = "file"}`.
        base: The folder a ratings file's path is relative to (the job file's).
        where: The key path for messages, e.g. "jobs/x.toml: datasets.mine.fields.human".

    Returns:
        (aspect -> column or columns, aspect -> ratings file).

    Raises:
        ConfigError: An aspect's value is none of those.
    """
    columns: dict[str, str | tuple[str, ...]] = {}
    files: dict[str, Path] = {}
    for aspect, value in human.items():
        if isinstance(value, dict):
            if set(value) != {"ratings"} or not isinstance(value["ratings"], str):
                raise ConfigError(f"{where}.{aspect} must be {{ ratings = \"ratings.jsonl\" }} "
                                  f"(the ratings file, relative to the job file); got {value!r}")
            files[aspect] = base / value["ratings"]
        else:
            columns[aspect] = tuple(value) if isinstance(value, list) else value
    return columns, files


def rated_reader(read: Callable[[], Iterator[Item]], files: Mapping[str, Path]
                 ) -> Callable[[], Iterator[Item]]:
    """`read` with the aspects' ratings as human columns; each file is read once, here.

    Args:
        read: Reads the data set's items (each call a new pass).
        files: Aspect -> its ratings file (a missing file: no ratings yet).

    Returns:
        A reader of the items `with_ratings`.
    """
    if not files:
        return read
    loaded = {path: read_ratings(path) for path in set(files.values())}
    columns = {aspect: votes(loaded[path], aspect) for aspect, path in files.items()}
    return lambda: with_ratings(read(), columns)
