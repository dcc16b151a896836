"""One write plan, two stores: the PostgreSQL ledger and the simulator's in-memory ledger, driven
through the same operations, answer the same verdicts and hold the same fence row, receipts and
outbox rows (receipt and outbox ids compared by position: each store numbers its own)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from mcpsync.activities.ledger import Ledger
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import (
    AcceptRequest,
    AcceptVerdict,
    AllocateRequest,
    BeginSubscriptionRequest,
    EnsureRequest,
    FenceSnapshot,
    FinishUnsubscribeRequest,
    MarkActiveRequest,
    SetStateRequest,
    StartSubscriptionRequest,
    SubscriptionStarted,
)
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason
from sim.ledger import LEDGER_ACTIVITIES, MemoryLedger
from tests.conftest import ledger_rows, unique

S = SubscriptionState
V = AcceptVerdict


class Both:
    """One subscription in both ledgers; every call goes to both and the results must agree."""

    def __init__(self, ledger: Ledger, *, legacy_id: bool = False) -> None:
        self.key = SubscriptionKey(subject=unique("plan"), server="srv", uri=f"demo://{unique('doc')}")
        self.sql, self.mem = ledger, MemoryLedger(self.key)
        self.judged: str | None = None  # the digest of the read the last accept judged
        # The id the subscription's workflow runs under (a row records it once, whatever the scheme).
        self.workflow_id = self.key.legacy_workflow_id if legacy_id else self.key.workflow_id

    async def start(self) -> None:
        await self.sql.ensure_subscription(self.key, "inc-1", workflow_id=self.workflow_id)
        self.mem.ensure_subscription("inc-1", workflow_id=self.workflow_id)
        await self.sql.begin_subscription(self.key, 1)
        LEDGER_ACTIVITIES[Act.BEGIN_SUBSCRIPTION](self.mem, BeginSubscriptionRequest(key=self.key,
                                                                                     session_generation=1))
        await self.sql.mark_active(self.key, 1, 1)
        LEDGER_ACTIVITIES[Act.MARK_ACTIVE](self.mem, MarkActiveRequest(key=self.key, session_generation=1,
                                                                       subscription_generation=1))
        await self.same()

    async def allocate(self, name: str, cycle_id: str | None = None) -> tuple[int, str]:
        req = AllocateRequest(key=self.key, session_generation=1, subscription_generation=1, min_ordinal=1,
                              request_id=f"{self.key.workflow_id}/{name}", trigger=TriggerReason.UPDATED,
                              cycle_id=cycle_id)
        ticket = await self.sql.fence.allocate_read(req)
        assert ticket == await self.mem.allocate_read(req) and ticket.granted
        return ticket.ordinal, ticket.request_id

    async def accept(self, read: tuple[int, str], kind: ReadOutcomeKind, digest: str | None = None,
                     guardrail: str | None = None) -> AcceptVerdict:
        outcome = ReadOutcome(kind=kind, key=self.key, ordinal=read[0], request_id=read[1],
                              session_generation=1, subscription_generation=1, trigger=TriggerReason.UPDATED,
                              content_digest=digest, mime_type="text/plain", server_version="v1",
                              guardrail_rejection=guardrail)
        req = AcceptRequest(outcome=outcome, expected_state=S.ACTIVE, close_epoch=0)
        (sql, sql_judged), (mem, mem_judged) = await self.sql.fence.accept_judged(req), \
            self.mem.accept_judged(req)
        receipts = await self._receipt_ids()
        assert (sql.verdict, sql.reason, sql.watermark, sql.last_accepted_ordinal, sql.outbox_id is None,
                sql_judged) == (mem.verdict, mem.reason, mem.watermark, mem.last_accepted_ordinal,
                                mem.outbox_id is None, mem_judged)
        self.judged = sql_judged
        assert _position(receipts, sql.receipt_id) == _position([r.receipt_id for r in self.mem.receipts],
                                                                mem.receipt_id)
        await self.same()
        return sql.verdict

    async def same(self) -> None:
        """The fence row, the receipts and the outbox rows agree."""
        receipt_ids = await self._receipt_ids()
        mem_receipt_ids = [r.receipt_id for r in self.mem.receipts]
        sql_row, mem_row = await self.sql.load_fence(self.key), self.mem.row
        assert _comparable(sql_row, receipt_ids) == _comparable(mem_row, mem_receipt_ids)
        sql_receipts = await ledger_rows(self.sql, "SELECT read_ordinal, status, content_digest, request_id"
                                         " FROM resource_versions WHERE workflow_id=%s ORDER BY receipt_id",
                                         self.workflow_id)
        assert [tuple(r) for r in sql_receipts] == \
            [(r.ordinal, r.status.value, r.digest, r.request_id) for r in self.mem.receipts]
        sql_outbox = await ledger_rows(self.sql, "SELECT event_type, read_ordinal, content_digest, receipt_id"
                                       " FROM outbox WHERE workflow_id=%s ORDER BY outbox_id",
                                       self.workflow_id)
        assert [(e, o, d, _position(receipt_ids, r)) for e, o, d, r in sql_outbox] == \
            [(e.event_type, e.ordinal, e.digest, _position(mem_receipt_ids, e.receipt_id))
             for e in self.mem.outbox]

    async def _receipt_ids(self) -> list[int]:
        rows = await ledger_rows(self.sql, "SELECT receipt_id FROM resource_versions WHERE workflow_id=%s"
                                 " ORDER BY receipt_id", self.workflow_id)
        return [int(r[0]) for r in rows]


def _position(ids: list[int], receipt_id: int | None) -> int | None:
    return ids.index(receipt_id) if receipt_id in ids else None


def _comparable(row: FenceSnapshot, receipt_ids: list[int]) -> dict[str, Any]:
    return row.model_dump() | {"last_receipt_id": _position(receipt_ids, row.last_receipt_id)}


async def test_reads_a_tombstone_and_a_replay_write_alike(ledger: Ledger) -> None:
    both = Both(ledger)
    await both.start()
    assert await both.accept(await both.allocate("r1"), ReadOutcomeKind.CONTENT, "sha256:a") == V.ACCEPTED
    late, r3 = await both.allocate("r2"), await both.allocate("r3")
    assert await both.accept(r3, ReadOutcomeKind.CONTENT, "sha256:b") == V.ACCEPTED
    assert await both.accept(late, ReadOutcomeKind.CONTENT, "sha256:old") == V.STALE
    assert await both.accept(r3, ReadOutcomeKind.CONTENT, "sha256:b") == V.ACCEPTED  # a retry: replayed
    assert await both.accept(await both.allocate("r4"), ReadOutcomeKind.CONTENT, "sha256:b") == V.UNCHANGED
    # A retry that read again after r4: the replay names r3's read (its digest), at r3's position.
    assert await both.accept(r3, ReadOutcomeKind.CONTENT, "sha256:d") == V.ACCEPTED
    assert both.judged == "sha256:b"
    assert await both.accept(await both.allocate("r5"), ReadOutcomeKind.CONTENT, "sha256:c",
                             guardrail="too large") == V.GUARDRAIL_REJECTED
    assert await both.accept(await both.allocate("r6"), ReadOutcomeKind.MALFORMED) == V.REJECTED
    assert await both.accept(await both.allocate("r7"), ReadOutcomeKind.NOT_FOUND) == V.TOMBSTONE_PENDING
    await ledger.confirm_tombstone(both.key, listed=False, scan_id="c1")
    both.mem.confirm_tombstone(False, "c1", False)
    await both.same()
    assert both.mem.row.state == S.TOMBSTONED and both.mem.outbox[-1].event_type == "tombstoned"
    # The catalog's receipt reads back (its trigger was once a string no TriggerReason knew).
    receipts = await ledger.reports.receipts(both.key)
    assert receipts[-1].status == V.TOMBSTONED and receipts[-1].trigger == TriggerReason.CATALOG


async def test_close_fences_late_reads_alike(ledger: Ledger) -> None:
    both = Both(ledger)
    await both.start()
    assert await both.accept(await both.allocate("r1"), ReadOutcomeKind.CONTENT, "sha256:a") == V.ACCEPTED
    in_flight = await both.allocate("r2")
    assert await ledger.begin_unsubscribe(both.key) == both.mem.begin_unsubscribe()
    assert await ledger.begin_unsubscribe(both.key) == both.mem.begin_unsubscribe()  # idempotent
    assert await both.accept(in_flight, ReadOutcomeKind.CONTENT, "sha256:b") == V.STALE_AFTER_CLOSE


async def test_revocations_write_alike(ledger: Ledger) -> None:
    by_platform, by_read, by_catalog = Both(ledger), Both(ledger), Both(ledger)
    for both in (by_platform, by_read, by_catalog):
        await both.start()
        assert await both.accept(await both.allocate("r1"), ReadOutcomeKind.CONTENT, "sha256:a") == V.ACCEPTED
    for _ in range(2):  # the second revocation writes nothing
        await ledger.revoke(by_platform.key, reason="gone", source="platform", effective_at=datetime.now(UTC))
        by_platform.mem.revoke()
        await by_platform.same()
    assert await by_read.accept(await by_read.allocate("r2"), ReadOutcomeKind.DENIED) == V.REVOKED
    await ledger.confirm_tombstone(by_catalog.key, listed=False, scan_id="c9", proven=True)
    by_catalog.mem.confirm_tombstone(False, "c9", True)
    await by_catalog.same()
    for both in (by_platform, by_read, by_catalog):
        assert both.mem.row.state == S.REVOKED and [e.event_type for e in both.mem.outbox] == \
            ["version_accepted", "revoked"]
        assert len(await ledger_rows(ledger, "SELECT 1 FROM revocations WHERE workflow_id=%s",
                                     both.key.workflow_id)) == 1


async def test_the_recorded_workflow_id_alike(ledger: Ledger) -> None:
    """A row created by a workflow under the legacy id: both ledgers keep that id (a second id
    changes nothing and is audited), write reads, receipts and outbox rows under it, and
    ``note_notification`` answers it with the same update counter."""
    both = Both(ledger, legacy_id=True)
    await both.start()
    assert await both.accept(await both.allocate("r1"), ReadOutcomeKind.CONTENT, "sha256:a") == V.ACCEPTED
    assert await ledger.reports.read_count(both.key) == len(both.mem.read_requests) == 1
    sql = await ledger.fence.note_notification(both.key.subject, both.key.server, both.key.uri, 1)
    mem = both.mem.note_notification(1)
    assert sql is not None and mem is not None
    assert (sql.workflow_id,
            sql.fence.notifications_seen) == (mem.workflow_id, mem.fence.notifications_seen) == \
        (both.key.legacy_workflow_id, 1)
    await ledger.ensure_subscription(both.key, "inc-1", workflow_id=both.key.workflow_id)
    both.mem.ensure_subscription("inc-1", workflow_id=both.key.workflow_id)
    assert await ledger.fence.workflow_id_of(both.key) == both.mem.workflow_id == both.key.legacy_workflow_id
    mismatches = await ledger_rows(ledger, "SELECT count(*) FROM audit WHERE kind='WORKFLOW_ID_MISMATCH'"
                                   " AND subject=%s", both.key.subject)
    assert mismatches[0][0] == both.mem.audit.count("WORKFLOW_ID_MISMATCH") == 1
    await both.same()


async def test_the_coverage_rule_alike(ledger: Ledger) -> None:
    """``coverage.plan_note`` / ``plan_allocate`` / ``covered_after`` in both ledgers: the note's
    work and the row's notified / covered / allocated_sequence agree after every step."""
    both = Both(ledger)
    await both.start()
    k = both.key

    async def note(generation: int = 1) -> bool:
        sql = await ledger.fence.note_notification(k.subject, k.server, k.uri, generation)
        assert sql is not None
        mem = both.mem.note_notification(generation)
        assert mem is not None and sql.work == mem.work
        assert (sql.fence.notifications_seen,
                sql.fence.covered) == (mem.fence.notifications_seen, mem.fence.covered)
        return sql.work

    assert await note()  # clean -> dirty: work
    assert not await note()  # a copy: the read the first one earns covers it
    first = await both.allocate("cycle-1", cycle_id="run/1")
    assert await both.allocate("cycle-1", cycle_id="run/1") == first  # a retry holds the same ticket
    assert await note()  # a read allocated before it may be in flight: work
    assert await both.accept(first, ReadOutcomeKind.CONTENT, "sha256:a") == AcceptVerdict.ACCEPTED
    await both.same()
    row = await ledger.load_fence(k)
    assert (row.notifications_seen, row.covered, row.allocated_sequence) == (3, 2, 2)
    failed = await both.allocate("cycle-2", cycle_id="run/2")
    assert await both.accept(failed, ReadOutcomeKind.TRANSIENT) == AcceptVerdict.REJECTED
    assert (await ledger.load_fence(k)).covered == 2  # a failed read covers nothing
    assert await note(generation=2)  # another session generation than the row's: work, counted
    assert await note(generation=0)  # an older one: work (the workflow audits it), not counted
    assert (await ledger.load_fence(k)).notifications_seen == 4
    await both.same()
    # Not ACTIVE: always work (the workflow learns the state from the read it then tries).
    await ledger.set_state(k, S.TOMBSTONE_PENDING, allowed_from=[S.ACTIVE])
    LEDGER_ACTIVITIES[Act.SET_STATE](both.mem, SetStateRequest(key=k, state=S.TOMBSTONE_PENDING,
                                                               allowed_from=[S.ACTIVE]))
    assert await note()
    await both.same()


async def test_the_sweeps_look_alike(ledger: Ledger) -> None:
    """The sweep's synthetic note (``count=False``) writes nothing in either store: it answers the row
    and ``plan_note``'s work, and the read that follows covers what the row counted at its allocation
    (a clean row stays clean; a dirty one is covered)."""
    both = Both(ledger)
    await both.start()
    k = both.key

    async def look() -> bool:
        sql = await ledger.fence.note_notification(k.subject, k.server, k.uri, 1, count=False)
        mem = both.mem.note_notification(1, count=False)
        assert sql is not None and mem is not None and sql.work == mem.work
        assert (sql.fence.notifications_seen,
                sql.fence.covered) == (mem.fence.notifications_seen, mem.fence.covered)
        await both.same()
        return sql.work

    assert await ledger.fence.note_notification(k.subject, k.server, "demo://nobody", 1, count=False) is None
    before = await ledger.load_fence(k)
    assert await look()  # clean: the work is a read (the workflow's, where nothing reads here)
    assert (await ledger.load_fence(k)).notifications_seen == before.notifications_seen == 0
    assert await both.accept(await both.allocate("swept"), ReadOutcomeKind.CONTENT, "sha256:a") == V.ACCEPTED
    row = await ledger.load_fence(k)
    assert (row.notifications_seen, row.covered) == (0, 0)  # no notification, none owed
    sql = await ledger.fence.note_notification(k.subject, k.server, k.uri, 1)  # a notification: counted
    assert sql is not None and both.mem.note_notification(1) is not None
    assert not await look()  # dirty: the notification's own read owns the work
    assert await both.accept(await both.allocate("swept-2"), ReadOutcomeKind.CONTENT, "sha256:a") == \
        V.UNCHANGED
    row = await ledger.load_fence(k)
    assert (row.notifications_seen, row.covered) == (1, 1)


async def test_a_reopened_row_and_the_resync_period_alike(ledger: Ledger) -> None:
    """A closed row a new incarnation reopens has no current digest in either store (its first read
    publishes again), and ``mark_active`` records the run's safety-read period in both."""
    both = Both(ledger)
    await both.start()
    assert await both.accept(await both.allocate("r1"), ReadOutcomeKind.CONTENT, "sha256:a") == V.ACCEPTED
    await ledger.begin_unsubscribe(both.key)
    both.mem.begin_unsubscribe()
    await ledger.finish_unsubscribe(both.key, True)
    LEDGER_ACTIVITIES[Act.FINISH_UNSUBSCRIBE](both.mem, FinishUnsubscribeRequest(key=both.key, acked=True))
    await ledger.ensure_subscription(both.key, "inc-2", workflow_id=both.workflow_id)
    both.mem.ensure_subscription("inc-2", workflow_id=both.workflow_id)
    await both.same()
    assert both.mem.row.state == S.DISCOVERED and both.mem.row.last_accepted_digest is None
    await ledger.begin_subscription(both.key, 2)
    LEDGER_ACTIVITIES[Act.BEGIN_SUBSCRIPTION](both.mem, BeginSubscriptionRequest(key=both.key,
                                                                                 session_generation=2))
    mark = MarkActiveRequest(key=both.key, session_generation=2, subscription_generation=2, read_reports=True,
                             safety_read_seconds=300.0)
    await ledger.fence.mark_active(mark)
    LEDGER_ACTIVITIES[Act.MARK_ACTIVE](both.mem, mark)
    await both.same()
    stored = await ledger_rows(ledger, "SELECT safety_read_seconds FROM subscriptions WHERE workflow_id=%s",
                               both.workflow_id)
    assert stored[0][0] == both.mem.safety_read_seconds == 300.0


async def test_the_start_call_alike(ledger: Ledger) -> None:
    """``Act.START_SUBSCRIPTION`` (a new run's ensure, current session and begin as one call) answers
    and writes alike in both stores: no session, no begin; a session and ``begin``: subscription
    generation 1 on it; not asked to begin, or a row no longer DISCOVERED: nothing begun."""
    both = Both(ledger)
    ensure = EnsureRequest(key=both.key, incarnation="inc-1")
    start = LEDGER_ACTIVITIES[Act.START_SUBSCRIPTION]

    async def call(begin: bool) -> SubscriptionStarted:
        req = StartSubscriptionRequest(ensure=ensure, begin=begin)
        sql, mem = await ledger.fence.start_subscription(req), start(both.mem, req)
        assert _comparable(sql.fence, []) == _comparable(mem.fence, [])
        assert (sql.begun is None) == (mem.begun is None)
        if sql.begun is not None and mem.begun is not None:
            assert _comparable(sql.begun, []) == _comparable(mem.begun, [])
        assert (sql.session and sql.session.generation) == (mem.session and mem.session.generation)
        await both.same()
        return sql

    none = await call(True)  # no live session yet: ensured, nothing begun
    assert none.fence.state == S.DISCOVERED and none.session is None and none.begun is None
    assert await ledger.sessions.acquire_lease(both.key.subject, both.key.server, "h", 60.0)
    both.mem.session = await ledger.sessions.open_session(
        subject=both.key.subject, server=both.key.server, edition="e1", capabilities={"subscribe": True},
        server_name="fixture", server_version="1", task_queue="q", host_id="h")
    asked_not = await call(False)  # the run has a signal's work first: not begun
    assert asked_not.session is not None and asked_not.begun is None
    begun = await call(True)
    assert begun.begun is not None and begun.begun.state == S.SUBSCRIBING
    assert (begun.begun.session_generation, begun.begun.subscription_generation) == (1, 1)
    again = await call(True)  # SUBSCRIBING now: not DISCOVERED, the run decides (ledger_flow.begins_at_start)
    assert again.fence.state == S.SUBSCRIBING and again.begun is None


async def test_the_start_call_is_one_transaction(ledger: Ledger) -> None:
    """A new run's start (ensure, current session, begin) commits as ONE transaction: the row it creates
    and the begin that moves it to SUBSCRIBING carry the same transaction's ``now()``. Separate
    transactions (a pool checkout and a commit each) would stamp them apart."""
    both = Both(ledger)
    assert await ledger.sessions.acquire_lease(both.key.subject, both.key.server, "h", 60.0)
    await ledger.sessions.open_session(
        subject=both.key.subject, server=both.key.server, edition="e1", capabilities={"subscribe": True},
        server_name="fixture", server_version="1", task_queue="q", host_id="h")
    started = await ledger.fence.start_subscription(
        StartSubscriptionRequest(ensure=EnsureRequest(key=both.key, incarnation="inc-1"), begin=True))
    assert started.begun is not None and started.begun.state == S.SUBSCRIBING
    rows = await ledger_rows(ledger, "SELECT created_at, updated_at FROM subscriptions WHERE workflow_id=%s",
                             both.workflow_id)
    assert rows[0][0] == rows[0][1], rows
