"""Run the judge-runner benchmarks and write their figures to a JSON file.

    .venv/bin/python bench/run.py --out bench/results.json          # all, ~17-19 min
    .venv/bin/python bench/run.py --quick                           # smaller, no 60 s rate test
    .venv/bin/python bench/run.py --only throughput --only cached   # a selection

Every fake server runs in its own process on 127.0.0.1; every loop is bounded in count and time.
See bench/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson  # noqa: E402

import bench.pgcache as pgcache  # noqa: E402
import bench.tenm as tenm  # noqa: E402
from bench import batch, cached, common, fleet, local, memory, page, ratelimit, report, throughput  # noqa: E402
from bench import billing as billing_bench  # noqa: E402
from bench import floors as floors_bench  # noqa: E402
from bench import peers as peers_bench  # noqa: E402
from bench import process as process_bench  # noqa: E402
from bench import reliability as reliability_bench  # noqa: E402
from bench import shards as shards_bench  # noqa: E402

# The same collector thresholds as `judge` itself (runner.cli.main.main), for every loop measured
# in this process, the bare ones included.
gc.set_threshold(100_000, 50, 100)

DATA_DIR = Path(os.environ.get("JUDGE_DATA_DIR")
                or Path(__file__).resolve().parents[2] / "shared" / "datasets")

Bench = Callable[[Path, bool], dict[str, Any]]
BENCHMARKS: dict[str, Bench] = {
    "throughput": throughput.zero_latency,
    "latency": throughput.high_latency,
    "process": process_bench.whole_process,
    "floors": floors_bench.floors,
    "cached": cached.cached_rerun,
    "ratelimit": ratelimit.rate_limit,
    "plan_memory": memory.plan_memory,
    "run_memory": memory.run_memory,
    "local": lambda work, quick: local.local_judge(work, quick, DATA_DIR),
    "pgcache": pgcache.pg_cache,
    "batch": batch.batch_job,
    "reliability": reliability_bench.reliability,
    "report": report.report_page,
    "page": page.report_page_10m,
    "fleet": fleet.fleet_throughput,
    "peers": peers_bench.peer_comparison,
    "shards": shards_bench.shard_share,
    "tenm": tenm.ten_million,
    "billing": billing_bench.prompt_caching,
}
# What the table shows for each: (label, key in the result, format[, the row's own goal])
HEADLINES: dict[str, list[tuple[str, ...]]] = {
    "throughput": [("runner / bare aiohttp, 64 in flight", "runner_over_bare", "{:.2f}x"),
                   ("runner + in-memory cache / bare", "runner_memorycache_over_bare",
                    "{:.2f}x"),
                   ("openai SDK (default) / bare", "openai_default_over_bare", "{:.2f}x"),
                   ("openai SDK (aiohttp) / bare", "openai_aiohttp_over_bare", "{:.2f}x")],
    "latency": [("runner req/s, 256 in flight, 200 ms", "runner_rate", "{:.0f}/s"),
                ("bare aiohttp req/s, same", "bare_rate", "{:.0f}/s")],
    "process": [("judge run / bare aiohttp, whole processes", "judge_over_bare", "{:.2f}x"),
                ("same, the calls alone", "judge_over_bare_calls", "{:.2f}x")],
    "floors": [("floor: bare aiohttp loop / judge run, 40k calls", "judge_over_bare", "{:.2f}x",
                ">= 0.8x"),
               ("same, median of the rounds", "judge_over_bare_median", "{:.2f}x", ">= 0.8x"),
               ("judge run, 100k cached / the cached floor", "run_over_floor", "{:.2f}x",
                "<= 1.5x"),
               ("judge rescore, 100k / the cached floor", "rescore_over_floor", "{:.2f}x",
                "<= 1.5x")],
    "cached": [("judge run, 100k tasks all cached", "run_seconds", "{:.1f} s"),
               ("judge rescore rate", "rescore_tasks_per_s", "{:.0f} tasks/s")],
    "ratelimit": [("429s received at 600 rpm", "received_429", "{}"),
                  ("accepted in first 60 s window", "achieved_per_min", "{}/min"),
                  ("steady rate", "steady_rate_per_min", "{}/min")],
    "plan_memory": [("judge plan peak RSS, 1M tasks", "max_rss_mb", "{:.0f} MB"),
                    ("judge plan peak RSS, 10M tasks", "max_rss_mb_10m", "{:.0f} MB"),
                    ("judge plan, 10M tasks: wall time", "seconds_10m", "{:.0f} s")],
    "run_memory": [("cached judge run peak RSS (largest size)", "max_rss_mb", "{:.0f} MB"),
                   ("at tasks", "tasks", "{}"),
                   ("peak growth per task", "growth_bytes_per_task", "{} B"),
                   ("linear projection to 10M tasks", "projected_10m_mb", "{} MB")],
    "batch": [("write + upload + submit (100k; 10k --quick)", "submit_s", "{} s"),
              ("ingest the answers into the cache", "ingest_s", "{} s"),
              ("peak RSS", "max_rss_mb", "{} MB")],
    "reliability": [("reliability_rows over the cached job", "reliability_rows_s", "{:.2f} s"),
                    ("collect, without the watcher", "collect_s", "{:.2f} s"),
                    ("collect, with the watcher", "collect_with_watcher_s", "{:.2f} s"),
                    ("1,000 permutations, all pooled", "permutation_1000_s", "{:.2f} s")],
    "local": [("local:smollm2 calls/s, prompt cache off", "calls_per_s_cache_off", "{}"),
              ("local:smollm2 calls/s, prompt cache on", "calls_per_s_cache_on", "{}")],
    "pgcache": [("PostgreSQL / diskcache, batched lookups (worst)", "pg_over_disk_worst",
                 "{:.2f}x"),
                ("4 shards on one PostgreSQL, 0-latency fake", "shard_tasks_per_s",
                 "{} tasks/s")],
    "report": [("report.html for 100k judgments: added time", "html_seconds", "{:.2f} s"),
               ("report.html size", "page_mb", "{:.2f} MB"),
               ("report.html drawn in chromium", "browser_load_seconds", "{:.2f} s")],
    "page": [("report.html of a 10M-judgment study: size", "html_mb", "{:.2f} MB"),
             ("drawn in chromium (best of 3 tabs)", "drawn_s", "{:.2f} s"),
             ("page_data over 100 series of 100k rows", "page_data_s", "{:.2f} s"),
             ("page_data peak allocation", "page_data_peak_mb", "{:.0f} MB"),
             ("ItemRows.add, per judgment", "item_rows_add_us", "{} us")],
    "fleet": [("8 endpoints, 200 ms: answers/s over ideal", "over_ideal", "{:.2f}"),
              ("answers/s", "rate", "{:.0f}/s"),
              ("runner / bare aiohttp loop, same servers", "runner_over_bare", "{:.2f}x"),
              ("busiest replica's share / even share", "max_share_over_even", "{:.2f}")],
    "shards": [("judge run --shard I/8, 40k cached tasks: CPU (median shard)", "shard_cpu_s",
                "{:.2f} s"),
               ("same: peak RSS (median shard)", "shard_rss_mib", "{:.0f} MB"),
               ("judge run, the whole job in 1 process: CPU", "one_process_cpu_s", "{:.2f} s"),
               ("shard CPU, split by cache key / by group", "before_over_after_shard_cpu",
                "{:.2f}x")],
    "peers": [("judge-runner / cookbook pattern, 0 ms, 64", "cookbook_0ms", "{:.2f}x"),
              ("judge-runner / inspect_ai, 0 ms, 64", "inspect_ai_0ms", "{:.2f}x"),
              ("judge-runner / cookbook pattern, 200 ms, 256", "cookbook_200ms", "{:.2f}x"),
              ("judge-runner / inspect_ai, 200 ms, 256", "inspect_ai_200ms", "{:.2f}x"),
              ("judge run / cookbook process, 0 ms", "cookbook_0ms_process", "{:.2f}x"),
              ("judge run / inspect process, 0 ms", "inspect_ai_0ms_process", "{:.2f}x"),
              ("judge run / cookbook process, 200 ms", "cookbook_200ms_process", "{:.2f}x"),
              ("judge run / inspect process, 200 ms", "inspect_ai_200ms_process", "{:.2f}x"),
              ("diagnostic: / cookbook pattern without its 1 ms pause, 0 ms",
               "cookbook_nosleep_0ms", "{:.2f}x"),
              ("diagnostic: / the same, 200 ms", "cookbook_nosleep_200ms", "{:.2f}x"),
              ("judge-runner answers/s, 0 ms", "runner_rate_0ms", "{}/s"),
              ("judge-runner answers/s, 200 ms", "runner_rate_200ms", "{}/s")],
    "tenm": [("tasks (10M; 100k with --quick)", "tasks", "{}"),
             ("judge rescore, folder: peak RSS", "rescore_folder_max_rss_mb", "{:.0f} MB"),
             ("judge rescore, folder: rate", "rescore_folder_tasks_per_s", "{} tasks/s"),
             ("cached judge run, folder: peak RSS", "run_folder_max_rss_mb", "{:.0f} MB"),
             ("cached judge run, folder: rate", "run_folder_tasks_per_s", "{} tasks/s"),
             ("judge rescore, PostgreSQL: peak RSS", "rescore_pg_max_rss_mb", "{:.0f} MB"),
             ("judge rescore, PostgreSQL: rate", "rescore_pg_tasks_per_s", "{} tasks/s"),
             ("cached judge run, PostgreSQL: peak RSS", "run_pg_max_rss_mb", "{:.0f} MB"),
             ("cached judge run, PostgreSQL: rate", "run_pg_tasks_per_s", "{} tasks/s"),
             ("judge plan: peak RSS", "plan_max_rss_mb", "{:.0f} MB")],
    "billing": [("G-Eval, prompt caching: input cost / cookbook's",
                 "geval_cached_input_over_cookbook", "{:.2f}x"),
                ("Lai et al., prompt caching: input cost / cookbook's",
                 "lai_cached_input_over_cookbook", "{:.2f}x"),
                ("G-Eval, gpt-4.1 online: input cost / its cookbook's",
                 "geval_openai_input_over_cookbook", "{:.2f}x"),
                ("Lai et al., gpt-4.1 online: input cost / its cookbook's",
                 "lai_openai_input_over_cookbook", "{:.2f}x"),
                ("G-Eval, --until-ci 0.1: calls / online's",
                 "geval_until_ci_calls_over_online", "{:.2f}x"),
                ("Lai et al., --until-ci 0.1: calls / online's",
                 "lai_until_ci_calls_over_online", "{:.2f}x"),
                ("G-Eval, --until-ci 0.2: calls / online's",
                 "geval_until_ci_wide_calls_over_online", "{:.2f}x"),
                ("Lai et al., --until-ci 0.2: calls / online's",
                 "lai_until_ci_wide_calls_over_online", "{:.2f}x")],
}


def _run_one(name: str, quick: bool) -> dict[str, Any]:
    started, load = time.perf_counter(), common.load_avg()
    try:
        with tempfile.TemporaryDirectory(prefix=f"judge-bench-{name}-") as work:
            result = BENCHMARKS[name](Path(work), quick)
    except Exception as exc:  # one broken benchmark must not hide the others' figures
        traceback.print_exc()
        result = {"error": f"{type(exc).__name__}: {exc}", "pass": False}
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    result["load_avg_before_after"] = [load, common.load_avg()]
    return result


def _verdict(result: dict[str, Any]) -> str:
    if "error" in result:
        return "ERROR"
    return {True: "PASS", False: "FAIL", None: "n/a"}[result.get("pass")]


def _table(results: dict[str, dict[str, Any]]) -> str:
    rows = [("benchmark", "figure", "value", "target", "result")]
    for name, result in results.items():
        for i, (label, key, fmt, *goal) in enumerate(HEADLINES[name]):
            value = result.get(key)
            shown = "-" if value is None else fmt.format(value)
            first = i == 0
            target = goal[0] if goal else str(result.get("target", "")) if first else ""
            rows.append((name if first else "", label, shown, target,
                         _verdict(result) if first else ""))
    widths = [max(len(r[c]) for r in rows) for c in range(5)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
                     .rstrip() for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller runs (~1-2 min); skips the 60 s rate-limit test; "
                             "targets are not judged on scaled-down jobs")
    parser.add_argument("--only", action="append", choices=list(BENCHMARKS),
                        help="run only this benchmark (repeatable)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other benchmarks already in --out, replacing only these "
                             "(each benchmark's figures carry the time they were measured), "
                             "e.g. --only peers --out bench/results.json --merge")
    args = parser.parse_args()
    if args.merge and not args.out:
        parser.error("--merge needs --out (the figures file to merge into)")
    names = args.only or [n for n in BENCHMARKS if not (args.quick and n == "ratelimit")]
    started = time.time()
    common.compile_runner()
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        measured = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        results[name] = {**_run_one(name, args.quick), "measured": measured}
        print(f"[bench] {name}: {_verdict(results[name])} in {results[name]['elapsed_s']} s",
              file=sys.stderr, flush=True)
    document = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                "elapsed_s": round(time.time() - started, 1), "quick": args.quick,
                "machine": common.machine(), "benchmarks": results}
    print(_table(results))
    if args.out:
        if args.merge and args.out.exists():
            document = _merged(orjson.loads(args.out.read_bytes()), document)
        args.out.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
        print(f"figures: {args.out}")


def _merged(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`old`'s benchmarks with `new`'s replacing theirs; an old benchmark without its own
    "measured" time gets its file's timestamp, so every figure still says when it was made."""
    benchmarks = {name: {**result, "measured": result.get("measured", old.get("timestamp"))}
                  for name, result in old.get("benchmarks", {}).items()}
    benchmarks.update(new["benchmarks"])
    return {**new, "timestamp": old.get("timestamp", new["timestamp"]),
            "updated": new["timestamp"], "benchmarks": benchmarks}


if __name__ == "__main__":
    main()
