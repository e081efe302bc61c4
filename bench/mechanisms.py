"""What a mechanism buys, as whole `judge` processes: alternated rounds of the same command
with and without it (each variant is an environment, e.g. JUDGE_PROCESSES=1), the load
average beside every round.

    python -m bench.mechanisms run --tasks 40000 --rounds 3 \
        --variant default --variant one-process:JUDGE_PROCESSES=1
    python -m bench.mechanisms rescore --tasks 100000 --rounds 3 --variant default ...

`run`: a `judge run` of TASKS zero-latency calls against one fake server process
(bench/server.py), each round on a fresh cache folder, so every task is called. `rescore`: a
`judge rescore` of TASKS tasks, all cached (bench/cached.py's prefill, once), after one warm-up
rescore. Variants run in rotating order each round (A B, B A, ...); the figure of a variant is
the median of its rounds, and of a pair the median of the per-round ratios. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench import common
from bench.cached import ASPECTS, prefill


def _variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    env = dict(pair.split("=", 1) for pair in rest.split(",") if pair)
    return name, env


def _judge(args: list[str], env: dict[str, str], cwd: Path) -> common.Child:
    import os
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return common.run_child([common.JUDGE, *args], cwd=cwd, timeout_s=1800)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=("run", "rescore"))
    parser.add_argument("--tasks", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", action="append", required=True,
                        help="NAME or NAME:VAR=VALUE,VAR=VALUE")
    parser.add_argument("--work", type=Path)
    args = parser.parse_args()
    common.compile_runner()
    variants = [_variant(v) for v in args.variant]
    work = args.work or Path(tempfile.mkdtemp(prefix="mechanisms-"))
    items = args.tasks // len(ASPECTS)
    rounds: list[dict[str, Any]] = []
    if args.command == "rescore":
        job, cache = work / "job" / "job.toml", work / "cache"
        if not cache.exists():  # a new job: its dead port is part of every key
            dead = f"http://127.0.0.1:{common.free_port()}/v1"
            job = common.write_job(work / "job", items, aspects=ASPECTS, base_url=dead)
            prefill(job, cache)
        warm = _judge(["rescore", str(job), "--cache-dir", str(cache), "--out",
                       str(work / "out")], {}, work)
        assert warm.exit_code == 0, warm.stderr[-2000:]
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for name, env in order:
                child = _judge(["rescore", str(job), "--cache-dir", str(cache), "--out",
                                str(work / "out")], env, work)
                assert child.exit_code == 0, child.stderr[-2000:]
                rounds.append({"round": r, "variant": name, **child.figures(),
                               "load_avg": common.load_avg()})
                print(json.dumps(rounds[-1]), flush=True)
    else:
        with common.server(latency=0.0) as server:
            job = common.write_job(work / "job", items, aspects=ASPECTS, base_url=server.url)
            for r in range(args.rounds):
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                for name, env in order:
                    cache = work / f"cache-{name}"
                    shutil.rmtree(cache, ignore_errors=True)
                    child = _judge(["run", str(job), "--cache-dir", str(cache), "--out",
                                    str(work / "out"), "--yes"], env, work)
                    assert child.exit_code == 0, child.stderr[-2000:]
                    rounds.append({"round": r, "variant": name, **child.figures(),
                                   "load_avg": common.load_avg()})
                    print(json.dumps(rounds[-1]), flush=True)
    base = variants[0][0]
    summary: dict[str, Any] = {"command": args.command, "tasks": items * len(ASPECTS),
                               "seconds": {}, "ratio_over_" + base: {}}
    for name, _ in variants:
        mine = [x["seconds"] for x in rounds if x["variant"] == name]
        summary["seconds"][name] = statistics.median(mine)
        ratios = [x["seconds"] / y["seconds"] for x in rounds for y in rounds
                  if x["variant"] == name and y["variant"] == base and x["round"] == y["round"]]
        summary["ratio_over_" + base][name] = [round(statistics.median(ratios), 3),
                                               [round(q, 3) for q in ratios]]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
