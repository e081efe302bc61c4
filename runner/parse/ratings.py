"""The parsers that read one rating: `stars`, `number`, `pair` and `logprob`.

Each is a parser as runner.parse.base says, of (Choice, merged options). `stars`, `number` and
`logprob` return the one key "score"; `pair` returns "1" and "2". A rating off the min..max
scale is a failure, never clipped. runner.parse.parsers registers them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from runner.parse.base import (
    DECIMAL,
    DENOMINATOR,
    NUMBER,
    RANGE,
    Choice,
    Failure,
    Scores,
    in_range,
    scale_text,
    score_in_range,
)

__all__ = ["parse_logprob", "parse_number", "parse_pair", "parse_stars"]

# --- stars --------------------------------------------------------------------------------------

_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten".split())}
# A star count in digits or words, group "v", with an optional "and a half", group "half".
_STAR_VALUE = rf"(?P<v>{DECIMAL}|{'|'.join(_NUMBER_WORDS)})(?P<half>\s+and\s+a\s+half)?"
_STAR_COUNT = re.compile(
    rf"(?<![\w.]){_STAR_VALUE}[\s-]*stars?\b"
    r"(?!\s*(?:means?\b|meaning|indicates?|represents?|signif|stands?\b|is for|are for|=))",
    re.IGNORECASE)
_STAR_LABEL = re.compile(rf"\b(?:stars?|rating|score)\s*[:：=]\s*\**\s*{_STAR_VALUE}\b",
                         re.IGNORECASE)
_STAR_FRACTION = re.compile(
    rf"(?<![\w./]){_STAR_VALUE}\s*(?:/|out\s+of)\s*(?:{DECIMAL}|five|ten)\b", re.IGNORECASE)
_STAR_SYMBOLS = re.compile("[★⭐🌟](?:[\\s\ufe0f]*[★⭐🌟])*")
# Text just before "N stars" that makes N the end of a range or a denominator ("1-5 stars").
_RANGE_BEFORE = re.compile(
    rf"(?:(?:\d|\b(?:{'|'.join(_NUMBER_WORDS)}))\s*[-–~]|/|\bto|\band|\bout\s+of)\s*$",
    re.IGNORECASE)
# A line that is only a star count, with markdown or punctuation around it ("**4**", "Four.").
_BARE_STAR_VALUE = re.compile(rf"[\s*_`\"'.!]*{_STAR_VALUE}[\s*_`\"'.!]*", re.IGNORECASE)


def _star_value(match: re.Match[str]) -> float:
    word = match.group("v").lower()
    value = float(_NUMBER_WORDS[word]) if word in _NUMBER_WORDS else float(word)
    return value + 0.5 if match.group("half") else value


def _star_candidates(text: str) -> list[tuple[int, float]]:
    """(position, stars) for every explicit star rating in the text."""
    found = [(m.start(), _star_value(m)) for m in _STAR_COUNT.finditer(text)
             if not _RANGE_BEFORE.search(text, max(0, m.start() - 12), m.start())]
    found += [(m.start(), _star_value(m)) for m in _STAR_LABEL.finditer(text)]
    found += [(m.start(), _star_value(m)) for m in _STAR_FRACTION.finditer(text)]
    found += [(m.start(), float(len(re.sub("[\\s\ufe0f]", "", m.group()))))
              for m in _STAR_SYMBOLS.finditer(text)]
    return found


def _star_level(text: str, levels: Mapping[str, int]) -> Scores | Failure | None:
    """Match the prompt's level descriptions, longest first; None when none is present."""
    low, matched = text.lower(), set()
    for description in sorted(levels, key=len, reverse=True):
        needle = description.lower()
        if needle in low:
            matched.add(levels[description])
            low = low.replace(needle, "\0")  # a shorter description inside it no longer counts
    if len(matched) > 1:
        return Failure("parse", f"several level descriptions match: {sorted(matched)}")
    return Scores({"score": float(matched.pop())}) if matched else None


def parse_stars(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read a star rating.

    The earliest explicit rating wins: "4 stars"/"four-star"/"4.5 stars"/"four and a half
    stars", "Stars: 4" (also "Rating:"/"Score:"), "4/5" or "4 out of 5", or a run of "★"/"⭐"
    ("☆" are empty stars and not counted). "N star(s)" is not a rating when it is defined
    ("one star means ...", "5 stars = ..."), ends a range ("one to five stars", "1-5 stars") or is
    a denominator ("out of five stars"). Failing those, a first line that is only a number or
    number word ("4", "Four."). Failing that, the `levels` descriptions (see `_star_level`);
    several different levels present is a failure. A rating outside min..max is a failure.

    Args:
        options: merged options "min", "max" and "levels" (description -> star count).

    Returns:
        Scores({"score": stars}), or Failure("parse") saying what was wrong or missing.
    """
    text = choice.text or ""
    candidates = _star_candidates(text)
    if candidates:
        return score_in_range(min(candidates)[1], "star rating", options)
    first_line = next((line for line in text.splitlines() if line.strip()), "")
    bare = _BARE_STAR_VALUE.fullmatch(first_line)
    if bare:
        return score_in_range(_star_value(bare), "star rating", options)
    level = _star_level(text, options["levels"])
    return level or Failure("parse", f"no star rating {scale_text(options)} found")


# --- number -------------------------------------------------------------------------------------

def parse_number(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read one number (G-Eval "scores ONLY" answers: "4", "- 4", "Coherence: 4", "4/5").

    With `pattern`, its first match's group is the score. Otherwise a standalone number,
    skipping echoed ranges ("(1-5)", "1 to 5") and denominators ("/5", "out of 5"): the first
    one, or with `pick = "last"` the last one (a chain-of-thought answer ends with its score).
    With `marker` (e.g. "Score:", matched without regard to case), only the text after the
    marker's last occurrence is read, and an answer without the marker is a failure. The number
    must lie in min..max; a chosen number outside it is a failure, not a reason to look further.

    Args:
        options: merged options "min", "max", "pattern", "pick" and "marker".

    Returns:
        Scores({"score": number}), or Failure("parse") saying what was wrong or missing.
    """
    text = choice.text or ""
    if options["pattern"] is not None:
        found = re.search(options["pattern"], text)
        standalone = found and NUMBER.fullmatch((found.group(1) or "").strip())
        if not standalone:
            return Failure("parse", f"pattern {options['pattern']!r} found no number")
        return score_in_range(float(standalone.group(1)), "score", options)
    if options["marker"] is not None:
        at = text.lower().rfind(options["marker"].lower())
        if at == -1:
            return Failure("parse", f"no {options['marker']!r} in the answer")
        text = text[at + len(options["marker"]):]
    numbers = NUMBER.findall(DENOMINATOR.sub(" ", RANGE.sub(" ", text)))
    if not numbers:
        return Failure("parse", f"no score {scale_text(options)} found")
    chosen = numbers[-1] if options["pick"] == "last" else numbers[0]
    return score_in_range(float(chosen), "score", options)


# --- pair ---------------------------------------------------------------------------------------

_PAIR_LABEL = re.compile(
    r"(?:assistant|model|answer|response|AI)\s*#?\s*[12]\b\s*[:：]?|[12]\s*号\s*(?:AI)?\s*助手\s*[:：]?",
    re.IGNORECASE)


def parse_pair(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read the two scores on the first non-blank line ("8 7", "8, 7", "Assistant 1: 8 ...").

    Labels like "Assistant 1:" / "1号AI助手" and denominators ("/10") are dropped first; the line
    must then hold exactly two numbers, both in min..max.

    Args:
        options: merged options "min" and "max".

    Returns:
        Scores({"1": first, "2": second}), or Failure("parse") saying what was wrong.
    """
    first_line = next((line for line in (choice.text or "").splitlines() if line.strip()), "")
    line = DENOMINATOR.sub(" ", _PAIR_LABEL.sub(" ", first_line))
    numbers = [float(n) for n in NUMBER.findall(line)]
    if len(numbers) != 2:
        return Failure("parse", f"first line should hold two scores, found {len(numbers)}")
    if not all(in_range(n, options) for n in numbers):
        return Failure("parse", f"scores {numbers[0]:g} {numbers[1]:g} not in "
                       f"{scale_text(options)}")
    return Scores({"1": numbers[0], "2": numbers[1]})


# --- logprob ------------------------------------------------------------------------------------

def _token_text(entry: Any) -> str | None:
    """The stripped "token" of one logprobs entry; None when the entry has no text token."""
    token = entry.get("token") if isinstance(entry, Mapping) else None
    return token.strip() if isinstance(token, str) else None


def parse_logprob(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Expected score from the token distribution where the judge wrote its score.

    The position is the first (or, with position="last", the last) token whose sampled text,
    stripped, is an integer in min..max; its `top_logprobs` entries that are such integers are
    turned into probabilities, renormalised over those integers, and averaged. An answer with no
    score token is a failure even if some alternative token was a digit.

    Args:
        choice: the answer, with `logprobs` (requested with logprobs=true, top_logprobs=N).
        options: merged options "min", "max" and "position".

    Returns:
        Scores({"score": expected score}), or Failure("parse") naming what was missing.
    """
    if not choice.logprobs:
        return Failure("parse", "response has no logprobs; request logprobs=true, top_logprobs=N")
    allowed = {str(s): s for s in range(math.ceil(options["min"]), math.floor(options["max"]) + 1)}
    positions = [entry for entry in choice.logprobs if _token_text(entry) in allowed]
    if not positions:
        return Failure("parse", f"no score token {scale_text(options)} in the response")
    tops = positions[0 if options["position"] == "first" else -1].get("top_logprobs")
    mass: dict[int, float] = {}
    for top in tops if isinstance(tops, Sequence) else ():
        logprob = top.get("logprob") if isinstance(top, Mapping) else None
        if _token_text(top) in allowed and isinstance(logprob, (int, float)) and logprob <= 0:
            score = allowed[str(_token_text(top))]
            mass[score] = mass.get(score, 0.0) + math.exp(logprob)
    total = math.fsum(mass.values())
    if not total > 0:
        return Failure("parse", "no top_logprobs at the score token; request top_logprobs=N")
    return Scores({"score": math.fsum(s * p for s, p in mass.items()) / total})
