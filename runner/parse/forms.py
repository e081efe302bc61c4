"""The parsers that read several labelled scores: `form`, `outputs` and `json`.

Each is a parser as runner.parse.base says, of (Choice, merged options). Their keys: `form` the
keys its `fields` table maps labels to, `json` `aspect_key` of each aspect (or of each numeric
top-level key), `outputs` "1".."count". With `required`, one missing, N/A or off-scale score
fails the whole answer; without it, such scores are left out, and an answer with none left is a
failure. runner.parse.parsers registers them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from runner.parse.base import DECIMAL, Choice, Failure, Scores, aspect_key, in_range, scale_text
from runner.parse.structured import find_object, lookup, number

__all__ = ["parse_form", "parse_json", "parse_outputs"]

# --- json ---------------------------------------------------------------------------------------


def parse_json(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read a JSON object ({"coherence": 4, "reasoning": "..."}), bare, in a ```json block,
    with text around it, or continuing a prefilled "{".

    With `fields` (aspect -> key in the object, or a dotted path "scores.coherence"), each
    aspect's score is that key's value under `aspect_key(aspect)`; with `required`, a missing,
    non-numeric or out-of-range field fails the answer, otherwise it is left out. Without
    `fields`, every numeric top-level value is kept under `aspect_key` of its key ("score" stays
    "score"), so an aspect's score is the key named like the aspect. Numbers may be written as
    strings ("4", "4/5"); booleans are not numbers.

    Args:
        options: merged options "fields", "min", "max" and "required".

    Returns:
        Scores keyed by `aspect_key`, or Failure("parse") naming the fields that were wrong.
    """
    obj = find_object(choice.text or "")
    if obj is None:
        return Failure("parse", "no JSON object found")
    if not options["fields"]:
        values = {aspect_key(k): v for k, raw in obj.items()
                  if (v := number(raw)) is not None and in_range(v, options)}
        if values:
            return Scores(values)
        return Failure("parse", f"no numeric field {scale_text(options)} in the JSON object "
                       f"(keys: {', '.join(map(str, obj)) or 'none'})")
    values, problems = {}, []
    for aspect, path in options["fields"].items():
        value = number(lookup(obj, path))
        if value is None:
            problems.append(f"{path} missing or not a number")
        elif not in_range(value, options):
            problems.append(f"{path} {value:g} outside {scale_text(options)}")
        else:
            values[aspect_key(aspect)] = value
    if (problems and options["required"]) or not values:
        return Failure("parse", "; ".join(problems))
    return Scores(values)


# --- form ---------------------------------------------------------------------------------------

_SEGMENTS = re.compile(r"[\n;]|,\s")
_PAREN_SCORE = re.compile(
    rf"\s*(?:(?P<na>n/?a)|(?P<num>{DECIMAL})(?:\s*(?P<sep>/|out of|-|–)\s*(?P<of>{DECIMAL}))?)\s*",
    re.IGNORECASE)


@functools.lru_cache(maxsize=64)
def _form_regex(labels: tuple[str, ...]) -> re.Pattern[str]:
    """One segment: bullet, label (longest first), "(1-5)" or "(4)", separator, value."""
    order = sorted(range(len(labels)), key=lambda i: -len(labels[i]))
    alternatives = "|".join(f"(?P<f{i}>{re.escape(labels[i])})" for i in order)
    return re.compile(
        r"[\s>#*_|•·+\-–—]*+(?:\d+[.)]\s+)?[\s*_]*+"
        rf"(?:{alternatives})(?![^\W\d_])(?:\s*(?:score|rating|得分|分数|评分|점수))?"
        r"[\s*_]*(?:\((?P<paren>[^()\n]*)\))?[\s*_]*(?:[:：=|\-–—][\s*_]*)?"
        rf"(?:(?P<na>n/?a\b)|(?P<num>{DECIMAL})(?!\d|\.\d|[A-Za-z]))?",
        re.IGNORECASE)


def _form_value(match: re.Match[str], options: Mapping[str, Any]) -> tuple[str, bool] | None:
    """(value, written as "(x-max)") of a labelled segment, or None when it holds no value.

    The value is a number, "na", or "range" for a bare "(min-max)": that is the echoed label,
    unless the answer writes its scores as "(x-max)" elsewhere (see `parse_form`).
    """
    if match.group("num") or match.group("na"):
        return match.group("num") or "na", False
    paren = _PAREN_SCORE.fullmatch(match.group("paren") or "")
    if not paren or paren.group("na"):
        return ("na", False) if paren else None
    if paren.group("sep") not in ("-", "–"):
        return paren.group("num"), False
    if float(paren.group("of")) != options["max"]:
        return None
    if float(paren.group("num")) == options["min"]:
        return "range", False
    return paren.group("num"), True


def _form_read(text: str, labels: tuple[str, ...], keys: Sequence[str],
               options: Mapping[str, Any]) -> dict[str, tuple[str, bool]]:
    """key -> (value, dashed) from the first segment that gives each key a value."""
    found: dict[str, tuple[str, bool]] = {}
    regex = _form_regex(labels)
    for segment in _SEGMENTS.split(text):
        match = regex.match(segment)
        value = match and _form_value(match, options)
        if not match or not value:
            continue
        key = keys[next(i for i in range(len(labels)) if match.group(f"f{i}") is not None)]
        if key not in found or found[key][0] == "range":
            found[key] = value
    return found


def parse_form(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read several labelled scores ("- Fluency (1-5): 4", "**Accuracy**: 3", "Coherence - 5").

    A label counts at the start of a line or after ";" or ", ", behind bullets, numbering or
    markdown; several labels may share a key (synonyms). For each key the first segment with a
    value wins: a number after the separator, else a score written into the parentheses:
    "(4)", "(4/5)", or "(4-5)" ("(x-max)", x > min). A bare "(1-5)" ("(min-max)") is the echoed
    label and no value, unless another field of the same answer used "(x-max)": then it means
    min. "N/A" becomes `na_value` when set. With `required`, any missing, N/A or out-of-range
    key fails the answer; otherwise such keys are left out.

    Args:
        options: merged options "fields" (label -> key), "min", "max", "na_value", "required".

    Returns:
        Scores keyed by the `fields` keys, or Failure("parse") naming the labels that were wrong.
    """
    labels, keys = tuple(options["fields"]), tuple(options["fields"].values())
    values: dict[str, float] = {}
    problems: list[str] = []
    found = _form_read(choice.text or "", labels, keys, options)
    dashed = any(d for _, d in found.values())
    for key in dict.fromkeys(keys):
        label = labels[keys.index(key)]
        value = found.get(key, ("", False))[0]
        value = str(options["min"]) if value == "range" and dashed else value
        if value in ("", "range"):
            problems.append(f"{label} missing")
        elif value == "na" and options["na_value"] is None:
            problems.append(f"{label} is N/A")
        elif value != "na" and not in_range(float(value), options):
            problems.append(f"{label} {float(value):g} outside {scale_text(options)}")
        else:
            values[key] = float(options["na_value"] if value == "na" else value)
    if (problems and options["required"]) or not values:
        return Failure("parse", "; ".join(problems))
    return Scores(values)


# --- outputs ------------------------------------------------------------------------------------

_OUTPUT_HEADER = re.compile(r"^[ \t>#*_-]*output\s*#?\s*(\d+)\b", re.IGNORECASE | re.MULTILINE)


def parse_outputs(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read "Output 3 ... Score: 85 ... Explanation: ..." blocks (Lai et al. 2023).

    A block starts at a line beginning "Output N" and runs to the next one; its first
    "<label>: <number>" ("Score" by default) is output N's score. Outputs outside 1..count are
    ignored, and the first block with a score wins. With `required`, a missing or out-of-range
    output fails the answer; otherwise it is left out.

    Args:
        options: merged options "count", "min", "max", "required" and "label".

    Returns:
        Scores keyed "1".."count", or Failure("parse") naming the outputs without a score.
    """
    text = choice.text or ""
    score = re.compile(rf"\b{re.escape(options['label'])}\s*[:：=]?[\s*_]*({DECIMAL})(?!\d|\.\d)",
                       re.IGNORECASE)
    headers = list(_OUTPUT_HEADER.finditer(text))
    values: dict[str, float] = {}
    off_scale: list[str] = []
    ends = [h.start() for h in headers[1:]] + [len(text)]
    for header, end in zip(headers, ends, strict=False):  # no header: no block
        output = int(header.group(1))
        found = score.search(text, header.end(), end)
        if not found or not 1 <= output <= options["count"] or str(output) in values:
            continue
        if in_range(float(found.group(1)), options):
            values[str(output)] = float(found.group(1))
        else:
            off_scale.append(f"{output} ({found.group(1)})")
    missing = [str(n) for n in range(1, options["count"] + 1) if str(n) not in values]
    if (missing and options["required"]) or not values:
        message = f"no score for output {', '.join(missing)}" if missing else ""
        if off_scale:
            message += f"; outside {scale_text(options)}: {', '.join(off_scale)}"
        return Failure("parse", message.lstrip("; "))
    return Scores(values)
