"""The Makefile's first-hour recipes, run by the real make against a venv of fake programs.

`make run JOB=openmeva` is the README's first command: its local judge gives one score to
almost every story, the run exits 1 for it, and the note saying what that judge is must still
be its last line. `make install-local` builds llama.cpp without the multimodal library and keeps
a CMAKE_ARGS of the user's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")]


def fake_venv(tmp_path: Path, programs: dict[str, str]) -> Path:
    """A venv folder whose bin/ holds the given shell scripts, already marked installed."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name, body in {"python": "exit 0", **programs}.items():
        script = venv / "bin" / name
        script.write_text(f"#!/bin/sh\n{body}\n")
        script.chmod(0o755)
    later = time.time() + 60  # newer than pyproject.toml: make sees nothing to install
    (venv / ".installed").touch()
    os.utime(venv / ".installed", (later, later))
    return venv


def local_job(tmp_path: Path) -> Path:
    job = tmp_path / "demo.toml"
    job.write_text('[models.smollm2]\nspec = "local:smollm2"\n')
    return job


def make(target: str, venv: Path, job: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", target, f"VENV={venv}", f"JOB={job}", "TICK=1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
        env={**os.environ, **env})


def test_the_local_note_is_the_last_line_when_the_judge_exits_1(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path, {"judge": "echo 'judge smollm2/stars: 767 of 773 answers are \"2\"'"
                                         " >&2; exit 1"})
    (venv / ".installed-local").touch()
    os.utime(venv / ".installed-local", (time.time() + 120,) * 2)
    done = make("run", venv, local_job(tmp_path))
    assert done.returncode != 0  # the run's exit code is kept
    out = [line for line in done.stdout.splitlines() if line.strip() and
           not line.startswith("make")]  # in order: stderr goes to the same pipe
    assert "767 of 773" in done.stdout
    assert out[-1].startswith("note: the local judge (SmolLM2-135M)"), out
    assert "exits 1" in out[-1] and "MODEL=openai:" in out[-1]


def test_a_job_without_a_local_model_prints_no_note(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path, {"judge": "exit 0"})
    job = tmp_path / "api.toml"
    job.write_text('[models.g]\nspec = "openai:gpt-4o-mini"\n')
    done = make("run", venv, job)
    assert done.returncode == 0, done.stdout
    assert "note: the local judge" not in done.stdout


def test_install_local_builds_without_the_multimodal_library(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path, {"pip": 'echo "CMAKE_ARGS=[$CMAKE_ARGS] $*"'})
    done = make("install-local", venv, local_job(tmp_path), CMAKE_ARGS="-DGGML_CUDA=on")
    assert done.returncode == 0, done.stdout
    log = (venv / "install-local.log").read_text()
    assert "CMAKE_ARGS=[-DLLAVA_BUILD=OFF -DGGML_CUDA=on] install -v" in log
    assert (venv / ".installed-local").exists()
