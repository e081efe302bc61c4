"""The API key goes to the server and nowhere else: not the cache, not the reports, not the
terminal, also when requests fail (400, 429, 500) and when the server refuses the key (401).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakeserver import ThreadedServer
from tests.test_cli import OPENMEVA, clean_env, manifest, run_judge

SECRET = "sk-test-SECRET123"
NEEDLES = (SECRET.encode(), b"SECRET123")


def _leaks(folder: Path) -> list[str]:
    """Files under `folder` whose bytes contain the key (or its distinctive part)."""
    found = []
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {needle!r}" for needle in NEEDLES if needle in data]
    return found


@pytest.mark.slow
def test_the_api_key_is_sent_but_never_stored_or_printed(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    env = clean_env(data_dir, OPENAI_API_KEY=SECRET)
    server.state.script.queue = ["400", "429", "500", "ok", "drop"]

    result = run_judge("run", OPENMEVA, "--limit", 20, "--model", "fake", "--base-url",
                       server.url, "--cache-dir", cache, "--out", out, env=env, cwd=tmp_path)

    assert result.returncode == 1, result.stderr  # the 400 is a failure, listed
    assert "400: fake 400" in result.stderr
    assert server.state.auth and set(server.state.auth) == {f"Bearer {SECRET}"}
    assert manifest(out)["counts"]["api_calls"] == 19

    server.state.script.queue = ["401"]
    refused = run_judge("run", OPENMEVA, "--limit", 25, "--model", "fake", "--base-url",
                        server.url, "--cache-dir", cache, "--out", out, env=env, cwd=tmp_path)

    assert refused.returncode == 2, refused.stderr
    assert "refused the credentials" in refused.stderr
    assert cache.is_dir() and any(cache.iterdir()) and (out / "judgments.jsonl").exists()
    leaks = _leaks(tmp_path)  # the cache, the reports, and anything else written in cwd
    for run in (result, refused):
        leaks += [f"{name}: {needle!r}" for name, text in (("stdout", run.stdout),
                                                          ("stderr", run.stderr))
                  for needle in NEEDLES if needle.decode() in text]
    assert leaks == []
