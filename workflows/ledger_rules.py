"""The durable fence rules: pure functions over the ledger's fence row.

Contract:
- Every rule takes the durable row (``FenceSnapshot``) and answers what may happen to it. The
  ledger applies them to the PostgreSQL row it holds locked (``SELECT ... FOR UPDATE``); the
  simulator applies them to an in-memory row. One rule, two stores: the simulator cannot drift
  from production.
- ``judge_read`` is the sole acceptance point: the only rule that makes a version current.
- ``marked_active``: the row a start marked ACTIVE, on which reads are allocated
  (``coverage.plan_allocate``); ``close_rule``, ``tombstone_rule`` and ``revoke_rule`` end a
  subscription.
"""

from __future__ import annotations

from pydantic import BaseModel

from mcpsync.workflows.records.ledger import AcceptVerdict, FenceSnapshot
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import CLOSING_STATES as CLOSING
from mcpsync.workflows.records.subscription import TERMINAL_STATES as TERMINAL
from mcpsync.workflows.records.subscription import SubscriptionState

__all__ = ["IssuedRead", "Judgement", "marked_active", "judge_read", "close_rule", "tombstone_rule",
           "revoke_rule"]

S = SubscriptionState
_ACTIVE = S.ACTIVE  # read once: an ``Enum`` class attribute is slow on Python 3.11; every allocation asks


class IssuedRead(BaseModel):
    """A ``read_requests`` row: a read the fence issued before it was dispatched."""

    model_config = {"frozen": True}

    ordinal: int
    request_id: str
    session_generation: int
    subscription_generation: int
    completed_verdict: AcceptVerdict | None = None
    notified: int = 0  # the row's notification count at this read's allocation (``coverage``)
    # Allocated by a read cycle (allocate + read + accept in one activity): its accept runs whether
    # or not the run that scheduled it still lives (an orphan of a reset run accepts too).
    in_cycle: bool = False


class Judgement(BaseModel):
    """What the sole acceptance point decided, and what it must write."""

    model_config = {"frozen": True}

    verdict: AcceptVerdict
    reason: str
    write_receipt: bool = False  # a resourceVersion.v1 row
    advance: bool = False  # lastAcceptedOrdinal/watermark := ordinal
    advance_ordinal_only: bool = False  # lastAcceptedOrdinal := ordinal; digest and watermark stay
    outbox: bool = False  # an invalidation outbox row
    new_state: SubscriptionState | None = None
    audit_kind: str | None = None


def marked_active(row: FenceSnapshot, *, session_generation: int, subscription_generation: int) -> bool:
    """``row`` is ACTIVE on these generations: marked by their start (``mark_active``, now or by an
    earlier attempt of it), and a read may be allocated on it. Anything else (closing, revoked,
    another subscription generation) is another writer's row, on which no read is made."""
    return (row.exists and row.state == _ACTIVE and row.session_generation == session_generation
            and row.subscription_generation == subscription_generation)


# The verdicts on a fresh read of content, the same every time (a judgement is frozen): most judged
# reads end in one of them, and each is built once a process rather than validated per read.
_UNCHANGED = Judgement(verdict=AcceptVerdict.UNCHANGED, reason="digest unchanged", write_receipt=True,
                       advance=True)
_ACCEPTED = Judgement(verdict=AcceptVerdict.ACCEPTED, reason="new digest", write_receipt=True, advance=True,
                      outbox=True)


def judge_read(row: FenceSnapshot, issued: IssuedRead | None, outcome: ReadOutcome, *,
               row_uri: str | None) -> Judgement:
    """acceptResourceVersion: the only rule that makes a version current."""
    V = AcceptVerdict
    if not row.exists or issued is None or row_uri != outcome.key.uri \
            or issued.request_id != outcome.request_id:
        reason = ("no fence row" if not row.exists else "read was never issued" if issued is None
                  else "identity mismatch")
        return Judgement(verdict=V.REJECTED, reason=reason, audit_kind="UNKNOWN_IDENTITY")
    if issued.completed_verdict is not None:
        return Judgement(verdict=issued.completed_verdict, reason="replayed")
    if row.state in CLOSING:
        return Judgement(verdict=V.STALE_AFTER_CLOSE, reason=f"subscription is {row.state}",
                         audit_kind="STALE_AFTER_CLOSE")
    if row.state != S.ACTIVE:
        return Judgement(verdict=V.REJECTED, reason=f"subscription is {row.state}", audit_kind="NOT_ACTIVE")
    if (outcome.session_generation != row.session_generation
            or outcome.subscription_generation != row.subscription_generation
            or issued.session_generation != outcome.session_generation
            or issued.subscription_generation != outcome.subscription_generation):
        return Judgement(verdict=V.STALE, reason="generation superseded", write_receipt=True)
    if issued.in_cycle and outcome.ordinal < row.last_issued_ordinal:
        # A newer read was allocated after this one and may have been served first (an orphan of a
        # reset run, or concurrent reads): accepting this one after it could go back a version.
        return Judgement(verdict=V.STALE, reason=f"ordinal {outcome.ordinal} superseded by issued "
                                                 f"{row.last_issued_ordinal}", write_receipt=True)
    if outcome.ordinal <= row.last_accepted_ordinal:
        return Judgement(verdict=V.STALE, reason=f"ordinal {outcome.ordinal} <= lastAccepted "
                                                 f"{row.last_accepted_ordinal}", write_receipt=True)
    if outcome.kind == ReadOutcomeKind.NOT_FOUND:
        return Judgement(verdict=V.TOMBSTONE_PENDING, reason="not found while ACTIVE", write_receipt=True,
                         advance=True, new_state=S.TOMBSTONE_PENDING)
    if outcome.kind == ReadOutcomeKind.DENIED:
        # The server says this subject may no longer read it: revocation, not an empty resource.
        return Judgement(verdict=V.REVOKED, reason="read denied", audit_kind="READ_DENIED",
                         new_state=S.REVOKED)
    if outcome.kind != ReadOutcomeKind.CONTENT:
        return Judgement(verdict=V.REJECTED, reason=outcome.kind.value, audit_kind="READ_FAILED")
    if outcome.guardrail_rejection is not None:
        # The fence position moves (an older read must not land after it); the current version stays.
        return Judgement(verdict=V.GUARDRAIL_REJECTED, reason=outcome.guardrail_rejection, write_receipt=True,
                         advance_ordinal_only=True, audit_kind="GUARDRAIL_REJECTED")
    if outcome.content_digest == row.last_accepted_digest:
        return _UNCHANGED
    return _ACCEPTED


def tombstone_rule(row: FenceSnapshot, *, listed: bool, proven: bool = False) -> SubscriptionState | None:
    """A reconciled catalog's word on one subscribed URI.

    TOMBSTONE_PENDING: not listed → TOMBSTONED (receipt + outbox row); listed → ACTIVE (deleted
    and recreated). ACTIVE and not listed for this subject → REVOKED, but only on a
    SNAPSHOT_PROVEN catalog: revocation is a completeness decision, and an unproven catalog
    only earns a verification read. Anything else: None, nothing to do."""
    if not row.exists:
        return None
    if row.state == S.TOMBSTONE_PENDING:
        return S.ACTIVE if listed else S.TOMBSTONED
    if row.state == S.ACTIVE and not listed and proven:
        return S.REVOKED
    return None


def revoke_rule(row: FenceSnapshot) -> bool:
    """Revocation applies to any subscription not already finished; it is idempotent."""
    return row.exists and row.state not in TERMINAL


def close_rule(row: FenceSnapshot) -> tuple[SubscriptionState, int, int] | None:
    """beginUnsubscribe: (UNSUBSCRIBING, close_epoch + 1, closeOrdinal = lastIssued), or None if already
    closing."""
    if not row.exists or row.state in CLOSING or row.state in TERMINAL:
        return None
    return S.UNSUBSCRIBING, row.close_epoch + 1, row.last_issued_ordinal
