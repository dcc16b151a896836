"""The pure state machine and fence rules, driven without Temporal or PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mcpsync.workflows.coverage import plan_allocate
from mcpsync.workflows.ingress_rules import ingress_read_request
from mcpsync.workflows.ledger_rules import (
    IssuedRead,
    close_rule,
    judge_read,
    marked_active,
)
from mcpsync.workflows.records.ledger import (
    AcceptResult,
    AcceptVerdict,
    FenceSnapshot,
    NotedNotification,
    ReadTicket,
)
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import (
    ResourceUpdated,
    SubscriptionKey,
    SubscriptionState,
    TriggerReason,
)
from mcpsync.workflows.subscription_state import FenceState, SubscriptionFence, UpdateDisposition

KEY = SubscriptionKey(subject="s", server="srv", uri="demo://x")
S = SubscriptionState


def row(**kw: object) -> FenceSnapshot:
    base: dict[str, object] = dict(exists=True, state=S.ACTIVE, session_generation=1,
                                   subscription_generation=1)
    base.update(kw)
    return FenceSnapshot.model_validate(base)


def outcome(ordinal: int, digest: str | None = "sha256:a", kind: ReadOutcomeKind = ReadOutcomeKind.CONTENT,
            sg: int = 1) -> ReadOutcome:
    return ReadOutcome(kind=kind, key=KEY, ordinal=ordinal, request_id=f"r{ordinal}", session_generation=sg,
                       subscription_generation=1, trigger=TriggerReason.UPDATED, content_digest=digest)


def issued(ordinal: int, sg: int = 1) -> IssuedRead:
    return IssuedRead(ordinal=ordinal, request_id=f"r{ordinal}", session_generation=sg,
                      subscription_generation=1)


def active_fence() -> SubscriptionFence:
    f = SubscriptionFence(FenceState(key=KEY))
    f.adopt(row())
    return f


def test_allocation_requires_active_and_matching_generations() -> None:
    def ordinal(r: FenceSnapshot, min_ordinal: int) -> int | None:
        plan = plan_allocate(r, session_generation=1, subscription_generation=1, min_ordinal=min_ordinal)
        return None if plan is None else plan.ordinal

    assert ordinal(row(last_issued_ordinal=4), 2) == 5
    assert ordinal(row(last_issued_ordinal=4), 9) == 9
    assert ordinal(row(state=S.UNSUBSCRIBING), 1) is None
    assert ordinal(row(session_generation=2), 1) is None


def test_judge_orders_reads_by_ordinal() -> None:
    r = row(last_issued_ordinal=6, last_accepted_ordinal=6, last_accepted_digest="sha256:b")
    assert judge_read(r, issued(5), outcome(5), row_uri=KEY.uri).verdict == AcceptVerdict.STALE
    r = row(last_issued_ordinal=6, last_accepted_ordinal=4, last_accepted_digest="sha256:a")
    j = judge_read(r, issued(5), outcome(5, "sha256:b"), row_uri=KEY.uri)
    assert j.verdict == AcceptVerdict.ACCEPTED and j.outbox and j.advance
    j = judge_read(r, issued(5), outcome(5, "sha256:a"), row_uri=KEY.uri)
    assert j.verdict == AcceptVerdict.UNCHANGED and not j.outbox and j.advance


def test_judge_fences_closed_unknown_and_old_generation() -> None:
    closed = row(state=S.UNSUBSCRIBING, close_ordinal=3)
    for kind in (ReadOutcomeKind.CONTENT, ReadOutcomeKind.NOT_FOUND):
        j = judge_read(closed, issued(3), outcome(3, kind=kind), row_uri=KEY.uri)
        assert j.verdict == AcceptVerdict.STALE_AFTER_CLOSE and not j.write_receipt and not j.outbox
    assert judge_read(row(), None, outcome(1), row_uri=KEY.uri).verdict == AcceptVerdict.REJECTED
    assert judge_read(row(), issued(1), outcome(1), row_uri="demo://X").verdict == AcceptVerdict.REJECTED
    j = judge_read(row(session_generation=2), issued(1), outcome(1), row_uri=KEY.uri)
    assert j.verdict == AcceptVerdict.STALE and not j.advance


def test_not_found_while_active_is_tombstone_pending() -> None:
    j = judge_read(row(), issued(1), outcome(1, None, ReadOutcomeKind.NOT_FOUND), row_uri=KEY.uri)
    assert (j.verdict == AcceptVerdict.TOMBSTONE_PENDING and j.new_state == S.TOMBSTONE_PENDING
            and not j.outbox)


def test_close_rule_freezes_last_issued_and_is_idempotent() -> None:
    assert close_rule(row(last_issued_ordinal=7, close_epoch=2)) == (S.UNSUBSCRIBING, 3, 7)
    assert close_rule(row(state=S.UNSUBSCRIBING)) is None
    assert close_rule(row(state=S.CLOSED)) is None


def read_cycle(f: SubscriptionFence, ticket: ReadTicket) -> bool:
    """As the program runs one: the slot is reserved, the cycle returns, then ``issued``."""
    _, placeholder = f.reserve_read(1)
    f.release_placeholder(placeholder)
    return f.issued(ticket)


def judged(verdict: AcceptVerdict, ordinal: int, *, notified: int, covered: int) -> AcceptResult:
    """An accept's answer with the row's level after it."""
    return AcceptResult(verdict=verdict, watermark=ordinal, last_accepted_ordinal=ordinal, notified=notified,
                        covered=covered)


def test_duplicates_coalesce_into_one_follow_up_read() -> None:
    f = active_fence()
    sig = ResourceUpdated(uri=KEY.uri, session_generation=1)
    assert f.note_update(sig) == UpdateDisposition.NOTED
    assert f.read_wanted() == TriggerReason.UPDATED
    _, placeholder = f.reserve_read(1)
    for _ in range(20):
        assert f.note_update(sig) == UpdateDisposition.NOTED
    assert f.read_wanted() is None  # one in flight
    f.release_placeholder(placeholder)
    assert f.issued(ReadTicket(granted=True, ordinal=1, request_id="r1", notifications_seen=1))
    # 20 notifications were recorded after the allocation: the row is dirty, one follow-up
    f.applied(1, judged(AcceptVerdict.ACCEPTED, 1, notified=21, covered=1), read_notified=1,
              trigger=TriggerReason.UPDATED)
    assert f.read_wanted() == TriggerReason.FOLLOW_UP
    assert read_cycle(f, ReadTicket(granted=True, ordinal=2, request_id="r2", notifications_seen=21))
    f.applied(2, judged(AcceptVerdict.UNCHANGED, 2, notified=21, covered=21), read_notified=21,
              trigger=TriggerReason.FOLLOW_UP)
    assert f.read_wanted() is None and f.s.reads_issued == 2


def test_old_session_notifications_are_ignored_and_future_ones_flagged() -> None:
    f = active_fence()
    f.adopt(row(session_generation=3))
    assert f.note_update(ResourceUpdated(uri=KEY.uri, session_generation=2)) == UpdateDisposition.OLD_SESSION
    assert f.note_update(ResourceUpdated(uri=KEY.uri,
                                         session_generation=4)) == UpdateDisposition.FUTURE_SESSION
    assert f.note_update(ResourceUpdated(uri="demo://y", session_generation=3)) == UpdateDisposition.WRONG_URI
    assert f.read_wanted() is None


def test_adopt_never_moves_ordinals_back_and_closed_never_reopens() -> None:
    f = active_fence()
    f.adopt(row(last_issued_ordinal=9, last_accepted_ordinal=8, watermark=8))
    f.adopt(row(last_issued_ordinal=2, last_accepted_ordinal=1, watermark=1))  # a rewound view
    assert (f.s.last_issued_ordinal, f.s.last_accepted_ordinal, f.s.watermark) == (9, 8, 8)
    f.adopt(row(state=S.CLOSED))
    f.adopt(row(state=S.ACTIVE))
    assert f.s.state == S.CLOSED and f.finished
    assert f.note_update(ResourceUpdated(uri=KEY.uri, session_generation=1)) == UpdateDisposition.NOT_ACTIVE


def test_updates_recorded_before_the_allocation_need_no_read_of_their_own() -> None:
    f = active_fence()
    f.s.pending_trigger = TriggerReason.INITIAL
    # The ingress recorded updates 1 and 2 before this read was allocated: the read observes them.
    assert read_cycle(f, ReadTicket(granted=True, ordinal=1, request_id="r1", notifications_seen=2))
    f.applied(1, judged(AcceptVerdict.ACCEPTED, 1, notified=2, covered=2), read_notified=2,
              trigger=TriggerReason.INITIAL)
    assert f.read_wanted() is None
    # A later update (the row was clean: the ingress signals it) earns its own read.
    assert f.note_update(ResourceUpdated(uri=KEY.uri, session_generation=1)) == UpdateDisposition.NOTED
    assert f.read_wanted() == TriggerReason.UPDATED


def test_updates_a_failed_read_covered_by_the_way_get_one_read() -> None:
    # Simulator finding F7: the read covering an update came back malformed; the change went unread.
    f = active_fence()
    f.s.pending_trigger = TriggerReason.INITIAL
    assert read_cycle(f, ReadTicket(granted=True, ordinal=1, request_id="r1", notifications_seen=1))
    f.applied(1, AcceptResult(verdict=AcceptVerdict.REJECTED, reason="malformed", notified=1, covered=0),
              read_notified=1, trigger=TriggerReason.INITIAL)
    assert f.read_wanted() == TriggerReason.FOLLOW_UP
    # That follow-up failing too is not retried (a failing server is not read in a loop) ...
    assert read_cycle(f, ReadTicket(granted=True, ordinal=2, request_id="r2", notifications_seen=1))
    f.applied(2, AcceptResult(verdict=AcceptVerdict.REJECTED, reason="malformed", notified=1, covered=0),
              read_notified=1, trigger=TriggerReason.FOLLOW_UP)
    assert f.read_wanted() is None
    # ... unless a notification was recorded after its allocation.
    f.s.pending_trigger = TriggerReason.UPDATED
    assert read_cycle(f, ReadTicket(granted=True, ordinal=3, request_id="r3", notifications_seen=2))
    f.applied(3, AcceptResult(verdict=AcceptVerdict.REJECTED, reason="malformed", notified=3, covered=0),
              read_notified=2, trigger=TriggerReason.UPDATED)
    assert f.read_wanted() == TriggerReason.FOLLOW_UP


def test_a_read_that_is_abandoned_resubscribes() -> None:
    f = active_fence()
    f.s.pending_trigger = TriggerReason.INITIAL
    assert read_cycle(f, ReadTicket(granted=True, ordinal=4, request_id="r4", notifications_seen=7))
    f.session_lost(4)
    assert f.read_wanted() == TriggerReason.RESUBSCRIBE and f.s.in_flight == []


def test_a_finished_fence_never_leaves_its_terminal_state() -> None:
    # Simulator finding F10: a verdict judged before the revocation lands after it.
    f = active_fence()
    f.s.pending_trigger = TriggerReason.UPDATED
    assert read_cycle(f, ReadTicket(granted=True, ordinal=1, request_id="r1"))
    f.adopt(row(state=S.REVOKED))
    f.applied(1, AcceptResult(verdict=AcceptVerdict.TOMBSTONE_PENDING, watermark=1, last_accepted_ordinal=1))
    assert f.s.state == S.REVOKED and f.finished
    f.adopt(row(state=S.ACTIVE))  # a snapshot read before the revocation committed
    assert f.s.state == S.REVOKED
    f.adopt(row(state=S.CLOSED))  # the ledger may still name another terminal state
    assert f.s.state == S.CLOSED


def test_an_unlisted_catalog_measured_before_our_read_saw_content_is_stale() -> None:
    from datetime import UTC, datetime, timedelta

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    f = active_fence()
    f.observed(AcceptResult(verdict=AcceptVerdict.ACCEPTED, watermark=1, last_accepted_ordinal=1),
               allocated_at=t0, now=t0)
    assert f.catalog_word_is_stale(listed=False, measured_at=t0 - timedelta(seconds=1))
    assert not f.catalog_word_is_stale(listed=False, measured_at=t0 + timedelta(seconds=1))
    assert not f.catalog_word_is_stale(listed=True, measured_at=t0 - timedelta(seconds=1))  # agrees with us


# --- deadlines (issue 15) ----------------------------------------------------------------------------


def _polling_fence(bound: float = 30.0) -> SubscriptionFence:
    from mcpsync.workflows.records.ledger import FenceSnapshot
    f = SubscriptionFence(FenceState(key=KEY))
    f.adopt(FenceSnapshot(exists=True, state=S.ACTIVE, session_generation=1, subscription_generation=1))
    f.subscribed(FenceSnapshot(exists=True, state=S.ACTIVE, session_generation=1, subscription_generation=1),
                 poll_interval_seconds=bound)
    return f


def test_deadline_is_armed_by_allocation_and_no_wake_up_moves_it() -> None:
    from datetime import UTC, datetime, timedelta
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    f = _polling_fence(30.0)
    f.s.pending_trigger = None
    f.arm_read_deadline(requested_at=t0, period_seconds=f.read_period(300.0), jitter=0.5)
    due = f.s.read_due_at
    assert due == t0 + timedelta(seconds=27)  # 0.8 + 0.2 * 0.5 of the bound: early, never late
    for wake in range(1, 27):  # catalog words, covered notifications, rechecks: each a pass of the loop
        now = t0 + timedelta(seconds=wake)
        assert not f.poll_if_due(now, period_seconds=30.0)
        assert f.until_read_due(now) == due - now and f.s.read_due_at == due
    assert f.poll_if_due(due, period_seconds=30.0) and f.s.pending_trigger == TriggerReason.POLL
    assert f.until_read_due(due) is None  # a read is requested: nothing left to time


def test_deadline_waits_for_an_allocation_on_its_way_and_arms_when_missing() -> None:
    from datetime import UTC, datetime, timedelta
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    f = _polling_fence(10.0)
    f.s.pending_trigger = None
    f.s.in_flight.append(-1)  # an ordinal requested, not granted: its grant re-arms the deadline
    f.s.read_due_at = t0
    assert not f.poll_if_due(t0 + timedelta(seconds=5), period_seconds=10.0)
    assert f.until_read_due(t0 + timedelta(seconds=5)) is None
    f.s.in_flight.clear()
    f.s.read_due_at = None  # carried from a run before deadlines existed
    assert not f.poll_if_due(t0, period_seconds=10.0) and f.s.read_due_at == t0 + timedelta(seconds=10)
    # The safety period applies when subscribed (no published bound); none at all when disabled.
    f.s.staleness_bound_seconds = None
    assert f.read_period(300.0) == 300.0 and f.read_period(0.0) is None


# --- identity reconciliation (issue 14) ---------------------------------------------------------------


def test_reconciliation_is_bounded_and_resolved_only_by_evidence_measured_after_it() -> None:
    from datetime import UTC, datetime, timedelta

    from mcpsync.workflows.records.ledger import FenceSnapshot
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    f = _polling_fence(30.0)
    assert f.identity_conflict("identity conflict: x", now=t0, observed_uri="demo://X")
    assert f.s.state == S.RECONCILIATION_REQUIRED and f.s.conflict_uris == ["demo://X"]
    # A second conflict does not extend the bound.
    assert f.identity_conflict("identity conflict: y", now=t0 + timedelta(seconds=50), observed_uri="demo://Y")
    assert f.reconciliation_deadline(t0 + timedelta(seconds=60), 900) == t0 + timedelta(seconds=900)
    # A catalog measured before the conflict, or one that does not list the exact URI, is no evidence.
    assert not f.identity_evidence(listed=True, measured_at=t0 - timedelta(seconds=1))
    assert not f.identity_evidence(listed=False, measured_at=t0 + timedelta(seconds=5))
    assert f.identity_evidence(listed=True, measured_at=t0 + timedelta(seconds=5))
    assert f.s.reconciled_variants == ["demo://X", "demo://Y"]
    f.resumed(FenceSnapshot(exists=True, state=S.ACTIVE, session_generation=1, subscription_generation=1))
    assert f.s.state == S.ACTIVE and f.s.pending_trigger == TriggerReason.INITIAL and f.s.conflict_uris == []
    f.s.pending_trigger = None
    # The same stray variant again: an invalidation (a read of our exact URI), not another freeze.
    assert f.variant_already_reconciled("demo://X") and f.s.pending_trigger == TriggerReason.UPDATED
    assert not f.variant_already_reconciled("demo://Z")


def test_a_verification_read_clears_the_catalog_detail_and_not_found_says_why() -> None:
    from datetime import UTC, datetime

    from mcpsync.workflows.records.ledger import AcceptResult, AcceptVerdict
    from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind

    f = _polling_fence(30.0)
    f.s.detail = "not listed in catalog scan-7 (unproven): verifying by read"
    base = {"key": KEY, "ordinal": 3, "request_id": "r3", "session_generation": 1,
            "subscription_generation": 1, "trigger": TriggerReason.POLL}
    content = ReadOutcome(kind=ReadOutcomeKind.CONTENT, content_digest="sha256:aa", **base)
    f.read_judged(3, content, AcceptResult(verdict=AcceptVerdict.UNCHANGED, reason="digest unchanged"))
    assert f.s.detail == ""  # the verification read finished: the stale explanation goes
    gone = ReadOutcome(kind=ReadOutcomeKind.NOT_FOUND, error_code=-32602, **base)
    f.s.state = S.TOMBSTONE_PENDING
    f.read_judged(4, gone, AcceptResult(verdict=AcceptVerdict.TOMBSTONE_PENDING, reason="not found while "
                                                                                        "ACTIVE"))
    assert f.s.detail.startswith("read 4: not found (code -32602); waiting for a reconciled catalog")
    f.s.state = S.CLOSED
    f.finish(datetime(2026, 1, 1, tzinfo=UTC))
    assert f.record().ended_at == datetime(2026, 1, 1, tzinfo=UTC) and f.record().next_read_due_at is None


def test_the_ingress_reads_only_for_an_active_row_whose_run_mirrors_reports() -> None:
    """``ingress_read_request``: a read-cycle request on the row's own fence, only for an ACTIVE row on
    the notification's generation whose run takes reports."""
    ready = row(read_reports=True, last_issued_ordinal=7, close_epoch=2, subscription_generation=3,
                notifications_seen=9)
    noted = NotedNotification(workflow_id="wf", fence=ready)
    req = ingress_read_request(noted, KEY, generation=1, request_id="r1")
    assert req is not None
    assert (req.allocate.session_generation, req.allocate.subscription_generation,
            req.allocate.min_ordinal) == (1, 3, 8)
    assert req.allocate.trigger == TriggerReason.UPDATED and req.allocate.cycle_id is None
    assert req.expected_state == S.ACTIVE and req.close_epoch == 2
    refused = [NotedNotification(workflow_id="wf", fence=ready.model_copy(update={"read_reports": False})),
               NotedNotification(workflow_id="wf", fence=ready.model_copy(update={"state": S.SUBSCRIBING})),
               NotedNotification(workflow_id="wf",
                                 fence=ready.model_copy(update={"state": S.TOMBSTONE_PENDING}))]
    for n in refused:
        assert ingress_read_request(n, KEY, generation=1, request_id="r1") is None
    assert ingress_read_request(noted, KEY, generation=2, request_id="r1") is None  # another session


def test_a_reported_read_hands_over_what_it_leaves_dirty_and_never_moves_the_deadline_back() -> None:
    f = SubscriptionFence(FenceState(key=KEY, state=S.ACTIVE, session_generation=1, subscription_generation=1,
                                     last_issued_ordinal=4))
    at = datetime(2026, 1, 1, tzinfo=UTC)
    f.arm_read_deadline(requested_at=at, period_seconds=60, jitter=0.5)
    ticket = ReadTicket(granted=True, ordinal=6, request_id="r", notifications_seen=5)
    assert f.issued(ticket, in_flight=False)
    assert f.s.last_issued_ordinal == 6 and f.s.in_flight == [] and f.s.reads_issued == 1
    assert not f.issued(ReadTicket(granted=False), in_flight=False)
    f.applied(6, judged(AcceptVerdict.ACCEPTED, 6, notified=5, covered=5), read_notified=5)
    assert f.read_wanted() is None  # clean: nothing owed
    # A report the ledger judged but that observed nothing: the row stays dirty, the run reads.
    assert f.issued(ReadTicket(granted=True, ordinal=7, request_id="s", notifications_seen=6),
                    in_flight=False)
    f.applied(7, AcceptResult(verdict=AcceptVerdict.REJECTED, notified=6, covered=5), read_notified=6)
    assert f.read_wanted() == TriggerReason.FOLLOW_UP
    assert f.report_deadline(at + timedelta(seconds=1)) and not f.report_deadline(at)
    f.s.state = S.TOMBSTONE_PENDING
    assert not f.report_deadline(at + timedelta(seconds=1))


def _start_window(updates: int = 0) -> SubscriptionFence:
    """A start cycle in flight (``start_cycle_reserve`` after ``subscribing``), with ``updates``
    noted meanwhile."""
    f = SubscriptionFence(FenceState(key=KEY, pending_trigger=TriggerReason.RESUBSCRIBE))
    subscribing = FenceSnapshot(exists=True, state=S.SUBSCRIBING, session_generation=1,
                                subscription_generation=1)
    assert f.subscribing(subscribing, "2025-11-25", {"subscribe": True})
    f.start_cycle_reserve()
    assert f.s.pending_trigger is None and f.allocating  # the initial read serves what was pending
    for _ in range(updates):
        assert f.note_update(ResourceUpdated(uri=KEY.uri, session_generation=1)) == UpdateDisposition.NOTED
    return f


ACTIVE_1 = FenceSnapshot(exists=True, state=S.ACTIVE, session_generation=1, subscription_generation=1)


@pytest.mark.parametrize("read_notified, notified, signals, follow_up", [
    (0, 0, 0, False),
    (3, 3, 0, False),  # recorded before the read was allocated: the read observed it
    (3, 4, 0, True),  # one came after the allocation: it earns a read of its own
    # A wake-up while the read was in flight: its note may postdate the accept (which then answered
    # clean), so it earns one read whatever the answer says.
    (3, 3, 1, True),
])
def test_a_start_cycle_reads_again_only_for_notifications_after_its_allocation(
        read_notified: int, notified: int, signals: int, follow_up: bool) -> None:
    f = _start_window(signals)
    placeholder = f.s.in_flight[0]
    assert f.start_cycle_subscribed(ACTIVE_1, placeholder, read=True) == TriggerReason.INITIAL
    assert f.s.state == S.ACTIVE and placeholder not in f.s.in_flight
    # a wake-up during the start owes one read after it; else the level decides after its read
    assert f.s.pending_trigger == (TriggerReason.FOLLOW_UP if signals else None)
    assert f.issued(ReadTicket(granted=True, ordinal=1, request_id="r", notifications_seen=read_notified))
    f.applied(1, judged(AcceptVerdict.ACCEPTED, 1, notified=notified, covered=read_notified),
              read_notified=read_notified, trigger=TriggerReason.INITIAL)
    assert f.s.pending_trigger == (TriggerReason.FOLLOW_UP if follow_up else None)


def test_a_start_cycle_that_did_not_read_leaves_the_initial_read_owed() -> None:
    # Marked ACTIVE but not on this start's generations (no read was made): exactly ``subscribed``.
    f = _start_window(1)
    assert f.start_cycle_subscribed(ACTIVE_1, f.s.in_flight[0], read=False) is None
    assert f.s.pending_trigger == TriggerReason.INITIAL and f.s.in_flight == []
    # Not ACTIVE (closed meanwhile): no read, nothing owed by the start.
    g = _start_window()
    closed = ACTIVE_1.model_copy(update={"state": S.UNSUBSCRIBING})
    assert g.start_cycle_subscribed(closed, g.s.in_flight[0], read=True) is None
    assert g.s.state == S.UNSUBSCRIBING and g.s.in_flight == []


def test_marked_active_is_this_starts_row_only() -> None:
    assert marked_active(ACTIVE_1, session_generation=1, subscription_generation=1)
    assert not marked_active(ACTIVE_1, session_generation=1, subscription_generation=2)
    assert not marked_active(ACTIVE_1, session_generation=2, subscription_generation=1)
    assert not marked_active(ACTIVE_1.model_copy(update={"state": S.SUBSCRIBING}), session_generation=1,
                             subscription_generation=1)
    assert not marked_active(FenceSnapshot(exists=False), session_generation=1, subscription_generation=1)


def test_a_late_older_report_leaves_the_newest_receipt_and_digest() -> None:
    """The record's receipt and digest name the same read, whatever order the judged reads land in."""
    f = active_fence()
    newer = AcceptResult(verdict=AcceptVerdict.ACCEPTED, receipt_id=12, watermark=6, last_accepted_ordinal=6)
    older = AcceptResult(verdict=AcceptVerdict.ACCEPTED, receipt_id=11, watermark=5, last_accepted_ordinal=5)
    f.applied(6, newer)
    f.accepted_digest("sha256:six", newer)
    f.applied(5, older)
    f.accepted_digest("sha256:five", older)
    assert (f.s.last_receipt_id, f.s.last_accepted_digest, f.s.watermark) == (12, "sha256:six", 6)


def test_a_report_after_a_later_guardrail_rejection_still_names_its_version() -> None:
    """A guardrail-rejected read moves lastAccepted, not the version: an accepted read older than it,
    landing after it (a report, or a snapshot of the ledger), is still the newest version, so its
    receipt and digest are the record's."""
    f = active_fence()
    f.applied(5, AcceptResult(verdict=AcceptVerdict.GUARDRAIL_REJECTED, receipt_id=7, watermark=1,
                              last_accepted_ordinal=5))
    accepted = AcceptResult(verdict=AcceptVerdict.ACCEPTED, receipt_id=3, watermark=2,
                            last_accepted_ordinal=2)
    f.applied(2, accepted)
    f.accepted_digest("sha256:two", accepted)
    assert (f.s.last_receipt_id, f.s.last_accepted_digest, f.s.watermark, f.s.last_accepted_ordinal) == \
        (3, "sha256:two", 2, 5)
    f.adopt(row(last_issued_ordinal=5, last_accepted_ordinal=3, watermark=3, last_receipt_id=4,
                last_accepted_digest="sha256:three"))  # a read this run never heard of
    assert (f.s.last_receipt_id, f.s.last_accepted_digest, f.s.watermark, f.s.last_accepted_ordinal) == \
        (4, "sha256:three", 3, 5)


def test_fence_state_assigns_a_field_as_pydantic_does() -> None:
    """``FenceState.__setattr__`` (no per-name handler lookup): the value, the fields set (what a
    continued run's carried state keeps) and the refusal of a name that is no field, as pydantic's."""
    s = FenceState(key=KEY)
    s.watermark = 3
    s.state = S.ACTIVE
    assert (s.watermark, s.state) == (3, S.ACTIVE)
    assert s.model_fields_set == {"key", "watermark", "state"}
    assert FenceState.model_validate(s.model_dump(exclude_unset=True)) == s
    with pytest.raises(ValueError, match='no field "nope"'):
        s.nope = 1  # type: ignore[attr-defined]
