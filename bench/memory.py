"""Benchmark 5: peak RSS of `judge plan` over a 1,000,000-task job (a subprocess, wait4 rusage).

Two shapes of synthetic user JSONL (each line ~580 bytes: a ~300-character source, a
~120-character output, ids and human scores): 250k items x 4 aspects (the target) and, in the
full run, 100k items x 2 prompts x 5 aspects. MB here is 10^6 bytes; MiB is also recorded.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from bench import common

TARGET_MB = 400.0
SHAPES = {  # name: (items, prompts, aspects)
    "250k_items_x_4_aspects": (250_000, 1, ("coherence", "consistency", "fluency", "relevance")),
    "100k_items_x_2_prompts_x_5_aspects": (100_000, 2, ("coherence", "consistency", "fluency",
                                                         "relevance", "overall")),
}


def _plan(work: Path, name: str, scale: float) -> dict[str, Any]:
    items, prompts, aspects = SHAPES[name]
    items = int(items * scale)
    folder = work / name
    started = time.perf_counter()
    job = common.write_job(folder, items, aspects=aspects, prompts=prompts,
                           base_url="http://127.0.0.1:9/v1")
    write_s = time.perf_counter() - started
    child = common.run_child([common.JUDGE, "plan", str(job), "--cache-dir", str(folder / "cache")],
                             cwd=folder, timeout_s=400)
    tasks = sum(int(n) for n in re.findall(r"(\d+) tasks", child.stdout))
    peak_mb = child.max_rss_mib * 2**20 / 1e6
    return {"items": items, "tasks": tasks, "dataset_mb": round(
                (folder / "synth.jsonl").stat().st_size / 1e6, 1),
            "write_dataset_s": round(write_s, 1), **child.figures(),
            "max_rss_mb": round(peak_mb, 1),
            "tasks_per_s": round(tasks / child.seconds) if child.seconds else None,
            "pass": child.exit_code == 0 and peak_mb < TARGET_MB,
            "stdout": child.stdout.strip().splitlines()[-3:]}


def plan_memory(work: Path, quick: bool) -> dict[str, Any]:
    """Benchmark 5."""
    names = list(SHAPES)[:1] if quick else list(SHAPES)
    scale = 0.2 if quick else 1.0
    shapes = {name: _plan(work, name, scale) for name in names}
    main = shapes[names[0]]
    return {"setup": {"scale": scale, "shapes": {n: SHAPES[n][:2] + (len(SHAPES[n][2]),)
                                                 for n in names}},
            "target": f"judge plan peak RSS < {TARGET_MB:g} MB (10^6 bytes) at 1,000,000 tasks",
            "max_rss_mb": main["max_rss_mb"],
            "pass": None if quick else all(s["pass"] for s in shapes.values()),
            "shapes": shapes,
            "command": "judge plan JOB --cache-dir CACHE"}
