"""The bill of two published studies, sent several ways, against a fake that bills prompt
caching as Anthropic and OpenAI do (tests/fakebilling.py behind tests/fakeproviders.py, in a
thread).

Studies: jobs/geval-summeval.toml (G-Eval on SummEval, its `greedy` prompt: the Messages API
has neither n = 20 nor logprobs for the other two; all 1,600 items = 100 documents x 16
summaries, the first 64 with --quick) and jobs/tst-formality.toml (Lai et al. formality, both
prompts, every group; 180 items with --quick), each judged by `anthropic:claude-sonnet-4-5`
and by `openai:gpt-4.1`. Rows:

- (a) `cookbook`: what the OpenAI cookbook's parallel processor sends: every rendered request
  once, duplicates included, in the job's order, no cache_control (anthropic_body without a
  prefix), a plain loop of the job's concurrency over one aiohttp session, in this process;
- (b) `online`: `judge run` with `prompt_cache = false` (a process);
- (c) `online_cached`: `judge run` with prompt caching (the default);
- (d) `batch`: (b)'s billed tokens at the Batch API's discount (the table's, 50%), computed,
  not run: a real batch takes minutes to a day, so its wall time is not measured;
- (e) `until_ci`: `judge run --until-ci 0.1` with prompt caching, and whether its conclusions
  are the full run's (c) (`conclusions`), and the lines it printed last (`verdicts`: each
  judge's reason to stop, n and widest CI); a study whose job --until-ci refuses
  (check_until_ci) would say so (`refused`); (e') `until_ci_wide`: the same at W = 0.2, a
  width these studies can reach (their widest CI over all the data is 0.11-0.16);
- `openai_cookbook`, `openai_online`, `openai_batch`: (a), (b) and (d) with gpt-4.1, whose
  caching is automatic (a prompt of 1,024 tokens or more, in 128-token steps), so (b) is a
  plain `judge run`.

Each row gets a fresh fake (an empty provider cache) and a fresh judge cache. The fake answers
after LATENCY_S, as a judge that agrees with the humans as the papers' judges did
(bench/humanlike.py: Lai et al.'s recorded ChatGPT answers; G-Eval's expert means plus noise
for G-Eval-4's Spearman), so (e) meets a real study's CIs; (c)'s `sample_level` says how well
it agreed. Figures: requests, tokens by kind, USD by kind at the provider table's price
(runner.job.providers: the prices `judge run` bills, read on the date the table names), wall
seconds (`judge run`: the whole process, interpreter start and reports with 1,000 bootstrap
resamples included), `calls_s` (the fake's clock, first request to last answer: the calls
alone), and each row's input cost, total cost and times over (a)'s.
"""

from __future__ import annotations

import asyncio
import csv
import json
import math
import os
import re
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from bench import common, humanlike
from runner.errors import ConfigError
from runner.execute.providers import anthropic_body
from runner.job.bill import PRICES_READ, Price, Tokens
from runner.job.load import load_job
from runner.job.providers import SOURCES, price_of
from runner.prepare import prepare
from runner.session.select import check_until_ci
from tests.fakebilling import Biller
from tests.fakeproviders import Fake, ProviderServer

MODEL = "anthropic:claude-sonnet-4-5"
OPENAI_MODEL = "openai:gpt-4.1"
# The project's one price table (runner/job/providers.py), as `judge run` bills: cost by kind
PRICES = {MODEL: price_of("anthropic", "claude-sonnet-4-5"),
          OPENAI_MODEL: price_of("openai", "gpt-4.1")}
PRICE = PRICES[MODEL]
assert PRICE is not None and PRICES[OPENAI_MODEL] is not None
UNTIL_CI = 0.1
UNTIL_CI_WIDE = 0.2  # a W these studies can reach: their widest CI over all data is 0.11-0.16
LATENCY_S = 0.1
TIMEOUT_S = 600.0
STUDIES = {  # name: (job file, prompts kept, --limit, --limit with --quick)
    # all 1,600 items (800 until 2026-11-27): does --until-ci stop early on the real study
    "geval_summeval": ("geval-summeval.toml", ("greedy",), None, 64),
    "lai_formality": ("tst-formality.toml", ("single", "multi"), None, 180),
}


def variant(work: Path, name: str, url: str, *, cache: bool, model: str = MODEL) -> Path:
    """The study's job file for the bench: its prompts that Anthropic can send, the bench's
    `model` at `url`, no rate limits (the fake has none), prompt caching on or off."""
    job, kept, _, _ = STUDIES[name]
    text = (common.ROOT / "jobs" / job).read_text().replace("../prompts/",
                                                           f"{common.ROOT}/prompts/")
    head, *prompts = text.split("\n[models.")[0].split("\n[[prompts]]")
    head = re.sub(r"(?m)^(rpm|tpm) = .*$", "", head)
    body = "".join("\n[[prompts]]" + p for p in prompts
                   if re.search(r'(?m)^name = "(' + "|".join(kept) + ')"', p))
    path = work / f"{name}-{model.split(':')[0]}-{'cached' if cache else 'plain'}.toml"
    path.write_text(("" if cache else "prompt_cache = false\n") + head + body +
                    f'\n[models.judge]\nspec = "{model}"\nbase_url = "{url}/v1"\n')
    return path


async def _cookbook(job_path: Path, limit: int | None, url: str) -> int:
    """(a): every rendered request, in order, duplicates included, no cache marker."""
    job = load_job(job_path)
    expansion = prepare(job, Path(os.environ["JUDGE_DATA_DIR"]), limit=limit)
    anthropic = job.models[0].spec.startswith("anthropic:")
    bodies = iter([anthropic_body(t.body) if anthropic else t.body
                   for t in expansion.tasks()])
    route, headers = ("messages", {"x-api-key": "k", "anthropic-version": "2023-06-01"}) \
        if anthropic else ("chat/completions", {"authorization": "Bearer k"})
    sent = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        for body in bodies:
            async with session.post(f"{url}/v1/{route}", data=body, headers={
                    "content-type": "application/json", **headers}) as response:
                await response.read()
                assert response.status == 200, response.status
            sent += 1

    async with aiohttp.ClientSession() as session, asyncio.timeout(TIMEOUT_S):
        await asyncio.gather(*(worker(session) for _ in range(job.limits.concurrency)))
    return sent


def bill(price: Price, totals: dict[str, int], *, batch: bool = False) -> dict[str, float]:
    """The fake's token totals in USD at the table's `price`, by kind and in all.

    Args:
        price: the model's row of the provider table.
        totals: the biller's totals (input, cached, written, output).
        batch: at the price's Batch API discount.

    Returns:
        USD by kind (the biller's names), "input_all" (the three input kinds) and "total".
    """
    kinds = ("input", "cached", "written", "output")
    usd = {kind: round(price.cost(Tokens(**{field: totals[kind]}), batch=batch), 6)
           for kind, field in zip(kinds, Tokens._fields, strict=True)}
    usd["input_all"] = round(usd["input"] + usd["cached"] + usd["written"], 6)
    usd["total"] = round(usd["input_all"] + usd["output"], 6)
    return usd


def _row(biller: Biller, seconds: float, price: Price, batch: bool = False) -> dict[str, Any]:
    usd = bill(price, biller.totals, batch=batch)
    return {"requests": biller.totals["requests"], "tokens": dict(biller.totals),
            "usd": usd, "seconds": round(seconds, 2),
            "calls_s": round(biller.span[1] - biller.span[0], 2) if biller.span else 0.0}


def _judge_run(work: Path, job: Path, limit: int | None, tag: str, *extra: str) -> float:
    args = [common.JUDGE, "run", str(job), "--cache-dir", str(work / f"cache-{tag}"), "--out",
            str(work / f"out-{tag}"), "--yes", "--max-retries", "0", *extra]
    child = common.run_child(args + (["--limit", str(limit)] if limit else []), cwd=work,
                             timeout_s=TIMEOUT_S)
    if child.exit_code != 0:
        raise RuntimeError(f"judge run {tag}: exit {child.exit_code}: {child.stderr[-800:]}")
    return child.seconds


# (row, model, prompt caching, extra `judge run` arguments); the cookbook's row is not a run
ROWS = (("cookbook", MODEL, False, ()), ("online", MODEL, False, ()),
        ("online_cached", MODEL, True, ()),
        ("until_ci", MODEL, True, ("--until-ci", str(UNTIL_CI))),
        ("until_ci_wide", MODEL, True, ("--until-ci", str(UNTIL_CI_WIDE))),
        ("openai_cookbook", OPENAI_MODEL, False, ()),
        ("openai_online", OPENAI_MODEL, True, ()))


def _correlations(out: Path) -> dict[tuple[str, ...], tuple[float, float, float]]:
    """A run's LLM judges' correlations over all items: (dataset, aspect, level, method,
    judge) -> (value, CI low, CI high); cells without a figure left out, and the data's metric
    columns (no `model/prompt` name): they cover every item whether the run stopped or not."""
    found: dict[tuple[str, ...], tuple[float, float, float]] = {}
    with next(out.glob("*/correlations.csv")).open(newline="") as f:
        for r in csv.DictReader(f):
            try:
                figures = (float(r["value"]), float(r["ci_low"]), float(r["ci_high"]))
            except ValueError:
                continue
            if r["subset"] == "all" and "/" in r["judge"] and \
                    not any(math.isnan(x) for x in figures):
                found[(r["dataset"], r["aspect"], r["level"], r["method"], r["judge"])] = figures
    return found


def conclusions(full: Path, stopped: Path) -> dict[str, int]:
    """Whether a stopped run says what the full one does.

    Args:
        full: the full run's --out folder.
        stopped: the --until-ci run's.

    Returns:
        `cis`: the stopped run's CIs; `full_inside`: how many hold the full run's figure;
        `rankings`: the (dataset, aspect, level, method) cells with two judges or more;
        `same_first`: how many rank the same judge first.
    """
    whole, cut = _correlations(full), _correlations(stopped)
    inside = sum(lo <= whole[k][0] <= hi for k, (_, lo, hi) in cut.items() if k in whole)

    def first(found: dict[tuple[str, ...], tuple[float, float, float]]) -> dict[Any, str]:
        best: dict[Any, list[tuple[float, str]]] = {}
        for (*cell, judge), (value, _, _) in found.items():
            best.setdefault(tuple(cell), []).append((value, judge))
        return {cell: max(ranked)[1] for cell, ranked in best.items() if len(ranked) > 1}

    ranked_full, ranked_cut = first(whole), first(cut)
    return {"cis": len(cut), "full_inside": inside, "rankings": len(ranked_cut),
            "same_first": sum(ranked_full.get(c) == j for c, j in ranked_cut.items())}


def _one(work: Path, name: str, limit: int | None, row: str) -> dict[str, Any]:
    """One row of a study against a fresh billing fake."""
    _, model, cache, extra = next(r for r in ROWS if r[0] == row)
    with ProviderServer(Fake(latency_s=LATENCY_S, billing=Biller(), announce=False)) as server:
        job = variant(work, name, server.root, cache=cache, model=model)
        server.fake.reply = humanlike.replies(job, limit)
        started = time.perf_counter()
        if row.endswith("cookbook"):
            asyncio.run(_cookbook(job, limit, server.root))
            seconds = time.perf_counter() - started
        else:
            seconds = _judge_run(work, job, limit, f"{name}-{row}", *extra)
        assert server.fake.billing is not None
        price = PRICES[model]
        assert price is not None
        figures = _row(server.fake.billing, seconds, price)
        if row.endswith("online"):  # (d): its tokens through a Batch API, computed
            figures["batch"] = {**_row(server.fake.billing, 0.0, price, batch=True),
                                "seconds": None, "calls_s": None, "computed": True}
        return figures


def _ratios(rows: dict[str, Any], base: dict[str, Any]) -> None:
    for figures in rows.values():
        if "refused" in figures:
            continue
        figures["input_cost_over_cookbook"] = round(
            figures["usd"]["input_all"] / base["usd"]["input_all"], 3)
        figures["cost_over_cookbook"] = round(figures["usd"]["total"] / base["usd"]["total"], 3)
        if figures["seconds"] is not None:
            figures["seconds_over_cookbook"] = round(figures["seconds"] / base["seconds"], 3)
            figures["calls_s_over_cookbook"] = round(figures["calls_s"] / base["calls_s"], 3)


def study(work: Path, name: str, quick: bool) -> dict[str, Any]:
    """The rows of one study, each provider's with their ratios to its (a)."""
    limit = STUDIES[name][3] if quick else STUDIES[name][2]
    try:
        job = load_job(variant(work, name, "http://127.0.0.1:9", cache=True))
        check_until_ci(replace(job, limits=replace(job.limits, until_ci=UNTIL_CI)),
                       sharded=False, batch=False)
        refused = None
    except ConfigError as exc:
        refused = str(exc).split(" cannot run with ")[-1].split(";")[0]
    rows: dict[str, Any] = {}
    for row, *_ in ROWS:
        rows[row] = {"refused": refused} if row.startswith("until_ci") and refused else \
            _one(work, name, limit, row)
        if "batch" in rows[row]:
            rows[row.replace("online", "batch")] = rows[row].pop("batch")
    for row in ("until_ci", "until_ci_wide") if not refused else ():
        rows[row]["calls_over_online"] = round(
            rows[row]["requests"] / rows["online"]["requests"], 3)
        rows[row]["conclusions"] = conclusions(
            work / f"out-{name}-online_cached", work / f"out-{name}-{row}")
        manifest = next((work / f"out-{name}-{row}").glob("*/manifest.json"))
        rows[row]["verdicts"] = json.loads(manifest.read_bytes())["until_ci"]
    rows["online_cached"]["sample_level"] = {  # how well the fake judge agrees (humanlike)
        "/".join((aspect, method, judge)): round(value, 3) for (_, aspect, level, method, judge),
        (value, _, _) in _correlations(work / f"out-{name}-online_cached").items()
        if level == "sample"}
    _ratios({k: v for k, v in rows.items() if not k.startswith("openai")}, rows["cookbook"])
    _ratios({k: v for k, v in rows.items() if k.startswith("openai")}, rows["openai_cookbook"])
    return {"limit": limit, "rows": rows}


def headline(studies: dict[str, Any]) -> dict[str, Any]:
    """The figures bench/run.py's table shows beside (c)'s: OpenAI's online input cost over its
    cookbook's, and --until-ci's calls over (b)'s on each study (None where refused)."""
    rows = {name: s["rows"] for name, s in studies.items()}
    return {"geval_openai_input_over_cookbook":
            rows["geval_summeval"]["openai_online"]["input_cost_over_cookbook"],
            "lai_openai_input_over_cookbook":
            rows["lai_formality"]["openai_online"]["input_cost_over_cookbook"],
            "geval_until_ci_calls_over_online":
            rows["geval_summeval"]["until_ci"].get("calls_over_online"),
            "lai_until_ci_calls_over_online":
            rows["lai_formality"]["until_ci"].get("calls_over_online"),
            "geval_until_ci_wide_calls_over_online":
            rows["geval_summeval"]["until_ci_wide"].get("calls_over_online"),
            "lai_until_ci_wide_calls_over_online":
            rows["lai_formality"]["until_ci_wide"].get("calls_over_online")}


def prompt_caching(work: Path, quick: bool) -> dict[str, Any]:
    """The benchmark (`make bench`, `--only billing`): both studies; passes when (c)'s input
    cost is at most half (a)'s on every study (issue 35's goal)."""
    os.environ.setdefault("ANTHROPIC_API_KEY", "sk-ant-bench-fake")  # the fake takes any key
    os.environ.setdefault("OPENAI_API_KEY", "sk-bench-fake")
    os.environ.setdefault("JUDGE_DATA_DIR", str(common.ROOT.parent / "shared" / "datasets"))
    studies = {name: study(work, name, quick) for name in STUDIES}
    ratios = {name: s["rows"]["online_cached"]["input_cost_over_cookbook"]
              for name, s in studies.items()}
    return {"models": list(PRICES), "price_usd_per_mtok": {spec: {
                "input": p.input, "cached_input": p.cached_input, "cache_write": p.cache_write,
                "output": p.output, "batch_discount": p.batch_discount}
                for spec, p in PRICES.items() if p is not None},
            "prices_read": PRICES_READ,
            "price_sources": [SOURCES["anthropic"], SOURCES["openai"]],
            "latency_s": LATENCY_S, "until_ci": UNTIL_CI, "until_ci_wide": UNTIL_CI_WIDE,
            "studies": studies,
            "cached_input_over_cookbook": ratios,
            "geval_cached_input_over_cookbook": ratios["geval_summeval"],
            "lai_cached_input_over_cookbook": ratios["lai_formality"],
            **headline(studies),
            "pass": all(r <= 0.5 for r in ratios.values())}
