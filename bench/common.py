"""Shared pieces of the benchmarks: machine facts, the fake server process, a synthetic job.

The fake server always runs in its own process (bench/server.py) so it never shares the
client's GIL. Every figure is a ratio or rate measured within one run: the machines are noisy.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
JUDGE = str(Path(PYTHON).with_name("judge"))
PACKAGES = ("aiohttp", "openai", "httpx2", "aiolimiter", "diskcache", "orjson", "judge-runner")

TEMPLATE = """You will rate one summary of a news article for {{aspect}}.

Article:
{{source}}

Summary:
{{output}}

Answer with a rating from one to five stars, e.g. "3 stars", then one sentence of reasons.
"""

_WORDS = ("the council said on monday that the new plan would cut costs for local schools "
          "while critics argued it left rural families with longer journeys and fewer options "
          "officials expect a vote next month after a period of public consultation").split()


def compile_runner() -> None:
    """Byte-compile the runner package, as installing it does: a benchmark that times a `judge`
    process must not time compiling its source, ~0.15 s a start (this machine sets
    PYTHONDONTWRITEBYTECODE, so a run from the source tree never writes the .pyc files)."""
    import compileall
    compileall.compile_dir(str(ROOT / "runner"), quiet=1)


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    facts: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                             "cpus": os.cpu_count(), "cpu_model": _cpu_model(),
                             "mem_total_gib": _mem_total_gib()}
    facts["packages"] = {}
    for name in PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            facts["packages"][name] = importlib.metadata.version(name)
    facts["git_commit"] = _git("rev-parse", "HEAD")
    facts["git_dirty_runner"] = bool(_git("status", "--porcelain", "--", "runner"))
    return facts


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _mem_total_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    """A running fake server process."""

    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stats(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}/bench/stats"
        with urllib.request.urlopen(url, timeout=10) as response:
            data: dict[str, Any] = json.loads(response.read())
        return data


@contextlib.contextmanager
def server(latency: float = 0.0, rpm: float | None = None) -> Iterator[Server]:
    """Start bench/server.py on a free 127.0.0.1 port; stop it (by its pid) on exit."""
    port = free_port()
    cmd = [PYTHON, str(ROOT / "bench" / "server.py"), "--port", str(port),
           "--latency", str(latency)]
    if rpm is not None:
        cmd += ["--rpm", str(rpm)]
    with serving(cmd, [port]) as process:
        yield Server(port, process)


@contextlib.contextmanager
def serving(cmd: list[str], ports: list[int]) -> Iterator[subprocess.Popen[bytes]]:
    """Start `cmd`, a fake server process answering on `ports` of 127.0.0.1; wait until each
    port answers; stop it (by its pid) on exit."""
    process = subprocess.Popen(cmd, cwd=ROOT)
    try:
        for port in ports:
            _wait_ready(port, process)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _wait_ready(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"fake server exited with {process.returncode}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1):
                return
        time.sleep(0.05)
    raise RuntimeError("fake server did not start within 20 s")


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def write_dataset(path: Path, items: int, *, aspects: tuple[str, ...], systems: int = 8,
                  seed: int = 0) -> int:
    """A synthetic user JSONL: `items` outputs of `systems` systems over shared sources.

    Each line has id, group, system, source (~300 chars), output (~120 chars) and a human
    score per aspect. Returns the file size in bytes.
    """
    rng = random.Random(seed)
    sources = [_text(rng, 50) for _ in range(64)]
    outputs = [_text(rng, 20) for _ in range(256)]
    with path.open("w", encoding="utf-8") as f:
        for i in range(items):
            group = i // systems
            row = {"id": f"i{i}", "group": f"g{group}", "system": f"s{i % systems}",
                   "source": f"[{group}] {sources[group % 64]}",
                   "output": f"[{i}] {outputs[i % 256]}",
                   **{a: float(1 + (i * 7 + k) % 5) for k, a in enumerate(aspects)}}
            f.write(json.dumps(row) + "\n")
    return path.stat().st_size


def write_job(folder: Path, items: int, *, aspects: tuple[str, ...], prompts: int = 1,
              base_url: str, concurrency: int = 64, rpm: float | None = None,
              max_retries: int = 6, bootstrap: int = 1000) -> Path:
    """A job over a synthetic data set: items x prompts x aspects tasks, one fake model."""
    folder.mkdir(parents=True, exist_ok=True)
    write_dataset(folder / "synth.jsonl", items, aspects=aspects)
    (folder / "prompt.txt").write_text(TEMPLATE, encoding="utf-8")
    human = ", ".join(f'{a} = "{a}"' for a in aspects)
    lines = ['name = "synth"', f"bootstrap = {bootstrap}", "", "[limits]",
             f"concurrency = {concurrency}", f"max_retries = {max_retries}", "timeout_s = 60"]
    if rpm is not None:
        lines.append(f"rpm = {rpm}")
    lines += ["", "[[datasets]]", 'name = "synth"', 'path = "synth.jsonl"',
              'fields = { id = "id", group = "group", system = "system", '
              f'text = {{ source = "source", output = "output" }}, human = {{ {human} }} }}']
    for p in range(prompts):
        lines += ["", "[[prompts]]", f'name = "p{p}"', 'template = "prompt.txt"',
                  'parser = "stars"', f"aspects = {json.dumps(list(aspects))}",
                  f"params = {{ temperature = 0, max_tokens = {16 + p} }}"]
    lines += ["", "[models.judge]", 'spec = "fake-judge"', f'base_url = "{base_url}"']
    job = folder / "job.toml"
    job.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return job


@dataclass(frozen=True)
class Child:
    """A finished subprocess: wall time, exit code, its own CPU times and peak RSS."""

    seconds: float
    exit_code: int
    user_s: float
    sys_s: float
    max_rss_mib: float
    stdout: str
    stderr: str

    def figures(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "exit_code": self.exit_code,
                "cpu_user_s": round(self.user_s, 3), "cpu_sys_s": round(self.sys_s, 3),
                "max_rss_mib": round(self.max_rss_mib, 1)}


# A small launcher that forks the command, reaps it with wait4 and writes its figures to the
# file named by argv[1]. A command spawned by the benchmark process directly would report that
# (large) process's peak RSS as its own: Linux carries the parent's high-water mark into
# ru_maxrss across the vfork/exec that subprocess uses (after run_memory's in-process part, a
# 200k-task `judge plan` measured 276 MB that way, 167 MB through the launcher). The command
# dies with the launcher, which run_child's timeout kills.
_LAUNCH = """
import ctypes, json, os, sys, time
started = time.perf_counter()
pid = os.fork()
if pid == 0:
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL: dies with the launcher
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as exc:
        print(f"cannot start {sys.argv[2]}: {exc}", file=sys.stderr, flush=True)
    os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    json.dump({"seconds": time.perf_counter() - started, "max_rss_kib": usage.ru_maxrss,
               "user_s": usage.ru_utime, "sys_s": usage.ru_stime}, out)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_child(args: list[str], *, cwd: Path, timeout_s: float) -> Child:
    """Run a command; its wall time, CPU times and peak RSS are its own (see _LAUNCH)."""
    figures = cwd / ".child.rusage.json"
    figures.unlink(missing_ok=True)
    launched = _reaped([PYTHON, "-c", _LAUNCH, str(figures), *args], cwd=cwd,
                       timeout_s=timeout_s)
    got = json.loads(figures.read_bytes()) if figures.exists() else {}  # none: killed
    return Child(got.get("seconds", launched.seconds), launched.exit_code,
                 got.get("user_s", launched.user_s), got.get("sys_s", launched.sys_s),
                 got.get("max_rss_kib", launched.max_rss_mib * 1024) / 1024,
                 launched.stdout, launched.stderr)


def _reaped(args: list[str], *, cwd: Path, timeout_s: float) -> Child:
    """Run a command, reaping it with wait4 so the rusage is this child's alone."""
    out_path, err_path = cwd / ".child.out", cwd / ".child.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        started = time.perf_counter()
        process = subprocess.Popen(args, cwd=cwd, stdout=out, stderr=err,
                                   stdin=subprocess.DEVNULL)
        deadline = started + timeout_s
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                process.kill()
                _, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(0.005)
        seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    return Child(seconds, process.returncode, usage.ru_utime, usage.ru_stime,
                 usage.ru_maxrss / 1024, out_path.read_text(errors="replace"),
                 err_path.read_text(errors="replace"))


def manifest_counts(out: Path) -> dict[str, Any]:
    """The counts in the manifest.json of a report folder; {} when there is none."""
    try:
        counts: dict[str, Any] = json.loads((out / "manifest.json").read_bytes())["counts"]
        return counts
    except (OSError, ValueError, KeyError):
        return {}


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def speed_probe() -> float:
    """Seconds for a fixed pure-Python loop (5M additions): how fast this machine runs Python
    right now. On the shared 2-core machine the same code's times drift with the other work on
    the host, which the load average does not show, so timed benchmarks record this before and
    after."""
    started = time.perf_counter()
    total = 0
    for i in range(5_000_000):
        total += i
    return round(time.perf_counter() - started, 3)


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]
