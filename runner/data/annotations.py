"""Human ratings collected by hand (`judge serve --annotator NAME`): one JSONL file, appended to.

Each rating is one line {"item", "aspect", "annotator", "score", "time"} (score null: the
annotator skipped the item on that aspect), written with one write and fsynced before the call
returns, never rewritten: a crash loses at most the rating being written, and a line cut short
by it is ignored on reading.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import NamedTuple

import orjson

from runner.errors import DataError

__all__ = ["Rating", "append_rating", "read_ratings"]


class Rating(NamedTuple):
    """One line of a ratings file."""

    item: str
    aspect: str
    annotator: str
    score: float | None  # None: skipped
    time: float


def append_rating(path: Path, *, item: str, aspect: str, annotator: str,
                  score: float | None) -> None:
    """Append one rating to `path` (made with its folder if missing) and fsync it.

    Args:
        path: the ratings file.
        item: the item's id.
        aspect: the aspect rated.
        annotator: who rated.
        score: the rating, None for a skip.

    Raises:
        DataError: the file cannot be written.
    """
    line = orjson.dumps({"item": item, "aspect": aspect, "annotator": annotator,
                         "score": score, "time": time.time()}, option=orjson.OPT_APPEND_NEWLINE)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise DataError(f"{path}: cannot append the rating ({exc.strerror or exc}); check the "
                        "folder's permissions and free space") from None


def read_ratings(path: Path) -> list[Rating]:
    """Every rating in `path`, in file order ([] if there is no file yet).

    Args:
        path: the ratings file.

    Returns:
        The ratings; a last line cut short by a crash is left out.
    """
    if not path.is_file():
        return []
    out = []
    for line in path.read_bytes().splitlines():
        try:
            r = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        out.append(Rating(str(r["item"]), str(r["aspect"]), str(r["annotator"]),
                          None if r["score"] is None else float(r["score"]), float(r["time"])))
    return out
