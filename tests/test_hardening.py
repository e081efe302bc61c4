"""The faults users meet before any kill -9, each through the real `judge` CLI in a subprocess:
endpoints that are not there, wrong model names, answers that are empty, servers that echo the
key. Each ends with one `Error:` line and the right exit code, or with failed tasks that a rerun
asks again; none with a traceback, a paid call lost, or a key written anywhere."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from tests.fakeserver import ThreadedServer
from tests.test_cli import (
    JOB,
    clean_env,
    closed_port,
    error_line,
    judge_cmd,
    judgments,
    run_judge,
    write_job,
)

TASKS = 12


def _run(job: Path, tmp_path: Path, data_dir: Path, *args: object,
         **env: str) -> tuple[float, object]:
    started = time.monotonic()
    result = run_judge("run", job, "--limit", TASKS, "--cache-dir", tmp_path / "cache",
                       "--out", tmp_path / "out", *args, env=clean_env(data_dir, **env),
                       cwd=tmp_path)
    return time.monotonic() - started, result


def _command(result: object) -> str:
    """The command line of a `judge` run, as its resume line gives it."""
    return " ".join(["judge", *result.args[1:]])  # type: ignore[attr-defined]


def _answer(content: object, finish: str = "stop") -> tuple[int, dict[str, str], bytes]:
    body = {"choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": content}}]}
    return 200, {"Content-Type": "application/json"}, orjson.dumps(body)


# ------------------------------------------------------------ endpoints that are not there

@pytest.mark.slow
def test_a_server_that_is_not_running_stops_the_run_at_once(tmp_path: Path,
                                                            data_dir: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    job = write_job(tmp_path / "jobs", JOB.replace("max_retries = 3", "max_retries = 8"))

    took, result = _run(job, tmp_path, data_dir, "--base-url", url, "--concurrency", 1)

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    *_, counts, line = result.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert counts.startswith(f"{TASKS} tasks: 0 cached, 0 called, 0 repeat an earlier task, "
                             f"0 failed, {TASKS} not run (2 retries)"), counts
    assert line == f"Error: cannot connect to {url} (connection refused): is the server " \
                   "running? (model fake; check --base-url / base_url); run stopped, nothing " \
                   "lost: rerun to resume: " + _command(result)
    assert took < 20  # three attempts with backoff, not 12 tasks x 9 attempts
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_fleet_with_every_replica_down_stops_the_same_way(tmp_path: Path,
                                                            data_dir: Path) -> None:
    urls = [f"http://127.0.0.1:{closed_port()}/v1" for _ in range(2)]
    fleet = JOB.replace('spec = "fake"', 'spec = "fake"\nendpoints = [' + ", ".join(
        f'{{ base_url = "{u}", api_key_env = "K{i}" }}' for i, u in enumerate(urls)) + "]")
    job = write_job(tmp_path / "jobs", fleet)

    took, result = _run(job, tmp_path, data_dir, K0="a", K1="b")

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    last = result.stderr.strip().splitlines()[-1]  # type: ignore[attr-defined]
    assert last.startswith("Error: cannot connect to any endpoint of model fake ("), last
    assert all(f"{u}: connection refused" in last for u in urls), last
    assert took < 30


@pytest.mark.slow
def test_a_fleet_with_one_replica_down_works_on_the_other(server: ThreadedServer,
                                                          tmp_path: Path, data_dir: Path) -> None:
    dead = f"http://127.0.0.1:{closed_port()}/v1"
    fleet = JOB.replace('spec = "fake"', 'spec = "fake"\nendpoints = [' +
                        f'{{ base_url = "{dead}", api_key_env = "K0" }}, '
                        f'{{ base_url = "{server.url}", api_key_env = "K1" }}]')
    job = write_job(tmp_path / "jobs", fleet)

    _, result = _run(job, tmp_path, data_dir, K0="a", K1="b")

    assert result.returncode == 0, result.stderr  # type: ignore[attr-defined]
    assert server.state.answered == TASKS


@pytest.mark.slow
@pytest.mark.parametrize(("message", "verdict"), [
    ("The model `gpt-5x` does not exist.", "has no model 'gpt-5x' (HTTP 404: {}); check "
     "--model / base_url"),
    ("404 page not found", "answered HTTP 404 at its chat-completions path ({}): check "
     "--base-url / base_url")])  # a 404 that names no model: the path is wrong, not the model
def test_a_wrong_model_name_stops_after_a_few_identical_404s(
        server: ThreadedServer, tmp_path: Path, data_dir: Path, message: str,
        verdict: str) -> None:
    body = orjson.dumps({"error": {"message": message, "code": "model_not_found"}})
    server.state.script.raw = [(404, {}, body)] * 50
    job = write_job(tmp_path / "jobs", JOB.replace('spec = "fake"', 'spec = "gpt-5x"'))

    _, result = _run(job, tmp_path, data_dir, "--base-url", server.url, "--concurrency", 1)

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    last = result.stderr.strip().splitlines()[-1]  # type: ignore[attr-defined]
    assert last == f"Error: the server at {server.url} {verdict.format(message)} (an " \
                   "OpenAI-compatible base URL ends in /v1); run stopped, nothing lost: " \
                   "rerun to resume: " + _command(result)
    assert server.state.requests == 3  # not all twelve
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_refused_key_names_the_variable_that_holds_it(server: ThreadedServer,
                                                        tmp_path: Path, data_dir: Path) -> None:
    server.state.script.queue = ["401"] * 4
    job = write_job(tmp_path / "jobs", JOB.replace('spec = "fake"',
                                                   'spec = "fake"\napi_key_env = "MY_GATEWAY_KEY"'))

    _, result = _run(job, tmp_path, data_dir, "--base-url", server.url, MY_GATEWAY_KEY="abc-1")

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    last = result.stderr.strip().splitlines()[-1]  # type: ignore[attr-defined]
    assert last.startswith(f"Error: the server at {server.url} refused the credentials in "
                           "MY_GATEWAY_KEY (HTTP 401: fake 401): check the key"), last


@pytest.mark.slow
@pytest.mark.parametrize("url", ["htp://127.0.0.1:8000/v1", "http//127.0.0.1:8000/v1",
                                 "http:///v1", "127.0.0.1:8000/v1"])
def test_a_malformed_base_url_is_refused_before_any_call(tmp_path: Path, data_dir: Path,
                                                         url: str) -> None:
    job = write_job(tmp_path / "jobs")

    _, result = _run(job, tmp_path, data_dir, "--base-url", url)

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    line = error_line(result.stderr)  # type: ignore[attr-defined]
    assert line.startswith(f"Error: --base-url {url!r} is not an http(s) URL"), line
    assert not (tmp_path / "cache").exists()


@pytest.mark.slow
def test_a_malformed_base_url_in_the_job_names_the_field(tmp_path: Path,
                                                         data_dir: Path) -> None:
    job = write_job(tmp_path / "jobs", JOB.replace(
        'spec = "fake"', 'spec = "fake"\nbase_url = "htp://localhost:8000/v1"'))

    _, result = _run(job, tmp_path, data_dir)

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    line = error_line(result.stderr)  # type: ignore[attr-defined]
    assert line.startswith(f"Error: {job}: models.fake.base_url 'htp://localhost:8000/v1' is "
                           "not an http(s) URL"), line


# ------------------------------------------------------------ answers that are not answers

@pytest.mark.slow
@pytest.mark.parametrize("content", [None, ""])
def test_a_200_without_an_answer_is_retried_then_failed_never_cached(
        server: ThreadedServer, tmp_path: Path, data_dir: Path, content: object) -> None:
    server.state.script.raw = [_answer(content)] * 4  # one task's four attempts (max_retries 3)
    job = write_job(tmp_path / "jobs")

    _, result = _run(job, tmp_path, data_dir, "--base-url", server.url, "--concurrency", 1)

    assert result.returncode == 1, result.stderr  # type: ignore[attr-defined]
    failed = [j for j in judgments(tmp_path / "out") if j["error"] is not None]
    assert [j["error"] for j in failed] == [{"type": "api", "message": "empty: the server "
                                             "answered 200 with no content (finish_reason stop)"}]
    assert server.state.requests == TASKS + 3

    _, rerun = _run(job, tmp_path, data_dir, "--base-url", server.url)

    assert rerun.returncode == 0, rerun.stderr  # type: ignore[attr-defined]
    assert server.state.requests == TASKS + 4  # the empty one was asked again, and only it


@pytest.mark.slow
def test_a_content_filter_refusal_stays_an_answer(server: ThreadedServer, tmp_path: Path,
                                                  data_dir: Path) -> None:
    server.state.script.raw = [_answer(None, "content_filter")]
    job = write_job(tmp_path / "jobs")

    _, result = _run(job, tmp_path, data_dir, "--base-url", server.url, "--concurrency", 1)

    assert server.state.requests == TASKS, result.stderr  # type: ignore[attr-defined]
    errors = [j["error"]["type"] for j in judgments(tmp_path / "out") if j["error"]]
    assert errors == ["refusal"]


# ------------------------------------------------------------ secrets

SECRET = "gw-live-0123456789abcdef"


@pytest.mark.slow
@pytest.mark.parametrize("status", [400, 401, 403])
def test_a_server_that_echoes_the_key_leaks_it_nowhere(server: ThreadedServer, tmp_path: Path,
                                                       data_dir: Path, status: int) -> None:
    echo = f"invalid request; headers were Authorization: Bearer {SECRET}; key={SECRET}"
    server.state.script.raw = [(status, {}, orjson.dumps({"error": {"message": echo}}))] * 2
    job = write_job(tmp_path / "jobs")

    _, result = _run(job, tmp_path, data_dir, "--base-url", server.url, "--concurrency", 1,
                     OPENAI_API_KEY=SECRET)

    assert result.returncode in (1, 2), result.stderr  # type: ignore[attr-defined]
    assert "[redacted]" in result.stderr  # type: ignore[attr-defined]
    texts = [result.stdout, result.stderr]  # type: ignore[attr-defined]
    texts += [p.read_bytes().decode("utf-8", "replace") for p in tmp_path.rglob("*")
              if p.is_file()]
    assert not [t for t in texts if "0123456789abcdef" in t]


# ------------------------------------------------------------ data and report folders

MINE = JOB.replace('name = "openmeva"', 'name = "mine"\npath = "data.jsonl"\n'
                   'fields = { text = { storyline = "out", beginning = "src" }, '
                   'human = { overall = "score" } }')
ROWS = "".join(orjson.dumps({"id": str(i), "src": f"s{i}", "out": f"o{i}", "score": i % 5}
                            ).decode() + "\n" for i in range(TASKS))
REPORTS = ("judgments.jsonl", "scores.csv", "correlations.csv", "summary.csv", "report.md",
           "reliability.csv", "report.html", "manifest.json")


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("text", ["", "\n\n"])
def test_an_empty_data_file_is_an_error_and_no_report_is_touched(
        server: ThreadedServer, tmp_path: Path, data_dir: Path, text: str) -> None:
    job = write_job(tmp_path / "jobs", MINE)
    (tmp_path / "jobs" / "data.jsonl").write_text(ROWS)
    _, first = _run(job, tmp_path, data_dir, "--base-url", server.url)
    assert first.returncode == 0, first.stderr  # type: ignore[attr-defined]
    before = _snapshot(tmp_path / "out")
    (tmp_path / "jobs" / "data.jsonl").write_text(text)

    for command in ("run", "rescore"):
        result = run_judge(command, job, "--base-url", server.url, "--cache-dir",
                           tmp_path / "cache", "--out", tmp_path / "out",
                           env=clean_env(data_dir), cwd=tmp_path)

        assert result.returncode == 2, result.stderr
        assert error_line(result.stderr) == \
            f"Error: {tmp_path / 'jobs' / 'data.jsonl'}: no items; check the file is the one " \
            "you meant and not empty"
    assert _snapshot(tmp_path / "out") == before
    assert server.state.requests == TASKS


@pytest.mark.slow
def test_out_that_is_a_file_is_refused_before_any_call(server: ThreadedServer, tmp_path: Path,
                                                       data_dir: Path) -> None:
    job = write_job(tmp_path / "jobs")
    (tmp_path / "out").write_text("my notes")

    _, result = _run(job, tmp_path, data_dir, "--base-url", server.url)

    assert result.returncode == 2, result.stderr  # type: ignore[attr-defined]
    assert error_line(result.stderr) == (  # type: ignore[attr-defined]
        f"Error: --out {tmp_path / 'out'}: is a file, not a folder; give a folder for the "
        "reports (no call was made)")
    assert server.state.requests == 0
    assert (tmp_path / "out").read_text() == "my notes"


@pytest.mark.slow
@pytest.mark.parametrize("out", ["/proc/judge-reports/out", "{tmp}/notes.txt/out"])
def test_out_that_cannot_be_written_is_refused_before_any_call(
        server: ThreadedServer, tmp_path: Path, data_dir: Path, out: str) -> None:
    job = write_job(tmp_path / "jobs")
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    out = out.format(tmp=tmp_path)

    result = run_judge("run", job, "--limit", TASKS, "--base-url", server.url, "--cache-dir",
                       tmp_path / "cache", "--out", out, env=clean_env(data_dir), cwd=tmp_path)

    assert result.returncode == 2, result.stderr
    line = error_line(result.stderr)
    assert line.startswith(f"Error: --out {out}: "), line
    assert line.endswith("(no call was made)"), line
    assert server.state.requests == 0


@pytest.mark.slow
def test_a_full_disk_under_the_reports_leaves_the_previous_set_untouched(
        server: ThreadedServer, tmp_path: Path, data_dir: Path, small_disk: Path) -> None:
    job = write_job(tmp_path / "jobs")
    out = small_disk / "out"
    args = ("--limit", TASKS, "--base-url", server.url, "--cache-dir", tmp_path / "cache",
            "--out", out)
    first = run_judge("run", job, *args, env=clean_env(data_dir), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    before = _snapshot(out)
    filler = small_disk / "filler"
    with filler.open("wb") as f:  # fill what is left, bar a few kB
        free = __import__("shutil").disk_usage(small_disk).free
        f.write(b"\0" * max(0, free - 8192))

    full = run_judge("rescore", job, *args, env=clean_env(data_dir), cwd=tmp_path)

    assert full.returncode == 2, full.stderr
    line = full.stderr.strip().splitlines()[-1]
    assert line.startswith(f"Error: {out}: cannot write the reports (No space left on device); "
                           "the previous reports are untouched"), line
    assert "Traceback" not in full.stderr
    assert _snapshot(out) == before
    assert [p.name for p in small_disk.iterdir() if p.name.startswith(".")] == []
    assert not list((out / "history").glob(".*"))  # no stage
    filler.unlink()

    again = run_judge("rescore", job, *args, env=clean_env(data_dir), cwd=tmp_path)

    assert again.returncode == 0, again.stderr
    assert set(_snapshot(out)) == set(before)


@pytest.mark.slow
def test_a_kill_while_the_reports_are_written_never_leaves_a_mixed_set(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    """A set with a manifest is whole: its task count matches its judgments.jsonl."""
    import os
    import signal
    import subprocess
    job = write_job(tmp_path / "jobs")
    out = tmp_path / "out"
    common = ("--base-url", server.url, "--cache-dir", tmp_path / "cache", "--out", out)
    assert run_judge("run", job, "--limit", 40, *common, env=clean_env(data_dir),
                     cwd=tmp_path).returncode == 0
    assert run_judge("rescore", job, "--limit", 20, *common, env=clean_env(data_dir),
                     cwd=tmp_path).returncode == 0
    (out / ".scores.csv.abc123.tmp").write_text("a killed writer's leftover")
    os.utime(out / ".scores.csv.abc123.tmp", (0, 0))
    killed = 0
    for attempt in range(6):
        proc = subprocess.Popen(judge_cmd("rescore", job, "--limit", 40 - attempt, *common),
                                env=clean_env(data_dir), cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < deadline:
                stages = list((out / "history").glob(f".*.partial-{proc.pid}"))
                if stages and any(stages[0].iterdir()):
                    os.kill(proc.pid, signal.SIGKILL)
                    killed += 1
                    break
        finally:
            proc.kill()
            proc.wait()
        lines = (out / "judgments.jsonl").read_bytes().count(b"\n")
        manifest = orjson.loads((out / "manifest.json").read_bytes())
        assert manifest["counts"]["tasks"] == lines  # one set: the old one, or a whole new one
        assert (out / "latest").resolve().name == manifest["run_id"]  # and `latest` shows it
    assert killed >= 1
    final = run_judge("rescore", job, "--limit", 40, *common, env=clean_env(data_dir),
                      cwd=tmp_path)
    assert final.returncode == 0, final.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")] == []
    assert not list(out.glob(".*")) and not list((out / "history").glob(".*"))  # leftovers
    # of killed writers are gone


# ------------------------------------------------------------ signals

@pytest.mark.slow
def test_sigterm_stops_like_the_first_ctrl_c_and_exits_143(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    import os
    import signal
    import subprocess
    server.state.script.latency_s = 0.3
    job = write_job(tmp_path / "jobs")
    args = ["run", str(job), "--limit", "40", "--base-url", server.url, "--cache-dir",
            str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "--concurrency", "4"]
    proc = subprocess.Popen(judge_cmd(*args), env=clean_env(data_dir), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while server.state.answered < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()

    assert proc.returncode == 143, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("terminated: ") and last.endswith(
        f"tasks left; rerun to resume: judge {' '.join(args)}"), stderr
    assert "Traceback" not in stderr
    sent, answered = server.state.requests, server.state.answered
    assert sent == answered < 40  # what was in flight finished within the grace period
    server.state.script.latency_s = 0
    rerun = run_judge(*args, env=clean_env(data_dir), cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert server.state.requests == 40  # each task asked once over both runs


@pytest.mark.parametrize(("raised", "code"), [("KeyboardInterrupt", 130), ("Terminated", 143)])
def test_a_signal_while_the_commands_load_exits_without_a_traceback(
        monkeypatch: pytest.MonkeyPatch, raised: str, code: int) -> None:
    import builtins
    import sys

    import runner.cli
    real = builtins.__import__

    def interrupted(name: str, *args: object, **kwargs: object) -> object:
        if name == "runner.cli" and args[2] and "main" in args[2]:  # type: ignore[operator]
            raise getattr(runner.cli, raised, KeyboardInterrupt)()
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", interrupted)
    monkeypatch.delitem(sys.modules, "runner.cli.main", raising=False)
    with pytest.raises(SystemExit) as info:
        runner.cli.judge()
    assert info.value.code == code


# ------------------------------------------------------------ small ones

@pytest.mark.slow
def test_a_folder_as_the_job_or_the_data_file_is_one_clear_line(tmp_path: Path,
                                                                data_dir: Path) -> None:
    job = write_job(tmp_path / "jobs", MINE)
    (tmp_path / "jobs" / "data.jsonl").mkdir()

    as_job = run_judge("plan", tmp_path / "jobs", env=clean_env(data_dir), cwd=tmp_path)
    as_data = run_judge("plan", job, "--base-url", "http://127.0.0.1:9/v1",
                        env=clean_env(data_dir), cwd=tmp_path)

    assert (as_job.returncode, as_data.returncode) == (2, 2), as_job.stderr + as_data.stderr
    assert error_line(as_job.stderr) == f"Error: {tmp_path / 'jobs'}: is a folder, not a job " \
                                        "file; pass the job's .toml file (job.toml there)"
    assert error_line(as_data.stderr) == (
        f"Error: {job}: datasets[0].path points to {tmp_path / 'jobs' / 'data.jsonl'}, which is "
        "a folder; give the data file itself (.jsonl, .csv or .json)")


@pytest.mark.slow
def test_the_counts_add_up_to_the_tasks_in_run_and_rescore(server: ThreadedServer,
                                                           tmp_path: Path, data_dir: Path) -> None:
    """tst-formality's two prompts share requests: 12 tasks, 8 requests, 4 repeats."""
    from tests.test_cli import ROOT
    args = (ROOT / "jobs" / "tst-formality.toml", "--model", "fake", "--limit", 10,
            "--base-url", server.url, "--cache-dir", tmp_path / "cache", "--out", tmp_path / "o")
    env = clean_env(data_dir)
    lines = []
    for command in ("run", "rescore", "run"):
        result = run_judge(command, *args, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        lines += [line for line in result.stderr.splitlines() if " tasks: " in line]

    assert lines == [
        "12 tasks: 0 cached, 8 called, 4 repeat an earlier task, 0 failed, 0 not run "
        "(0 retries); 1792 tokens, cost unknown",
        "12 tasks: 8 cached, 0 called, 4 repeat an earlier task, 0 failed, 0 not run "
        "(0 retries); 0 tokens, cost unknown",  # the fake model has no price, called or not
        "12 tasks: 8 cached, 0 called, 4 repeat an earlier task, 0 failed, 0 not run "
        "(0 retries); 0 tokens, cost unknown"]
    assert server.state.requests == 8


@pytest.mark.slow
def test_a_cached_rerun_of_a_priced_model_costs_zero(server: ThreadedServer, tmp_path: Path,
                                                     data_dir: Path) -> None:
    """Where the price is known, a run that calls nothing says ~$0 (and its manifest 0.0)."""
    from tests.test_cli import manifest
    job = write_job(tmp_path / "jobs", JOB.replace(
        'spec = "fake"', 'spec = "fake"\nprice = {input = 1.0, output = 2.0}'))
    args = (job, "--limit", 4, "--base-url", server.url, "--cache-dir", tmp_path / "cache",
            "--out", tmp_path / "o")
    costs = []
    for _ in range(2):
        result = run_judge("run", *args, env=clean_env(data_dir), cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        line = next(x for x in result.stderr.splitlines() if " tasks: " in x)
        costs.append((line.rpartition(" tokens, ")[2], manifest(tmp_path / "o")[
            "estimated_cost_usd"]))

    assert costs[0][0].startswith("~$") and costs[0][0] != "~$0.0000" and costs[0][1] > 0
    assert costs[1] == ("~$0.0000", 0.0)


# ------------------------------------------------------------ one process

def test_judge_processes_1_runs_every_command_in_one_process() -> None:
    from runner import children as child
    before = child.second_core()
    try:
        child.one_process(True)
        assert not child.second_core() and not child.forkable()
    finally:
        child.one_process(False)
    assert child.second_core() == before


@pytest.mark.slow
def test_a_bad_judge_processes_is_one_error_line(tmp_path: Path, data_dir: Path) -> None:
    result = run_judge("plan", write_job(tmp_path / "jobs"), "--base-url",
                       "http://127.0.0.1:9/v1", env=clean_env(data_dir, JUDGE_PROCESSES="2"),
                       cwd=tmp_path)
    assert result.returncode == 2
    assert error_line(result.stderr) == ("Error: JUDGE_PROCESSES must be 1 (every command in one "
                                         "process) or unset (got '2')")
