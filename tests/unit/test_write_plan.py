"""The write plan (workflows/write_plan.py): which rows accept / close / tombstone / revoke write.

Pure tests of the planner; tests/integration/test_ledger_plan.py applies the same plans in PostgreSQL and in
the simulator's in-memory ledger and compares the two."""

from __future__ import annotations

from pydantic import PrivateAttr

from mcpsync.workflows.ledger_rules import IssuedRead, judge_read
from mcpsync.workflows.records.base import FrozenRecord, replaced
from mcpsync.workflows.records.ledger import AcceptVerdict, FenceSnapshot, OutboxEventType
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason
from mcpsync.workflows.write_plan import (
    FenceUpdate,
    PlanKind,
    RevokeSource,
    accept_result,
    close_receipt,
    plan_accept,
    plan_close,
    plan_revoke,
    plan_tombstone,
)

S = SubscriptionState
KEY = SubscriptionKey(subject="alice", server="s", uri="demo://doc")
ROW = FenceSnapshot(exists=True, state=S.ACTIVE, session_generation=1, subscription_generation=1,
                    last_issued_ordinal=3, last_accepted_ordinal=1, watermark=1,
                    last_accepted_digest="sha256:a", last_receipt_id=7)
ISSUED = IssuedRead(ordinal=2, request_id="r2", session_generation=1, subscription_generation=1)


def _outcome(kind: ReadOutcomeKind, digest: str | None = None, guardrail: str | None = None) -> ReadOutcome:
    return ReadOutcome(kind=kind, key=KEY, ordinal=2, request_id="r2", session_generation=1,
                       subscription_generation=1, trigger=TriggerReason.UPDATED, content_digest=digest,
                       guardrail_rejection=guardrail)


def _plan(row: FenceSnapshot, issued: IssuedRead | None,
          outcome: ReadOutcome):  # type: ignore[no-untyped-def]
    return plan_accept(row, issued, outcome, judge_read(row, issued, outcome, row_uri=KEY.uri))


def test_a_new_digest_writes_receipt_outbox_and_advances() -> None:
    new = _outcome(ReadOutcomeKind.CONTENT, "sha256:b")
    plan = _plan(ROW, ISSUED, new)
    assert plan.kind == PlanKind.ACCEPT and plan.read_request_outcome == "ACCEPTED" and plan.audit is None
    assert plan.receipt is not None and plan.receipt.status == AcceptVerdict.ACCEPTED and plan.receipt.of_read
    assert plan.outbox is not None and plan.outbox.event == OutboxEventType.VERSION_ACCEPTED
    assert plan.outbox.previous_digest == "sha256:a" and plan.outbox.rollout_gated \
        and not plan.outbox.withdraws
    assert plan.fence is not None
    after = plan.fence.applied(ROW, 9)
    assert (after.last_accepted_ordinal, after.watermark, after.last_accepted_digest,
            after.last_receipt_id) == \
        (2, 2, "sha256:b", 9)
    result = accept_result(plan, ROW, receipt_id=9, outbox_id=11)
    assert (result.verdict, result.receipt_id, result.outbox_id,
            result.watermark) == (AcceptVerdict.ACCEPTED, 9, 11, 2)


def test_unchanged_and_not_found_advance_without_an_invalidation() -> None:
    same = _plan(ROW, ISSUED, _outcome(ReadOutcomeKind.CONTENT, "sha256:a"))
    assert same.receipt is not None and same.outbox is None and same.fence is not None
    gone = _plan(ROW, ISSUED, _outcome(ReadOutcomeKind.NOT_FOUND))
    assert gone.fence is not None and gone.outbox is None
    after = gone.fence.applied(ROW, 9)
    # A not-found read keeps the digest it will withdraw once a catalog confirms the deletion.
    assert (after.state, after.last_accepted_digest, after.watermark) == (S.TOMBSTONE_PENDING, "sha256:a", 2)


def test_a_guardrail_rejection_moves_only_the_fence_position() -> None:
    plan = _plan(ROW, ISSUED, _outcome(ReadOutcomeKind.CONTENT, "sha256:b", guardrail="too big"))
    assert plan.fence == FenceUpdate(last_accepted_ordinal=2) and plan.outbox is None
    assert plan.audit is not None and plan.audit.kind == "GUARDRAIL_REJECTED"
    result = accept_result(plan, ROW, receipt_id=9, outbox_id=None)
    assert (result.watermark, result.last_accepted_ordinal) == (1, 2)


def test_stale_after_close_writes_only_audit_and_the_stored_verdict() -> None:
    closing = ROW.model_copy(update={"state": S.UNSUBSCRIBING})
    plan = _plan(closing, ISSUED, _outcome(ReadOutcomeKind.CONTENT, "sha256:b"))
    assert plan.receipt is None and plan.outbox is None and plan.fence is None
    assert plan.audit is not None and plan.audit.kind == "STALE_AFTER_CLOSE"
    assert plan.read_request_outcome == "STALE_AFTER_CLOSE"


def test_a_denied_read_revokes_and_its_verdict_is_stored() -> None:
    plan = _plan(ROW, ISSUED, _outcome(ReadOutcomeKind.DENIED))
    # A denial's verdict (REVOKED) is stored, so a retried accept replays it.
    assert plan.read_request_outcome == "REVOKED" and plan.receipt is None
    assert plan.fence == FenceUpdate(state=S.REVOKED)
    assert plan.outbox is not None and plan.outbox.event == OutboxEventType.REVOKED and plan.outbox.withdraws
    assert not plan.outbox.rollout_gated and not plan.outbox.of_receipt
    assert plan.revocation is not None and plan.revocation.source == RevokeSource.READ_DENIED
    assert accept_result(plan, ROW, receipt_id=None, outbox_id=12).outbox_id is None


def test_a_failed_read_keeps_its_kind_and_an_unknown_read_is_not_completed() -> None:
    assert _plan(ROW, ISSUED, _outcome(ReadOutcomeKind.MALFORMED)).read_request_outcome == "malformed"
    unknown = _plan(ROW, None, _outcome(ReadOutcomeKind.CONTENT, "sha256:b"))
    assert unknown.read_request_outcome is None and unknown.audit is not None
    assert unknown.audit.kind == "UNKNOWN_IDENTITY"


def test_a_replayed_accept_writes_nothing() -> None:
    done = ISSUED.model_copy(update={"completed_verdict": AcceptVerdict.ACCEPTED})
    plan = _plan(ROW, done, _outcome(ReadOutcomeKind.CONTENT, "sha256:b"))
    assert plan.replay and not plan.writes


def test_close_freezes_the_last_issued_ordinal_once() -> None:
    plan = plan_close(ROW)
    assert plan.fence == FenceUpdate(state=S.UNSUBSCRIBING, close_epoch=1, close_ordinal=3)
    closed = plan.fence.applied(ROW, None)
    assert close_receipt(closed).close_ordinal == 3
    assert not plan_close(closed).writes
    # Consumers hear of it once: one ``closed`` row withdrawing every receipt, never held by a rollout.
    assert plan.outbox is not None and plan.outbox.event == OutboxEventType.CLOSED and plan.outbox.withdraws
    assert not plan.outbox.rollout_gated and not plan.outbox.of_receipt and plan.receipt is None
    assert plan.outbox.previous_digest == ROW.last_accepted_digest
    never = plan_close(ROW.model_copy(update={"last_accepted_digest": None}))
    assert never.fence is not None and never.outbox is None, \
        "no version was ever current: nothing to withdraw"


def test_tombstone_revocation_and_recreation() -> None:
    pending = ROW.model_copy(update={"state": S.TOMBSTONE_PENDING})
    plan = plan_tombstone(pending, listed=False, proven=False, scan_id="c1")
    assert plan.kind == PlanKind.TOMBSTONE and plan.receipt is not None and not plan.receipt.of_read
    assert (plan.receipt.ordinal, plan.receipt.status,
            plan.receipt.request_id) == (1, AcceptVerdict.TOMBSTONED,
                                                                                  "catalog:c1")
    assert plan.outbox is not None and plan.outbox.event == OutboxEventType.TOMBSTONED \
        and plan.outbox.withdraws
    assert plan.fence is not None and plan.fence.applied(pending, 20).last_receipt_id == 20
    assert plan_tombstone(pending, listed=True, proven=False,
                          scan_id="c2").fence == FenceUpdate(state=S.ACTIVE)
    assert not plan_tombstone(ROW, listed=False, proven=False, scan_id="c3").writes  # unproven: no revocation
    revoked = plan_tombstone(ROW, listed=False, proven=True, scan_id="c4")
    assert revoked.kind == PlanKind.REVOKE and revoked.revocation is not None
    assert revoked.revocation.source == RevokeSource.CATALOG


def test_revoke_is_idempotent() -> None:
    plan = plan_revoke(ROW, source=RevokeSource.PLATFORM, reason="x" * 400)
    assert plan.fence == FenceUpdate(state=S.REVOKED) and plan.revocation is not None
    assert len(plan.revocation.reason) == 300
    assert not plan_revoke(plan.fence.applied(ROW, None), source=RevokeSource.PLATFORM, reason="again").writes


def test_a_replayed_accept_answers_at_its_own_read_as_it_first_did() -> None:
    # Read 2 was accepted (receipt 9), its answer lost; read 3 was accepted since. The retry's replay
    # names receipt 9 at ordinal 2, not at the row's newer position (F16, docs/simulation.md).
    done = ISSUED.model_copy(update={"completed_verdict": AcceptVerdict.ACCEPTED})
    now = ROW.model_copy(update={"last_accepted_ordinal": 3, "watermark": 3, "last_receipt_id": 11})
    plan = _plan(now, done, _outcome(ReadOutcomeKind.CONTENT, "sha256:retry"))
    assert plan.replay and not plan.writes
    result = accept_result(plan, now, receipt_id=9, outbox_id=None, ordinal=2)
    assert (result.verdict, result.receipt_id, result.watermark, result.last_accepted_ordinal) == \
        (AcceptVerdict.ACCEPTED, 9, 2, 2)


def test_a_replaced_record_is_the_copy_pydantic_makes() -> None:
    """``records.base.replaced`` (how the in-memory ledger's rows are written) makes the record
    ``model_copy(update=...)`` makes: the same state (fields, fields set, extra, private attributes), so a
    pydantic release that keeps more on a record shows here; a record with private attributes is
    ``model_copy``'d."""

    class _Private(FrozenRecord):
        n: int = 0
        _memo: int = PrivateAttr(default=5)

    update = {"last_issued_ordinal": 4, "allocated_sequence": 2}
    for row in (ROW, FenceSnapshot(exists=False)):
        made, copied = replaced(row, update), row.model_copy(update=update)
        assert made.__getstate__() == copied.__getstate__() and made == copied
        assert list(made.__dict__) == list(copied.__dict__)
        assert made.model_fields_set == copied.model_fields_set
    private = _Private()
    assert replaced(private, {"n": 1}).__getstate__() == private.model_copy(update={"n": 1}).__getstate__()
