"""manifest.json's provenance: what the answers a report set uses cost to obtain."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.job.providers import Price
from runner.job.spec import Job, Limits, parse_model_spec
from runner.report.provenance import Provenance


def _job(price: Price | None) -> Job:
    model = parse_model_spec("m", name="judge", base_url="http://127.0.0.1:1/v1", price=price)
    return Job(path=Path("j.toml"), name="j", models=(model,), datasets=(), prompts=(),
               output_dir=Path("out"), limits=Limits())


def test_sources_tokens_cost_and_times() -> None:
    p = Provenance()
    p.add("judge", "api", 200.0, (1000, 10))
    p.add("judge", "api", 100.0, (1000, 10))
    p.add("judge", "batch:b1", 300.0, (2000, 20))
    p.add("judge", "batch:b2", None, (0, 0))
    p.add("judge", "import:study.jsonl", 50.0, (5000, 50))
    out = p.as_dict(_job(Price(input=1.0, output=2.0)))  # USD per 1M tokens
    assert out["answers"] == {"api": 2, "batch": 2, "import": 1} and out["calls"] == 4
    assert (out["prompt_tokens"], out["completion_tokens"]) == (9000, 90)
    # api: 2000 x 1 + 20 x 2; batch at half price: (2000 x 1 + 20 x 2) / 2; import: none
    assert out["estimated_cost_usd"] == pytest.approx((2040 + 1020) / 1e6)
    assert (out["first_answer"], out["last_answer"]) == ("1970-01-01T00:00:50Z",
                                                         "1970-01-01T00:05:00Z")


def test_an_unpriced_model_makes_the_cost_unknown_and_nothing_makes_it_empty() -> None:
    p = Provenance()
    p.add("judge", "api", 1.0, (10, 1))
    assert p.as_dict(_job(None))["estimated_cost_usd"] is None
    empty = Provenance().as_dict(_job(None))
    assert empty == {"answers": {}, "calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                     "estimated_cost_usd": 0.0, "first_answer": None, "last_answer": None}
