"""report.html and the paper figures, end to end: the real `judge` CLI against the fake server,
a real cache on disk, and the page opened in Debian's chromium (driven by playwright, whose
wheel carries only the driver; `playwright install` is never run)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.report.html import embed_json, read_page_data, render
from tests.conftest import DATA_DIR, ROOT
from tests.fakeserver import Script, ThreadedServer, default_reply

JUDGE = str(Path(sys.executable).parent / "judge")
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
PAYLOAD = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'


def hostile_reply(body: dict[str, Any]) -> str:
    """A quarter of the answers refuse, a quarter do not parse, a quarter score; all three
    carry a script. The last quarter is the fake server's usual answer."""
    text = body["messages"][-1]["content"]
    digest = int(hashlib.sha256(text.encode()).hexdigest(), 16)
    if digest % 4 == 0:
        return f"I cannot rate this. {PAYLOAD}"
    if digest % 4 == 1:
        return f"Hmm, hard to say. {PAYLOAD}"
    if digest % 4 == 2:
        return f"{default_reply(body)} {PAYLOAD}"
    return default_reply(body)


def _judge(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    env["JUDGE_DATA_DIR"] = str(DATA_DIR)
    return subprocess.run([JUDGE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180, check=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """openmeva, 40 items, against the hostile fake server; then `judge report --figures`."""
    if not (DATA_DIR / "openmeva").exists():
        pytest.skip(f"no openmeva data in {DATA_DIR}")
    tmp = tmp_path_factory.mktemp("report")
    with ThreadedServer(Script(reply=hostile_reply)) as server:
        common = ["--limit", "40", "--model", "fake", "--base-url", server.url,
                  "--cache-dir", str(tmp / "cache"), "--out", str(tmp / "out")]
        done = _judge("run", str(ROOT / "jobs" / "openmeva.toml"), *common, cwd=tmp)
        assert done.returncode == 0, done.stderr  # unparsable answers are not API failures
        calls = server.state.answered
        assert (tmp / "out" / "report.html").exists()
        (tmp / "out" / "report.html").unlink()
        report = _judge("report", str(ROOT / "jobs" / "openmeva.toml"), *common,
                        "--figures", str(tmp / "figs"), cwd=tmp)
        assert report.returncode == 0, report.stderr
        assert server.state.answered == calls  # report made no call
    yield {"out": tmp / "out", "figs": tmp / "figs", "tmp": tmp}


@pytest.mark.slow
def test_page_is_self_contained_and_holds_every_section(run: dict[str, Path]) -> None:
    text = (run["out"] / "report.html").read_text()
    start = text.index('<script type="application/json" id="report-data">')
    shell = text[:start] + text[text.index("</script>", start):]  # the page without its data
    assert "https://" not in shell and "http://" not in shell.replace(
        "http://www.w3.org/2000/svg", ""), "the page must fetch nothing"
    assert "<script src" not in text and "<link" not in text and "@import" not in text
    data = read_page_data(run["out"] / "report.html")
    (ds,) = data["datasets"]
    assert ds["name"] == "openmeva"
    aspect = ds["aspects"][0]
    judges = {r["judge"] for r in aspect["correlations"]}
    assert "fake/stars" in judges and len(judges) > 5  # the metrics are judges too
    scatter = aspect["scatter"]["fake/stars"]
    assert 0 < scatter["n"] <= 40 and len(scatter["points"]) == scatter["n"]
    assert aspect["systems"]["fake/stars"]["pairs"] > 0
    assert {f["type"] for f in data["failures"]} == {"parse", "refusal"}
    assert all(PAYLOAD in e for f in data["failures"] for e in f["examples"])
    items = data["items"]
    assert not items["capped"] and len(items["rows"]) == items["seen"] == 40
    diffs = [r[7] for r in items["rows"] if r[7] is not None]
    assert diffs == sorted(diffs, reverse=True)  # largest disagreement first
    prompt = items["prompts"][items["rows"][0][11]]
    assert "[user]" in prompt and "stars" in prompt  # the exact prompt sent


def test_json_block_cannot_close_the_script() -> None:
    text = embed_json({"a": "</script><script>alert(1)</script>", "b": "x & y > z"})
    assert "<" not in text and ">" not in text and "&" not in text
    page = render({"job": "</title><script>alert(1)</script>", "x": "</script>"}).decode()
    assert page.count("</script>") == 2  # the data block's and the renderer's own
    assert "<title>&lt;/title&gt;" in page


@pytest.mark.slow
def test_figures_are_png_and_svg(run: dict[str, Path]) -> None:
    figs = run["figs"]
    kinds = {"table", "forest", "scatter", "distribution", "systems"}
    for kind in kinds:
        png = figs / f"{kind}_openmeva_overall.png"
        svg = figs / f"{kind}_openmeva_overall.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000, kind
        assert "<svg" in svg.read_text()[:2000], kind
    assert "fake/stars" in (figs / "forest_openmeva_overall.svg").read_text()


@pytest.mark.slow
def test_view_prints_the_path_and_names_a_missing_report(run: dict[str, Path]) -> None:
    job = str(ROOT / "jobs" / "openmeva.toml")
    done = _judge("view", job, "--out", str(run["out"]), "--print", cwd=run["tmp"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(run["out"].absolute() / "report.html")  # not history/
    missing = _judge("view", job, "--out", str(run["tmp"] / "nowhere"), cwd=run["tmp"])
    assert missing.returncode == 2
    assert "no report yet; run `judge report" in missing.stderr
    assert missing.stderr.startswith("Error: ")


# --- in a real browser ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium")
        pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


def _open(browser: Any, page_path: Path) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # Nothing may leave the page: any request other than the file itself fails the test.
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(
        "file://") else (errors.append(f"request {route.request.url}"), route.abort())[1])
    page.goto(page_path.as_uri())
    page.wait_for_selector("body[data-rendered=true]", timeout=20_000)
    return page, errors


@pytest.mark.slow
def test_page_renders_in_chromium(run: dict[str, Path], browser: Any, tmp_path: Path) -> None:
    page, errors = _open(browser, run["out"] / "report.html")
    assert page.locator("svg").count() >= 5
    assert page.locator("#ds-0 svg .point").count() >= 40  # scatter points, forest points
    assert page.locator("svg .ci-bar").count() > 5
    assert page.locator("svg .fit").count() == 1
    assert page.locator("svg .bar").count() > 3
    assert page.locator("table.corr td.best").count() > 0
    assert page.locator("#failures pre.example").count() > 0
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert (tmp_path / "report.png").stat().st_size > 10_000
    assert errors == []
    page.close()


@pytest.mark.slow
def test_item_browser_filters_and_opens_a_row(run: dict[str, Path], browser: Any) -> None:
    page, errors = _open(browser, run["out"] / "report.html")
    rows = page.locator("#items-table tbody tr")
    assert rows.count() == 40
    assert page.inner_text("#item-sample").startswith("All 40 judgments")  # a small job: all
    assert page.locator("#item-filter-kept").count() == 0
    page.select_option("#item-filter-status", "parse")
    parse = rows.count()
    assert 0 < parse < 40
    assert all(t == "parse" for t in rows.locator("td:nth-child(9)").all_inner_texts())
    page.select_option("#item-filter-status", "")
    system = rows.first.locator("td:nth-child(3)").inner_text()
    page.fill("#item-search", system)
    assert 0 < rows.count() < 40
    assert all(s == system for s in rows.locator("td:nth-child(3)").all_inner_texts())
    page.fill("#item-search", "no such thing anywhere")
    assert rows.count() == 0
    assert "0 of 40 rows match" in page.inner_text("#item-count")
    page.fill("#item-search", "")
    page.select_option("#item-filter-status", "parse")
    rows.first.click()
    assert page.is_visible("#item-detail")
    assert "null" not in page.inner_text("#item-detail")  # no missing part shown as "null"
    assert PAYLOAD in page.inner_text("#item-detail pre.raw")  # shown as text
    assert "stars" in page.inner_text("#item-detail pre.prompt")
    assert page.evaluate("window.__pwned") is None  # and never run
    assert errors == []
    page.close()


@pytest.mark.slow
def test_script_in_a_data_field_is_text(run: dict[str, Path], browser: Any,
                                        tmp_path: Path) -> None:
    data = read_page_data(run["out"] / "report.html")
    data["job"] = PAYLOAD
    data["datasets"][0]["name"] = PAYLOAD
    data["items"]["rows"][0][2] = PAYLOAD  # a system name
    data["summary"][0]["prompt"] = PAYLOAD
    page_path = tmp_path / "hostile.html"
    page_path.write_bytes(render(data))
    page, errors = _open(browser, page_path)
    assert page.evaluate("window.__pwned") is None
    assert PAYLOAD in page.inner_text("#title")
    assert PAYLOAD in page.inner_text("#items-table")
    assert PAYLOAD in page.inner_text("#failures")
    # A broken image would be a console error, if it had been parsed as HTML.
    assert errors == []
    page.close()


# --- the item browser's cap ----------------------------------------------------------------

def _judgment(i: int, score: float | None, human: float) -> Any:
    from runner.data.datasets import Item
    from runner.reduce.judgments import Judgment
    from runner.tasks import Task

    item = Item(dataset="d", item_id=f"i{i}", group=f"g{i}", system=f"s{i % 3}", subset="",
                fields={}, human={"a": human}, annotators={}, metrics={})
    task = Task(key=f"k{i}", dataset="d", item_id=f"i{i}", prompt="p", aspect="a", model="m",
                sample=0, body=b'{"messages": [{"role": "user", "content": "rate"}]}',
                prompt_tokens=1, max_tokens=1)
    error = None if score is not None else {"type": "parse", "message": "no score"}
    return Judgment(task=task, item=item, score=score, values={}, raw=f"answer {i}",
                    error=error, cached=True, usage=None)


def test_item_rows_keep_top_disagreements_failures_and_a_sample() -> None:
    from runner.report.browser import ItemRows

    rows = ItemRows(cap=40)
    judgments = [_judgment(i, None if i % 50 == 7 else float(i % 5), 2.0 + (i == 977) * 100)
                 for i in range(1000)]
    assert list(rows.watch(judgments)) == judgments  # passed through untouched
    kept = rows.kept()
    assert rows.capped and rows.seen == 1000 and len(kept) <= 40
    assert kept[0][0].item == "i977" and "disagreement" in kept[0][1]  # the largest, first
    assert rows.failed == 20 and len(rows.failures) == 10  # a quarter of the cap, of 20
    assert all(r.status == "parse" for r in rows.failures)
    assert {r.item for r, why in kept if "failure" in why} == {r.item for r in rows.failures}
    top = [r for r, why in kept if "disagreement" in why]
    assert len(top) == 10 and all(r.diff is not None and r.diff >= 2.0 for r in top)
    assert len([r for r, why in kept if "random" in why]) == 20  # half the cap
    assert len({id(r) for r, _ in kept}) == len(kept)


def test_item_rows_sample_every_judgment_uniformly_in_bounded_memory() -> None:
    """Past `cap` judgments the browser keeps a seeded uniform sample of them all (failures
    included, at their rate), never more than `cap` rows at any moment."""
    from runner.report.browser import ItemRows

    def stream(n: int) -> Any:
        return (_judgment(i, None if i % 10 == 3 else float(i % 5), 3.0) for i in range(n))

    rows, most = ItemRows(cap=400), 0
    for k, _ in enumerate(rows.watch(stream(100_000))):
        if k % 997 == 0:
            most = max(most, len(rows.everything) + len(rows.sample) + len(rows.top)
                       + len(rows.failures))
    assert most <= 400 and rows.everything == []
    assert rows.seen == 100_000 and rows.failed == 10_000
    picked = [int(r.item[1:]) for r in rows.sample]
    assert len(picked) == len(set(picked)) == 200
    assert 40_000 < sum(picked) / len(picked) < 60_000  # spread over the whole stream
    fifths = [sum(i // 20_000 == f for i in picked) for f in range(5)]
    assert all(20 <= n <= 60 for n in fifths), fifths  # 40 expected in each
    assert 10 <= sum(i % 10 == 3 for i in picked) <= 32  # failures at their 10% rate
    again = ItemRows(cap=400)
    list(again.watch(stream(100_000)))
    assert [r.item for r in again.sample] == [r.item for r in rows.sample]  # seeded
    other = ItemRows(cap=400, seed=1)
    list(other.watch(stream(100_000)))
    assert [r.item for r in other.sample] != [r.item for r in rows.sample]
    assert rows.counts() == {"seen": 100_000, "failed": 10_000, "cap": 400, "seed": 0,
                             "sample": 200, "disagreements": 100, "failures": 100}


def test_small_jobs_keep_every_row() -> None:
    from runner.report.browser import ItemRows

    rows = ItemRows(cap=40)
    list(rows.watch(_judgment(i, float(i % 5), 3.0) for i in range(40)))
    assert not rows.capped and len(rows.kept()) == 40


# --- the correlations' input rows ------------------------------------------------------------

def test_judge_rows_negate_lower_is_better_metrics_and_pair_annotators() -> None:
    """judge_rows: the LLM judges' rows in the cells' order (items without a human score for
    the aspect left out), then each metric (negated where lower is better) and `iaa`
    (annotator 2 against annotator 1), in the items' order."""
    import types

    from runner.data.datasets import Item
    from runner.reduce.cells import CellBuilder
    from runner.reduce.correlate import Row
    from runner.report.write import Tables, judge_rows

    def item(i: int, human: dict[str, float], votes: tuple[float, ...] = ()) -> Item:
        return Item(dataset="d", item_id=f"i{i}", group=f"g{i // 2}", system=f"s{i % 2}",
                    subset="", fields={}, human=human,
                    annotators={"a": votes} if votes else {},
                    metrics={"*": {"ter": 0.1 * i, "bleu": 0.2 * i}})

    items = [item(0, {"a": 3.0}, (2.0, 4.0)), item(1, {"a": 1.0}), item(2, {}),
             item(3, {"a": 5.0}, (5.0, 4.0))]
    expansion = types.SimpleNamespace(items={"d": items},
                                      lower_is_better={"d": frozenset({"ter"})},
                                      job=types.SimpleNamespace(prompts=[]))
    builder = CellBuilder(expansion)  # type: ignore[arg-type]
    for model, prompt in (("m2", "p"), ("m1", "p")):
        for it in items:
            builder.add("d", it, (prompt, "a", model),
                        None if it.item_id == "i1" else float(len(model) + int(it.item_id[1:])),
                        None)
    got = {where: {judge: series.rows() for judge, series in judges.items()} for where, judges
           in judge_rows(expansion, Tables(builder.finish())).items()}  # type: ignore[arg-type]

    def row(it: Item, judge: float | None, human: float) -> Row:
        return Row(it.group, it.system, it.subset, judge, human)

    scored = [items[0], items[1], items[3]]
    assert got == {("d", "a"): {
        "m2/p": [row(it, s, it.human["a"]) for it, s in zip(scored, [2.0, None, 5.0], strict=True)],
        "m1/p": [row(it, s, it.human["a"]) for it, s in zip(scored, [2.0, None, 5.0], strict=True)],
        "ter": [row(it, -0.1 * int(it.item_id[1:]), it.human["a"]) for it in scored],
        "bleu": [row(it, 0.2 * int(it.item_id[1:]), it.human["a"]) for it in scored],
        "iaa": [row(items[0], 4.0, 2.0), row(items[3], 4.0, 5.0)]}}
    assert list(got["d", "a"]) == ["m2/p", "m1/p", "ter", "bleu", "iaa"]


# --- the other sections, and a large job's 2-D histogram, in the browser ---------------------

@pytest.mark.slow
@pytest.mark.parametrize(("job", "section"), [("colossalai-en", "#battles"),
                                              ("korean-chat", "#leaderboard")])
def test_battles_and_leaderboard_render(job: str, section: str, browser: Any,
                                        tmp_path: Path) -> None:
    from tests.fakeserver import default_reply
    from tests.test_colossalai import fake_reply

    # each study's judge answers in its own format (the Korean form's lines, ColossalAI's
    # scores): a judge none of whose answers parse fails the run
    reply = fake_reply if job.startswith("colossalai") else default_reply
    with ThreadedServer(Script(reply=reply)) as server:
        done = _judge("run", str(ROOT / "jobs" / f"{job}.toml"), "--limit", "5", "--model",
                      "fake", "--base-url", server.url, "--cache-dir", str(tmp_path / "cache"),
                      "--out", str(tmp_path / "out"), "--yes", "--rpm", "60000", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = read_page_data(tmp_path / "out" / "report.html")
    prompts = data["items"]["prompts"]  # generated answers' judge prompts rebuilt too
    at = data["items"]["columns"].index("prompt")
    assert data["items"]["rows"] and all("[user]" in prompts[r[at]] for r in data["items"]["rows"])
    page, errors = _open(browser, tmp_path / "out" / "report.html")
    cells = page.locator(f"{section} table td")
    assert cells.count() > 4 and any(t.strip() for t in cells.all_inner_texts())
    if job.startswith("colossalai"):
        assert "inconsistent" in page.inner_text(section)
        assert "No human ratings" in page.inner_text("#ds-0")
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert errors == []
    page.close()


@pytest.mark.slow
def test_large_scatter_is_a_2d_histogram(run: dict[str, Path], browser: Any,
                                         tmp_path: Path) -> None:
    import random

    import numpy as np

    from runner.report.aggregate import MAX_POINTS, scatter_and_counts

    rng = random.Random(1)
    judge = np.array([float(rng.randint(1, 5)) for _ in range(MAX_POINTS * 3)])
    big, _ = scatter_and_counts(
        judge, np.array([rng.random() * 4 + 1 for _ in range(MAX_POINTS * 3)]))
    assert "points" not in big and big["n"] == MAX_POINTS * 3
    assert sum(c for _, _, c in big["hist"]["cells"]) == MAX_POINTS * 3
    assert len(big["hist"]["x"]) == 6  # one bin per star: 0.5 .. 5.5
    data = read_page_data(run["out"] / "report.html")
    data["datasets"][0]["aspects"][0]["scatter"]["fake/stars"] = big
    (tmp_path / "big.html").write_bytes(render(data))
    page, errors = _open(browser, tmp_path / "big.html")
    assert page.locator("svg .cell").count() == len(big["hist"]["cells"])
    assert errors == []
    page.close()


# --- the Reliability section: reliability.csv's rows, in chromium --------------------------

def _rendered_reliability(page: Any) -> dict[str, tuple[str, str]]:
    """data-key (dataset, aspect, figure, a, b, statistic joined by NUL) -> (shown value, n)."""
    found = page.evaluate(
        """() => [...document.querySelectorAll('#reliability td[data-key]')].map(
            td => [td.dataset.key, td.querySelector('span.v').textContent, td.dataset.n])""")
    keys = [k for k, _, _ in found]
    assert len(keys) == len(set(keys)), "a reliability row is shown twice"
    return {k: (v, n) for k, v, n in found}


def _shown(value: str) -> str:
    """What report.js's fmt shows for a reliability.csv value."""
    if value == "":
        return ""
    v = float(value)
    return str(int(v)) if v.is_integer() else f"{v:.3f}"


@pytest.mark.slow
@pytest.mark.parametrize(("job", "limit", "figures"), [
    ("tst-formality", "90", {"agreement", "length", "position"}),
    ("colossalai-en", "5", {"position"}),
])
def test_reliability_section_matches_reliability_csv(job: str, limit: str, figures: set[str],
                                                     browser: Any, tmp_path: Path) -> None:
    import csv

    from tests.test_colossalai import fake_reply

    script = Script(reply=fake_reply) if job.startswith("colossalai") else Script()
    with ThreadedServer(script) as server:
        done = _judge("run", str(ROOT / "jobs" / f"{job}.toml"), "--limit", limit, "--model",
                      "fake", "--base-url", server.url, "--cache-dir", str(tmp_path / "cache"),
                      "--out", str(tmp_path / "out"), "--yes", "--rpm", "60000", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with (tmp_path / "out" / "reliability.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert figures <= {r["figure"] for r in rows}
    if job == "tst-formality":  # two annotators: their own agreement is a row
        assert any(r["a"] == "annotators" for r in rows)
    page, errors = _open(browser, tmp_path / "out" / "report.html")
    shown = _rendered_reliability(page)
    expected = {"\0".join(r[c] for c in ("dataset", "aspect", "figure", "a", "b", "statistic")):
                (_shown(r["value"]), r["n"]) for r in rows}
    assert shown == expected  # every row once, same value and n, nothing else
    text = page.inner_text("#reliability")
    assert "Reliability" in page.inner_text("#nav")
    if job == "colossalai-en":  # battles only: the missing figures say why
        assert "no inter-annotator agreement" in text or "no agreement to compute" in text
        assert "first_position_win_rate" in text
    else:
        assert "no self-consistency" in text  # one sample per judgment
    assert errors == []
    page.close()


@pytest.mark.slow
def test_reliability_says_why_a_figure_is_missing(run: dict[str, Path], browser: Any) -> None:
    """openmeva: one human score per item, one sample, no order swaps."""
    (rel,) = read_page_data(run["out"] / "report.html")["reliability"]
    assert rel["dataset"] == "openmeva" and rel["rows"]
    assert not any(r["a"] == "annotators" for r in rel["rows"])
    page, errors = _open(browser, run["out"] / "report.html")
    notes = page.locator("#reliability .rel-note").all_inner_texts()
    assert "agreement: one annotator per item: no inter-annotator agreement" in notes
    assert any("no self-consistency" in n for n in notes)
    assert page.locator("#reliability td[data-key]").count() == len(rel["rows"])
    assert errors == []
    page.close()


@pytest.mark.slow
def test_script_in_a_reliability_row_is_text(run: dict[str, Path], browser: Any,
                                             tmp_path: Path) -> None:
    data = read_page_data(run["out"] / "report.html")
    rel = data["reliability"][0]
    rel["rows"][0]["a"] = PAYLOAD  # a judge name
    rel["rows"][0]["b"] = PAYLOAD
    rel["notes"].append(PAYLOAD)
    page_path = tmp_path / "hostile-reliability.html"
    page_path.write_bytes(render(data))
    assert PAYLOAD not in page_path.read_text()  # escaped in the JSON block
    page, errors = _open(browser, page_path)
    assert page.evaluate("window.__pwned") is None
    # textContent: off-screen tables are not laid out (content-visibility), so innerText
    # skips them; a payload parsed as HTML would not be in the text at all
    assert page.text_content("#reliability").count(PAYLOAD) >= 3  # row, column, note
    assert errors == []
    page.close()


# --- the page's data stays bounded whatever the number of judgments ----------------------------

SMALL_JOB = """\
name = "big"
levels = ["sample", "dataset", "system"]

[[datasets]]
name = "news"
path = "outputs.jsonl"
[datasets.fields]
id = "id"
group = "doc"
system = "system"
text = { source = "source", summary = "summary" }
human = { fluency = ["rater1", "rater2"] }

[[prompts]]
name = "stars"
template = "fluency.txt"
parser = "stars"
aspects = ["fluency"]

[models.judge]
spec = "openai:gpt-4o-mini"
"""


def small_expansion(folder: Path) -> Any:
    """The expansion of a small job over examples/my-data (the page names its prompts)."""
    import shutil

    from runner.job.load import load_job
    from runner.prepare import prepare

    for name in ("outputs.jsonl", "fluency.txt"):
        shutil.copy(ROOT / "examples" / "my-data" / name, folder / name)
    (folder / "job.toml").write_text(SMALL_JOB)
    return prepare(load_job(folder / "job.toml"), folder)


def synthetic_series(rows: int, systems: int = 8, seed: int = 0) -> dict[str, Any]:
    """judge -> Series of `rows` rows: stars, a 0-100 scale and a judge with 1% unscored,
    against human scores that are the mean of two 1-5 raters."""
    import numpy as np

    from runner.reduce.series import Labels, Series

    rng = np.random.default_rng(seed)
    human = (rng.integers(1, 6, rows) + rng.integers(1, 6, rows)) / 2.0
    noisy = human + rng.normal(0, 0.7, rows)
    judges = {"m/stars": np.clip(np.rint(noisy), 1, 5), "m/percent": np.clip(noisy, 1, 5) * 20,
              "m/gaps": np.where(rng.random(rows) < 0.01, np.nan, np.clip(np.rint(noisy), 1, 5))}
    codes = np.arange(rows, dtype=np.int32)
    labels = Labels(groups=[f"g{g}" for g in range(rows // 4 + 1)],
                    systems=[f"s{s}" for s in range(systems)], subsets=[""])
    return {name: Series(judge, human, codes // 4, (codes % systems).astype(np.int32),
                         np.zeros(rows, dtype=np.int32), labels) for name, judge in judges.items()}


def _charts(expansion: Any, series: dict[str, Any]) -> dict[str, Any]:
    from runner.report.browser import ItemRows
    from runner.report.pagedata import page_data

    data = page_data(expansion, {("news", "fluency"): series}, [], [], [], None, {}, ItemRows())
    aspect: dict[str, Any] = data["datasets"][0]["aspects"][0]
    return aspect


def test_page_data_size_does_not_grow_with_the_judgments(tmp_path: Path) -> None:
    """A million rows a judge make a page no larger than a hundred thousand do (a few more
    digits in the counts): every chart is sent as an aggregate (bins, quantiles, a row per
    system up to MAX_SYSTEMS)."""
    from runner.report.pagedata import MAX_SYSTEMS

    expansion = small_expansion(tmp_path)
    small = embed_json(_charts(expansion, synthetic_series(100_000)))
    big = _charts(expansion, synthetic_series(1_000_000))
    assert len(embed_json(big)) < 1.1 * len(small) < 12_000  # more cells filled, more digits
    for name in ("m/stars", "m/percent", "m/gaps"):
        sc = big["scatter"][name]
        assert "points" not in sc and sc["n"] == 1_000_000 - big["distribution"][name]["missing"]
        assert len(sc["hist"]["cells"]) <= (len(sc["hist"]["x"]) - 1) * (len(sc["hist"]["y"]) - 1)
        assert sum(sc["levels"]["n"]) == sc["n"] and len(sc["levels"]["q"]) == 9  # 1, 1.5 .. 5
    assert big["scatter"]["m/percent"]["hist"]["x"][-1] == 100.0  # 20 bins on a 0-100 scale
    many = _charts(expansion, synthetic_series(1_000_000, systems=MAX_SYSTEMS + 1))
    assert len(embed_json(many)) < 1.1 * len(small)
    assert many["systems"]["m/stars"] == {"rows": [], "pairs": 0, "pairwise_accuracy": None,
                                          "systems": MAX_SYSTEMS + 1}
    assert len(big["systems"]["m/stars"]["rows"]) == 8


def test_quantiles_are_numpy_quantiles_per_human_level(tmp_path: Path) -> None:
    import numpy as np

    from runner.report.pagedata import QUANTILES

    series = synthetic_series(20_000)
    aspect = _charts(small_expansion(tmp_path), series)
    for name, s in series.items():
        ok = ~np.isnan(s.judge)
        judge, human = s.judge[ok], s.human[ok]
        levels = aspect["scatter"][name]["levels"]
        edges = aspect["scatter"][name]["hist"]["y"]
        for k, (n, q) in enumerate(zip(levels["n"], levels["q"], strict=True)):
            inside = (human >= edges[k]) & (human < edges[k + 1])
            assert n == int(inside.sum()) > 0
            assert q == np.round(np.quantile(judge[inside], QUANTILES), 4).tolist()
        dist = aspect["distribution"][name]
        assert dist["quantiles"] == np.round(np.quantile(judge, QUANTILES), 4).tolist()
        assert dist["mean"] == round(float(judge.mean()), 4)


def test_bins_and_quantiles_match_numpy_on_any_column() -> None:
    """The page's arithmetic bins are numpy's histogram's (values on the edges included), and
    a score first seen after the first rows still gets its own bin and count."""
    import numpy as np

    from runner.report.aggregate import QUANTILES, _edges, counts

    rng = np.random.default_rng(5)
    wide = np.concatenate([rng.random(50_000) * 7.3 - 1, np.linspace(-1, 6.3, 21), [np.nan]])
    stars = np.concatenate([rng.integers(1, 5, 9000).astype(float), [5.0, 5.0, np.nan]])
    for values in (wide, stars):
        got = counts(values)
        finite = values[~np.isnan(values)]
        assert got["missing"] == 1
        edges = _edges(np.unique(finite))  # the page sends them rounded to 6 places
        assert got["edges"] == np.round(edges, 6).tolist()
        assert got["counts"] == np.histogram(finite, bins=edges)[0].tolist()
        assert got["quantiles"] == np.round(np.quantile(finite, QUANTILES), 4).tolist()
    assert counts(stars)["edges"] == [0.5, 1.5, 2.5, 3.5, 4.5, 5.5]  # the late 5s: a bin
    assert counts(stars)["counts"][-1] == 2


def test_reservoir_keeps_every_item_with_the_same_chance() -> None:
    """The reservoir's sample: over 400 seeded streams of 1,000 items, each tenth of the stream
    is kept about as often as the others (10 slots: 400 expected per tenth)."""
    import random

    from runner.report.browser import Reservoir

    kept = [0] * 10
    for seed in range(400):
        sampler, slots = Reservoir(10, random.Random(seed)), [0] * 10
        for i in range(1000):
            if (slot := sampler.offer()) is not None:
                slots[slot] = i
        assert sampler.seen == 1000
        for i in slots:
            kept[i // 100] += 1
    assert all(320 <= k <= 480 for k in kept), kept
