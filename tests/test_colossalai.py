"""The ColossalAI chat-evaluation jobs: published prompts verbatim, battles in both orders,
the reference variant, automatic metrics, and both jobs end to end against the fake server."""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import sacrebleu
from click.testing import CliRunner, Result
from rouge_score import rouge_scorer

from runner.cli.main import cli
from runner.errors import ConfigError
from runner.expand import Expansion
from runner.job.load import load_job as _load_job
from runner.job.spec import Job
from runner.parse import metrics
from runner.prepare import prepare
from runner.session.select import resolve_models
from tests.fakeserver import Script, ThreadedServer

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "colossalai_chat_eval/chat_evaluate_2023-09/applications/Chat/evaluate"
EXAMPLES = ("colossalai_chat_eval/colossaleval_head/applications/ColossalEval/configs/"
            "gpt_evaluation/data/eval_{lang}_examples.json")
LANGS = ("en", "cn")
BATTLE_MARK = re.compile(r"\[The Start of AI Assistant 1's Answer\]|\[1号AI助手的答案\]")
BATTLE_ANSWERS = re.compile(
    r"\[(?:The Start of AI Assistant 1's Answer|1号AI助手的答案)\]\n(.*?)\n\n\[.*?\]\n\n"
    r"\[(?:The Start of AI Assistant 2's Answer|2号AI助手的答案)\]\n(.*?)\n\n\[", re.S)
# The first example question of each language: there the fake judge always prefers position 1.
BIASED = ("Which are some popular fiction books", "列举一些可以促进头发生长的食物")


def published(data_dir: Path, lang: str) -> dict[str, Any]:
    def read(rel: str) -> Any:
        return json.loads((data_dir / SOURCE / rel.format(lang=lang)).read_text("utf-8"))
    return {"config": read("config/config_{lang}.json")["category"],
            "prompts": read("prompt/evaluation_prompt/evaluation_prompt_{lang}.json"),
            "battle": read("prompt/battle_prompt/battle_prompt_{lang}.json"),
            "examples": {str(e["id"]): e for e in json.loads(
                (data_dir / EXAMPLES.format(lang=lang)).read_text("utf-8"))}}


def load_job(path: Path) -> Job:
    """The job with its bare model names served at an address never called here."""
    job = _load_job(path)
    return replace(job, models=resolve_models(job, (), "http://127.0.0.1:9/v1", None))


def question(example: Mapping[str, str], sep: str) -> str:
    """gpt_evaluate.py: the instruction, plus sep + input when the input is not empty."""
    return example["instruction"] + (sep + example["input"] if example["input"] != "" else "")


def generated(expansion: Expansion) -> Expansion:
    """The expansion with every candidate answer made up: "answer of <model> to <item>"."""
    full, missing = expansion.with_generated(
        lambda t: f"answer of {t.model} to {t.item_id}: {{braces}} stay")
    assert missing == 0
    return full


def user_text(body: bytes) -> tuple[str | None, str]:
    messages = orjson.loads(body)["messages"]
    system = messages[0]["content"] if messages[0]["role"] == "system" else None
    assert messages[-1]["role"] == "user"
    return system, messages[-1]["content"]


# ---------------------------------------------------------------- prompts, verbatim

@pytest.mark.slow
def test_prompt_files_are_what_the_tool_writes_from_the_published_json(data_dir: Path) -> None:
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "colossalai_prompts.py"),
                          "--check"], capture_output=True, text=True,
                         env={"JUDGE_DATA_DIR": str(data_dir), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert "133 files checked" in run.stdout


@pytest.mark.parametrize("lang", LANGS)
def test_every_metric_request_is_the_published_prompt_filled_in(data_dir: Path,
                                                                lang: str) -> None:
    src = published(data_dir, lang)
    job = load_job(ROOT / "jobs" / f"colossalai-{lang}.toml")
    expansion = generated(prepare(job, data_dir))
    seen: Counter[str] = Counter()
    for task in expansion.tasks():
        if task.prompt != "gpt":
            continue
        item = expansion.item(task.dataset, task.item_id)
        example = src["examples"][item.group]
        entry, metric = src["prompts"][item.subset], task.aspect.replace("_", " ")
        assert metric in src["config"][item.subset]["GPT"]
        expected = entry["prompt"].format(question=question(example, "\n"),
                                          answer=item.fields["answer"],
                                          metric=entry["metrics"][metric],
                                          steps=entry["CoT"][metric])
        assert user_text(task.body) == (None, expected)
        assert orjson.loads(task.body)["max_tokens"] == 1
        seen[item.subset] += 1
    # 25 questions x 2 candidates x the category's metrics (5, 4, 3, 3, 4 per config)
    per_category = {c: len(src["config"][c]["GPT"]) * 5 * 2 for c in seen}
    assert seen == per_category and sum(seen.values()) == 190


@pytest.mark.parametrize("lang", LANGS)
def test_battle_requests_are_the_published_prompt_in_both_orders(data_dir: Path,
                                                                 lang: str) -> None:
    src = published(data_dir, lang)
    job = load_job(ROOT / "jobs" / f"colossalai-{lang}.toml")
    expansion = generated(prepare(job, data_dir))
    battles = [t for t in expansion.tasks() if t.prompt == "battle"]
    assert len(battles) == 50 and len({t.key for t in battles}) == 50
    battle = src["battle"]
    for first, second in zip(battles[::2], battles[1::2], strict=True):
        assert first.item_id == second.item_id and first.members == second.members[::-1]
        a, b = (expansion.item("answers", m).fields["answer"] for m in first.members)
        ask = question(src["examples"][first.item_id], " ")
        for task, (x, y) in ((first, (a, b)), (second, (b, a))):
            expected = battle["prompt_template"].format(question=ask, answer_1=x, answer_2=y,
                                                        prompt=battle["prompt"])
            assert user_text(task.body) == (battle["system_prompt"], expected)
        assert first.body != second.body


@pytest.mark.parametrize("lang", LANGS)
def test_reference_prompt_applies_only_where_a_reference_exists(
        data_dir: Path, tmp_path: Path, lang: str) -> None:
    """The registered examples have no target and no output: no reference task. A user file in
    ColossalAI's format gets the --gpt_with_reference block after the first-round prompt."""
    job = load_job(ROOT / "jobs" / f"colossalai-{lang}.toml")
    assert not [t for t in generated(prepare(job, data_dir)).tasks()
                if t.prompt == "gpt_reference"]

    src = published(data_dir, lang)
    rows = [{"id": 1, "category": "classification", "instruction": "Pick one.", "input": "",
             "target": "sport", "output": ""},
            {"id": 2, "category": "open_qa", "instruction": "Why?", "input": "context",
             "target": "", "output": "a recorded answer"},
            {"id": 3, "category": "open_qa", "instruction": "Who?", "input": "", "target": "",
             "output": ""}]
    path = own_data_job(tmp_path, lang, rows)
    expansion = generated(prepare(load_job(path), data_dir))
    refs = [t for t in expansion.tasks() if t.prompt == "gpt_reference"]
    assert {t.item_id.split(":")[0] for t in refs} == {"1", "2"}
    assert len(refs) == 2 * (2 + 3)  # classification: 2 metrics, open_qa: 3; two candidates
    for task in refs:
        item = expansion.item(task.dataset, task.item_id)
        row = rows[int(item.group) - 1]
        entry, metric = src["prompts"][item.subset], task.aspect.replace("_", " ")
        first = entry["prompt"].format(question=question(row, "\n"), answer=item.fields["answer"],
                                       metric=entry["metrics"][metric],
                                       steps=entry["CoT"][metric])
        assert user_text(task.body)[1] == first + reference_block(metric, lang,
                                                                  row["target"] or row["output"])


def reference_block(metric: str, lang: str, reference: str) -> str:
    """gpt_evaluate.reference_template() @ 079bf3c, written out for the test."""
    if lang == "en":
        adjective, intro = "example", "\nAn example answer with good quality is as follows:"
        if metric == "correctness":
            adjective, intro = "correct", "\nA correct answer is as follows:"
        return (f"{intro}\n\n{reference}\n\nNow please compare the answer with the {adjective} "
                f"answer, determine whether the answer is able to achieve the same level of "
                f"{metric}.\n\n{metric} (1-5) (directly give the score for the given answer):")
    adjective, intro = "示例", "\n一个优质的示例答案如下："
    if metric == "correctness":
        adjective, intro = "标准", "\n标准答案如下："
    return (f"{intro}\n\n{reference}\n\n请比较答案与上面的{adjective}答案，确定答案是否可以达到与该"
            f"{adjective}答案同样水平的{metric}。\n\n{metric} (1-5) (直接对给定答案打分)")


def own_data_job(tmp_path: Path, lang: str, rows: list[dict[str, Any]]) -> Path:
    """The language's job on a JSONL file in ColossalAI's target-file format."""
    data = tmp_path / "targets.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    dataset = f"colossalai_{lang}"
    text = (ROOT / "jobs" / f"colossalai-{lang}.toml").read_text("utf-8")
    text = text.replace("../prompts/", f"{ROOT}/prompts/")
    text = text.replace(f'[[datasets]]\nname = "{dataset}"\n', f'''[[datasets]]
name = "{dataset}"
path = "{data}"
[datasets.fields]
id = "id"
subset = "category"
text = {{ question = "instruction", input = "input", target = "target", output = "output" }}
''')
    path = tmp_path / "job.toml"
    path.write_text(text, "utf-8")
    return path


def test_generated_items_carry_their_category_metrics(data_dir: Path, tmp_path: Path) -> None:
    rows = [{"id": 1, "category": "classification", "instruction": "Pick one.", "input": "",
             "target": "the sport", "output": ""},
            {"id": 2, "category": "brainstorming", "instruction": "Ideas?", "input": "",
             "target": "", "output": ""},
            {"id": 3, "category": "summarization", "instruction": "Sum up.", "input": "",
             "target": "", "output": "a recorded summary"}]
    expansion = generated(prepare(load_job(own_data_job(tmp_path, "en", rows)), data_dir))
    answers = {it.item_id: it for it in expansion.items["answers"]}
    hyp = "answer of cand_a to 1: {braces} stay"
    assert answers["1:cand_a"].metrics == {"*": {
        **metrics.overlap(hyp, "the sport", "en"), "chrf": metrics.chrf(hyp, "the sport")}}
    assert set(answers["2:cand_a"].metrics["*"]) == {"distinct_1", "distinct_2"}
    assert set(answers["3:cand_b"].metrics["*"]) == {"bleu", "rouge1", "rouge2", "rougeL",
                                                     "chrf"}  # against the recorded output
    assert answers["3:cand_b"].fields["reference"] == "a recorded summary"


# ---------------------------------------------------------------- automatic metrics

def test_bleu_and_chrf_are_sacrebleu_sentence_scores() -> None:
    hyp, ref = "The cat sat on the mat.", "The cat is sitting on the mat."
    assert metrics.bleu(hyp, ref, "en") == sacrebleu.sentence_bleu(hyp, [ref]).score
    assert metrics.chrf(hyp, ref) == sacrebleu.sentence_chrf(hyp, [ref]).score
    zh_hyp, zh_ref = "我爱北京天安门。", "我爱北京。"
    assert metrics.bleu(zh_hyp, zh_ref, "zh") == pytest.approx(
        sacrebleu.sentence_bleu(zh_hyp, [zh_ref], tokenize="zh").score)
    # Without zh tokenization the whole sentence would be one word and BLEU 0.
    assert metrics.bleu(zh_hyp, zh_ref, "zh") > 0 == sacrebleu.sentence_bleu(
        zh_hyp, [zh_ref], tokenize="13a").score


def test_rouge_english_is_rouge_score_and_chinese_counts_characters() -> None:
    hyp, ref = "The quick brown fox jumps.", "A quick brown dog jumps over it"
    expected = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"]).score(ref, hyp)
    assert metrics.rouge(hyp, ref, "en") == {k: v.fmeasure for k, v in expected.items()}
    # 我爱北京天安门 vs 我爱北京: 4 common characters, P = 4/7, R = 1; bigrams 3/6 and 3/3.
    got = metrics.rouge("我爱北京天安门", "我爱北京", "zh")
    assert got["rouge1"] == pytest.approx(8 / 11) and got["rougeL"] == pytest.approx(8 / 11)
    assert got["rouge2"] == pytest.approx(2 / 3)


def test_tokens_distinct_and_overlap_by_hand() -> None:
    assert metrics.tokens("我爱Python3！好", "zh") == ["我", "爱", "python3", "好"]
    assert metrics.tokens("Don't stop-me", "en") == ["don", "t", "stop", "me"]
    assert metrics.distinct("the cat the cat", 1, "en") == 2 / 4
    assert metrics.distinct("the cat the cat", 2, "en") == 2 / 3
    assert metrics.distinct("好好学习", 1, "zh") == 3 / 4
    assert metrics.distinct("one", 2, "en") == 0.0
    got = metrics.overlap("a b c d", "a b e", "en")  # 2 common: P 2/4, R 2/3
    assert got == pytest.approx({"precision": 0.5, "recall": 2 / 3, "f1": 4 / 7})
    assert metrics.overlap("x y", "a b", "en") == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert metrics.overlap("体育", "体育新闻", "zh")["recall"] == 0.5


def test_compute_leaves_out_reference_metrics_without_a_reference() -> None:
    names = list(metrics.METRICS)
    assert set(metrics.compute(names, "some answer", " ", "en")) == {"distinct_1", "distinct_2"}
    assert set(metrics.compute(names, "some answer", "the answer", "en")) == {
        c for cols in metrics.METRICS.values() for c in cols}
    with pytest.raises(ValueError, match="unknown metric 'bertscore'"):
        metrics.compute(["bertscore"], "a", "b", "en")
    assert metrics.compute(["distinct"], "the cat the cat", "", "en") == {
        "distinct_1": 2 / 4, "distinct_2": 2 / 3}


# ---------------------------------------------------------------- job-file keys

@pytest.mark.parametrize(("snippet", "message"), [
    ('per = "item"\norder = "both"', 'order must be "given" or, with per = "group", "both"'),
    ('join = { question = "input" }', "join.question must be a table"),
    ('join = { question = { fields = [] } }', "join.question.fields is empty"),
    ('requires = ["nope"]', "requires names nope, which data set"),
])
def test_new_prompt_keys_are_checked(data_dir: Path, tmp_path: Path, snippet: str,
                                     message: str) -> None:
    (tmp_path / "t.txt").write_text("{{question}} {{output_1}} {{output_2}}")
    (tmp_path / "job.toml").write_text(f'''
[[datasets]]
name = "colossalai_en"
[[prompts]]
name = "p"
template = "t.txt"
parser = "pair"
aspects = ["battle"]
{snippet}
[models.j]
spec = "j"
base_url = "http://127.0.0.1:9/v1"
''')
    with pytest.raises(ConfigError, match=re.escape(message)):
        prepare(load_job(tmp_path / "job.toml"), data_dir)


def test_generate_metrics_and_language_are_checked(tmp_path: Path) -> None:
    base = ('[[datasets]]\nname = "colossalai_en"\n[[generate]]\nname = "a"\n'
            'dataset = "colossalai_en"\nmodels = ["c"]\ntemplate = "t.txt"\n{}\n'
            '[[prompts]]\nname = "p"\ntemplate = "t.txt"\nparser = "number"\naspects = ["x"]\n'
            '[models.c]\nspec = "c"\n')
    (tmp_path / "t.txt").write_text("{{question}}")
    for snippet, message in (('metrics = ["bertscore"]', "metrics must list metrics among"),
                             ('metrics = { chat = ["bleu", "x"] }', "metrics.chat must list"),
                             ('language = "fr"', "language must be one of en, zh")):
        (tmp_path / "job.toml").write_text(base.format(snippet))
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_job(tmp_path / "job.toml")


# ---------------------------------------------------------------- end to end

def fake_reply(body: dict[str, Any]) -> str:
    """Candidates answer by model; battles get two scores from the answers' hashes (so most
    questions are decided the same way in both orders) except a few with position bias;
    metric prompts get one digit."""
    system, text = body["messages"][0]["content"], body["messages"][-1]["content"]
    digest = int(hashlib.sha256(text.encode()).hexdigest(), 16)
    if BATTLE_MARK.search(text):
        first, second = answers_in(text)
        if any(q in text for q in BIASED):
            return "8 7\nposition bias"
        return f"{score(first)} {score(second)}\nthe first line holds both scores"
    if "(1-5)" in text or "(1-5)" in system:
        return f"{digest % 5 + 1}"
    return f"answer of {body['model']} to {hashlib.md5(text.encode()).hexdigest()[:6]} " \
           f"question {text[:12]!r}: {digest % 1000}"


def answers_in(text: str) -> tuple[str, str]:
    found = BATTLE_ANSWERS.search(text)
    assert found is not None
    return found.group(1), found.group(2)


def score(answer: str) -> int:
    return 1 + int(hashlib.sha256(answer.encode()).hexdigest(), 16) % 3 * 4  # 1, 5 or 9


@pytest.fixture
def recorded() -> Iterator[tuple[ThreadedServer, list[dict[str, Any]]]]:
    bodies: list[dict[str, Any]] = []

    def reply(body: dict[str, Any]) -> str:
        bodies.append(body)
        return fake_reply(body)

    with ThreadedServer(Script(reply=reply)) as server:
        yield server, bodies


def judge(monkeypatch: pytest.MonkeyPatch, data_dir: Path, *args: Any) -> Result:
    monkeypatch.setenv("JUDGE_DATA_DIR", str(data_dir))
    for key in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "JUDGE_CACHE_DIR"):
        monkeypatch.delenv(key, raising=False)
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("lang", LANGS)
def test_job_runs_end_to_end_with_battles_and_metrics(
        recorded: tuple[ThreadedServer, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch,
        data_dir: Path, tmp_path: Path, lang: str) -> None:
    server, bodies = recorded
    job = ROOT / "jobs" / f"colossalai-{lang}.toml"
    where = ["--base-url", server.url, "--limit", 5, "--cache-dir", tmp_path / "cache"]
    out = tmp_path / "out"

    planned = judge(monkeypatch, data_dir, "plan", job, *where)
    assert planned.exit_code == 0, planned.output
    assert "cand_a (Qwen/Qwen2.5-7B-Instruct): 5 tasks, 0 cached" in planned.output
    assert "10 generated answers are not cached yet" in planned.output

    ran = judge(monkeypatch, data_dir, "run", job, *where, "--model", "fake", "--out", out,
                "--yes", "--rpm", 60000)  # the job's 500 rpm would take 8 s
    assert ran.exit_code == 0, ran.output
    # 10 answers; 5 brainstorming questions x 2 answers x 5 metrics; 5 battles x 2 orders
    assert "70 tasks: 0 cached, 70 called" in ran.output
    assert server.state.requests == 70

    battle_bodies = [b for b in bodies if BATTLE_MARK.search(b["messages"][-1]["content"])]
    texts = Counter(b["messages"][-1]["content"] for b in battle_bodies)
    assert len(battle_bodies) == 10 and set(texts.values()) == {1}  # each order sent once
    by_question: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for text in texts:
        by_question[text.split("\n")[1]].append(answers_in(text))
    for (a1, a2), (b1, b2) in by_question.values():
        assert (a1, a2) == (b2, b1) and a1 != a2  # the same two answers, swapped

    rows = read_csv(out / "battle.csv")
    assert len(rows) == 1
    row = rows[0]
    assert (row["judge"], row["model_a"], row["model_b"]) == ("fake/battle", "cand_a", "cand_b")
    counts = {k: int(row[k]) for k in ("n", "a_wins", "ties", "b_wins", "inconsistent",
                                       "failed")}
    assert counts["a_wins"] + counts["ties"] + counts["b_wins"] + counts["inconsistent"] \
        == counts["n"] == 5 and counts["failed"] == 0
    assert counts == expected_battle(out / "judgments.jsonl")
    assert counts["inconsistent"] >= 1  # question 1's position bias
    assert float(row["inconsistent_rate"]) == counts["inconsistent"] / 5
    assert "## Battles (both orders)" in (out / "report.md").read_text("utf-8")

    scores = read_csv(out / "scores.csv")
    assert {"distinct_1", "distinct_2"} <= set(scores[0])
    assert all(r["distinct_1"] for r in scores if r["dataset"] == "answers")
    board = read_csv(out / "leaderboard.csv")
    assert {(r["judge"], r["model"]) for r in board} == {
        (j, m) for j in ("fake/gpt", "fake/battle") for m in ("cand_a", "cand_b")}
    assert all(r["failed"] == "0" and r["distinct_1"] for r in board)

    rerun = judge(monkeypatch, data_dir, "run", job, *where, "--model", "fake", "--out", out,
                  "--yes")
    assert rerun.exit_code == 0 and server.state.requests == 70  # all from the cache

    # The job's own judges: the answers are cached, so plan counts and prices every judge task.
    planned = judge(monkeypatch, data_dir, "plan", job, *where)
    assert planned.exit_code == 0, planned.output
    assert "gpt35 (openai:gpt-3.5-turbo): 50 tasks, 0 cached" in planned.output
    assert "gpt4 (openai:gpt-4): 10 tasks, 0 cached" in planned.output
    assert re.search(r"^total: ~\$\d+\.\d{4} online, prompt caching ~\$\d+\.\d{4}, batch ~\$"
                     r"\d+\.\d{4}$", planned.output, re.M)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


def expected_battle(path: Path) -> dict[str, int]:
    """The battle counts recomputed from judgments.jsonl: an order = one request key."""
    orders: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for line in path.read_bytes().splitlines():
        j = orjson.loads(line)
        if j["prompt"] == "battle":
            orders[j["group"]][j["key"]][j["system"]] = j["score"]
    counts = Counter({k: 0 for k in ("a_wins", "ties", "b_wins", "inconsistent", "failed")})
    for keys in orders.values():
        outcomes = {"a_wins" if s["cand_a"] > s["cand_b"] else
                    "b_wins" if s["cand_a"] < s["cand_b"] else "ties" for s in keys.values()}
        counts[outcomes.pop() if len(outcomes) == 1 else "inconsistent"] += 1
    return {"n": len(orders), **counts}


def test_battle_skips_groups_with_too_few_members(data_dir: Path) -> None:
    job = load_job(ROOT / "jobs" / "colossalai-en.toml")
    expansion = prepare(job, data_dir, limit=3)
    only_a, _ = expansion.with_generated(
        lambda t: "answer" if t.model == "cand_a" or t.item_id == "1" else None)
    battles = [t for t in only_a.tasks() if t.prompt == "battle"]
    assert [(t.item_id, len(t.members)) for t in battles] == [("1", 2), ("1", 2)]
    assert list(itertools.chain.from_iterable(t.members for t in battles)) == [
        "1:cand_a", "1:cand_b", "1:cand_b", "1:cand_a"]


@pytest.mark.parametrize("lang", LANGS)
def test_generation_count_counts_the_generation_tasks(data_dir: Path, lang: str) -> None:
    """The pool's progress total of a generation stage, counted without rendering a request."""
    expansion = prepare(load_job(ROOT / "jobs" / f"colossalai-{lang}.toml"), data_dir, limit=7)
    count = len(list(expansion.generation_tasks()))
    assert count > 0 and expansion.generation_count() == count
