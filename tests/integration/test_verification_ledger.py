"""The verification schedule on real PostgreSQL (``activities/ledger/verification.py``): a granted
allocation of a scheduled row is a verification and re-arms it; a gap over the period is reported once
(an ``overdue`` outbox event and an audit row), by the verification that closes it or by the watchdog
while it is open; the sweep claims due rows."""

from __future__ import annotations

import uuid

from mcpsync.activities.ledger import Ledger
from mcpsync.workflows.records.ledger import AllocateRequest, MarkActiveRequest, WatchRequest
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason
from mcpsync.workflows.verification_rules import verification_delay
from tests.conftest import unique

PERIOD = 30.0


async def _scheduled(ledger: Ledger, key: SubscriptionKey, period: float | None = PERIOD) -> int:
    await ledger.ensure_subscription(key, "inc-1")
    snap = await ledger.begin_subscription(key, 1)
    snap = await ledger.fence.mark_active(MarkActiveRequest(
        key=key, session_generation=1, subscription_generation=snap.subscription_generation,
        read_reports=True, safety_read_seconds=period))
    assert snap.state == SubscriptionState.ACTIVE
    return snap.subscription_generation


async def _allocate(ledger: Ledger, key: SubscriptionKey, sub_gen: int) -> None:
    ticket = await ledger.fence.allocate_read(AllocateRequest(
        key=key, session_generation=1, subscription_generation=sub_gen, min_ordinal=1,
        request_id=str(uuid.uuid4()), trigger=TriggerReason.POLL))
    assert ticket.granted


async def _row(ledger: Ledger, key: SubscriptionKey) -> dict[str, object]:
    async with ledger.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT verified_at, verify_due_at, watched_at, now() AS now,"
            " (SELECT count(*) FROM outbox o WHERE o.workflow_id = s.workflow_id"
            "   AND o.event_type = 'overdue')"
            " AS overdue_events,"
            " (SELECT count(*) FROM audit a WHERE a.workflow_id = s.workflow_id"
            "   AND a.kind = 'VERIFICATION_OVERDUE') AS overdue_audits"
            " FROM subscriptions s WHERE subject=%s AND server=%s AND uri=%s",
            (key.subject, key.server, key.uri))
        row = await cur.fetchone()
        assert row is not None and cur.description is not None
        return {d.name: v for d, v in zip(cur.description, row, strict=True)}


async def _age(ledger: Ledger, key: SubscriptionKey, seconds: float) -> None:
    """``seconds`` pass for the row: every time it recorded moves that far back (the test's clock)."""
    async with ledger.pool.connection() as conn:
        await conn.execute("UPDATE subscriptions SET verified_at = verified_at - make_interval(secs => %s),"
                           " watched_at = watched_at - make_interval(secs => %s),"
                           " verify_due_at = verify_due_at - make_interval(secs => %s)"
                           " WHERE subject=%s AND server=%s AND uri=%s",
                           (seconds, seconds, seconds, key.subject, key.server, key.uri))


async def test_an_allocation_verifies_and_rearms_within_the_period(ledger: Ledger) -> None:
    key = SubscriptionKey(subject=unique("s"), server="srv", uri="demo://v/1")
    sub_gen = await _scheduled(ledger, key)
    row = await _row(ledger, key)
    assert row["verified_at"] is None  # a new chain: due within the claim delay, before any read
    await _allocate(ledger, key, sub_gen)
    row = await _row(ledger, key)
    assert 0 <= (row["now"] - row["verified_at"]).total_seconds() < 5  # type: ignore[operator]
    due_in = (row["verify_due_at"] - row["verified_at"]).total_seconds()  # type: ignore[operator]
    assert verification_delay(PERIOD, 0.0) <= due_in <= verification_delay(PERIOD, 1.0)
    assert row["overdue_events"] == 0


async def test_a_gap_closed_late_is_reported_once_by_the_closing_verification(ledger: Ledger) -> None:
    key = SubscriptionKey(subject=unique("s"), server="srv", uri="demo://v/2")
    sub_gen = await _scheduled(ledger, key)
    await _allocate(ledger, key, sub_gen)
    await _age(ledger, key, PERIOD - 1)
    await _allocate(ledger, key, sub_gen)  # within the period: no breach
    assert (await _row(ledger, key))["overdue_events"] == 0
    await _age(ledger, key, PERIOD + 5)
    await _allocate(ledger, key, sub_gen)
    row = await _row(ledger, key)
    assert (row["overdue_events"], row["overdue_audits"]) == (1, 1)
    async with ledger.pool.connection() as conn:
        cur = await conn.execute("SELECT detail FROM outbox WHERE subject=%s AND event_type='overdue'",
                                 (key.subject,))
        detail = (await cur.fetchone())[0]  # type: ignore[index]
    assert detail["closed"] is True and detail["period_seconds"] == PERIOD
    assert detail["gap_seconds"] >= PERIOD + 5


async def test_the_watchdog_reports_an_open_gap_once_and_the_closing_read_does_not_repeat_it(
        ledger: Ledger) -> None:
    key = SubscriptionKey(subject=unique("s"), server="srv", uri="demo://v/3")
    sub_gen = await _scheduled(ledger, key)
    await _allocate(ledger, key, sub_gen)
    fine = await ledger.verification.watch(WatchRequest(key=key))
    assert fine.scheduled and not fine.overdue and fine.outbox_id is None
    await _age(ledger, key, 2 * PERIOD)
    first = await ledger.verification.watch(WatchRequest(key=key))
    assert first.overdue and first.outbox_id is not None
    second = await ledger.verification.watch(WatchRequest(key=key))  # the same open gap
    assert second.overdue and second.outbox_id is None
    await _allocate(ledger, key, sub_gen)  # the read the watchdog asks for closes it
    assert (await _row(ledger, key))["overdue_events"] == 1


async def test_rows_off_the_schedule_are_not_judged(ledger: Ledger) -> None:
    polling = SubscriptionKey(subject=unique("s"), server="srv", uri="demo://v/poll")
    sub_gen = await _scheduled(ledger, polling, period=None)
    await _allocate(ledger, polling, sub_gen)
    assert not (await ledger.verification.watch(WatchRequest(key=polling))).scheduled
    assert (await _row(ledger, polling))["verified_at"] is None
    missing = SubscriptionKey(subject=unique("s"), server="srv", uri="demo://v/none")
    assert not (await ledger.verification.watch(WatchRequest(key=missing))).scheduled


async def test_the_sweep_claims_due_rows_and_says_when_the_next_is_due(ledger: Ledger) -> None:
    subject = unique("s")
    keys = [SubscriptionKey(subject=subject, server="srv", uri=f"demo://v/sweep/{n}") for n in range(3)]
    for key in keys:
        await _allocate(ledger, key, await _scheduled(ledger, key))
    first = await ledger.verification.due(subject, "srv")
    assert first.uris == [] and first.next_in is not None
    assert verification_delay(PERIOD, 0.0) - 5 <= first.next_in <= verification_delay(PERIOD, 1.0)
    async with ledger.pool.connection() as conn:
        await conn.execute("UPDATE subscriptions SET verify_due_at = now() - interval '1 second'"
                           " WHERE subject=%s AND uri <> %s", (subject, keys[2].uri))
    due = await ledger.verification.due(subject, "srv")
    assert sorted(due.uris) == sorted(k.uri for k in keys[:2])
    # Claimed: not due again until the claim delay passes, unless a granted allocation re-arms them.
    assert (await ledger.verification.due(subject, "srv")).uris == []
    assert (await ledger.verification.due(subject, "other")).next_in is None
