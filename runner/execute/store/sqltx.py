"""One SQLite write transaction for the answers' table, the claim table and the batch ledger.
What it buys: a failure, a failed COMMIT's too, is rolled back, so the connection takes the next
transaction (left open, every later BEGIN failed: "cannot start a transaction within ...")."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

__all__ = ["BUSY_MS", "transaction"]

BUSY_MS = 60_000  # a connection waits this long for another run's transaction (they take ~ms)


@contextlib.contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT on `db` (isolation_level=None); on any error, a best-effort
    ROLLBACK, then the error goes on.

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
