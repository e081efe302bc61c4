"""What PostgreSQL's located index buys (runner/execute/store/keyindex.py,
PgCache.get_many_raw_at), as whole `judge` processes on the ten-million benchmark's PostgreSQL
cache (bench/tenm.py's study, filled once): alternated rounds of `judge rescore` and a cached
`judge run`, without the index (its folder removed first: the read by key, which stores it) and
with it, the PostgreSQL server's CPU beside each command's wall time, CPU and memory.

    python -m bench.located --size 10m --rounds 2 --out /tmp/located.json

The server's CPU is its postmaster's own and its children's, those it reaped included (a
backend ends with its connection), before and after each command. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

from bench import common, tenm

VARIANTS = ("without", "with")


def server_cpu_s(postmaster: int) -> float:
    """CPU seconds of the server so far: the postmaster, its reaped children, its live ones."""
    tick = os.sysconf("SC_CLK_TCK")

    def fields(pid: int) -> list[str]:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()

    total = sum(int(x) for x in fields(postmaster)[11:15])  # utime stime cutime cstime
    for child in Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split():
        try:
            total += sum(int(x) for x in fields(int(child))[11:13])
        except OSError:  # ended since
            pass
    return total / tick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=list(tenm.SIZES), default="10m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/judge-tenm"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    common.compile_runner()
    folder, job, tasks = tenm.study_job(args.work, args.size)
    machine = folder / "machine-located"  # the commands' XDG_CACHE_HOME
    runs: dict[str, list[dict[str, Any]]] = {}
    with tenm.kept_cluster(folder / "pg") as cluster:
        tenm.fill(job, cluster.url, folder / "postgresql.filled.json")
        postmaster = int((folder / "pg" / "data" / "postmaster.pid").read_text().split()[0])
        for n in range(args.rounds):
            for command in ("rescore", "run"):
                for variant in VARIANTS if n % 2 == 0 else VARIANTS[::-1]:
                    if variant == "without":
                        shutil.rmtree(machine, ignore_errors=True)
                    cwd = folder / "runs" / f"located-{command}-{variant}"
                    shutil.rmtree(cwd, ignore_errors=True)
                    before = server_cpu_s(postmaster)
                    got = tenm.measure(tenm._command(command, job, cluster.url, cwd / "report"),
                                       common.ROOT, cwd, tasks, machine=machine)
                    got["server_cpu_s"] = round(server_cpu_s(postmaster) - before, 1)
                    runs.setdefault(f"{command}/{variant}", []).append(got)
                    shutil.rmtree(cwd, ignore_errors=True)  # 10M: ~5 GB of reports
                    print(f"[located] {command} {variant}: {got['seconds']} s, server "
                          f"{got['server_cpu_s']} s CPU", flush=True)
    means = {name: round(statistics.mean(r["seconds"] for r in rs), 1)
             for name, rs in runs.items()}
    document = {"tasks": tasks, "runs": runs, "mean_seconds": means,
                "bought": {c: round(means[f"{c}/without"] / means[f"{c}/with"], 2)
                           for c in ("rescore", "run")},
                "command": "python -m bench.located --size 10m --rounds 2"}
    text = json.dumps(document, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
