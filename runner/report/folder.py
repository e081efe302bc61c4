"""The out folder: a report set is replaced only by a complete new one.

`report_set` writes the new set to a hidden folder beside the out folder (`.NAME.new-PID`); only
once every file is there is the old manifest removed, each new file moved in (a rename: no space
needed, nothing half-written), the old set's files the new one lacks removed, and the manifest
moved in last. So a set with manifest.json is complete, and one without it is being replaced. A
failure while writing (disk full) leaves the previous set as it was; a kill leaves a stage
folder, which the next write removes. `check_out` finds a folder that cannot be written before
the first paid call.

Every set is also kept: before it replaces the folder's, it is linked (hard links: no copy,
no space) into `history/RUN_ID/` (RUN_ID = UTC time and a short random id, as in the manifest's
`run_id`), and `latest` points there. A kept set is never touched again; `judge runs` lists
them, so neither a rebuild nor a run with other models loses an earlier run's reports. Each
set of a ten-million-judgment study takes ~5 GB once the folder's own set has moved on, so
`judge runs JOB --keep N` removes all but the newest N (`forget_runs`): a run is hidden by a
rename first, so it is listed whole or not at all.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from runner.children import alive
from runner.errors import ReportError

__all__ = ["HISTORY", "REPORT_FILES", "atomic_file", "check_out", "forget_runs", "kept_runs",
           "new_run_id", "own_bytes", "report_set", "write_atomic"]

HISTORY = "history"
"""The out folder's subfolder that keeps every report set, one folder a run."""

REPORT_FILES = ("judgments.jsonl", "scores.csv", "scores.parquet", "correlations.csv",
                "summary.csv", "report.md", "reliability.csv", "battle.csv", "ranking.csv",
                "leaderboard.csv", "report.html", "manifest.json")
"""The files of one report set (manifest.json last): others in the folder (compare.csv,
power.csv, a user's notes) are left alone."""
STALE_TMP_S = 600.0
"""A `.NAME.*.tmp` file in the out folder older than this is a killed writer's leftover."""


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that readers see the old file or the new one, never half."""
    with atomic_file(path) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[io.BufferedWriter]:
    """A file that replaces `path` when the block ends (as write_atomic), written as the data
    is made: no buffer holds a 10M-task run's judgments.jsonl (~4 GB) or scores.csv.

    The file's mode follows the umask (0644 under umask 022), as any file the user writes: a
    report is meant to be shared, and holds no key. (tempfile.mkstemp made every report 0600,
    unreadable by the others on a shared machine; a user who wants a study private sets
    umask 077, which the cache folder follows too.)"""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"  # random: O_EXCL cannot clash
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with open(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_out(out_dir: Path) -> None:
    """Raise ReportError unless reports can be written to `out_dir`: checked before the first
    paid call (a file in its place, or a folder that cannot be written, was found after)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError(f"--out {out_dir}: is a file, not a folder; give a folder for the "
                          "reports (no call was made)")
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists() or p == Path("/"))
    if not existing.is_dir():
        raise ReportError(f"--out {out_dir}: {existing} is a file, not a folder; give another "
                          "report folder (no call was made)")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise ReportError(f"--out {out_dir}: cannot write in {existing} ({exc.strerror or exc}); "
                          "give a folder you can write to (no call was made)") from None


def new_run_id(when: float | None = None) -> str:
    """`20261125T143015.123Z-a1b2c3`: sorts by time (to the millisecond), unique across
    machines writing one folder."""
    now = time.time() if when is None else when
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    return f"{stamp}.{int(now % 1 * 1000):03d}Z-{secrets.token_hex(3)}"


@contextlib.contextmanager
def report_set(out_dir: Path, run_id: str) -> Iterator[Path]:
    """A folder to write a new report set into; the set replaces `out_dir`'s when the block
    ends without an error (see the module docstring), kept first as history/`run_id`. An
    OSError while writing (disk full, no permission) becomes a ReportError,
    with the previous set untouched."""
    out_dir = Path(out_dir)
    _clean_leftovers(out_dir)
    stage = out_dir.parent / f".{out_dir.name}.new-{os.getpid()}"
    try:
        stage.mkdir(parents=True, exist_ok=True)
        yield stage
        out_dir.mkdir(exist_ok=True)
        _keep(stage, out_dir / HISTORY, run_id)
        (out_dir / "manifest.json").unlink(missing_ok=True)
        for name in REPORT_FILES[:-1]:
            if (stage / name).exists():
                os.replace(stage / name, out_dir / name)
            else:
                (out_dir / name).unlink(missing_ok=True)  # the old set's, not this one's
        os.replace(stage / "manifest.json", out_dir / "manifest.json")
        _point_latest(out_dir, run_id)
    except OSError as exc:
        raise ReportError(f"{out_dir}: cannot write the reports ({exc.strerror or exc}); the "
                          "previous reports are untouched and every answer is cached: free "
                          "space or fix the folder, then `judge rescore` the job") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _keep(stage: Path, history: Path, run_id: str) -> None:
    """The staged set as history/run_id, whole or not at all (a hidden folder, renamed)."""
    partial = history / f".{run_id}.partial-{os.getpid()}"
    partial.mkdir(parents=True, exist_ok=True)
    for name in REPORT_FILES:
        if (stage / name).exists():
            try:
                os.link(stage / name, partial / name)
            except OSError:  # a file system without hard links
                shutil.copy2(stage / name, partial / name)
    os.rename(partial, history / run_id)


def _point_latest(out_dir: Path, run_id: str) -> None:
    """`latest` -> history/run_id, replaced in one rename (where symbolic links exist)."""
    link = out_dir / f".latest.{os.getpid()}"
    with contextlib.suppress(OSError):
        link.unlink(missing_ok=True)
        os.symlink(Path(HISTORY) / run_id, link, target_is_directory=True)
        os.replace(link, out_dir / "latest")


def kept_runs(out_dir: Path) -> list[Path]:
    """The report sets kept in out_dir/history, oldest first (complete ones only)."""
    history = out_dir / HISTORY
    if not history.is_dir():
        return []
    return sorted(p for p in history.iterdir()
                  if not p.name.startswith(".") and (p / "manifest.json").is_file())


def own_bytes(run: Path) -> int:
    """The bytes of `run`'s files that no other name links (the folder's own set, another
    kept run): what removing it frees."""
    total = 0
    for path in run.iterdir():
        with contextlib.suppress(OSError):
            st = path.stat(follow_symlinks=False)
            if st.st_nlink == 1:
                total += st.st_size
    return total


def forget_runs(out_dir: Path, keep: int) -> tuple[list[str], int]:
    """Remove out_dir's kept runs but the `keep` newest, and never the one `latest` points at.

    Args:
        out_dir: the report folder.
        keep: how many of the newest kept runs stay (1 or more).

    Returns:
        The removed runs' ids, oldest first, and the bytes that freed.

    Raises:
        ReportError: a run could not be removed (the ones before it are gone).
    """
    kept = kept_runs(out_dir)
    latest = (out_dir / "latest").resolve() if (out_dir / "latest").is_symlink() else None
    removed, freed = [], 0
    for run in kept[:max(0, len(kept) - keep)]:
        if run.resolve() == latest:
            continue
        freed += own_bytes(run)
        hidden = run.with_name(f".{run.name}.removing-{os.getpid()}")
        try:
            os.rename(run, hidden)
            shutil.rmtree(hidden)
        except OSError as exc:
            raise ReportError(f"{run}: cannot remove this kept run ({exc.strerror or exc}); "
                              "fix the folder's permissions and try again") from None
        removed.append(run.name)
    return removed, freed


def _clean_leftovers(out_dir: Path) -> None:
    """Stage folders of writers that are gone, and `.NAME.*.tmp` files a killed writer left."""
    with contextlib.suppress(OSError):
        for stage in [*out_dir.parent.glob(f".{out_dir.name}.new-*"),
                      *(out_dir / HISTORY).glob(".*.partial-*"),
                      *(out_dir / HISTORY).glob(".*.removing-*")]:
            pid = stage.name.rpartition("-")[2]
            if pid.isdigit() and not alive(int(pid)):
                shutil.rmtree(stage, ignore_errors=True)
        for tmp in out_dir.glob(".*.tmp"):
            if time.time() - tmp.stat().st_mtime > STALE_TMP_S:
                tmp.unlink(missing_ok=True)
