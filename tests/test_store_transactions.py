"""A SQLite write transaction of a cache folder that fails (a lock held too long, its COMMIT's
too) is one CacheError naming the file and the fix, and leaves its connection usable for the
next one: the claim table (runner/execute/store/claimtable.py) and the batch ledger
(runner/execute/ledger.py), against real files and a real second connection holding the lock."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from runner.errors import CacheError
from runner.execute import ledger
from runner.execute.ledger import Ledger
from runner.execute.store import claimtable
from runner.execute.store.claimtable import FolderClaims, Owner

SHORT_MS = 200  # the busy timeout these tests give: a held lock fails at once


def test_a_claim_whose_commit_fails_is_rolled_back_and_the_next_claim_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """claims.db keeps a rollback journal: a reader's shared lock lets a claim begin and write
    but not commit. The failed COMMIT is a CacheError, and the transaction it left is rolled
    back: the next claim begins one (it was "cannot start a transaction within a
    transaction" for the rest of the run) and the failed claim holds nothing."""
    monkeypatch.setattr(claimtable, "BUSY_MS", SHORT_MS)
    claims, owner = FolderClaims(tmp_path), Owner()
    reader = sqlite3.connect(tmp_path / "claims.db", isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM claim").fetchall()  # holds a shared lock
        with pytest.raises(CacheError) as failed:
            claims.claim(["k1"], owner, 60)
        assert str(failed.value).startswith(f"{tmp_path / 'claims.db'}: cannot store the claims "
                                            "of this run (database is locked); check the cache")
        reader.execute("ROLLBACK")
        assert claims.claim(["k2"], owner, 60) == {"k2"}
        assert claims.claim(["k1"], Owner(run="other"), 60) == {"k1"}  # the failed one's not held
    finally:
        reader.close()
        claims.close()


def test_a_ledger_locked_by_another_process_is_one_error_and_usable_once_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another connection holding BEGIN IMMEDIATE on batches.sqlite past the busy timeout: the
    ledger's write is a CacheError naming the file and the fix (it was a raw sqlite3
    OperationalError, a traceback at the CLI), after the cache's busy timeout (here shortened;
    sqlite3's default was 5 s); once the lock goes, the same ledger writes."""
    monkeypatch.setattr(ledger, "BUSY_MS", SHORT_MS)
    book = Ledger(tmp_path)
    book.reserve(file_id="f1", job="j", model="m", endpoint="e", keys=["k1"])
    holder = sqlite3.connect(tmp_path / "batches.sqlite", isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another judge process writing, never ending
        started = time.monotonic()
        with pytest.raises(CacheError) as failed:
            book.attach("f1", "batch-1", "validating")
        assert time.monotonic() - started < 4  # the timeout given, not sqlite3's default 5 s
        assert str(failed.value) == (
            f"{tmp_path / 'batches.sqlite'}: cannot write the batch ledger (database is "
            "locked); another judge process is using it: let it end (or stop it), then rerun")
        holder.execute("ROLLBACK")
        book.attach("f1", "batch-1", "validating")
        assert [(r.file_id, r.batch_id) for r in book.rows()] == [("f1", "batch-1")]
    finally:
        holder.close()
        book.close()
