"""`judge cache export|import` between a diskcache folder, PostgreSQL and JSONL archives, and the
`--cache URL` option, through the real cli (click's CliRunner) on real caches."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from runner.cli.main import cli
from runner.execute.store.backend import open_cache
from runner.execute.store.cache import Cache
from tests.test_cache_backends import _key, _record
from tests.test_cli import OPENMEVA, error_line, manifest

N = 1200  # past one batch (1000) of has_many / get_many


@pytest.fixture
def invoke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data_dir: Path) -> Any:
    monkeypatch.chdir(tmp_path)
    for name in ("JUDGE_CACHE_URL", "JUDGE_CACHE_DIR", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JUDGE_DATA_DIR", str(data_dir))

    def call(*args: Any) -> Result:
        return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)

    return call


def _fill(folder: Path, n: int = N) -> dict[str, dict[str, Any]]:
    records = {_key(i): _record(i, f"{i % 5 + 1} stars \x00 é") for i in range(n)}
    with Cache(folder) as cache:
        for key, record in records.items():
            cache.put(key, record)
    return records


def _all(location: str | Path) -> dict[str, dict[str, Any]]:
    with open_cache(location) as cache:
        return cache.get_many(list(cache.keys()))


@pytest.mark.slow
def test_disk_to_postgresql_to_archive_to_disk_keeps_every_record(
        invoke: Any, tmp_path: Path, pg_url: str) -> None:
    records = _fill(tmp_path / "a")
    done = invoke("cache", "export", pg_url, "--cache-dir", tmp_path / "a")
    assert done.exit_code == 0, done.output
    assert done.output == f"exported {N} records from {tmp_path / 'a'} to {pg_url} " \
                          "(0 already there)\n"
    assert _all(pg_url) == records

    archive = tmp_path / "study.jsonl.gz"
    done = invoke("cache", "export", archive, "--cache", pg_url)
    assert done.exit_code == 0, done.output
    lines = gzip.decompress(archive.read_bytes()).splitlines()
    assert len(lines) == N and set(orjson.loads(lines[0])) == {"key", "record"}
    assert list(tmp_path.glob(".*tmp")) == []

    done = invoke("cache", "import", archive, "--cache-dir", tmp_path / "b")
    assert done.exit_code == 0, done.output
    assert _all(tmp_path / "b") == records
    again = invoke("cache", "import", archive, "--cache-dir", tmp_path / "b")
    assert again.output.startswith(f"imported 0 records from {archive}") and \
        f"({N} already there)" in again.output


@pytest.mark.slow
def test_import_from_postgresql_and_a_plain_archive_skips_keys_already_there(
        invoke: Any, tmp_path: Path, pg_url: str) -> None:
    records = _fill(tmp_path / "a", 50)
    assert invoke("cache", "export", pg_url, "--cache-dir", tmp_path / "a").exit_code == 0
    _fill(tmp_path / "b", 20)  # the first 20 are there already
    done = invoke("cache", "import", pg_url, "--cache-dir", tmp_path / "b")
    assert done.exit_code == 0 and "imported 30 records" in done.output and \
        "(20 already there)" in done.output
    assert _all(tmp_path / "b") == records
    plain = tmp_path / "plain.jsonl"
    assert invoke("cache", "export", plain, "--cache-dir", tmp_path / "b").exit_code == 0
    assert len(plain.read_bytes().splitlines()) == 50
    assert invoke("cache", "import", plain, "--cache-dir", tmp_path / "c").exit_code == 0
    assert _all(tmp_path / "c") == records


@pytest.mark.parametrize(("line", "message"), [
    (b"{not json", "not JSON"),
    (b'{"key": "abc", "record": {}}', '"key" must be a cache key (64 lowercase hex digits)'),
    (b'{"key": "' + b"a" * 64 + b'", "record": {"request": {}}}',
     '"record" must be an object with request, response, source'),
])
def test_a_bad_archive_line_is_one_error_naming_the_line_and_stores_nothing(
        invoke: Any, tmp_path: Path, line: bytes, message: str) -> None:
    good = [orjson.dumps({"key": _key(i), "record": _record(i)}) for i in range(2)]
    archive = tmp_path / "bad.jsonl"
    archive.write_bytes(b"\n".join([*good, line, *good]) + b"\n")
    done = invoke("cache", "import", archive, "--cache-dir", tmp_path / "c")
    assert done.exit_code == 2
    assert error_line(done.output).startswith(f"Error: {archive}:3: {message}")
    with Cache(tmp_path / "c") as cache:
        assert cache.stats()["entries"] == 0


def test_export_to_a_missing_folder_fails_cleanly(invoke: Any, tmp_path: Path) -> None:
    _fill(tmp_path / "a", 5)
    target = tmp_path / "nope" / "x.jsonl"
    done = invoke("cache", "export", target, "--cache-dir", tmp_path / "a")
    assert done.exit_code == 2
    assert error_line(done.output).startswith(f"Error: {target}: cannot write the archive")
    assert not target.parent.exists()


def test_cache_option_that_is_not_a_url_is_an_error(invoke: Any) -> None:
    done = invoke("cache", "stats", "--cache", "somewhere/cache")
    assert done.exit_code == 2
    assert error_line(done.output) == (
        "Error: --cache / JUDGE_CACHE_URL 'somewhere/cache': expected a "
        "postgresql://USER@HOST:PORT/DBNAME URL; for a folder use --cache-dir")


@pytest.mark.slow
def test_the_password_in_a_cache_url_never_reaches_output_or_manifest(
        invoke: Any, tmp_path: Path, pg_url: str) -> None:
    # Trust auth accepts any password: the URL works and carries a secret to leak.
    secret_url = pg_url.replace("postgres@", "postgres:hunter2@")
    _fill(tmp_path / "a", 3)
    assert invoke("cache", "export", secret_url, "--cache-dir", tmp_path / "a").exit_code == 0
    stats = invoke("cache", "stats", "--cache", secret_url)
    assert stats.exit_code == 0 and "3 entries" in stats.output
    out = tmp_path / "out"
    done = invoke("rescore", OPENMEVA, "--limit", 3, "--model", "fake", "--base-url",
                  "http://127.0.0.1:9/v1", "--cache", secret_url, "--out", out, "--partial")
    assert done.exit_code == 0, done.output
    assert manifest(out)["cache_url"] == pg_url.replace("postgres@", "postgres:***@")
    for text in (stats.output.encode(), done.output.encode(),
                 *(p.read_bytes() for p in out.rglob("*") if p.is_file())):  # scores.parquet too
        assert b"hunter2" not in text


@pytest.mark.slow
def test_judge_cache_url_from_the_environment(invoke: Any, tmp_path: Path, pg_url: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _fill(tmp_path / "a", 7)
    assert invoke("cache", "export", pg_url, "--cache-dir", tmp_path / "a").exit_code == 0
    monkeypatch.setenv("JUDGE_CACHE_URL", pg_url)
    done = invoke("cache", "stats")
    assert done.exit_code == 0 and done.output.startswith(f"{pg_url}: 7 entries, ")
    # --cache wins over the environment
    monkeypatch.setenv("JUDGE_CACHE_URL", "not-a-url")
    assert invoke("cache", "stats", "--cache", pg_url).exit_code == 0
    assert invoke("cache", "stats").exit_code == 2
