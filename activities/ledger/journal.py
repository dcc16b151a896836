"""The ledger's journal: the audit log and the invalidation outbox.

Contract:
- ``audit`` appends one row (kind, the subscription it concerns, a JSON detail); activity
  ``ledger_audit`` is the workflow's way to it. Audit rows never hold a body.
- The outbox is written only inside a fenced transaction of ``mcpsync.activities.ledger.fence`` (the
  write plan's ``OutboxPlan``): ``insert_outbox`` and ``insert_audit`` take that transaction's
  cursor. ``withdrawn`` lists what a tombstone or a revocation withdraws (every receipt of the
  subscription and the digests they name, ``outboxEvent.v1`` ``invalidates``).
- A staged rollout (``rollout_policies``; no row means ALL,
  ``mcpsync.workflows.catalog_rules.refresh_enabled``) decides whether a gated
  invalidation is published; a held one leaves an audit row instead.
- Consumers read the outbox through ``mcpsync.activities.ledger.outbox`` (positions, not ids; docs/outbox.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from psycopg.rows import dict_row
from temporalio import activity

from mcpsync.activities.ledger.store import LedgerStore, recorded_workflow_id
from mcpsync.workflows.catalog_rules import refresh_enabled
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.catalog import RolloutMode, RolloutPolicy
from mcpsync.workflows.records.ledger import AuditRequest, OutboxEventType
from mcpsync.workflows.records.subscription import SubscriptionKey

__all__ = ["Journal"]


class Journal:
    def __init__(self, store: LedgerStore) -> None:
        self.store = store

    def activities(self) -> list[Callable[..., Any]]:
        return [self.record_audit]

    async def audit(
        self,
        kind: str,
        *,
        subject: str | None = None,
        server: str | None = None,
        uri: str | None = None,
        workflow_id: str | None = None,
        session_generation: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> int:
        async with self.store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            return await self.insert_audit(cur, kind, subject=subject, server=server, uri=uri,
                                           workflow_id=workflow_id, session_generation=session_generation,
                                           detail=detail)

    @activity.defn(name=Act.AUDIT)
    async def record_audit(self, req: AuditRequest) -> int:
        k = req.key
        async with self.store.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            # The id the subscription's row recorded (an older
            # scheme's included), not one computed from the key.
            return await self.insert_audit(cur, req.kind, subject=k.subject, server=k.server, uri=k.uri,
                                           workflow_id=await recorded_workflow_id(cur, k),
                                           session_generation=req.session_generation, detail=dict(req.detail))

    # --- inside a fenced transaction ---------------------------------------------------------

    @staticmethod
    async def insert_audit(cur: Any, kind: str, *, subject: str | None = None, server: str | None = None,
                           uri: str | None = None, workflow_id: str | None = None,
                           session_generation: int | None = None,
                           detail: dict[str, Any] | None = None) -> int:
        await cur.execute(
            """
            INSERT INTO audit (kind, subject, server, uri, workflow_id, session_generation, detail)
            VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING audit_id
            """,
            (kind, subject, server, uri, workflow_id, session_generation, json.dumps(detail or {})),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row["audit_id"])

    @staticmethod
    async def insert_outbox(cur: Any, event: OutboxEventType, key: SubscriptionKey, *, workflow_id: str,
                            receipt_id: int | None, content_digest: str | None, ordinal: int,
                            detail: dict[str, Any]) -> int:
        """One outbox row of the subscription of ``key``, under ``workflow_id``: the id its row recorded."""
        # A revocation's row is stamped when it is written, not when its transaction began: the
        # revocation latency (effective_at -> created_at) must never come out negative.
        created_at = "clock_timestamp()" if event == OutboxEventType.REVOKED else "now()"
        await cur.execute(
            f"""
            INSERT INTO outbox (event_type, workflow_id, subject, server, uri, receipt_id, content_digest,
                read_ordinal, detail, created_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, {created_at}) RETURNING outbox_id
            """,
            (event.value, workflow_id, key.subject, key.server, key.uri, receipt_id, content_digest, ordinal,
             json.dumps(detail)),
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row["outbox_id"])

    @staticmethod
    async def withdrawn(cur: Any, workflow_id: str) -> tuple[list[int], list[str]]:
        """Every receipt of a subscription and the digests they name: what a tombstone or a
        revocation withdraws (``outboxEvent.v1`` ``invalidates``)."""
        await cur.execute(
            "SELECT receipt_id, content_digest FROM resource_versions WHERE workflow_id=%s"
            " ORDER BY receipt_id",
            (workflow_id,))
        receipts = await cur.fetchall()
        return [r["receipt_id"] for r in receipts], sorted({r["content_digest"] for r in receipts
                                                             if r["content_digest"]})

    @staticmethod
    async def rollout_allows(cur: Any, key: SubscriptionKey) -> bool:
        """The staged rollout (``mcpsync.workflows.catalog_rules.refresh_enabled``);
        no policy row means ALL."""
        await cur.execute("SELECT mode, percent FROM rollout_policies WHERE server=%s", (key.server,))
        row = await cur.fetchone()
        if row is None:
            return True
        policy = RolloutPolicy(server=key.server, mode=RolloutMode(row["mode"]), percent=row["percent"])
        return refresh_enabled(policy, key.subject, key.server, key.uri)
