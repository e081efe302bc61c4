"""runner.report.write.atomic_file: reports streamed to disk replace the old file only once
complete (judgments.jsonl and scores.csv are written that way, never held in memory)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from runner.report.write import atomic_file, write_atomic


def test_the_old_file_stays_until_the_new_one_is_complete(tmp_path: Path) -> None:
    path = tmp_path / "out" / "judgments.jsonl"
    write_atomic(path, b"old\n")
    with atomic_file(path) as f:
        f.write(b"new 1\n")
        f.flush()
        assert path.read_bytes() == b"old\n"  # readers see the old file while it is written
        f.write(b"new 2\n")
    assert path.read_bytes() == b"new 1\nnew 2\n"
    assert [p.name for p in path.parent.iterdir()] == ["judgments.jsonl"]


def test_a_failure_midway_leaves_the_old_file_and_no_temp_file(tmp_path: Path) -> None:
    path = tmp_path / "scores.csv"
    write_atomic(path, b"old\n")
    with pytest.raises(RuntimeError, match="judging failed"), atomic_file(path) as f:
        f.write(b"half")
        raise RuntimeError("judging failed")
    assert path.read_bytes() == b"old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["scores.csv"]


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_report_file_follows_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    old = os.umask(umask)
    try:
        write_atomic(tmp_path / "report.md", b"shared")
        with atomic_file(tmp_path / "scores.csv") as f:
            f.write(b"a,b\n")
    finally:
        os.umask(old)
    for name in ("report.md", "scores.csv"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode, name
