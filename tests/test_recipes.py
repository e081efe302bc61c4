"""The cluster recipes in examples/ run the command the README says, with a consistent split."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from runner.execute.shard import Shard

ROOT = Path(__file__).resolve().parents[1]
SLURM = ROOT / "examples" / "slurm-array.sh"
K8S = ROOT / "examples" / "k8s-indexed-job.yaml"


@pytest.fixture
def fake_judge(tmp_path: Path) -> Path:
    """A `judge` on PATH that writes its arguments to a file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "judge"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/args\n')
    script.chmod(0o755)
    return bin_dir


def _slurm(fake_judge: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": f"{fake_judge}:{os.environ['PATH']}", **env}
    return subprocess.run(["bash", str(SLURM), "jobs/openmeva.toml"], env=full,
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.slow
def test_slurm_array_task_runs_its_shard_of_shards(fake_judge: Path, tmp_path: Path) -> None:
    done = _slurm(fake_judge, SLURM_ARRAY_TASK_ID="3", SLURM_ARRAY_TASK_COUNT="1",
                  SHARDS="8", JUDGE_CACHE_URL="postgresql://judge@db.lab/judge")
    assert done.returncode == 0, done.stderr
    args = (tmp_path / "args").read_text().split("\n")[:-1]
    # SHARDS, not SLURM_ARRAY_TASK_COUNT: a rerun of one index is still shard 3 of 8.
    assert args == ["run", "jobs/openmeva.toml", "--shard", "3/8", "--yes"]
    assert Shard.parse(args[3]) == Shard(3, 8)


@pytest.mark.slow
@pytest.mark.parametrize("missing", ["SHARDS", "JUDGE_CACHE_URL"])
def test_slurm_array_task_refuses_to_run_without_its_settings(
        fake_judge: Path, tmp_path: Path, missing: str) -> None:
    env = {"SLURM_ARRAY_TASK_ID": "0", "SHARDS": "8", "JUDGE_CACHE_URL": "postgresql://x@y/z"}
    del env[missing]
    done = _slurm(fake_judge, **env)
    assert done.returncode != 0 and missing in done.stderr
    assert not (tmp_path / "args").exists()


def test_k8s_indexed_job_shards_by_completion_index_over_all_completions() -> None:
    text = K8S.read_text()
    completions = int(re.search(r"^\s+completions: (\d+)$", text, re.M)[1])  # type: ignore[index]
    assert re.search(r"^\s+completionMode: Indexed$", text, re.M)
    shard = re.search(r'--shard \\"\$JOB_COMPLETION_INDEX/(\d+)\\"', text)
    assert shard and int(shard[1]) == completions
    assert "JUDGE_CACHE_URL" in text and "secretKeyRef" in text
