"""errors.scrub and errors.redact_url on their own: every route a secret takes into a text (a
header value, a job's key variable, a `*_API_KEY` / `*_TOKEN` / `*_SECRET` variable, a URL's
userinfo and query, a PostgreSQL password) comes out masked, and ordinary text comes out as it
went in. tests/test_secrets.py checks the same through the real CLI, file by file.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import errors
from runner.api import selection
from runner.errors import MASK, REDACTED, redact_url, register_secret, scrub
from runner.execute.store.backend import checked_url
from tests.test_cli import OPENMEVA

PLANTED = "correct horse battery"
"""A secret of no known key shape (no sk-, no Bearer, no key=): only registration hides it."""


@pytest.fixture(autouse=True)
def no_registered_secrets() -> Iterator[None]:
    """Each test starts with no registered secret and leaves none behind."""
    kept = set(errors._SECRETS)
    errors._SECRETS.clear()
    yield
    errors._SECRETS.clear()
    errors._SECRETS.update(kept)


def test_ordinary_text_comes_out_as_it_went_in() -> None:
    for text in ("400: the model does not exist", "key too short: key=abc",
                 "see https://example.org/v1/models?limit=5", "password: check it", ""):
        assert scrub(text) == text


@pytest.mark.parametrize(("text", "expected"), [
    ("Authorization: Bearer abc.def-123456", f"Authorization: Bearer {REDACTED}"),
    ("bad key sk-proj-1234567890abcd given", f"bad key {REDACTED} given"),
    ("key AIzaSyA1234567890abcdefghijkl echoed", f"key {REDACTED} echoed"),
    ('{"api_key": "abcdefghijklmnop"}', f'{{"api_key": "{REDACTED}"}}'),
    ("access_token=abcdefghijklmnopq x", f"access_token={REDACTED} x"),
])
def test_anything_shaped_like_a_key_is_masked(text: str, expected: str) -> None:
    assert scrub(text) == expected
    assert scrub(expected) == expected  # a scrubbed text stays as it is


def test_a_header_value_given_is_removed_without_being_registered() -> None:
    assert scrub(f"the gateway echoed {PLANTED}", (PLANTED,)) == \
        f"the gateway echoed {REDACTED}"
    assert scrub(f"later: {PLANTED}") == f"later: {PLANTED}"  # given once, not remembered


def test_a_registered_secret_of_no_key_shape_is_removed_everywhere() -> None:
    text = f"error: {PLANTED} is not valid; {PLANTED}"
    assert scrub(text) == text  # no shape catches it ...
    register_secret(PLANTED)
    assert scrub(text) == f"error: {REDACTED} is not valid; {REDACTED}"  # ... registration does


def test_short_or_empty_values_are_not_registered() -> None:
    for value in (None, "", "abc12"):
        register_secret(value)
    assert scrub("abc12 and the word abc") == "abc12 and the word abc"


def test_the_keys_a_selection_reads_are_registered(data_dir: Path, tmp_path: Path) -> None:
    # the job's key variable, and any *_API_KEY / *_TOKEN / *_SECRET variable (runner.api)
    env = {"OPENAI_API_KEY": "openai plain value", "GATEWAY_TOKEN": "gateway plain value",
           "VAULT_SECRET": "vault plain value", "UNRELATED": "ordinary plain value"}
    selection(OPENMEVA, models=("fake",), base_url="http://127.0.0.1:9/v1", limit=1,
              data_dir=data_dir, environ=env, cache_dir=tmp_path / "cache")
    text = " | ".join(env.values())
    assert scrub(text) == f"{REDACTED} | {REDACTED} | {REDACTED} | ordinary plain value"


@pytest.mark.parametrize(("url", "expected"), [
    ("postgresql://judge:hunter2@db:5432/cache", f"postgresql://judge:{MASK}@db:5432/cache"),
    ("postgresql://:hunter2@db/cache", f"postgresql://:{MASK}@db/cache"),
    ("postgresql://judge@db/cache?password=hunter2&sslmode=require",
     f"postgresql://judge@db/cache?password={MASK}&sslmode=require"),
    ("https://gw/v1?key=abc&x=1", f"https://gw/v1?key={MASK}&x=1"),  # any length in a query
    ("postgresql://judge@db/cache?sslpassword=hunter2&sslmode=require",  # any *password
     f"postgresql://judge@db/cache?sslpassword={MASK}&sslmode=require"),
    ("https://gw/v1?api-key=a&token=b&sig=c", f"https://gw/v1?api-key={MASK}&token={MASK}&sig={MASK}"),
    ("http://u:p@ss@host/v1", f"http://u:{MASK}@host/v1"),  # an unescaped @: all of it masked
    ("postgres://u:hunter2@[bad/db", f"postgres://u:{MASK}@[bad/db"),  # does not parse
    ("postgresql://judge@db/cache", "postgresql://judge@db/cache"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
])
def test_a_url_loses_its_password_and_tokens(url: str, expected: str) -> None:
    assert redact_url(url) == expected
    assert scrub(f"judge run x --cache {url} --out y") == f"judge run x --cache {expected} --out y"


def test_a_cache_url_registers_its_password() -> None:
    checked_url("postgresql://judge:correct%20horse@db/cache")
    # a driver's message quoting the password outside the URL, raw or decoded
    assert scrub("FATAL: password correct horse rejected") == f"FATAL: password {REDACTED} rejected"
    assert scrub("given correct%20horse") == f"given {REDACTED}"
