"""Find the JSON object in a judge's answer: the reading half of the `json` parser.

Pure, no I/O, never raises on any text. Judges asked for JSON answer with the bare object,
with a fenced ```json block, with a sentence before or after it, or (an Anthropic answer to a
prefilled "{") with the object's body only; each of these is read. What the object's fields
mean is the parser's business (runner.parse.forms).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["find_object", "lookup", "number"]

_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n(.*?)```", re.DOTALL)
_DECODER = json.JSONDecoder()
_BRACES_TRIED = 64  # "{" positions tried per text: a long answer full of braces stays linear
_NUMERIC = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*(?:/\s*\d+(?:\.\d+)?)?\s*")


def find_object(text: str) -> Mapping[str, Any] | None:
    """The first JSON object in a judge's answer.

    Returns:
        The object inside a fenced block first, else the one at the first "{" that starts a
        valid object, else `text` read as the body of an object whose "{" was prefilled; None
        when there is none.
    """
    for block in _FENCE.findall(text):
        if (found := _first_object(block)) is not None:
            return found
    if (found := _first_object(text)) is not None:
        return found
    if "}" in text:  # a continuation of a prefilled "{"
        return _first_object("{" + text.lstrip())
    return None


def _first_object(text: str) -> Mapping[str, Any] | None:
    start = text.find("{")
    for _ in range(_BRACES_TRIED):
        if start == -1:
            break
        try:
            value, _end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):  # not JSON, a number too long, nesting too deep
            value = None
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


def lookup(obj: Mapping[str, Any], path: str) -> Any:
    """The value at a key or a dotted path of a JSON object.

    Args:
        path: a key, or a dotted path into nested objects ("scores.coherence").

    Returns:
        The value under the key itself if present, else at the dotted path; None when absent.
    """
    if path in obj:
        return obj[path]
    value: Any = obj
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def number(value: Any) -> float | None:
    """A score from a JSON value.

    Args:
        value: any decoded JSON value.

    Returns:
        A finite number (not a boolean) as a float, or the number a string holds ("4", "4/5"
        gives 4.0); None otherwise.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str) and (found := _NUMERIC.fullmatch(value)):
        return float(found.group(1))
    return None
