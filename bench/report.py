"""Benchmark: report.html for a 100,000-judgment job (25,000 items x 4 aspects, all cached).

Measures, in this process, what writing report.html adds to a run's reports: keeping the item
browser's rows as the judgments stream by, the page's data (runner.report.pagedata) and the
page itself; then the page's size, and the time Debian's chromium takes from navigation to
the page drawn (body[data-rendered]), when chromium is installed.

    .venv/bin/python bench/run.py --only report [--quick]   # quick: 5,000 items, 20,000
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from bench import common
from bench.cached import ASPECTS, prefill
from runner.execute.store.cache import Cache
from runner.job.load import load_job
from runner.prepare import prepare
from runner.reduce.battle import Battles
from runner.reduce.judgments import judge
from runner.reduce.positions import Positions
from runner.report.browser import ItemRows
from runner.report.html import render
from runner.report.pagedata import page_data
from runner.report.reliability import reliability_rows
from runner.report.write import collect, correlations, judge_rows, summary

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
TARGET_MB, TARGET_LOAD_S = 5.0, 3.0


def _browser_load(page: Path) -> float | None:
    """Seconds from navigation to the page drawn, in headless chromium; None without it."""
    if not CHROMIUM.exists():
        return None
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 900})
            started = time.perf_counter()
            tab.goto(page.as_uri())
            tab.wait_for_selector("body[data-rendered=true]", timeout=60_000)
            return time.perf_counter() - started
        finally:
            browser.close()


def report_page(work: Path, quick: bool) -> dict[str, Any]:
    """The benchmark (see the module docstring)."""
    items = 5000 if quick else 25000
    job_path = common.write_job(work / "job", items, aspects=ASPECTS,
                                base_url=f"http://127.0.0.1:{common.free_port()}/v1")
    prefill(job_path, work / "cache")
    expansion = prepare(load_job(job_path), job_path.parent)
    with Cache(work / "cache") as cache:
        # As in a run: tasks kept without their bodies, so the page rebuilds the kept rows'.
        judgments = [j._replace(task=j.task.without_body())
                     for j in judge(expansion, cache)]
    battles, rows = Battles(expansion), ItemRows()
    started = time.perf_counter()
    for _ in rows.watch(judgments):
        pass
    watch_s = time.perf_counter() - started
    positions = Positions(expansion)
    tables = collect(expansion, battles.watch(positions.watch(judgments)), _Sink())
    series = judge_rows(expansion, tables)  # shared with correlations.csv: not added work
    corr, summ = correlations(expansion, tables, series), summary(tables)
    reliability = reliability_rows(expansion, tables.cells, positions)  # reliability.csv's
    started = time.perf_counter()
    data = page_data(expansion, series, corr, summ, battles.rows(), None,
                     {"job": expansion.job.name}, rows, reliability)
    page = render(data)
    path = work / "report.html"
    path.write_bytes(page)
    build_s = time.perf_counter() - started
    load_s = _browser_load(path)
    size_mb = len(page) / 1e6
    return {
        "setup": {"judgments": len(judgments), "items": items, "aspects": len(ASPECTS),
                  "rows_embedded": len(data["items"]["rows"]),
                  "reliability_rows": len(reliability)},
        "target": f"page < {TARGET_MB:g} MB, drawn in chromium < {TARGET_LOAD_S:g} s",
        "html_seconds": round(watch_s + build_s, 2),
        "keep_rows_seconds": round(watch_s, 2),
        "page_data_and_render_seconds": round(build_s, 2),
        "page_mb": round(size_mb, 2),
        "browser_load_seconds": None if load_s is None else round(load_s, 2),
        "pass": None if quick or load_s is None else size_mb < TARGET_MB
        and load_s < TARGET_LOAD_S,
        "command": "bench/run.py --only report" + (" --quick" if quick else ""),
    }


class _Sink:
    """judgments.jsonl's bytes, dropped: only the added work is timed."""

    def write(self, data: bytes) -> int:
        return len(data)
