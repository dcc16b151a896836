"""The store every ledger concern is built from: the PostgreSQL pool, and the fence row's shape.

Contract:
- ``LedgerStore`` holds the one connection pool (autocommit; a method that writes more than one
  statement opens its own transaction). The concerns (``ledger_sessions``, ``ledger_fence``,
  ``ledger_content``, ``ledger_journal``, ``ledger_reports``) each take a store and share
  nothing else, so one process has one pool however many concerns it builds.
- ``snapshot`` turns a ``subscriptions`` row into the ``FenceSnapshot`` the fence rules take;
  ``fence_row`` reads it, optionally ``FOR UPDATE`` (every fenced write locks the row first).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from workflows.records import FenceSnapshot, SubscriptionState

__all__ = ["LedgerStore", "snapshot", "fence_row", "jsonable"]


class LedgerStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool


def snapshot(row: dict[str, Any] | None) -> FenceSnapshot:
    """The fence rules' view of a ``subscriptions`` row (``exists=False`` for no row)."""
    if row is None:
        return FenceSnapshot(exists=False)
    return FenceSnapshot(
        exists=True,
        state=SubscriptionState(row["state"]),
        session_generation=row["session_generation"],
        subscription_generation=row["subscription_generation"],
        last_issued_ordinal=row["last_issued_ordinal"],
        last_accepted_ordinal=row["last_accepted_ordinal"],
        watermark=row["watermark"],
        close_epoch=row["close_epoch"],
        close_ordinal=row["close_ordinal"],
        last_accepted_digest=row["last_accepted_digest"],
        last_receipt_id=row["last_receipt_id"],
        notifications_seen=row["notifications_seen"],
    )


async def fence_row(cur: Any, workflow_id: str, *, lock: bool = False) -> dict[str, Any] | None:
    """The ``subscriptions`` row on a ``dict_row`` cursor; ``lock``: held until the transaction ends."""
    await cur.execute("SELECT * FROM subscriptions WHERE workflow_id=%s" + (" FOR UPDATE" if lock else ""),
                      (workflow_id,))
    row: dict[str, Any] | None = await cur.fetchone()
    return row


def jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its timestamps as ISO strings (JSON output of diagnostics)."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}
