"""manifest.json's provenance: what the answers a report set uses cost to obtain."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.job.bill import Bill, Price, Tokens
from runner.job.models import parse_model_spec
from runner.job.spec import Job, Limits
from runner.report.provenance import Provenance


def _job(price: Price | None) -> Job:
    model = parse_model_spec("m", name="judge", base_url="http://127.0.0.1:1/v1", price=price)
    return Job(path=Path("j.toml"), name="j", models=(model,), datasets=(), prompts=(),
               output_dir=Path("out"), limits=Limits())


def test_sources_tokens_cost_and_times() -> None:
    p = Provenance()
    p.add("judge", "api", 200.0, Tokens(1000, 0, 0, 10))
    p.add("judge", "api", 100.0, Tokens(1000, 0, 0, 10))
    p.add("judge", "batch:b1", 300.0, Tokens(2000, 0, 0, 20))
    p.add("judge", "batch:b2", None, Tokens(0, 0, 0, 0))
    p.add("judge", "import:study.jsonl", 50.0, Tokens(5000, 0, 0, 50))
    out = p.as_dict(_job(Price(input=1.0, output=2.0)))  # USD per 1M tokens
    assert out["answers"] == {"api": 2, "batch": 2, "import": 1} and out["calls"] == 4
    assert (out["prompt_tokens"], out["completion_tokens"]) == (9000, 90)
    # api: 2000 x 1 + 20 x 2; batch at half price: (2000 x 1 + 20 x 2) / 2; import: none
    assert out["estimated_cost_usd"] == pytest.approx((2040 + 1020) / 1e6)
    assert (out["first_answer"], out["last_answer"]) == ("1970-01-01T00:00:50Z",
                                                         "1970-01-01T00:05:00Z")


def test_an_unpriced_model_makes_the_cost_unknown_and_nothing_makes_it_empty() -> None:
    p = Provenance()
    p.add("judge", "api", 1.0, Tokens(10, 0, 0, 1))
    assert p.as_dict(_job(None))["estimated_cost_usd"] is None
    empty = Provenance().as_dict(_job(None))
    assert empty == {"answers": {}, "calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                     "estimated_cost_usd": 0.0, "bill": Bill().as_dict(),
                     "first_answer": None, "last_answer": None}


def test_the_bill_by_kind_of_token_and_what_caching_and_batching_saved() -> None:
    """Cached input at its price, a cache write at its own, batch at the discount; saved is
    against list price (every prompt token as input, online), and adds up to the difference."""
    p = Provenance()
    p.add("judge", "api", 1.0, Tokens(100_000, 800_000, 100_000, 10_000))
    p.add("judge", "batch:b", 2.0, Tokens(1_000_000, 0, 0, 0))
    price = Price(input=1.0, output=2.0, cached_input=0.1, cache_write=1.25)
    bill = p.as_dict(_job(price))["bill"]
    assert bill["tokens"] == {"input": 1_100_000, "cached_input": 800_000,
                              "cache_write": 100_000, "output": 10_000}
    cost = bill["cost_usd"]
    assert (cost["input"], cost["cached_input"], cost["cache_write"], cost["output"]) == \
        pytest.approx((0.1 + 0.5, 0.08, 0.125, 0.02))
    assert bill["list_usd"] == pytest.approx(1.0 + 0.02 + 1.0)
    assert bill["saved_usd"]["caching"] == pytest.approx(0.8 - 0.08 - 0.025)
    assert bill["saved_usd"]["batching"] == pytest.approx(0.5)
    assert cost["total"] == pytest.approx(
        bill["list_usd"] - bill["saved_usd"]["caching"] - bill["saved_usd"]["batching"])
    unknown = p.as_dict(_job(None))["bill"]
    assert unknown["cost_usd"]["total"] is None and unknown["saved_usd"]["caching"] is None
    assert unknown["tokens"] == bill["tokens"]
