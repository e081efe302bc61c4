"""Shared fixtures: the fake OpenAI-compatible server, data dir, per-test cache dir."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakeserver import Script, ThreadedServer

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("JUDGE_DATA_DIR") or ROOT.parent / "shared" / "datasets")


@pytest.fixture
def server() -> Iterator[ThreadedServer]:
    """A fake chat-completions server on 127.0.0.1 in a thread; script it via server.state.script."""
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
