"""Turn judge answers (chat-completion choices) into scores.

Pure and versioned: no I/O. Each `Parser` maps one `Choice` to `Scores` or a `Failure`, never
raises on any text and never turns an answer it cannot read into a number. Bump a parser's
`version` whenever its behaviour changes; reports record it.

Refusals: a parser first tries to read a score. Only when that fails and the answer contains a
refusal phrase ("I'm sorry, but I cannot", "As an AI language model", "I can't evaluate",
"抱歉", "我无法", "죄송합니다", "평가할 수 없습니다", ...) is the result `Failure("refusal")`
instead of `Failure("parse")`: a polite apology followed by a score is a score.

Numbers: a number is ASCII digits with an optional decimal part ("4", "4.5"), not glued to
letters ("GPT-4", "3rd" are not scores). A leading "-" is a bullet, never a sign.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from runner.errors import ConfigError
from runner.parse.structured import find_object, lookup, number

__all__ = ["PARSERS", "Choice", "Combined", "Failure", "Parser", "Scores", "aspect_key",
           "check_aspect", "check_options", "combine", "get_parser"]


@dataclass(frozen=True, slots=True)
class Choice:
    """One choice of a chat-completion response."""

    text: str  # choices[i].message.content, "" when null
    logprobs: Sequence[Mapping[str, Any]] | None = None  # choices[i].logprobs.content, raw dicts
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Scores:
    """What one answer said: {"score": x}, {field key: x}, {"1": x, "2": y, ...}."""

    values: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class Failure:
    """Why an answer gave no score: type "parse" or "refusal", and a one-line message."""

    type: str
    message: str


@dataclass(frozen=True, slots=True)
class Parser:
    """A named, versioned parser with its options and their defaults."""

    name: str
    version: str
    options: Mapping[str, Any]  # option name -> default; other names are a ConfigError
    func: Callable[[Choice, Mapping[str, Any]], Scores | Failure]

    def __call__(self, choice: Choice, options: Mapping[str, Any] | None = None
                 ) -> Scores | Failure:
        """Parse one choice with the defaults overridden by `options` (checked first)."""
        check_options(self, options or {})
        return self.func(choice, {**self.options, **(options or {})})


@dataclass(frozen=True, slots=True)
class Combined:
    """Several samples (n > 1 choices) of one task.

    `values` holds, per key, the mean over the samples that have the key. The three counts are
    disjoint and add up to the number of samples. `failure` is the first failure when no sample
    parsed (or a parse failure when there were no samples), else None.
    """

    values: Mapping[str, float]
    n_parsed: int
    n_failed: int  # parse failures, refusals not included
    n_refused: int
    failure: Failure | None


# --- shared pieces ------------------------------------------------------------------------------

_N = r"\d++(?:\.\d++)?+"  # possessive: no backtracking into long digit runs
# A standalone number: not part of a word, a version ("GPT-4") or a longer number.
_NUMBER = re.compile(rf"(?<![A-Za-z0-9_.])(?<![A-Za-z]-)({_N})(?!\d|\.\d|[A-Za-z_])")
# An echoed scale, "(1-5)" or "1 to 5"; never a score.
_RANGE = re.compile(rf"\(?(?<![\d.]){_N}\s*(?:-|–|—|~|to)\s*{_N}\)?", re.IGNORECASE)
_DENOMINATOR = re.compile(rf"(?:/|\bout\s+of)\s*{_N}", re.IGNORECASE)  # the "/5" of "4/5"
_REFUSAL = re.compile(
    r"\bI(?:'m| am|’m) (?:sorry|unable to|not able to)\b|\bI apologi[sz]e\b"
    r"|\bI (?:cannot|can ?not|can't|can’t|won't|will not)\b|\bAs an AI\b"
    r"|抱歉|对不起|我无法|我不能|作为一个?(?:AI|人工智能)|죄송|할 수 없|AI 언어 모델로서",
    re.IGNORECASE)


def _refusing(parse: Callable[[Choice, Mapping[str, Any]], Scores | Failure]
              ) -> Callable[[Choice, Mapping[str, Any]], Scores | Failure]:
    """Wrap a parser: an unreadable answer with a refusal phrase (or filtered) is a refusal."""

    def parse_or_refuse(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
        result = parse(choice, options)
        if not isinstance(result, Failure) or result.type != "parse":
            return result
        found = _REFUSAL.search(choice.text or "")
        if found:
            start = max(0, found.start() - 20)
            snippet = " ".join(choice.text[start:found.start() + 80].split())
            return Failure("refusal", f"judge declined ({result.message}): {snippet!r}")
        if choice.finish_reason in ("content_filter", "length"):
            kind = "refusal" if choice.finish_reason == "content_filter" else "parse"
            return Failure(kind, f"{result.message} (finish_reason={choice.finish_reason})")
        return result

    return parse_or_refuse


def _in_range(value: float, options: Mapping[str, Any]) -> bool:
    return bool(options["min"] <= value <= options["max"])


def _scale(options: Mapping[str, Any]) -> str:
    return f"{options['min']:g}-{options['max']:g}"


def _score(value: float, what: str, options: Mapping[str, Any]) -> Scores | Failure:
    if _in_range(value, options):
        return Scores({"score": float(value)})
    return Failure("parse", f"{what} {value:g} is outside {_scale(options)}")


# --- stars --------------------------------------------------------------------------------------

_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten".split())}
_VALUE = rf"(?P<v>{_N}|{'|'.join(_WORDS)})(?P<half>\s+and\s+a\s+half)?"
_STAR_COUNT = re.compile(
    rf"(?<![\w.]){_VALUE}[\s-]*stars?\b"
    r"(?!\s*(?:means?\b|meaning|indicates?|represents?|signif|stands?\b|is for|are for|=))",
    re.IGNORECASE)
_STAR_LABEL = re.compile(rf"\b(?:stars?|rating|score)\s*[:：=]\s*\**\s*{_VALUE}\b", re.IGNORECASE)
_STAR_FRACTION = re.compile(
    rf"(?<![\w./]){_VALUE}\s*(?:/|out\s+of)\s*(?:{_N}|five|ten)\b", re.IGNORECASE)
_STAR_SYMBOLS = re.compile("[★⭐🌟](?:[\\s\ufe0f]*[★⭐🌟])*")
# Text just before "N stars" that makes N the end of a range or a denominator ("1-5 stars").
_RANGE_BEFORE = re.compile(
    rf"(?:(?:\d|\b(?:{'|'.join(_WORDS)}))\s*[-–~]|/|\bto|\band|\bout\s+of)\s*$", re.IGNORECASE)
_BARE = re.compile(rf"[\s*_`\"'.!]*{_VALUE}[\s*_`\"'.!]*", re.IGNORECASE)


def _value(match: re.Match[str]) -> float:
    word = match.group("v").lower()
    value = float(_WORDS[word]) if word in _WORDS else float(word)
    return value + 0.5 if match.group("half") else value


def _star_candidates(text: str) -> list[tuple[int, float]]:
    """(position, stars) for every explicit star rating in the text."""
    found = [(m.start(), _value(m)) for m in _STAR_COUNT.finditer(text)
             if not _RANGE_BEFORE.search(text, max(0, m.start() - 12), m.start())]
    found += [(m.start(), _value(m)) for m in _STAR_LABEL.finditer(text)]
    found += [(m.start(), _value(m)) for m in _STAR_FRACTION.finditer(text)]
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


def _parse_stars(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read a star rating.

    The earliest explicit rating wins: "4 stars"/"four-star"/"4.5 stars"/"four and a half
    stars", "Stars: 4" (also "Rating:"/"Score:"), "4/5" or "4 out of 5", or a run of "★"/"⭐"
    ("☆" are empty stars and not counted). "N star(s)" is not a rating when it is defined
    ("one star means ...", "5 stars = ..."), ends a range ("one to five stars", "1-5 stars") or is
    a denominator ("out of five stars"). Failing those, a first line that is only a number or
    number word ("4", "Four."). Failing that, the `levels` descriptions (see `_star_level`);
    several different levels present is a failure. A rating outside min..max is a failure.
    """
    text = choice.text or ""
    candidates = _star_candidates(text)
    if candidates:
        return _score(min(candidates)[1], "star rating", options)
    first_line = next((line for line in text.splitlines() if line.strip()), "")
    bare = _BARE.fullmatch(first_line)
    if bare:
        return _score(_value(bare), "star rating", options)
    level = _star_level(text, options["levels"])
    return level or Failure("parse", f"no star rating {_scale(options)} found")


# --- number -------------------------------------------------------------------------------------

def _parse_number(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read one number (G-Eval "scores ONLY" answers: "4", "- 4", "Coherence: 4", "4/5").

    With `pattern`, its first match's group is the score. Otherwise a standalone number,
    skipping echoed ranges ("(1-5)", "1 to 5") and denominators ("/5", "out of 5"): the first
    one, or with `pick = "last"` the last one (a chain-of-thought answer ends with its score).
    With `marker` (e.g. "Score:", matched without regard to case), only the text after the
    marker's last occurrence is read, and an answer without the marker is a failure. The number
    must lie in min..max; a chosen number outside it is a failure, not a reason to look further.
    """
    text = choice.text or ""
    if options["pattern"] is not None:
        found = re.search(options["pattern"], text)
        number_ = found and _NUMBER.fullmatch((found.group(1) or "").strip())
        if not number_:
            return Failure("parse", f"pattern {options['pattern']!r} found no number")
        return _score(float(number_.group(1)), "score", options)
    if options["marker"] is not None:
        at = text.lower().rfind(options["marker"].lower())
        if at == -1:
            return Failure("parse", f"no {options['marker']!r} in the answer")
        text = text[at + len(options["marker"]):]
    numbers = _NUMBER.findall(_DENOMINATOR.sub(" ", _RANGE.sub(" ", text)))
    if not numbers:
        return Failure("parse", f"no score {_scale(options)} found")
    chosen = numbers[-1] if options["pick"] == "last" else numbers[0]
    return _score(float(chosen), "score", options)


# --- json ---------------------------------------------------------------------------------------

def aspect_key(aspect: str) -> str:
    """How an aspect name appears among a parser's values: "Overall Quality" -> overall_quality.

    The rule every parser keeps: an answer's score for an aspect is its value "score", else
    its value under `aspect_key(aspect)`. `check_aspect` holds a job's parser options to it, so a
    misnamed key is a job-file error naming the aspect, not a score missing from every task.
    """
    return "_".join(aspect.lower().replace("-", " ").split())


def _parse_json(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read a JSON object ({"coherence": 4, "reasoning": "..."}), bare, in a ```json block,
    with text around it, or continuing a prefilled "{".

    With `fields` (aspect -> key in the object, or a dotted path "scores.coherence"), each
    aspect's score is that key's value under `aspect_key(aspect)`; with `required`, a missing,
    non-numeric or out-of-range field fails the answer, otherwise it is left out. Without
    `fields`, every numeric top-level value is kept under `aspect_key` of its key ("score" stays
    "score"), so an aspect's score is the key named like the aspect. Numbers may be written as
    strings ("4", "4/5"); booleans are not numbers.
    """
    obj = find_object(choice.text or "")
    if obj is None:
        return Failure("parse", "no JSON object found")
    if not options["fields"]:
        values = {aspect_key(k): v for k, raw in obj.items()
                  if (v := number(raw)) is not None and _in_range(v, options)}
        if values:
            return Scores(values)
        return Failure("parse", f"no numeric field {_scale(options)} in the JSON object "
                       f"(keys: {', '.join(map(str, obj)) or 'none'})")
    values, problems = {}, []
    for aspect, path in options["fields"].items():
        value = number(lookup(obj, path))
        if value is None:
            problems.append(f"{path} missing or not a number")
        elif not _in_range(value, options):
            problems.append(f"{path} {value:g} outside {_scale(options)}")
        else:
            values[aspect_key(aspect)] = value
    if (problems and options["required"]) or not values:
        return Failure("parse", "; ".join(problems))
    return Scores(values)


# --- form ---------------------------------------------------------------------------------------

_SEGMENTS = re.compile(r"[\n;]|,\s")
_PAREN_SCORE = re.compile(
    rf"\s*(?:(?P<na>n/?a)|(?P<num>{_N})(?:\s*(?P<sep>/|out of|-|–)\s*(?P<of>{_N}))?)\s*",
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
        rf"(?:(?P<na>n/?a\b)|(?P<num>{_N})(?!\d|\.\d|[A-Za-z]))?",
        re.IGNORECASE)


def _form_value(match: re.Match[str], options: Mapping[str, Any]) -> tuple[str, bool] | None:
    """(value, written as "(x-max)") of a labelled segment, or None when it holds no value.

    The value is a number, "na", or "range" for a bare "(min-max)": that is the echoed label,
    unless the answer writes its scores as "(x-max)" elsewhere (see `_parse_form`).
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


def _parse_form(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read several labelled scores ("- Fluency (1-5): 4", "**Accuracy**: 3", "Coherence - 5").

    A label counts at the start of a line or after ";" or ", ", behind bullets, numbering or
    markdown; several labels may share a key (synonyms). For each key the first segment with a
    value wins: a number after the separator, else a score written into the parentheses:
    "(4)", "(4/5)", or "(4-5)" ("(x-max)", x > min). A bare "(1-5)" ("(min-max)") is the echoed
    label and no value, unless another field of the same answer used "(x-max)": then it means
    min. "N/A" becomes `na_value` when set. With `required`, any missing, N/A or out-of-range
    key fails the answer; otherwise such keys are left out.
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
        elif value != "na" and not _in_range(float(value), options):
            problems.append(f"{label} {float(value):g} outside {_scale(options)}")
        else:
            values[key] = float(options["na_value"] if value == "na" else value)
    if (problems and options["required"]) or not values:
        return Failure("parse", "; ".join(problems))
    return Scores(values)


# --- outputs ------------------------------------------------------------------------------------

_OUTPUT_HEADER = re.compile(r"^[ \t>#*_-]*output\s*#?\s*(\d+)\b", re.IGNORECASE | re.MULTILINE)


def _parse_outputs(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read "Output 3 ... Score: 85 ... Explanation: ..." blocks (Lai et al. 2023).

    A block starts at a line beginning "Output N" and runs to the next one; its first
    "<label>: <number>" ("Score" by default) is output N's score. Outputs outside 1..count are
    ignored, and the first block with a score wins. With `required`, a missing or out-of-range
    output fails the answer; otherwise it is left out.
    """
    text = choice.text or ""
    score = re.compile(rf"\b{re.escape(options['label'])}\s*[:：=]?[\s*_]*({_N})(?!\d|\.\d)",
                       re.IGNORECASE)
    headers = list(_OUTPUT_HEADER.finditer(text))
    values: dict[str, float] = {}
    bad: list[str] = []
    ends = [h.start() for h in headers[1:]] + [len(text)]
    for header, end in zip(headers, ends, strict=False):  # no header: no block
        number = int(header.group(1))
        found = score.search(text, header.end(), end)
        if not found or not 1 <= number <= options["count"] or str(number) in values:
            continue
        if _in_range(float(found.group(1)), options):
            values[str(number)] = float(found.group(1))
        else:
            bad.append(f"{number} ({found.group(1)})")
    missing = [str(n) for n in range(1, options["count"] + 1) if str(n) not in values]
    if (missing and options["required"]) or not values:
        message = f"no score for output {', '.join(missing)}" if missing else ""
        if bad:
            message += f"; outside {_scale(options)}: {', '.join(bad)}"
        return Failure("parse", message.lstrip("; "))
    return Scores(values)


# --- pair ---------------------------------------------------------------------------------------

_PAIR_LABEL = re.compile(
    r"(?:assistant|model|answer|response|AI)\s*#?\s*[12]\b\s*[:：]?|[12]\s*号\s*(?:AI)?\s*助手\s*[:：]?",
    re.IGNORECASE)


def _parse_pair(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Read the two scores on the first non-blank line ("8 7", "8, 7", "Assistant 1: 8 ...").

    Labels like "Assistant 1:" / "1号AI助手" and denominators ("/10") are dropped first; the line
    must then hold exactly two numbers, both in min..max.
    """
    first_line = next((line for line in (choice.text or "").splitlines() if line.strip()), "")
    line = _DENOMINATOR.sub(" ", _PAIR_LABEL.sub(" ", first_line))
    numbers = [float(n) for n in _NUMBER.findall(line)]
    if len(numbers) != 2:
        return Failure("parse", f"first line should hold two scores, found {len(numbers)}")
    if not all(_in_range(n, options) for n in numbers):
        return Failure("parse", f"scores {numbers[0]:g} {numbers[1]:g} not in {_scale(options)}")
    return Scores({"1": numbers[0], "2": numbers[1]})


# --- logprob ------------------------------------------------------------------------------------

def _token(entry: Any) -> str | None:
    token = entry.get("token") if isinstance(entry, Mapping) else None
    return token.strip() if isinstance(token, str) else None


def _parse_logprob(choice: Choice, options: Mapping[str, Any]) -> Scores | Failure:
    """Expected score from the token distribution where the judge wrote its score.

    The position is the first (or, with position="last", the last) token whose sampled text,
    stripped, is an integer in min..max; its `top_logprobs` entries that are such integers are
    turned into probabilities, renormalised over those integers, and averaged. An answer with no
    score token is a failure even if some alternative token was a digit.
    """
    if not choice.logprobs:
        return Failure("parse", "response has no logprobs; request logprobs=true, top_logprobs=N")
    allowed = {str(s): s for s in range(math.ceil(options["min"]), math.floor(options["max"]) + 1)}
    positions = [entry for entry in choice.logprobs if _token(entry) in allowed]
    if not positions:
        return Failure("parse", f"no score token {_scale(options)} in the response")
    tops = positions[0 if options["position"] == "first" else -1].get("top_logprobs")
    mass: dict[int, float] = {}
    for top in tops if isinstance(tops, Sequence) else ():
        logprob = top.get("logprob") if isinstance(top, Mapping) else None
        if _token(top) in allowed and isinstance(logprob, (int, float)) and logprob <= 0:
            score = allowed[str(_token(top))]
            mass[score] = mass.get(score, 0.0) + math.exp(logprob)
    total = math.fsum(mass.values())
    if not total > 0:
        return Failure("parse", "no top_logprobs at the score token; request top_logprobs=N")
    return Scores({"score": math.fsum(s * p for s, p in mass.items()) / total})


# --- registry and options -----------------------------------------------------------------------

def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _pattern(value: Any) -> bool:
    try:
        return value is None or (isinstance(value, str) and re.compile(value).groups == 1)
    except re.error:
        return False


def _text_map(value: Any, number_values: bool) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and k.strip() and (_number(v) if number_values else
                                               isinstance(v, str) and v)
        for k, v in value.items())


_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "min": (_number, "a number"),
    "max": (_number, "a number"),
    "levels": (lambda v: _text_map(v, True), "a table of level description -> star count"),
    "pattern": (_pattern, "a regular expression with exactly one group"),
    "fields": (lambda v: bool(v) and _text_map(v, False), "a non-empty table of label -> key"),
    "na_value": (lambda v: v is None or _number(v), "a number"),
    "required": (lambda v: isinstance(v, bool), "true or false"),
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
              "a positive integer"),
    "label": (lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty string"),
    "position": (lambda v: v in ("first", "last"), '"first" or "last"'),
    "pick": (lambda v: v in ("first", "last"), '"first" or "last"'),
    "marker": (lambda v: v is None or (isinstance(v, str) and bool(v.strip())),
               'a non-empty string such as "Score:"'),
}
# Where one parser's option means something else than the same name's elsewhere.
_PARSER_CHECKS: dict[tuple[str, str], tuple[Callable[[Any], bool], str]] = {
    ("json", "fields"): (lambda v: _text_map(v, False),
                         'a table of aspect -> JSON key, e.g. {coherence = "coherence_score"}'),
}


def _parser(name: str, func: Callable[[Choice, Mapping[str, Any]], Scores | Failure],
            **options: Any) -> Parser:
    return Parser(name, "1", MappingProxyType(options), _refusing(func))


_EMPTY: Mapping[str, Any] = MappingProxyType({})
PARSERS: Mapping[str, Parser] = MappingProxyType({p.name: p for p in [
    _parser("stars", _parse_stars, min=1, max=5, levels=_EMPTY),
    _parser("number", _parse_number, min=1, max=5, pattern=None, pick="first", marker=None),
    _parser("form", _parse_form, fields=_EMPTY, min=1, max=5, na_value=None, required=True),
    _parser("outputs", _parse_outputs, count=0, min=0, max=100, required=True, label="Score"),
    _parser("pair", _parse_pair, min=1, max=10),
    _parser("logprob", _parse_logprob, min=1, max=5, position="first"),
    _parser("json", _parse_json, fields=_EMPTY, min=1, max=5, required=True),
]})


def get_parser(name: str) -> Parser:
    """The parser called `name`; ConfigError listing the known names otherwise."""
    if name not in PARSERS:
        raise ConfigError(f"unknown parser {name!r}; known parsers: {', '.join(sorted(PARSERS))}")
    return PARSERS[name]


def check_options(parser: Parser, options: Mapping[str, Any]) -> None:
    """Raise ConfigError naming the first unknown or invalid option of `parser`."""
    for key in options:
        if key not in parser.options:
            raise ConfigError(f"parser {parser.name!r}: unknown option {key!r}; "
                              f"valid options: {', '.join(sorted(parser.options))}")
    merged = {**parser.options, **options}
    for key, value in merged.items():
        valid, expected = _PARSER_CHECKS.get((parser.name, key), _CHECKS[key])
        if not valid(value):
            got = f"got {value!r}" if key in options else "it has no default"
            raise ConfigError(f"parser {parser.name!r}: option {key!r} must be {expected} "
                              f"({got})")
    if not merged["min"] < merged["max"]:
        raise ConfigError(f"parser {parser.name!r}: option 'min' must be below 'max' "
                          f"(got min={merged['min']!r}, max={merged['max']!r})")


def check_aspect(parser: Parser, options: Mapping[str, Any], aspect: str,
                 aspects: Sequence[str]) -> None:
    """Raise ConfigError where `options` (merged for `aspect`) break the rule of `aspect_key`:
    a `form` field table with no key for the aspect (nor "score"), or a `json` field table
    naming an aspect the prompt does not have. Parsers whose keys are not set by options
    pass."""
    fields = options.get("fields") or {}
    if parser.name == "form" and fields and not {"score", aspect, aspect_key(aspect)} & set(
            fields.values()):
        raise ConfigError(f"parser 'form': no field gives aspect {aspect!r} a score; map a "
                          f"label to the key {aspect_key(aspect)!r} (keys now: "
                          f"{', '.join(sorted(set(fields.values())))})")
    if parser.name == "json":
        known = {aspect_key(a) for a in aspects}
        for name in fields:
            if aspect_key(name) not in known:
                raise ConfigError(f"parser 'json': fields names {name!r}, which is not an "
                                  f"aspect of the prompt ({', '.join(aspects)}); key each "
                                  "field by its aspect")


def combine(results: Sequence[Scores | Failure]) -> Combined:
    """Average the samples of one task; see `Combined`."""
    sums: dict[str, list[float]] = {}
    failures = [r for r in results if isinstance(r, Failure)]
    for result in results:
        if isinstance(result, Scores):
            for key, value in result.values.items():
                sums.setdefault(key, []).append(value)
    n_parsed = len(results) - len(failures)
    n_refused = sum(f.type == "refusal" for f in failures)
    failure = None
    if not n_parsed:
        failure = failures[0] if failures else Failure("parse", "no samples to combine")
    return Combined({k: math.fsum(v) / len(v) for k, v in sums.items()}, n_parsed,
                    len(failures) - n_refused, n_refused, failure)
