"""The verification schedule in SQL: the rules of ``mcpsync.workflows.verification_rules`` on the fence row.

Contract:
- ``record_allocation`` runs in a granted allocation's transaction (``FenceLedger.allocate_read``,
  batched: ``read_batches.allocate_batch``, the row locked): a scheduled row (ACTIVE, with a
  safety-read period) records the verification
  (``verified_at``) and is due again ``verification_delay`` later, columns the allocation's own
  update writes; a gap it closes that exceeds the period and was not reported yet is reported there
  (``report_overdue``). ``mark_chain`` runs in ``mark_active``'s: a row that holds a version keeps
  its chain (``continues_chain``: the new subscription generation's first read closes the gap since
  the previous one's newest verification), any other starts a new one; either is due within
  ``claim_delay`` if that read does not land.
- ``due`` is the ingress's sweep: the due rows of one (subject, server) through the partial index
  ``subscriptions_verify_due``, each claimed (due again ``claim_delay`` later) in the same
  transaction, rows locked by a running allocation skipped; and how long until the next row is due
  (a claimed one included). Two statements: the due rows, then the claims with the next due time.
- ``watch`` is the watchdog's local activity (``ledger_watch_verifications``): ``judge_gap`` on the
  gap still open of the locked row, reported when new; the look is recorded (``watched_at``), so
  the gap is reported once, whoever finds it first.
- A report is an ``overdue`` outbox event and a ``VERIFICATION_OVERDUE`` audit row, with the gap and
  the period (metadata only).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import dict_row
from temporalio import activity

from mcpsync.activities.ledger.journal import Journal
from mcpsync.activities.ledger.store import BY_KEY, LedgerStore, looked_note
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import NotedNotification, OutboxEventType, WatchRequest, WatchResult
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState
from mcpsync.workflows.verification_rules import (
    GapJudgement,
    claim_delay,
    continues_chain,
    judge_gap,
    verification_delay,
)

__all__ = ["CLAIM_SQL", "DUE_ROWS_SQL", "Due", "VerificationLedger", "mark_chain", "record_allocation",
           "report_overdue"]

ACTIVE = SubscriptionState.ACTIVE.value
OVERDUE_AUDIT = "VERIFICATION_OVERDUE"

# The scheduled rows of one (subject, server), in the words of the partial index
# ``subscriptions_verify_due`` (migration 023): the state is a literal, so a generic plan proves the
# index's predicate too, and the due rows and the next one are read in ``verify_due_at`` order through
# it, however many rows the pair has.
_SCHEDULED = f"subject = %s AND server = %s AND state = '{ACTIVE}' AND safety_read_seconds IS NOT NULL"

DUE_ROWS_SQL = f"""
    SELECT * FROM subscriptions
    WHERE {_SCHEDULED} AND verify_due_at <= now() + make_interval(secs => %s)
    ORDER BY verify_due_at LIMIT %s FOR UPDATE SKIP LOCKED"""
"""A look's due rows, claimed (params: subject, server, ahead seconds, limit)."""

CLAIM_SQL = f"""
    WITH claimed AS (
        UPDATE subscriptions s SET verify_due_at = now() + make_interval(secs => c.delay)
        FROM unnest(%s::text[], %s::float8[]) AS c(workflow_id, delay)
        WHERE s.workflow_id = c.workflow_id)
    SELECT EXTRACT(EPOCH FROM (
        SELECT verify_due_at FROM subscriptions
        WHERE {_SCHEDULED} AND verify_due_at IS NOT NULL AND workflow_id <> ALL(%s::text[])
        ORDER BY verify_due_at LIMIT 1) - now())::float8 AS next_in"""
"""The claims (params: workflow ids, their claim delays) and, in the same statement, when the next row
the look left is due (params: subject, server, the claimed ids): its reads do not see its own UPDATE.
An ordered LIMIT 1, not ``min()``: PostgreSQL reads ``min()`` through an index only in a statement
without a WITH clause, and this one has one."""


def _key(row: dict[str, Any]) -> SubscriptionKey:
    return SubscriptionKey(subject=row["subject"], server=row["server"], uri=row["uri"])


async def report_overdue(cur: Any, row: dict[str, Any], gap: GapJudgement, *, closed: bool) -> int:
    """Record the breach ``gap`` of ``row`` (locked): the ``overdue`` outbox event's id. ``closed``: a
    verification closed the gap now (else the watchdog found it open)."""
    period = float(row["safety_read_seconds"])
    verified_at: datetime | None = row["verified_at"]
    apart = ("no verification yet" if gap.gap_seconds is None
             else f"{gap.gap_seconds:.0f} s without a verification")
    detail = {"gap_seconds": None if gap.gap_seconds is None else round(gap.gap_seconds, 3),
              "period_seconds": period, "verified_at": verified_at.isoformat() if verified_at else None,
              "closed": closed, "reason": f"{apart}, over the {period:g} s staleness bound"}
    # It names the current version (its receipt, and the watermark as its read ordinal): a consumer
    # ordering by read ordinal never takes it for a newer one.
    outbox_id = await Journal.insert_outbox(
        cur, OutboxEventType.OVERDUE, _key(row), workflow_id=row["workflow_id"],
        receipt_id=row["last_receipt_id"], content_digest=row["last_accepted_digest"],
        ordinal=int(row["watermark"]), detail=detail)
    await Journal.insert_audit(cur, OVERDUE_AUDIT, subject=row["subject"], server=row["server"],
                               uri=row["uri"], workflow_id=row["workflow_id"],
                               session_generation=row["session_generation"], detail=detail)
    return outbox_id


async def record_allocation(cur: Any, row: dict[str, Any]) -> dict[str, datetime]:
    """A granted allocation of ``row`` (locked, as it stood before the grant, read with the
    transaction's time: ``fence_row(now=True)``; ``cur`` a ``dict_row`` cursor) is a verification: the
    columns the allocation's update writes with its own (none for a row that is not scheduled)."""
    period = row["safety_read_seconds"]
    if row["state"] != ACTIVE or period is None:
        return {}
    now: datetime = row["db_now"]  # the transaction's time, as ``now()`` anywhere in it
    if row["verified_at"] is not None:  # a chain's first verification closes no gap
        gap = judge_gap(verified_at=row["verified_at"], watched_at=row["watched_at"], now=now,
                        period_seconds=float(period))
        if gap.report:
            await report_overdue(cur, row, gap, closed=True)
    delay = verification_delay(float(period), random.random())
    return {"verified_at": now, "verify_due_at": now + timedelta(seconds=delay)}


async def mark_chain(cur: Any, row: dict[str, Any]) -> None:
    """``mark_active`` made ``row`` (as it stands after) ACTIVE on a new subscription generation: its
    chain goes on while it holds a version (``continues_chain``), else a new one starts; due within
    ``claim_delay`` unless the generation's first read re-arms it."""
    period = row["safety_read_seconds"]
    keep = continues_chain(row["last_accepted_digest"])
    await cur.execute(
        "UPDATE subscriptions SET verified_at = CASE WHEN %s THEN verified_at END,"
        " watched_at = CASE WHEN %s THEN watched_at END,"
        " verify_due_at = now() + make_interval(secs => %s) WHERE workflow_id = %s",
        (keep, keep, claim_delay(float(period)) if period is not None else None, row["workflow_id"]),
    )


@dataclass(frozen=True, slots=True)
class Due:
    """A sweep's answer: the URIs due now (claimed), and seconds until the next row is due (None:
    none is scheduled)."""

    uris: list[str]
    next_in: float | None
    shortest_period: float | None = None  # the shortest safety-read period among the claimed rows
    looks: list[NotedNotification] = field(default_factory=list)  # per URI, its row as claimed


class VerificationLedger:
    def __init__(self, store: LedgerStore) -> None:
        self.store = store

    def activities(self) -> list[Callable[..., Any]]:
        return [self.watch]

    async def due(self, subject: str, server: str, *, limit: int = 500, ahead: float = 0.0,
                  generation: int | None = None) -> Due:
        """The sweep of one (subject, server) (module contract): the rows due within ``ahead`` seconds
        (``verification_rules.sweep_ahead``); with the session ``generation``, each claimed row's look
        too (``looked_note``: what the sweep's note on it would answer)."""
        async with self.store.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(DUE_ROWS_SQL, (subject, server, ahead, limit))
            rows = await cur.fetchall()
            ids = [r["workflow_id"] for r in rows]
            delays = [claim_delay(float(r["safety_read_seconds"])) for r in rows]
            # The claims, and when the next row they leave is due, in one statement (its reads do not
            # see its own UPDATE: the claimed rows are due again ``delays`` from now).
            await cur.execute(CLAIM_SQL, (ids, delays, subject, server, ids))
            nxt = await cur.fetchone()
        left = [] if nxt is None or nxt["next_in"] is None else [max(0.0, float(nxt["next_in"]))]
        next_in = min(delays + left, default=None)
        return Due(uris=[r["uri"] for r in rows], next_in=next_in,
                   shortest_period=min((float(r["safety_read_seconds"]) for r in rows), default=None),
                   looks=[] if generation is None else [looked_note(r, generation) for r in rows])

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
            gap = judge_gap(verified_at=row["verified_at"], watched_at=row["watched_at"], now=row["db_now"],
                            period_seconds=period)
            outbox_id = await report_overdue(cur, row, gap, closed=False) if gap.report else None
            await cur.execute("UPDATE subscriptions SET watched_at = now() WHERE workflow_id = %s",
                              (row["workflow_id"],))
        return WatchResult(scheduled=True, verified_at=row["verified_at"], gap_seconds=gap.gap_seconds,
                           period_seconds=period, overdue=gap.overdue, outbox_id=outbox_id)
