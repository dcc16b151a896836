"""Read-only views of the ledger for tests, benchmarks and diagnostics.

Contract: queries only, never a write, never a body. Not for consumers: ``outbox_after`` pages by
id, and id order is not commit order (a row can be skipped for good); consumers use
``mcpsync.activities.ledger.outbox`` (positions; docs/outbox.md).
"""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from mcpsync.activities.ledger.store import BY_KEY, LedgerStore, jsonable, key_params
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import CacheScope, SubscriptionKey, TriggerReason
from mcpsync.workflows.records.versioned import ResourceVersionV1

__all__ = ["LedgerReports", "OutboxRow", "AuditRow"]


class OutboxRow(dict[str, Any]):
    """One invalidation outbox row (plain dict for JSON output)."""


class AuditRow(dict[str, Any]):
    """One audit row (plain dict for JSON output)."""


class LedgerReports:
    def __init__(self, store: LedgerStore) -> None:
        self.store = store

    async def outbox_after(self, after_id: int = 0, limit: int = 100) -> list[OutboxRow]:
        """Rows by id, for tests and diagnostics only (see the module contract)."""
        async with self.store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT * FROM outbox WHERE outbox_id > %s ORDER BY outbox_id LIMIT %s", (after_id, limit)
            )
            return [OutboxRow(jsonable(r)) for r in await cur.fetchall()]

    async def audit_rows(self, kind: str | None = None, limit: int = 100) -> list[AuditRow]:
        """The newest audit rows first, of one kind or all."""
        async with self.store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            if kind is None:
                await cur.execute("SELECT * FROM audit ORDER BY audit_id DESC LIMIT %s", (limit,))
            else:
                await cur.execute(
                    "SELECT * FROM audit WHERE kind=%s ORDER BY audit_id DESC LIMIT %s", (kind, limit)
                )
            return [AuditRow(jsonable(r)) for r in await cur.fetchall()]

    async def receipts(self, key: SubscriptionKey) -> list[ResourceVersionV1]:
        """Every ``resourceVersion.v1`` receipt of one subscription, oldest first."""
        async with self.store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            # Receipts carry the id the subscription's row recorded (an older scheme's included).
            await cur.execute(
                "SELECT * FROM resource_versions WHERE workflow_id ="
                f" (SELECT workflow_id FROM subscriptions WHERE {BY_KEY}) ORDER BY receipt_id",
                key_params(key),
            )
            rows = await cur.fetchall()
        return [
            ResourceVersionV1(
                receipt_id=r["receipt_id"], uri=r["uri"], mime_type=r["mime_type"],
                content_digest=r["content_digest"], read_ordinal=r["read_ordinal"], subject=r["subject"],
                server=r["server"], server_name=r["server_name"], server_version=r["server_version"],
                edition=r["edition"], session_generation=r["session_generation"],
                subscription_generation=r["subscription_generation"], request_id=r["request_id"],
                trigger=TriggerReason(r["trigger_reason"]), status=AcceptVerdict(r["status"]),
                accepted_at=r["accepted_at"], ttl_ms=r["ttl_ms"],
                cache_scope=CacheScope(r["cache_scope"]) if r["cache_scope"] else None,
            )
            for r in rows
        ]

    async def read_count(self, key: SubscriptionKey) -> int:
        """How many reads the fence issued for one subscription."""
        async with self.store.pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM read_requests WHERE workflow_id ="
                                     f" (SELECT workflow_id FROM subscriptions WHERE {BY_KEY})",
                                     key_params(key))
            row = await cur.fetchone()
        return int(row[0]) if row else 0
