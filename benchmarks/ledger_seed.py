"""Ledger rows as the read cycle leaves them, written straight into the ledger (no upstream, no
Temporal): for benchmarks and tests of what reads the ledger (``mcpsync serve``).

Contract: ``seed_version`` writes one subscription of ``subject`` in ``state`` with one ACCEPTED
receipt of ``body`` (text/markdown, its digest by ``content_digest``), the body in the content store
and the receipt's ``version_accepted`` outbox row, in one transaction; it returns the receipt id.
``emit_event`` writes one more ``version_accepted`` outbox row for that subscription.
"""

from __future__ import annotations

import uuid
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from mcpsync.workflows.digest import ContentPart, content_digest

__all__ = ["emit_event", "seed_version"]

MIME = "text/markdown"


async def seed_version(pool: AsyncConnectionPool, subject: str, server: str, state: str, uri: str,
                       body: bytes) -> int:
    digest = content_digest([ContentPart("text", MIME, body)])
    wf = f"seed-{uuid.uuid4().hex}"
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(
            "INSERT INTO subscriptions (workflow_id, subject, server, uri, uri_normalized, state,"
            " last_issued_ordinal, last_accepted_ordinal) VALUES (%s, %s, %s, %s, %s, %s, 1, 1)",
            (wf, subject, server, uri, uri, state))
        cur = await conn.execute(
            "INSERT INTO resource_versions (workflow_id, subject, server, uri, mime_type, content_digest,"
            " size, read_ordinal, session_generation, subscription_generation, request_id, trigger_reason,"
            " status) VALUES (%s, %s, %s, %s, %s, %s, %s, 1, 1, 1, %s, 'poll', 'ACCEPTED')"
            " RETURNING receipt_id", (wf, subject, server, uri, MIME, digest, len(body), f"rq-{wf}"))
        row = await cur.fetchone()
        assert row is not None
        receipt = int(row[0])
        await conn.execute(
            # The receipt counted on the row as the accept counts it (``store.RECEIPT_COUNTED``; no
            # read: its own time).
            "UPDATE subscriptions SET last_receipt_id = %s, last_accepted_digest = %s,"
            " receipt_counts = '{\"ACCEPTED\": 1}', content_read_at = now() WHERE workflow_id = %s",
            (receipt, digest, wf))
        await conn.execute(
            "INSERT INTO content_store (subject, content_digest, mime_type, kind, size, body)"
            " VALUES (%s, %s, %s, 'text', %s, %s) ON CONFLICT DO NOTHING",
            (subject, digest, MIME, len(body), body))
        await emit_event(conn, receipt)
    return receipt


async def emit_event(conn: AsyncConnection[Any], receipt: int) -> None:
    """One ``version_accepted`` outbox row for ``receipt`` (on ``conn``, a psycopg async connection)."""
    await conn.execute(
        "INSERT INTO outbox (event_type, workflow_id, subject, server, uri, content_digest, read_ordinal,"
        " receipt_id, detail) SELECT 'version_accepted', workflow_id, subject, server, uri, content_digest,"
        " read_ordinal, receipt_id, '{}'::jsonb FROM resource_versions WHERE receipt_id = %s", (receipt,))
