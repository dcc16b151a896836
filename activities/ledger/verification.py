"""The verification schedule in SQL: the rules of ``mcpsync.workflows.verification_rules`` on the fence row.

Contract:
- ``record_allocation`` runs in a granted allocation's transaction (``FenceLedger.allocate_read``, the
  row locked): a scheduled row (ACTIVE, with a safety-read period) records the verification
  (``verified_at``), widens ``worst_gap_seconds`` by the gap since the previous one (not by a gap the
  watchdog reported open already) and is due again ``verification_delay`` later. ``start_chain``
  runs in ``mark_active``'s: a new subscription generation's first read has no predecessor, and the
  row is due within ``claim_delay`` if that read does not land.
- ``due`` is the ingress's sweep: the due rows of one (subject, server) through the partial index
  ``subscriptions_verify_due``, each claimed (due again ``claim_delay`` later) in the same
  transaction, rows locked by a running allocation skipped; and how long until the next row is due.
- ``watch`` is the watchdog's local activity (``ledger_watch_verifications``): ``judge_watch`` on the
  locked row; a breach not reported before is recorded in the same transaction (an ``overdue``
  outbox event and a ``VERIFICATION_OVERDUE`` audit row); the widest gap restarts from 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row
from temporalio import activity

from mcpsync.activities.ledger.journal import Journal
from mcpsync.activities.ledger.store import BY_KEY, LedgerStore
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import OutboxEventType, WatchRequest, WatchResult
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState
from mcpsync.workflows.verification_rules import (
    claim_delay,
    judge_watch,
    overdue_gap_seen,
    verification_delay,
)

__all__ = ["Due", "VerificationLedger", "record_allocation", "start_chain"]

ACTIVE = SubscriptionState.ACTIVE.value


async def record_allocation(cur: Any, row: dict[str, Any]) -> None:
    """A granted allocation of ``row`` (locked, as it stood before the grant) is a verification. The
    gap it closes widens ``worst_gap_seconds`` unless the watchdog reported it open already
    (``overdue_gap_seen``)."""
    period = row["safety_read_seconds"]
    if row["state"] != ACTIVE or period is None:
        return
    reported = overdue_gap_seen(verified_at=row["verified_at"], watched_at=row["watched_at"],
                                period_seconds=float(period))
    await cur.execute(
        """
        UPDATE subscriptions SET
            worst_gap_seconds = CASE WHEN %s THEN worst_gap_seconds ELSE GREATEST(worst_gap_seconds,
                COALESCE(EXTRACT(EPOCH FROM now() - verified_at)::float8, 0)) END,
            verified_at = now(), verify_due_at = now() + make_interval(secs => %s)
        WHERE workflow_id = %s
        """,
        (reported, verification_delay(float(period), random.random()), row["workflow_id"]),
    )


async def start_chain(cur: Any, row: dict[str, Any]) -> None:
    """``mark_active`` made ``row`` (as it stands after) ACTIVE on a new subscription generation: a
    new chain, due within ``claim_delay`` unless its first read re-arms it."""
    period = row["safety_read_seconds"]
    await cur.execute(
        "UPDATE subscriptions SET verified_at = NULL, worst_gap_seconds = 0, watched_at = NULL,"
        " verify_due_at = now() + make_interval(secs => %s) WHERE workflow_id = %s",
        (claim_delay(float(period)) if period is not None else None, row["workflow_id"]),
    )


@dataclass(frozen=True, slots=True)
class Due:
    """A sweep's answer: the URIs due now (claimed), and seconds until the next row is due (None:
    none is scheduled)."""

    uris: list[str]
    next_in: float | None


class VerificationLedger:
    def __init__(self, store: LedgerStore, *, journal: Journal) -> None:
        self.store = store
        self.journal = journal

    def activities(self) -> list[Callable[..., Any]]:
        return [self.watch]

    async def due(self, subject: str, server: str, *, limit: int = 500) -> Due:
        """The sweep of one (subject, server) (module contract)."""
        async with self.store.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(
                """
                SELECT workflow_id, uri, safety_read_seconds FROM subscriptions
                WHERE subject = %s AND server = %s AND state = %s AND safety_read_seconds IS NOT NULL
                  AND verify_due_at <= now()
                ORDER BY verify_due_at LIMIT %s FOR UPDATE SKIP LOCKED
                """,
                (subject, server, ACTIVE, limit),
            )
            rows = await cur.fetchall()
            if rows:
                await conn.execute(
                    """
                    UPDATE subscriptions s SET verify_due_at = now() + make_interval(secs => c.delay)
                    FROM unnest(%s::text[], %s::float8[]) AS c(workflow_id, delay)
                    WHERE s.workflow_id = c.workflow_id
                    """,
                    ([r[0] for r in rows], [claim_delay(float(r[2])) for r in rows]),
                )
            cur = await conn.execute(
                """
                SELECT EXTRACT(EPOCH FROM min(verify_due_at) - now())::float8 FROM subscriptions
                WHERE subject = %s AND server = %s AND state = %s AND safety_read_seconds IS NOT NULL
                """,
                (subject, server, ACTIVE),
            )
            nxt = await cur.fetchone()
        next_in = None if nxt is None or nxt[0] is None else max(0.0, float(nxt[0]))
        return Due(uris=[r[1] for r in rows], next_in=next_in)

    @activity.defn(name=Act.WATCH_VERIFICATIONS)
    async def watch(self, req: WatchRequest) -> WatchResult:
        """The watchdog's look (module contract)."""
        key: SubscriptionKey = req.key
        async with self.store.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(f"SELECT *, now() AS db_now FROM subscriptions WHERE {BY_KEY} FOR UPDATE",
                              (key.subject, key.server, key.uri))
            row = await cur.fetchone()
            if row is None or row["state"] != ACTIVE or row["safety_read_seconds"] is None:
                return WatchResult(scheduled=False)
            period = float(row["safety_read_seconds"])
            j = judge_watch(verified_at=row["verified_at"], worst_gap_seconds=float(row["worst_gap_seconds"]),
                            watched_at=row["watched_at"], now=row["db_now"], period_seconds=period)
            outbox_id = None
            if j.report:
                detail = {"widest_gap_seconds": round(j.widest_gap_seconds, 3), "period_seconds": period,
                          "verified_at": row["verified_at"].isoformat() if row["verified_at"] else None,
                          "overdue_now": j.overdue_now}
                outbox_id = await self.journal.insert_outbox(
                    cur, OutboxEventType.OVERDUE, key, workflow_id=row["workflow_id"],
                    receipt_id=row["last_receipt_id"], content_digest=row["last_accepted_digest"],
                    ordinal=int(row["last_issued_ordinal"]), detail=detail)
                await self.journal.insert_audit(
                    cur, "VERIFICATION_OVERDUE", subject=key.subject, server=key.server, uri=key.uri,
                    workflow_id=row["workflow_id"], session_generation=row["session_generation"],
                    detail=detail)
            await cur.execute("UPDATE subscriptions SET worst_gap_seconds = 0, watched_at = now()"
                              " WHERE workflow_id = %s", (row["workflow_id"],))
        return WatchResult(scheduled=True, verified_at=row["verified_at"],
                           widest_gap_seconds=j.widest_gap_seconds, period_seconds=period,
                           breached=j.breached, overdue_now=j.overdue_now,
                           outbox_id=outbox_id)
