"""A damaged or unreachable folder cache costs one task, never the study: a damaged record is
its task's failure (and `judge cache check` / `judge run --refresh-damaged` mend it), a cache
that cannot be opened is one `Error:` line, a read-only folder is read, the reader process's
death is absorbed, and a full disk holds the answers until it has room (tests/test_disk_full.py).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner, Result

from runner.cli import main as cli_main
from runner.errors import CacheError
from runner.execute.store import reader as reader_module
from runner.reduce import judgments as judgments_module
from runner.session import run as session_run
from tests.fakeserver import ThreadedServer
from tests.test_cli import JOB, clean_env, judgments, manifest, write_job

LIMIT = 12


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, data_dir: Path, tmp_path: Path) -> None:
    """The data sets read from `data_dir`; no API key, base URL or cache from the shell."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JUDGE_DATA_DIR", str(data_dir))
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "JUDGE_CACHE_DIR", "JUDGE_CACHE_URL"):
        monkeypatch.delenv(name, raising=False)


def _judge(*args: Any) -> Result:
    return CliRunner().invoke(cli_main.cli, [str(a) for a in args], catch_exceptions=False)


def _run_args(job: Path, cache: Path, out: Path, server: ThreadedServer) -> list[Any]:
    return ["run", job, "--limit", LIMIT, "--base-url", server.url, "--model", "fake",
            "--cache-dir", cache, "--out", out, "--yes"]


def _damage(cache: Path, how: str, which: int = 0) -> str:
    """Damage the stored bytes of one record of `cache` (its `which`-th key); its key."""
    with sqlite3.connect(cache / "cache.db") as con:
        key, value = con.execute("SELECT key, value FROM Cache ORDER BY key LIMIT 1 OFFSET ?",
                                 (which,)).fetchone()
        damaged = value[:len(value) // 2] if how == "truncated" else os.urandom(len(value))
        con.execute("UPDATE Cache SET value = ? WHERE key = ?", (damaged, key))
    return str(key)


@pytest.fixture
def filled(server: ThreadedServer, tmp_path: Path) -> tuple[Path, Path, list[Any]]:
    """A cache of every task of a small job (the job, the cache, the run's arguments)."""
    job = write_job(tmp_path / "job", JOB)
    args = _run_args(job, tmp_path / "cache", tmp_path / "out", server)
    done = _judge(*args)
    assert done.exit_code == 0, done.output
    return job, tmp_path / "cache", args


@pytest.mark.slow
@pytest.mark.parametrize("how", ["truncated", "random"])
@pytest.mark.parametrize("way", ["direct", "reader", "cached first"])
def test_a_damaged_record_fails_its_task_alone_in_run_and_rescore(
        filled: tuple[Path, Path, list[Any]], server: ThreadedServer, how: str, way: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job, cache, args = filled
    key = _damage(cache, how)
    if way == "reader":  # read by a reader process (this test's threads: no fork)
        monkeypatch.setattr(reader_module, "MIN_TASKS", 1)
        monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
        monkeypatch.setattr(judgments_module, "READ_BATCH", 3)
    if way == "cached first":
        monkeypatch.setattr(session_run, "CACHED_FIRST_TASKS", 1)
    before = server.state.requests
    for command in (args, ["rescore", *args[1:-1]]):
        done = _judge(*command)
        assert done.exit_code == 1, done.output
        assert f"failed {key[:12]}: cached answer unreadable (" in done.output
        assert "rerun with `judge run --refresh-damaged` to ask again" in done.output
        lines = judgments(tmp_path / "out")
        assert len(lines) == LIMIT
        failed = [j for j in lines if j["error"] is not None]
        assert [j["key"] for j in failed] == [key]
        assert failed[0]["error"]["message"].startswith("cached answer unreadable")
        assert all(j["score"] is not None for j in lines if j["key"] != key)
        assert manifest(tmp_path / "out")["counts"]["failures"] == 1
    assert server.state.requests == before  # nothing asked again without being told


def test_cache_check_lists_damaged_records_and_drop_removes_them(
        filled: tuple[Path, Path, list[Any]], server: ThreadedServer, tmp_path: Path) -> None:
    job, cache, args = filled
    keys = sorted([_damage(cache, "truncated", 0), _damage(cache, "random", 3)])
    done = _judge("cache", "check", "--cache-dir", cache)
    assert done.exit_code == 1, done.output
    assert sorted(line.split()[1].rstrip(":") for line in done.stdout.splitlines()
                  if line.startswith("damaged ")) == keys
    assert f"{cache}: 2 damaged records (--drop removes them)" in done.output
    # scoped to a job's tasks: the same two
    scoped = _judge("cache", "check", job, "--limit", LIMIT, "--model", "fake", "--base-url",
                    server.url, "--cache-dir", cache)
    assert scoped.exit_code == 1, scoped.output
    assert scoped.stdout == done.stdout
    dropped = _judge("cache", "check", "--cache-dir", cache, "--drop")
    assert dropped.exit_code == 0, dropped.output
    assert "2 damaged records (dropped; `judge run` asks them again)" in dropped.output
    clean = _judge("cache", "check", "--cache-dir", cache)
    assert clean.exit_code == 0, clean.output
    assert f"{cache}: 0 damaged records" in clean.output
    before = server.state.requests
    rerun = _judge(*args)
    assert rerun.exit_code == 0, rerun.output
    assert server.state.requests - before == 2


def test_run_refresh_damaged_asks_the_damaged_answers_again(
        filled: tuple[Path, Path, list[Any]], server: ThreadedServer, tmp_path: Path) -> None:
    _, cache, args = filled
    key = _damage(cache, "random", 5)
    before = server.state.requests
    done = _judge(*args, "--refresh-damaged")
    assert done.exit_code == 0, done.output
    assert f"{cache}: dropped 1 damaged records; asking them again" in done.output
    assert server.state.requests - before == 1
    assert all(j["error"] is None for j in judgments(tmp_path / "out"))
    assert key in {j["key"] for j in judgments(tmp_path / "out")}


def _error_line(output: str) -> str:
    """The one `Error:` line of a command's output (and no traceback)."""
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, output
    assert "Traceback" not in output, output
    return errors[0]


@pytest.mark.parametrize("how", ["random", "truncated"])
@pytest.mark.parametrize("command", ["run", "rescore", "status"])
def test_a_corrupt_cache_database_is_one_error_line_naming_it(
        filled: tuple[Path, Path, list[Any]], how: str, command: str) -> None:
    _, cache, args = filled
    db = cache / "cache.db"
    data = db.read_bytes()
    db.write_bytes(os.urandom(len(data)) if how == "random" else data[:len(data) // 3])
    done = _judge(*{"run": args, "rescore": ["rescore", *args[1:-1]],
                    "status": ["status", *args[1:-3]]}[command])
    assert done.exit_code == 2, done.output
    line = _error_line(done.output)
    assert line.startswith(f"Error: {db}: the cache database is damaged ("), line
    assert "restore the folder from a copy, or move it aside and rerun" in line


class _FastClock:
    """diskcache's clock, a second further on at each look: its minute of retries on a locked
    database goes by at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        self.now += 1.0
        return self.now

    @staticmethod
    def sleep(seconds: float) -> None:
        pass


def test_a_cache_locked_by_another_process_for_a_minute_is_one_error_line(
        filled: tuple[Path, Path, list[Any]], server: ThreadedServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import diskcache.core

    _, cache, args = filled
    before = server.state.requests
    holder = sqlite3.connect(cache / "cache.db", isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # another process's write, never ending
        monkeypatch.setattr(diskcache.core, "time", _FastClock())
        for command in (args, ["rescore", *args[1:-1]]):
            done = _judge(*command)
            assert done.exit_code == 2, done.output
            line = _error_line(done.output)
            assert line.startswith(f"Error: {cache / 'cache.db'}: locked by another process "
                                   "for over a minute ("), line
            assert line.endswith("let the other judge command on this folder end (or stop "
                                 "it), then rerun")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert server.state.requests == before


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"/"
            for p in sorted(folder.rglob("*"))}


@pytest.fixture
def unwritable(filled: tuple[Path, Path, list[Any]], monkeypatch: pytest.MonkeyPatch
               ) -> tuple[Path, Path, list[Any]]:
    """The filled cache folder, made read-only: chmod, and, since root writes whatever the
    mode (tests run as root in CI), os.access saying so too, which is what the code asks."""
    _, cache, _ = filled
    real = os.access

    def access(path: Any, mode: int, **kwargs: Any) -> bool:
        if mode & os.W_OK and Path(path).resolve().is_relative_to(cache.resolve()):
            return False
        return real(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", access)
    for p in [cache, *cache.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    return filled


def test_reading_commands_read_a_read_only_cache_folder_and_write_nothing(
        unwritable: tuple[Path, Path, list[Any]], server: ThreadedServer,
        tmp_path: Path) -> None:
    job, cache, args = unwritable
    made = [{**j, "cached": True} for j in judgments(tmp_path / "out")]
    before, shot = server.state.requests, _snapshot(cache)
    common = [job, "--limit", LIMIT, "--model", "fake", "--base-url", server.url,
              "--cache-dir", cache]
    for command in (["rescore", *common, "--out", tmp_path / "rescored"],
                    ["report", *common, "--out", tmp_path / "reported"],
                    ["plan", *common], ["status", *common, "--out", tmp_path / "out"],
                    ["cache", "export", tmp_path / "copy.jsonl", "--cache-dir", cache],
                    ["cache", "stats", "--cache-dir", cache]):
        done = _judge(*command)
        assert done.exit_code == 0, (command, done.output)
    for name in ("rescored", "reported"):
        assert judgments(tmp_path / name) == made
    assert len((tmp_path / "copy.jsonl").read_bytes().splitlines()) == LIMIT
    assert f"{LIMIT}/{LIMIT} tasks cached" in _judge("status", *common).output
    assert _judge("cache", "check", "--cache-dir", cache).exit_code == 0
    assert _snapshot(cache) == shot  # no journal, no -wal or -shm, not a byte changed
    assert server.state.requests == before


def test_a_command_that_must_write_a_read_only_folder_is_one_error_line(
        unwritable: tuple[Path, Path, list[Any]], server: ThreadedServer) -> None:
    _, cache, args = unwritable
    before, shot = server.state.requests, _snapshot(cache)
    for command in (args, [*args, "--refresh-damaged"],
                    ["cache", "check", "--cache-dir", cache, "--drop"]):
        done = _judge(*command)
        assert done.exit_code == 2, done.output
        line = _error_line(done.output)
        assert line.startswith(f"Error: {cache}: the cache folder is not writable; "), line
        assert "rescore, report, plan, status, cache export and run --offline read it as it is" \
            in line
    assert _snapshot(cache) == shot
    assert server.state.requests == before


@pytest.mark.slow
def test_a_killed_reader_process_is_read_for_in_place_and_nothing_is_lost(
        filled: tuple[Path, Path, list[Any]], server: ThreadedServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A large cached-first run (the thresholds down to this job: reader processes for the
    cached pass, the pool's lookups and the judging of what it called), each reader killed
    with SIGKILL after its first reply, with requests in flight."""
    from runner.execute.store import backend
    from runner.execute.store.cache import Cache

    _, cache, args = filled
    keys = [j["key"] for j in judgments(tmp_path / "out")]  # in task order
    with Cache(cache) as c:  # a hole in the middle: the rest goes through the pool
        hole = keys[4:7]
        assert all(c._store.delete(key) for key in hole)
    monkeypatch.setattr(session_run, "CACHED_FIRST_TASKS", 1)
    monkeypatch.setattr(reader_module, "MIN_TASKS", 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1}, raising=False)
    monkeypatch.setattr(judgments_module, "READ_BATCH", 2)
    monkeypatch.setattr(backend, "LOOKUP_BATCH", 2)
    pipelined, killed = reader_module.Reader._pipelined, []

    def killing(self: reader_module.Reader, *a: Any, **k: Any) -> Any:
        for n, got in enumerate(pipelined(self, *a, **k)):
            if n == 0:
                os.kill(self._child.process.pid, signal.SIGKILL)
                self._child.process.wait(timeout=30)
                killed.append(self._child.process.pid)
            yield got

    monkeypatch.setattr(reader_module.Reader, "_pipelined", killing)
    before = server.state.requests
    done = _judge(*args)
    assert done.exit_code == 0, done.output
    assert len(killed) >= 2, killed  # the cached pass's reader, and the one judging the pool's
    assert server.state.requests - before == len(hole)  # nothing bought twice, none lost
    lines = judgments(tmp_path / "out")
    assert sorted(j["key"] for j in lines) == sorted(keys)
    assert all(j["error"] is None and j["score"] is not None for j in lines)
    counts = manifest(tmp_path / "out")["counts"]
    assert (counts["cache_hits"], counts["api_calls"]) == (LIMIT - len(hole), len(hole))


def _stored_bodies(cache: Path, state: Any) -> set[str]:
    """The server's keys of the request bodies whose answers the cache folder holds, in
    SQLite or in its journals (read without writing: the disk may be full)."""
    from runner.execute.store.journal import unfolded

    raws = [raw for _, raw in unfolded(cache)]
    with sqlite3.connect(f"file:{cache / 'cache.db'}?immutable=1", uri=True) as con:
        raws += [bytes(row[0]) for row in con.execute("SELECT value FROM Cache")]
    return {state.body_key(orjson.loads(raw)["request"]) for raw in raws}


def test_answers_sqlite_refuses_to_fold_are_read_from_their_journal_not_bought_again(
        filled: tuple[Path, Path, list[Any]], server: ThreadedServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed run's journal that SQLite cannot take (a disk still full: diskcache opened,
    its inserts refused) is read where it is: the rerun buys none of its answers."""
    from runner.execute.store import table
    from runner.execute.store.cache import Cache
    from runner.execute.store.journal import Journal

    _, cache, args = filled
    with Cache(cache) as c:
        keys = sorted(c.keys())[:5]
        rows = sorted(c.get_many_raw(keys).items())
        assert all(c._store.delete(key) for key in keys)
        journal = Journal(cache)  # as a killed run leaves it
        journal.append(rows)
        journal.close(remove=False)

    def full(db: Any, store: Any, chunk: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(table, "write", full)  # every chunk Cache.put_raw writes
    before = server.state.requests
    done = _judge(*args)
    assert done.exit_code == 0, done.output
    assert server.state.requests == before
    lines = judgments(tmp_path / "out")
    assert len(lines) == LIMIT and all(j["error"] is None for j in lines)
    assert [p.name for p in (cache / "journal").iterdir()] == [journal.path.name]  # kept


def test_enospc_from_the_journals_write_holds_the_answers_until_it_has_room(
        server: ThreadedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The full disk of tests/test_disk_full.py where no tmpfs can be mounted: the journal's
    write call refuses with ENOSPC once ~20 KB are written, three times, then takes
    everything (space freed): the run holds what it received, says so once, and goes on."""
    import errno

    from runner.execute.store import journal as journal_module

    tasks, room, refusals = 60, [20_000], [0]
    real = os.write

    def write(fd: int, data: Any) -> int:
        if "/journal/" in os.readlink(f"/proc/self/fd/{fd}") and refusals[0] < 3:
            if len(data) > room[0]:
                refusals[0] += 1
                raise OSError(errno.ENOSPC, "No space left on device")
            room[0] -= len(data)
        return real(fd, data)

    monkeypatch.setattr(journal_module.os, "write", write)
    job, cache = write_job(tmp_path / "job", JOB), tmp_path / "cache"
    args = ["run", job, "--limit", tasks, "--base-url", server.url, "--model", "fake",
            "--cache-dir", cache, "--out", tmp_path / "out", "--yes"]
    done = _judge(*args)
    assert done.exit_code == 0, done.output
    assert refusals[0] == 3
    assert done.output.count(f"cache disk full at {cache}: free space; the run continues by "
                             "itself (Ctrl-C to stop, nothing is lost)") == 1, done.output
    assert f"cache disk at {cache}: room again, " in done.output
    assert server.state.requests == tasks
    assert all(n == 1 for n in server.state.bodies.values())
    assert len(_stored_bodies(cache, server.state)) == tasks
    assert all(j["error"] is None for j in judgments(tmp_path / "out"))


# The real `judge` in a fresh interpreter (one thread: a cached-first run forks its expanders,
# then spawns reader processes for the pool's lookups and for judging what it called), with
# the thresholds down to this small job.
SMALL_THRESHOLDS = """import os, sys
import runner.cli.main as m
import runner.session.run as run
import runner.execute.store.backend as b
import runner.execute.store.reader as r
import runner.reduce.judgments as j
run.CACHED_FIRST_TASKS, r.MIN_TASKS, b.LOOKUP_BATCH, j.READ_BATCH = 1, 1, 2, 2
os.sched_getaffinity = lambda _: {0, 1}
sys.argv[0] = "judge"
m.main()
"""


def _readers(parent: int) -> list[int]:
    """The pids of the reader processes `parent` spawned and that are still running."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # not a process, or gone
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"runner.execute.store.reader" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_a_reader_process_killed_during_a_cached_first_run_costs_nothing(
        filled: tuple[Path, Path, list[Any]], server: ThreadedServer, tmp_path: Path,
        data_dir: Path) -> None:
    """kill -9 of the reader process that looks keys up for the pool while it calls a hole
    of uncached tasks: the run goes on, reads the rest itself, and exits as usual."""
    import sys

    from runner.execute.store.cache import Cache

    _, cache, args = filled
    keys = sorted(j["key"] for j in judgments(tmp_path / "out"))
    with Cache(cache) as c:
        hole = keys[2:10]
        assert all(c._store.delete(key) for key in hole)
    server.state.script.latency_s = 0.3  # the pool's lookups last while it calls
    before = server.state.requests
    proc = subprocess.Popen([sys.executable, "-c", SMALL_THRESHOLDS, *map(str, args[:-1]),
                             "--concurrency", "1", "--yes"], env=clean_env(data_dir),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline, killed = time.monotonic() + 30, 0
        while not killed and proc.poll() is None and time.monotonic() < deadline:
            if server.state.requests > before and (readers := _readers(proc.pid)):
                os.kill(readers[0], signal.SIGKILL)
                killed = readers[0]
            time.sleep(0.01)
        assert killed, "no reader process came while the pool called"
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    assert server.state.requests - before == len(hole)
    lines = judgments(tmp_path / "out")
    assert sorted(j["key"] for j in lines) == keys
    assert all(j["error"] is None for j in lines)


def test_a_read_only_open_beside_a_live_writer_reads_what_it_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A -wal file says a writer may be at work: the read-only open takes SQLite's locks
    (mode=ro) and reads what the writer committed there, which immutable would not see."""
    from runner.execute.store.cache import Cache

    folder = tmp_path / "cache"
    with Cache(folder) as writer:
        writer.put_many((f"k{i}", {"response": {}, "i": i}) for i in range(50))
        assert (folder / "cache.db-wal").exists()
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, mode, **k: False if mode & os.W_OK
                            and Path(p).is_relative_to(folder) else real(p, mode, **k))
        with Cache(folder, read_only=True) as reader:
            assert reader.read_only
            assert reader.has_many([f"k{i}" for i in range(60)]) == {f"k{i}" for i in range(50)}
            assert reader.get("k7") == {"response": {}, "i": 7}
            with pytest.raises(CacheError, match="the cache folder is not writable"):
                reader.put("k99", {"response": {}})
