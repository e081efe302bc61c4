"""`judge serve`: the desk over a folder of runs, through aiohttp's test client against two real
runs (the fake server, a real cache and report folder), and the served figures against the
CLI's and the files'."""

from __future__ import annotations

import csv
import hashlib
import html
import re
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
from runner.data.annotations import read_ratings
from runner.execute.store.lease import describe, lease_id, lease_name
from runner.report.html import read_page_data
from runner.serve import Desk, make_app, new_token
from runner.serve.live import holder
from runner.serve.rate import ratings_path
from tests.conftest import DATA_DIR
from tests.fakeserver import Script, ThreadedServer
from tests.test_cli import JOB, write_job

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


async def test_the_index_lists_every_kept_run(client: Any, study: Study) -> None:
    page = await (await client.get("/")).text()
    assert "<h2>job</h2>" in page
    assert page.index(study.first) < page.index(study.second)
    assert f"/run/job/{study.second}" in page


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
