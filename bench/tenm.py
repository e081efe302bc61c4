"""Benchmark: ten million judgments (issue 26), whole `judge` processes on a fake-filled cache.

The issue's study shape: items x 5 prompts x 4 aspects x 5 judge models (100 tasks an item; 1k,
10k or 100k items: 100k, 1M, 10M tasks), every model at a closed port so that a cache miss
fails. The cache (a folder, and PostgreSQL in a private cluster) is filled once, under the keys
runner.expand computes, with compact records (the human score moved by a judge's noise), and
kept in --work between runs. Then `judge rescore`, a fully cached `judge run` (alternating
folder and PostgreSQL, and this tree and --compare-tree's) and `judge plan`, each a subprocess
(bench.common.run_child: its wall time, CPU, peak RSS) under a time and an RSS cap; with
--compare-tree, the two trees' report sets compared file by file. See bench/README.md, "Ten
million judgments".

    python -m bench.tenm --size 100k --size 1m --out /tmp/tenm.json     # folder + PostgreSQL
    python -m bench.tenm --size 10m --backend folder --out /tmp/tenm.json --merge
    python -m bench.tenm --quick --compare-tree /tmp/old                 # byte-identical reports?
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import filecmp
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import common  # noqa: E402

ASPECTS = ("coherence", "consistency", "fluency", "relevance")
PROMPTS = 5
JUDGES = 5
TASKS_PER_ITEM = PROMPTS * len(ASPECTS) * JUDGES  # 100
SIZES = {"100k": 1_000, "1m": 10_000, "10m": 100_000}  # name: items
DEAD = "http://127.0.0.1:9/v1"  # part of every key: fixed, and nothing may listen there
TIME_CAP_S = 1800.0
RSS_CAP_MB = 16_000.0  # 10^6 bytes: a command past this is stopped (the machine has 24 GiB)
TARGET_MB, TARGET_RATE, PLAN_TARGET_MB = 1000.0, 50_000.0, 300.0  # issue 26 at 10M tasks
ANSWERED_AT = 1_764_000_000.0  # the records' "time"
REPORTED = ("judgments.jsonl", "scores.csv", "scores.parquet")
NOT_COMPARED = frozenset({"manifest.json", "report.html"})
# Per (judge + prompt) mod 5: P(answer - human) for -2..+2, sharp to loose.
_SPREADS = ((2, 10, 76, 10, 2), (3, 15, 64, 15, 3), (5, 20, 50, 20, 5), (8, 22, 40, 22, 8),
            (12, 23, 30, 23, 12))
_CUTS = [list(itertools.accumulate(p * 2**32 // 100 for p in spread))[:-1]
         for spread in _SPREADS]
_REASONS = ("clear and faithful to the source", "misses one key point", "some repetition",
            "reads well but vague", "adds a detail not in the article", "concise and accurate")


def write_study(folder: Path, items: int) -> Path:
    """The study's data set, 5 templates and job file in `folder`; returns the job's path."""
    folder.mkdir(parents=True, exist_ok=True)
    common.write_dataset(folder / "synth.jsonl", items, aspects=ASPECTS)
    lines = ['name = "tenm"', "", "[[datasets]]", 'name = "synth"', 'path = "synth.jsonl"',
             'fields = { id = "id", group = "group", system = "system", text = { source = '
             '"source", output = "output" }, human = { '
             + ", ".join(f'{a} = "{a}"' for a in ASPECTS) + " } }"]
    for p in range(PROMPTS):
        intro = f"Reviewer brief {p}: read the article, then judge the summary's {{{{aspect}}}}."
        (folder / f"p{p}.txt").write_text(intro + "\n" + common.TEMPLATE.split("\n", 1)[1],
                                          encoding="utf-8")
        lines += ["", "[[prompts]]", f'name = "p{p}"', f'template = "p{p}.txt"',
                  f'parser = "{"number" if p % 2 else "stars"}"', f"aspects = {list(ASPECTS)!r}"
                  .replace("'", '"'), f"params = {{ temperature = 0, max_tokens = {16 + p} }}"]
    for j in range(JUDGES):
        lines += ["", f"[models.j{j}]", f'spec = "fake-judge-{j}"', f'base_url = "{DEAD}"']
    job = folder / "job.toml"
    job.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return job


def answer(key: str, human: float, prompt: int, judge: int) -> str:
    """The fake judge's answer: the human score moved by this judge's noise (from the key)."""
    bits = int(key[:12], 16)
    delta = bisect.bisect(_CUTS[(judge + prompt) % len(_CUTS)], bits >> 16) - 2
    score = min(5, max(1, round(human) + delta))
    if prompt % 2:  # the number parser
        return str(score)
    return f"{score} stars: {_REASONS[bits % len(_REASONS)]}."


def records(job: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(key, record) for every task of the job, in task order."""
    from runner.job.load import load_job
    from runner.prepare import prepare
    expansion = prepare(load_job(job), job.parent, stream=True)
    humans = {it.item_id: it.human for it in expansion.items["synth"]}  # ~0.4 KB an item
    for task in expansion.tasks():
        human = humans[task.item_id][task.aspect]
        text = answer(task.key, human, int(task.prompt[1:]), int(task.model[1:]))
        yield task.key, {
            "response": {"choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": text}}]},
            "usage": {"prompt_tokens": task.prompt_tokens, "completion_tokens": len(text) // 4},
            "source": "api", "time": ANSWERED_AT}


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def fill(job: Path, location: str | Path, marker: Path) -> dict[str, Any]:
    """Store every task's record in the cache at `location` (a folder or a PostgreSQL URL) unless
    `marker` says an earlier fill completed (and the job's first key is there); returns what the
    fill took (the earlier one's figures when reused)."""
    from runner.execute.store.backend import is_url, open_cache
    if marker.exists():
        done: dict[str, Any] = json.loads(marker.read_text())
        with open_cache(location) as cache:
            if next(records(job))[0] in cache:
                return {**done, "reused": True}
    if not is_url(location):
        shutil.rmtree(location, ignore_errors=True)  # a fill cut short: start again
    started, load = time.perf_counter(), common.load_avg()
    with open_cache(location) as cache:
        stored = cache.put_many(records(job))
        seconds = time.perf_counter() - started
        stats = cache.stats()
    size = stats["bytes"] if is_url(location) else _folder_bytes(Path(location))
    done = {"records": stored, "entries": stats["entries"], "prefill_s": round(seconds, 1),
            "records_per_s": round(stored / seconds), "disk_mb": round(size / 1e6, 1),
            "disk_bytes_per_record": round(size / max(stored, 1)),
            "load_avg_before_after": [load, common.load_avg()],
            "filled": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    marker.write_text(json.dumps(done, indent=1))
    return {**done, "reused": False}


class _Watch(threading.Thread):
    """Samples the RSS of the measured command's processes (every descendant of this process
    below the run_child launcher) twice a second; kills them (by pid) once one passes the RSS
    cap or the time cap, so the launcher still reports the command's figures."""

    def __init__(self, time_cap_s: float, rss_cap_mb: float) -> None:
        super().__init__(daemon=True)
        self.caps = (time_cap_s, rss_cap_mb)
        self.killed: str | None = None
        self.tree_peak_mb = 0.0  # the sum over the command's processes, at its sampled peak
        self.done = threading.Event()

    def run(self) -> None:
        started, page = time.monotonic(), os.sysconf("SC_PAGE_SIZE")
        while not self.done.wait(0.5):
            pids = _descendants(os.getpid(), depth=2)
            rss = [_rss_pages(pid) * page / 1e6 for pid in pids]
            self.tree_peak_mb = max(self.tree_peak_mb, sum(rss))
            age = time.monotonic() - started
            if age > self.caps[0] or max(rss, default=0) > self.caps[1]:
                self.killed = (f"over the time cap ({self.caps[0]:.0f} s)" if age > self.caps[0]
                               else f"over the RSS cap ({self.caps[1]:.0f} MB) at {age:.0f} s")
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                return


def _descendants(root: int, depth: int) -> list[int]:
    """The pids at least `depth` generations below `root`."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, level = [], [root]
    for generation in itertools.count(1):
        level = [c for pid in level for c in children.get(pid, [])]
        if not level:
            return found
        if generation >= depth:
            found += level


def _rss_pages(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def measure(args: list[str], tree: Path, cwd: Path, tasks: int, *, time_cap_s: float = TIME_CAP_S,
            rss_cap_mb: float = RSS_CAP_MB, machine: Path | None = None) -> dict[str, Any]:
    """One `judge ARGS` process with PYTHONPATH=tree: its figures, the load average beside them.
    `machine`: its XDG_CACHE_HOME, where a read from PostgreSQL keeps its located key index
    (runner.execute.store.pgcache.PgCache.index_folder)."""
    cwd.mkdir(parents=True, exist_ok=True)
    load, watch = common.load_avg(), _Watch(time_cap_s, rss_cap_mb)
    watch.start()
    try:
        home = [f"XDG_CACHE_HOME={machine}"] if machine else []
        child = common.run_child(["env", f"PYTHONPATH={tree}", *home, common.JUDGE, *args],
                                 cwd=cwd, timeout_s=time_cap_s + 120)
    finally:
        watch.done.set()
        watch.join()
    peak_mb = child.max_rss_mib * 2**20 / 1e6
    return {**child.figures(), "max_rss_mb": round(peak_mb, 1),
            "bytes_per_task": round(peak_mb * 1e6 / tasks),
            "tree_rss_peak_mb": round(watch.tree_peak_mb, 1),
            "tasks_per_s": round(tasks / child.seconds) if child.exit_code == 0 else None,
            "cpu_s": round(child.user_s + child.sys_s, 1), "killed": watch.killed,
            "load_avg_before_after": [load, common.load_avg()],
            "stderr_tail": child.stderr.strip().splitlines()[-3:]}


def report_sizes(out: Path) -> dict[str, float | None]:
    """MB of the report files a researcher loads, and of the whole folder."""
    files = {f.name: f.stat().st_size for f in out.glob("*") if f.is_file()}  # not history/
    return {**{name: round(files[name] / 1e6, 1) if name in files else None for name in REPORTED},
            "folder": round(sum(files.values()) / 1e6, 1)}


def compare_reports(a: Path, b: Path) -> dict[str, Any]:
    """Two report folders file by file: every CSV and JSONL (manifest.json and report.html are
    not compared: they hold times and paths). Returns the files compared, those that differ,
    each with the first differing line (1-based, both texts cut to 200 characters), and the
    files only one folder has."""
    def listed(folder: Path) -> set[str]:  # history/ holds earlier runs' (hard-linked) copies
        return {f.name for f in folder.glob("*")
                if f.is_file() and f.suffix in (".csv", ".jsonl") and f.name not in NOT_COMPARED}

    left, right = listed(a), listed(b)
    differ = [{"file": name, **_first_difference(a / name, b / name)}
              for name in sorted(left & right)
              if not filecmp.cmp(a / name, b / name, shallow=False)]
    return {"compared": sorted(left & right), "differ": differ,
            "only_in_first": sorted(left - right), "only_in_second": sorted(right - left),
            "identical": not differ and left == right}


def _first_difference(a: Path, b: Path) -> dict[str, Any]:
    with a.open("rb") as fa, b.open("rb") as fb:
        for number, (la, lb) in enumerate(itertools.zip_longest(fa, fb), 1):
            if la != lb:
                return {"line": number, "first": _shown(la), "second": _shown(lb)}
    return {"line": None, "first": None, "second": None}


def _shown(line: bytes | None) -> str | None:
    return None if line is None else line.decode(errors="replace").rstrip("\n")[:200]


def kept_cluster(root: Path) -> Any:
    """tests/pgserver.PgCluster with its data folder in `root`, kept for the next run (initdb
    only the first time): `with kept_cluster(root) as cluster: cluster.url`."""
    from tests.pgserver import PgCluster

    class Kept(PgCluster):
        def _run(self, *args: str) -> None:
            if args[0] != "initdb" or not (self.data / "PG_VERSION").exists():
                super()._run(*args)

        def remove(self) -> None:
            pass

    cluster = Kept()
    shutil.rmtree(cluster.root)  # the temp folder it made
    cluster.root, cluster.data = root, root / "data"
    root.mkdir(parents=True, exist_ok=True)
    return cluster


def _closed(url: str) -> bool:
    host, port = url.split("//")[1].split("/")[0].split(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) != 0


def _command(command: str, job: Path, location: str | Path, out: Path | None) -> list[str]:
    cache = ["--cache", location] if isinstance(location, str) else ["--cache-dir", str(location)]
    tail = ["--yes", "--max-retries", "0"] if command == "run" else []
    return [command, str(job), *cache, *(["--out", str(out)] if out else []), *tail]


def study_job(root: Path, size: str) -> tuple[Path, Path, int]:
    """The work folder of one size under `root`, its job (written the first time) and its
    number of tasks."""
    items = SIZES[size]
    folder = root / f"{items}items_{PROMPTS}p_{len(ASPECTS)}a_{JUDGES}j"
    job = folder / "job" / "job.toml"
    if not job.exists():
        write_study(job.parent, items)
    return folder, job, items * TASKS_PER_ITEM


def study(root: Path, size: str, *, backends: tuple[str, ...], trees: dict[str, Path],
          rounds: int, keep: bool = False,
          commands: tuple[str, ...] = ("rescore", "run")) -> dict[str, Any]:
    """Fill (or reuse) the caches of one size, then measure `rounds` rounds of rescore and run
    on each backend and tree, alternating, then plan once per tree; then the comparisons. The
    figures so far are in WORK/SHAPE/progress.json after each command."""
    folder, job, tasks = study_job(root, size)
    items = SIZES[size]
    if not _closed(DEAD):
        raise RuntimeError(f"something listens on {DEAD}: a cache miss would be answered")
    runs_dir = folder / "runs"
    figures: dict[str, Any] = {"tasks": tasks, "items": items, "work": str(folder),
                               "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "dataset_mb": round((job.parent / "synth.jsonl").stat().st_size
                                                   / 1e6, 1), "fill": {}, "plan": {},
                               "runs": {}}
    with contextlib.ExitStack() as stack:
        locations: dict[str, str | Path] = {}
        if "folder" in backends:
            locations["folder"] = folder / "cache"
        if "postgresql" in backends:
            locations["postgresql"] = stack.enter_context(kept_cluster(folder / "pg")).url
        for name, location in locations.items():
            print(f"[tenm] {size}: filling the {name} cache ...", file=sys.stderr, flush=True)
            figures["fill"][name] = fill(job, location, folder / f"{name}.filled.json")
        for _, command, (backend, location), (label, tree) in itertools.product(
                range(rounds), commands, locations.items(), trees.items()):
            print(f"[tenm] {size}: {label} {command} on {backend} ...", file=sys.stderr,
                  flush=True)
            cwd = runs_dir / f"{label}-{command}-{backend}"
            shutil.rmtree(cwd, ignore_errors=True)  # every command writes a new report folder
            machine = folder / "machine"  # the located index of PostgreSQL's reads
            located = len(list(machine.glob("judge-runner/postgresql/*/keys/*-located")))
            got = measure(_command(command, job, location, cwd / "report"), tree, cwd, tasks,
                          machine=machine)
            if backend == "postgresql":
                got["located_index_before"] = located
            got["report_mb"] = report_sizes(cwd / "report")
            got["counts"] = common.manifest_counts(cwd / "report")
            figures["runs"].setdefault(f"{command}/{backend}/{label}", []).append(got)
            (folder / "progress.json").write_text(json.dumps(figures, indent=1))  # if cut short
        planned = next(iter(locations.values()))
        for label, tree in trees.items():
            figures["plan"][label] = measure(_command("plan", job, planned, None), tree,
                                             runs_dir / f"{label}-plan", tasks)
    figures["compared"] = _comparisons(runs_dir, list(locations), list(trees), commands)
    if not keep:
        shutil.rmtree(runs_dir, ignore_errors=True)  # 10M tasks: ~5 GB of judgments.jsonl each
    figures["best"] = {name: min(rs, key=lambda r: (r["exit_code"] != 0, r["seconds"]))
                       for name, rs in figures["runs"].items()}
    return figures


def _comparisons(runs: Path, backends: list[str], labels: list[str],
                 commands: tuple[str, ...]) -> dict[str, Any]:
    """The other tree's reports against this tree's, and PostgreSQL's against the folder's."""
    pairs: dict[str, tuple[Path, Path]] = {}
    for command in commands:
        for other in labels[1:]:
            for backend in backends:
                pairs[f"{command}/{backend}: {labels[0]} vs {other}"] = (
                    runs / f"{labels[0]}-{command}-{backend}",
                    runs / f"{other}-{command}-{backend}")
        if len(backends) > 1:
            pairs[f"{command}/{labels[0]}: {backends[0]} vs {backends[1]}"] = (
                runs / f"{labels[0]}-{command}-{backends[0]}",
                runs / f"{labels[0]}-{command}-{backends[1]}")
    return {name: compare_reports(a / "report", b / "report") for name, (a, b) in pairs.items()}


def projections(sizes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each command's peak RSS at 10M tasks, projected linearly from its growth between the
    two smallest sizes measured (a floor when the growth is superlinear)."""
    measured = sorted((s for s in sizes.values() if "best" in s), key=lambda s: s["tasks"])
    if len(measured) < 2:
        return {}
    a, b = measured[:2]
    out = {}
    for name in a["best"].keys() & b["best"].keys():
        ra, rb = a["best"][name], b["best"][name]
        if ra["killed"] or rb["killed"] or ra["exit_code"] or rb["exit_code"]:
            continue
        growth = (rb["max_rss_mb"] - ra["max_rss_mb"]) * 1e6 / (b["tasks"] - a["tasks"])
        out[name] = {"growth_bytes_per_task": round(growth),
                     "projected_10m_mb": round(rb["max_rss_mb"] + growth
                                               * (10_000_000 - b["tasks"]) / 1e6),
                     "seconds_per_1m_tasks": round(rb["seconds"] * 1e6 / b["tasks"], 1)}
    return out


def headlines(sizes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The largest size's figures for this tree, under flat keys (bench/run.py's table)."""
    largest = max(sizes.values(), key=lambda s: s["tasks"])
    flat: dict[str, Any] = {"tasks": largest["tasks"]}
    for command, backend in itertools.product(("rescore", "run"), ("folder", "postgresql")):
        best = largest["best"].get(f"{command}/{backend}/this")
        if best is not None:
            short = "pg" if backend == "postgresql" else backend
            flat[f"{command}_{short}_max_rss_mb"] = best["max_rss_mb"]
            flat[f"{command}_{short}_tasks_per_s"] = best["tasks_per_s"]
    plan = largest["plan"].get("this")
    flat["plan_max_rss_mb"] = plan and plan["max_rss_mb"]
    ok = all(b["exit_code"] == 0 and b["max_rss_mb"] <= TARGET_MB and b["tasks_per_s"]
             and b["tasks_per_s"] >= TARGET_RATE for n, b in largest["best"].items()
             if n.endswith("/this"))
    flat["pass"] = (ok and bool(plan) and plan["max_rss_mb"] < PLAN_TARGET_MB
                    if largest["tasks"] >= 10_000_000 else None)
    return flat


def run_sizes(root: Path, names: list[str], *, backends: tuple[str, ...],
              compare_tree: Path | None = None, rounds: int | None = None,
              keep: bool = False, commands: tuple[str, ...] = ("rescore", "run")
              ) -> dict[str, Any]:
    """The benchmark over the sizes `names`, smallest first."""
    trees = {"this": common.ROOT, **({"compare": compare_tree} if compare_tree else {})}
    for tree in trees.values():
        subprocess.run([common.PYTHON, "-m", "compileall", "-q", str(tree / "runner")],
                       check=False, timeout=300)  # as installing does: no compiling timed
    sizes = {name: study(root, name, backends=backends, trees=trees, keep=keep, commands=commands,
                         rounds=rounds or (1 if name == "10m" else 2))
             for name in sorted(names, key=SIZES.__getitem__)}
    return {"target": f"10M tasks: rescore and cached run <= {TARGET_MB:g} MB, >= "
                      f"{TARGET_RATE:,.0f} tasks/s; plan < {PLAN_TARGET_MB:g} MB",
            **headlines(sizes), "trees": {k: str(v) for k, v in trees.items()},
            "sizes": sizes, "projections": projections(sizes),
            "command": "python -m bench.tenm --size 100k|1m|10m [--backend folder|postgresql] "
                       "[--compare-tree PATH]"}


def ten_million(work: Path, quick: bool) -> dict[str, Any]:
    """bench/run.py's entry: 100k tasks with --quick, else 10M; folder and PostgreSQL. The caches
    go to JUDGE_TENM_WORK or /tmp/judge-tenm (kept for the next run), not to `work`."""
    root = Path(os.environ.get("JUDGE_TENM_WORK", "/tmp/judge-tenm"))
    from tests.pgserver import find_bindir
    backends = ("folder", "postgresql") if find_bindir() else ("folder",)
    return run_sizes(root, ["100k" if quick else "10m"], backends=backends)


def _summary(document: dict[str, Any]) -> Iterator[str]:
    """A line per command measured (its fastest round) and per report comparison."""
    for name, size in document["sizes"].items():
        for run, b in size["best"].items():
            yield (f"{name} {run}: {b['seconds']} s, {b['tasks_per_s']} tasks/s, {b['cpu_s']} "
                   f"CPU s, {b['max_rss_mb']} MB, exit {b['exit_code']} {b['killed'] or ''} "
                   f"(load {b['load_avg_before_after'][0][0]})")
        for pair, got in size.get("compared", {}).items():
            same = "identical" if got["identical"] else "DIFFER"
            yield f"{name} {pair}: {same} {got['compared']}"
            for d in got["differ"]:
                yield f"  {d['file']} line {d['line']}:\n    {d['first']}\n    {d['second']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", action="append", choices=list(SIZES),
                        help="tasks: 100k, 1m (default) or 10m; repeatable")
    parser.add_argument("--quick", action="store_true", help="= --size 100k")
    parser.add_argument("--backend", action="append", choices=("folder", "postgresql"),
                        help="which caches (default both); repeatable")
    parser.add_argument("--work", type=Path, default=Path("/tmp/judge-tenm"),
                        help="where the filled caches stay between runs")
    parser.add_argument("--compare-tree", type=Path,
                        help="another tree of the code: the same commands with PYTHONPATH=PATH, "
                             "their reports compared with this tree's")
    parser.add_argument("--command", action="append", choices=("rescore", "run"),
                        help="which commands (default both, rescore first); repeatable")
    parser.add_argument("--rounds", type=int, help="rounds of each command (default 2; 1 at 10m)")
    parser.add_argument("--keep-reports", action="store_true",
                        help="keep the report folders (WORK/SHAPE/runs)")
    parser.add_argument("--out", type=Path, help="write the figures here (JSON)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the sizes already in --out that this run does not measure")
    args = parser.parse_args()
    result = run_sizes(args.work, args.size or (["100k"] if args.quick else ["1m"]),
                       backends=tuple(args.backend or ("folder", "postgresql")),
                       compare_tree=args.compare_tree, rounds=args.rounds,
                       keep=args.keep_reports, commands=tuple(args.command or ("rescore", "run")))
    document = {"machine": common.machine(), **result}
    if args.merge and args.out and args.out.exists():
        sizes = {**json.loads(args.out.read_text()).get("sizes", {}), **result["sizes"]}
        document.update(headlines(sizes), sizes=sizes, projections=projections(sizes))
    if args.out:
        args.out.write_text(json.dumps(document, indent=1) + "\n")
    print("\n".join(_summary(document)))


if __name__ == "__main__":
    main()
