"""`judge import` stores a study's recorded answers through put_many (a transaction per chunk)
on both backends, in the real `judge` script against the real data set: every answer is stored
once under its request's key, and a rerun stores none again."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.execute.store.backend import open_cache
from tests.conftest import ROOT
from tests.test_cli import clean_env, run_judge

JOB = ROOT / "jobs" / "korean-chat-readme.toml"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["diskcache", "postgresql"])
def test_judge_import_stores_every_answer_once(backend: str, request: pytest.FixtureRequest,
                                               data_dir: Path, tmp_path: Path) -> None:
    where = (["--cache", request.getfixturevalue("pg_url")] if backend == "postgresql"
             else ["--cache-dir", str(tmp_path / "cache")])
    env = clean_env(data_dir)
    first = run_judge("import", JOB, *where, "--out", tmp_path / "out", env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    # 1512 answers, 6 of them to identical requests (one cache entry each): see the job file.
    assert "imported 1506 answers (0 already cached, 0 tasks without" in first.stderr
    with open_cache(where[1]) as cache:
        keys = list(cache.keys())
        assert len(keys) == 1506
        records = cache.get_many(keys)
    assert all(r["source"].startswith("import:korean_chat/") for r in records.values())
    assert all(r["response"]["choices"][0]["message"]["content"] for r in records.values())
    again = run_judge("import", JOB, *where, "--out", tmp_path / "out", env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "imported 0 answers (1506 already cached" in again.stderr
