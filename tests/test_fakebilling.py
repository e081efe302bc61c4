"""Tests for the billing fake (tests/fakebilling.py): it caches and bills prefixes as the
providers document (minimums, 128-token steps, cache_control, a lifetime), and a judge run
with prompt caching is billed cache reads where one without is billed full price."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from scipy.stats import spearmanr

from bench import humanlike
from bench.billing import MODEL, PRICE, bill, conclusions, variant
from runner.data.datasets import Item
from runner.execute.providers import anthropic_body
from runner.execute.store.cache import Cache
from runner.job.load import load_job
from runner.prepare import prepare
from tests.conftest import DATA_DIR, JobWriter
from tests.fakebilling import Biller
from tests.fakeproviders import Fake, ProviderServer, _anthropic
from tests.test_prompt_cache import RUBRIC, make_job, run, tasks


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def chat(text: str, model: str = "gpt-4o") -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


def test_openai_caches_long_prompts_in_128_token_steps_for_a_lifetime() -> None:
    clock = Clock()
    biller = Biller(ttl_s=300, clock=clock)
    rubric = "x" * (1200 * 4)  # 1,200 tokens
    first = biller.openai(chat(rubric + "item one"))
    assert (first.cached, first.input) == (0, first.input) and first.input > 1200
    biller.remember(first)
    again = biller.openai(chat(rubric + "item two"))
    assert again.cached == 1152  # the longest step both share: 1,024 + 128
    clock.now = 301.0  # past the lifetime
    assert biller.openai(chat(rubric + "item three")).cached == 0
    short = Biller()
    usage = short.openai(chat("y" * 4000))
    short.remember(usage)
    assert short.openai(chat("y" * 4000)).cached == 0  # under 1,024 tokens: never cached


def messages(model: str, rubric: str, item: str, marked: bool = True) -> dict[str, object]:
    block: dict[str, object] = {"type": "text", "text": rubric}
    if marked:
        block["cache_control"] = {"type": "ephemeral"}
    return {"model": model, "messages": [{"role": "user", "content": [
        block, {"type": "text", "text": item}]}]}


def test_anthropic_writes_then_reads_a_marked_prefix_over_its_minimum_only() -> None:
    biller = Biller()
    rubric = "r" * (1100 * 4)
    first = biller.anthropic(messages("claude-sonnet-4-5", rubric, "item one"))
    assert (first.written, first.cached, first.input) == (1100, 0, 2)
    biller.remember(first)
    second = biller.anthropic(messages("claude-sonnet-4-5", rubric, "item two"))
    assert (second.written, second.cached) == (0, 1100)
    unmarked = biller.anthropic(messages("claude-sonnet-4-5", rubric, "x", marked=False))
    assert (unmarked.written, unmarked.cached, unmarked.input) == (0, 0, 1100)
    haiku = biller.anthropic(messages("claude-3-5-haiku-latest", rubric, "item"))
    assert (haiku.written, haiku.cached) == (0, 0)  # under Haiku's 2,048
    biller.remember(second)
    assert bill(PRICE, biller.totals) == {  # Sonnet 4.5: $3, $0.30, $3.75, $15 per 1M
        "input": 0.000012, "cached": 0.00033, "written": 0.004125, "output": 0.0,
        "input_all": 0.004467, "total": 0.004467}


@pytest.mark.slow
async def test_a_judge_run_is_billed_cache_reads_only_with_prompt_caching(
        write_job: JobWriter, tmp_path: Path) -> None:
    # Two documents of two summaries each, the document in the prefix; no rate limit announced
    # (the fake's 50 rpm would space the requests). The run's first request goes alone (the
    # breaker's probe); with 4 in flight the other three would go together and the second
    # document's two would both write its prefix (3 writes, 1 read before runner.execute.
    # prefixes): its first goes alone instead, so each document is one write and one read.
    prefix = len("You are a strict judge." + RUBRIC + "Story: \nSummary: " + "Document 0. " * 5)
    for top, want, workers in (("", (2, 2), 1), ("", (2, 2), 4),
                               ("prompt_cache = false", (0, 0), 4)):
        with ProviderServer(Fake(billing=Biller(), latency_s=0.05, announce=False)) as server, \
                Cache(tmp_path / f"{top[:6]}{workers}") as c:
            job = make_job(write_job, "anthropic:claude-sonnet-4-5", server.root + "/v1",
                           top=top, prompt='prefix_until = "output"')
            stats = await run(job, c, concurrency=workers)
            assert stats.api_calls == 4
            billing = server.fake.billing
            assert billing is not None
            # the bench's bill of the fake's totals is the run's own, kind by kind
            usd = bill(PRICE, billing.totals)
            assert [usd[k] for k in ("input", "cached", "written", "output")] == \
                pytest.approx(stats.bill.paid, abs=1e-6)
            assert usd["total"] == pytest.approx(stats.cost, abs=1e-6) and stats.cost > 0
            assert (billing.totals["written"], billing.totals["cached"]) == (
                want[0] * (prefix // 4), want[1] * (prefix // 4))
            record = c.get(tasks(job)[0].key)
            assert record["response"]["usage"]["prompt_tokens"] > prefix // 4


def test_the_bench_variants_keep_the_study_but_its_model_limits_and_caching(
        tmp_path: Path) -> None:
    for cache in (True, False):
        job = load_job(variant(tmp_path, "geval_summeval", "http://127.0.0.1:9", cache=cache))
        assert [p.name for p in job.prompts] == ["greedy"] and job.prompt_cache is cache
        assert job.prompts[0].prefix_until == "summary"
        assert [m.spec for m in job.models] == [MODEL] and job.limits.rpm is None
    lai = load_job(variant(tmp_path, "lai_formality", "http://127.0.0.1:9", cache=True))
    assert [p.name for p in lai.prompts] == ["single", "multi"]


def test_a_stopped_runs_conclusions_are_checked_against_the_full_runs(tmp_path: Path) -> None:
    head = "dataset,aspect,judge,level,method,subset,value,n_groups,n_items,ci_low,ci_high\n"
    rows = {"full": ["d,a,m/j1,sample,spearman,all,0.50,9,9,0.45,0.55",
                     "d,a,m/j2,sample,spearman,all,0.30,9,9,0.25,0.35",
                     "d,a,bleu,sample,spearman,all,0.90,9,9,0.85,0.95",
                     "d,b,m/j1,sample,spearman,all,0.10,9,9,0.05,0.15",
                     "d,b,m/j2,sample,spearman,all,0.20,9,9,0.15,0.25",
                     "d,c,m/j1,sample,spearman,all,0.20,9,9,0.15,0.25"],
            "stopped": ["d,a,m/j1,sample,spearman,all,0.48,3,3,0.40,0.56",  # holds 0.50
                        "d,a,m/j2,sample,spearman,all,0.31,3,3,0.26,0.36",  # holds 0.30
                        "d,a,bleu,sample,spearman,all,0.90,9,9,0.85,0.95",  # a metric: out
                        "d,a,m/j2,sample,spearman,pos,0.90,3,3,0.00,0.10",  # not all items
                        "d,b,m/j1,sample,spearman,all,0.30,3,3,0.25,0.35",  # misses 0.10
                        "d,b,m/j2,sample,spearman,all,0.20,3,3,,",  # no CI: left out
                        "d,c,m/j1,sample,spearman,all,0.20,3,3,0.10,0.30"]}  # one judge
    for name, lines in rows.items():
        (tmp_path / name / "job").mkdir(parents=True)
        (tmp_path / name / "job" / "correlations.csv").write_text(head + "\n".join(lines))
    assert conclusions(tmp_path / "full", tmp_path / "stopped") == {
        "cis": 4, "full_inside": 3, "rankings": 1, "same_first": 1}


def test_the_bench_judge_answers_as_the_papers_judges_at_the_same_bill(tmp_path: Path) -> None:
    # Lai et al.: the recorded ChatGPT answer of each output, by prompt; the bill (the fake's
    # output tokens) is the default answer's
    job = variant(tmp_path, "lai_formality", "http://127.0.0.1:9", cache=True)
    reply, expansion = humanlike.replies(job, 18), prepare(load_job(job), DATA_DIR, limit=18)
    for task in expansion.tasks():
        body = orjson.loads(anthropic_body(task.body, task.prefix))  # as the run sends it
        answer = _anthropic(body, reply)
        assert answer["usage"] == _anthropic(body)["usage"]
        label = "Score" if task.prompt == "single" else task.aspect.title()
        text = "".join(block["text"] for block in answer["content"])
        assert [float(x) for x in re.findall(rf"(?m)^{label}: (\S+)$", text)] == [
            expansion.index[(task.dataset, m)].metrics[task.aspect][
                humanlike.RECORDED[task.prompt]] for m in task.members]


def test_the_bench_judge_agrees_with_summevals_experts_as_g_eval_4_did(tmp_path: Path) -> None:
    job = load_job(variant(tmp_path, "geval_summeval", "http://127.0.0.1:9", cache=True))
    groups: dict[str, list[Item]] = {}
    for item in prepare(job, DATA_DIR, limit=None).items["summeval"]:
        groups.setdefault(item.group, []).append(item)
    for aspect, paper in humanlike.GEVAL4_SPEARMAN.items():
        values = []
        for items in groups.values():
            judged = [humanlike.geval_score(it, aspect, it.item_id.encode()) for it in items]
            assert set(judged) <= set(range(1, humanlike.GEVAL_SCALE[aspect] + 1))
            if len(set(judged)) > 1 and len({it.human[aspect] for it in items}) > 1:
                values.append(spearmanr(judged, [it.human[aspect] for it in items])[0])
        assert abs(sum(values) / len(values) - paper) < 0.04, aspect
