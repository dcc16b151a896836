"""Operator views of the ledger: the subscriptions table, one subscription's receipts and audit rows.

Contract:
- Read-only. The ``subscriptions`` fence rows are the source of truth for what exists;
  these queries never write and never return a resource body.
- ``list_subscriptions`` filters by server, subject and state (any of several), ordered by
  (server, subject, uri); each row carries what ``activities/ledger/proven.py`` proves about its version:
  ``last_accepted_at`` and ``accepted_receipt_id`` (the accepted version's receipt, status ACCEPTED),
  ``last_verified_at`` (the newest read that saw its digest) and ``dirty`` (the level rule).
- ``subscription_history`` returns the newest ``limit`` receipts and audit rows of one
  subscription, oldest first, each a plain JSON-able dict with a ``kind`` of ``receipt`` or
  ``audit`` and an ``at`` timestamp, so one sorted list tells what happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from mcpsync.activities.ledger.proven import PROVEN_COLUMNS, PROVEN_JOIN, proven_from_row

__all__ = ["SUBSCRIPTION_COLUMNS", "list_subscriptions", "subscription_history"]

SUBSCRIPTION_COLUMNS = (
    "workflow_id", "subject", "server", "uri", "state", "session_generation", "subscription_generation",
    "last_issued_ordinal", "last_accepted_ordinal", "watermark", "close_epoch", "close_ordinal",
    "last_accepted_digest", "last_receipt_id", "notifications_seen", "last_notification_at", "created_at",
    "updated_at", "verify_due_at",
)


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}


async def list_subscriptions(pool: AsyncConnectionPool, *, server: str | None = None,
                             subject: str | None = None,
                             states: Sequence[str] = (), uri: str | None = None) -> list[dict[str, Any]]:
    """Fence rows matching every given selector (None / empty: any), with ``last_accepted_at``."""
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("server", server), ("subject", subject), ("uri", uri)):
        if value is not None:
            where.append(f"s.{column} = %s")
            params.append(value)
    if states:
        where.append("s.state = ANY(%s)")
        params.append(list(states))
    sql = (f"SELECT {', '.join('s.' + c for c in SUBSCRIPTION_COLUMNS)}, {PROVEN_COLUMNS} "
           f"FROM subscriptions s {PROVEN_JOIN}"
           + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY s.server, s.subject, s.uri")
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(sql, params)  # type: ignore[arg-type]  # built from fixed column names only
        return [_jsonable(_with_proven(r)) for r in await cur.fetchall()]


def _with_proven(row: dict[str, Any]) -> dict[str, Any]:
    proven = proven_from_row(row)
    plain = {k: v for k, v in row.items() if not k.startswith("proven_")}
    return plain | {"last_accepted_at": proven.accepted_at, "accepted_receipt_id": proven.accepted_receipt_id,
                    "last_verified_at": proven.verified_at, "dirty": proven.dirty}


async def subscription_history(pool: AsyncConnectionPool, *, workflow_id: str, subject: str, server: str,
                               uri: str, limit: int = 20) -> list[dict[str, Any]]:
    """The newest ``limit`` receipts and ``limit`` audit rows of one subscription, merged oldest first.

    Audit rows written before a workflow existed (a notification for an unsubscribed URI) carry no
    workflow id: they match by (subject, server, uri)."""
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            "SELECT receipt_id, status, read_ordinal, content_digest, mime_type, size, trigger_reason,"
            " session_generation, subscription_generation, accepted_at FROM resource_versions"
            " WHERE workflow_id = %s ORDER BY receipt_id DESC LIMIT %s", (workflow_id, limit))
        receipts = [{"kind": "receipt", "at": r["accepted_at"], **r} for r in await cur.fetchall()]
        await cur.execute(
            "SELECT audit_id, kind AS audit_kind, session_generation, detail, created_at FROM audit"
            " WHERE workflow_id = %s OR (workflow_id IS NULL AND subject = %s AND server = %s AND uri = %s)"
            " ORDER BY audit_id DESC LIMIT %s", (workflow_id, subject, server, uri, limit))
        audits = [{"kind": "audit", "at": r["created_at"], **r} for r in await cur.fetchall()]
    merged = sorted(receipts + audits,
                    key=lambda r: (r["at"], r.get("receipt_id") or 0, r.get("audit_id") or 0))
    return [_jsonable(r) for r in merged]
