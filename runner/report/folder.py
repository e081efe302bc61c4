"""The out folder: its report set is always one whole set, switched in one rename.

`report_set` writes the new set to a hidden folder `history/.RUN_ID.partial-PID`; only once
every file is there is it renamed to `history/RUN_ID` (RUN_ID = UTC time and a short random id,
as in the manifest's `run_id`), and then `latest` is pointed there in one rename. The folder's
own report files (`scores.csv`, `report.html`, ...) are symbolic links `NAME -> latest/NAME`,
so every path a user knows reads the set `latest` points at: at every moment the folder shows
one whole set, the old one or the new one, and a kill at any step leaves it so (the links
are made before the switch, and a name the new set lacks is removed after it, when its link
already reads nothing). A folder written by an older version (regular files, hard-linked
into history) is turned into links the same way: each file becomes a link to the same set's
file first. A failure while writing (disk full) leaves the previous set as it was; a kill
leaves a partial folder, which the next write removes. `check_out` finds a folder that cannot
be written before the first paid call. Symbolic links are needed (Windows is out of scope).

Every set is kept: a kept set is never touched again; `judge runs` lists them, so neither a
rebuild nor a run with other models loses an earlier run's reports. Each set of a
ten-million-judgment study takes ~5 GB, so `judge runs JOB --keep N` removes all but the
newest N (`forget_runs`), never the one `latest` points at: a run is hidden by a rename
first, so it is listed whole or not at all.
"""

from __future__ import annotations

import contextlib
import csv
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
           "new_run_id", "own_bytes", "read_csv", "report_set", "write_atomic"]

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
    """Write `data` to `path` so that readers see the old file or the new one, never half.

    Args:
        path, data: the file to replace and its new content.
    """
    with atomic_file(path) as f:
        f.write(data)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[io.BufferedWriter]:
    """A file that replaces `path` when the block ends (as write_atomic), written as the data
    is made: no buffer holds a 10M-task run's judgments.jsonl (~4 GB) or scores.csv.

    The file's mode follows the umask (0644 under umask 022, not mkstemp's 0600), as any file
    the user writes: a report is meant to be shared, and holds no key (umask 077 keeps a study
    private, the cache folder too).

    Args:
        path: the file to replace.

    Yields:
        The open temporary file; it replaces `path` only if the block ends without an error.
    """
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
    paid call.

    Args:
        out_dir: the report folder (it need not exist yet).

    Raises:
        ReportError: A file is in its way or it cannot be written.
    """
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
    machines writing one folder.

    Args:
        when: the time it names (default: now).

    Returns:
        The run id.
    """
    now = time.time() if when is None else when
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
    return f"{stamp}.{int(now % 1 * 1000):03d}Z-{secrets.token_hex(3)}"


@contextlib.contextmanager
def report_set(out_dir: Path, run_id: str) -> Iterator[Path]:
    """A folder to write a new report set into; the set becomes history/`run_id` and the
    folder's when the block ends without an error (see the module docstring).

    Args:
        out_dir, run_id: the report folder and the new set's id (new_run_id).

    Yields:
        The staging folder to write the set's files into.

    Raises:
        ReportError: An OSError while writing (disk full, no permission): the previous set
            stands.
    """
    out_dir = Path(out_dir)
    _clean_leftovers(out_dir)
    stage = out_dir / HISTORY / f".{run_id}.partial-{os.getpid()}"
    try:
        stage.mkdir(parents=True, exist_ok=True)
        yield stage
        os.rename(stage, out_dir / HISTORY / run_id)
        _show(out_dir, run_id)
    except OSError as exc:
        raise ReportError(f"{out_dir}: cannot write the reports ({exc.strerror or exc}); the "
                          "previous reports are untouched and every answer is cached: free "
                          "space or fix the folder, then `judge rescore` the job") from None
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _show(out_dir: Path, run_id: str) -> None:
    """Make the kept set history/run_id the folder's: one rename of `latest` switches every
    report file's link at once."""
    names = {n for n in REPORT_FILES if (out_dir / HISTORY / run_id / n).exists()}
    for name in REPORT_FILES:  # before the switch each name reads the set shown now
        if name in names or os.path.lexists(out_dir / name):
            _link(out_dir / name, Path("latest") / name)
    _link(out_dir / "latest", Path(HISTORY) / run_id)
    for name in REPORT_FILES:  # the old set's, not this one's: their links read nothing now
        if name not in names and (out_dir / name).is_symlink():
            (out_dir / name).unlink(missing_ok=True)


def _link(path: Path, target: Path) -> None:
    """`path` -> `target`, a symbolic link replacing whatever is there in one rename."""
    if path.is_symlink() and os.readlink(path) == str(target):
        return
    tmp = path.with_name(f".{path.name}.link-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.symlink(target, tmp)
    os.replace(tmp, path)


def kept_runs(out_dir: Path) -> list[Path]:
    """The report sets kept in out_dir/history, oldest first (complete ones only).

    Args:
        out_dir: the report folder.

    Returns:
        The runs' folders; [] without a history.
    """
    history = out_dir / HISTORY
    if not history.is_dir():
        return []
    return sorted(p for p in history.iterdir()
                  if not p.name.startswith(".") and (p / "manifest.json").is_file())


def read_csv(path: Path) -> list[dict[str, str]]:
    """A kept run's CSV report as rows ([] when the run has none).

    Args:
        path: the CSV file.

    Returns:
        Its rows by column name.
    """
    if not path.is_file():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def own_bytes(run: Path) -> int:
    """The bytes of `run`'s files that no other name links (in a folder an older version
    wrote, its own files were hard links to the newest run): what removing it frees.

    Args:
        run: a kept run's folder.

    Returns:
        The bytes freed by removing it.
    """
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
        out_dir, keep: the report folder and how many of the newest kept runs stay (1 or more).

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
        for link in out_dir.glob(".*.link-*"):
            pid = link.name.rpartition("-")[2]
            if pid.isdigit() and not alive(int(pid)):
                link.unlink(missing_ok=True)
        for tmp in out_dir.glob(".*.tmp"):
            if time.time() - tmp.stat().st_mtime > STALE_TMP_S:
                tmp.unlink(missing_ok=True)
