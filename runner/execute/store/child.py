"""Start a `python -m` child process of this very runner package (the reader and the folding
process), its standard streams piped to this process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["second_core", "spawn"]


def spawn(module: str, *args: str) -> subprocess.Popen[bytes]:
    """`python -P -m module args...` in a fresh interpreter. -P keeps the current folder off
    sys.path (a user's own ./runner would shadow ours), and PYTHONPATH leads to this package."""
    ours = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (ours, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen([sys.executable, "-P", "-m", module, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def second_core() -> bool:
    """Whether this process may run on two cores or more: a child process working beside it
    gains nothing on one."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(
        os.cpu_count() or 1)
    return len(cores) >= 2
