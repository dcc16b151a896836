"""The ledger's write plan: which rows one fenced transaction writes, decided once.

Contract:
- Pure and deterministic: no I/O, no clock. Each function takes the fence row the ledger holds
  locked (``FenceSnapshot``) and the answer of the matching rule in ``mcpsync.workflows.ledger_rules``
  (``judge_read``, ``close_rule``, ``tombstone_rule``, ``revoke_rule``) and returns one
  ``WritePlan``: the receipt, the fence-row update, the outbox row, the audit row, the
  ``read_requests`` completion and the revocation that transaction writes, or nothing.
- Two stores apply the same plan: ``activities/ledger/fence.py`` in SQL (inside the transaction
  that locked the row) and ``MemoryLedger`` in ``sim/ledger.py`` in memory. Neither
  decides a write on its own, so the simulator checks the writes production makes.
- What only SQL has stays in the SQL applier and is named here, not decided there: a staged
  rollout may hold an invalidation (``OutboxPlan.rollout_gated``; no policy row means it is
  written), a revocation purges the subject's bodies and records a ``revocations`` row.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict

from mcpsync.workflows.coverage import covered_after
from mcpsync.workflows.ledger_rules import IssuedRead, Judgement, close_rule, revoke_rule, tombstone_rule
from mcpsync.workflows.records.base import replaced
from mcpsync.workflows.records.ledger import AcceptResult, AcceptVerdict, FenceSnapshot, OutboxEventType
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import CloseReceipt, SubscriptionState, TriggerReason

__all__ = ["PlanKind", "RevokeSource", "FenceUpdate", "WritePlan", "plan_accept", "plan_close",
           "plan_tombstone", "plan_revoke", "accept_result", "close_receipt"]

S = SubscriptionState
V = AcceptVerdict


class PlanKind(StrEnum):
    """Which transaction a plan belongs to (the simulator's ``LedgerWrite.kind``)."""

    ACCEPT = "accept"  # a read judged
    CLOSE = "close"  # beginUnsubscribe froze the close ordinal
    TOMBSTONE = "tombstone"  # a reconciled catalog confirmed a deletion
    REVOKE = "revoke"  # the subscription was revoked (platform, catalog)
    STATE = "state"  # only the state column moves (a recreated tombstone back to ACTIVE)


class RevokeSource(StrEnum):
    """Who revoked (``revocations.source``, the ``revoked`` outbox row's ``source``)."""

    PLATFORM = "platform"
    CATALOG = "catalog"
    READ_DENIED = "read_denied"


class _Plan(BaseModel):
    model_config = ConfigDict(frozen=True)


class AuditPlan(_Plan):
    """One ``audit`` row of the transaction."""

    kind: str
    detail: dict[str, Any]


class ReceiptPlan(_Plan):
    """One ``resource_versions`` row. A read's receipt also carries the read's own columns
    (MIME type, size, server, caching directives), which the applier copies from the outcome."""

    ordinal: int
    status: AcceptVerdict
    request_id: str
    trigger: TriggerReason  # the read's, or CATALOG (a receipt a reconciled catalog wrote)
    session_generation: int
    subscription_generation: int
    content_digest: str | None = None
    of_read: bool = True  # a read's receipt: one per ordinal (``resource_versions_once``)


class FenceUpdate(_Plan):
    """``UPDATE subscriptions SET ...``: only the fields given are written (their names are the
    column names and the ``FenceSnapshot`` fields)."""

    state: SubscriptionState | None = None
    last_accepted_ordinal: int | None = None
    watermark: int | None = None
    last_accepted_digest: str | None = None
    close_epoch: int | None = None
    close_ordinal: int | None = None
    notifications_seen: int | None = None  # + the notifications the ingress absorbed into the read
    covered: int | None = None  # ``coverage.covered_after``
    link_receipt: bool = False  # last_receipt_id := the receipt this plan writes

    def columns(self, receipt_id: int | None) -> dict[str, Any]:
        """Column -> new value, in field order; ``receipt_id`` is the id the plan's receipt got."""
        given = self.model_fields_set
        cols = {name: getattr(self, name) for name in _COLUMNS if name in given}
        if self.link_receipt:
            cols["last_receipt_id"] = receipt_id
        return cols

    def applied(self, row: FenceSnapshot, receipt_id: int | None) -> FenceSnapshot:
        """The row after the update (what the in-memory ledger stores)."""
        return replaced(row, self.columns(receipt_id))


_COLUMNS = tuple(name for name in FenceUpdate.model_fields if name != "link_receipt")


class OutboxPlan(_Plan):
    """One ``outbox`` row. ``withdraws``: it names every receipt of the subscription and the digests
    they name (``outboxEvent.v1`` ``invalidates``), which the applier reads from its receipts."""

    event: OutboxEventType
    ordinal: int
    content_digest: str | None = None  # the new current digest (``version_accepted`` only)
    previous_digest: str | None = None
    of_receipt: bool = True  # receipt_id := this plan's receipt; else the row's last receipt
    withdraws: bool = False
    rollout_gated: bool = False  # a staged rollout may hold it (an audit row instead)
    reason: str = ""


class RevocationPlan(_Plan):
    """The ``revocations`` row and the purge of the subject's bodies (SQL only)."""

    source: RevokeSource
    reason: str


class WritePlan(_Plan):
    """Everything one transaction writes. An empty plan (``writes`` False) writes nothing."""

    kind: PlanKind
    judgement: Judgement | None = None  # accept: the verdict the plan carries out
    replay: bool = False  # accept retried after its commit: answer the stored verdict, write nothing
    audit: AuditPlan | None = None
    read_request_outcome: str | None = None  # read_requests.outcome (and completed_at); None: untouched
    receipt: ReceiptPlan | None = None
    fence: FenceUpdate | None = None
    outbox: OutboxPlan | None = None
    revocation: RevocationPlan | None = None

    @property
    def writes(self) -> bool:
        return not (self.audit is None and self.read_request_outcome is None and self.receipt is None
                    and self.fence is None and self.outbox is None and self.revocation is None)


def plan_revoke(row: FenceSnapshot, *, source: RevokeSource, reason: str,
                kind: PlanKind = PlanKind.REVOKE, unchecked: bool = False) -> WritePlan:
    """Revocation (``revoke_rule``): REVOKED, one ``revoked`` outbox row withdrawing every receipt
    (never held by a rollout), the subject's bodies purged. Nothing when already finished.
    ``unchecked``: the caller's rule already decided (a catalog's or a read's REVOKED)."""
    if not unchecked and not revoke_rule(row):
        return WritePlan(kind=kind)
    outbox = OutboxPlan(event=OutboxEventType.REVOKED, ordinal=row.last_accepted_ordinal, of_receipt=False,
                        previous_digest=row.last_accepted_digest, withdraws=True, reason=reason[:300])
    return WritePlan(kind=kind, fence=FenceUpdate(state=S.REVOKED), outbox=outbox,
                     revocation=RevocationPlan(source=source, reason=reason[:300]))


def plan_accept(row: FenceSnapshot, issued: IssuedRead | None, outcome: ReadOutcome, j: Judgement, *,
                absorbed: int = 0) -> WritePlan:
    """acceptResourceVersion's writes for the judgement ``judge_read`` gave on the locked row, with the
    row's coverage moved by the judged read under the same lock: ``absorbed`` notifications the
    ingress took into this read are counted, and ``covered`` (``coverage.covered_after``) takes the
    read's allocation count plus them when it observed the resource."""
    if j.reason == "replayed":
        return WritePlan(kind=PlanKind.ACCEPT, judgement=j, replay=True)
    coverage: dict[str, Any] = {}
    if issued is not None:
        if absorbed > 0:
            coverage["notifications_seen"] = row.notifications_seen + absorbed
        covered = covered_after(row, j.verdict, issued.notified + max(absorbed, 0))
        if covered is not None:
            coverage["covered"] = covered
    return _plan_accept(row, issued, outcome, j, coverage)


def _plan_accept(row: FenceSnapshot, issued: IssuedRead | None, outcome: ReadOutcome, j: Judgement,
                 coverage: dict[str, Any]) -> WritePlan:
    """The accept's plan, built once: ``coverage`` (the row's coverage columns the judged read moves)
    joins whatever fence update the verdict makes."""
    o = outcome
    audit = None if j.audit_kind is None else AuditPlan(kind=j.audit_kind, detail={
        "reason": j.reason, "ordinal": o.ordinal, "request_id": o.request_id, "outcome": o.kind.value,
        "digest": o.content_digest, "error_code": o.error_code, "error": o.error})
    rr_outcome = None
    if issued is not None and j.audit_kind != "UNKNOWN_IDENTITY":
        # Every final verdict is stored so a retried accept replays it; a failed read keeps its
        # outcome kind (denied, malformed, ...) for the answer gate and the audit.
        rr_outcome = o.kind.value if j.verdict == V.REJECTED else j.verdict.value
    if j.verdict == V.REVOKED:
        revoke = plan_revoke(row, source=RevokeSource.READ_DENIED, reason=j.reason, kind=PlanKind.ACCEPT,
                             unchecked=True)
        update: dict[str, Any] = {"judgement": j, "audit": audit, "read_request_outcome": rr_outcome}
        if coverage:
            update["fence"] = (revoke.fence or FenceUpdate()).model_copy(update=coverage)
        return revoke.model_copy(update=update)
    if not j.write_receipt:
        return WritePlan(kind=PlanKind.ACCEPT, judgement=j, audit=audit, read_request_outcome=rr_outcome,
                         fence=FenceUpdate(**coverage) if coverage else None)
    receipt = ReceiptPlan(ordinal=o.ordinal, status=j.verdict, request_id=o.request_id, trigger=o.trigger,
                          session_generation=o.session_generation,
                          subscription_generation=o.subscription_generation, content_digest=o.content_digest)
    fenced: dict[str, Any] = {}
    outbox = None
    if j.advance_ordinal_only:
        # The fence position moves (an older read must not land after it); the current version stays.
        fenced["last_accepted_ordinal"] = o.ordinal
    elif j.advance:
        fenced.update(last_accepted_ordinal=o.ordinal, watermark=o.ordinal, state=j.new_state or S.ACTIVE,
                      link_receipt=True)
        if o.kind == ReadOutcomeKind.CONTENT:  # a not-found read keeps the digest it withdraws
            fenced["last_accepted_digest"] = o.content_digest
        if j.outbox:
            outbox = OutboxPlan(event=OutboxEventType.VERSION_ACCEPTED, ordinal=o.ordinal,
                                content_digest=o.content_digest, previous_digest=row.last_accepted_digest,
                                rollout_gated=True)
    fenced.update(coverage)
    return WritePlan(kind=PlanKind.ACCEPT, judgement=j, audit=audit, read_request_outcome=rr_outcome,
                     receipt=receipt, fence=FenceUpdate(**fenced) if fenced else None, outbox=outbox)


def accept_result(plan: WritePlan, row: FenceSnapshot, *, receipt_id: int | None,
                  outbox_id: int | None, ordinal: int = 0) -> AcceptResult:
    """What ``accept`` answers after applying ``plan`` to ``row``: the verdict and the row after the
    plan's update. A replay (read ``ordinal``) answers as the accept first did: its stored receipt and,
    for a verdict that moved the version, that read's position, so the receipt and watermark name it."""
    j = plan.judgement
    assert j is not None, "not an accept plan"
    # The four columns the answer reads, as ``FenceUpdate.applied`` leaves them (no copy of the row).
    after = plan.fence.columns(receipt_id) if plan.fence is not None else {}
    watermark = after.get("watermark", row.watermark)
    last_accepted_ordinal = after.get("last_accepted_ordinal", row.last_accepted_ordinal)
    if plan.replay and j.verdict in (V.ACCEPTED, V.UNCHANGED, V.TOMBSTONE_PENDING):
        watermark = last_accepted_ordinal = ordinal
    published = plan.outbox is not None and plan.outbox.event == OutboxEventType.VERSION_ACCEPTED
    return AcceptResult(verdict=j.verdict, reason=j.reason, receipt_id=receipt_id,
                        outbox_id=outbox_id if published else None, watermark=watermark,
                        last_accepted_ordinal=last_accepted_ordinal,
                        notified=after.get("notifications_seen", row.notifications_seen),
                        covered=after.get("covered", row.covered))


CLOSED_REASON = "closed: the subscription is no longer tracked (no later version will be accepted)"


def plan_close(row: FenceSnapshot) -> WritePlan:
    """beginUnsubscribe (``close_rule``): UNSUBSCRIBING, a new close epoch, the close ordinal frozen,
    and, when a version was ever current, one ``closed`` outbox row naming every receipt (what
    consumers must stop treating as fresh): from here no read is allocated and no version accepted,
    whether the unsubscribe then ends CLOSED or UNSUBSCRIBE_UNKNOWN. Never held by a rollout: it
    withdraws, it publishes nothing new."""
    rule = close_rule(row)
    if rule is None:
        return WritePlan(kind=PlanKind.CLOSE)
    state, epoch, ordinal = rule
    closed = None if row.last_accepted_digest is None else OutboxPlan(  # never a version: nothing to withdraw
        event=OutboxEventType.CLOSED, ordinal=row.last_accepted_ordinal, of_receipt=False,
        previous_digest=row.last_accepted_digest, withdraws=True, reason=CLOSED_REASON)
    fence = FenceUpdate(state=state, close_epoch=epoch, close_ordinal=ordinal)
    return WritePlan(kind=PlanKind.CLOSE, fence=fence, outbox=closed)


def close_receipt(row: FenceSnapshot) -> CloseReceipt:
    """The close receipt a row answers (a row not closing yet: its would-be close ordinal)."""
    ordinal = row.close_ordinal if row.close_ordinal is not None else row.last_issued_ordinal
    return CloseReceipt(state=row.state or S.UNSUBSCRIBING, close_epoch=row.close_epoch,
                        close_ordinal=ordinal, last_accepted_ordinal=row.last_accepted_ordinal)


def plan_tombstone(row: FenceSnapshot, *, listed: bool, proven: bool, scan_id: str) -> WritePlan:
    """A reconciled catalog's word (``tombstone_rule``): TOMBSTONED writes a receipt at the last
    accepted ordinal and a ``tombstoned`` outbox row withdrawing every receipt; REVOKED revokes;
    a recreated resource goes back to ACTIVE; anything else writes nothing."""
    target = tombstone_rule(row, listed=listed, proven=proven)
    if target is None:
        return WritePlan(kind=PlanKind.STATE)
    if target == S.REVOKED:
        return plan_revoke(row, source=RevokeSource.CATALOG, unchecked=True,
                           reason=f"not listed for this subject in catalog {scan_id}")
    if target != S.TOMBSTONED:
        return WritePlan(kind=PlanKind.STATE, fence=FenceUpdate(state=target))
    receipt = ReceiptPlan(ordinal=row.last_accepted_ordinal, status=V.TOMBSTONED, of_read=False,
                          request_id=f"catalog:{scan_id}", trigger=TriggerReason.CATALOG,
                          session_generation=row.session_generation,
                          subscription_generation=row.subscription_generation)
    outbox = OutboxPlan(event=OutboxEventType.TOMBSTONED, ordinal=row.last_accepted_ordinal,
                        previous_digest=row.last_accepted_digest, withdraws=True, rollout_gated=True,
                        reason=f"deleted: not listed in reconciled catalog {scan_id}")
    return WritePlan(kind=PlanKind.TOMBSTONE, receipt=receipt, outbox=outbox,
                     fence=FenceUpdate(state=target, link_receipt=True))
