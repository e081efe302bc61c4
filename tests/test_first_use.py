"""A registered data set missing from JUDGE_DATA_DIR is downloaded on first `judge run`, from
its pinned upstream URL (here a mirror on 127.0.0.1), and checked against its sha256."""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner.data.datasets import REGISTRY
from tests.conftest import DATA_DIR, ROOT
from tests.fakeserver import ThreadedServer

JUDGE = str(Path(sys.executable).parent / "judge")
PREFIX = "https://raw.githubusercontent.com"


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTP server on 127.0.0.1 laid out like the upstream raw URLs of openmeva."""
    root = tmp_path / "mirror"
    for remote in REGISTRY["openmeva"].files:
        target = root / remote.url.removeprefix(PREFIX + "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(DATA_DIR / remote.path, target)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", root
    finally:
        server.shutdown()
        server.server_close()


def _run(data: Path, mirror_url: str, server: ThreadedServer,
         tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JUDGE_DATA_DIR": str(data), "JUDGE_DATA_MIRROR": mirror_url}
    return subprocess.run(
        [JUDGE, "run", str(ROOT / "jobs" / "openmeva.toml"), "--limit", "2", "--model", "fake",
         "--base-url", server.url, "--cache-dir", str(tmp_path / "cache"), "--out",
         str(tmp_path / "out")], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=120, check=False)


@pytest.mark.slow
def test_first_run_downloads_and_verifies(tmp_path: Path, mirror: tuple[str, Path],
                                          server: ThreadedServer) -> None:
    data = tmp_path / "data"
    done = _run(data, mirror[0], server, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "downloading from upstream and checking sha256 (first use)" in done.stderr
    (remote,) = REGISTRY["openmeva"].files
    got = (data / remote.path).read_bytes()
    assert hashlib.sha256(got).hexdigest() == remote.sha256
    again = _run(data, mirror[0], server, tmp_path)  # present now: no download
    assert again.returncode == 0 and "downloading" not in again.stderr


@pytest.mark.slow
def test_a_corrupt_download_stops_before_any_call(tmp_path: Path, mirror: tuple[str, Path],
                                                  server: ThreadedServer) -> None:
    (remote,) = REGISTRY["openmeva"].files
    served = mirror[1] / remote.url.removeprefix(PREFIX + "/")
    served.write_bytes(served.read_bytes().replace(b"fusion", b"fusioN", 1))
    done = _run(tmp_path / "data", mirror[0], server, tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("Error: ")
    assert "sha256" in done.stderr
    assert server.state.requests == 0
    assert not (tmp_path / "data" / remote.path).exists()
