"""The provider table (runner.job.providers): every kind has a row, a kind without one is an
error, cache keys are those of the code before the table, prices are in nothing hashed."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner import expand, tasks
from runner.errors import ConfigError
from runner.estimate import estimate_cost, model_price
from runner.execute.providers import provider
from runner.job import spec
from runner.job.bill import Price, Tokens
from runner.job.load import load_job
from runner.job.models import parse_model_spec
from runner.job.providers import KINDS, SOURCES, cache_minimum, price_of
from runner.job.spec import ModelSpec
from runner.prepare import prepare
from tests.conftest import JobWriter

JOB = """
[[datasets]]
name = "mine"
path = "data.jsonl"
fields = { id = "id", text = { output = "output" }, human = { overall = "score" } }

[[prompts]]
name = "p"
template = "Rate {{aspect}}: {{output}}"
system = "You judge."
parser = "number"
aspects = ["overall"]

[models.oa]
spec = "openai:gpt-4o-mini"
[models.an]
spec = "anthropic:claude-3-5-haiku-20241022"
[models.ge]
spec = "gemini:gemini-2.0-flash"
[models.az]
spec = "azure:my-deploy"
base_url = "https://me.openai.azure.com"
[models.co]
spec = "judge-c"
base_url = "http://127.0.0.1:9/v1"
[models.lo]
spec = "local:smollm2"
[models.fl]
spec = "anthropic:claude-3-5-haiku-20241022"
endpoints = [{base_url = "http://127.0.0.1:9/v1"}, {base_url = "http://127.0.0.2:9/v1"}]
"""
# The keys of JOB's tasks as main's code before the provider table computed them (commit
# 9ad8062, the same job expanded there): one model of every kind, and a fleet.
KEYS_BEFORE = {
    "oa": "1bd5774948e7cbe47c5de50a78d8dc1ed2631643d22e4ba3158465d915933647",
    "an": "bc0cad99daeeab1d1010e924755935d150a20fd0c2040401f5dc1762e6a56d3f",
    "ge": "007359c96695cc86bcac20c5e0a1742f37a0124dc8304b682a8b6cd326087f85",
    "az": "dff15ef52e69e0cd527673db68e032fb3d60cd58cb4a46577b4f40533073a495",
    "co": "fb1706a90c984cac61957e10f36cc5c8b062bb6ae0ccad5c9cc374b940ebf230",
    "lo": "63892d7e9a991859c78b54c228b4f5dccd4eb5780578f4f70b734b2005cc2775",
    "fl": "a074ddcafaf70e9d03eba7a3008604ae5d7479ee010d117528b56cce1a3d6d43",
}
ROWS = [{"id": "a", "output": "x", "score": 1}]


def _job(write_job: JobWriter, extra: str = "") -> Path:
    return write_job(JOB + extra, rows=ROWS)


def test_cache_keys_are_those_of_the_code_before_the_table(write_job: JobWriter) -> None:
    exp = prepare(load_job(_job(write_job)), Path())
    assert {t.model: t.key for t in exp.tasks()} == KEYS_BEFORE


def test_every_kind_a_spec_can_make_has_a_row() -> None:
    specs = ["openai:m", "anthropic:m", "gemini:m", "local:m", "bare-model"]
    kinds = {parse_model_spec(s, base_url="http://127.0.0.1:9/v1").kind for s in specs}
    kinds.add(parse_model_spec("azure:d", base_url="https://x.openai.azure.com").kind)
    assert kinds == set(KINDS)


def test_a_kind_without_a_row_is_an_error() -> None:
    """A new provider left out of the table does not share `openai:`'s cache keys silently:
    its identity, its URL and its price all refuse it, naming the table."""
    model = ModelSpec(name="m", spec="mistral:small", model="small", kind="mistral",
                      base_url="https://api.mistral.ai/v1")
    for look in (lambda: model.endpoint, lambda: provider("mistral", "https://x/v1"),
                 lambda: estimate_cost(model, 10, 10)):
        with pytest.raises(ConfigError, match=r"'mistral' has no row .*runner/job/providers"):
            look()


def test_every_kind_has_prices_or_an_explicit_unknown() -> None:
    """A provider with a public price page lists its models; the others say what an unlisted
    model costs (local: free) or that it is unknown, and unknown stays None, never 0."""
    for kind, r in KINDS.items():
        if kind in SOURCES:
            assert r.prices, kind
            for name, price in r.prices.items():
                assert 0 < price.input and 0 < price.output, (kind, name)
                assert (price.cached_input or price.input) <= price.input, (kind, name)
                assert (price.cache_write or price.input) >= price.input, (kind, name)
        else:
            assert not r.prices and kind in ("compatible", "local"), kind
    assert price_of("compatible", "llama3") is None and price_of("openai", "gpt-9") is None
    assert price_of("local", "smollm2") == Price(input=0.0, output=0.0)
    bare = parse_model_spec("llama3", base_url="http://127.0.0.1:9/v1")
    assert estimate_cost(bare, 1000, 1000) is None


def test_a_dated_snapshot_takes_its_models_price() -> None:
    haiku = KINDS["anthropic"].prices["claude-3-5-haiku"]
    assert price_of("anthropic", "claude-3-5-haiku-20241022") is haiku
    assert price_of("anthropic", "claude-3-5-haiku-latest") is haiku
    assert price_of("openai", "gpt-4o-mini-2024-07-18") is KINDS["openai"].prices["gpt-4o-mini"]
    assert price_of("openai", "gpt-4o-2024-05-13") == Price(input=5.0, output=15.0)
    assert price_of("openai", "gpt-4-32k") is None  # not a snapshot of gpt-4
    assert cache_minimum("anthropic", "claude-3-5-haiku-20241022") == 2048
    assert cache_minimum("anthropic", "claude-sonnet-4-20250514") == 1024
    assert cache_minimum("compatible", "x") is None


def test_cost_by_kind_of_token() -> None:
    """Anthropic's rule: a write at 1.25x input, a read at 0.1x; batch halves everything."""
    sonnet = price_of("anthropic", "claude-sonnet-4-5")
    assert sonnet is not None
    tokens = Tokens(input=1_000_000, cached_input=1_000_000, cache_write=1_000_000,
                    output=1_000_000)
    assert sonnet.cost(tokens) == pytest.approx(3.0 + 0.3 + 3.75 + 15.0)
    assert sonnet.cost(tokens, batch=True) == pytest.approx((3.0 + 0.3 + 3.75 + 15.0) / 2)
    plain = Price(input=2.0, output=4.0)  # no cached price: a cached token is an input token
    assert plain.cost(Tokens(0, 1_000_000, 0, 0)) == pytest.approx(2.0)


def test_the_jobs_price_overrides_every_field(write_job: JobWriter) -> None:
    path = write_job(JOB.replace('spec = "openai:gpt-4o-mini"', 'spec = "openai:gpt-4o-mini"\n'
                                 'price = {input = 1, output = 2, cached_input = 0.25}\n'
                                 'batch_discount = 0.4'), rows=ROWS)
    job = load_job(path)
    oa = next(m for m in job.models if m.name == "oa")
    assert model_price(oa) == Price(input=1.0, output=2.0, cached_input=0.25,
                                    batch_discount=0.4)
    an = next(m for m in job.models if m.name == "an")
    assert model_price(an) is KINDS["anthropic"].prices["claude-3-5-haiku"]
    bad = write_job(JOB.replace('spec = "judge-c"', 'spec = "judge-c"\n'
                                'price = {input = 1, output = -2}'), rows=ROWS)
    with pytest.raises(ConfigError, match=r"models\.co\.price\.output must be a price"):
        load_job(bad)


def test_prices_are_in_nothing_hashed(write_job: JobWriter,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Editing a price, in the job or in the table, keeps every key and the key index's
    fingerprint (before the table, the job's price was part of the fingerprint and the table
    sat in expand.py, whose source is digested)."""
    plain = prepare(load_job(_job(write_job)), Path())
    priced = prepare(load_job(write_job(JOB.replace(
        'spec = "judge-c"', 'spec = "judge-c"\nprice = {input = 1, output = 2}'), rows=ROWS)),
        Path())
    assert [t.key for t in priced.tasks()] == [t.key for t in plain.tasks()]
    assert priced.fingerprint() == plain.fingerprint()
    read: list[str] = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda p: read.append(p.name) or real(p))
    expand._code_digest.__wrapped__()  # type: ignore[attr-defined]
    assert read == ["expand.py", "tasks.py", "spec.py"]  # not providers.py, where the prices are
    assert not [name for module in (expand, tasks, spec) for name, value in vars(module).items()
                if isinstance(value, Price) or name == "PRICES"]
