"""Tests for runner.parse.parsers: example tables per parser, recorded judge answers, properties."""

from __future__ import annotations

import dataclasses
import math
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runner.errors import ConfigError
from runner.parse.parsers import (
    PARSERS,
    Choice,
    Combined,
    Failure,
    Scores,
    aspect_key,
    check_options,
    combine,
    get_parser,
)

KOREAN = Path("/work/shared/datasets/korean_chat_eval/lm-evaluation-by-openai_4cc6bd0")
KOREAN_FIELDS = {"Fluency": "fluency", "Coherence": "coherence", "Accuracy": "accuracy",
                 "Completeness": "completeness", "Overall Quality": "overall_quality"}
VALID_OPTIONS: dict[str, dict[str, Any]] = {
    "stars": {"levels": {"Nonsense": 1, "Perfect storyline and grammar": 5}},
    "number": {},
    "form": {"fields": KOREAN_FIELDS, "na_value": 1},
    "outputs": {"count": 3},
    "pair": {},
    "logprob": {},
    "json": {"fields": {"coherence": "scores.coherence"}, "required": False},
}


def run(name: str, text: str, **options: Any) -> Scores | Failure:
    return get_parser(name)(Choice(text), options)


def check(result: Scores | Failure, expected: Any) -> None:
    """`expected` is a float (one "score"), a dict of values, or (failure type, message part)."""
    if isinstance(expected, tuple):
        assert isinstance(result, Failure), result
        assert (result.type, expected[1] in result.message) == (expected[0], True), result
    else:
        assert isinstance(result, Scores), result
        want = {"score": expected} if isinstance(expected, (int, float)) else expected
        assert dict(result.values) == pytest.approx(want)


# --- stars --------------------------------------------------------------------------------------

LEVELS = {"Nonsense": 1,
          "The storyline has some connections with the beginning, but is not understandable": 2,
          "The storyline has some connections with the beginning and is understandable": 3,
          "Perfect storyline and grammar": 5}


@pytest.mark.parametrize(("text", "expected"), [
    ("4 stars", 4), ("Stars: 4", 4), ("4", 4), ("4.", 4), ("**3**", 3), ("4/5", 4),
    ("4 out of 5 stars", 4), ("4.5 stars", 4.5), ("Three stars.", 3), ("five", 5),
    ("four and a half stars", 4.5), ("I would give it a four-star rating.", 4),
    ("★★★★", 4), ("★★★☆☆", 3), ("⭐⭐⭐", 3), ("⭐️⭐️", 2), ("Stars: ★★★★★", 5),
    ("I'd rate this summary 3 stars out of 5.", 3),
    # echoed definitions, ranges and denominators are not ratings
    ('One star means "incoherence" and five stars means "perfect coherence". I give it four '
     "stars.", 4),
    ("On a scale of one to five stars, this gets 2 stars.", 2),
    ("Out of five stars: 3 stars.", 3),
    ("Between 1 and 5 stars, I choose 4 stars.", 4),
    ("1 star = poor, 5 stars = great. Rating: 2", 2),
    # the first rating wins
    ("2 stars. On reflection, maybe 3 stars.", 2),
    ("I'm sorry for the delay. 4 stars.", 4),
    ("4\n\nThe summary is coherent but misses one fact.", 4),
    # failures
    ("6 stars", ("parse", "outside 1-5")), ("zero stars", ("parse", "outside 1-5")),
    ("The summary is good.", ("parse", "no star rating 1-5")), ("", ("parse", "no star")),
    ("One of the issues is coherence.", ("parse", "no star rating")),
    ("I'm sorry, but I cannot rate this summary.", ("refusal", "cannot rate")),
    ("As an AI language model, I can't evaluate offensive text.", ("refusal", "As an AI")),
    ("抱歉，我无法评价这个摘要。", ("refusal", "抱歉")),
])
def test_stars(text: str, expected: Any) -> None:
    check(run("stars", text), expected)


@pytest.mark.parametrize(("text", "expected"), [
    ("nonsense.", 1), ("Perfect storyline and grammar!", 5),
    ("The storyline has some connections with the beginning and is understandable.", 3),
    ("The storyline has some connections with the beginning, but is not understandable", 2),
    ("It is not nonsense but the storyline is not perfect storyline and grammar",
     ("parse", "several level descriptions")),
    ("No level here", ("parse", "no star rating")),
    ("3 stars: the storyline has some connections with the beginning and is understandable", 3),
])
def test_stars_levels(text: str, expected: Any) -> None:
    check(run("stars", text, levels=LEVELS), expected)


def test_stars_levels_longest_first() -> None:
    levels = {"coherence": 3, "incoherence": 1, "perfect coherence": 5}
    check(run("stars", "Perfect coherence.", levels=levels), 5)
    check(run("stars", "Incoherence", levels=levels), 1)
    check(run("stars", "some coherence", levels=levels), 3)


def test_stars_scale_of_ten() -> None:
    check(run("stars", "8 stars", max=10), 8)
    check(run("stars", "ten stars", max=10), 10)


# --- number -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("4", 4), (" 4", 4), ("- 4", 4), ("-4", 4), ("Coherence: 4", 4), ("4/5", 4), ("3.5", 3.5),
    ("- Coherence (1-5): 3", 3), ("Score (1 to 5): 2", 2), ("5 out of 5", 5),
    ("语言组织：4分", 4), ("점수: 5점", 5), ("GPT-4 says 3", 3), ("**2**", 2),
    ("4\n\nExplanation: 2 errors", 4),
    ("7", ("parse", "7 is outside 1-5")), ("0", ("parse", "outside")),
    ("Coherence (1-5):", ("parse", "no score 1-5")), ("N/A", ("parse", "no score")),
    ("Sorry, I cannot score this.", ("refusal", "I cannot")),
    ("As an AI language model, I am unable to do that.", ("refusal", "As an AI")),
    ("죄송합니다. 평가할 수 없습니다.", ("refusal", "죄송")),
])
def test_number(text: str, expected: Any) -> None:
    check(run("number", text), expected)


def test_number_pattern() -> None:
    pattern = r"Final score:\s*(\S+)"
    check(run("number", "Step 1: read. Step 2: think.\nFinal score: 4", pattern=pattern), 4)
    check(run("number", "Final score: four", pattern=pattern), ("parse", "found no number"))
    check(run("number", "nothing", pattern=pattern), ("parse", "found no number"))
    check(run("number", "Final score: 9", pattern=pattern), ("parse", "outside"))
    check(run("number", "85", min=0, max=100), 85)


# --- form ---------------------------------------------------------------------------------------

F3 = {"Fluency": "fluency", "Coherence": "coherence", "Accuracy": "accuracy"}


@pytest.mark.parametrize(("text", "expected"), [
    ("- Fluency (1-5): 4\n- Coherence (1-5): 5\n- Accuracy (1-5): 3",
     {"fluency": 4, "coherence": 5, "accuracy": 3}),
    ("Fluency: 4\nCoherence: 5\nAccuracy: 3", {"fluency": 4, "coherence": 5, "accuracy": 3}),
    ("**Fluency**: 4\n**Coherence:** 5\n1. Accuracy - 3",
     {"fluency": 4, "coherence": 5, "accuracy": 3}),
    ("Fluency: 4, Coherence: 5; Accuracy: 3", {"fluency": 4, "coherence": 5, "accuracy": 3}),
    ("FLUENCY score: 4/5\ncoherence = 5\n| Accuracy | 2 |",
     {"fluency": 4, "coherence": 5, "accuracy": 2}),
    ("- Fluency (4): fine.\n- Coherence (5)\n- Accuracy (3/5): ok",
     {"fluency": 4, "coherence": 5, "accuracy": 3}),
    # the score written into the label: "(x-5)"; then "(1-5)" in the same answer is 1
    ("- Fluency (2-5): awkward.\n- Coherence (1-5): off-topic.\n- Accuracy (1-5): wrong.",
     {"fluency": 2, "coherence": 1, "accuracy": 1}),
    # echoed criteria before the answer do not hide the scores
    ("Evaluation Criteria:\n- Fluency (1-5): The quality of the language.\n- Coherence (1-5):"
     " consistent context.\n- Accuracy (1-5) - The correctness.\n\nEvaluation Form:\n"
     "- Fluency (1-5): 5\n- Coherence (1-5): 4\n- Accuracy (1-5): 2",
     {"fluency": 5, "coherence": 4, "accuracy": 2}),
    ("Fluency: 4\nCoherence: 5\nAccuracy: 3\nFluency: 1",
     {"fluency": 4, "coherence": 5, "accuracy": 3}),
    ("- Fluency (1-5):\n- Coherence (1-5):\n- Accuracy (1-5):", ("parse", "Fluency missing")),
    ("Fluency: 4\nCoherence: 5", ("parse", "Accuracy missing")),
    ("Fluency: 4\nCoherence: 7\nAccuracy: 3", ("parse", "Coherence 7 outside 1-5")),
    ("Fluency: 4\nCoherence: 5\nAccuracy: N/A", ("parse", "Accuracy is N/A")),
    ("Fluently: 4\nCoherent: 5\nAccurate: 3", ("parse", "Fluency missing")),
    ("I'm sorry, but I can't evaluate this response.", ("refusal", "can't evaluate")),
    ("죄송하지만 이 응답은 평가할 수 없습니다.", ("refusal", "죄송")),
])
def test_form(text: str, expected: Any) -> None:
    check(run("form", text, fields=F3), expected)


def test_form_options() -> None:
    text = "Fluency: 4\nAccuracy: N/A"
    check(run("form", text, fields=F3, na_value=1), ("parse", "Coherence missing"))
    check(run("form", text, fields=F3, na_value=1, required=False),
          {"fluency": 4, "accuracy": 1})
    check(run("form", text, fields=F3, required=False), {"fluency": 4})
    check(run("form", "nothing", fields=F3, required=False), ("parse", "Fluency missing"))
    fields = {"Overall Quality": "overall", "Overall": "overall", "Quality": "quality"}
    check(run("form", "Quality: 2\nOverall Quality: 4", fields=fields),
          {"overall": 4, "quality": 2})
    check(run("form", "Overall: 3\nQuality: 2", fields=fields), {"overall": 3, "quality": 2})
    check(run("form", "Content: 80\nStyle: 65.5\nFluency: 100", min=0, max=100,
              fields={"Content": "content", "Style": "style", "Fluency": "fluency"}),
          {"content": 80, "style": 65.5, "fluency": 100})
    check(run("form", "语言组织：4\n切题(1-5)：5", fields={"语言组织": "lo", "切题": "rel"}),
          {"lo": 4, "rel": 5})


def test_form_bare_range_is_min_only_after_a_dashed_score() -> None:
    """Only "(x-max)" elsewhere makes a bare "(1-5)" mean min: a score after the label, in
    "(4)", "(4/5)" or "(N/A)" does not."""
    for text in ("Fluency: 4\nCoherence (1-5): fine\nAccuracy: 3",
                 "Fluency (4)\nCoherence (1-5): fine\nAccuracy (3/5)",
                 "Fluency (N/A)\nCoherence (1-5): fine\nAccuracy: 3"):
        check(run("form", text, fields=F3, na_value=4), ("parse", "Coherence missing"))
    check(run("form", "Fluency (4-5)\nCoherence (1-5): fine\nAccuracy: 3", fields=F3),
          {"fluency": 4, "coherence": 1, "accuracy": 3})


def test_an_en_dash_range_is_a_range_like_a_hyphen() -> None:
    """"(1–5)" with an en dash (as word processors and many models write it) is the echoed
    scale, never a score, and "(4–5)" is a score written into the label."""
    check(run("number", "- Coherence (1–5): 3"), 3)
    check(run("form", "Fluency (4–5)\nCoherence (1–5): fine\nAccuracy: 3", fields=F3),
          {"fluency": 4, "coherence": 1, "accuracy": 3})
    check(run("form", "Fluency: 4\nCoherence (1–5): fine\nAccuracy: 3", fields=F3),
          ("parse", "Coherence missing"))


def test_a_hyphenated_aspect_is_keyed_with_an_underscore() -> None:
    """"Self-Consistency" and "self consistency" are one key, so an answer's "Self-Consistency"
    value is the aspect's score whichever way the prompt spells it."""
    assert aspect_key("Self-Consistency") == aspect_key("self  consistency") == "self_consistency"
    check(run("json", '{"Self-Consistency": 4, "Fact-check": 2}'),
          {"self_consistency": 4, "fact_check": 2})


def test_form_na_in_brackets() -> None:
    """"(N/A)" where a score would be written into the label is N/A, not a missing field."""
    text = "Fluency (N/A): not applicable\nCoherence (n/a)\nAccuracy (1-5): 3"
    check(run("form", text, fields=F3), ("parse", "Fluency is N/A; Coherence is N/A"))
    check(run("form", text, fields=F3, na_value=1),
          {"fluency": 1, "coherence": 1, "accuracy": 3})


# --- outputs ------------------------------------------------------------------------------------

TST = """Output 1
Score: 90
Explanation: The output sentence is similar to the source sentence.

Output 2
Score: 100
Explanation: Explanation: The output preserves the original meaning.

**Output 3:** That way you can still go by your last name.
Score: 85/100
Explanation: Scores of 100 are for perfect outputs."""


@pytest.mark.parametrize(("text", "options", "expected"), [
    (TST, {}, {"1": 90, "2": 100, "3": 85}),
    (TST, {"count": 2}, {"1": 90, "2": 100}),
    (TST.replace("Score: 100", "Score: 120"), {}, ("parse", "no score for output 2; outside")),
    (TST.replace("Score: 100", "Score: 120"), {"required": False}, {"1": 90, "3": 85}),
    (TST, {"count": 4}, ("parse", "no score for output 4")),
    (TST, {"count": 4, "required": False}, {"1": 90, "2": 100, "3": 85}),
    ("Output 2\nScore: 70\nOutput 1\nScore: 60\nOutput 2\nScore: 10", {"count": 2},
     {"1": 60, "2": 70}),
    ("Output 1\nExplanation: fine\nOutput 2\nScore: 50", {"count": 2},
     ("parse", "no score for output 1")),
    ("Output 1\nContent: 80\nStyle: 70\nFluency: 90", {"count": 1, "label": "Style"}, {"1": 70}),
    ("Score: 80", {"count": 1}, ("parse", "no score for output 1")),
    # outputs are numbered from 1: an "Output 0" block is ignored, not a key "0"
    ("Output 0\nScore: 50\nOutput 1\nScore: 60", {"count": 1}, {"1": 60}),
    ("Output 0\nScore: 50", {"count": 1, "required": False}, ("parse", "no score for output 1")),
    ("I'm sorry, but I cannot provide informal strength scores for Output 1 as it includes an "
     "offensive term.", {"count": 1}, ("refusal", "cannot provide")),
])
def test_outputs(text: str, options: dict[str, Any], expected: Any) -> None:
    check(run("outputs", text, **{"count": 3, **options}), expected)


def test_outputs_default_range_is_0_to_100() -> None:
    check(run("outputs", "Output 1\nScore: 0\nOutput 2\nScore: 100", count=2), {"1": 0, "2": 100})
    check(run("outputs", "Output 1\nScore: 101", count=1),
          ("parse", "no score for output 1; outside 0-100: 1 (101)"))


# --- pair ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("8 7\nAssistant 1 is more detailed.", {"1": 8, "2": 7}),
    ("8, 7", {"1": 8, "2": 7}), ("\n  9.5 6\n", {"1": 9.5, "2": 6}),
    ("Assistant 1: 8 Assistant 2: 7", {"1": 8, "2": 7}),
    ("Assistant 1: 8/10, Assistant 2: 7/10", {"1": 8, "2": 7}),
    ("1号AI助手：8分 2号AI助手：6分", {"1": 8, "2": 6}),
    ("8\n7", ("parse", "found 1")), ("8 7 6", ("parse", "found 3")),
    ("11 7", ("parse", "not in 1-10")), ("Both answers are good.", ("parse", "found 0")),
    ("I'm sorry, I cannot compare these answers.", ("refusal", "cannot compare")),
])
def test_pair(text: str, expected: Any) -> None:
    check(run("pair", text), expected)


# --- logprob ------------------------------------------------------------------------------------

def entry(token: str, tops: dict[str, float]) -> dict[str, Any]:
    return {"token": token, "logprob": math.log(tops.get(token, 0.5)),
            "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in tops.items()]}


def logprob(entries: list[dict[str, Any]] | None, text: str = "", **options: Any
            ) -> Scores | Failure:
    return get_parser("logprob")(Choice(text, logprobs=entries), options)


def test_logprob_expected_value() -> None:
    check(logprob([entry("4", {"4": 0.6, "5": 0.2, "3": 0.1, "x": 0.1})]),
          (4 * 0.6 + 5 * 0.2 + 3 * 0.1) / 0.9)
    # " 4" and "4" are the same score; the "-" bullet position is skipped
    check(logprob([entry("-", {"-": 0.9, "4": 0.1}), entry(" 4", {" 4": 0.5, "4": 0.25,
                                                                  " 2": 0.25})]),
          (4 * 0.75 + 2 * 0.25))
    check(logprob([entry("7", {"7": 0.5, "9": 0.5})], min=1, max=10), 8)
    many = [entry("3", {"3": 1.0}), entry(" and", {}), entry("5", {"5": 0.5, "4": 0.5})]
    check(logprob(many), 3)
    check(logprob(many, position="last"), 4.5)
    three = [entry("2", {"2": 1.0}), entry("4", {"4": 1.0}), entry("5", {"5": 0.5, "1": 0.5})]
    check(logprob(three, position="last"), 3)  # the last, not the second


def test_logprob_ignores_positive_logprobs() -> None:
    """A log-probability above 0 (a probability above 1) is malformed: that entry is dropped."""
    tops = [{"token": "5", "logprob": 0.5}, {"token": "3", "logprob": math.log(0.5)},
            {"token": "2", "logprob": math.log(0.5)}]
    check(logprob([{"token": "5", "logprob": 0.5, "top_logprobs": tops}]), 2.5)


@pytest.mark.parametrize(("entries", "expected"), [
    (None, ("parse", "request logprobs=true, top_logprobs=N")),
    ([], ("parse", "request logprobs=true")),
    ([entry("Five", {"Five": 0.9, "5": 0.1})], ("parse", "no score token 1-5")),
    ([entry("6", {"6": 0.9, "5": 0.1})], ("parse", "no score token")),
    ([{"token": "4", "logprob": -0.1}], ("parse", "top_logprobs=N")),
    ([{"token": "4", "logprob": -0.1, "top_logprobs": []}], ("parse", "top_logprobs=N")),
    ([{"token": "4", "top_logprobs": [{"token": "4", "logprob": float("nan")}]}],
     ("parse", "top_logprobs")),
    ([{"token": 4}, "junk", {"token": "3", "top_logprobs": "junk"}], ("parse", "top_logprobs")),
])
def test_logprob_failures(entries: Any, expected: Any) -> None:
    check(logprob(entries), expected)


def test_logprob_refusal() -> None:
    check(logprob([entry("I", {"I": 0.9, "4": 0.1})], "I'm sorry, I cannot rate this."),
          ("refusal", "cannot rate"))


# --- registry and options -----------------------------------------------------------------------

def test_registry() -> None:
    assert sorted(PARSERS) == ["form", "json", "logprob", "number", "outputs", "pair", "stars"]
    for name, parser in PARSERS.items():
        assert parser.name == name and parser.version
        check_options(parser, VALID_OPTIONS[name])
    with pytest.raises(ConfigError, match="unknown parser 'stras'; known parsers: form, "
                                          "json, logprob, number, outputs, pair, stars"):
        get_parser("stras")


@pytest.mark.parametrize(("name", "options", "message"), [
    ("stars", {"mx": 5}, "parser 'stars': unknown option 'mx'; valid options: levels, max, min"),
    ("number", {"min": 5, "max": 1}, "'min' must be below 'max' (got min=5, max=1)"),
    ("number", {"min": 3, "max": 3}, "'min' must be below 'max' (got min=3, max=3)"),
    ("number", {"max": "5"}, "option 'max' must be a number (got '5')"),
    ("number", {"min": True}, "option 'min' must be a number"),
    ("number", {"pattern": "no group"}, "'pattern' must be a regular expression with exactly"),
    ("number", {"pattern": "(unclosed"}, "'pattern' must be a regular expression"),
    ("form", {}, "option 'fields' must be a non-empty table of label -> key (it has no default)"),
    ("form", {"fields": {}}, "option 'fields' must be a non-empty table of label -> key (got {})"),
    ("form", {"fields": {"Fluency": 1}}, "option 'fields' must be"),
    ("form", {"fields": F3, "required": "yes"}, "option 'required' must be true or false"),
    ("form", {"fields": F3, "na_value": "one"}, "option 'na_value' must be a number"),
    ("outputs", {}, "option 'count' must be a positive integer (it has no default)"),
    ("outputs", {"count": 2, "label": " "}, "option 'label' must be a non-empty string"),
    ("stars", {"levels": {"good": "five"}}, "option 'levels' must be a table"),
    ("logprob", {"position": "middle"}, "option 'position' must be \"first\" or \"last\""),
])
def test_bad_options(name: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_options(get_parser(name), options)
    assert message in str(raised.value)
    with pytest.raises(ConfigError):  # calling with bad options fails the same way
        get_parser(name)(Choice("4"), options)


def test_refusal_message_quotes_the_phrase_in_context() -> None:
    """20 characters before the refusal phrase and 80 from its start, whitespace collapsed."""
    text = "a" * 30 + " I'm sorry, but\n" + "b" * 100
    phrase_at = text.index("I'm")
    result = run("number", text)
    want = " ".join(text[phrase_at - 20:phrase_at + 80].split())
    assert result == Failure("refusal", f"judge declined (no score 1-5 found): {want!r}")


def test_results_are_frozen_value_objects() -> None:
    for value in (Choice("4"), Scores({"score": 4.0}), Failure("parse", "x"), get_parser("number"),
                  combine([Scores({"score": 4.0})])):
        assert not hasattr(value, "__dict__")  # slots
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(value, dataclasses.fields(value)[0].name, None)


def test_finish_reason() -> None:
    number = get_parser("number")
    assert number(Choice("", finish_reason="content_filter")) == Failure(
        "refusal", "no score 1-5 found (finish_reason=content_filter)")
    assert number(Choice("The summary", finish_reason="length")) == Failure(
        "parse", "no score 1-5 found (finish_reason=length)")
    check(number(Choice("4", finish_reason="length")), 4)


def test_defaults_are_merged() -> None:
    parser = get_parser("number")
    check(parser(Choice("5")), 5)
    check(parser(Choice("9"), {"max": 10}), 9)
    check(parser(Choice("9")), ("parse", "outside 1-5"))


# --- recorded answers ---------------------------------------------------------------------------

class StringsOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def korean(model: str) -> list[str]:
    path = KOREAN / "chatgpt_results" / f"{model}.pkl"
    if not path.exists():
        pytest.skip(f"{path} not available")
    with path.open("rb") as f:
        answers = StringsOnly(f).load()
    assert isinstance(answers, list) and all(isinstance(a, str) for a in answers)
    return answers


# The README table of superheavytail/lm-evaluation-by-openai at 4cc6bd0 (judge gpt-4-0125-preview):
# fluency, coherence, accuracy, completeness, overall quality.
README = {
    "gpt_4_0125_preview": (4.97, 4.94, 4.74, 4.69, 4.80),
    "gpt_3_5_turbo_0125": (4.93, 4.88, 4.33, 4.12, 4.43),
    "kullm3": (4.83, 4.78, 4.17, 4.23, 4.36),
    "upstage-solar": (4.24, 3.04, 3.71, 3.77, 3.32),
    "kullm_v2": (3.70, 3.25, 2.82, 2.48, 2.80),
    "koalpaca_v1_1b": (3.90, 3.25, 2.60, 2.37, 2.67),
}


@pytest.mark.parametrize("model", sorted(README))
def test_korean_readme_means(model: str) -> None:
    """Every recorded answer parses; N/A is read as 1 (as upstream); means match the README."""
    answers = korean(model)
    results = [get_parser("form")(Choice(a), {"fields": KOREAN_FIELDS, "na_value": 1})
               for a in answers]
    parsed = [r.values for r in results if isinstance(r, Scores)]
    assert len(answers) == 252 and len(parsed) == len(answers)
    means = tuple(round(math.fsum(p[k] for p in parsed) / len(parsed) + 1e-9, 2)
                  for k in KOREAN_FIELDS.values())
    assert means == README[model]


def test_korean_odd_answers() -> None:
    answers = korean("gpt_4_0125_preview")
    form = get_parser("form")
    options = {"fields": KOREAN_FIELDS}
    assert form(Choice(answers[186]), options) == Failure("parse", "Accuracy is N/A")
    check(form(Choice(answers[186]), {**options, "na_value": 1}),
          {"fluency": 5, "coherence": 5, "accuracy": 1, "completeness": 5, "overall_quality": 5})
    check(form(Choice(answers[64]), options), {k: 5 for k in KOREAN_FIELDS.values()})  # (5-5)
    check(form(Choice(answers[226]), options),  # "- Fluency (5): <explanation>" lines
          {"fluency": 5, "coherence": 5, "accuracy": 4, "completeness": 4, "overall_quality": 4})


# --- properties ---------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["token", "logprob", "top_logprobs", "x"]), inner, max_size=4),
    max_leaves=12)
answers = st.text() | st.lists(
    st.sampled_from(["Fluency", "(1-5)", "(4)", ":", " ", "\n", "- ", "4", "10", "N/A", "stars",
                     "★", "Output 2", "Score:", "/5", "one", "I'm sorry", "**", "8 7", ",",
                     "-", "5-5", "out of", "1号AI助手", "{", "}", '"coherence":',
                     '"scores": {', "```json\n", "```"]), max_size=30).map("".join)


@given(name=st.sampled_from(sorted(PARSERS)), text=answers,
       logprobs=st.none() | st.lists(json_values, max_size=4))
def test_parsers_never_raise(name: str, text: str, logprobs: Any) -> None:
    result = get_parser(name)(Choice(text, logprobs=logprobs), VALID_OPTIONS[name])
    if isinstance(result, Failure):
        assert result.type in ("parse", "refusal") and "\n" not in result.message
    else:
        assert result.values and all(math.isfinite(v) for v in result.values.values())


@given(st.lists(st.integers(1, 5), min_size=5, max_size=5),
       st.sampled_from(["- {} (1-5): {}", "{}: {}", "**{}**: {}/5", "{} ({})"]))
def test_form_reads_what_was_written(scores: list[int], line: str) -> None:
    text = "\n".join(line.format(label, s) for label, s in zip(KOREAN_FIELDS, scores,
                                                                strict=True))
    result = get_parser("form")(Choice(text), {"fields": KOREAN_FIELDS})
    assert isinstance(result, Scores)
    assert list(result.values.values()) == scores


@given(st.integers(1, 5), st.sampled_from(["{} stars", "Stars: {}", "{}/5", "{}", "{} out of 5",
                                           "I give it {} stars."]))
def test_stars_reads_what_was_written(stars: int, form: str) -> None:
    assert get_parser("stars")(Choice(form.format(stars))) == Scores({"score": stars})


sample = st.one_of(
    st.dictionaries(st.sampled_from("abc"), st.floats(-100, 100), max_size=3).map(Scores),
    st.sampled_from([Failure("parse", "no score"), Failure("refusal", "sorry")]))


@given(st.lists(sample, max_size=8))
def test_combine(results: list[Scores | Failure]) -> None:
    combined = combine(results)
    assert isinstance(combined, Combined)
    scores = [r for r in results if isinstance(r, Scores)]
    assert combined.n_parsed == len(scores)
    assert combined.n_refused == sum(isinstance(r, Failure) and r.type == "refusal"
                                     for r in results)
    assert combined.n_parsed + combined.n_failed + combined.n_refused == len(results)
    assert set(combined.values) == {k for s in scores for k in s.values}
    for key, mean in combined.values.items():
        have = [s.values[key] for s in scores if key in s.values]
        assert min(have) - 1e-9 <= mean <= max(have) + 1e-9
        assert mean == pytest.approx(math.fsum(have) / len(have))
    assert combine(list(reversed(results))).values == pytest.approx(combined.values)
    if scores:
        assert combined.failure is None
    else:
        assert combined.failure == next((r for r in results if isinstance(r, Failure)),
                                        Failure("parse", "no samples to combine"))


def test_combine_missing_keys() -> None:
    combined = combine([Scores({"a": 1, "b": 4}), Scores({"a": 3}), Failure("parse", "x")])
    assert combined == Combined({"a": 2.0, "b": 4.0}, 2, 1, 0, None)
    refused = Failure("refusal", "sorry")
    assert combine([refused, Failure("parse", "x")]).failure == refused
