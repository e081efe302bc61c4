"""Benchmark: report.html of a ten-million-judgment study (issue 26), built from columns.

The study's shape: 100,000 items x 5 prompts x 4 aspects x 5 judge models, so per (data set,
aspect) 25 judges of 100,000 rows each (`--quick`: 10,000 items, 1M judgments). No job runs:
the page's inputs are made here as a run would hand them over, the reducer's `Series` (numpy
columns: stars with noise, one judge on a continuous scale, 1% unscored; human scores the mean
of two raters; 8 systems), correlations.csv and summary.csv rows of the right number, and an
`ItemRows` that watched every judgment (synthetic `Judgment`s, 2% failures). Measured:

- `item_rows_s`: every judgment made and watched by the browser's `ItemRows` (the making
  included: it is most of it), `item_rows_held_most`: the most rows it held at once (checked
  every 100,000 judgments), and `item_rows_add_us`: `ItemRows.add` alone a judgment, over a
  list of 300,000 made beforehand (best of 3);
- `page_data_s`, `render_s`: the page's data and the page, in this process (best of 3), and
  `page_data_peak_mb`: the most memory page_data allocated (tracemalloc, numpy included);
- `html_mb`: report.html's size; `drawn_s`: Debian's chromium, headless, from navigation to
  every chart and table drawn (body[data-rendered]), best and median of 3 fresh tabs.

    .venv/bin/python bench/run.py --only page [--quick]
"""

from __future__ import annotations

import itertools
import random
import statistics
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench import common
from bench.report import ARGS, CHROMIUM
from runner.data.datasets import Item
from runner.expand import Expansion
from runner.job.load import load_job
from runner.prepare import prepare
from runner.reduce.judgments import Judgment
from runner.reduce.series import Labels, Series
from runner.report.browser import ItemRows
from runner.report.html import embed_json, render
from runner.report.pagedata import page_data
from runner.tasks import Task

ASPECTS = ("coherence", "consistency", "fluency", "relevance")
PROMPTS, MODELS, SYSTEMS = 5, 5, 8
TARGET_MB, TARGET_DRAWN_S = 5.0, 5.0  # "opens in a browser in seconds"
BODY = b'{"messages":[{"role":"user","content":"Rate the summary from 1 to 5 stars."}]}'


def _judges() -> list[tuple[str, str]]:
    return [(f"judge{m}", f"p{p}") for m in range(MODELS) for p in range(PROMPTS)]


def synthetic_series(items: int, seed: int = 0) -> dict[tuple[str, str], dict[str, Series]]:
    """(dataset, aspect) -> judge -> Series, the 10M study's columns at `items` items."""
    rng = np.random.default_rng(seed)
    groups = np.arange(items, dtype=np.int32) // SYSTEMS
    labels = Labels(groups=[f"g{g}" for g in range(int(groups[-1]) + 1)],
                    systems=[f"s{s}" for s in range(SYSTEMS)], subsets=[""])
    system = (np.arange(items) % SYSTEMS).astype(np.int32)
    subset = np.zeros(items, dtype=np.int32)
    out: dict[tuple[str, str], dict[str, Series]] = {}
    for aspect in ASPECTS:
        human = (rng.integers(1, 6, items) + rng.integers(1, 6, items)) / 2.0
        judges: dict[str, Series] = {}
        for k, (model, prompt) in enumerate(_judges()):
            noisy = human + rng.normal(0, 0.4 + 0.05 * k, items)
            judge = np.clip(noisy, 1, 5) * 20 if k == 0 else np.clip(np.rint(noisy), 1, 5)
            judge[rng.random(items) < 0.01] = np.nan
            judges[f"{model}/{prompt}"] = Series(judge, human, groups, system, subset, labels)
        out["synth", aspect] = judges
    return out


def _tables(series: dict[tuple[str, str], dict[str, Series]],
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """correlations.csv and summary.csv rows, as many as the study has (values made up)."""
    corr, summ = [], []
    for (dataset, aspect), judges in series.items():
        for name, s in judges.items():
            for level in ("sample", "dataset", "system"):
                for method in ("pearson", "spearman", "kendall"):
                    corr.append({"dataset": dataset, "aspect": aspect, "judge": name,
                                 "level": level, "method": method, "subset": "all",
                                 "value": 0.5, "n_groups": len(s.labels.groups),
                                 "n_items": len(s), "ci_low": 0.45, "ci_high": 0.55,
                                 "n_systems": SYSTEMS if level == "system" else None})
            model, prompt = name.split("/")
            scored = int(np.count_nonzero(~np.isnan(s.judge)))
            summ.append({"dataset": dataset, "prompt": prompt, "aspect": aspect, "model": model,
                         "n": len(s), "scored": scored, "mean": 3.0, "std": 1.0,
                         "parse_failures": len(s) - scored, "refusals": 0, "api_failures": 0})
    return corr, summ


def _judgments(items: list[Item]) -> Iterator[Judgment]:
    """Every judgment of the study, made as they go by (2% failures)."""
    rng = random.Random(1)
    failure = {"type": "parse", "message": "no score in the answer"}
    for aspect in ASPECTS:
        for model, prompt in _judges():
            for it in items:
                key = f"{it.item_id}/{aspect}/{model}/{prompt}"
                task = Task(key, "synth", it.item_id, prompt, aspect, model, 0, BODY, 20, 16)
                if rng.random() < 0.02:
                    yield Judgment(task, it, None, {}, "I cannot tell.", failure, True, None)
                else:
                    score = float(rng.randint(1, 5))
                    yield Judgment(task, it, score, {aspect: score}, f"{score:g} stars", None,
                                   True, None)


def _items(n: int) -> list[Item]:
    return [Item(dataset="synth", item_id=f"i{i}", group=f"g{i // SYSTEMS}",
                 system=f"s{i % SYSTEMS}", subset="", fields={},
                 human={a: float(1 + (i * 7 + k) % 5) for k, a in enumerate(ASPECTS)},
                 annotators={}, metrics={}) for i in range(n)]


def _drawn(page: Path, rounds: int = 3) -> list[float] | None:
    """Seconds from navigation to the page drawn, per fresh tab; None without chromium."""
    if not CHROMIUM.exists():
        return None
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            for _ in range(rounds):
                tab = browser.new_page(viewport={"width": 1280, "height": 900})
                started = time.perf_counter()
                tab.goto(page.as_uri())
                tab.wait_for_selector("body[data-rendered=true]", timeout=120_000)
                times.append(time.perf_counter() - started)
                tab.close()
        finally:
            browser.close()
    return times


def _add_us(items: list[Item]) -> float:
    """Microseconds of `ItemRows.add` a judgment, over 300,000 made beforehand (best of 3)."""
    made = list(itertools.islice(_judgments(items), 300_000))
    best = float("inf")
    for _ in range(3):
        rows = ItemRows()
        started = time.perf_counter()
        for j in made:
            rows.add(j)
        best = min(best, time.perf_counter() - started)
    return best / len(made) * 1e6


def _expansion(work: Path) -> Expansion:
    """The job the page names (its prompts, levels and methods): 5 prompts, 4 aspects."""
    job = common.write_job(work / "job", 10, aspects=ASPECTS, prompts=PROMPTS,
                           base_url="http://127.0.0.1:9/v1")
    return prepare(load_job(job), job.parent)


def _best_of(n: int, make: Any) -> tuple[float, Any]:
    best, made = float("inf"), None
    for _ in range(n):
        started = time.perf_counter()
        made = make()
        best = min(best, time.perf_counter() - started)
    return best, made


def report_page_10m(work: Path, quick: bool) -> dict[str, Any]:
    """The benchmark (see the module docstring)."""
    items = 10_000 if quick else 100_000
    expansion = _expansion(work)
    series = synthetic_series(items)
    corr, summ = _tables(series)
    rows, most = ItemRows(), 0
    started = time.perf_counter()
    for k, _ in enumerate(rows.watch(_judgments(_items(items)))):
        if k % 100_000 == 0:
            most = max(most, len(rows.everything) + len(rows.sample) + len(rows.top)
                       + len(rows.failures))
    item_rows_s = time.perf_counter() - started
    add_us = _add_us(_items(items))

    def build() -> dict[str, Any]:
        return page_data(expansion, series, corr, summ, [], None, {"job": "synth"}, rows)

    page_data_s, data = _best_of(3, build)
    tracemalloc.start()
    build()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    render_s, page = _best_of(3, lambda: render(data))
    path = work / "report.html"
    path.write_bytes(page)
    drawn = _drawn(path)
    html_mb = len(page) / 1e6
    best = None if drawn is None else min(drawn)
    return {
        "setup": {"items": items, "judgments": rows.seen, "judges_per_aspect": len(_judges()),
                  "aspects": len(ASPECTS), "series": sum(len(j) for j in series.values()),
                  "rows_per_series": items, "rows_embedded": len(data["items"]["rows"]),
                  "chromium": str(CHROMIUM)},
        "target": f"report.html < {TARGET_MB:g} MB, drawn in chromium < {TARGET_DRAWN_S:g} s",
        "item_rows_s": round(item_rows_s, 2),
        "item_rows_us_per_judgment": round(item_rows_s / rows.seen * 1e6, 2),
        "item_rows_held_most": most,
        "item_rows_add_us": round(add_us, 2),
        "page_data_s": round(page_data_s, 3),
        "page_data_peak_mb": round(peak / 1e6, 1),
        "render_s": round(render_s, 3),
        "html_mb": round(html_mb, 3),
        "charts_json_mb": round(len(embed_json({"d": data["datasets"]})) / 1e6, 3),
        "drawn_s": None if best is None else round(best, 2),
        "drawn_s_median": None if drawn is None else round(statistics.median(drawn), 2),
        "pass": None if quick or best is None else html_mb < TARGET_MB and best < TARGET_DRAWN_S,
        "command": "bench/run.py --only page" + (" --quick" if quick else ""),
    }
