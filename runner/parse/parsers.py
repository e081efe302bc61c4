"""The parser registry: every parser by name, its options checked, its keys held to the rule
of `aspect_key` when the job file is read (`check_aspect`).

Pure and versioned: no I/O. Each `Parser` maps one `Choice` to `Scores` or a `Failure`
(runner.parse.base). Bump a parser's `version` whenever its behaviour changes; reports record
it. A new parser is a function of (Choice, options) in a module of runner.parse and one line in
`PARSERS` (with a line in `_OPTION_CHECKS` for an option name no parser had); nothing outside
this package changes.

Refusals: a parser first tries to read a score. Only when that fails and the answer contains a
refusal phrase ("I'm sorry, but I cannot", "As an AI language model", "I can't evaluate",
"抱歉", "我无法", "죄송합니다", "평가할 수 없습니다", ...) is the result `Failure("refusal")`
instead of `Failure("parse")`: a polite apology followed by a score is a score.

The parsers themselves are in runner.parse.ratings (stars, number, pair, logprob) and
runner.parse.forms (form, outputs, json); what they take and return, in runner.parse.base, is
importable from here too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from runner.errors import ConfigError
from runner.parse.base import Choice, Failure, Scores, aspect_key
from runner.parse.forms import parse_form, parse_json, parse_outputs
from runner.parse.ratings import parse_logprob, parse_number, parse_pair, parse_stars

__all__ = ["PARSERS", "Choice", "Combined", "Failure", "Parser", "Scores", "aspect_key",
           "check_aspect", "check_options", "combine", "get_parser"]

_ParseFunction = Callable[[Choice, Mapping[str, Any]], Scores | Failure]


@dataclass(frozen=True, slots=True)
class Parser:
    """A named, versioned parser with its options and their defaults."""

    name: str  # the name a job file gives (`parser = "stars"`)
    version: str  # recorded in reports; bumped whenever the parser's behaviour changes
    options: Mapping[str, Any]  # option name -> default; other names are a ConfigError
    func: _ParseFunction  # called with the merged options

    def __call__(self, choice: Choice, options: Mapping[str, Any] | None = None
                 ) -> Scores | Failure:
        """Parse one choice with the defaults overridden by `options` (checked first).

        Args:
            options: options overriding the defaults; None for the defaults.

        Returns:
            The answer's Scores, or a Failure ("parse" or "refusal").

        Raises:
            ConfigError: an option is unknown or invalid (see `check_options`).
        """
        check_options(self, options or {})
        return self.func(choice, {**self.options, **(options or {})})


@dataclass(frozen=True, slots=True)
class Combined:
    """Several samples (n > 1 choices) of one task. The three counts are disjoint and add up
    to the number of samples."""

    values: Mapping[str, float]  # key -> mean over the samples that have the key
    n_parsed: int  # samples that gave Scores
    n_failed: int  # parse failures, refusals not included
    n_refused: int
    failure: Failure | None  # the first when no sample parsed (none: a parse failure), else None


# --- refusals -----------------------------------------------------------------------------------

_REFUSAL = re.compile(
    r"\bI(?:'m| am|’m) (?:sorry|unable to|not able to)\b|\bI apologi[sz]e\b"
    r"|\bI (?:cannot|can ?not|can't|can’t|won't|will not)\b|\bAs an AI\b"
    r"|抱歉|对不起|我无法|我不能|作为一个?(?:AI|人工智能)|죄송|할 수 없|AI 언어 모델로서",
    re.IGNORECASE)


def _refusing(parse: _ParseFunction) -> _ParseFunction:
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


# --- registry and options -----------------------------------------------------------------------

# Each option name's check and what a valid value is, for the message. Every option of every
# parser has an entry: `check_options` reads it for each default as well as each given value.
def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_one_group_regex(value: Any) -> bool:
    try:
        return value is None or (isinstance(value, str) and re.compile(value).groups == 1)
    except re.error:
        return False


def _is_text_table(value: Any, number_values: bool) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and k.strip() and (_is_number(v) if number_values else
                                               isinstance(v, str) and v)
        for k, v in value.items())


_OPTION_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "min": (_is_number, "a number"),
    "max": (_is_number, "a number"),
    "levels": (lambda v: _is_text_table(v, True), "a table of level description -> star count"),
    "pattern": (_is_one_group_regex, "a regular expression with exactly one group"),
    "fields": (lambda v: bool(v) and _is_text_table(v, False),
               "a non-empty table of label -> key"),
    "na_value": (lambda v: v is None or _is_number(v), "a number"),
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
_PARSER_OPTION_CHECKS: dict[tuple[str, str], tuple[Callable[[Any], bool], str]] = {
    ("json", "fields"): (lambda v: _is_text_table(v, False),
                         'a table of aspect -> JSON key, e.g. {coherence = "coherence_score"}'),
}


def _parser(name: str, func: _ParseFunction, **options: Any) -> Parser:
    return Parser(name, "1", MappingProxyType(options), _refusing(func))


_NO_TABLE: Mapping[str, Any] = MappingProxyType({})  # the default of a table option: none
PARSERS: Mapping[str, Parser] = MappingProxyType({p.name: p for p in [
    _parser("stars", parse_stars, min=1, max=5, levels=_NO_TABLE),
    _parser("number", parse_number, min=1, max=5, pattern=None, pick="first", marker=None),
    _parser("form", parse_form, fields=_NO_TABLE, min=1, max=5, na_value=None, required=True),
    _parser("outputs", parse_outputs, count=0, min=0, max=100, required=True, label="Score"),
    _parser("pair", parse_pair, min=1, max=10),
    _parser("logprob", parse_logprob, min=1, max=5, position="first"),
    _parser("json", parse_json, fields=_NO_TABLE, min=1, max=5, required=True),
]})


def get_parser(name: str) -> Parser:
    """The parser a job file names.

    Args:
        name: the parser's name (`parser = "stars"`).

    Returns:
        The registered Parser.

    Raises:
        ConfigError: no parser has that name; the message lists the known names.
    """
    if name not in PARSERS:
        raise ConfigError(f"unknown parser {name!r}; known parsers: {', '.join(sorted(PARSERS))}")
    return PARSERS[name]


def check_options(parser: Parser, options: Mapping[str, Any]) -> None:
    """Check options against the parser's option names and each option's check.

    Args:
        parser: the parser the options are for.
        options: the options a job gives (without the defaults).

    Raises:
        ConfigError: naming the first unknown or invalid option (a default counts too), or
            min not below max.
    """
    for key in options:
        if key not in parser.options:
            raise ConfigError(f"parser {parser.name!r}: unknown option {key!r}; "
                              f"valid options: {', '.join(sorted(parser.options))}")
    merged = {**parser.options, **options}
    for key, value in merged.items():
        valid, expected = _PARSER_OPTION_CHECKS.get((parser.name, key),
                                                    _OPTION_CHECKS[key])
        if not valid(value):
            got = f"got {value!r}" if key in options else "it has no default"
            raise ConfigError(f"parser {parser.name!r}: option {key!r} must be {expected} "
                              f"({got})")
    if not merged["min"] < merged["max"]:
        raise ConfigError(f"parser {parser.name!r}: option 'min' must be below 'max' "
                          f"(got min={merged['min']!r}, max={merged['max']!r})")


def check_aspect(parser: Parser, options: Mapping[str, Any], aspect: str,
                 aspects: Sequence[str]) -> None:
    """Hold the keys a job's options give a parser to the rule of `aspect_key`.

    A `form` field table with no key for the aspect (nor "score"), or a `json` field table
    naming an aspect the prompt does not have, breaks it. Parsers whose keys are not set by
    options pass.

    Args:
        parser: the parser the aspect is scored with.
        options: its options for `aspect`: the prompt's, overridden by the aspect's (no
            defaults).
        aspects: every aspect of the prompt.

    Raises:
        ConfigError: naming the aspect (or the field) and the key to use.
    """
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
    """Average the samples of one task.

    Args:
        results: the parse result of each sample (choice) of the task, in order.

    Returns:
        Per key the mean over the samples with that key, and the counts; see `Combined`.
    """
    sums: dict[str, list[float]] = {}
    failures = [r for r in results if isinstance(r, Failure)]
    for result in results:
        if isinstance(result, Scores):
            for key, value in result.values.items():
                sums.setdefault(key, []).append(value)
    n_parsed = len(results) - len(failures)
    n_refused = sum(f.type == "refusal" for f in failures)
    failure = None if n_parsed else next(iter(failures),
                                         Failure("parse", "no samples to combine"))
    return Combined({k: math.fsum(v) / len(v) for k, v in sums.items()}, n_parsed,
                    len(failures) - n_refused, n_refused, failure)
