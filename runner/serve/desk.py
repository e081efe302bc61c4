"""What the desk serves: the jobs of a folder of runs, their kept runs, and each job's file.

A folder of runs is either one job's report folder (it has `history/`, as `judge runs` lists)
or a folder of them (`runs/`, each job's output_dir by default). A job's file is the one its
newest kept run names in manifest.json (`job_file`, as the command was given: relative to the
folder `judge` ran in, which is where `judge serve` runs too).

Nothing here writes: runs are read from their kept report sets, never from the cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from runner.api import WorkingSet, selection
from runner.errors import ConfigError
from runner.job.load import load_job
from runner.job.spec import Job
from runner.report.folder import HISTORY, kept_runs
from runner.selection import TaskSelection

__all__ = ["Desk", "RunInfo"]


@dataclass(frozen=True, slots=True)
class RunInfo:
    """One kept run as the desk lists it (what `judge runs` shows)."""

    id: str
    path: Path
    manifest: dict[str, Any]

    @property
    def seed(self) -> int:
        """The --seed of the run's --sample draw (0, --sample's default, if none was given)."""
        return int((self.manifest.get("selection") or {}).get("seed") or 0)


@dataclass
class Desk:
    """The served folder, the data sets' folder, and who rates (None: no rating page)."""

    root: Path
    data_dir: Path
    annotator: str | None = None
    show_scores: bool = False
    """The rating page shows the judges' scores of the item (the latest run's); else blind."""
    environ: dict[str, str] = field(default_factory=dict)
    """Where the job's selection reads JUDGE_CACHE_DIR and the like (the CLI's environment)."""
    _selections: dict[tuple[str, str, bool, int], WorkingSet] = field(default_factory=dict)
    """(job, run id, whole data, the job file's mtime) -> its selection: not loaded again at
    every click."""

    def folders(self) -> dict[str, Path]:
        """Job name -> its report folder, by name.

        Returns:
            One entry if `root` is a job's report folder, else one per subfolder that is.
        """
        if (self.root / HISTORY).is_dir():
            found = [self.root]
        else:
            found = sorted(p for p in self.root.iterdir() if (p / HISTORY).is_dir()) \
                if self.root.is_dir() else []
        return {self._name(p): p for p in found}

    def _name(self, folder: Path) -> str:
        runs = kept_runs(folder)
        if runs:
            name = _manifest(runs[-1]).get("job")
            if isinstance(name, str) and name:
                return name
        return folder.name

    def folder(self, job: str) -> Path:
        """The report folder of `job`.

        Args:
            job: the job's name.

        Returns:
            Its report folder.

        Raises:
            ConfigError: No such job is served.
        """
        folders = self.folders()
        if job not in folders:
            raise ConfigError(f"{self.root}: no job {job!r} here (jobs: "
                              f"{', '.join(folders) or 'none'})")
        return folders[job]

    def runs(self, job: str) -> list[RunInfo]:
        """The job's kept runs, oldest first.

        Args:
            job: the job's name.

        Returns:
            Its kept runs; [] before its first.

        Raises:
            ConfigError: No such job is served.
        """
        return [RunInfo(p.name, p, _manifest(p)) for p in kept_runs(self.folder(job))]

    def run(self, job: str, run: str, runs: list[RunInfo] | None = None) -> RunInfo:
        """One kept run by id (`latest`: the newest).

        Args:
            job, run: the job's name and the run's id (or `latest`).
            runs: the job's runs if the caller has read them (each reading reads every
                kept run's manifest), else read here.

        Returns:
            The run.

        Raises:
            ConfigError: No such job or run.
        """
        runs = self.runs(job) if runs is None else runs
        if run == "latest" and runs:
            return runs[-1]
        for info in runs:
            if info.id == run:
                return info
        raise ConfigError(f"{self.folder(job) / HISTORY / run}: no such run of {job}")

    def job(self, job: str, runs: list[RunInfo] | None = None) -> Job:
        """The job as its file says now (the file its newest kept run names).

        Args:
            job: the job's name; runs: its runs if the caller has read them (as for `run`).

        Returns:
            The loaded job.

        Raises:
            ConfigError: No such job or run, the job file is not where the run said, or
                it is invalid now.
        """
        return load_job(_job_file(job, self.run(job, "latest", runs)))

    def selection(self, job: str, run: RunInfo | None = None, *,
                  whole: bool = False) -> WorkingSet:
        """The job's items as `run` selected them (its models, --limit, --sample), or with
        `whole` every item of its data (the rating queue); loaded once each, and again when
        the job file changes.

        Args:
            job, run: the job's name and the run whose selection is repeated (None: the newest).
            whole: every item instead.

        Returns:
            The items.
        """
        info = self.run(job, "latest") if run is None else run
        path = _job_file(job, info)
        key = (job, info.id, whole, path.stat().st_mtime_ns)
        if key not in self._selections:
            recorded = info.manifest.get("selection") or {}
            chosen = TaskSelection(job=path,
                                   models=tuple(recorded.get("models") or ()),
                                   base_url=recorded.get("base_url"),
                                   **({} if whole else {k: recorded.get(k)
                                                        for k in ("limit", "sample", "seed")}))
            self._selections[key] = selection(chosen, data_dir=self.data_dir,
                                              environ=self.environ)
        return self._selections[key]


def _job_file(job: str, info: RunInfo) -> Path:
    """The job file `info` names (relative to where `judge` ran); ConfigError if not there."""
    path = Path(str(info.manifest.get("job_file", "")))
    if not path.is_file():
        raise ConfigError(f"{path}: the job file of {job} is not there; run `judge serve` "
                          "from the folder the runs were made in")
    return path


def _manifest(run: Path) -> dict[str, Any]:
    data: dict[str, Any] = orjson.loads((run / "manifest.json").read_bytes())
    return data
