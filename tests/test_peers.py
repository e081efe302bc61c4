"""The peers benchmark's own parts (bench/peers.py): the cookbook-pattern script against the fake
server, and a failed peer install reported instead of raised.

The peers venv is a benchmark dependency, never a project one: the script test runs only where
`bench/run.py --only peers` has already built it (~/.cache/judge-runner/bench-peers-venv, or
JUDGE_PEERS_VENV), and skips otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench import peers
from tests.fakeserver import Script, ThreadedServer


def _requests(path: Path, n: int) -> list[dict[str, object]]:
    bodies = [{"model": "fake-judge", "temperature": 0, "max_tokens": 16,
               "messages": [{"role": "user", "content": f"Rate summary {i} in stars."}]}
              for i in range(n)]
    path.write_text("".join(json.dumps(b) + "\n" for b in bodies), encoding="utf-8")
    return bodies


@pytest.mark.skipif(not peers.installed().get("cookbook"),
                    reason="no peers venv (built by `bench/run.py --only peers`)")
def test_cookbook_pattern_saves_one_answer_per_request_after_a_retry(tmp_path: Path) -> None:
    bodies = _requests(tmp_path / "requests.jsonl", 20)
    out = tmp_path / "results.jsonl"
    with ThreadedServer(Script(queue=["500"])) as server:
        done = subprocess.run(
            [str(peers.venv_python()), str(peers.SCRIPTS / "cookbook_pattern.py"),
             "--requests", str(tmp_path / "requests.jsonl"), "--save", str(out),
             "--request-url", server.url + "/chat/completions", *peers.NEVER_THROTTLE,
             "--concurrency", "4", "--deadline-s", "30"],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "TIKTOKEN_CACHE_DIR": str(peers.tiktoken_cache())})
        requests = server.state.requests
    assert done.returncode == 0, done.stderr
    counters = json.loads(done.stdout)
    assert (counters["succeeded"], counters["failed"], counters["api_errors"]) == (20, 0, 1)
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert sorted(r[0]["messages"][0]["content"] for r in rows) == sorted(
        b["messages"][0]["content"] for b in bodies)  # type: ignore[index]
    assert all(r[1]["choices"][0]["message"]["content"].endswith("stars") for r in rows)
    assert requests == 21  # the request answered 500 went once more
    assert peers._answers_in(out) == 20


@pytest.mark.slow
def test_a_peer_that_cannot_install_is_skipped_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_PEERS_VENV", str(tmp_path / "venv"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # nothing to install from: every pip call fails
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    setup = peers.ensure_peers()
    for peer in ("cookbook", "inspect_ai"):
        assert setup["available"][peer].startswith("pip install --quiet"), setup
        assert "exited 1" in setup["available"][peer]
    assert peers.installed() == {"cookbook": False, "inspect_ai": False}


def test_a_folder_that_is_not_a_venv_is_left_alone(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "notes.txt").write_text("keep me", encoding="utf-8")
    monkeypatch.setenv("JUDGE_PEERS_VENV", str(tmp_path))
    setup = peers.ensure_peers()
    assert setup["available"]["cookbook"] == (
        f"{tmp_path} exists and is not a venv: set JUDGE_PEERS_VENV to another folder")
    assert (tmp_path / "notes.txt").read_text(encoding="utf-8") == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
