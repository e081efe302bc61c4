"""What a parser takes and returns, and the reading of numbers every parser shares.

A parser is a pure function of one `Choice` (and its options) that returns `Scores` or a
`Failure`: it never raises on any text and never turns an answer it cannot read into a number.
The keys of `Scores.values` obey one rule, told at `aspect_key`.

Numbers: a number is ASCII digits with an optional decimal part ("4", "4.5"), not glued to
letters ("GPT-4", "3rd" are not scores). A leading "-" is a bullet, never a sign.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["DECIMAL", "DENOMINATOR", "NUMBER", "RANGE", "Choice", "Failure", "Scores",
           "aspect_key", "in_range", "scale_text", "score_in_range"]


@dataclass(frozen=True, slots=True)
class Choice:
    """One choice of a chat-completion response: what every parser reads."""

    text: str  # choices[i].message.content, "" when null
    # choices[i].logprobs.content as raw dicts; None when not requested
    logprobs: Sequence[Mapping[str, Any]] | None = None
    finish_reason: str | None = None  # "stop", "length", "content_filter", ...


@dataclass(frozen=True, slots=True)
class Scores:
    """What one answer said, key -> score: {"score": x}, {aspect_key(aspect): x}, {"1": x, ...}."""

    values: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an answer gave no score."""

    type: str  # "parse" (the answer could not be read) or "refusal" (the judge declined)
    message: str  # one line for the report, naming what was missing


def aspect_key(aspect: str) -> str:
    """How an aspect name appears among a parser's values: "Overall Quality" -> overall_quality.

    The rule every parser keeps: an answer's score for an aspect is its value "score", else
    its value under `aspect_key(aspect)`. `check_aspect` holds a job's parser options to it, so a
    misnamed key is a job-file error naming the aspect, not a score missing from every task.

    Args:
        aspect: an aspect name as the prompt lists it.

    Returns:
        The name lowercased, with "-" and runs of whitespace turned into one "_".
    """
    return "_".join(aspect.lower().replace("-", " ").split())


DECIMAL = r"\d++(?:\.\d++)?+"  # possessive: no backtracking into long digit runs
"""Regex text of one unsigned decimal number ("4", "4.5"), to build other patterns from."""
# A standalone number: not part of a word, a version ("GPT-4") or a longer number.
NUMBER = re.compile(rf"(?<![A-Za-z0-9_.])(?<![A-Za-z]-)({DECIMAL})(?!\d|\.\d|[A-Za-z_])")
"""A standalone number, its digits as group 1."""
# An echoed scale, "(1-5)" or "1 to 5"; never a score.
RANGE = re.compile(rf"\(?(?<![\d.]){DECIMAL}\s*(?:-|–|—|~|to)\s*{DECIMAL}\)?", re.IGNORECASE)
"""An echoed scale, "(1-5)" or "1 to 5": text to drop before looking for a score."""
DENOMINATOR = re.compile(rf"(?:/|\bout\s+of)\s*{DECIMAL}", re.IGNORECASE)
"""The "/5" of "4/5" or the "out of 5" of "4 out of 5": text to drop before reading a score."""


def in_range(value: float, options: Mapping[str, Any]) -> bool:
    """Whether a score lies on the parser's scale.

    Args:
        options: the parser's merged options, with "min" and "max".

    Returns:
        True when min <= value <= max.
    """
    return bool(options["min"] <= value <= options["max"])


def scale_text(options: Mapping[str, Any]) -> str:
    """The scale for a message, "1-5".

    Args:
        options: the parser's merged options, with "min" and "max".

    Returns:
        "min-max", each written with `:g`.
    """
    return f"{options['min']:g}-{options['max']:g}"


def score_in_range(value: float, what: str, options: Mapping[str, Any]) -> Scores | Failure:
    """One score under the key "score", or a failure when it is off the scale.

    Args:
        what: what was read ("score", "star rating"), for the failure's message.
        options: the parser's merged options, with "min" and "max".

    Returns:
        Scores({"score": value}) when `in_range`, else Failure("parse") naming value and scale.
    """
    if in_range(value, options):
        return Scores({"score": float(value)})
    return Failure("parse", f"{what} {value:g} is outside {scale_text(options)}")
