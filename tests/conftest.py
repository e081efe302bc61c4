"""Shared fixtures: the fake OpenAI-compatible server, data dir, per-test cache dir."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from tests.fakeserver import Script, ThreadedServer
from tests.pgserver import pg_cluster, pg_url  # noqa: F401  (fixtures: a PostgreSQL server)

ROOT = Path(__file__).resolve().parents[1]
# A busy 2-core machine can take more than hypothesis's 200 ms for one example: no deadline.
settings.register_profile("busy machine", deadline=None)
settings.load_profile("busy machine")
# No test may reach the internet: a registered data set missing from JUDGE_DATA_DIR would be
# downloaded by `judge run`, so every download goes to a closed loopback port unless a test
# serves its own mirror (tests/test_first_use.py).
os.environ.setdefault("JUDGE_DATA_MIRROR", "http://127.0.0.1:9")
DATA_DIR = Path(os.environ.get("JUDGE_DATA_DIR") or ROOT.parent / "shared" / "datasets")


@pytest.fixture(autouse=True, scope="session")
def _cache_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """What a command keeps on the machine (PostgreSQL's located key indexes) goes to a folder
    of this session, in this process and in every `judge` it starts, not to ~/.cache."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))


@pytest.fixture
def server() -> Iterator[ThreadedServer]:
    """A fake chat-completions server on 127.0.0.1 in a thread; script it via state.script."""
    with ThreadedServer(Script()) as s:
        yield s


@pytest.fixture(params=["folder", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A cache that runs share: a folder, or a fresh PostgreSQL database."""
    if request.param == "folder":
        return str(tmp_path / "cache")
    return str(request.getfixturevalue("pg_url"))


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


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs mounted at tmp_path/disk for this test (root only; skipped with the reason
    elsewhere, a failure under CI=true), unmounted at its end (lazily: a folding child that
    outlives the command may still hold a file there for a moment)."""
    import subprocess
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(disk)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        reason = f"cannot mount a tmpfs here (root needed): {mounted.stderr.strip()}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
