"""The bill of two published studies, sent four ways, against a fake that bills prompt
caching as Anthropic does (tests/fakebilling.py behind tests/fakeproviders.py, in a thread).

Studies: jobs/geval-summeval.toml (G-Eval on SummEval, its `greedy` prompt: the Messages API
has neither n = 20 nor logprobs for the other two; all 1,600 items = 100 documents x 16
summaries, the first 64 with --quick) and jobs/tst-formality.toml (Lai et al. formality, both
prompts, every group; 180 items with --quick), each judged by `anthropic:claude-sonnet-4-5`.
Rows:

- (a) `cookbook`: what the OpenAI cookbook's parallel processor sends: every rendered request
  once, duplicates included, in the job's order, no cache_control (anthropic_body without a
  prefix), a plain loop of the job's concurrency over one aiohttp session, in this process;
- (b) `online`: `judge run` with `prompt_cache = false` (a process);
- (c) `online_cached`: `judge run` with prompt caching (the default);
- (d) `batch`: (b)'s billed tokens at the Message Batches discount (50%), computed, not run: a
  real batch takes minutes to a day, so its wall time is not measured.
- (e) `--until-ci 0.1` is not measured: it is not on main yet.

Each row gets a fresh fake (an empty provider cache) and a fresh judge cache. The fake answers
after LATENCY_S. Figures: requests, tokens by kind, USD by kind at the provider table's price
(runner.job.providers: the prices `judge run` bills, read on the date the table names), wall
seconds (`judge run`: the whole process, interpreter start and reports with 1,000 bootstrap
resamples included), `calls_s` (the fake's clock, first request to last answer: the calls
alone), and each row's input cost, total cost and times over (a)'s.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import common
from runner.execute.providers import anthropic_body
from runner.job.load import load_job
from runner.job.providers import PRICES_READ, SOURCES, Price, Tokens, price_of
from runner.prepare import prepare
from tests.fakebilling import Biller
from tests.fakeproviders import Fake, ProviderServer

MODEL = "anthropic:claude-sonnet-4-5"
# The project's one price table (runner/job/providers.py), as `judge run` bills: cost by kind
PRICE = price_of("anthropic", "claude-sonnet-4-5")
assert PRICE is not None
LATENCY_S = 0.1
TIMEOUT_S = 600.0
STUDIES = {  # name: (job file, prompts kept, --limit, --limit with --quick)
    "geval_summeval": ("geval-summeval.toml", ("greedy",), None, 64),
    "lai_formality": ("tst-formality.toml", ("single", "multi"), None, 180),
}


def variant(work: Path, name: str, url: str, *, cache: bool) -> Path:
    """The study's job file for the bench: its prompts that Anthropic can send, the bench's
    model at `url`, no rate limits (the fake has none), prompt caching on or off."""
    job, kept, _, _ = STUDIES[name]
    text = (common.ROOT / "jobs" / job).read_text().replace("../prompts/",
                                                           f"{common.ROOT}/prompts/")
    head, *prompts = text.split("\n[models.")[0].split("\n[[prompts]]")
    head = re.sub(r"(?m)^(rpm|tpm) = .*$", "", head)
    body = "".join("\n[[prompts]]" + p for p in prompts
                   if re.search(r'(?m)^name = "(' + "|".join(kept) + ')"', p))
    path = work / f"{name}-{'cached' if cache else 'plain'}.toml"
    path.write_text(("" if cache else "prompt_cache = false\n") + head + body +
                    f'\n[models.claude]\nspec = "{MODEL}"\nbase_url = "{url}/v1"\n')
    return path


async def _cookbook(job_path: Path, limit: int | None, url: str) -> int:
    """(a): every rendered request, in order, duplicates included, no cache marker."""
    job = load_job(job_path)
    expansion = prepare(job, Path(os.environ["JUDGE_DATA_DIR"]), limit=limit)
    bodies = iter([anthropic_body(t.body) for t in expansion.tasks()])
    sent = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        for body in bodies:
            async with session.post(f"{url}/v1/messages", data=body, headers={
                    "content-type": "application/json", "x-api-key": "k",
                    "anthropic-version": "2023-06-01"}) as response:
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


def _row(biller: Biller, seconds: float, batch: bool = False) -> dict[str, Any]:
    usd = bill(PRICE, biller.totals, batch=batch)
    return {"requests": biller.totals["requests"], "tokens": dict(biller.totals),
            "usd": usd, "seconds": round(seconds, 2),
            "calls_s": round(biller.span[1] - biller.span[0], 2) if biller.span else 0.0}


def _judge_run(work: Path, job: Path, limit: int | None, tag: str) -> float:
    args = [common.JUDGE, "run", str(job), "--cache-dir", str(work / f"cache-{tag}"), "--out",
            str(work / f"out-{tag}"), "--yes", "--max-retries", "0"]
    child = common.run_child(args + (["--limit", str(limit)] if limit else []), cwd=work,
                             timeout_s=TIMEOUT_S)
    if child.exit_code != 0:
        raise RuntimeError(f"judge run {tag}: exit {child.exit_code}: {child.stderr[-800:]}")
    return child.seconds


def study(work: Path, name: str, quick: bool) -> dict[str, Any]:
    """The four rows of one study, with their ratios to (a)."""
    limit = STUDIES[name][3] if quick else STUDIES[name][2]
    rows: dict[str, Any] = {}
    for row in ("cookbook", "online", "online_cached"):
        with ProviderServer(Fake(latency_s=LATENCY_S, billing=Biller(),
                                 announce=False)) as server:
            job = variant(work, name, server.root, cache=row == "online_cached")
            started = time.perf_counter()
            if row == "cookbook":
                asyncio.run(_cookbook(job, limit, server.root))
                seconds = time.perf_counter() - started
            else:
                seconds = _judge_run(work, job, limit, f"{name}-{row}")
            assert server.fake.billing is not None
            rows[row] = _row(server.fake.billing, seconds)
            if row == "online":
                rows["batch"] = {**_row(server.fake.billing, 0.0, batch=True),
                                 "seconds": None, "calls_s": None, "computed": True}
    base = rows["cookbook"]
    for figures in rows.values():
        figures["input_cost_over_cookbook"] = round(
            figures["usd"]["input_all"] / base["usd"]["input_all"], 3)
        figures["cost_over_cookbook"] = round(figures["usd"]["total"] / base["usd"]["total"], 3)
        if figures["seconds"] is not None:
            figures["seconds_over_cookbook"] = round(figures["seconds"] / base["seconds"], 3)
            figures["calls_s_over_cookbook"] = round(figures["calls_s"] / base["calls_s"], 3)
    return {"limit": limit, "rows": rows}


def prompt_caching(work: Path, quick: bool) -> dict[str, Any]:
    """The benchmark (`make bench`, `--only billing`): both studies; passes when (c)'s input
    cost is at most half (a)'s on every study (issue 35's goal)."""
    os.environ.setdefault("ANTHROPIC_API_KEY", "sk-ant-bench-fake")  # the fake takes any key
    os.environ.setdefault("JUDGE_DATA_DIR", str(common.ROOT.parent / "shared" / "datasets"))
    studies = {name: study(work, name, quick) for name in STUDIES}
    ratios = {name: s["rows"]["online_cached"]["input_cost_over_cookbook"]
              for name, s in studies.items()}
    return {"model": MODEL, "price_usd_per_mtok": {
                "input": PRICE.input, "cached_input": PRICE.cached_input,
                "cache_write": PRICE.cache_write, "output": PRICE.output},
            "batch_discount": PRICE.batch_discount, "prices_read": PRICES_READ,
            "price_source": SOURCES["anthropic"],
            "latency_s": LATENCY_S, "studies": studies,
            "cached_input_over_cookbook": ratios,
            "geval_cached_input_over_cookbook": ratios["geval_summeval"],
            "lai_cached_input_over_cookbook": ratios["lai_formality"],
            "until_ci": "not measured: --until-ci is not on main",
            "pass": all(r <= 0.5 for r in ratios.values())}
