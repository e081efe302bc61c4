"""Shared fixtures: the fake OpenAI-compatible server, data dir, per-test cache dir."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakeserver import Script, ThreadedServer
from tests.pgserver import pg_cluster, pg_url  # noqa: F401  (fixtures: a PostgreSQL server)

ROOT = Path(__file__).resolve().parents[1]
# No test may reach the internet: a registered data set missing from JUDGE_DATA_DIR would be
# downloaded by `judge run`, so every download goes to a closed loopback port unless a test
# serves its own mirror (tests/test_first_use.py).
os.environ.setdefault("JUDGE_DATA_MIRROR", "http://127.0.0.1:9")
DATA_DIR = Path(os.environ.get("JUDGE_DATA_DIR") or ROOT.parent / "shared" / "datasets")


@pytest.fixture
def server() -> Iterator[ThreadedServer]:
    """A fake chat-completions server on 127.0.0.1 in a thread; script it via state.script."""
    with ThreadedServer(Script()) as s:
        yield s


@pytest.fixture
def data_dir() -> Path:
    if not (DATA_DIR / "openmeva").exists():
        pytest.fail(f"benchmark data not found at {DATA_DIR}: set JUDGE_DATA_DIR")
    return DATA_DIR


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


JobWriter = Callable[..., Path]


@pytest.fixture
def write_job(tmp_path: Path) -> JobWriter:
    """Write a job folder under tmp_path/job and return the path of its job.toml.

    `write_job(toml, rows=[...], files={"prompt.txt": "..."})`: `rows` go to data.jsonl (one
    JSON object a line, written byte for byte as given), `files` are written beside the job.
    """

    def write(toml: str, *, rows: list[dict[str, Any]] | None = None,
              files: dict[str, str] | None = None) -> Path:
        folder = tmp_path / "job"
        folder.mkdir(exist_ok=True)
        if rows is not None:
            lines = (json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            (folder / "data.jsonl").write_text("".join(lines), encoding="utf-8")
        for name, text in (files or {}).items():
            (folder / name).write_text(text, encoding="utf-8")
        path = folder / "job.toml"
        path.write_text(toml, encoding="utf-8")
        return path

    return write
