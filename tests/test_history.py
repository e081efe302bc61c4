"""Every run kept, none overwritten: each report set is kept in runs/<job>/history/RUN, `latest`
points at the newest, `judge runs` lists them, `judge view JOB RUN` opens one."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fakeserver import ThreadedServer
from tests.test_cli import clean_env, error_line, run_judge, write_job


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.mark.slow
def test_each_run_is_kept_and_listed(server: ThreadedServer, tmp_path: Path,
                                     data_dir: Path) -> None:
    job = write_job(tmp_path / "jobs")
    out = tmp_path / "out"
    common = ("--limit", 12, "--base-url", server.url, "--cache-dir", tmp_path / "cache",
              "--out", out)
    env = clean_env(data_dir)
    sets = []
    for command, model in (("run", "fake"), ("run", "other"), ("rescore", "fake")):
        done = run_judge(command, job, "--model", model, *common, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        sets.append(_files(out))

    kept = sorted((out / "history").iterdir())
    assert [_files(k) for k in kept] == sets  # each set as it was written, untouched since
    ids = [orjson.loads(s["manifest.json"])["run_id"] for s in sets]
    assert [k.name for k in kept] == ids and len(set(ids)) == 3
    assert all(re.fullmatch(r"\d{8}T\d{6}\.\d{3}Z-[0-9a-f]{6}", i) for i in ids)
    assert (out / "latest").resolve() == kept[-1].resolve()
    made = [orjson.loads(s["manifest.json"]) for s in sets]
    assert [m["kind"] for m in made] == ["run", "run", "rebuild"]
    # the rebuild's provenance is the first run's answers, from their cache records
    first, rebuild = made[0], made[2]
    assert rebuild["counts"]["api_calls"] == 0
    assert rebuild["provenance"] == first["provenance"]
    assert first["provenance"]["answers"] == {"api": 12} and first["provenance"]["calls"] == 12
    assert first["provenance"]["prompt_tokens"] == first["usage"]["prompt_tokens"] > 0
    assert first["provenance"]["completion_tokens"] == first["usage"]["completion_tokens"]
    assert first["provenance"]["estimated_cost_usd"] is None  # the fake model has no price
    assert first["started"] <= first["provenance"]["first_answer"] <= \
        first["provenance"]["last_answer"] <= first["ended"]

    listed = run_judge("runs", job, "--out", out, "--model", "fake", env=env, cwd=tmp_path)

    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["run", "kind", "models", "tasks", "calls", "cost", "cached",
                                "saved", "disk", "best", "correlation"]
    assert [line.split()[:8] for line in lines[1:]] == [  # no price: unknown, called or not
        [ids[0], "run", "fake", "12", "12", "unknown", "0%", "unknown"],
        [ids[1], "run", "other", "12", "12", "unknown", "0%", "unknown"],
        [ids[2], "rebuild", "fake", "12", "0", "unknown", "-", "unknown"]]
    # what removing each frees: every kept set's files are its own (the folder's report files
    # are links to the newest's)
    own = [sum(p.stat().st_size for p in k.iterdir()) for k in kept]
    assert [line.split()[8] for line in lines[1:]] == [f"{n / 1e3:.0f}kB" for n in own]
    # 12 items are 3 groups: too few to rank a judge on (runner.report.standing.MIN_POINTS)
    assert all(line.endswith("none ranked (spearman, sample)") for line in lines[1:]), lines

    shown = run_judge("view", job, ids[1], "--out", out, "--print", "--model", "x", env=env,
                      cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == str((out / "history" / ids[1] / "report.html").resolve())
    missing = run_judge("view", job, "20000101T000000Z-000000", "--out", out, "--print",
                        env=env, cwd=tmp_path)
    assert missing.returncode == 2
    assert error_line(missing.stderr) == (f"Error: {out / 'history' / '20000101T000000Z-000000'}"
                                          f": no such run; `judge runs {job}` lists them")

    pruned = run_judge("runs", job, "--out", out, "--keep", 1, env=env, cwd=tmp_path)
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stderr.strip() == (f"removed 2 kept runs ({ids[0]}, {ids[1]}); freed "
                                     f"{(own[0] + own[1]) / 1e3:.0f}kB")
    assert [line.split()[0] for line in pruned.stdout.splitlines()[1:]] == [ids[2]]
    assert sorted(p.name for p in (out / "history").iterdir()) == [ids[2]]
    assert _files(out / "history" / ids[2]) == _files(out) == sets[2]  # the newest, whole
    assert (out / "latest").resolve() == (out / "history" / ids[2]).resolve()
    again = run_judge("runs", job, "--out", out, "--keep", 1, env=env, cwd=tmp_path)
    assert again.stderr.strip() == "removed 0 kept runs; freed 0B"
    refused = run_judge("runs", job, "--out", out, "--keep", 0, env=env, cwd=tmp_path)
    assert refused.returncode == 2 and "--keep" in refused.stderr


@pytest.mark.slow
def test_runs_of_a_job_never_run(tmp_path: Path, data_dir: Path) -> None:
    job = write_job(tmp_path / "jobs")
    result = run_judge("runs", job, "--out", tmp_path / "out", env=clean_env(data_dir),
                       cwd=tmp_path)
    assert result.returncode == 2
    assert error_line(result.stderr) == (f"Error: {tmp_path / 'out' / 'history'}: no kept runs "
                                         f"yet; `judge run {job}` makes one")


def test_keep_never_removes_the_run_latest_points_at(tmp_path: Path) -> None:
    """A run that started first and finished last has the oldest id and is `latest`: pruning
    to the newest one keeps it too; a removal a killed pruner left half-done is cleared by the
    next report set."""
    from runner.report.folder import forget_runs, kept_runs, report_set

    out = tmp_path / "out"
    ids = ["20260101T000000.000Z-aaaaaa", "20260102T000000.000Z-bbbbbb",
           "20260103T000000.000Z-cccccc"]
    for run_id in ids:
        (out / "history" / run_id).mkdir(parents=True)
        (out / "history" / run_id / "manifest.json").write_bytes(b"{}")
    (out / "latest").symlink_to(Path("history") / ids[0], target_is_directory=True)
    assert forget_runs(out, 1) == ([ids[1]], 2)
    assert [p.name for p in kept_runs(out)] == [ids[0], ids[2]]

    left = out / "history" / f".{ids[2]}.removing-999999999"  # no such process
    left.mkdir()
    with report_set(out, "20260104T000000.000Z-dddddd") as stage:
        (stage / "manifest.json").write_bytes(b"{}")
    assert not left.exists()


class _Killed(BaseException):
    """The writer stops here, as a kill would stop it (no `except` catches it)."""


def _set(tag: str, names: tuple[str, ...]) -> dict[str, bytes]:
    return {name: f"{tag} {name}".encode() for name in names}


def _shown(out: Path) -> dict[str, bytes]:
    from runner.report.folder import REPORT_FILES
    return {n: (out / n).read_bytes() for n in REPORT_FILES if (out / n).exists()}


def _old_layout(out: Path, run_id: str, files: dict[str, bytes]) -> None:
    """A folder as the previous version wrote it: regular files, hard-linked into history."""
    (out / "history" / run_id).mkdir(parents=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
        os.link(out / name, out / "history" / run_id / name)
    (out / "latest").symlink_to(Path("history") / run_id, target_is_directory=True)


def _stop_after(patched: pytest.MonkeyPatch, steps: int) -> None:
    """Let `steps` file system changes (rename, replace, symlink, unlink) happen, then stop."""
    calls = iter(range(steps))

    def stopping(real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if next(calls, None) is None:
                raise _Killed
            return real(*args, **kwargs)
        return call
    for name in ("rename", "replace", "symlink", "unlink"):
        patched.setattr(os, name, stopping(getattr(os, name)))


@pytest.mark.parametrize("old_layout", [False, True])
def test_a_kill_at_any_step_of_the_switch_leaves_one_whole_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_layout: bool) -> None:
    """Each file system step of the switch (rename, link, replace, unlink) in turn is where the
    writer stops: the folder shows set A or set B, whole, and it is the one `latest` points at;
    the next write shows its own set whole. Set B lacks two of A's files."""
    from runner.report import folder
    from runner.report.folder import REPORT_FILES, report_set

    def write(out: Path, run_id: str, files: dict[str, bytes]) -> None:
        with report_set(out, run_id) as stage:
            for name, data in files.items():
                (stage / name).write_bytes(data)

    a = _set("A", REPORT_FILES)
    b = _set("B", tuple(n for n in REPORT_FILES if n not in ("battle.csv", "ranking.csv")))
    c = _set("C", REPORT_FILES)
    ids = {"A": "20260101T000000.000Z-aaaaaa", "B": "20260102T000000.000Z-bbbbbb",
           "C": "20260103T000000.000Z-cccccc"}
    step, finished = 0, False
    while not finished:
        out = tmp_path / f"out{step}"
        if old_layout:
            _old_layout(out, ids["A"], a)
        else:
            write(out, ids["A"], a)
        with monkeypatch.context() as patched:
            _stop_after(patched, step)
            try:
                write(out, ids["B"], b)
                finished = True
            except _Killed:
                pass
        # the killed writer is gone: its leftovers are for the next write to remove
        monkeypatch.setattr(folder, "alive", lambda pid: pid != os.getpid())
        shown = _shown(out)
        assert shown in (a, b), (step, sorted(shown))
        tag = "A" if shown == a else "B"
        assert (out / "latest").resolve() == (out / "history" / ids[tag]).resolve(), step
        assert _shown(out / "latest") == shown
        write(out, ids["C"], c)
        assert _shown(out) == c and _shown(out / "latest") == c
        assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []
        assert [p.name for p in (out / "history").iterdir()
                if p.name.startswith(".")] == []
        monkeypatch.undo()
        step += 1
    assert step >= 6  # the stage renamed, `latest` switched, two names removed: or more
