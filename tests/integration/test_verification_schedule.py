"""The ledger's verification schedule against real PostgreSQL (migration 023,
``activities/ledger/verification.py``): what a granted allocation and ``mark_active`` record on the
fence row, the ingress's sweep (``VerificationLedger.due``, and ``Resync`` over it), and the
watchdog's look (``VerificationLedger.watch``)."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from mcpsync.activities.ledger import Ledger
from mcpsync.worker.ingress.resync import BUSY_SECONDS, Resync
from mcpsync.workflows.ingress import IngressRouter
from mcpsync.workflows.records.ledger import (
    AcceptRequest,
    AcceptVerdict,
    AllocateRequest,
    MarkActiveRequest,
    WatchRequest,
)
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason
from mcpsync.workflows.verification_rules import (
    LONGEST_DELAY_SECONDS,
    claim_delay,
    verification_delay,
)
from tests.conftest import ledger_rows, unique

PERIOD = 30.0


async def _scheduled(ledger: Ledger, subject: str, uri: str, *, period: float | None = PERIOD,
                     server: str = "srv") -> SubscriptionKey:
    """An ACTIVE row marked by a run that said its safety-read period (None: a polling row)."""
    key = SubscriptionKey(subject=subject, server=server, uri=uri)
    await ledger.ensure_subscription(key, "inc-1")
    snap = await ledger.begin_subscription(key, 1)
    snap = await ledger.fence.mark_active(MarkActiveRequest(
        key=key, session_generation=1, subscription_generation=snap.subscription_generation,
        read_reports=True, safety_read_seconds=period))
    assert snap.state == SubscriptionState.ACTIVE
    return key


async def _allocate(ledger: Ledger, key: SubscriptionKey, generation: int = 1) -> int:
    """A granted read allocation on session and subscription ``generation``: its ordinal."""
    ticket = await ledger.fence.allocate_read(AllocateRequest(
        key=key, session_generation=generation, subscription_generation=generation, min_ordinal=1,
        request_id=uuid.uuid4().hex, trigger=TriggerReason.UPDATED))
    assert ticket.granted
    return ticket.ordinal


async def _read(ledger: Ledger, key: SubscriptionKey, digest: str, *, generation: int) -> None:
    """A read allocated on ``generation`` that saw ``digest``, accepted."""
    ordinal = await _allocate(ledger, key, generation)
    rows = await ledger_rows(ledger, "SELECT request_id FROM read_requests WHERE workflow_id=%s"
                             " AND ordinal=%s", key.workflow_id, ordinal)
    outcome = ReadOutcome(kind=ReadOutcomeKind.CONTENT, key=key, ordinal=ordinal, request_id=rows[0][0],
                          session_generation=generation, subscription_generation=generation,
                          trigger=TriggerReason.UPDATED, content_digest=digest, mime_type="text/plain")
    result = await ledger.fence.accept(AcceptRequest(outcome=outcome, expected_state=SubscriptionState.ACTIVE,
                                                     close_epoch=0))
    assert result.verdict == AcceptVerdict.ACCEPTED


async def _resubscribe(ledger: Ledger, key: SubscriptionKey, session_generation: int) -> int:
    """The run subscribes again on session ``session_generation`` and marks the row ACTIVE: the new
    subscription generation (equal to the session's in these tests)."""
    snap = await ledger.begin_subscription(key, session_generation)
    assert snap.subscription_generation == session_generation
    snap = await ledger.fence.mark_active(MarkActiveRequest(
        key=key, session_generation=session_generation, subscription_generation=snap.subscription_generation,
        read_reports=True, safety_read_seconds=PERIOD))
    assert snap.state == SubscriptionState.ACTIVE
    return snap.subscription_generation


async def _schedule(ledger: Ledger, key: SubscriptionKey) -> dict[str, Any]:
    """The row's schedule, times as seconds from the database's now (None: not set)."""
    rows = await ledger_rows(ledger, """
        SELECT EXTRACT(EPOCH FROM verified_at - now())::float8,
               EXTRACT(EPOCH FROM verify_due_at - now())::float8,
               EXTRACT(EPOCH FROM watched_at - now())::float8
        FROM subscriptions WHERE workflow_id = %s""", key.workflow_id)
    verified, due, watched = rows[0]
    return {"verified": verified, "due": due, "watched": watched}


async def _set(ledger: Ledger, key: SubscriptionKey, column: str, seconds_from_now: float | None) -> None:
    """Move one of the schedule's times (a test's clock: the rules compare with the database's now)."""
    assert column in ("verified_at", "verify_due_at", "watched_at")
    await ledger_rows(ledger, f"UPDATE subscriptions SET {column} = now() + make_interval(secs => %s)"
                              " WHERE workflow_id = %s", seconds_from_now, key.workflow_id)


async def _reports(ledger: Ledger, key: SubscriptionKey) -> tuple[int, int]:
    """(overdue outbox rows, VERIFICATION_OVERDUE audit rows) of ``key``."""
    outbox = await ledger_rows(ledger, "SELECT count(*) FROM outbox WHERE workflow_id=%s AND event_type=%s",
                               key.workflow_id, "overdue")
    audit = await ledger_rows(ledger, "SELECT count(*) FROM audit WHERE workflow_id=%s AND kind=%s",
                              key.workflow_id, "VERIFICATION_OVERDUE")
    return int(outbox[0][0]), int(audit[0][0])


async def test_a_new_chain_is_due_soon_and_each_granted_allocation_records_a_verification(
        ledger: Ledger) -> None:
    key = await _scheduled(ledger, unique("s"), "demo://v")
    s = await _schedule(ledger, key)
    # mark_active: a new chain, never verified, due a claim later unless its first read lands.
    assert s["verified"] is None and s["watched"] is None
    assert s["due"] == pytest.approx(claim_delay(PERIOD), abs=0.5)
    await _allocate(ledger, key)  # the first verification: no gap from nothing (verified_at NULL)
    s = await _schedule(ledger, key)
    assert s["verified"] == pytest.approx(0, abs=0.5) and await _reports(ledger, key) == (0, 0)
    assert verification_delay(PERIOD, 0) - 0.5 <= s["due"] - s["verified"] <= verification_delay(PERIOD, 1)
    await _set(ledger, key, "verified_at", -40)  # the previous verification 40 s ago: a gap over the period
    await _allocate(ledger, key)  # closes it: reported by this verification
    assert await _reports(ledger, key) == (1, 1)
    detail = await ledger_rows(ledger, "SELECT detail FROM outbox WHERE workflow_id=%s AND event_type=%s",
                               key.workflow_id, "overdue")
    assert detail[0][0]["closed"] is True and 40 <= detail[0][0]["gap_seconds"] < 41
    await _set(ledger, key, "verified_at", -10)  # a gap within the period: nothing reported
    await _allocate(ledger, key)
    assert await _reports(ledger, key) == (1, 1)


async def test_a_resubscribe_keeps_the_chain_and_its_first_read_reports_the_gap(ledger: Ledger) -> None:
    """The ingress killed and none sweeping: the run resubscribes on the next ingress's session, and
    that generation's first read closes the gap since the previous generation's newest verification.
    A row reopened for a new incarnation has no version to keep fresh: a new chain."""
    key = await _scheduled(ledger, unique("s"), "demo://resubscribed")
    await _read(ledger, key, "sha256:a", generation=1)  # the row holds a version
    await _set(ledger, key, "verified_at", -40)  # no verification since, for longer than the period
    generation = await _resubscribe(ledger, key, 2)
    s = await _schedule(ledger, key)
    assert s["verified"] == pytest.approx(-40, abs=0.5) and s["watched"] is None
    assert s["due"] == pytest.approx(claim_delay(PERIOD), abs=0.5)
    await _allocate(ledger, key, generation)  # the resubscribe's read closes the gap: reported by it
    assert await _reports(ledger, key) == (1, 1)
    detail = await ledger_rows(ledger, "SELECT detail FROM outbox WHERE workflow_id=%s AND event_type=%s",
                               key.workflow_id, "overdue")
    assert detail[0][0]["closed"] is True and 40 <= detail[0][0]["gap_seconds"] < 41
    # A gap the watchdog reported while open is not reported again by the resubscribe's read.
    await _set(ledger, key, "verified_at", -100)
    assert (await ledger.verification.watch(WatchRequest(key=key))).outbox_id is not None
    generation = await _resubscribe(ledger, key, 3)
    await _allocate(ledger, key, generation)
    assert await _reports(ledger, key) == (2, 2)
    # Closed, then reopened for a new incarnation (no current version): a new chain.
    await ledger.begin_unsubscribe(key)
    await ledger.finish_unsubscribe(key, acked=True)
    await ledger.ensure_subscription(key, "inc-2")
    await _resubscribe(ledger, key, 4)
    s = await _schedule(ledger, key)
    assert s["verified"] is None and s["watched"] is None


async def test_rows_off_the_schedule_are_never_due_recorded_or_judged(ledger: Ledger) -> None:
    subject = unique("s")
    scheduled = await _scheduled(ledger, subject, "demo://scheduled")
    polling = await _scheduled(ledger, subject, "demo://polling", period=None)  # no period: its timer's
    closing = await _scheduled(ledger, subject, "demo://closing")
    other = await _scheduled(ledger, subject, "demo://other", server="other")
    await ledger.begin_unsubscribe(closing)  # no longer ACTIVE
    for key in (scheduled, polling, closing, other):
        await _set(ledger, key, "verify_due_at", -60)  # all overdue, even where nothing would set it
    due = await ledger.verification.due(subject, "srv")
    assert due.uris == [scheduled.uri]
    await _allocate(ledger, polling)
    assert (await _schedule(ledger, polling))["verified"] is None
    for key in (polling, closing):
        assert not (await ledger.verification.watch(WatchRequest(key=key))).scheduled
    missing = SubscriptionKey(subject=subject, server="srv", uri="demo://never-subscribed")
    assert not (await ledger.verification.watch(WatchRequest(key=missing))).scheduled


async def test_due_claims_what_it_hands_out_skips_locked_rows_and_says_when_the_next_is_due(
        ledger: Ledger) -> None:
    subject = unique("s")
    a, b, c = [await _scheduled(ledger, subject, f"demo://{n}") for n in "abc"]
    await _set(ledger, a, "verify_due_at", -20)
    await _set(ledger, b, "verify_due_at", -10)
    await _set(ledger, c, "verify_due_at", 20)
    first = await ledger.verification.due(subject, "srv", limit=1)
    assert first.uris == [a.uri] and first.next_in == 0  # the most overdue first; b is still due
    second = await ledger.verification.due(subject, "srv")
    assert second.uris == [b.uri]
    assert second.next_in == pytest.approx(claim_delay(PERIOD), abs=0.5)  # a's claim ends first
    assert (await ledger.verification.due(subject, "srv")).uris == []  # both claimed
    await _allocate(ledger, a)  # a's read lands: re-armed a whole verification delay ahead
    assert (await _schedule(ledger, a))["due"] >= verification_delay(PERIOD, 0) - 0.5
    # A row a running allocation holds locked is skipped, and stays due.
    await _set(ledger, c, "verify_due_at", -1)
    async with ledger.pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM subscriptions WHERE workflow_id = %s FOR UPDATE", (c.workflow_id,))
        locked = await ledger.verification.due(subject, "srv")
    assert locked.uris == [] and locked.next_in == 0
    assert (await ledger.verification.due(subject, "srv")).uris == [c.uri]
    assert await ledger.verification.due(unique("nobody"), "srv") == type(locked)(uris=[], next_in=None)


async def test_due_claims_the_rows_due_within_ahead_and_names_their_shortest_period(ledger: Ledger) -> None:
    subject = unique("s")
    soon = await _scheduled(ledger, subject, "demo://soon", period=PERIOD)
    later = await _scheduled(ledger, subject, "demo://later", period=10 * PERIOD)
    await _set(ledger, soon, "verify_due_at", 0.4)
    await _set(ledger, later, "verify_due_at", 3)
    assert (await ledger.verification.due(subject, "srv")).uris == []  # nothing due now
    due = await ledger.verification.due(subject, "srv", ahead=1.0)
    assert due.uris == [soon.uri] and due.shortest_period == PERIOD
    assert due.next_in == pytest.approx(claim_delay(PERIOD), abs=0.5)  # soon's claim, before later
    nothing = await ledger.verification.due(subject, "srv", ahead=1.0)
    assert nothing.uris == [] and nothing.shortest_period is None
    assert nothing.next_in == pytest.approx(claim_delay(PERIOD) - 0.0, abs=0.5)


async def test_due_answers_each_claimed_rows_look_as_the_sweeps_note_would(ledger: Ledger) -> None:
    subject = unique("s")
    key = await _scheduled(ledger, subject, "demo://looked")
    await _set(ledger, key, "verify_due_at", -1)
    note = await ledger.fence.note_notification(subject, "srv", key.uri, 1, count=False)
    due = await ledger.verification.due(subject, "srv", generation=1)
    assert due.uris == [key.uri] and due.looks == [note]
    assert note is not None and note.workflow_id == key.workflow_id
    await _set(ledger, key, "verify_due_at", -1)
    assert (await ledger.verification.due(subject, "srv")).looks == []  # no generation: no looks


async def test_a_huge_period_schedules_without_overflow(ledger: Ledger) -> None:
    key = await _scheduled(ledger, unique("s"), "demo://huge", period=1e15)  # ~32 million years
    await _allocate(ledger, key)
    s = await _schedule(ledger, key)
    # Due ten years ahead (``LONGEST_DELAY_SECONDS``): the allocation recorded it, nothing overflowed.
    assert s["verified"] == pytest.approx(0, abs=0.5)
    assert s["due"] == pytest.approx(LONGEST_DELAY_SECONDS, abs=1)
    assert (await ledger.verification.due(key.subject, "srv")).uris == []
    result = await ledger.verification.watch(WatchRequest(key=key))
    assert result.scheduled and not result.overdue


async def test_the_watchdogs_look_reports_an_open_gap_once_and_its_closing_read_does_not_repeat_it(
        ledger: Ledger) -> None:
    key = await _scheduled(ledger, unique("s"), "demo://watched")
    await _allocate(ledger, key)
    fine = await ledger.verification.watch(WatchRequest(key=key))
    assert fine.scheduled and not fine.overdue and fine.outbox_id is None and fine.period_seconds == PERIOD
    assert (await _schedule(ledger, key))["watched"] == pytest.approx(0, abs=0.5)

    await _set(ledger, key, "verified_at", -100)  # no verification for 100 s: overdue now
    await _set(ledger, key, "watched_at", -90)  # the previous look came before the gap passed the period
    found = await ledger.verification.watch(WatchRequest(key=key))
    assert found.overdue and found.outbox_id is not None and found.gap_seconds is not None
    assert found.gap_seconds >= 100
    assert await _reports(ledger, key) == (1, 1)
    detail = await ledger_rows(ledger, "SELECT detail FROM outbox WHERE outbox_id=%s", found.outbox_id)
    assert detail[0][0]["period_seconds"] == PERIOD and detail[0][0]["closed"] is False
    again = await ledger.verification.watch(WatchRequest(key=key))  # the same open gap: not again
    assert again.overdue and again.outbox_id is None
    assert await _reports(ledger, key) == (1, 1)

    await _allocate(ledger, key)  # the open gap closes: reported while open, so not again now
    closed_seen = await ledger.verification.watch(WatchRequest(key=key))
    assert not closed_seen.overdue and closed_seen.outbox_id is None
    assert await _reports(ledger, key) == (1, 1)


class _Live:
    """The part of a live session the sweep looks at."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.lost = asyncio.Event()


async def test_the_sweep_feeds_due_rows_while_its_host_holds_a_session(ledger: Ledger) -> None:
    subject = unique("s")
    keys = [await _scheduled(ledger, subject, f"demo://sweep/{n}") for n in range(3)]
    for key in keys:
        await _set(ledger, key, "verify_due_at", -1)
    router = IngressRouter(subject, "srv", host_id="h", read_on_notification=True, max_pending=4)
    woken: list[None] = []
    host = SimpleNamespace(router=router, subject=subject, ledger=ledger, live=None)
    sweep = Resync(router, subject=subject, server="srv", ready=lambda: woken.append(None), host=host)  # type: ignore[arg-type]
    task = asyncio.create_task(sweep.run())
    try:
        await asyncio.sleep(0.4)
        assert sweep.looks == 0 and router.work.dirty == set()  # no session: no lease, no sweep
        host.live = _Live(generation=7)
        for _ in range(40):
            if sweep.fed:
                break
            await asyncio.sleep(0.05)
        # Room for two (half of max_pending): two claimed and fed, the third stays due for later.
        assert sweep.fed == 2 and len(woken) == 2
        assert {k[1] for k in router.work.background} == {7} and len(router.work.background) == 2
        unfed = [k for k in keys if (k.uri, 7) not in router.work.dirty]
        assert len(unfed) == 1 and (await _schedule(ledger, unfed[0]))["due"] < 0
        assert await sweep.look(7) == BUSY_SECONDS  # no room: the ledger is not even asked
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    router.pending.clear()  # the routers took the keys
    # The third row now; the next due is the first two's claim.
    assert await sweep.look(7) == pytest.approx(claim_delay(PERIOD), abs=0.5)
    assert sweep.fed == 3 and all((k.uri, 7) in router.work.dirty for k in keys)
