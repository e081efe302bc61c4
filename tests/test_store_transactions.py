"""A SQLite write transaction of a cache folder that fails (a lock held too long, its COMMIT's
too) is one CacheError naming the file and the fix, and leaves its connection usable for the
next one: the claim table (runner/execute/store/claimtable.py) and the batch ledger
(runner/execute/ledger.py), against real files and a real second connection holding the lock."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from runner.errors import CacheError
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
