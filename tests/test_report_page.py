"""report.html, looked at: the unparsed-judge banner, the system ranking view, the position and
length bias charts, sticky judge columns, the forest plot's CIs, the item browser's sample
column, and a large study's page (aggregated charts, a sampled item browser that says so), each
checked in Debian's chromium as tests/test_report.py does (its fixtures: the openmeva run
against the hostile fake server, and the browser)."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.report.html import read_page_data, render
from tests import test_report
from tests.conftest import ROOT
from tests.fakeserver import Script, ThreadedServer, default_reply
from tests.test_report import PAYLOAD, _judge, _judgment, _open, small_expansion, synthetic_series

# test_report's fixtures, shared here (each module runs its own: they are module-scoped)
browser = test_report.browser
run = test_report.run

MY_DATA = ROOT / "examples" / "my-data"
JOB = """\
name = "page"
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
samples = 3

[[prompts]]
name = "terse"
template = "terse.txt"
parser = "stars"
aspects = ["fluency"]

[models.judge]
spec = "openai:gpt-4o-mini"
"""
TERSE = "TERSE. Sentence: {{source}}\nSummary: {{summary}}\nHow fluent, in 1 to 5 stars?\n"


def terse_reply(body: dict[str, Any]) -> str:
    """The `terse` prompt's answers do not parse except for the first document's two
    summaries (18 of 20 unparsed); every other answer is the fake server's usual one."""
    text = body["messages"][-1]["content"]
    if text.startswith("TERSE") and "council" not in text:
        return "Fluent enough, I suppose."
    return default_reply(body)


@pytest.fixture(scope="module")
def mydata(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """examples/my-data with a 3-sample prompt and a mostly unparsable one, system level on."""
    tmp = tmp_path_factory.mktemp("page")
    for name in ("outputs.jsonl", "fluency.txt"):
        shutil.copy(MY_DATA / name, tmp / name)
    (tmp / "terse.txt").write_text(TERSE)
    (tmp / "job.toml").write_text(JOB)
    with ThreadedServer(Script(reply=terse_reply)) as server:
        done = _judge("run", str(tmp / "job.toml"), "--model", "fake", "--base-url", server.url,
                      "--cache-dir", str(tmp / "cache"), "--out", str(tmp / "out"), "--yes",
                      cwd=tmp)
    assert done.returncode == 0, done.stderr  # 2 of the terse judge's answers parse
    yield {"out": tmp / "out", "stderr": done.stderr, "tmp": tmp}


def _page(browser: Any, data: dict[str, Any], path: Path) -> tuple[Any, list[str]]:
    path.write_bytes(render(data))
    return _open(browser, path)


# --- the banner --------------------------------------------------------------------------

@pytest.mark.slow
def test_banner_names_each_mostly_unparsed_judge_as_the_run_does(
        mydata: dict[str, Any], browser: Any) -> None:
    line = "judge fake/terse: 18 of 20 answers unparsed"
    assert f"{line}: see report.html#failures" in mydata["stderr"]
    page, errors = _open(browser, mydata["out"] / "report.html")
    banner = page.locator("#main > #banner")
    assert banner.count() == 1
    assert page.evaluate("document.getElementById('main').firstElementChild.id") == "banner"
    text = banner.inner_text()
    assert line in text and "fake/stars" not in text  # the one judge, nobody else
    assert "rest on the 2 that parsed" in text
    link = banner.locator("a")
    assert link.get_attribute("href") == "#failures"
    link.click()
    page.wait_for_function("location.hash === '#failures'", timeout=5_000)
    assert errors == []
    page.close()


@pytest.mark.slow
def test_no_banner_when_half_the_answers_parse(run: dict[str, Path],
                                               browser: Any) -> None:
    """openmeva's hostile run: 20 of 40 unparsed is not most; `judge run` printed no line."""
    assert read_page_data(run["out"] / "report.html")["unparsed"] == []
    page, errors = _open(browser, run["out"] / "report.html")
    assert page.locator("#banner").count() == 0
    assert errors == []
    page.close()


# --- the item browser's sample column -------------------------------------------------------

@pytest.mark.slow
def test_item_browser_has_a_sample_column_when_a_prompt_samples(
        mydata: dict[str, Any], run: dict[str, Path], browser: Any) -> None:
    page, errors = _open(browser, mydata["out"] / "report.html")
    heads = page.locator("#items-table thead th").all_inner_texts()
    assert heads[:6] == ["dataset", "item", "system", "aspect", "judge", "sample"]
    page.select_option("#item-filter-judge", "fake/stars")
    rows = page.locator("#items-table tbody tr")
    assert rows.count() == 60  # 20 items x 3 samples
    got = rows.evaluate_all("rs => rs.map(r => [r.cells[1].textContent, r.cells[5].textContent])")
    by_item: dict[str, list[str]] = {}
    for item, sample in got:
        by_item.setdefault(item, []).append(sample)
    assert len(by_item) == 20 and all(sorted(v) == ["0", "1", "2"] for v in by_item.values())
    assert errors == []
    page.close()
    plain, errors = _open(browser, run["out"] / "report.html")  # one sample: no column
    assert "sample" not in plain.locator("#items-table thead th").all_inner_texts()
    assert "sample" not in read_page_data(run["out"] / "report.html")["items"]["columns"]
    assert errors == []
    plain.close()


# --- the system ranking view ---------------------------------------------------------------

def _ranks(values: list[float]) -> list[int]:
    """Competition ranks, 1 = highest (ties share the best)."""
    return [1 + sum(w > v for w in values) for v in values]


@pytest.mark.slow
def test_system_ranking_sorts_by_human_mean_with_the_judge_rank_beside(
        run: dict[str, Path], browser: Any) -> None:
    data = read_page_data(run["out"] / "report.html")
    rows = data["datasets"][0]["aspects"][0]["systems"]["fake/stars"]["rows"]
    assert len(rows) >= 3
    ordered = sorted(rows, key=lambda r: (-r["human"], r["system"]))
    human_ranks = _ranks([r["human"] for r in ordered])
    judge_ranks = _ranks([r["judge"] for r in ordered])
    page, errors = _open(browser, run["out"] / "report.html")
    panel = page.locator("#ds-0 .ranking")
    assert panel.count() == 1
    shown_human = [t.lstrip("=") for t in panel.locator(".rank-human").all_text_contents()]
    shown_judge = [t.lstrip("=") for t in panel.locator(".rank-judge").all_text_contents()]
    assert shown_human == [str(r) for r in human_ranks]  # sorted by human mean
    assert shown_judge == [str(r) for r in judge_ranks]  # the judge's rank beside it
    legend = panel.locator(".legend").text_content() or ""
    for entry in ("human mean", "judge mean", "95% CI", "judge # = human #", "1 off"):
        assert entry in legend
    table = page.locator("#ds-0 table.sticky", has=page.locator("th", has_text="judge rank"))
    cells = table.locator("tbody tr td:first-child").all_text_contents()
    assert cells == [r["system"] for r in ordered]
    assert errors == []
    page.close()


@pytest.mark.slow
def test_a_flat_judge_looks_flat_beside_the_humans(run: dict[str, Path], browser: Any,
                                                   tmp_path: Path) -> None:
    """A judge that says "2" to nearly every item: system means 1.99-2.01. z-scored, its dots
    spread as far as the humans'; drawn to the same share of each score scale, they do not,
    and the plot says the ranking is noise."""
    data = read_page_data(run["out"] / "report.html")
    aspect = data["datasets"][0]["aspects"][0]
    sys = aspect["systems"]["fake/stars"]
    for i, r in enumerate(sys["rows"]):
        r["judge"] = 1.99 + 0.02 * i / (len(sys["rows"]) - 1)
        r["judge_sd"] = 0.1
    aspect["distribution"]["fake/stars"] = {"missing": 0, "edges": [0.5, 1.5, 2.5, 3.5],
                                            "counts": [1, 30, 1]}
    page, errors = _page(browser, data, tmp_path / "flat.html")
    panel = page.locator("#ds-0 .ranking")

    def spread(color: str) -> float:
        xs = panel.locator(f"circle.point[fill='{color}']").evaluate_all(
            "cs => cs.map(c => +c.getAttribute('cx'))")
        assert len(xs) == len(sys["rows"])
        return max(xs) - min(xs)

    human, judge = spread("#2ca02c"), spread("#d62728")
    assert human > 50 and judge < human / 10
    text = panel.text_content() or ""
    assert "each axis the same share of its score scale" in text
    assert "judge 1.990 to 2.010" in text
    assert "ranking is mostly noise" in text
    assert errors == []
    page.close()


# --- wide tables ---------------------------------------------------------------------------

@pytest.mark.slow
def test_wide_tables_scroll_with_the_judge_column_fixed(run: dict[str, Path],
                                                        browser: Any) -> None:
    page, errors = _open(browser, run["out"] / "report.html")
    page.set_viewport_size({"width": 520, "height": 900})
    box = page.locator("#ds-0 .scroll").first
    assert box.locator("table.corr").count() == 1
    wide = box.evaluate("b => [b.scrollWidth, b.clientWidth]")
    assert wide[0] > wide[1] + 100  # it scrolls inside its box, not the page
    judge = box.locator("tbody tr:first-child td:first-child")
    value = box.locator("tbody tr:first-child td:nth-child(2)")
    judge.scroll_into_view_if_needed()  # elementFromPoint below sees the viewport only
    before, cell_before = judge.bounding_box(), value.bounding_box()
    box.evaluate("b => { b.scrollLeft = 300; }")
    page.wait_for_function("document.querySelector('#ds-0 .scroll').scrollLeft > 0",
                           timeout=5_000)
    after, cell_after = judge.bounding_box(), value.bounding_box()
    assert after["x"] == pytest.approx(before["x"], abs=1)  # the judge column stays
    assert cell_after["x"] < cell_before["x"] - 100  # the numbers move under it
    assert judge.inner_text() == "fake/stars"
    # on top of the numbers it covers: the judge cell is what the browser hits there
    hit = page.evaluate("([x, y]) => document.elementFromPoint(x, y).textContent",
                        [after["x"] + 5, after["y"] + after["height"] / 2])
    assert hit == "fake/stars"
    rel = page.locator("#reliability .scroll table.rel.sticky")
    assert rel.count() >= 1
    assert errors == []
    page.close()


# --- the forest plot's CIs -----------------------------------------------------------------

@pytest.mark.slow
def test_forest_says_95_ci_only_where_it_draws_one(mydata: dict[str, Any], browser: Any,
                                                   tmp_path: Path) -> None:
    data = read_page_data(mydata["out"] / "report.html")
    corr = data["datasets"][0]["aspects"][0]["correlations"]
    system = [r for r in corr if r["level"] == "system" and r["value"] is not None]
    assert system and all(r["ci_low"] is None for r in system)  # none at system level
    page, errors = _open(browser, mydata["out"] / "report.html")
    forests = page.locator("#ds-0 .forest")
    captions = forests.locator(".caption").all_inner_texts()
    assert any(c.startswith("system level") for c in captions)
    for k, caption in enumerate(captions):
        bars = forests.nth(k).locator(".ci-bar").count()
        if caption.startswith("system level"):
            assert "95% CI" not in caption and "no CI" in caption and bars == 0
        else:
            assert "95% CI" in caption and bars > 0
    assert errors == []
    page.close()
    for r in system:  # once system-level CIs exist, the panel draws and names them
        r["ci_low"], r["ci_high"], r["n_systems"] = r["value"] - 0.3, min(r["value"] + 0.3, 1), 2
    page, errors = _page(browser, data, tmp_path / "ci.html")
    forest = page.locator("#ds-0 .forest", has=page.locator(".caption",
                                                            has_text="system level"))
    assert "95% CI" in forest.locator(".caption").inner_text()
    assert "2 systems" in forest.locator(".caption").inner_text()
    drawn = [r for r in system if r["method"] == data["methods"][0]]  # the first method's
    assert forest.locator(".ci-bar").count() == len(drawn) > 1
    assert errors == []
    page.close()


# --- position and length bias, drawn ---------------------------------------------------------

def _rel(figure: str, a: str, b: str, statistic: str, value: float, n: int = 20,
         p: float | None = None) -> dict[str, Any]:
    return {"dataset": "openmeva", "aspect": "overall", "figure": figure, "a": a, "b": b,
            "statistic": statistic, "value": value, "n": n, "p_value": p}


@pytest.mark.slow
def test_position_bias_is_a_chart_of_mean_score_by_position(
        run: dict[str, Path], browser: Any, tmp_path: Path) -> None:
    data = read_page_data(run["out"] / "report.html")
    means = {("fake/stars", 1): 3.4, ("fake/stars", 2): 3.1, ("fake/stars", 3): 2.9,
             ("other/p", 1): 3.0, ("other/p", 2): 3.05, ("other/p", 3): 3.0}
    data["reliability"][0]["rows"] += [
        *(_rel("position", j, f"position {k}", "mean_score", v) for (j, k), v in means.items()),
        _rel("position", "fake/stars", "", "first_position_win_rate", 0.62, 40, 0.03),
        _rel("position", "other/p", "", "first_position_win_rate", 0.5, 40, 1.0)]
    page, errors = _page(browser, data, tmp_path / "position.html")
    chart = page.locator("#reliability .position-chart")
    assert chart.count() == 1
    # textContent: a chart off screen is not laid out (content-visibility), innerText skips it
    assert "n=20 a point" in chart.locator(".caption").text_content()
    points = chart.locator("circle.point")
    assert points.count() == 6 and chart.locator("polyline").count() == 2  # a line a judge
    titles = points.evaluate_all("cs => cs.map(c => c.textContent)")
    assert "fake/stars, position 1: mean 3.400 (n=20)" in titles
    ys = {t: y for t, y in zip(titles, points.evaluate_all(
        "cs => cs.map(c => +c.getAttribute('cy'))"), strict=True)}
    assert ys["fake/stars, position 1: mean 3.400 (n=20)"] < \
        ys["fake/stars, position 3: mean 2.900 (n=20)"]  # higher mean, higher on the chart
    legend = chart.locator(".legend").all_text_contents()
    assert {"fake/stars", "other/p"} <= set(legend)
    wins = page.locator("#reliability .position-wins circle.point")
    assert wins.count() == 2
    assert errors == []
    page.close()


@pytest.mark.slow
def test_length_bias_is_a_chart(mydata: dict[str, Any], browser: Any) -> None:
    """my-data's answer field is `summary`: reliability.csv has length rows; the page draws
    each judge's and the humans' score-length Spearman, and the judge-human correlation before
    and after controlling for length."""
    (rel,) = read_page_data(mydata["out"] / "report.html")["reliability"]
    bias = {r["a"]: r["value"] for r in rel["rows"] if r["figure"] == "length"
            and r["b"] == "length (chars)" and r["value"] is not None}
    assert "human" in bias and "fake/stars" in bias
    page, errors = _open(browser, mydata["out"] / "report.html")
    chart = page.locator("#reliability .length-chart")
    assert chart.count() == 1
    titles = chart.locator("circle.point").evaluate_all("cs => cs.map(c => c.textContent)")
    assert sorted(t.split(":")[0] for t in titles) == sorted(bias)
    for judge, value in bias.items():
        assert any(t.startswith(f"{judge}: {value:.3f}") for t in titles)
    partial = page.locator("#reliability .length-partial")
    assert partial.count() == 1 and partial.locator("circle.point").count() == 2 * (len(bias) - 1)
    assert "controlling for length" in (partial.locator(".legend").text_content() or "")
    assert errors == []
    page.close()


@pytest.mark.slow
def test_the_new_views_keep_data_as_text(run: dict[str, Path], browser: Any,
                                         tmp_path: Path) -> None:
    data = copy.deepcopy(read_page_data(run["out"] / "report.html"))
    data["unparsed"] = [{"judge": PAYLOAD, "unparsed": 3, "answered": 4}]
    data["datasets"][0]["aspects"][0]["systems"]["fake/stars"]["rows"][0]["system"] = PAYLOAD
    data["reliability"][0]["rows"] += [_rel("position", PAYLOAD, "position 1", "mean_score", 3),
                                       _rel("length", PAYLOAD, "length (chars)", "spearman", 0.2)]
    page, errors = _page(browser, data, tmp_path / "hostile.html")
    assert page.evaluate("window.__pwned") is None
    assert PAYLOAD in page.inner_text("#banner")
    assert errors == []
    page.close()


@pytest.mark.slow
def test_paper_figure_draws_a_flat_judge_flat(run: dict[str, Path]) -> None:
    """`judge report --figures`: the systems figure puts both sides on one axis, each as a
    share of its own score scale (z-scores made the flat judge as wide as the humans), and
    the forest figure says "95% CI" only for a panel with CIs."""
    from runner.report.figures import _forest, _systems

    data = read_page_data(run["out"] / "report.html")
    aspect = data["datasets"][0]["aspects"][0]
    rows = aspect["systems"]["fake/stars"]["rows"]
    for i, r in enumerate(rows):
        r["judge"] = 1.99 + 0.02 * i / (len(rows) - 1)
    aspect["distribution"]["fake/stars"] = {"missing": 0, "edges": [0.5, 1.5, 2.5, 3.5],
                                            "counts": [1, 30, 1]}
    fig = _systems(aspect, "flat")
    assert fig is not None
    xs = {line.get_label(): line.get_xdata() for line in fig.axes[0].lines
          if line.get_label() in ("human", "judge")}
    width = {k: float(max(v) - min(v)) for k, v in xs.items()}
    assert width["human"] > 0.2 and width["judge"] < width["human"] / 10
    corr = [dict(r, ci_low=None, ci_high=None) if r["level"] == "dataset" else r
            for r in aspect["correlations"]]
    forest = _forest(corr, ["sample", "dataset"], "spearman", "t")
    assert forest is not None
    labels = [ax.get_xlabel() for ax in forest.axes]
    assert labels == ["spearman (95% CI)", "spearman (no CI)"]


# --- a large study's page -----------------------------------------------------------------------

@pytest.mark.slow
def test_a_large_study_draws_aggregates_and_states_the_item_sample(browser: Any,
                                                                   tmp_path: Path) -> None:
    """A million rows a judge and 30,000 judgments through the item browser: the page draws
    2-D histograms with quantile boxes and the distributions' quantiles, and says the browser
    holds a random sample, how large, of how many, and can show that sample alone."""
    from runner.report.browser import ItemRows
    from runner.report.pagedata import page_data

    rows = ItemRows()
    list(rows.watch(_judgment(i, None if i % 40 == 3 else float(i % 5), 3.0)
                    for i in range(30_000)))
    series = synthetic_series(1_000_000)
    data = page_data(small_expansion(tmp_path), {("news", "fluency"): series}, [], [], [],
                     None, {}, rows)
    page, errors = _page(browser, data, tmp_path / "large.html")
    assert (tmp_path / "large.html").stat().st_size < 1_500_000  # 2,000 rows and the charts
    aspect = data["datasets"][0]["aspects"][0]
    levels = sum(q is not None for sc in aspect["scatter"].values() for q in sc["levels"]["q"])
    assert page.locator("svg .cell").count() == sum(
        len(sc["hist"]["cells"]) for sc in aspect["scatter"].values())
    assert page.locator("svg .quantile").count() == levels == 3 * 9
    assert page.locator(".plot .quantiles").count() == 4  # three judges and the humans
    assert "median 3, middle half 2–4" in page.text_content(".plot .quantiles >> nth=0")
    note = page.inner_text("#item-sample")
    assert note.startswith("A sample: 1,000 of 30,000 judgments, drawn uniformly at random "
                           "(seed 0); with the 500 largest judge-human disagreements and 500 "
                           "of the 750 failures, drawn at random"), note
    assert f": {len(data['items']['rows']):,} rows" in note
    page.select_option("#item-filter-kept", "random")
    assert page.inner_text("#item-count").startswith("1000 of ")
    page.select_option("#item-filter-kept", "failure")
    assert page.inner_text("#item-count").startswith("500 of ")
    assert set(page.locator("#items-table td:nth-child(9)").all_inner_texts()) == {"parse"}
    assert errors == []
    page.close()
    import matplotlib.pyplot

    from runner.report.figures import _scatter  # the paper figure draws the same boxes

    fig = _scatter(aspect["scatter"], "fluency", "large")
    assert fig is not None and sum(len(ax.patches) for ax in fig.axes) == levels
    matplotlib.pyplot.close(fig)


@pytest.mark.slow
def test_too_many_systems_are_counted_not_drawn(browser: Any, tmp_path: Path) -> None:
    """Past MAX_SYSTEMS systems the page draws no row per system and says how many."""
    from runner.report.browser import ItemRows
    from runner.report.pagedata import MAX_SYSTEMS, page_data

    series = synthetic_series(5_000, systems=MAX_SYSTEMS + 1)
    data = page_data(small_expansion(tmp_path), {("news", "fluency"): series}, [], [], [],
                     None, {}, ItemRows())
    page, errors = _page(browser, data, tmp_path / "systems.html")
    assert page.locator(".ranking").count() == 0
    assert page.text_content(".system-count") == (
        f"{MAX_SYSTEMS + 1} systems: too many to draw a row each here; the system-level "
        "correlations are in the table above.")
    assert errors == []
    page.close()


# --- a battle's page: its ranking as a chart, an item browser without human columns ---------

@pytest.mark.slow
def test_a_battle_page_charts_its_ranking_and_claims_no_disagreement(
        browser: Any, tmp_path: Path) -> None:
    job = ROOT / "examples" / "battle" / "job.toml"
    choose = ("--model", "fake", "--cache-dir", str(tmp_path / "cache"), "--out",
              str(tmp_path / "out"))
    with ThreadedServer(Script()) as server:
        done = _judge("run", str(job), *choose, "--base-url", server.url, "--yes", cwd=tmp_path)
        figures = _judge("report", str(job), *choose, "--base-url", server.url, "--figures",
                         str(tmp_path / "figs"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    ranking = read_page_data(tmp_path / "out" / "report.html")["ranking"]
    page, errors = _open(browser, tmp_path / "out" / "report.html")
    chart = page.locator("#battles .strengths")
    assert chart.count() == 1
    assert chart.locator("circle.point").count() == len(ranking) == 2
    assert chart.locator("line.ci-bar").count() == sum(r["ci_low"] is not None for r in ranking)
    assert "1. model-" in chart.inner_text()
    heads = page.locator("#items-table thead th").all_inner_texts()
    assert "human" not in heads and "|diff|" not in heads and "score" in heads
    note = page.inner_text("#item-sample")
    assert "no judge-human disagreement to sort by" in note and "largest" not in note
    assert errors == []
    page.close()
    assert figures.returncode == 0, figures.stderr  # the paper figure of the same ranking
    assert (tmp_path / "figs" / "ranking_fake-battle_answers_battle.png").is_file()
