"""`judge serve`: the desk over a folder of runs, through aiohttp's test client against two real
runs (the fake server, a real cache and report folder), and the served figures against the
CLI's and the files'."""

from __future__ import annotations

import csv
import hashlib
import html
import os
import re
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from click.testing import CliRunner

import runner
from runner.cli.main import cli
from runner.data.annotations import append_rating, read_ratings
from runner.execute.store.cache import Cache
from runner.execute.store.lease import describe, lease_id, lease_name
from runner.prepare import prepare
from runner.report.html import read_page_data
from runner.serve import Desk, make_app, new_token
from runner.serve import desk as desk_module
from runner.serve import live as live_module
from runner.serve.live import LiveRuns, holder
from runner.serve.rate import ratings_path, record
from tests import test_report
from tests.conftest import DATA_DIR
from tests.fakeserver import Script, ThreadedServer
from tests.processes import Child, Processes, processes_fixture, wait_until  # noqa: F401
from tests.test_cli import JOB, clean_env, error_line, judge_cmd, run_judge, write_job
from tests.test_ratings import RATED_JOB, rated_job

LIMIT = 40


def reply(body: dict[str, Any]) -> str:
    """A score from the story's hash for most, a level description (whose score the second
    run's parser changes) for every 3rd, an answer that does not parse for every 7th."""
    text = body["messages"][-1]["content"]
    digest = int(hashlib.sha256(text.encode()).hexdigest(), 16)
    if digest % 7 == 0:
        return "no idea"
    return "Perfect storyline and grammar" if digest % 3 == 0 else f"{digest % 5 + 1} stars"


@dataclass
class Study:
    root: Path
    job: Path
    runs: Path
    first: str
    second: str
    base_url: str = ""  # the fake server's, which the cache keys name


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Study]:
    """Two kept runs of one job: a run, then a rescore after a parser change."""
    root = tmp_path_factory.mktemp("desk")
    job = write_job(root / "jobs")
    with ThreadedServer(Script(reply=reply)) as server:
        options: dict[str, Any] = {"limit": LIMIT, "base_url": server.url, "data_dir": DATA_DIR,
                                   "cache_dir": root / "cache", "out": root / "runs" / "job",
                                   "environ": {}}
        runner.run(job, **options)
        job.write_text(JOB.replace('"Perfect storyline and grammar" = 5',
                                   '"Perfect storyline and grammar" = 1'))
        runner.rescore(job, **options)
    first, second = sorted(p.name for p in (root / "runs" / "job" / "history").iterdir())
    yield Study(root, job, root / "runs", first, second)


@pytest.fixture
async def client(study: Study) -> Any:
    app = make_app(Desk(study.runs, DATA_DIR, annotator="alice"))
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        yield c


async def test_the_index_lists_every_kept_run(client: Any, study: Study,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's table holds judge runs' rows, cell for cell."""
    page = await (await client.get("/")).text()
    assert "<h2>job</h2>" in page
    assert page.index(study.first) < page.index(study.second)
    assert f"/run/job/{study.second}" in page
    monkeypatch.chdir(study.root)
    printed = CliRunner().invoke(cli, ["runs", str(study.job), "--out", str(study.runs / "job")])
    assert printed.exit_code == 0, printed.output
    rows = re.findall(r"<tr><td><input type=radio.*?</td>(.*?)</tr>", page)
    cells = [html.unescape(re.sub(r"<[^>]+>", " ", r)).split() for r in rows]
    assert [c[:-1] for c in cells] == [line.split() for line in printed.stdout.splitlines()[1:]]


async def test_each_page_reads_the_kept_runs_once(client: Any, study: Study,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The index, a run's page (its live line included) and two runs side by side read every
    kept run's manifest once: as often as listing the jobs' runs does, not again for the live
    line or the job file."""
    read: list[Path] = []
    real = desk_module._manifest

    def counted(run: Path) -> Any:
        read.append(run)
        return real(run)

    monkeypatch.setattr(desk_module, "_manifest", counted)
    desk = Desk(study.runs, DATA_DIR)
    {job: desk.runs(job) for job in desk.folders()}
    listing = len(read)  # every job's name (its newest manifest), then its runs
    read.clear()
    desk.runs("job")
    one_job = len(read)  # the job's folder found by name, then its runs
    for page, once in (("/", listing), (f"/run/job/{study.first}", one_job),
                       (f"/diff?job=job&a={study.first}&b={study.second}", one_job)):
        read.clear()
        assert (await client.get(page)).status == 200
        assert len(read) == once, page


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


async def test_a_run_page_shows_the_report_figures(client: Any, study: Study) -> None:
    folder = study.runs / "job" / "history" / study.first
    page = await (await client.get(f"/run/job/{study.first}")).text()
    shown = re.findall(r"<td class='num figure'>([^<]*)</td>", page)
    files = [r for r in _csv(folder / "correlations.csv") if r["subset"] == "all"]
    assert shown == [f"{float(r['value']):.3f}" if r["value"] else "n/a" for r in files]
    # and the report.html's own figures (the page a user opens), level by level
    embedded = {(c["level"], c["method"]): c["value"]
                for c in _correlations(read_page_data(folder / "report.html"))}
    assert embedded and all(f"{value:.3f}" in shown for value in embedded.values()
                            if value is not None)
    report = await client.get(f"/run/job/{study.first}/report.html")
    assert report.status == 200 and (await report.read()) == (folder / "report.html").read_bytes()


def _correlations(data: Any) -> list[dict[str, Any]]:
    """Every row of report.html's data that is an all-items correlation of the judge."""
    found: list[dict[str, Any]] = []
    if isinstance(data, dict):
        if {"level", "method", "value"} <= data.keys() and data.get("subset") == "all" \
                and data.get("judge") == "fake/stars":
            found.append(data)
        for v in data.values():
            found += _correlations(v)
    elif isinstance(data, list):
        for v in data:
            found += _correlations(v)
    return found


async def test_side_by_side_shows_judge_diffs_lines(client: Any, study: Study,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(study.root)
    monkeypatch.setenv("JUDGE_DATA_DIR", str(DATA_DIR))
    printed = CliRunner().invoke(cli, ["diff", str(study.job), study.first, study.second,
                                       "--out", str(study.runs / "job")])
    assert printed.exit_code == 0, printed.output
    page = await (await client.get("/diff", params={"job": "job", "a": study.first,
                                                    "b": study.second})).text()
    lines = re.search(r"<pre id=diff-lines>(.*?)</pre>", page, re.S)
    assert lines is not None
    cli_lines = printed.stdout.splitlines()[1:]
    assert cli_lines and html.unescape(lines[1]).splitlines() == cli_lines
    assert "+0.000" not in lines[1]  # the parser change moved the figures
    assert f"/run/job/{study.first}/report.html" in page
    assert f"/run/job/{study.second}/report.html" in page


async def test_the_item_browser_filters_across_runs(client: Any, study: Study) -> None:
    both = {"job": "job", "run": [study.first, study.second]}
    page = await (await client.get("/items", params=[("job", "job"), ("run", study.first),
                                                     ("run", study.second)])).text()
    rows = re.findall(r"<tr data-job='job' data-run='([^']*)' data-key='([^']*)'>", page)
    assert {run for run, _ in rows} == {study.first, study.second}
    assert len(rows) == 2 * LIMIT
    failed = await (await client.get("/items", params=[("job", "job"), ("run", study.first),
                                                       ("status", "failed")])).text()
    keys = re.findall(r"data-key='([^']*)'", failed)
    judgments = [r for r in _jsonl(study.runs / "job" / "history" / study.first)
                 if r["error"]]
    assert keys and sorted(keys) == sorted(j["key"] for j in judgments)
    far = await (await client.get("/items", params={**both, "run": study.first,
                                                    "disagree": "3"})).text()
    diffs = [float(d) for d in re.findall(r"<td class=num>(\d\.\d{3})</td>", far)]
    assert diffs and min(diffs) >= 3 and diffs == sorted(diffs, reverse=True)
    one = await (await client.get("/judgment", params={"job": "job", "run": study.first,
                                                       "key": judgments[0]["key"]})).json()
    assert one["answer"] == "no idea"
    assert "[user]" in one["request"] and "[parameters]" in one["request"]


def _jsonl(run: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (run / "judgments.jsonl").read_bytes().splitlines()]


async def test_rating_appends_and_resumes_in_sample_order(client: Any, study: Study) -> None:
    path = ratings_path(runner.load_job(study.job), "openmeva")
    page = await (await client.get("/rate/job")).text()
    assert "stars" not in page.split("<div class=fields>")[0]  # blind: no judge's score
    assert "id=scores" not in page and "fake/stars" not in page
    first = re.search(r"<code id=item>([^<]*)</code>", page)
    assert first is not None and "overall (1 to 5)" in page
    response = await client.post("/rate/job", data={"dataset": "openmeva", "item": first[1],
                                                    "overall": "4"}, allow_redirects=False)
    assert response.status == 303
    after = await (await client.get("/rate/job")).text()
    second = re.search(r"<code id=item>([^<]*)</code>", after)
    assert second is not None and second[1] != first[1]
    await client.post("/rate/job", data={"dataset": "openmeva", "item": second[1],
                                         "overall": "skip"})
    off = await client.post("/rate/job", data={"dataset": "openmeva", "item": second[1],
                                               "overall": "9"})
    assert off.status == 400 and "rate on the job&#x27;s scale, 1 to 5" in await off.text()
    got = [(r.item, r.aspect, r.annotator, r.score) for r in read_ratings(path)]
    assert got == [(first[1], "overall", "alice", 4.0), (second[1], "overall", "alice", None)]
    path.unlink()


async def test_a_desk_without_an_annotator_takes_no_rating(study: Study) -> None:
    async with TestClient(TestServer(make_app(Desk(study.runs, DATA_DIR)))) as c:
        response = await c.get("/rate/job")
        assert response.status == 400
        assert "restart it with `judge serve --annotator NAME`" in await response.text()


async def test_a_desk_bound_elsewhere_needs_its_token(study: Study) -> None:
    assert new_token("127.0.0.1") is None and new_token("::1") is None
    token = new_token("0.0.0.0")
    assert token is not None and len(token) >= 20
    async with TestClient(TestServer(make_app(Desk(study.runs, DATA_DIR), token))) as c:
        assert (await c.get("/")).status == 403
        assert (await c.get("/", params={"token": "wrong"})).status == 403
        first = await c.get("/", params={"token": token})
        assert first.status == 200
        assert (await c.get("/items")).status == 200  # the cookie it set


async def test_another_sites_page_cannot_ask_or_post(client: Any) -> None:
    """A name that resolves to 127.0.0.1 (DNS rebinding) or a form posted from another
    site's page is refused; the desk's own pages pass."""
    assert (await client.get("/", headers={"Host": "evil.example:80"})).status == 403
    posted = await client.post("/rate/job", data={"dataset": "openmeva", "item": "x"},
                               headers={"Origin": "http://evil.example"},
                               allow_redirects=False)
    assert posted.status == 403 and "only the desk's own pages" in await posted.text()
    assert (await client.get("/", headers={"Host": "localhost:1"})).status == 200


def test_a_lease_of_a_dead_process_is_no_run(tmp_path: Path) -> None:
    path = tmp_path / f"lease-{lease_id(lease_name('job', None)):08x}.lock"
    assert holder(tmp_path, "job") is None
    path.write_text(describe("judge run job"))
    assert holder(tmp_path, "job") == path.read_text()
    path.write_text(f"host {socket.gethostname()} pid 99999999 since 2026-11-27T10:00:00Z: "
                    "judge run job")  # a pid no process has: a killed run's leftover
    assert holder(tmp_path, "job") is None
    path.write_text("")  # released
    assert holder(tmp_path, "job") is None


def test_an_aspects_rating_goes_to_the_file_the_job_declares(tmp_path: Path) -> None:
    """The job reads `overall` from the ratings file it declares, so the desk writes it there;
    `fluency`, declared nowhere, goes to the data set's default file."""
    job = rated_job(tmp_path / "study", groups=2)
    job.write_text(RATED_JOB.replace('aspects = ["overall"]', 'aspects = ["overall", "fluency"]'),
                   "utf-8")
    expansion = prepare(runner.load_job(job), DATA_DIR)
    assert record(expansion, "ann", "mine", "d0-a", {"overall": "4", "fluency": "2"}) == 2
    declared, default = job.parent / "ratings.jsonl", job.parent / "data.ratings.jsonl"
    assert [(r.aspect, r.score) for r in read_ratings(declared)] == [("overall", 4.0)]
    assert [(r.aspect, r.score) for r in read_ratings(default)] == [("fluency", 2.0)]
    assert prepare(runner.load_job(job), DATA_DIR).item("mine", "d0-a").human == {"overall": 4.0}


def _stars(item: str) -> int:
    """The judge's stars for item `d{g}-{s}` of rated_job (distinct within a group)."""
    g, s = item[1:].split("-")
    return (int(g) + "abc".index(s)) % 5 + 1


def _rated_reply(body: dict[str, Any]) -> str:
    """_stars of the item, but no parsable answer for d5-b (a parse failure to filter on)."""
    found = re.search(r"summary (\d+) by (\w)", body["messages"][-1]["content"])
    assert found is not None
    item = f"d{found[1]}-{found[2]}"
    return "no idea" if item == "d5-b" else f"{_stars(item)} stars"


def _pilot(tmp_path: Path) -> Path:
    """rated_job's pilot, `judge run --sample 6 --seed 1`: its report folder."""
    job = rated_job(tmp_path / "jobs")
    with ThreadedServer(Script(reply=_rated_reply)) as server:
        runner.run(job, sample=6, seed=1, base_url=server.url, data_dir=DATA_DIR,
                   cache_dir=tmp_path / "cache", out=tmp_path / "runs" / "job", environ={})
    return tmp_path / "runs" / "job"


async def test_the_rating_queue_starts_with_the_items_the_pilot_run_judged(
        tmp_path: Path) -> None:
    """After `judge run --sample 6 --seed 1`, the first six items to rate are the six judged
    (the queue follows the run's --seed, not 0), so a rescore pairs every rating."""
    judged = {r["item_id"] for r in _jsonl(_pilot(tmp_path))}
    app = make_app(Desk(tmp_path / "runs", DATA_DIR, annotator="ana"))
    shown = []
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        for _ in range(6):
            page = await (await c.get("/rate/job")).text()
            found = re.search(r"<code id=item>([^<]*)</code>", page)
            assert found is not None
            shown.append(found[1])
            await c.post("/rate/job", data={"dataset": "mine", "item": found[1], "overall": "3"})
    assert len(judged) == 6 and set(shown) == judged


async def test_show_scores_shows_the_judges_scores_of_the_item_being_rated(
        tmp_path: Path) -> None:
    judgments = _jsonl(_pilot(tmp_path))
    app = make_app(Desk(tmp_path / "runs", DATA_DIR, annotator="ana", show_scores=True))
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        page = await (await c.get("/rate/job")).text()
    item = re.search(r"<code id=item>([^<]*)</code>", page)
    shown = re.search(r"<div id=scores>.*?<tbody>(.*?)</tbody>", page, re.S)
    assert item is not None and shown is not None
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", r)
            for r in re.findall(r"<tr>(.*?)</tr>", shown[1])]
    judged = [r for r in judgments if r["item_id"] == item[1]]
    assert judged and rows == [["fake/stars", "overall", f"{r['score']:g}", "ok"]
                               for r in judged]


# --- the real command, in a real browser ---------------------------------------------------

browser = test_report.browser


def _serve(processes: Processes, study: Study, *options: str) -> tuple[Child, str]:
    """`judge serve` on a free port, and the URL it prints."""
    child = processes.start(judge_cmd("serve", study.runs, "--port", 0, *options),
                            cwd=study.root, env=clean_env(DATA_DIR))
    found = re.search(r"(http://\S+)", child.wait_for("judge desk on", stream="out"))
    assert found is not None
    return child, found[1]


@pytest.fixture
def rated_study(tmp_path: Path) -> Study:
    """Two runs of a job whose human column is a ratings file, where annotator ana rated every
    item (scores unrelated to the judge's): a run, then a rescore after a parser change (a
    level description read as 1 star: d5-b's answer parses)."""
    job = rated_job(tmp_path / "jobs")
    for n, item in enumerate(f"d{g}-{s}" for g in range(12) for s in "abc"):
        append_rating(job.parent / "ratings.jsonl", item=item, aspect="overall",
                      annotator="ana", score=n * 7 % 5 + 1)
    with ThreadedServer(Script(reply=_rated_reply)) as server:
        options: dict[str, Any] = {"base_url": server.url, "data_dir": DATA_DIR, "environ": {},
                                   "cache_dir": tmp_path / "cache",
                                   "out": tmp_path / "runs" / "job"}
        runner.run(job, **options)
        job.write_text(RATED_JOB + '[prompts.parser_options.levels]\n"no idea" = 1\n', "utf-8")
        runner.rescore(job, **options)
    first, second = sorted(p.name for p in (tmp_path / "runs" / "job" / "history").iterdir())
    return Study(tmp_path, job, tmp_path / "runs", first, second, server.url)


@pytest.mark.slow
def test_the_desk_in_a_browser(rated_study: Study, browser: Any, processes: Processes) -> None:
    """List the runs, open two side by side (judge diff's lines), filter the item browser and
    open a judgment, rate five items as an annotator, restart the desk and find them; `judge
    rescore` reads them into the human column (the annotators' mean): the correlations the
    desk shows move."""
    study = rated_study
    child, url = _serve(processes, study, "--annotator", "bob")
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(url)
    assert page.locator("section.job h2").inner_text() == "job"
    assert page.locator("table.runs tbody tr").count() == 2
    with page.expect_navigation():
        page.click("text=Open A and B side by side")
    env = clean_env(DATA_DIR)
    printed = run_judge("diff", study.job, study.first, study.second, "--out",
                        study.runs / "job", env=env, cwd=study.root)
    assert printed.returncode == 0, printed.stderr
    shown = page.locator("#diff-lines").inner_text().splitlines()
    assert shown == printed.stdout.splitlines()[1:]
    for frame in ("A", "B"):
        page.frame_locator(f"iframe[title={frame}]").locator(
            "body[data-rendered=true]").wait_for(timeout=20_000)

    page.goto(url + f"items?job=job&run={study.first}")
    page.select_option("select[name=status]", "failed")
    with page.expect_navigation():
        page.click("button:text('Filter')")
    statuses = page.locator("#items tbody td[class^=status]").all_inner_texts()
    assert statuses == ["parse"]
    page.locator("#items tbody tr").first.click()
    page.locator("#detail").wait_for(state="visible")
    assert "summary 5 by b" in page.locator("#request").inner_text()
    assert page.locator("#answer").inner_text() == "no idea"

    page.goto(url + "rate/job")
    assert page.locator("#scores").count() == 0  # blind by default
    rated = []
    for _ in range(5):  # each as the judge rated it
        item = page.locator("#item").inner_text()
        rated.append((item, float(_stars(item))))
        page.check(f"input[name=overall][value='{_stars(item)}']")
        with page.expect_navigation():
            page.click("#save")
    child.signal(signal.SIGINT)
    assert child.finish()[0] == 130

    child, url = _serve(processes, study, "--annotator", "bob", "--show-scores")
    page.goto(url + "rate/job")
    assert "item 6 of 36" in page.locator("main").inner_text()
    item = page.locator("#item").inner_text()
    assert page.locator("#scores td").all_inner_texts()[:3] == [
        "fake/stars", "overall", "1" if item == "d5-b" else str(_stars(item))]
    ratings = study.job.parent / "ratings.jsonl"  # the file the job declares
    assert [(r.item, r.score) for r in read_ratings(ratings) if r.annotator == "bob"] == rated

    rescored = run_judge("rescore", study.job, "--base-url", study.base_url, "--cache-dir",
                         study.root / "cache", "--out", study.runs / "job", env=env,
                         cwd=study.root)
    assert rescored.returncode == 0, rescored.stderr
    third = max(p.name for p in (study.runs / "job" / "history").iterdir())
    judge: dict[str, dict[tuple[str, str], str]] = {}
    for run in (study.second, third):
        page.goto(url + f"run/job/{run}")
        rows = [r for r in _csv(study.runs / "job" / "history" / run / "correlations.csv")
                if r["subset"] == "all"]
        assert page.locator("td.figure").all_inner_texts() == [
            f"{float(r['value']):.3f}" if r["value"] else "n/a" for r in rows]
        judge[run] = {(r["level"], r["method"]): r["value"] for r in rows
                      if r["judge"] == "fake/stars"}
    assert judge[third].keys() == judge[study.second].keys()
    assert all(judge[third][k] != v for k, v in judge[study.second].items()), judge
    assert not errors, errors
    child.signal(signal.SIGINT)
    child.finish()


@pytest.mark.slow
def test_a_run_in_progress_shows_its_counts_and_eta(tmp_path: Path, processes: Processes,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """While `judge run` calls, the desk counts the answers it stored (read-only) against the
    run's tasks, with the correlations so far; once it stops, the job is no longer running."""
    monkeypatch.setattr(live_module, "PARTIAL_EVERY_S", 0.0)  # at every look
    job = write_job(tmp_path / "jobs")
    out, cache = tmp_path / "runs" / "job", tmp_path / "cache"
    with ThreadedServer(Script(reply=reply)) as server:
        runner.run(job, limit=20, base_url=server.url, data_dir=DATA_DIR, cache_dir=cache,
                   out=out, environ={})
        job.write_text(JOB.replace("max_tokens = 32", "max_tokens = 33"))  # 20 new tasks
        server.state.script.latency_s = 0.5
        child = processes.start(judge_cmd("run", job, "--limit", 20, "--base-url", server.url,
                                          "--cache-dir", cache, "--out", out,
                                          "--concurrency", 1),
                                cwd=tmp_path, env=clean_env(DATA_DIR))
        live = LiveRuns(Desk(tmp_path / "runs", DATA_DIR))
        seen: list[dict[str, Any]] = []
        wait_until(lambda: seen.append(live.progress("job")) or seen[-1].get("answered", 0) > 0,
                   "the run's first answers")
        first = seen[-1]
        assert first["running"] and first["tasks"] == 20 and first["answered"] < 20
        assert f"pid {child.pid} " in first["holder"]
        wait_until(lambda: seen.append(live.progress("job")) or
                   seen[-1].get("answered", 0) > max(first["answered"], 2), "more answers")
        assert seen[-1]["eta_s"] is not None and seen[-1]["eta_s"] > 0
        now = seen[-1]
        assert now["line"].startswith(f"running: {now['answered']} of 20 tasks answered, "
                                      "about ")
        # the report's correlations over the answers so far: at most as many items as answers
        partial = [r for r in now["correlations"] if r["level"] == "dataset"]
        assert partial and all(1 < r["n_items"] <= now["answered"] for r in partial)
        assert "; so far: openmeva/overall fake/stars spearman sample " in now["line"]
        assert live.line("job").startswith("running: ") and list(live.lines()) == ["job"]
        child.signal(signal.SIGINT)
        child.finish()
    assert live.progress("job") == {"running": False, "line": ""}
    assert live.line("job") == "" and live.lines() == {}


@pytest.mark.slow
def test_serve_says_what_it_cannot_serve(study: Study, tmp_path: Path) -> None:
    env = clean_env(DATA_DIR)
    peeking = run_judge("serve", study.runs, "--show-scores", env=env, cwd=tmp_path)
    assert peeking.returncode == 2
    assert error_line(peeking.stderr) == ("Error: --show-scores shows scores on the rating page: "
                                          "give --annotator NAME too")
    missing = run_judge("serve", tmp_path / "nope", env=env, cwd=tmp_path)
    assert missing.returncode == 2
    assert error_line(missing.stderr) == (f"Error: {tmp_path / 'nope'}: no such folder; give a "
                                          "folder of runs (runs/) or a job's report folder")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = run_judge("serve", study.runs, "--port", port, env=env, cwd=tmp_path)
    assert busy.returncode == 2
    assert error_line(busy.stderr).startswith(f"Error: --host 127.0.0.1 --port {port}: cannot "
                                              "listen there (")
    assert error_line(busy.stderr).endswith("); pick another --port")


def test_the_desk_reads_a_cache_without_writing_it(tmp_path: Path) -> None:
    """never_write (the desk's view of a run in progress) leaves every file of a writable
    cache folder as it was: an open for reading (read_only) writes diskcache's settings."""
    with Cache(tmp_path) as cache:
        cache.put("k1", {"answer": 1})

    def files() -> dict[str, tuple[int, int]]:
        return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in tmp_path.rglob("*")}

    before = files()
    with Cache(tmp_path, never_write=True) as cache:
        assert cache.has_many(["k1", "k2"]) == {"k1"}
        assert cache.get("k1") == {"answer": 1}
    assert files() == before


def test_a_job_file_edited_is_read_again(study: Study) -> None:
    """The desk keeps a job's expansion between clicks, not past an edit of its file (a run
    in progress after `judge serve` started is counted against its own tasks)."""
    desk = Desk(study.runs, DATA_DIR)
    first = desk.selection("job")
    assert desk.selection("job") is first
    stat = study.job.stat()
    os.utime(study.job, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert desk.selection("job") is not first

