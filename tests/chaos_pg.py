"""The PostgreSQL trials of the fault campaign (tests/test_chaos.py, beside tests/chaos.py's
kills and full disks): the 1,000-task run with its cache in a fresh database of a private
server, which goes away mid-run at a random point of the run's progress.

Faults (`PG_FAULTS`), each drawn from the trial's seed with its length:
- `stop`: the server stopped (pg_ctl stop -m fast), started again within the run's wait: the
  run holds its answers, waits, goes on;
- `stop past the wait`: stopped for longer than the wait (JUDGE_PG_WAIT_S): the run stops,
  its held answers in a spill file; the server is started again and the run resumed;
- `SIGSTOP`: every server process frozen for longer than the request timeout, then thawed.

A trial counts, as the storage trials do: lost (tasks the uninterrupted run on a folder reports
and this one does not), answers bought twice (none allowed: nothing is killed), mismatches,
and checks that the wait was told in one line when it started and one when it ended.
`CHAOS_PG_FAULT` (`stop`, `sigstop`), `CHAOS_PG_OUTAGE_S` and `CHAOS_PG_WAIT_S` fix a trial's
fault, its length and the run's wait (the measured long outages of docs/development.md).
"""

from __future__ import annotations

import os
import random
import signal
import time

import psycopg

from tests.chaos import DONE, RUN_TIMEOUT_S, TASKS, Campaign, Trial, _closed, _reset, fault_mix
from tests.fakeserver import Script, ThreadedServer
from tests.pgserver import PgCluster
from tests.processes import wait_until
from tests.test_cli import clean_env, judge_cmd
from tests.test_pg_faults import _pg_ctl, _signal

__all__ = ["PG_FAULTS", "pg_trial"]

PG_FAULTS = {"stop": (1.0, 8.0), "stop past the wait": (4.0, 8.0), "SIGSTOP": (9.0, 14.0)}
"""Fault -> the range its length is drawn from, in seconds."""
SHORT_WAIT_S = 2.0  # JUDGE_PG_WAIT_S of a `stop past the wait` trial
SIGSTOP_TIMEOUT_S = 8  # the request timeout of a SIGSTOP trial: shorter than the freeze
WAITING, BACK, GAVE_UP = "unreachable: waiting up to", ": back after ", ": gave up after "


def _plan(seed: int) -> tuple[str, float, float | None]:
    """The trial's fault, its length and the run's wait (None: the default), from the seed or
    CHAOS_PG_FAULT, CHAOS_PG_OUTAGE_S and CHAOS_PG_WAIT_S."""
    rng = random.Random(f"pg {seed}")
    fault = rng.choice(sorted(PG_FAULTS))
    seconds = rng.uniform(*PG_FAULTS[fault])
    wait = SHORT_WAIT_S if fault == "stop past the wait" else None
    if chosen := os.environ.get("CHAOS_PG_FAULT"):
        fault = {"stop": "stop", "sigstop": "SIGSTOP"}[chosen]
        wait = None
    seconds = float(os.environ.get("CHAOS_PG_OUTAGE_S") or seconds)
    wait = float(os.environ.get("CHAOS_PG_WAIT_S") or 0) or wait
    return fault, seconds, wait


def _database(cluster: PgCluster, seed: int) -> str:
    name = f"chaos{seed}_{time.monotonic_ns()}"
    with psycopg.connect(cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    return cluster.url.rsplit("/", 1)[0] + "/" + name


def _away(cluster: PgCluster, fault: str, gone: bool) -> None:
    """`gone`: the fault begins (the server stopped or frozen), else it ends."""
    if fault == "SIGSTOP":
        _signal(cluster, signal.SIGSTOP if gone else signal.SIGCONT)
    else:  # a stopped server started with its own options (postmaster.opts)
        _pg_ctl(cluster, "stop" if gone else "restart")


def pg_trial(campaign: Campaign, seed: int, cluster: PgCluster) -> Trial:
    """One PostgreSQL trial (module doc) on `cluster`, a server of the campaign's own."""
    fault, seconds, wait = _plan(seed)
    trial, rng, started = Trial(seed), random.Random(f"pg at {seed}"), time.monotonic()
    trial.fault = f"PostgreSQL {fault} {seconds:.1f} s" + (f", wait {wait:g} s" if wait else "")
    folder = campaign.workdir / f"pg-{seed}"
    with ThreadedServer(Script(fault_for=fault_mix(seed), retry_after=0.05, slow_s=0.3)) as server:
        code, stderr = campaign._judge(campaign._args(server, folder, "reference"), folder)
        if code not in DONE:
            trial.problems.append(f"the uninterrupted run exited {code}: {stderr[-1500:]}")
            return trial
        _reset(server)
        args = campaign._args(server, folder, "resumed")
        args[args.index("--cache-dir"):args.index("--cache-dir") + 2] = \
            ["--cache", _database(cluster, seed)]
        if fault == "SIGSTOP":
            args[args.index("--timeout") + 1] = SIGSTOP_TIMEOUT_S
        env = clean_env(campaign.data_dir, XDG_CACHE_HOME=str(folder / "xdg"),
                        **({"JUDGE_PG_WAIT_S": f"{wait:g}"} if wait else {}))
        proc = campaign.processes.start(judge_cmd(*args), env=env, cwd=folder)
        at = rng.randint(50, TASKS - 300)  # answers before the outage: the run has work left
        wait_until(lambda: server.state.answered >= at or proc.proc.poll() is not None,
                   "the run's progress", timeout=RUN_TIMEOUT_S)
        _away(cluster, fault, gone=True)
        try:
            time.sleep(seconds)  # the outage's length, drawn: not a wait for anything
        finally:
            _away(cluster, fault, gone=False)
        stderr = campaign.resumed(trial, server, proc, (args, env, folder),
                                  lambda code, stderr: code == 2 and GAVE_UP in stderr)
    told = [line for line in stderr.splitlines() if WAITING in line or BACK in line
            or GAVE_UP in line]
    if len(told) != 2 or WAITING not in told[0]:
        trial.problems.append(f"the wait told in {len(told)} lines, not 2: {told}")
    return _closed(trial, folder, started)
