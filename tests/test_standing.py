"""Judges that cannot mislead (issue 36, section 3), through the real `judge` CLI against the
fake server: the best `*` goes only to a judge with enough parsed answers and groups, every
correlation the table prints has its n, and a judge giving one score to every item is named
(terminal, summary.csv, report.html's banner) and fails the run."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import orjson

from runner.report.html import read_page_data
from runner.report.standing import bias_warnings
from tests import test_report
from tests.fakeserver import ThreadedServer
from tests.test_cli import clean_env, run_judge, write_job

browser = test_report.browser  # Debian's chromium (skips without it outside CI)

GROUPS, SYSTEMS = 12, 5
"""60 items: 12 documents, 5 systems each; every item's text carries its human score."""

TOY_JOB = """
[[datasets]]
name = "toy"
path = "toy.jsonl"
[datasets.fields]
id = "id"
group = "doc"
system = "system"
text = { text = "text" }
human = { overall = "score" }

[[prompts]]
name = "stars"
template = "toy.txt"
parser = "stars"
aspects = ["overall"]

[models.good]
spec = "good"

[models.poor]
spec = "poor"
"""

HUMAN = re.compile(r"human=(\d)")
KEY = re.compile(r"key=(\d+)")


def toy_job(folder: Path) -> Path:
    """The job over 60 items whose human scores spread over 1..5 within every document."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"d{g}-s{s}", "doc": f"d{g}", "system": f"s{s}",
             "text": f"key={g * SYSTEMS + s} human={(g + s) % 5 + 1}", "score": (g + s) % 5 + 1}
            for g in range(GROUPS) for s in range(SYSTEMS)]
    (folder / "toy.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    (folder / "toy.txt").write_text("Rate this text: {{text}}\nAnswer with 1 to 5 stars.\n")
    return write_job(folder, TOY_JOB)


def good_or_poor(body: dict[str, Any]) -> str:
    """`good` is near the human score on every item (off by one on every third); `poor`
    answers only one item in four, and those exactly (the rest: text no parser reads)."""
    text = body["messages"][-1]["content"]
    human, key = int(HUMAN.findall(text)[-1]), int(KEY.findall(text)[-1])
    if body["model"] == "good":
        return f"{min(5, human + (key % 3 == 0))} stars"
    return f"{human} stars" if key % 4 == 0 else "I cannot rate this."


def _run(server: ThreadedServer, tmp_path: Path, data_dir: Path,
         *extra: Any) -> tuple[Any, Path]:
    job = toy_job(tmp_path / "jobs")
    out = tmp_path / "out"
    result = run_judge("run", job, "--base-url", server.url, "--cache-dir", tmp_path / "cache",
                       "--out", out, *extra, env=clean_env(data_dir), cwd=tmp_path)
    return result, out


def _table(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("correlation with"))
    return lines[at:]


def test_the_best_mark_goes_to_the_judge_that_answered(server: ThreadedServer, tmp_path: Path,
                                                       data_dir: Path) -> None:
    server.state.script.reply = good_or_poor
    result, out = _run(server, tmp_path, data_dir)

    table = _table(result.stderr)
    good = next(line for line in table if "good/stars" in line)
    poor = next(line for line in table if "poor/stars" in line)
    poor_value, good_value = (float(re.findall(r"stars\s+(-?[\d.]+)", line)[0])
                              for line in (poor, good))
    assert poor_value > good_value, table  # poor's few parsed answers are exact
    assert good.lstrip().startswith("* good/stars") and not poor.lstrip().startswith("*")
    # n beside every correlation: groups (sample), items (dataset), systems (system)
    assert re.findall(r"n=(\d+)", good) == [str(GROUPS), str(GROUPS * SYSTEMS), str(SYSTEMS)]
    assert len(re.findall(r"n=\d+", poor)) == len(re.findall(r"\d\.\d{3}", poor)) > 0
    assert ">= 50% of answers parsed and n >= 10" in table[4], table

    # judge runs' "best correlation" and report.html's bold cell name the same judge
    runs = run_judge("runs", tmp_path / "jobs" / "job.toml", "--out", out,
                     env=clean_env(data_dir), cwd=tmp_path)
    assert runs.returncode == 0, runs.stderr
    assert "good/stars" in runs.stdout.splitlines()[-1] and "poor/stars" not in runs.stdout
    aspect = read_page_data(out / "report.html")["datasets"][0]["aspects"][0]
    assert ["sample", "all", "spearman", "good/stars"] in aspect["best"]
    assert not any(judge == "poor/stars" for *_, judge in aspect["best"])


def test_a_judge_without_spread_is_named_and_fails_the_run(server: ThreadedServer,
                                                          tmp_path: Path,
                                                          data_dir: Path) -> None:
    server.state.script.reply = lambda body: ("3 stars" if body["model"] == "poor"
                                              else good_or_poor(body))
    result, out = _run(server, tmp_path, data_dir)

    assert result.returncode == 1, result.stderr
    assert ('judge poor/stars: 60 of 60 answers are "3" on toy / overall (no spread): no '
            "correlation can be computed") in result.stderr.splitlines()
    with (out / "summary.csv").open(newline="", encoding="utf-8") as f:
        rows = {r["model"]: r for r in csv.DictReader(f)}
    assert (rows["poor"]["top_score"], rows["poor"]["top_count"]) == ("3.0", "60")
    assert rows["good"]["top_count"] != "60"
    assert read_page_data(out / "report.html")["no_spread"] == [
        {"judge": "poor/stars", "dataset": "toy", "aspect": "overall", "top": 60, "scored": 60,
         "score": "3"}]


def test_nearly_no_spread_also_fails_and_a_spread_judge_does_not(server: ThreadedServer,
                                                                tmp_path: Path,
                                                                data_dir: Path) -> None:
    def reply(body: dict[str, Any]) -> str:
        if body["model"] == "good":
            return good_or_poor(body)
        key = int(KEY.findall(body["messages"][-1]["content"])[-1])
        return "4 stars" if key == 7 else "3 stars"  # 59 of 60 alike: >= 95%

    server.state.script.reply = reply
    result, _ = _run(server, tmp_path, data_dir)

    assert result.returncode == 1, result.stderr
    assert ('judge poor/stars: 59 of 60 answers are "3" on toy / overall (almost no spread): '
            "its correlations rest on the few answers that differ") in result.stderr
    assert "judge good/stars" not in result.stderr


def test_diff_prints_n_and_names_judges_that_mostly_did_not_parse(server: ThreadedServer,
                                                                  tmp_path: Path,
                                                                  data_dir: Path) -> None:
    server.state.script.reply = good_or_poor
    result, out = _run(server, tmp_path, data_dir)
    assert result.returncode == 0, result.stderr
    job = tmp_path / "jobs" / "job.toml"
    env = clean_env(data_dir)
    again = run_judge("rescore", job, "--base-url", server.url, "--cache-dir", tmp_path / "cache",
                      "--out", out, env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    first = sorted(p.name for p in (out / "history").iterdir())[0]

    diff = run_judge("diff", job, first, "latest", "--out", out, env=env, cwd=tmp_path)

    assert diff.returncode == 0, diff.stderr
    lines = diff.stdout.strip().splitlines()
    assert lines[0].endswith("paired bootstrap; n = groups both runs scored):")
    good = [line for line in lines if "good/stars -> good/stars" in line]
    poor = [line for line in lines if "poor/stars -> poor/stars" in line]
    assert len(good) == len(poor) == 2  # sample and dataset levels
    assert all(line.endswith(f"  n={GROUPS}") for line in good), good
    assert all(re.search(r"  n=\d+  \(few answers parsed in both runs: 15 of 60, 15 of 60\)$",
                         line) for line in poor), poor


def test_diff_says_when_two_runs_share_no_group(server: ThreadedServer, tmp_path: Path,
                                                data_dir: Path) -> None:
    server.state.script.reply = good_or_poor
    job = toy_job(tmp_path / "jobs")
    data = tmp_path / "jobs" / "toy.jsonl"
    rows = data.read_bytes().splitlines(keepends=True)
    out, env = tmp_path / "out", clean_env(data_dir)
    for half in (rows[:30], rows[30:]):  # documents 0-5, then 6-11: no group in common
        data.write_bytes(b"".join(half))
        done = run_judge("run", job, "--base-url", server.url, "--cache-dir",
                         tmp_path / "cache", "--out", out, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    first = sorted(p.name for p in (out / "history").iterdir())[0]

    diff = run_judge("diff", job, first, "latest", "--out", out, env=env, cwd=tmp_path)

    assert diff.returncode == 0, diff.stderr
    assert "  toy / overall: the two runs share no scored group (other items: another " \
           "--sample, --limit or data file): nothing to compare" in diff.stdout.splitlines()
    assert all(line.endswith("n=0") or "(few answers" in line
               for line in diff.stdout.splitlines() if "->" in line and "/stars" in line)


def test_a_judge_that_scores_length_is_warned_of(server: ThreadedServer, tmp_path: Path,
                                                 data_dir: Path) -> None:
    """poor's stars are its answer's length (padding of 1 to 5 blocks, unrelated to the human
    score); a warning, not a failure."""
    job = toy_job(tmp_path / "jobs")
    job.write_text(TOY_JOB.replace('text = { text = "text" }', 'text = { output = "text" }'))
    (tmp_path / "jobs" / "toy.txt").write_text("Rate this text: {{output}}\nAnswer with stars.\n")
    data = tmp_path / "jobs" / "toy.jsonl"
    rows = [orjson.loads(line) for line in data.read_bytes().splitlines()]
    for i, row in enumerate(rows):
        row["text"] += " " + "padding " * (4 * ((i * 2) % 5 + 1))
    data.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))

    def reply(body: dict[str, Any]) -> str:
        if body["model"] == "good":
            return good_or_poor(body)
        return f"{body['messages'][-1]['content'].count('padding') // 4} stars"

    server.state.script.reply = reply
    result = run_judge("run", job, "--base-url", server.url, "--cache-dir", tmp_path / "cache",
                       "--out", tmp_path / "out", env=clean_env(data_dir), cwd=tmp_path)

    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "track" in line]
    assert len(warned) == 1 and re.fullmatch(
        r"warning: judge poor/stars on toy / overall: its scores track answer length "
        r"\(spearman (0\.9\d|1\.00) over 60 items\); length held fixed, its spearman with "
        r"the humans is -?0\.0\d \(see reliability\.csv\)", warned[0]), warned


def test_a_judge_whose_verdicts_follow_the_order_is_warned_of() -> None:
    """Position rows exist for group prompts and battles; the rule reads reliability.csv's."""
    def row(judge: str, value: float, n: int, p: float) -> dict[str, Any]:
        return {"dataset": "d", "aspect": "a", "figure": "position", "a": judge, "b": "",
                "statistic": "first_position_win_rate", "value": value, "n": n, "p_value": p}

    lines = bias_warnings([row("m/first", 0.95, 40, 1e-9), row("m/second", 0.05, 40, 1e-9),
                           row("m/fair", 0.6, 40, 0.2), row("m/few", 1.0, 4, 0.12)])
    assert lines == [
        "warning: judge m/first on d / a: the output shown first wins 95% of 40 decisive "
        "pairs: its verdicts track position (see reliability.csv)",
        "warning: judge m/second on d / a: the output shown second wins 95% of 40 decisive "
        "pairs: its verdicts track position (see reliability.csv)"]


def test_the_paper_table_boxes_the_page_s_best_judge_only() -> None:
    """`judge report --figures` draws from report.html's data: the box is the page's `best`
    (runner.report.standing), not the column's highest value."""
    import matplotlib.pyplot as plt  # matplotlib: only in the tests that draw
    from matplotlib.patches import Rectangle

    from runner.report.figures import _table

    rows = [{"judge": j, "level": "sample", "method": "spearman", "subset": "all", "value": v}
            for j, v in (("a/p", 0.4), ("b/p", 0.9))]  # b: the 16-of-60 judge
    marked, unmarked = (_table(rows, "t", best) for best in
                        ([["sample", "all", "spearman", "a/p"]], []))
    try:
        def boxes(fig: Any) -> list[Any]:
            return [p.get_xy() for p in fig.axes[0].patches if isinstance(p, Rectangle)]

        assert boxes(marked) == [(-0.5, -0.5)]  # column 0, row 0: a/p
        assert boxes(unmarked) == []
    finally:
        plt.close("all")


def test_the_page_bolds_the_ranked_best_and_names_a_judge_without_spread(
        server: ThreadedServer, tmp_path: Path, data_dir: Path, browser: Any) -> None:
    """In Chromium: report.html's bold cells are the page data's `best` (good/stars, never
    the mostly unparsed poor/stars), and its banner carries the terminal's no-spread line."""
    server.state.script.reply = good_or_poor
    result, out = _run(server, tmp_path / "ranked", data_dir)
    assert result.returncode == 0, result.stderr
    page, errors = test_report._open(browser, out / "report.html")
    bold = page.evaluate("[...document.querySelectorAll('table.corr td.best')]"
                         ".map(td => td.parentElement.firstElementChild.textContent)")
    assert bold and set(bold) == {"good/stars"}, bold
    page.close()

    server.state.script.reply = lambda body: ("3 stars" if body["model"] == "poor"
                                              else good_or_poor(body))
    result, out = _run(server, tmp_path / "flat", data_dir)
    assert result.returncode == 1, result.stderr
    page, errors_flat = test_report._open(browser, out / "report.html")
    banner = page.locator("#main > #banner").inner_text()
    assert ('judge poor/stars: 60 of 60 answers are "3" on toy / overall (no spread): no '
            "correlation can be computed") in banner
    assert errors == errors_flat == []
    page.close()
