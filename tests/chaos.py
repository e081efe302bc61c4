"""The fault campaign of tests/test_chaos.py: a 1,000-task `judge run` (the real CLI in a
subprocess) against the fake server on 127.0.0.1, with a seeded mix of faults, interrupted by
kill -9, SIGTERM and Ctrl-C at random points of its progress and resumed until it completes;
then compared with an uninterrupted run of the same job on a fresh cache.

What one trial checks, and counts for the campaign's summary:
- lost: tasks the uninterrupted run reports and the resumed one does not (or without a score);
- mismatches: scores.csv or correlations.csv differ, or a task's judgment differs;
- repeats: answers the server sent more than once for one cache key (a request body), at most
  the concurrency per interruption (what was in flight when the process died);
- an exit status that is not the signal's (kill -9: -9; SIGTERM: 143 or -15; Ctrl-C: 130), a
  traceback on stderr, or a process of a killed run (its reader, its forked children) left
  running.

A storage trial (`Campaign.disk`) puts the resumed run's cache on a small tmpfs with a few
hundred KB left: once the run says the disk is full, after a random wait, the space is freed
(the run goes on by itself) or the run is stopped with Ctrl-C or killed with kill -9 (once no
request is in flight), the space freed, and the run resumed. No answer may be repeated at all
(the answers held while the disk is full are on another disk at once), nothing lost.

The fault a request meets depends only on its body and how many times that body was asked
for (`fault_mix`), never on the order requests arrive in: the interrupted and the
uninterrupted run see the same answers in the end, whatever their timing and whether an
empty answer is stored or retried.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fakeserver import Script, ThreadedServer
from tests.processes import Child, Processes, alive, wait_until
from tests.test_cli import OPENMEVA, clean_env, judge_cmd, judgments

TASKS = 1000  # openmeva: 200 stories x 5 generators
CONCURRENCY = 8
FAULTS = (("429", 0.002), ("500", 0.01), ("503", 0.005), ("drop", 0.005), ("malformed", 0.005),
          ("slow", 0.02))
"""Fault -> probability for each of a body's first FAULTED attempts (429s are rare: each
pauses the whole pool for at least half a second)."""
FAULTED = 2  # attempts that may fault; --max-retries 3 leaves every other task an answer
EMPTY = 0.01
"""Share of bodies whose every answer is empty (`content: ""`): stored or retried, the same in
both runs."""
SIGNALS = (signal.SIGKILL, signal.SIGTERM, signal.SIGINT)
EXITS = {signal.SIGKILL: {-signal.SIGKILL}, signal.SIGTERM: {143, -signal.SIGTERM},
         signal.SIGINT: {130}}
DONE = {0, 1}  # complete: every task answered, or failed for good (listed)
RUN_TIMEOUT_S = 240.0
COMPARED = ("scores.csv", "correlations.csv")
FULL = "cache disk full at "
FREE = (250_000, 700_000)  # bytes left on the storage trial's disk: it fills within 1,000 tasks
HOLD_S = 2.0  # the longest a storage trial leaves the disk full


def _unit(*parts: object) -> float:
    """A number in [0, 1) drawn from `parts` alone."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def fault_mix(seed: int) -> Callable[[str, int], str]:
    """The fault for (body key, attempt): a pure function of the seed, the body and the
    attempt (Script.fault_for)."""

    def fault_for(key: str, attempt: int) -> str:
        if _unit(seed, key) < EMPTY:
            return "empty"
        if attempt > FAULTED:
            return "ok"
        draw, edge = _unit(seed, key, attempt), 0.0
        for name, p in FAULTS:
            edge += p
            if draw < edge:
                return name
        return "ok"

    return fault_for


@dataclass
class Trial:
    """One trial's plan (from its seed) and what it found."""

    seed: int
    signals: list[tuple[signal.Signals, float]] = field(default_factory=list)
    """(signal, when), in order, one run each: sent once the run has sent a request and got
    `when` x the answers it still lacked at its start (0 <= when < 0.95)."""
    exits: list[int] = field(default_factory=list)
    stopped: list[signal.Signals] = field(default_factory=list)
    """The signals that ended a run (one sent after its run completed ends nothing)."""
    lost: int = 0
    repeats: int = 0
    mismatches: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    fault: str = ""
    """A storage trial's fault, e.g. `disk full 0.8 s, Ctrl-C`."""

    @classmethod
    def plan(cls, seed: int) -> Trial:
        rng = random.Random(seed)
        signals = [(rng.choice(SIGNALS), round(rng.uniform(0, 0.95), 3))
                   for _ in range(rng.randint(1, 3))]
        return cls(seed, signals)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.mismatches or self.problems)

    def line(self) -> str:
        said = self.fault or ", ".join(f"{sig.name}@{when:.0%}" for sig, when in self.signals)
        return (f"seed {self.seed}: {said}; exits {self.exits}, {len(self.stopped)} stopped a "
                f"run; lost {self.lost}, repeats "
                f"{self.repeats}, mismatches {len(self.mismatches)}, {self.seconds:.0f} s"
                + "".join(f"\n  {p}" for p in self.problems + self.mismatches[:10]))


class Campaign:
    """Runs trials in `workdir` against one fake server; each trial gets fresh caches."""

    def __init__(self, workdir: Path, data_dir: Path, processes: Processes) -> None:
        self.workdir, self.data_dir, self.processes = workdir, data_dir, processes

    def run(self, seed: int) -> Trial:
        trial = Trial.plan(seed)
        started = time.monotonic()
        folder = self.workdir / f"trial-{seed}"
        script = Script(fault_for=fault_mix(seed), retry_after=0.05, slow_s=0.3)
        with ThreadedServer(script) as server:
            args = self._args(server, folder, "reference")
            code, stderr = self._judge(args, folder)
            if code not in DONE:
                trial.problems.append(f"the uninterrupted run exited {code}: {stderr[-1500:]}")
                return trial
            _reset(server)
            self._interrupted(trial, server, folder)
            trial.repeats = sum(n - 1 for n in server.state.answers.values() if n > 1)
        if left := self._orphans():
            trial.problems.append(f"processes of the interrupted runs left running: {left}")
        # A kill loses what was in flight; Ctrl-C lets it finish and stores it.
        most = CONCURRENCY * sum(1 for sig in trial.stopped if sig != signal.SIGINT)
        if trial.repeats > most:
            trial.problems.append(f"{trial.repeats} answers repeated, over {most} "
                                  f"({CONCURRENCY} a kill)")
        if not trial.problems:
            _compare(trial, folder / "reference", folder / "resumed")
        trial.seconds = time.monotonic() - started
        return trial

    def disk(self, seed: int, disk: Path) -> Trial:
        """A storage trial (module doc) with its cache on `disk`, a small file system of its
        own."""
        trial, rng, started = Trial(seed), random.Random(f"disk {seed}"), time.monotonic()
        folder = self.workdir / f"disk-{seed}"
        script = Script(fault_for=fault_mix(seed), retry_after=0.05, slow_s=0.3)
        with ThreadedServer(script) as server:
            code, stderr = self._judge(self._args(server, folder, "reference"), folder)
            if code not in DONE:
                trial.problems.append(f"the uninterrupted run exited {code}: {stderr[-1500:]}")
                return trial
            _reset(server)
            filler = _leave(disk, rng.randint(*FREE))
            args = self._args(server, folder, "resumed")
            args[args.index("--cache-dir") + 1] = disk / "cache"
            env = clean_env(self.data_dir, TMPDIR=str(folder))  # spill files: kept apart
            proc = self.processes.start(judge_cmd(*args), env=env, cwd=folder)
            proc.wait_for(FULL, timeout=RUN_TIMEOUT_S)
            held, stop = rng.uniform(0, HOLD_S), rng.choice((None, "Ctrl-C", "kill -9"))
            trial.fault = f"disk full {held:.1f} s" + (f", {stop}" if stop else "")
            time.sleep(held)  # the fault's length, drawn: not a wait for anything
            if stop == "kill -9":  # once no request is in flight: the run holds what it bought
                wait_until(lambda: server.state.in_flight == 0, "no request in flight")
            if stop:
                sig = signal.SIGINT if stop == "Ctrl-C" else signal.SIGKILL
                proc.signal(sig)
                trial.stopped.append(sig)
            filler.unlink()
            self.resumed(trial, server, proc, (args, env, folder),
                         lambda code, _: code == {"Ctrl-C": 130, "kill -9": -9}.get(stop or ""))
        return _closed(trial, folder, started)

    def resumed(self, trial: Trial, server: ThreadedServer, proc: Child,
                run: tuple[list[Any], dict[str, str], Path],
                again: Callable[[int, str], bool]) -> str:
        """A storage trial's faulted run `proc` finished, and run once more (`run`: its
        arguments, environment and folder) when `again(exit, stderr)`: it stopped. The last
        must complete without a traceback, and no answer may be bought twice. Returns the
        faulted run's stderr."""
        code, _, stderr = proc.finish(timeout=RUN_TIMEOUT_S)
        trial.exits.append(code)
        faulted = stderr
        if again(code, stderr):
            args, env, folder = run
            code, _, stderr = self.processes.start(judge_cmd(*args), env=env, cwd=folder
                                                   ).finish(timeout=RUN_TIMEOUT_S)
            trial.exits.append(code)
        if code not in DONE or "Traceback" in stderr:
            trial.problems.append(f"exit {code}: {stderr[-1500:]}")
        trial.repeats = sum(n - 1 for n in server.state.answers.values() if n > 1)
        if trial.repeats:
            trial.problems.append(f"{trial.repeats} answers bought twice")
        return faulted

    def _orphans(self) -> list[int]:
        """The killed runs' children (reader, forked children) still running after 60 s."""
        left = [pid for pid in self.processes.adopted if alive(pid)]
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = [pid for pid in left if alive(pid)]
        return left

    def _interrupted(self, trial: Trial, server: ThreadedServer, folder: Path) -> None:
        """The runs of the trial: one per planned signal, then until one completes."""
        args = self._args(server, folder, "resumed")
        for sig, when in [*trial.signals, *[(None, 0.0)] * 2]:
            state = server.state
            sent, answered = state.requests, state.answered
            after = answered + int(when * (TASKS - len(state.answers)))
            proc = self.processes.start(judge_cmd(*args), env=clean_env(self.data_dir),
                                        cwd=folder)
            if sig is not None:
                wait_until(lambda: (state.requests > sent and  # noqa: B023
                                    state.answered >= after)  # noqa: B023
                           or proc.proc.poll() is not None, "the run's progress",  # noqa: B023
                           timeout=RUN_TIMEOUT_S)
                for pid in _descendants(proc.pid):  # ended by the test if they outlive it
                    self.processes.adopt(pid)
                proc.signal(sig)
            code, _, stderr = proc.finish(timeout=RUN_TIMEOUT_S)
            trial.exits.append(code)
            if "Traceback" in stderr:
                trial.problems.append(f"a traceback after {sig}: {stderr[-1500:]}")
            if code in DONE:
                return
            if sig is None or code not in EXITS[sig]:
                trial.problems.append(f"exit {code} after {sig}: {stderr[-1500:]}")
                return
            trial.stopped.append(sig)
        trial.problems.append("no run completed")

    def _args(self, server: ThreadedServer, folder: Path, name: str) -> list[Any]:
        return ["run", OPENMEVA, "--concurrency", CONCURRENCY, "--max-retries", 3,
                "--timeout", 30, "--rpm", 10**6, "--base-url", server.url, "--model", "fake",
                "--cache-dir", folder / f"{name}-cache", "--out", folder / name]

    def _judge(self, args: list[Any], folder: Path) -> tuple[int, str]:
        folder.mkdir(parents=True, exist_ok=True)
        proc = self.processes.start(judge_cmd(*args), env=clean_env(self.data_dir), cwd=folder)
        code, _, stderr = proc.finish(timeout=RUN_TIMEOUT_S)
        return code, stderr


def _descendants(pid: int) -> list[int]:
    """The processes under `pid`, from /proc (empty where there is none)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        below = [child for child, parent in parents.items() if parent in frontier]
        found += below
        frontier = below
    return found


def _leave(disk: Path, free: int) -> Path:
    """`disk` emptied, then filled but for `free` bytes; the filler file."""
    for path in disk.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    filler, stat = disk / "filler", os.statvfs(disk)
    filler.write_bytes(b"\0" * max(0, stat.f_bavail * stat.f_frsize - free))
    return filler


def _closed(trial: Trial, folder: Path, started: float) -> Trial:
    """A storage trial compared with its uninterrupted run (when nothing else went wrong),
    timed."""
    if not trial.problems:
        _compare(trial, folder / "reference", folder / "resumed")
    trial.seconds = time.monotonic() - started
    return trial


def _reset(server: ThreadedServer) -> None:
    """Counters back to zero: the interrupted runs are counted from a fresh start."""
    state = server.state
    state.bodies.clear()
    state.answers.clear()
    state.status.clear()
    state.requests = state.answered = 0


def _compare(trial: Trial, reference: Path, resumed: Path) -> None:
    for name in COMPARED:
        if (reference / name).read_bytes() != (resumed / name).read_bytes():
            trial.mismatches.append(f"{name} differs")
    want = {j["key"]: _judged(j) for j in judgments(reference)}
    got = {j["key"]: _judged(j) for j in judgments(resumed)}
    trial.lost = sum(1 for key, j in want.items()
                     if key not in got or (j["score"] is not None and got[key]["score"] is None))
    trial.mismatches += [f"{key[:12]}: {_difference(want[key], got[key])}"[:300]
                         for key in want if key in got and got[key] != want[key]]
    trial.mismatches += [f"{key[:12]}: not in the uninterrupted run" for key in got
                         if key not in want]


def _difference(want: dict[str, Any], got: dict[str, Any]) -> str:
    return ", ".join(f"{name} {want.get(name)!r} != {got.get(name)!r}"
                     for name in sorted(want.keys() | got.keys())
                     if want.get(name) != got.get(name))


def _judged(j: dict[str, Any]) -> dict[str, Any]:
    """What a judgment says, without how it was come by (cached, usage)."""
    return {k: v for k, v in j.items() if k not in ("cached", "usage")}
