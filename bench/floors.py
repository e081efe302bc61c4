"""`judge` against the project's floors (../shared/floors), as whole processes, in one window.

The floors are the least one Python process can do for the same work (see their README):
`bare_loop.py` POSTs N chat bodies through one aiohttp session; `cached_floor.py` renders and
hashes every request, reads every stored answer of a cache folder in one scan, parses, writes a
CSV and correlates. They are read where they are (JUDGE_FLOORS_DIR, default ../shared/floors),
never copied. Each side is a fresh process, alternated with the other ROUNDS times, best of
ROUNDS, on the floors' own job shape (`big.py`, `big.toml`, `stars.txt`):

- throughput: N calls (40,000; `--quick` 8,000) at 0 ms, 64 in flight, a fresh fake server and
  a fresh cache per process: bare seconds / `judge run` seconds, best of each side and the
  median of the rounds' ratios (goal >= 0.8x);
- cached: 100,000 tasks (25,000 items x 4 aspects; `--quick` 5,000 x 4), the cache filled once
  by a real `judge run`: `judge run` (all cached) and `judge rescore` seconds / the cached
  floor's seconds (goal <= 1.5x). The floor is given a 100,000-line data file, so it renders,
  hashes and writes a row for as many tasks as judge does.
"""

from __future__ import annotations

import os
import shutil
import statistics
from pathlib import Path
from typing import Any

from bench import common

FLOORS = Path(os.environ.get("JUDGE_FLOORS_DIR") or common.ROOT.parent / "shared" / "floors")
CONCURRENCY = 64
ROUNDS = 3
TIMEOUT_S = 600.0
ASPECTS = ("quality", "fluency", "coherence", "relevance")
GOALS = {"throughput": 0.8, "cached_run": 1.5, "rescore": 1.5}


def floors(work: Path, quick: bool) -> dict[str, Any]:
    """Whole-process ratios of `judge` to the floors, with their goals."""
    if not (FLOORS / "bare_loop.py").exists():
        return {"skipped": f"no floors at {FLOORS} (set JUDGE_FLOORS_DIR)"}
    calls = 8_000 if quick else 40_000
    items = 5_000 if quick else 25_000
    throughput = _throughput(work / "throughput", calls)
    cached = _cached(work / "cached", items)
    met = (throughput["judge_over_bare"] >= GOALS["throughput"]
           and cached["run_over_floor"] <= GOALS["cached_run"]
           and cached["rescore_over_floor"] <= GOALS["rescore"])
    return {"judge_over_bare": throughput["judge_over_bare"],
            "judge_over_bare_median": throughput["judge_over_bare_median"],
            "run_over_floor": cached["run_over_floor"],
            "rescore_over_floor": cached["rescore_over_floor"],
            "target": "bare/run >= 0.8x; run, rescore <= 1.5x the cached floor",
            "pass": None if quick else met, "throughput": throughput, "cached": cached}


def _shape(folder: Path, items: int, aspects: tuple[str, ...]) -> Path:
    """The floors' job over `items` items of big.py, judged on `aspects` (one human column)."""
    folder.mkdir(parents=True, exist_ok=True)
    _checked([common.PYTHON, str(FLOORS / "big.py"), str(items), "big.jsonl"], folder)
    shutil.copy(FLOORS / "stars.txt", folder / "stars.txt")
    job = (FLOORS / "big.toml").read_text(encoding="utf-8")
    if aspects != ("quality",):
        # the aspect is named in the request, so every (item, aspect) is a request of its own
        with (folder / "stars.txt").open("a", encoding="utf-8") as f:
            f.write(" ({{aspect}})")
        job = job.replace('aspects = ["quality"]', f"aspects = {list(aspects)!r}".replace("'", '"'))
        job = job.replace('human = { quality = "h" }',
                          "human = { " + ", ".join(f'{a} = "h"' for a in aspects) + " }")
    (folder / "big.toml").write_text(job, encoding="utf-8")
    return folder / "big.toml"


def _throughput(work: Path, calls: int) -> dict[str, Any]:
    job = _shape(work, calls, ("quality",))
    runs: dict[str, list[dict[str, Any]]] = {"bare": [], "judge": []}
    for round_ in range(ROUNDS):
        for side in (("judge", "bare") if round_ % 2 == 0 else ("bare", "judge")):
            with common.server(0.0) as server:
                if side == "bare":
                    argv = [common.PYTHON, str(FLOORS / "bare_loop.py"),
                            server.url + "/chat/completions", str(calls), str(CONCURRENCY)]
                else:
                    argv = [common.JUDGE, "run", str(job), "--base-url", server.url,
                            "--cache-dir", str(work / f"cache-{round_}"),
                            "--out", str(work / f"out-{round_}"), "--yes"]
                runs[side].append(_checked(argv, work) | {"requests": server.stats()["requests"]})
    bare, judge = _best(runs["bare"]), _best(runs["judge"])
    # the median of the rounds' own ratios beside the best of each side: on a shared machine
    # one quiet round can flatter either
    paired = statistics.median(b["seconds"] / j["seconds"]
                               for b, j in zip(runs["bare"], runs["judge"], strict=True))
    return {"calls": calls, "concurrency": CONCURRENCY, "bare_s": bare, "judge_s": judge,
            "judge_over_bare": round(bare / judge, 3),
            "judge_over_bare_median": round(paired, 3), "runs": runs}


def _cached(work: Path, items: int) -> dict[str, Any]:
    job = _shape(work, items, ASPECTS)
    tasks = items * len(ASPECTS)
    floor_data = work / "floor.jsonl"  # one line a task, so the floor does per-task work
    _checked([common.PYTHON, str(FLOORS / "big.py"), str(tasks), str(floor_data)], work)
    cache = work / "cache"
    with common.server(0.0) as server:
        _checked([common.JUDGE, "run", str(job), "--base-url", server.url, "--cache-dir",
                  str(cache), "--out", str(work / "filled"), "--yes"], work)
        url = server.url  # part of a bare model's cache identity
    sides = {
        "floor": [common.PYTHON, str(FLOORS / "cached_floor.py"), str(floor_data),
                  str(FLOORS / "stars.txt"), str(cache), str(work / "floor.csv")],
        # the server is gone: a fully cached run makes no call (the dead URL proves it)
        "cached_run": [common.JUDGE, "run", str(job), "--base-url", url,
                       "--cache-dir", str(cache), "--out", str(work / "run"), "--yes"],
        "rescore": [common.JUDGE, "rescore", str(job), "--base-url", url, "--cache-dir", str(cache),
                    "--out", str(work / "rescore")],
    }
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for round_ in range(ROUNDS):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for side in order:
            runs[side].append(_checked(sides[side], work))
    best = {side: _best(r) for side, r in runs.items()}
    return {"tasks": tasks, "seconds": best,
            "run_over_floor": round(best["cached_run"] / best["floor"], 3),
            "rescore_over_floor": round(best["rescore"] / best["floor"], 3),
            "max_rss_mib": {side: max(r["max_rss_mib"] for r in rs) for side, rs in runs.items()},
            "runs": runs}


def _best(runs: list[dict[str, Any]]) -> float:
    return float(min(r["seconds"] for r in runs))


def _checked(argv: list[str], cwd: Path) -> dict[str, Any]:
    child = common.run_child(argv, cwd=cwd, timeout_s=TIMEOUT_S)
    if child.exit_code != 0:
        raise RuntimeError(f"{Path(argv[1]).name} exited {child.exit_code}: {child.stderr[-2000:]}")
    return child.figures()
