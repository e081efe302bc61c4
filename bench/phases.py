"""Where a whole `judge run`'s time goes, phase by phase, against the bare loop floor.

    .venv/bin/python -m bench.phases --calls 40000 --rounds 4 [--base /tmp/old-tree]

Each round runs, each a fresh process on a fresh fake server (bench/server.py) and, for judge, a
fresh cache: `bare_loop.py` (../shared/floors) and `judge run` of the floors' job, this tree's
code and, with --base, another tree's (its PYTHONPATH), in alternating order. `judge run` runs
under `python bench/phases.py wrap`, which times runner functions from outside (wrapped at
import, nothing in runner/ changes) and writes each boundary's wall time and the main process's
own CPU (`time.process_time`); the server's clock gives the first and last request. Prints the
median of each phase (wall / main CPU, seconds) and the per-round ratios bare / judge. A
function a later version renamed is left out (its phase shows "-"). Diagnostic: the whole
process figures are `bench/run.py --only floors`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import builtins
import functools
import json
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and sys.argv[1:2] != ["wrap"]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (label, from boundary, to boundary); "start" is the process's start, "first" and "last" the
# server's first and last request, "end" the process's exit
PHASES = [("interpreter and imports", "start", "imports"),
          ("select: job, items, expansion", "resolve >", "resolve <"),
          ("checks, lease, set-up, pool imports", "resolve <", "execute >"),
          ("pool start to the first request", "execute >", "first"),
          ("BEFORE THE FIRST REQUEST", "start", "first"),
          ("the calls, first to last request", "first", "last"),
          ("main CPU in the pool", "execute >", "execute <"),
          ("read back, judge, judgments.jsonl", "execute <", "report.collect <"),
          ("other reports, the report child", "report.collect <", "ForkedResult.result <"),
          ("the last reports, the summary", "ForkedResult.result <", "atexit"),
          ("interpreter exit", "atexit", "end"),
          ("AFTER THE LAST REQUEST", "last", "end"),
          ("WHOLE PROCESS", "start", "end")]


def _wrap(out_path: str, argv: list[str]) -> None:
    """Run `judge ARGV` in this process with its phase boundaries stamped into `out_path`."""
    out, main_pid = open(out_path, "w", buffering=1), os.getpid()  # noqa: SIM115

    def mark(name: str) -> None:
        if os.getpid() == main_pid:  # a forked child's stamps are not the main process's
            out.write(json.dumps([name, time.time(), time.process_time()]) + "\n")

    def timed(owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr, None)
        if fn is None:
            return
        if asyncio.iscoroutinefunction(fn):
            async def wrapped_async(*a: Any, **k: Any) -> Any:
                mark(label + " >")
                try:
                    return await fn(*a, **k)
                finally:
                    mark(label + " <")
            setattr(owner, attr, functools.wraps(fn)(wrapped_async))
            return

        def wrapped(*a: Any, **k: Any) -> Any:
            mark(label + " >")
            try:
                return fn(*a, **k)
            finally:
                mark(label + " <")
        setattr(owner, attr, functools.wraps(fn)(wrapped))

    import runner.cli.main as cli_main
    mark("imports")
    import runner.cli.runcmd as runcmd
    timed(runcmd, "resolve", "resolve")
    lazy = {"runner.execute.pool": [("execute", "execute")],
            "runner.report.write": [("collect", "report.collect")]}
    real_import = builtins.__import__

    def hooked(name: str, *args: Any, **kwargs: Any) -> Any:
        module = real_import(name, *args, **kwargs)
        for attr, label in lazy.pop(name, []):
            target = sys.modules[name]
            timed(target, attr, label)
            if name == "runner.report.write":
                timed(target.ForkedResult, "result", "ForkedResult.result")
        return module

    builtins.__import__ = hooked
    atexit.register(mark, "atexit")
    sys.argv = ["judge", *argv]
    cli_main.main()


def _round(argv: list[str], env: dict[str, str], cwd: Path, stamps: Path | None
           ) -> dict[str, Any]:
    from bench import common
    with common.server(0.0) as server:
        args = [a.replace("URL", server.url) for a in argv]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.time()
        child = _with_env(env, lambda: common.run_child(args, cwd=cwd, timeout_s=600))
        ended = time.time()
        stats = server.stats()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if child.exit_code != 0:
        raise RuntimeError(f"{args[:3]} exited {child.exit_code}: {child.stderr[-2000:]}")
    at = {"start": (started, 0.0), "first": (stats["first_request_at"], None),
          "last": (stats["last_request_at"], None), "end": (ended, None)}
    if stamps is not None:
        for line in stamps.read_text().splitlines():
            name, wall, cpu = json.loads(line)
            at.setdefault(name, (wall, cpu))
    return {"seconds": ended - started, "at": at,
            "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime}


def _with_env(env: dict[str, str], work: Any) -> Any:
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return work()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _phase(run: dict[str, Any], start: str, end: str) -> tuple[float | None, float | None]:
    at = run["at"]
    if start not in at or end not in at:
        return None, None
    (w0, c0), (w1, c1) = at[start], at[end]
    return w1 - w0, (None if c0 is None or c1 is None else c1 - c0)


def _median(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    return f"{statistics.median(got):.3f}" if got and len(got) == len(values) else "-"


def main() -> None:
    from bench import common, floors
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=40_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--base", type=Path, help="another tree's runner/ to time beside")
    parser.add_argument("--work", type=Path, default=Path("/tmp/judge-bench-phases"))
    args = parser.parse_args()
    common.compile_runner()
    job = floors._shape(args.work / "job", args.calls, ("quality",))
    sides: dict[str, tuple[list[str], dict[str, str]]] = {
        "bare": ([common.PYTHON, str(floors.FLOORS / "bare_loop.py"), "URL/chat/completions",
                  str(args.calls), str(floors.CONCURRENCY)], {})}
    stamps = args.work / "stamps.jsonl"
    for name, tree in (("judge", common.ROOT), ("base", args.base)):
        if tree is not None:
            sides[name] = ([common.PYTHON, str(Path(__file__).resolve()), "wrap", str(stamps),
                            "run", str(job), "--base-url", "URL", "--cache-dir",
                            str(args.work / "cache"), "--out", str(args.work / "out"),
                            "--yes"], {"PYTHONPATH": str(tree)})
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    load = [common.load_avg()]
    for round_ in range(args.rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name in order:
            for leftover in (args.work / "cache", args.work / "out"):  # a fresh cache each
                shutil.rmtree(leftover, ignore_errors=True)
            argv, env = sides[name]
            runs[name].append(_round(argv, env, job.parent, None if name == "bare" else stamps))
    load.append(common.load_avg())
    print(f"load average before / after: {load}")
    print("| phase | " + " | ".join(f"{n}: wall / main CPU" for n in sides) + " |")
    for label, start, end in PHASES:
        cells = []
        for name in sides:
            walls, cpus = zip(*(_phase(r, start, end) for r in runs[name]), strict=True)
            cells.append(f"{_median(list(walls))} / {_median(list(cpus))}")
        print(f"| {label} | " + " | ".join(cells) + " |")
    for name in sides:
        if name != "bare":
            ratios = [b["seconds"] / j["seconds"] for b, j in zip(runs["bare"], runs[name],
                                                                     strict=True)]
            print(f"bare / {name} per round: {[round(r, 2) for r in ratios]}, median "
                  f"{statistics.median(ratios):.3f}; CPU (process and children) median "
                  f"{statistics.median(r['cpu'] for r in runs[name]):.2f} s")


if __name__ == "__main__":
    if sys.argv[1:2] == ["wrap"]:
        _wrap(sys.argv[2], sys.argv[3:])
    else:
        main()
