"""One SQLite write transaction, the same for the answers' table, the claim table and the batch
ledger: what it buys is one rule for a failure, a failed COMMIT included (a lock, a full disk):
rolled back, so the connection takes the next transaction, where a transaction left open made
every later BEGIN fail ("cannot start a transaction within a transaction")."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

__all__ = ["transaction"]


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT on `db` (opened with isolation_level=None); on any error, its
    COMMIT's too, a best-effort ROLLBACK, then the error goes on.

    Args:
        db: the connection, outside a transaction.

    Returns:
        The context of the transaction's statements.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # the error that led here says more
                db.execute("ROLLBACK")
        raise
