"""The ledger's gauges on real PostgreSQL read the counts the fence row keeps (migration 025), never
the history: they answer what counting the history answers (the definition, ``HISTORY`` below), on a
ledger with reads of every kind; retention does not lower them; and no snapshot query touches
``read_requests`` or ``resource_versions`` (activities/ledger/metrics.py, docs/metrics.md)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import mcpsync.activities.ledger.migrations as migrations
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.metrics import (
    SNAPSHOT_QUERIES,
    WATCHING,
    LedgerSnapshot,
    freshness_bounds,
    read_snapshot,
    snapshot_params,
)
from mcpsync.activities.ledger.retention import prune
from mcpsync.workflows.records.ledger import AcceptRequest, AcceptVerdict, AllocateRequest
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason
from tests.conftest import ledger_rows
from tests.integration.test_ledger import _active

V = AcceptVerdict
K = ReadOutcomeKind
OLD = timedelta(days=2)  # past every published freshness bound

# The definition the gauges keep: the history counted (the queries the snapshot ran before
# migration 025). Per workflow: the read's allocation of its newest receipt that saw content.
HISTORY = {
    "reads": "SELECT s.server, count(*) FROM read_requests r JOIN subscriptions s USING (workflow_id)"
             " GROUP BY s.server",
    "receipts": "SELECT server, status, count(*) FROM resource_versions GROUP BY server, status",
    "verified": """
        SELECT s.workflow_id, coalesce(v.verified_at, s.created_at) FROM subscriptions s
        LEFT JOIN LATERAL (
            SELECT coalesce(r.issued_at, rv.accepted_at) AS verified_at FROM resource_versions rv
            LEFT JOIN read_requests r ON r.workflow_id = rv.workflow_id AND r.ordinal = rv.read_ordinal
            WHERE rv.workflow_id = s.workflow_id AND rv.status IN ('ACCEPTED', 'UNCHANGED')
            ORDER BY rv.receipt_id DESC LIMIT 1) v ON true
        WHERE s.state = ANY(%s)""",
}


class Sub:
    """One subscription driven through the fence as the workflow drives it."""

    def __init__(self, ledger: Ledger, key: SubscriptionKey) -> None:
        self.ledger, self.key = ledger, key

    async def allocate(self, *, aged: bool = False) -> tuple[int, str]:
        ticket = await self.ledger.fence.allocate_read(AllocateRequest(
            key=self.key, session_generation=1, subscription_generation=1, min_ordinal=1,
            request_id=str(uuid.uuid4()), trigger=TriggerReason.UPDATED))
        assert ticket.granted
        if aged:  # allocated long ago: its receipt is past the freshness bound
            await ledger_rows(self.ledger, "UPDATE read_requests SET issued_at = issued_at - %s"
                              " WHERE workflow_id=%s AND ordinal=%s",
                              OLD, self.key.workflow_id, ticket.ordinal)
        return ticket.ordinal, ticket.request_id

    async def accept(self, read: tuple[int, str], kind: K = K.CONTENT, digest: str | None = None,
                     guardrail: str | None = None) -> AcceptVerdict:
        outcome = ReadOutcome(kind=kind, key=self.key, ordinal=read[0], request_id=read[1],
                              session_generation=1, subscription_generation=1, trigger=TriggerReason.UPDATED,
                              content_digest=digest, mime_type="text/plain", guardrail_rejection=guardrail)
        result = await self.ledger.fence.accept(AcceptRequest(
            outcome=outcome, expected_state=SubscriptionState.ACTIVE, close_epoch=0))
        return result.verdict


async def _every_kind(ledger: Ledger) -> None:
    """Subscriptions with reads of every kind: each verdict's receipt (or none), a replayed accept, a
    granted read never accepted, catalog and revocation receipts, a subscription never read."""
    a = Sub(ledger, await _active(ledger, uri="demo://gauges/a"))
    assert await a.accept(await a.allocate(), digest="sha256:a1") == V.ACCEPTED
    late, r3 = await a.allocate(), await a.allocate(aged=True)
    assert await a.accept(r3, digest="sha256:a2") == V.ACCEPTED
    assert await a.accept(late, digest="sha256:old") == V.STALE
    assert await a.accept(r3, digest="sha256:a2") == V.ACCEPTED  # a retry: replayed, nothing written
    for _ in range(3):
        assert await a.accept(await a.allocate(aged=True), digest="sha256:a2") == V.UNCHANGED
    guarded = await a.allocate()
    assert await a.accept(guarded, digest="sha256:g", guardrail="too large") == V.GUARDRAIL_REJECTED
    assert await a.accept(await a.allocate(), K.MALFORMED) == V.REJECTED
    await a.allocate()  # granted, never accepted
    t = Sub(ledger, await _active(ledger, uri="demo://gauges/tombstoned"))
    assert await t.accept(await t.allocate(aged=True), digest="sha256:t") == V.ACCEPTED
    assert await t.accept(await t.allocate(), K.NOT_FOUND) == V.TOMBSTONE_PENDING
    await ledger.confirm_tombstone(t.key, listed=False, scan_id="c1")
    d = Sub(ledger, await _active(ledger, uri="demo://gauges/denied"))
    assert await d.accept(await d.allocate(), digest="sha256:d") == V.ACCEPTED
    assert await d.accept(await d.allocate(), K.DENIED) == V.REVOKED
    c = Sub(ledger, await _active(ledger, uri="demo://gauges/closed"))
    assert await c.accept(await c.allocate(), digest="sha256:c") == V.ACCEPTED
    in_flight = await c.allocate()
    await ledger.begin_unsubscribe(c.key)
    assert await c.accept(in_flight, digest="sha256:c2") == V.STALE_AFTER_CLOSE
    p = Sub(ledger, await _active(ledger, uri="demo://gauges/platform"))
    assert await p.accept(await p.allocate(aged=True), digest="sha256:p") == V.ACCEPTED
    await ledger.revoke(p.key, reason="gone", source="platform", effective_at=datetime.now(UTC))
    never = await _active(ledger, uri="demo://gauges/never")  # watching, nothing read: since creation
    await ledger_rows(ledger, "UPDATE subscriptions SET created_at = created_at - %s WHERE workflow_id=%s",
                      OLD, never.workflow_id)
    await _active(ledger, uri="demo://gauges/fresh")  # watching, just created


async def _history(ledger: Ledger) -> dict[str, Any]:
    """What counting the history answers, in the snapshot's terms."""
    reads = {r[0]: int(r[1]) for r in await ledger_rows(ledger, HISTORY["reads"])}
    receipts = {(r[0], r[1]): int(r[2]) for r in await ledger_rows(ledger, HISTORY["receipts"])}
    watching = [s.value for s in WATCHING]
    verified = {r[0]: r[1] for r in await ledger_rows(ledger, HISTORY["verified"], watching)}
    return {"reads": reads, "receipts": receipts, "verified": verified}


async def _kept(ledger: Ledger) -> dict[str, Any]:
    """The row's own verified time per watching subscription (what the freshness query ages)."""
    rows = await ledger_rows(ledger, "SELECT workflow_id, coalesce(content_read_at, created_at)"
                             " FROM subscriptions WHERE state = ANY(%s)", [s.value for s in WATCHING])
    return {r[0]: r[1] for r in rows}


def _shown(snap: LedgerSnapshot) -> dict[str, Any]:
    """A snapshot's gauges, the oldest age in whole hours (the snapshots run a moment apart)."""
    assert not snap.failures, snap.failures
    return {"reads": snap.reads, "receipts": snap.receipts,
            "freshness": {k: (f.subscriptions, int(f.max_age // 3600), f.past_bound)
                          for k, f in snap.freshness.items()}}


async def test_the_gauges_answer_what_the_history_counts(private_ledger: Ledger) -> None:
    ledger = private_ledger  # the counts are of the whole ledger
    await _every_kind(ledger)
    history = await _history(ledger)
    assert set(history["receipts"]) == {("srv", v.value) for v in V
                                        if v not in (V.STALE_AFTER_CLOSE, V.REJECTED, V.REVOKED)}
    snap, _ = await read_snapshot(ledger.pool, 0)
    assert snap.reads == history["reads"] and snap.receipts == history["receipts"]
    assert await _kept(ledger) == history["verified"]
    watching = snap.freshness[("srv", "subscribe")]
    assert (watching.subscriptions, watching.past_bound) == (len(history["verified"]), 2)
    assert snap.amplification("srv") == history["reads"]["srv"] / history["receipts"][("srv", "ACCEPTED")]
    # The migration counts a ledger written before it alike (its backfill, run again on zeroed rows).
    await ledger_rows(ledger, "UPDATE subscriptions SET reads_granted = 0, receipt_counts = '{}',"
                      " content_read_at = NULL")
    async with ledger.pool.connection() as conn:  # several statements: no parameters
        await conn.execute((Path(migrations.__file__).parent / "025_ledger_gauges.sql").read_text())
    again, _ = await read_snapshot(ledger.pool, 0)
    assert _shown(again) == _shown(snap) and await _kept(ledger) == history["verified"]


async def test_retention_does_not_lower_the_gauges(private_ledger: Ledger) -> None:
    ledger = private_ledger
    await _every_kind(ledger)
    before, _ = await read_snapshot(ledger.pool, 0)
    # Everything a month old: prune forgets the completed reads and the superseded verifications.
    await ledger_rows(ledger, "UPDATE resource_versions SET accepted_at = accepted_at - interval '30 days'")
    await ledger_rows(ledger, "UPDATE read_requests SET completed_at = completed_at - interval '30 days'")
    aged, _ = await read_snapshot(ledger.pool, 0)
    done = await prune(ledger.pool, keep=timedelta(days=7))
    assert done.read_requests > 0 and done.verification_receipts > 0
    history = await _history(ledger)
    assert sum(history["reads"].values()) < sum(before.reads.values()), "the history did shrink"
    after, _ = await read_snapshot(ledger.pool, 0)
    assert (after.reads, after.receipts) == (before.reads, before.receipts)
    assert after.amplification("srv") == before.amplification("srv")
    assert _shown(after)["freshness"] == _shown(aged)["freshness"]


async def test_no_snapshot_query_reads_the_history(ledger: Ledger) -> None:
    params = snapshot_params(0, freshness_bounds())
    for name, sql in SNAPSHOT_QUERIES.items():
        async with ledger.pool.connection() as conn:
            cur = await conn.execute("EXPLAIN " + sql, params if "%(" in sql else None)
            plan = "\n".join(str(r[0]) for r in await cur.fetchall())
        for table in ("read_requests", "resource_versions"):
            assert f" {table}" not in plan, f"{name} reads {table}:\n{plan}"
