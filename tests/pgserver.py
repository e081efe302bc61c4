"""A private PostgreSQL cluster on 127.0.0.1 for the tests and benchmarks, from Debian's packages.

`with PgCluster() as pg: pg.url` runs initdb in a temporary folder (owned by the `postgres` user
when we are root: the server refuses to run as root), starts it with pg_ctl on a free port with
trust auth and its unix socket inside that folder, and stops and removes it afterwards.
`find_bindir()` is None when PostgreSQL is not installed (tests skip then, except under CI).
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

START_TIMEOUT_S = 30


def find_bindir() -> Path | None:
    """The server's bin dir (initdb, pg_ctl): pg_config --bindir, else /usr/lib/postgresql/*."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                             timeout=10, check=False).stdout.strip()
        candidates.insert(0, out)
    for c in candidates:
        if c and (Path(c) / "initdb").is_file() and (Path(c) / "pg_ctl").is_file():
            return Path(c)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """A throwaway PostgreSQL server; `url` is a libpq URL for its `postgres` database."""

    def __init__(self, bindir: Path | None = None) -> None:
        found = bindir or find_bindir()
        if found is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self.bindir = found
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="judge-pg-"))
        self.data = self.root / "data"
        self.as_postgres = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=START_TIMEOUT_S * 2)

    def __enter__(self) -> PgCluster:
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        try:
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                      "-E", "UTF8", "--no-sync")
            # fsync off: a test cluster is thrown away; durability is not what is tested.
            options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} "
                       f"-c unix_socket_directories={self.root} -c fsync=off "
                       "-c max_connections=50")
            self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l",
                      str(self.root / "log"), "-w", "-t", str(START_TIMEOUT_S), "start")
        except BaseException:
            self.remove()
            raise
        return self

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def __exit__(self, *exc: object) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            self.remove()


# ---------------------------------------------------------------- pytest fixtures (conftest)

_databases = itertools.count()


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One PostgreSQL server for the session; skipped when not installed, except under CI."""
    if find_bindir() is None:
        reason = "PostgreSQL is not installed (apt-get install postgresql)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason}: .ci/run installs it, so CI must have it")
        pytest.skip(reason)
    with PgCluster() as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    """A fresh, empty database on the session's server, as a URL."""
    name = f"t{os.getpid()}_{next(_databases)}"
    with psycopg.connect(pg_cluster.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]
    return pg_cluster.url.rsplit("/", 1)[0] + "/" + name
