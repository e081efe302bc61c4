"""Expansion.fingerprint: a digest of everything that decides a job's keys and their order,
the same in every process (the key index was filed under it until 2026-11-25)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from runner.expand import Expansion, prepare
from runner.job.load import load_job
from tests.conftest import ROOT, JobWriter
from tests.test_expand import JOB, ROWS, TEMPLATE


def _expand(write_job: JobWriter, toml: str = JOB, rows: list[dict[str, Any]] = ROWS,
            template: str = TEMPLATE) -> Expansion:
    path = write_job(toml, rows=rows, files={"prompt.txt": template})
    return prepare(load_job(path), ROOT)


def test_the_fingerprint_follows_what_decides_the_keys(write_job: JobWriter) -> None:
    base = _expand(write_job)
    same = base.fingerprint()
    assert _expand(write_job).fingerprint() == same
    # a parser or its options: the same requests, the same keys, the same fingerprint
    assert _expand(write_job, JOB.replace('parser = "number"', 'parser = "stars"')
                   ).fingerprint() == same
    changed = {
        "template": _expand(write_job, template=TEMPLATE + "Be brief.\n"),
        "system prompt": _expand(write_job, JOB.replace("You judge", "You rate")),
        "field": _expand(write_job, rows=[{**ROWS[0], "output": "other"}, *ROWS[1:]]),
        "item order": _expand(write_job, rows=ROWS[::-1]),
        "fewer items": _expand(write_job, rows=ROWS[:2]),
        "model": _expand(write_job, JOB.replace("127.0.0.1:9002", "127.0.0.1:9003")),
        "param": _expand(write_job, JOB.replace("top_p = 0.5", "top_p = 0.6")),
        "samples": _expand(write_job, JOB.replace("samples = 2", "samples = 3")),
    }
    for what, expansion in changed.items():
        assert expansion.fingerprint() != same, what
        assert [t.key for t in expansion.tasks()] != [t.key for t in base.tasks()], what


def test_the_fingerprint_is_the_same_in_another_process(write_job: JobWriter) -> None:
    expansion = _expand(write_job)
    code = ("import sys; from runner.expand import prepare; from runner.job.load import load_job;"
            "from pathlib import Path; print(prepare(load_job(Path(sys.argv[1])), "
            "Path(sys.argv[2])).fingerprint())")
    done = subprocess.run([sys.executable, "-c", code, str(expansion.job.path), str(ROOT)],
                          capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == expansion.fingerprint()
