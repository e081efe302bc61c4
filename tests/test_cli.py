"""The `judge` command as a user sees it: exit codes, stderr lines, report files, server traffic.

Runs that matter end to end go through the installed `judge` script in a subprocess, against
the fake server on 127.0.0.1 and a cache dir under tmp_path; the rest use click's CliRunner in
process (same code path, no interpreter start-up). Every run is bounded by a timeout.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click
import orjson
import pytest
from click.testing import CliRunner, Result

from runner.cli.main import cli
from runner.session.pool import run_async
from tests.fakeserver import ThreadedServer

ROOT = Path(__file__).resolve().parents[1]
OPENMEVA = ROOT / "jobs" / "openmeva.toml"
TEMPLATE = ROOT / "prompts" / "wang2023" / "openmeva.txt"
JUDGE = shutil.which("judge", path=str(Path(sys.executable).parent)) or "judge"
REPORTS = ("judgments.jsonl", "scores.csv", "correlations.csv", "summary.csv", "report.md",
           "manifest.json")
# The per-task keys report.py documents for judgments.jsonl (more may follow).
JUDGMENT_KEYS = {"dataset", "item_id", "group", "system", "subset", "prompt", "aspect", "model",
                 "sample", "key", "score", "values", "raw", "error", "cached", "usage"}
COUNT_KEYS = {"tasks", "cache_hits", "api_calls", "retries", "failures"}
ENV_KEYS = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "JUDGE_CACHE_DIR", "JUDGE_DATA_MIRROR")
FAILED_LINE = re.compile(r"^failed [0-9a-f]{12}: ", re.M)
SUBPROCESS_TIMEOUT_S = 60

# A small job for variations: openmeva with the stars prompt and one bare model.
JOB = f"""
[limits]
concurrency = 4
max_retries = 3
timeout_s = 10

[[datasets]]
name = "openmeva"

[[prompts]]
name = "stars"
template = "{TEMPLATE}"
parser = "stars"
aspects = ["overall"]
params = {{ temperature = 0, max_tokens = 32 }}

[prompts.parser_options.levels]
"Perfect storyline and grammar" = 5

[models.fake]
spec = "fake"
"""


# ---------------------------------------------------------------- helpers (shared by test_*)

def clean_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """os.environ without the variables that would change a run, plus JUDGE_DATA_DIR."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    env["JUDGE_DATA_DIR"] = str(data_dir)
    env.update(extra)
    return env


def judge_cmd(*args: Any) -> list[str]:
    return [JUDGE, *map(str, args)]


def run_judge(*args: Any, env: Mapping[str, str], cwd: Path,
              timeout: float = SUBPROCESS_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """The real `judge` script in a subprocess."""
    return subprocess.run(judge_cmd(*args), env=dict(env), cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, check=False)


def write_job(folder: Path, text: str = JOB, name: str = "job.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def closed_port() -> int:
    """A port on 127.0.0.1 with nothing listening (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def judgments(out: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (out / "judgments.jsonl").read_bytes().splitlines()]


def manifest(out: Path) -> dict[str, Any]:
    return orjson.loads((out / "manifest.json").read_bytes())


def error_line(stderr: str) -> str:
    """The single line a configuration error prints."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("Error: "), stderr
    return lines[0]


@pytest.fixture
def invoke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data_dir: Path) -> Any:
    """CliRunner in tmp_path with a clean environment; unexpected exceptions raise."""
    monkeypatch.chdir(tmp_path)
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("JUDGE_DATA_DIR", str(data_dir))

    def call(*args: Any, env: Mapping[str, str | None] | None = None) -> Result:
        return CliRunner().invoke(cli, [str(a) for a in args], env=env,
                                  catch_exceptions=False)

    return call


# ---------------------------------------------------------------- judge run, end to end

@pytest.mark.slow
def test_run_writes_every_report_and_a_rerun_makes_no_call(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    args = ("run", OPENMEVA, "--limit", 50, "--base-url", server.url, "--model", "fake",
            "--cache-dir", cache, "--out", out)
    env = clean_env(data_dir)

    first = run_judge(*args, env=env, cwd=tmp_path)

    assert first.returncode == 0, first.stderr
    assert "50 tasks: 0 cached, 50 called, 0 repeat an earlier task, 0 failed, 0 not run " \
           "(0 retries)" in first.stderr
    assert server.state.requests == 50 and set(server.state.bodies.values()) == {1}
    for name in REPORTS:
        assert (out / name).stat().st_size > 0, name
    lines = judgments(out)
    assert len(lines) == 50
    assert all(JUDGMENT_KEYS <= line.keys() for line in lines)
    assert len({line["key"] for line in lines}) == 50
    assert all(line["error"] is None and line["score"] in (1.0, 2.0, 3.0, 4.0, 5.0)
               and line["cached"] is False and line["usage"]["prompt_tokens"] > 0
               for line in lines)
    with (out / "scores.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 50 and {r["model"] for r in rows} == {"fake"}
    assert rows[0]["human_score"] != ""
    with (out / "correlations.csv").open(newline="") as f:
        judges = {r["judge"] for r in csv.DictReader(f)}
    assert "fake/stars" in judges
    assert re.search(r"^\| fake/stars \| ", (out / "report.md").read_text(), re.M)
    m = manifest(out)
    assert COUNT_KEYS <= m["counts"].keys()
    assert {k: m["counts"][k] for k in COUNT_KEYS} == {
        "tasks": 50, "cache_hits": 0, "api_calls": 50, "retries": 0, "failures": 0}
    assert m["usage"]["prompt_tokens"] > 0 and m["usage"]["completion_tokens"] == 150

    second = run_judge(*args, env=env, cwd=tmp_path)

    assert second.returncode == 0, second.stderr
    assert server.state.requests == 50, "the rerun called the server"
    m = manifest(out)
    assert {k: m["counts"][k] for k in COUNT_KEYS} == {
        "tasks": 50, "cache_hits": 50, "api_calls": 0, "retries": 0, "failures": 0}
    again = judgments(out)
    assert all(line["cached"] is True for line in again)
    assert [line["score"] for line in again] == [line["score"] for line in lines]


@pytest.mark.slow
def test_fault_mix_keeps_manifest_and_judgments_in_agreement(
        server: ThreadedServer, tmp_path: Path, data_dir: Path) -> None:
    script = server.state.script
    script.faults = {"429": 0.10, "500": 0.05, "drop": 0.02, "malformed": 0.01}
    script.retry_after = 0.01
    out = tmp_path / "out"
    result = run_judge("run", OPENMEVA, "--limit", 40, "--base-url", server.url, "--model",
                       "fake", "--cache-dir", tmp_path / "cache", "--out", out,
                       "--max-retries", 2, env=clean_env(data_dir), cwd=tmp_path)

    assert result.returncode in (0, 1), result.stderr
    assert sum(server.state.status[s] for s in ("429", "500", "drop", "malformed")) > 0
    m, lines = manifest(out), judgments(out)
    api_failed = [line for line in lines if (line["error"] or {}).get("type") == "api"]
    assert len(lines) == m["counts"]["tasks"] == 40
    assert len(api_failed) == m["counts"]["failures"]
    assert m["counts"]["api_calls"] + m["counts"]["failures"] == 40
    assert m["counts"]["api_calls"] == server.state.answered
    assert m["counts"]["retries"] > 0
    assert (result.returncode == 1) == bool(api_failed)
    assert len(FAILED_LINE.findall(result.stderr)) == min(len(api_failed), 20)
    for line in api_failed:
        assert f"failed {line['key'][:12]}: " in result.stderr


def test_permanent_400_fails_those_tasks_with_the_servers_message(
        server: ThreadedServer, invoke: Any, tmp_path: Path) -> None:
    server.state.script.queue = ["400", "400", "400"]
    out = tmp_path / "out"
    args = ("run", OPENMEVA, "--limit", 20, "--base-url", server.url, "--model", "fake",
            "--cache-dir", tmp_path / "cache", "--out", out)

    result = invoke(*args)

    assert result.exit_code == 1, result.stderr
    assert server.state.requests == 20, "a 400 must not be retried"
    failed = [line for line in judgments(out) if line["error"] is not None]
    assert len(failed) == 3 == manifest(out)["counts"]["failures"]
    for line in failed:
        assert line["error"] == {"type": "api", "message": "400: fake 400"}
        assert f"failed {line['key'][:12]}: 400: fake 400" in result.stderr.splitlines()

    rerun = invoke(*args)  # failures are not cached: the rerun asks for exactly those again

    assert rerun.exit_code == 0, rerun.stderr
    assert server.state.requests == 23
    assert all(line["error"] is None for line in judgments(out))


# ---------------------------------------------------------------- bad input: exit 2, no call

BAD_JOBS = {
    "malformed TOML": (
        lambda job: "name = 'x'\n[limits\n",
        r"{job}: not valid TOML \(.*line 2.*\); fix the syntax"),
    "byte-order mark": (  # Windows Notepad's "UTF-8 with BOM"; tomllib: "Invalid statement"
        lambda job: "\ufeff" + JOB,
        r"{job}: starts with a UTF-8 byte-order mark \(BOM\), which TOML readers refuse; save "
        r"the file as UTF-8 without BOM"),
    "unknown parser": (
        lambda job: JOB.replace('parser = "stars"', 'parser = "nosuch"'),
        r"{job}: prompts\[0\]\.parser is wrong: unknown parser 'nosuch'; known parsers: .*stars"),
    "unknown parser option": (
        lambda job: JOB.replace('[prompts.parser_options.levels]\n"Perfect storyline and '
                                'grammar" = 5', '[prompts.parser_options]\ncolour = 1'),
        r"{job}: prompts\[0\]\.parser is wrong: parser 'stars': unknown option 'colour'; "
        r"valid options: .*levels.*"),
    "unknown placeholder": (
        lambda job: JOB.replace(str(TEMPLATE), str(job.parent / "t.txt")),
        r"{job}: prompts\[0\]\.template uses \{{\{{nosuch\}}\}}, which data set 'openmeva' does "
        r"not have; its fields are .*storyline"),
    "unregistered data set": (
        lambda job: JOB.replace('name = "openmeva"', 'name = "nosuchset"'),
        r"{job}: datasets: 'nosuchset' is not a registered data set \(.*openmeva.*\); or give "
        r'path = "your.jsonl" and fields'),
    "user data file missing": (
        lambda job: JOB.replace('name = "openmeva"', 'name = "mine"\npath = "missing.jsonl"\n'
                                'fields = { text = { storyline = "out", beginning = "src" } }'),
        r"{job}: datasets\[0\]\.path points to {missing}, which does not exist; fix the path "
        r"\(relative to the job file\)"),
}


@pytest.mark.parametrize("case", list(BAD_JOBS))
def test_bad_job_is_one_error_line_exit_2_and_no_call(
        case: str, server: ThreadedServer, invoke: Any, tmp_path: Path) -> None:
    make, pattern = BAD_JOBS[case]
    job = tmp_path / "jobs" / "job.toml"
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "t.txt").write_text("Rate {{storyline}} after {{nosuch}}.\nStars:")
    write_job(job.parent, make(job))

    result = invoke("run", job, "--limit", 5, "--base-url", server.url,
                    "--cache-dir", tmp_path / "cache", "--out", tmp_path / "out")

    assert result.exit_code == 2, result.output
    line = error_line(result.stderr)
    expected = pattern.format(job=re.escape(str(job)),
                              missing=re.escape(str(job.parent / "missing.jsonl")))
    assert re.fullmatch("Error: " + expected, line), line
    assert server.state.requests == 0
    assert not (tmp_path / "out").exists()


def test_registered_data_set_not_downloaded_names_the_file_and_the_fix(
        server: ThreadedServer, invoke: Any, tmp_path: Path) -> None:
    empty = tmp_path / "data"
    result = invoke("plan", OPENMEVA, "--limit", 5, "--base-url", server.url, "--model", "fake",
                    "--cache-dir", tmp_path / "cache", env={"JUDGE_DATA_DIR": str(empty)})

    assert result.exit_code == 2
    line = error_line(result.stderr)
    assert line.startswith(f"Error: {empty / 'openmeva'}"), line
    assert "judge datasets fetch openmeva" in line
    assert server.state.requests == 0


def test_run_whose_data_set_cannot_be_downloaded_makes_no_call(
        server: ThreadedServer, invoke: Any, tmp_path: Path) -> None:
    """`run` downloads a missing set first; the mirror (a closed 127.0.0.1 port) fails."""
    empty = tmp_path / "data"
    result = invoke("run", OPENMEVA, "--limit", 5, "--base-url", server.url, "--model", "fake",
                    "--cache-dir", tmp_path / "cache",
                    env={"JUDGE_DATA_DIR": str(empty), "JUDGE_DATA_MIRROR": "http://127.0.0.1:9"})

    assert result.exit_code == 2
    first, line = result.stderr.strip().splitlines()  # the notice, then one error line
    assert first.startswith("data set openmeva: 1 file(s) not in")
    assert line.startswith("Error: http://127.0.0.1:9/krystalan/"), line
    assert line.endswith("openmeva/data/openmeva.json was not written; check the network or "
                         "pass a mirror")
    assert not list(empty.rglob("*.json"))
    assert server.state.requests == 0


def test_openai_model_without_a_key_stops_before_any_call(
        server: ThreadedServer, invoke: Any, tmp_path: Path) -> None:
    # --base-url points the openai: model at the fake server, so a call would be counted.
    result = invoke("run", OPENMEVA, "--limit", 5, "--model", "openai:gpt-4o-mini",
                    "--base-url", server.url, "--cache-dir", tmp_path / "cache")

    assert result.exit_code == 2
    assert error_line(result.stderr) == (
        f"Error: {OPENMEVA}: model 'openai:gpt-4o-mini' (openai:gpt-4o-mini) needs an API key: "
        "set OPENAI_API_KEY (no call was made)")
    assert server.state.requests == 0


def test_bare_model_without_a_server_says_how_to_give_one(invoke: Any, tmp_path: Path) -> None:
    result = invoke("run", OPENMEVA, "--limit", 5, "--model", "fake",
                    "--cache-dir", tmp_path / "cache")

    assert result.exit_code == 2
    assert error_line(result.stderr) == (
        f"Error: {OPENMEVA}: model 'fake' needs its server's URL, even offline (its answers "
        "are cached under it): pass --base-url http://HOST:PORT/v1, set OPENAI_BASE_URL, or use "
        "openai:NAME")


def test_budget_without_a_price_is_a_configuration_error(
        server: ThreadedServer, invoke: Any, tmp_path: Path) -> None:
    result = invoke("run", OPENMEVA, "--limit", 5, "--model", "fake", "--base-url", server.url,
                    "--budget", 1, "--cache-dir", tmp_path / "cache")

    assert result.exit_code == 2
    assert error_line(result.stderr).startswith(
        f"Error: {OPENMEVA}: --budget needs a price for model 'fake'")
    assert server.state.requests == 0


# ---------------------------------------------------------------- rescore: cache only

def _levels_reply(body: dict[str, Any]) -> str:
    """Every third story gets a level description instead of a number of stars."""
    text = body["messages"][-1]["content"]
    return "Perfect storyline and grammar" if len(text) % 3 == 0 else "3 stars"


def _report_files(out: Path) -> dict[str, Any]:
    files: dict[str, Any] = {n: (out / n).read_bytes() for n in REPORTS if n != "manifest.json"}
    m = manifest(out)
    for volatile in ("started", "ended", "command", "run_id", "kind"):  # a run, or a rebuild
        m.pop(volatile)
    files["manifest.json"] = m
    return files


def test_rescore_rebuilds_reports_from_the_cache_without_a_server(
        invoke: Any, tmp_path: Path) -> None:
    job = write_job(tmp_path / "jobs")
    cache, out = tmp_path / "cache", tmp_path / "out"
    with ThreadedServer() as server:
        server.state.script.reply = _levels_reply
        url = server.url
        args = (job, "--limit", 30, "--base-url", url, "--cache-dir", cache, "--out", out)
        assert invoke("run", *args).exit_code == 0
        assert invoke("run", *args).exit_code == 0  # all cached: `cached` true, as rescore says
        calls = server.state.requests
    assert calls == 30
    with pytest.raises(OSError):  # the server is gone: any network use would fail
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
    before = _report_files(out)
    (out / "judgments.jsonl").unlink()

    result = invoke("rescore", *args)

    assert result.exit_code == 0, result.stderr
    assert _report_files(out) == before
    assert manifest(out)["kind"] == "rebuild"
    scores = {line["item_id"]: line["score"] for line in judgments(out)}
    levels = {line["item_id"] for line in judgments(out) if line["raw"].startswith("Perfect")}
    assert levels and {scores[i] for i in levels} == {5.0}

    job.write_text(JOB.replace('"Perfect storyline and grammar" = 5',
                               '"Perfect storyline and grammar" = 2'))
    result = invoke("rescore", *args)

    assert result.exit_code == 0, result.stderr
    rescored = {line["item_id"]: line["score"] for line in judgments(out)}
    assert {rescored[i] for i in levels} == {2.0}
    assert {i: s for i, s in rescored.items() if i not in levels} == {
        i: s for i, s in scores.items() if i not in levels}
    assert manifest(out)["counts"]["cache_hits"] == 30


# ---------------------------------------------------------------- --offline and --budget

def test_offline_makes_no_request_and_reports_the_misses(
        server: ThreadedServer, invoke: Any, tmp_path: Path) -> None:
    common = ("--base-url", server.url, "--model", "fake", "--cache-dir", tmp_path / "cache",
              "--out", tmp_path / "out")
    assert invoke("run", OPENMEVA, "--limit", 10, *common).exit_code == 0
    assert server.state.requests == 10

    result = invoke("run", OPENMEVA, "--limit", 20, "--offline", *common)

    assert server.state.requests == 10
    assert result.exit_code == 1, result.stderr  # a partial report, not asked for
    assert "20 tasks: 10 cached, 0 called, 0 repeat an earlier task, 0 failed, 10 not run " \
           "(0 retries)" in result.stderr
    assert re.search(r"^10 of 20 tasks have no cached answer, and the reports leave them out: "
                     r"`judge run` calls them, or pass --partial to accept a partial report "
                     r"\(first keys: [0-9a-f]{12}, ",
                     result.stderr, re.M), result.stderr
    assert invoke("run", OPENMEVA, "--limit", 20, "--offline", "--partial", *common
                  ).exit_code == 0
    counts = manifest(tmp_path / "out")["counts"]
    assert (counts["cache_hits"], counts["api_calls"], counts["not_run"]) == (10, 0, 10)
    missing = [line for line in judgments(tmp_path / "out") if line["score"] is None]
    assert len(missing) == 10
    assert all(line["error"]["type"] == "api" and "no cached answer" in line["error"]["message"]
               for line in missing)


def test_budget_stops_dispatching_before_the_limit(
        server: ThreadedServer, invoke: Any, tmp_path: Path) -> None:
    # ~190 prompt + 32 reserved tokens at $1000 per 1M tokens: ~$0.22 a task, so $1 buys 4.
    job = write_job(tmp_path / "jobs", JOB + "price = { input = 1000, output = 1000 }\n")
    out = tmp_path / "out"

    result = invoke("run", job, "--limit", 50, "--base-url", server.url, "--budget", 1,
                    "--cache-dir", tmp_path / "cache", "--out", out)

    assert result.exit_code == 0, result.stderr
    counts = manifest(out)["counts"]
    assert 1 <= server.state.requests == counts["api_calls"] <= 5
    assert counts["api_calls"] + counts["not_run"] == 50
    assert f"--budget reached: {counts['not_run']} tasks not run" in result.stderr
    assert manifest(out)["estimated_cost_usd"] <= 1.0


# ---------------------------------------------------------------- plan, status, cache

def test_plan_counts_tasks_cached_answers_and_cost_without_network(
        invoke: Any, tmp_path: Path) -> None:
    cache = ("--cache-dir", tmp_path / "cache")
    model = ("--model", "openai:gpt-4o-mini")
    with ThreadedServer() as server:  # 10 answers from an endpoint that is then closed
        filled = server.url
        assert invoke("run", OPENMEVA, "--limit", 10, *model, "--base-url", filled, *cache,
                      "--out", tmp_path / "out", env={"OPENAI_API_KEY": "sk-test"}
                      ).exit_code == 0
    closed = f"http://127.0.0.1:{closed_port()}/v1"

    fresh = invoke("plan", OPENMEVA, "--limit", 50, *model, "--base-url", closed, *cache)
    partly = invoke("plan", OPENMEVA, "--limit", 50, *model, "--base-url", filled, *cache)

    assert fresh.exit_code == 0 and partly.exit_code == 0, fresh.stderr + partly.stderr
    head, row, short, total = fresh.stdout.splitlines()
    assert head == "job openmeva: 50 items, 1 prompts, 1 models"
    m = re.fullmatch(r"  openai:gpt-4o-mini \(openai:gpt-4o-mini\): 50 tasks, 0 cached, 0 repeat "
                     r"an earlier request, 50 to call, ~(\d+) prompt \+ <=1600 completion tokens, "
                     r"~\$(\d+\.\d{4}) online, prompt caching ~\$(\d+\.\d{4}), "
                     r"batch ~\$(\d+\.\d{4})", row)
    assert m, row
    cost = (int(m[1]) * 0.15 + 1600 * 0.60) / 1e6
    assert m[2] == m[3] == f"{cost:.4f}"  # the prompt is too short to be cached:
    assert re.fullmatch(r"    stars \(overall\): too short to be cached \(static prefix ~\d+ "
                        r"tokens, under openai's minimum of 1024\)", short), short
    assert total == f"total: ~${cost:.4f} online, prompt caching ~${cost:.4f}, " \
                    f"batch ~${cost / 2:.4f}"
    assert m[4] == f"{cost / 2:.4f}"  # the Batch API's price: half
    assert ": 50 tasks, 10 cached, 0 repeat an earlier request, 40 to call, " in partly.stdout


def test_status_before_and_after_a_run(server: ThreadedServer, invoke: Any,
                                       tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = (OPENMEVA, "--limit", 20, "--base-url", server.url, "--model", "fake",
            "--cache-dir", tmp_path / "cache", "--out", out)

    before = invoke("status", *args)
    assert invoke("run", *args).exit_code == 0
    after = invoke("status", *args)

    assert before.exit_code == 0 and after.exit_code == 0
    assert before.stdout.splitlines() == [
        "job openmeva: 0/20 tasks cached, 20 to call",
        f"no run yet ({out / 'manifest.json'} does not exist)"]
    first, last = after.stdout.splitlines()
    assert first == "job openmeva: 20/20 tasks cached, 0 to call"
    assert re.fullmatch(r"last run \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ: .*", last), last
    assert "tasks 20" in last and "api_calls 20" in last and "failures 0" in last
    assert server.state.requests == 20


def test_cache_stats_and_explain(server: ThreadedServer, invoke: Any, tmp_path: Path) -> None:
    cache, out = tmp_path / "cache", tmp_path / "out"
    select = (OPENMEVA, "--limit", 5, "--base-url", server.url, "--model", "fake",
              "--cache-dir", cache)
    item = "125:fusion"  # the first story of openmeva, first generator

    not_yet = invoke("cache", "explain", *select, "--item", item)
    assert invoke("run", *select, "--out", out).exit_code == 0
    explained = invoke("cache", "explain", *select, "--item", item)
    stats = invoke("cache", "stats", "--cache-dir", cache)

    key = next(line["key"] for line in judgments(out) if line["item_id"] == item)
    assert not_yet.exit_code == 0 and explained.exit_code == 0
    lines = explained.stdout.splitlines()
    assert lines[0] == f"openmeva {item} prompt=stars aspect=overall model=fake sample=0"
    assert lines[1] == f"  endpoint: {server.url}"
    assert lines[2] == "  model:    fake"
    assert lines[3] == '  params:   {"max_tokens":32,"stop":["\\n"],"temperature":0}'
    assert re.fullmatch(r"  messages: 1, sha256 [0-9a-f]{16}", lines[4])
    assert lines[5] == f"  key:      {key}  cached"
    assert not_yet.stdout.splitlines()[5] == f"  key:      {key}  NOT cached"
    assert stats.exit_code == 0
    assert re.fullmatch(rf"{re.escape(str(cache))}: 5 entries, \d+\.\d MB\n", stats.stdout)


def test_cache_commands_name_what_is_wrong(server: ThreadedServer, invoke: Any,
                                           tmp_path: Path) -> None:
    missing = tmp_path / "nocache"
    stats = invoke("cache", "stats", "--cache-dir", missing)
    explain = invoke("cache", "explain", OPENMEVA, "--limit", 5, "--base-url", server.url,
                     "--model", "fake", "--cache-dir", tmp_path / "cache", "--item", "nope")

    assert stats.exit_code == 2
    assert error_line(stats.stderr) == (
        f"Error: {missing}: no cache here; pass --cache-dir or set JUDGE_CACHE_DIR")
    assert explain.exit_code == 2
    assert error_line(explain.stderr) == (
        f"Error: {OPENMEVA}: no task has item id 'nope' (ids look like '125:fusion')")


# ---------------------------------------------------------------- help

def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name)


@pytest.mark.parametrize("path", list(_commands(cli)), ids=lambda p: " ".join(p) or "judge")
def test_every_command_has_help(path: tuple[str, ...], invoke: Any) -> None:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    assert command.help, f"judge {' '.join(path)} has no docstring"

    result = invoke(*path, "--help")

    assert result.exit_code == 0
    assert result.stdout.startswith(f"Usage: cli {' '.join(path)}".rstrip() + " ")
    first_line = command.help.strip().splitlines()[0].strip()
    assert first_line[:40] in " ".join(result.stdout.split())


# ---------------------------------------------------------------- start-up: lazy imports

HEAVY = ("numpy", "scipy", "aiohttp", "asyncio", "tqdm", "matplotlib", "psycopg", "uvloop")
# Runs the CLI in a fresh interpreter, then names the heavy modules it had to import.
PROBE = ("import sys\nfrom runner.cli.main import cli\ntry:\n"
         "    cli.main(sys.argv[1:], prog_name='judge', standalone_mode=False)\nfinally:\n"
         f"    print('imported:', *[m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)")


@pytest.mark.slow
@pytest.mark.parametrize(("args", "wanted"), [
    (("--help",), set()),
    (("plan", "{job}", "--limit", "3", "--base-url", "{url}"), set()),
    (("status", "{job}", "--limit", "3", "--base-url", "{url}"), set()),
    (("datasets", "list"), set()),
    (("rescore", "{job}", "--limit", "3", "--base-url", "{url}", "--partial"), {"numpy"}),
    (("run", "{job}", "--limit", "3", "--base-url", "{url}"),
     {"numpy", "aiohttp", "asyncio", "tqdm"}),  # asyncio's loop: uvloop bought nothing
])
def test_commands_import_only_what_they_use(args: tuple[str, ...], wanted: set[str],
                                            tmp_path: Path, data_dir: Path) -> None:
    """scipy.stats alone took 0.7-1.5 s to import, aiohttp ~0.17 s, asyncio ~65 ms; no command
    pays for what it does not use (rescore calls nothing: no aiohttp, no asyncio)."""
    job = write_job(tmp_path)
    with ThreadedServer() as server:
        argv = [a.format(job=job, url=server.url) for a in args]
        proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True,
                              text=True, env=clean_env(data_dir), cwd=tmp_path,
                              timeout=SUBPROCESS_TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("imported:"), proc.stderr
    assert set(line.split()[1:]) == wanted


def test_run_async_returns_the_result_without_formatting_it() -> None:
    """asyncio.run on Python 3.11 formats its main task's repr, result included, on the way
    out (a WorkingSet of 25k items took 0.5 s and 70 MB)."""

    formatted: list[bool] = []

    class Loud:
        def __repr__(self) -> str:
            formatted.append(True)  # asyncio would swallow an exception raised here
            return "Loud()"

    async def work() -> Loud:
        return Loud()

    assert isinstance(run_async(work()), Loud)
    assert not formatted

