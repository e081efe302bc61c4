"""Judges people write today: the json parser, chain-of-thought numbers, juries, the answer
field of the length-bias analysis, system-level sample sizes and Bradley-Terry rankings; the
end-to-end test runs the real `judge` CLI against the fake server."""

from __future__ import annotations

import csv
import hashlib
import itertools
import math
import os
import random
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import scipy.stats

from runner.errors import ConfigError
from runner.execute.providers import anthropic_body
from runner.job.load import load_job
from runner.parse.parsers import Choice, Failure, Scores, get_parser
from runner.reduce.correlate import Row, correlate
from runner.reduce.jury import verdict
from runner.reduce.ranking import rank_rows
from runner.reduce.resample import Resamples
from runner.reduce.statistics import STATISTICS
from runner.report.headline import headline, system_warnings
from runner.report.html import read_page_data
from runner.report.markdown import ranking_markdown
from tests.conftest import DATA_DIR, ROOT, JobWriter
from tests.fakeproviders import ProviderServer
from tests.fakeserver import Script, ThreadedServer

JUDGE = str(Path(sys.executable).parent / "judge")


def parse(name: str, text: str, **options: Any) -> Scores | Failure:
    return get_parser(name)(Choice(text), options)


# --- json ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    '{"coherence": 4, "reasoning": "clear"}',
    'Here is my verdict:\n```json\n{"coherence": 4}\n```\nHope this helps.',
    'I think {"coherence": "4"} is fair.',
    '"coherence": 4, "reasoning": "answer continuing a prefilled brace"}',
    '{"coherence": "4/5"}',
])
def test_json_reads_the_object_wherever_it_is(text: str) -> None:
    assert parse("json", text) == Scores({"coherence": 4.0})


def test_json_fields_map_keys_and_paths_to_aspects() -> None:
    fields = {"Coherence": "coherence_score", "fluency": "scores.fluency"}
    text = '{"coherence_score": 3, "scores": {"fluency": 5}, "coherence": 1}'
    assert parse("json", text, fields=fields) == Scores({"coherence": 3.0, "fluency": 5.0})


@pytest.mark.parametrize(("text", "options", "message"), [
    ("Coherence is 4.", {}, "no JSON object found"),
    ('{"coherence": 4', {}, "no JSON object found"),
    ('{"reasoning": "fine", "ok": true}', {}, "no numeric field 1-5 in the JSON object "
                                              "(keys: reasoning, ok)"),
    ('{"c": 7}', {"fields": {"coherence": "c"}}, "c 7 outside 1-5"),
    ('{"c": 4}', {"fields": {"coherence": "c", "fluency": "f"}}, "f missing or not a number"),
])
def test_json_failures_say_why(text: str, options: dict[str, Any], message: str) -> None:
    result = parse("json", text, **options)
    assert result == Failure("parse", message)


def test_json_survives_deep_nesting_and_many_braces() -> None:
    assert parse("json", '{"a": ' + "[" * 100_000) == Failure("parse", "no JSON object found")
    assert parse("json", "{" * 50_000 + '{"score": 3}') == Failure("parse",
                                                                 "no JSON object found")


def test_json_without_required_keeps_what_parsed() -> None:
    result = parse("json", '{"c": 4}', fields={"coherence": "c", "fluency": "f"},
                   required=False)
    assert result == Scores({"coherence": 4.0})


# --- number with a chain of thought -------------------------------------------------------------

COT = ("Step 1: the summary covers 2 of the 3 key points.\nStep 2: it has 1 error (scale 1-5)."
       "\nScore: 4\nThat is 4 out of 5.")


def test_number_reads_the_last_number_or_the_one_after_a_marker() -> None:
    assert parse("number", COT) == Scores({"score": 1.0})  # the first: what CoT used to give
    assert parse("number", COT, pick="last") == Scores({"score": 4.0})
    # the last two numbers differ: the last, not the one before it
    assert parse("number", "Draft: 2\nRevised: 3\nFinal: 5", pick="last") == Scores(
        {"score": 5.0})
    assert parse("number", COT.replace("That is 4", "Really 5"), marker="score:") == Scores(
        {"score": 4.0})
    assert parse("number", "no verdict", marker="Score:") == Failure(
        "parse", "no 'Score:' in the answer")


def test_number_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="option 'pick' must be \"first\" or \"last\""):
        parse("number", "4", pick="final")
    with pytest.raises(ConfigError, match="option 'marker' must be a non-empty string"):
        parse("number", "4", marker=" ")


# --- the aspect-key rule, in the loader ---------------------------------------------------------

JOB = """
[[datasets]]
name = "d"
path = "data.jsonl"
[datasets.fields]
id = "id"
group = "doc"
system = "system"
text = {{ story = "output" }}
human = {{ coherence = "human" }}
{answer}

[[prompts]]
name = "js"
template = "Rate as JSON: {{{{story}}}}"
parser = "json"
aspects = ["coherence"]
params = {{ temperature = 0, response_format = {{ type = "json_object" }} }}
{js_options}

[[prompts]]
name = "cot"
template = "Think step by step, then write Score: N. {{{{story}}}}"
parser = "number"
parser_options = {{ marker = "Score:" }}
aspects = ["coherence"]

[models.a]
spec = "a"
base_url = "{url}"

[models.b]
spec = "b"
base_url = "{url}"
{juries}
"""
ANSWER = 'answer = "story"'
PANEL = '\n[juries.panel]\njudges = ["a/js", "b/js"]\nmethod = "mean"\n'


@pytest.mark.parametrize(("js_options", "juries", "message"), [
    ('parser_options = { fields = { coherense = "c" } }', "",
     "prompts[0].parser is wrong: parser 'json': fields names 'coherense', which is not an "
     "aspect of the prompt (coherence); key each field by its aspect"),
    ('parser = "form"\nparser_options = { fields = { Coherence = "coh" } }', "",
     "prompts[0].parser is wrong: parser 'form': no field gives aspect 'coherence' a score; "
     "map a label to the key 'coherence' (keys now: coh)"),
    ("", '\n[juries.panel]\njudges = ["a/js"]\n',
     "juries.panel.judges must list two or more judges (got ['a/js'])"),
    ("", '\n[juries.panel]\njudges = ["a/js", "c/js"]\n',
     "juries.panel.judges names 'c/js', which is not a judge of this job; judges are "
     "model/prompt: a/cot, a/js, b/cot, b/js"),
    ("", PANEL.replace('"mean"', '"vote"'),
     "juries.panel.method must be one of mean, median, majority (got 'vote')"),
    ("", PANEL + "quorum = 3\n", "juries.panel.quorum must be from 1 to 2, or 0 for all "
                                 "(got 3)"),
    ("", PANEL + "size = 3\n", "juries.panel.size is not a known key; use one of: judges, "
                               "method, quorum"),
    ("", PANEL.replace("juries.panel", 'juries."a/js"'),
     'juries.a/js is not a jury name: a name without "/" that is not iaa or human (those name '
     "other rows of the reports)"),
])
def test_loader_errors_name_the_aspect_and_the_jury(write_job: JobWriter, js_options: str,
                                                     juries: str, message: str) -> None:
    text = JOB.format(js_options=js_options, juries=juries, url="http://127.0.0.1:9/v1",
                      answer=ANSWER)
    if 'parser = "form"' in js_options:
        text = text.replace('parser = "json"\n', "", 1)
    path = write_job(text, rows=[])
    with pytest.raises(ConfigError) as caught:
        load_job(path)
    assert str(caught.value) == f"{path}: {message}"


def test_loader_accepts_response_format_and_a_jury(write_job: JobWriter) -> None:
    path = write_job(JOB.format(js_options="", juries=PANEL, url="http://127.0.0.1:9/v1",
                                answer=ANSWER),
                     rows=[])
    job = load_job(path)
    score_form = 'parser = "form"\nparser_options = { fields = { Score = "score" } }'
    load_job(write_job(JOB.format(js_options=score_form, juries="", url="http://127.0.0.1:9/v1",
                                  answer=ANSWER).replace('parser = "json"\n', "", 1), rows=[]))
    assert job.prompts[0].params["response_format"] == {"type": "json_object"}
    assert [(j.name, j.judges, j.method, j.quorum) for j in job.juries] == [
        ("panel", ("a/js", "b/js"), "mean", 0)]


def test_anthropic_gets_a_prefilled_brace_for_json() -> None:
    body = {"model": "c", "messages": [{"role": "user", "content": "Rate as JSON"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}
    sent = orjson.loads(anthropic_body(orjson.dumps(body)))
    assert "response_format" not in sent
    assert sent["messages"][-1] == {"role": "assistant", "content": "{"}
    plain = orjson.loads(anthropic_body(orjson.dumps({**body, "response_format": None})))
    assert plain["messages"] == body["messages"]


@pytest.mark.slow
def test_an_anthropic_judge_answers_json_through_a_prefilled_brace(
        write_job: JobWriter, tmp_path: Path) -> None:
    job = """
[[datasets]]
name = "d"
path = "data.jsonl"
fields = { id = "id", text = { story = "output" } }

[[prompts]]
name = "js"
template = "Rate as JSON with a score: {{story}}"
parser = "json"
aspects = ["overall"]
params = { response_format = { type = "json_object" } }

[models.claude]
spec = "anthropic:claude-3-5-haiku-latest"
base_url = "%s/v1"
"""
    with ProviderServer() as provider:
        path = write_job(job % provider.root, rows=[{"id": f"i{i}", "output": f"Story {i}"}
                                                      for i in range(3)])
        env = {"ANTHROPIC_API_KEY": "sk-ant-test"}
        done = _judge("run", str(path), "--cache-dir", str(tmp_path / "cache"), "--out",
                      str(tmp_path / "out"), cwd=tmp_path, env=env)
        seen = [s.body for s in provider.fake.seen]
    assert done.returncode == 0, done.stderr
    assert len(seen) == 3 and all(b["messages"][-1] == {"role": "assistant", "content": "{"}
                                  and "response_format" not in b for b in seen)
    lines = [orjson.loads(x) for x in (tmp_path / "out" / "judgments.jsonl").read_bytes()
             .splitlines()]
    assert all(x["error"] is None and 1 <= x["score"] <= 5 for x in lines)


# --- juries -------------------------------------------------------------------------------------

def test_jury_methods() -> None:
    assert verdict("mean", [1.0, 2.0, 4.0]) == pytest.approx(7 / 3)
    assert verdict("median", [1.0, 2.0, 4.0]) == 2.0
    assert verdict("majority", [4.0, 2.0, 4.0]) == 4.0
    assert verdict("majority", [1.0, 2.0, 4.0]) == 2.0  # a three-way tie: the median
    assert verdict("mean", []) is None


def test_a_jury_without_a_quorum_is_not_an_unparsed_judge() -> None:
    summary = [{"dataset": "d", "prompt": "js", "aspect": "x", "model": "a", "n": 4,
                "scored": 4, "api_failures": 0},
               {"dataset": "d", "prompt": "", "aspect": "x", "model": "panel", "n": 4,
                "scored": 0, "api_failures": 0}]
    result = headline(["sample"], ["spearman"], [], summary, juries=["panel"])
    assert (result.unparsed, result.scoreless) == ([], [])


# --- end to end ---------------------------------------------------------------------------------

def _digest(*parts: str) -> int:
    return int(hashlib.sha256("|".join(parts).encode()).hexdigest(), 16)


def reply(body: dict[str, Any]) -> str:
    text = body["messages"][-1]["content"]
    n = _digest(text, body["model"]) % 5 + 1
    if "as JSON" in text:
        return f'Sure.\n```json\n{{"coherence": {n}, "reasoning": "1 2 3"}}\n```'
    return f"Step 1: 2 of 3 points.\nStep 2: 1 error.\nScore: {n}\nSo 3 out of 5 overall."


def rows(systems: int = 3, docs: int = 6) -> list[dict[str, Any]]:
    return [{"id": f"{d}-{s}", "doc": f"d{d}", "system": f"s{s}", "output": f"text {d} {s} "
             + "word " * (s * 3 + d), "human": _digest(str(d), str(s)) % 5 + 1}
            for d in range(docs) for s in range(systems)]


def _judge(*args: str, cwd: Path, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL",
                                                               "ANTHROPIC_API_KEY")}
    return subprocess.run([JUDGE, *args], cwd=cwd, env={**clean, **(env or {})},
                          capture_output=True, text=True, timeout=180, check=False)


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_jury_json_and_cot_study_end_to_end(write_job: JobWriter, tmp_path: Path) -> None:
    bodies: list[dict[str, Any]] = []
    lock = threading.Lock()

    def recording(body: dict[str, Any]) -> str:
        with lock:
            bodies.append(body)
        return reply(body)

    with ThreadedServer(Script(reply=recording)) as server:
        path = write_job(JOB.format(js_options="", juries=PANEL, url=server.url,
                                           answer=ANSWER), rows=rows())
        done = _judge("run", str(path), "--cache-dir", str(tmp_path / "cache"),
                      "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    js = [b for b in bodies if "as JSON" in b["messages"][-1]["content"]]
    assert js and all(b["response_format"] == {"type": "json_object"} for b in js)
    assert len(bodies) == 2 * 2 * 18  # two judges, two prompts, 18 items; the jury: no call
    out = tmp_path / "out"
    summary = {(r["prompt"], r["model"]): r for r in _csv(out / "summary.csv")}
    assert summary["cot", "a"]["scored"] == "18" and summary["js", "b"]["scored"] == "18"
    scores = _csv(out / "scores.csv")
    by = {(r["item_id"], r["model"], r["prompt"]): r["judge_score"] for r in scores}
    for r in rows():
        mean = (float(by[r["id"], "a", "js"]) + float(by[r["id"], "b", "js"])) / 2
        assert float(by[r["id"], "panel", ""]) == pytest.approx(mean)
    judges = {r["judge"] for r in _csv(out / "correlations.csv")}
    assert {"a/js", "b/js", "a/cot", "panel"} <= judges
    assert '"panel"' in (out / "report.html").read_text(encoding="utf-8")
    lengths = [r for r in _csv(out / "reliability.csv") if r["figure"] == "length"]
    assert {r["a"] for r in lengths} >= {"a/js", "panel", "human"}  # from fields.answer
    system = [r for r in _csv(out / "correlations.csv") if r["level"] == "system"]
    assert system and {(r["n_systems"], r["ci_low"]) for r in system} == {("3", "")}
    warning = ("warning: d / coherence: the system level rests on 3 systems (n_items = 18): "
               "no CI, and any ranking of 3 systems gives a coefficient like that; read the "
               "sample and dataset levels")
    assert done.stderr.rstrip().endswith(warning)
    assert re.search(r"^  [* ] panel +-?\d", done.stderr, re.MULTILINE)  # in the result table
    compared = _judge("compare", str(path), "--judges", "panel", "a/js", "--cache-dir",
                      str(tmp_path / "cache"), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    assert {r["a"] for r in _csv(out / "compare.csv")} == {"panel"}
    note = "System level: only 3 systems, whatever the item count"
    assert note in (out / "report.md").read_text(encoding="utf-8")
    assert note in (out / "report.html").read_text(encoding="utf-8")


@pytest.mark.slow
def test_answer_must_be_a_text_field(write_job: JobWriter, tmp_path: Path) -> None:
    path = write_job(JOB.format(js_options="", juries="", url="http://127.0.0.1:9/v1",
                                answer='answer = "output"'), rows=rows())
    done = _judge("plan", str(path), "--cache-dir", str(tmp_path / "cache"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (f"Error: {path}: datasets.d.fields.answer names 'output', "
                                   "which is not a text field; use one of: story")


@pytest.mark.slow
def test_openmeva_length_bias_reads_the_storyline(tmp_path: Path) -> None:
    if not (DATA_DIR / "openmeva").exists():
        pytest.skip(f"no openmeva data in {DATA_DIR}")
    with ThreadedServer(Script()) as server:
        done = _judge("run", str(ROOT / "jobs" / "openmeva.toml"), "--limit", "40", "--model",
                      "fake", "--base-url", server.url, "--cache-dir", str(tmp_path / "cache"),
                      "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lengths = [r for r in _csv(tmp_path / "out" / "reliability.csv") if r["figure"] == "length"]
    assert {(r["a"], r["b"]) for r in lengths} >= {("fake/stars", "length (chars)"),
                                                   ("human", "length (tokens)")}


# --- system level: what it rests on -------------------------------------------------------------

def _rows(systems: int, groups: int = 30) -> list[Row]:
    draw = random.Random(7)
    return [Row(f"g{g}", f"s{s}", "", draw.randint(1, 5) + s / 3, draw.uniform(1, 5) + s / 3)
            for g in range(groups) for s in range(systems)]


def test_system_level_counts_systems_and_gets_a_ci_from_five() -> None:
    few = {c.method: c for c in correlate(_rows(3), levels=("system", "dataset"))
           if c.level == "system"}
    assert few["spearman"].n_systems == 3 and few["spearman"].n_items == 90
    assert (few["spearman"].ci_low, few["spearman"].ci_high) == (None, None)
    many = correlate(_rows(6), levels=("dataset", "system"), n_boot=200)
    assert {c.n_systems for c in many} == {6}
    for c in many:
        assert c.ci_low is not None and c.ci_high is not None and c.value is not None
        assert c.ci_low <= c.value + 1e-9 and c.value - 1e-9 <= c.ci_high


def test_system_ci_is_the_statistic_over_resampled_groups() -> None:
    rows_ = _rows(6, groups=12)
    boot = 50
    got = next(c for c in correlate(rows_, levels=("system",), methods=("kendall",),
                                    n_boot=boot, seed=3) if c.method == "kendall")
    counts = Resamples().counts((12,), boot, 3)
    values = []
    for b in range(boot):
        drawn = [r for g in range(12) for _ in range(int(counts[b][g])) for r in rows_
                 if r.group == f"g{g}"]
        by = {s: [r for r in drawn if r.system == s] for s in {r.system for r in drawn}}
        names = sorted(by)
        mx = [sum(r.judge for r in by[s]) / len(by[s]) for s in names]  # type: ignore[misc]
        my = [sum(r.human for r in by[s]) / len(by[s]) for s in names]
        values.append(scipy.stats.kendalltau(mx, my).statistic)
    finite = [v for v in values if math.isfinite(v)]
    assert got.ci_low == pytest.approx(float(np.percentile(finite, 2.5)))
    assert got.ci_high == pytest.approx(float(np.percentile(finite, 97.5)))


# --- Bradley-Terry ranking ----------------------------------------------------------------------

def _battle(a: str, b: str, a_wins: int, ties: int, b_wins: int,
            inconsistent: int = 0) -> dict[str, Any]:
    return {"judge": "j/p", "dataset": "d", "aspect": "x", "model_a": a, "model_b": b,
            "a_wins": a_wins, "ties": ties, "b_wins": b_wins, "inconsistent": inconsistent}


def test_two_systems_have_the_closed_form_strengths() -> None:
    first, second = rank_rows([_battle("a", "b", 6, 2, 1, 1)], n_boot=0)
    expected = math.log((6 + 1.5 + 0.05) / (1 + 1.5 + 0.05)) / 2  # ties + inconsistent: halves
    assert (first["model"], first["rank"], second["model"]) == ("a", 1, "b")
    assert first["strength"] == pytest.approx(expected, abs=1e-4)
    assert second["strength"] == pytest.approx(-expected, abs=1e-4)
    assert (first["battles"], first["wins"], first["ties"], first["losses"]) == (10, 6, 3, 1)


def test_the_fit_solves_the_bradley_terry_equations_and_has_cis() -> None:
    battles = [_battle("x", "y", 8, 1, 2), _battle("y", "z", 7, 0, 3), _battle("x", "z", 9, 1, 1),
               _battle("w", "x", 0, 0, 10), _battle("w", "y", 1, 2, 5)]
    rows_ = rank_rows(battles, n_boot=300, seed=1)
    assert [r["model"] for r in rows_] == ["x", "y", "z", "w"]
    _assert_solves(battles, rows_)
    for r in rows_:
        assert r["ci_low"] < r["strength"] < r["ci_high"]
    assert rank_rows(battles, n_boot=300, seed=1) == rows_  # seeded


def _assert_solves(battles: list[dict[str, Any]], rows_: list[dict[str, Any]]) -> None:
    """Each system's expected score equals its observed score (wins + half the ties, with the
    prior): the Bradley-Terry equations."""
    p = {r["model"]: math.exp(r["strength"]) for r in rows_}
    for m in p:
        expected = observed = 0.0
        for b in battles:
            if m not in (b["model_a"], b["model_b"]):
                continue
            other = b["model_b"] if m == b["model_a"] else b["model_a"]
            won = b["a_wins"] if m == b["model_a"] else b["b_wins"]
            games = b["a_wins"] + b["ties"] + b["b_wins"] + b["inconsistent"] + 0.1
            observed += won + (b["ties"] + b["inconsistent"] + 0.1) / 2
            expected += games * p[m] / (p[m] + p[other])
        assert expected == pytest.approx(observed, rel=1e-3)


def test_a_system_that_wins_every_battle_has_a_finite_fitted_strength() -> None:
    """No loss, no tie: without the prior's virtual tie its strength would run off to
    infinity; with it the fit converges to the equations' solution, CIs included."""
    top, bottom = rank_rows([_battle("b", "a", 0, 0, 10)], n_boot=0)
    expected = math.log((10 + 0.05) / 0.05) / 2
    assert (top["model"], top["wins"], top["losses"], bottom["model"]) == ("a", 10, 0, "b")
    assert top["strength"] == pytest.approx(expected, abs=1e-4)
    assert bottom["strength"] == pytest.approx(-expected, abs=1e-4)
    battles = [_battle("a", "b", 10, 0, 0), _battle("c", "a", 0, 0, 10),
               _battle("b", "c", 6, 0, 4)]
    rows_ = rank_rows(battles, n_boot=200, seed=1)
    assert [r["model"] for r in rows_] == ["a", "b", "c"]
    assert (rows_[0]["wins"], rows_[0]["battles"]) == (20, 20)
    _assert_solves(battles, rows_)
    for r in rows_:
        assert math.isfinite(r["ci_low"]) and math.isfinite(r["ci_high"])
        assert r["ci_low"] <= r["strength"] <= r["ci_high"]


def test_a_single_battle_or_none_still_fits() -> None:
    """One battle: the prior's tenth of a tie is what keeps the loser finite. A pair whose
    battles all dropped out (a row of zeros) leaves its system unranked by them, not NaN."""
    top, bottom = rank_rows([_battle("a", "b", 1, 0, 0)], n_boot=0)
    assert top["strength"] == pytest.approx(math.log(1.05 / 0.05) / 2, abs=1e-4)
    assert bottom["strength"] == -top["strength"]
    rows_ = {r["model"]: r for r in rank_rows([_battle("a", "b", 3, 0, 1),
                                                _battle("a", "c", 0, 0, 0)], n_boot=0)}
    assert all(math.isfinite(r["strength"]) for r in rows_.values()) and rows_["c"][
        "battles"] == 0
    assert rows_["a"]["strength"] - rows_["b"]["strength"] == pytest.approx(
        math.log(3.05 / 1.05), abs=2e-4)
    none = rank_rows([_battle("a", "b", 0, 0, 0)], n_boot=20)  # nothing to resample: no CI
    assert [(r["strength"], r["ci_low"], r["ci_high"]) for r in none] == [(0, None, None)] * 2


def test_the_cis_are_percentiles_of_the_fit_over_resampled_battles() -> None:
    """Two systems have a closed form per resample: the CI is its 2.5th and 97.5th
    percentiles over multinomial draws of the 60 battles (seeded), rounded to 4 places."""
    battles = [_battle("a", "b", 30, 10, 18, 2)]
    rows_ = rank_rows(battles, n_boot=200, seed=3)
    draws = np.random.default_rng(3).multinomial(60, np.array([30, 12, 18]) / 60, size=200)
    half = draws[:, 1] / 2 + 0.05
    strength = np.log((draws[:, 0] + half) / (draws[:, 2] + half)) / 2
    for r, sign in zip(rows_, (1, -1), strict=True):
        low, high = np.percentile(sign * strength, [2.5, 97.5])
        assert (r["ci_low"], r["ci_high"]) == (round(float(low), 4), round(float(high), 4))
        assert r["strength"] == round(r["strength"], 4)
    assert rank_rows(battles) == rank_rows(battles, n_boot=1000, seed=0)  # the defaults


def test_the_ranking_section_of_report_md() -> None:
    assert ranking_markdown([]) == ""  # no battle, no section
    rows_ = rank_rows([_battle("a", "b", 6, 2, 1, 1)], n_boot=0)
    rows_ += rank_rows([{**_battle("a", "b", 6, 2, 1, 1), "judge": "k/p"}], n_boot=50, seed=2)
    lines = ranking_markdown(rows_).splitlines()
    assert lines[:2] == ["", "## Ranking (Bradley-Terry over the battles)"]
    ci = [f"[{r['ci_low']:.2f}, {r['ci_high']:.2f}]" for r in rows_[2:]]
    assert lines[-6:] == [
        "| judge | aspect | rank | model | strength | 95% CI | wins | ties | losses |",
        "|---|---|---:|---|---:|---|---:|---:|---:|",
        "| j/p | x | 1 | a | 0.54 |  | 6 | 3 | 1 |", "| j/p | x | 2 | b | -0.54 |  | 1 | 3 | 6 |",
        f"| k/p | x | 1 | a | 0.54 | {ci[0]} | 6 | 3 | 1 |",
        f"| k/p | x | 2 | b | -0.54 | {ci[1]} | 1 | 3 | 6 |"]
    assert ranking_markdown(rows_).endswith("|\n")


@pytest.mark.slow
def test_battles_over_three_systems_write_a_ranking(write_job: JobWriter,
                                                    tmp_path: Path) -> None:
    systems = ["m1", "m2", "m3"]
    data = [{"id": f"q{q}-{a}{b}-{m}", "pair": f"q{q}-{a}{b}", "model": m, "answer": f"{m} {q}"}
            for q in range(5) for a, b in itertools.combinations(systems, 2) for m in (a, b)]
    job = """
[[datasets]]
name = "answers"
path = "data.jsonl"
[datasets.fields]
id = "id"
group = "pair"
system = "model"
text = { answer = "answer" }

[[prompts]]
name = "battle"
per = "group"
order = "both"
output_field = "answer"
template = "Assistant 1: {{output_1}}\\nAssistant 2: {{output_2}}\\nScore both, 1-10."
parser = "pair"
parser_options = { min = 1, max = 10 }
aspects = ["battle"]

[models.judge]
spec = "judge"
base_url = "%s"
"""
    with ThreadedServer(Script()) as server:
        path = write_job(job % server.url, rows=data)
        done = _judge("run", str(path), "--cache-dir", str(tmp_path / "cache"),
                      "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ranking = _csv(tmp_path / "out" / "ranking.csv")
    assert sorted(r["model"] for r in ranking) == systems
    assert [r["rank"] for r in ranking] == ["1", "2", "3"]
    assert sum(float(r["strength"]) for r in ranking) == pytest.approx(0, abs=1e-3)
    for r in ranking:
        assert int(r["wins"]) + int(r["ties"]) + int(r["losses"]) == int(r["battles"]) == 10
    assert "## Ranking (Bradley-Terry over the battles)" in (
        tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    page = read_page_data(tmp_path / "out" / "report.html")
    assert [r["model"] for r in page["ranking"]] == [r["model"] for r in ranking]


@pytest.mark.parametrize("method", list(STATISTICS))
def test_vectorised_system_values_equal_the_scalar_ones(method: str) -> None:
    draw = np.random.default_rng(1)
    mx = draw.integers(1, 4, (60, 7)).astype(float)  # ties in the judge means
    my = draw.random((60, 7))
    my[:, 2] = my[:, 3]  # and in the human means
    valid = draw.random((60, 7)) > 0.15  # systems no drawn group had
    got = STATISTICS[method].systems(mx, my, valid)
    for row in range(60):
        want = STATISTICS[method].one(mx[row, valid[row]], my[row, valid[row]])
        if want is None or not math.isfinite(want):
            assert math.isnan(got[row])
        else:
            assert got[row] == pytest.approx(want, abs=1e-12)


def test_the_system_warning_counts_the_judges_items() -> None:
    def row(judge: str, n_items: int) -> dict[str, Any]:
        return {"dataset": "d", "aspect": "x", "judge": judge, "level": "system",
                "method": "spearman", "subset": "all", "value": 1.0, "n_groups": 30,
                "n_items": n_items, "ci_low": None, "ci_high": None, "n_systems": 3}

    assert system_warnings([row("a/js", 90), row("rouge1", 120)]) == [
        "warning: d / x: the system level rests on 3 systems (n_items = 90): no CI, and any "
        "ranking of 3 systems gives a coefficient like that; read the sample and dataset levels"]
    assert system_warnings([{**row("a/js", 90), "n_systems": 5}]) == []
