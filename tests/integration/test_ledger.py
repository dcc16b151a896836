"""The ledger's fences against real PostgreSQL: CAS allocation, the sole acceptance point, close."""

from __future__ import annotations

import asyncio
import uuid

from mcpsync.activities.ledger import Ledger
from mcpsync.workflows.allocation import rederivations
from mcpsync.workflows.records.ledger import AcceptRequest, AcceptVerdict, AllocateRequest
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import (
    SessionInfo,
    SubscriptionKey,
    SubscriptionState,
    TriggerReason,
)
from tests.conftest import unique


async def _active(ledger: Ledger, uri: str = "demo://a", subject: str | None = None) -> SubscriptionKey:
    key = SubscriptionKey(subject=subject or unique("s"), server="srv", uri=uri)
    await ledger.ensure_subscription(key, "inc-1")
    snap = await ledger.begin_subscription(key, 1)
    assert snap.state == SubscriptionState.SUBSCRIBING
    snap = await ledger.mark_active(key, 1, snap.subscription_generation)
    assert snap.state == SubscriptionState.ACTIVE
    return key


async def _issue(ledger: Ledger, key: SubscriptionKey, min_ordinal: int = 1) -> int:
    ticket = await ledger.fence.allocate_read(AllocateRequest(
        key=key, session_generation=1, subscription_generation=1, min_ordinal=min_ordinal,
        request_id=str(uuid.uuid4()), trigger=TriggerReason.UPDATED))
    assert ticket.granted
    return ticket.ordinal


def _outcome(key: SubscriptionKey, ordinal: int, request_id: str, digest: str | None,
             kind: ReadOutcomeKind = ReadOutcomeKind.CONTENT) -> ReadOutcome:
    return ReadOutcome(kind=kind, key=key, ordinal=ordinal, request_id=request_id, session_generation=1,
                       subscription_generation=1, trigger=TriggerReason.UPDATED, content_digest=digest,
                       mime_type="text/plain")


async def _rid(ledger: Ledger, key: SubscriptionKey, ordinal: int) -> str:
    async with ledger.pool.connection() as conn:
        cur = await conn.execute("SELECT request_id FROM read_requests WHERE workflow_id=%s AND ordinal=%s",
                                 (key.workflow_id, ordinal))
        row = await cur.fetchone()
    assert row is not None
    return str(row[0])


async def _accept(ledger: Ledger, key: SubscriptionKey, ordinal: int, digest: str | None,
                  kind: ReadOutcomeKind = ReadOutcomeKind.CONTENT) -> AcceptVerdict:
    rid = await _rid(ledger, key, ordinal)
    result = await ledger.fence.accept(AcceptRequest(outcome=_outcome(key, ordinal, rid, digest, kind),
                                               expected_state=SubscriptionState.ACTIVE, close_epoch=0))
    return result.verdict


async def _count(ledger: Ledger, table: str, key: SubscriptionKey) -> int:
    async with ledger.pool.connection() as conn:
        cur = await conn.execute(f"SELECT count(*) FROM {table} WHERE workflow_id=%s", (key.workflow_id,))
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def test_ordinals_are_cas_allocated_and_never_reused(ledger: Ledger) -> None:
    key = await _active(ledger)
    assert await _issue(ledger, key) == 1
    assert await _issue(ledger, key) == 2
    # A rewound workflow asks for 1 again: the durable fence answers 3.
    assert await _issue(ledger, key, min_ordinal=1) == 3
    assert await _issue(ledger, key, min_ordinal=10) == 10


async def test_allocation_is_idempotent_per_request_id_and_resets_derive_new_ids(ledger: Ledger) -> None:
    key = await _active(ledger)

    async def allocate(request_id: str) -> tuple[int, str]:
        t = await ledger.fence.allocate_read(AllocateRequest(key=key, session_generation=1,
                                                       subscription_generation=1, min_ordinal=1,
                                                       request_id=request_id, trigger=TriggerReason.UPDATED))
        assert t.granted
        return t.ordinal, t.request_id

    # A retry after a lost response (not yet judged): the same ticket.
    assert await allocate("run1-r1") == (1, "run1-r1")
    assert await allocate("run1-r1") == (1, "run1-r1")
    assert await _accept(ledger, key, 1, "sha256:a") == AcceptVerdict.ACCEPTED
    # A reset run re-dispatches the finished allocation: a new read with an id of its own...
    assert await allocate("run1-r1") == (2, "run1-r1/1")
    assert await _accept(ledger, key, 2, "sha256:a") == AcceptVerdict.UNCHANGED
    # ... and a second reset to the same point derives again instead of hitting UNIQUE.
    assert await allocate("run1-r1") == (3, "run1-r1/1/2")
    # The simulator classifies these by production's count of the chain.
    assert [rederivations("run1-r1", taken) for taken in ("run1-r1", "run1-r1/1", "run1-r1/1/2")] == [0, 1, 2]



async def test_retried_allocation_answers_the_update_counter_it_saw(ledger: Ledger) -> None:
    key = await _active(ledger)

    async def seen(request_id: str) -> int:
        t = await ledger.fence.allocate_read(AllocateRequest(key=key, session_generation=1,
                                                       subscription_generation=1, min_ordinal=1,
                                                       request_id=request_id, trigger=TriggerReason.UPDATED))
        return t.notifications_seen

    await ledger.fence.note_notification(key.subject, key.server, key.uri, 1)
    assert await seen("r-a") == 1
    await ledger.fence.note_notification(key.subject, key.server, key.uri, 1)  # after the allocation
    # The retry is the same read: it saw 1 update, not 2.
    assert await seen("r-a") == 1


async def test_late_read_leaves_only_a_stale_receipt(ledger: Ledger) -> None:
    key = await _active(ledger)
    a, b = await _issue(ledger, key), await _issue(ledger, key)
    assert await _accept(ledger, key, b, "sha256:b") == AcceptVerdict.ACCEPTED
    assert await _accept(ledger, key, a, "sha256:a") == AcceptVerdict.STALE
    fence = await ledger.load_fence(key)
    assert fence.last_accepted_ordinal == b and fence.last_accepted_digest == "sha256:b"
    assert await _count(ledger, "outbox", key) == 1


async def test_in_order_reads_are_both_accepted_and_unchanged_digest_has_no_outbox(ledger: Ledger) -> None:
    key = await _active(ledger)
    a, b, c = await _issue(ledger, key), await _issue(ledger, key), await _issue(ledger, key)
    assert await _accept(ledger, key, a, "sha256:a") == AcceptVerdict.ACCEPTED
    assert await _accept(ledger, key, b, "sha256:b") == AcceptVerdict.ACCEPTED
    assert await _accept(ledger, key, c, "sha256:b") == AcceptVerdict.UNCHANGED
    assert await _count(ledger, "outbox", key) == 2
    assert (await ledger.load_fence(key)).watermark == c


async def test_retried_accept_writes_nothing_twice(ledger: Ledger) -> None:
    key = await _active(ledger)
    a = await _issue(ledger, key)
    assert await _accept(ledger, key, a, "sha256:a") == AcceptVerdict.ACCEPTED
    assert await _accept(ledger, key, a, "sha256:a") == AcceptVerdict.ACCEPTED
    assert await _count(ledger, "resource_versions", key) == 1
    assert await _count(ledger, "outbox", key) == 1


async def test_read_never_issued_is_rejected_and_audited(ledger: Ledger) -> None:
    key = await _active(ledger)
    result = await ledger.fence.accept(AcceptRequest(outcome=_outcome(key, 7, "forged", "sha256:x"),
                                               expected_state=SubscriptionState.ACTIVE, close_epoch=0))
    assert result.verdict == AcceptVerdict.REJECTED
    assert await _count(ledger, "resource_versions", key) == 0
    assert any(r["workflow_id"] == key.workflow_id
               for r in await ledger.reports.audit_rows("UNKNOWN_IDENTITY"))


async def test_close_freezes_ordinal_and_late_content_or_404_only_audits(ledger: Ledger) -> None:
    key = await _active(ledger)
    a, b = await _issue(ledger, key), await _issue(ledger, key)
    receipt = await ledger.begin_unsubscribe(key)
    assert receipt.state == SubscriptionState.UNSUBSCRIBING and receipt.close_ordinal == b
    denied = await ledger.fence.allocate_read(AllocateRequest(
        key=key, session_generation=1, subscription_generation=1, min_ordinal=b + 1,
        request_id=str(uuid.uuid4()), trigger=TriggerReason.UPDATED))
    assert not denied.granted
    assert await _accept(ledger, key, a, "sha256:late") == AcceptVerdict.STALE_AFTER_CLOSE
    assert await _accept(ledger, key, b, None, ReadOutcomeKind.NOT_FOUND) == AcceptVerdict.STALE_AFTER_CLOSE
    assert await _count(ledger, "resource_versions", key) == 0
    assert await _count(ledger, "outbox", key) == 0
    snap = await ledger.finish_unsubscribe(key, acked=False)
    assert snap.state == SubscriptionState.UNSUBSCRIBE_UNKNOWN
    # Never reopens for the same incarnation, even if asked to subscribe again.
    assert (await ledger.begin_subscription(key, 2)).state == SubscriptionState.UNSUBSCRIBE_UNKNOWN
    assert (await ledger.ensure_subscription(key, "inc-1")).state == SubscriptionState.UNSUBSCRIBE_UNKNOWN


async def test_not_found_while_active_is_tombstone_pending_without_outbox(ledger: Ledger) -> None:
    key = await _active(ledger)
    a = await _issue(ledger, key)
    assert await _accept(ledger, key, a, None, ReadOutcomeKind.NOT_FOUND) == AcceptVerdict.TOMBSTONE_PENDING
    assert (await ledger.load_fence(key)).state == SubscriptionState.TOMBSTONE_PENDING
    assert await _count(ledger, "outbox", key) == 0


async def test_session_generations_only_grow(ledger: Ledger) -> None:
    subject = unique("s")
    assert await ledger.sessions.acquire_lease(subject, "srv", "h", 60.0)
    gens = [
        (await ledger.sessions.open_session(subject=subject, server="srv", edition="2025-11-25",
                                   capabilities={"subscribe": True}, server_name="x", server_version="1",
                                   task_queue="q", host_id="h")).generation
        for _ in range(3)
    ]
    assert gens == [1, 2, 3]


async def test_only_the_lease_holder_opens_a_session(ledger: Ledger) -> None:
    """A host whose lease lapsed (or that never held one) opens no session: the holder's generation
    stays the current one."""
    subject = unique("s")

    async def open_as(host: str) -> SessionInfo | None:
        return await ledger.sessions.open_session(subject=subject, server="srv", edition="2025-11-25",
                                                  capabilities={"subscribe": True}, server_name="x",
                                                  server_version="1", task_queue=f"q-{host}", host_id=host)

    assert await open_as("nobody") is None  # no lease at all
    assert await ledger.sessions.acquire_lease(subject, "srv", "holder", 60.0)
    opened = await open_as("holder")
    assert opened is not None and opened.generation == 1
    assert await open_as("standby") is None  # another host's live lease
    await ledger.sessions.release_lease(subject, "srv", "holder")
    assert await ledger.sessions.acquire_lease(subject, "srv", "lapsed", 0.001)
    await asyncio.sleep(0.05)
    assert await open_as("lapsed") is None  # its own lease, lapsed
    current = await ledger.sessions.session_holder(subject, "srv")
    assert current == ("q-holder", "holder")


async def test_the_row_records_the_id_its_workflow_runs_under(ledger: Ledger) -> None:
    """A row created by a workflow under another id (the legacy scheme) keeps that id; every fence
    operation finds the row by key, and ``workflow_id_of`` / ``note_notification`` answer that id."""
    key = SubscriptionKey(subject=unique("s"), server="srv", uri="demo://ids/Legacy Doc")
    assert await ledger.fence.workflow_id_of(key) == key.workflow_id  # no row yet: the readable id
    await ledger.ensure_subscription(key, "inc-1", workflow_id=key.legacy_workflow_id)
    assert await ledger.fence.workflow_id_of(key) == key.legacy_workflow_id
    snap = await ledger.begin_subscription(key, 1)
    assert (await ledger.mark_active(key, 1, snap.subscription_generation)).state == SubscriptionState.ACTIVE
    ordinal = await _issue(ledger, key)
    async with ledger.pool.connection() as conn:
        cur = await conn.execute("SELECT request_id FROM read_requests WHERE workflow_id=%s AND ordinal=%s",
                                 (key.legacy_workflow_id, ordinal))
        row = await cur.fetchone()
    assert row is not None
    result = await ledger.fence.accept(AcceptRequest(outcome=_outcome(key, ordinal, str(row[0]),
                                                                "sha256:" + "a" * 64),
                                               expected_state=SubscriptionState.ACTIVE, close_epoch=0))
    assert result.verdict == AcceptVerdict.ACCEPTED
    assert [r.receipt_id for r in await ledger.reports.receipts(key)] == [result.receipt_id]
    assert await ledger.reports.read_count(key) == 1
    noted = await ledger.fence.note_notification(key.subject, key.server, key.uri, 1)
    assert noted is not None and noted.workflow_id == key.legacy_workflow_id \
        and noted.fence.notifications_seen == 1
    outbox = [r for r in await ledger.reports.outbox_after(0, 100_000) if r["subject"] == key.subject]
    assert [r["workflow_id"] for r in outbox] == [key.legacy_workflow_id]

    # A second workflow for the key under another id does not take the row over: audited.
    await ledger.ensure_subscription(key, "inc-1", workflow_id=key.workflow_id)
    assert await ledger.fence.workflow_id_of(key) == key.legacy_workflow_id
    mismatch = [a for a in await ledger.reports.audit_rows("WORKFLOW_ID_MISMATCH", 1000)
                if a["subject"] == key.subject]
    assert [(a["workflow_id"], a["detail"]["running_as"]) for a in mismatch] == [(key.legacy_workflow_id,
                                                                                 key.workflow_id)]
    receipt = await ledger.begin_unsubscribe(key)
    assert receipt.state == SubscriptionState.UNSUBSCRIBING
    assert (await ledger.finish_unsubscribe(key, acked=True)).state == SubscriptionState.CLOSED


async def test_the_row_records_coverage_by_level(ledger: Ledger) -> None:
    """notified (notifications_seen) and covered (workflows/coverage.py), on the SQL row."""
    key = await _active(ledger)

    async def note() -> bool:
        noted = await ledger.fence.note_notification(key.subject, key.server, key.uri, 1)
        assert noted is not None
        return noted.work

    assert await note()  # clean -> dirty
    assert not await note()  # a copy: the read the first one earned covers it
    first = await _issue(ledger, key)
    assert await note()  # allocated before it: the read in flight may not observe it
    assert await _accept(ledger, key, first, "sha256:a") == AcceptVerdict.ACCEPTED
    fence = await ledger.load_fence(key)
    assert (fence.notifications_seen, fence.covered, fence.allocated_sequence) == (3, 2, 2)
    second = await _issue(ledger, key)
    assert await _accept(ledger, key, second, None, ReadOutcomeKind.TRANSIENT) == AcceptVerdict.REJECTED
    assert (await ledger.load_fence(key)).covered == 2  # a failed read covers nothing
    third = await _issue(ledger, key)
    assert await _accept(ledger, key, third, "sha256:a") == AcceptVerdict.UNCHANGED
    fence = await ledger.load_fence(key)
    assert (fence.notifications_seen, fence.covered) == (3, 3)
    assert await note()  # clean again: the next notification is work
