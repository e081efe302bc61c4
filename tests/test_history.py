"""Every run kept, none overwritten: each report set is kept in runs/<job>/history/RUN, `latest`
points at the newest, `judge runs` lists them, `judge view JOB RUN` opens one."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from tests.fakeserver import ThreadedServer
from tests.test_cli import clean_env, error_line, run_judge, write_job


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()
            and not p.is_symlink()}


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
    assert lines[0].split() == ["run", "kind", "models", "tasks", "calls", "cost", "best",
                                "correlation"]
    assert [line.split()[:5] for line in lines[1:]] == [
        [ids[0], "run", "fake", "12", "12"], [ids[1], "run", "other", "12", "12"],
        [ids[2], "rebuild", "fake", "12", "0"]]
    assert all(re.search(r"/stars -?\d\.\d{3} \(spearman, sample, openmeva/overall\)$", line)
               for line in lines[1:]), lines

    shown = run_judge("view", job, ids[1], "--out", out, "--print", "--model", "x", env=env,
                      cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == str((out / "history" / ids[1] / "report.html").resolve())
    missing = run_judge("view", job, "20000101T000000Z-000000", "--out", out, "--print",
                        env=env, cwd=tmp_path)
    assert missing.returncode == 2
    assert error_line(missing.stderr) == (f"Error: {out / 'history' / '20000101T000000Z-000000'}"
                                          f": no such run; `judge runs {job}` lists them")


def test_runs_of_a_job_never_run(tmp_path: Path, data_dir: Path) -> None:
    job = write_job(tmp_path / "jobs")
    result = run_judge("runs", job, "--out", tmp_path / "out", env=clean_env(data_dir),
                       cwd=tmp_path)
    assert result.returncode == 2
    assert error_line(result.stderr) == (f"Error: {tmp_path / 'out' / 'history'}: no kept runs "
                                         f"yet; `judge run {job}` makes one")
