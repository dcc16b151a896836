"""The level-based coverage rule (workflows/coverage.py): notified, covered, dirty, and who owns work."""

from __future__ import annotations

from mcpsync.workflows.coverage import covered_after, dirty, plan_allocate, plan_note
from mcpsync.workflows.ledger_rules import IssuedRead, judge_read
from mcpsync.workflows.records.ledger import AcceptVerdict, FenceSnapshot
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason
from mcpsync.workflows.write_plan import plan_accept

S = SubscriptionState
V = AcceptVerdict
KEY = SubscriptionKey(subject="alice", server="s", uri="demo://doc")
CLEAN = FenceSnapshot(exists=True, state=S.ACTIVE, session_generation=1, subscription_generation=1,
                      last_issued_ordinal=2, last_accepted_ordinal=2, watermark=2,
                      last_accepted_digest="sha256:a", notifications_seen=4, covered=4, allocated_sequence=4)


def _note(row: FenceSnapshot, generation: int = 1) -> tuple[FenceSnapshot, bool]:
    plan = plan_note(row, generation=generation)
    return row.model_copy(update={"notifications_seen": plan.notified}), plan.work


def _allocate(row: FenceSnapshot) -> tuple[FenceSnapshot, int, int]:
    plan = plan_allocate(row, session_generation=1, subscription_generation=1, min_ordinal=1)
    assert plan is not None
    return row.model_copy(update={"last_issued_ordinal": plan.ordinal,
                                  "allocated_sequence": plan.notified}), \
        plan.ordinal, plan.notified


def _accept(row: FenceSnapshot, ordinal: int, notified: int, kind: ReadOutcomeKind, digest: str | None = None,
            ) -> tuple[FenceSnapshot, V]:
    issued = IssuedRead(ordinal=ordinal, request_id=f"r{ordinal}", session_generation=1,
                        subscription_generation=1, notified=notified)
    outcome = ReadOutcome(kind=kind, key=KEY, ordinal=ordinal, request_id=f"r{ordinal}", session_generation=1,
                          subscription_generation=1, trigger=TriggerReason.UPDATED, content_digest=digest)
    plan = plan_accept(row, issued, outcome, judge_read(row, issued, outcome, row_uri=KEY.uri))
    after = plan.fence.applied(row, None) if plan.fence is not None else row
    assert plan.judgement is not None
    return after, plan.judgement.verdict


def test_the_first_notification_makes_the_row_dirty_and_creates_work_copies_do_not() -> None:
    assert not dirty(CLEAN)
    row, work = _note(CLEAN)
    assert dirty(row) and work
    for _ in range(3):  # copies before any allocation: the read the first one earned covers them
        row, work = _note(row)
        assert dirty(row) and not work


def test_a_read_allocated_after_the_notifications_covers_them_when_it_observes_content() -> None:
    row, _ = _note(CLEAN)
    row, _ = _note(row)
    row, ordinal, notified = _allocate(row)
    assert notified == 6
    row, verdict = _accept(row, ordinal, notified, ReadOutcomeKind.CONTENT, "sha256:b")
    assert verdict == V.ACCEPTED and row.covered == 6 and not dirty(row)


def test_a_notification_while_a_read_is_in_flight_creates_work_and_stays_dirty_after_it() -> None:
    row, _ = _note(CLEAN)
    row, ordinal, notified = _allocate(row)
    row, work = _note(row)  # after the allocation: the read may not observe it
    assert work
    row, verdict = _accept(row, ordinal, notified, ReadOutcomeKind.CONTENT, "sha256:a")
    assert verdict == V.UNCHANGED and row.covered == 5 and dirty(row)


def test_a_failed_or_superseded_read_sets_nothing() -> None:
    row, _ = _note(CLEAN)
    row, ordinal, notified = _allocate(row)
    failed, verdict = _accept(row, ordinal, notified, ReadOutcomeKind.TRANSIENT)
    assert verdict == V.REJECTED and failed.covered == 4 and dirty(failed)
    _, work = _note(failed)  # the failed allocation is not confirmed: a new notification is work
    assert work
    newer, newer_ordinal, newer_notified = _allocate(row)
    newer, verdict = _accept(newer, newer_ordinal, newer_notified, ReadOutcomeKind.CONTENT, "sha256:b")
    assert verdict == V.ACCEPTED and newer.covered == 5
    late, verdict = _accept(newer, ordinal, notified, ReadOutcomeKind.CONTENT, "sha256:c")
    assert verdict == V.STALE and late.covered == 5


def test_covered_never_moves_back_and_only_observing_verdicts_move_it() -> None:
    assert covered_after(CLEAN, V.ACCEPTED, 3) is None
    assert covered_after(CLEAN, V.ACCEPTED, 6) == 6
    for verdict in (V.UNCHANGED, V.TOMBSTONE_PENDING, V.GUARDRAIL_REJECTED):
        assert covered_after(CLEAN, verdict, 6) == 6
    for verdict in (V.REJECTED, V.STALE, V.STALE_AFTER_CLOSE, V.REVOKED):
        assert covered_after(CLEAN, verdict, 6) is None


def test_a_row_not_active_on_the_notifications_generation_always_gets_the_work() -> None:
    row, _ = _note(CLEAN)
    assert _note(row, generation=2)[1]
    assert _note(row.model_copy(update={"state": S.TOMBSTONE_PENDING}))[1]
    assert plan_allocate(CLEAN.model_copy(update={"state": S.UNSUBSCRIBING}), session_generation=1,
                         subscription_generation=1, min_ordinal=1) is None


def test_notifications_the_ingress_absorbed_are_counted_by_the_accept_and_covered_only_if_observed() -> None:
    row, _ = _note(CLEAN)
    row, ordinal, notified = _allocate(row)
    issued = IssuedRead(ordinal=ordinal, request_id=f"r{ordinal}", session_generation=1,
                        subscription_generation=1, notified=notified)
    for kind, covered in ((ReadOutcomeKind.CONTENT, 7), (ReadOutcomeKind.TRANSIENT, 4)):
        outcome = ReadOutcome(kind=kind, key=KEY, ordinal=ordinal, request_id=f"r{ordinal}",
                              session_generation=1, subscription_generation=1, trigger=TriggerReason.UPDATED,
                              content_digest="sha256:b")
        plan = plan_accept(row, issued, outcome, judge_read(row, issued, outcome, row_uri=KEY.uri),
                           absorbed=2)
        assert plan.fence is not None
        after = plan.fence.applied(row, None)
        assert (after.notifications_seen, after.covered) == (7, covered)
