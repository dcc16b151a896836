"""The PostgreSQL ledger for one subscription row, in memory (``MemoryLedger``).

Contract:
- Each method is one transaction of ``activities/ledger/fence.py`` (``FenceLedger``): it applies the
  same pure plans (``coverage.plan_note``, ``coverage.plan_allocate``, ``allocation.prior_allocation``,
  ``write_plan.plan_accept`` / ``plan_close`` / ``plan_tombstone`` / ``plan_revoke``), and either raises
  ``LedgerIntegrityError`` having written nothing (a write PostgreSQL would reject: the UNIQUE/CHECK
  constraints of ``001_ledger.sql``) or commits and appends a ``LedgerWrite`` to ``log``.
- The simple state transitions (ensure, begin_subscription, mark_active, set_state,
  finish_unsubscribe) are ``ledger_flow``'s, as the SQL ledger's; ``read_requests`` rows carry the
  table's column names (``ledger_flow.issued_read`` and ``prior_allocation`` read them). Staged
  rollouts (no policy row holds an invalidation back), the content store and its purge and the
  ``revocations`` row are not modelled.
- The verification schedule (``activities/ledger/verification.py``) is the SQL ledger's, on the row's
  ``verified_at`` / ``verify_due_at`` / ``watched_at``, timed by ``now`` (the simulation's clock, set
  before every step): a granted allocation of an ACTIVE row with a safety-read period is a
  verification, due again ``verification_rules.verification_delay`` later (its draw from a random
  seeded by the schedule's seed, so a trace replays to the same due times), and the gap it closes is
  judged (``judge_gap``); ``mark_active`` keeps the row's chain while it holds a version
  (``continues_chain``), else starts a new one, due within ``claim_delay`` either way; ``due`` is the
  ingress's sweep (the row claimed, due again ``claim_delay`` later); ``watch`` is the watchdog's
  look. Each breach is reported once (an ``overdue`` outbox entry, on the logged write that found it).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, TypedDict, cast

from mcpsync.activities.ledger.verification import Due
from mcpsync.workflows import coverage, verification_rules
from mcpsync.workflows.allocation import prior_allocation
from mcpsync.workflows.ledger_flow import (
    begin_writes,
    begins_at_start,
    ensure_writes,
    finish_unsubscribe_writes,
    issued_read,
    mark_active_writes,
    set_state_writes,
)
from mcpsync.workflows.ledger_rules import IssuedRead, Judgement, judge_read
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.base import replaced
from mcpsync.workflows.records.ledger import (
    AcceptRequest,
    AcceptResult,
    AcceptVerdict,
    AllocateRequest,
    BeginSubscriptionRequest,
    FenceSnapshot,
    MarkActiveRequest,
    NotedNotification,
    OutboxEventType,
    ReadTicket,
    StartSubscriptionRequest,
    SubscriptionStarted,
    WatchResult,
)
from mcpsync.workflows.records.mcp_calls import ReadOutcome
from mcpsync.workflows.records.subscription import (
    CloseReceipt,
    SessionInfo,
    SubscriptionKey,
    SubscriptionState,
    TriggerReason,
)
from mcpsync.workflows.write_plan import (
    PlanKind,
    RevokeSource,
    WritePlan,
    accept_result,
    close_receipt,
    plan_accept,
    plan_close,
    plan_revoke,
    plan_tombstone,
)
from sim.model import JudgeFn

S = SubscriptionState
# Read once: on Python 3.11 an ``Enum`` class attribute goes through the metaclass's ``__getattr__`` hook
# (about ten times a plain attribute), and these are compared for every write.
_ACTIVE, _ACCEPT, _STATE = S.ACTIVE, PlanKind.ACCEPT, PlanKind.STATE.value


class LedgerIntegrityError(Exception):
    """PostgreSQL would reject this transaction (UNIQUE or CHECK); nothing was written."""


class ReadRequestRow(TypedDict):
    """A ``read_requests`` row, by its columns."""

    ordinal: int
    request_id: str
    session_generation: int
    subscription_generation: int
    trigger_reason: TriggerReason
    notifications_seen: int  # the row's update counter at allocation
    cycle_id: str | None
    outcome: str | None
    completed_at: int | None  # the length of ``MemoryLedger.log`` then: this ledger's clock


# The ledger's rows as it logs them. Not frozen, though never changed once made: a frozen dataclass's
# ``__init__`` sets each field through ``object.__setattr__``, four times a plain one's, and a schedule
# logs about 22 writes.
@dataclass(slots=True)
class Receipt:
    receipt_id: int
    ordinal: int
    digest: str | None
    status: AcceptVerdict
    request_id: str


@dataclass(slots=True)
class OutboxEntry:
    outbox_id: int
    event_type: OutboxEventType
    receipt_id: int
    digest: str | None
    ordinal: int


@dataclass(slots=True)
class LedgerWrite:
    """One committed ledger transaction, as the invariant checker sees it."""

    kind: str  # allocate | accept | close | tombstone | state | revoke | watch (``PlanKind``: planned writes)
    before: FenceSnapshot
    after: FenceSnapshot
    outcome: ReadOutcome | None = None
    issued: IssuedRead | None = None
    judgement: Judgement | None = None
    receipt: Receipt | None = None
    outbox: OutboxEntry | None = None
    ordinal: int = 0


# Answers that are always the same (frozen records: one a process).
_REFUSED = ReadTicket(granted=False, reason="fence refused: not ACTIVE or generation mismatch")
_UNSCHEDULED = WatchResult(scheduled=False)


@cache
def _computed_workflow_id(key: SubscriptionKey) -> str:
    """``key.workflow_id`` (a slug and a SHA-256 of the key): every schedule's ledger has the same key,
    so it is computed once a process."""
    return key.workflow_id


class MemoryLedger:
    def __init__(self, key: SubscriptionKey, judge: JudgeFn = judge_read, seed: str = "") -> None:
        self.key = key
        self.judge = judge
        self.row = FenceSnapshot(exists=False)
        self.incarnation = ""
        self.workflow_id = ""  # subscriptions.workflow_id: recorded by the ensure that creates the row
        self.safety_read_seconds: float | None = None  # subscriptions.safety_read_seconds (``mark_active``)
        self.read_requests: dict[int, ReadRequestRow] = {}
        self.request_ids: dict[str, int] = {}  # read_requests.request_id UNIQUE -> ordinal
        self.cycle_ids: dict[str, int] = {}  # read_requests.cycle_id UNIQUE -> ordinal
        self.receipts: list[Receipt] = []
        self.receipt_ordinals: set[int] = set()
        self.outbox: list[OutboxEntry] = []
        self.audit: list[str] = []  # audit kinds, in order
        self.session: SessionInfo | None = None  # the mcp_sessions row with closed_at IS NULL
        self.log: list[LedgerWrite] = []
        self._ids = 0
        self.now = datetime.min  # the simulation's clock (``Simulation.apply`` sets it before every step)
        # subscriptions.verified_at / verify_due_at / watched_at: the verification schedule
        self.verified_at: datetime | None = None  # the chain's newest verification
        self.verify_due_at: datetime | None = None  # when the next is due (the sweep's index)
        self.watched_at: datetime | None = None  # the watchdog's previous look at this chain
        # ``record_allocation``'s random.random(), seeded at its first draw (seeding from a string costs
        # about as much as a read cycle's records, and many schedules never verify)
        self._seed = seed
        self._draws: random.Random | None = None

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _set(self, after: FenceSnapshot) -> FenceSnapshot:
        """A compare-and-set transition: logged when it changed the row."""
        before, self.row = self.row, after
        if after != before:
            self.log.append(LedgerWrite(kind=_STATE, before=before, after=after))
        return after

    def _apply(self, plan: WritePlan, *, outcome: ReadOutcome | None = None, issued: IssuedRead | None = None,
               ordinal: int = 0) -> tuple[Receipt | None, OutboxEntry | None]:
        """Apply ``plan`` to the locked row as one transaction (the SQL applier's statements, in memory)."""
        before = self.row
        if plan.receipt is not None and plan.receipt.of_read \
                and plan.receipt.ordinal in self.receipt_ordinals:
            raise LedgerIntegrityError(
                f"resource_versions_once: a receipt for ordinal {plan.receipt.ordinal} exists")
        if not plan.writes and plan.kind != _ACCEPT:  # every judged read is logged, written or not
            return None, None
        if plan.audit is not None:
            self.audit.append(plan.audit.kind)
        if plan.read_request_outcome is not None and outcome is not None \
                and (rr := self.read_requests.get(outcome.ordinal)) is not None:
            rr["outcome"], rr["completed_at"] = plan.read_request_outcome, len(self.log)
        receipt = entry = None
        if plan.receipt is not None:
            p = plan.receipt
            receipt = Receipt(self._next_id(), p.ordinal, p.content_digest, p.status, p.request_id)
            self.receipts.append(receipt)
            if p.of_read:
                self.receipt_ordinals.add(p.ordinal)
        receipt_id = receipt.receipt_id if receipt is not None else None
        if plan.outbox is not None:
            ob = plan.outbox
            target = receipt_id if ob.of_receipt else before.last_receipt_id
            entry = OutboxEntry(self._next_id(), ob.event, target or 0, ob.content_digest, ob.ordinal)
            self.outbox.append(entry)
        if plan.fence is not None:
            self.row = plan.fence.applied(before, receipt_id)
        if plan.kind == _STATE:
            if self.row != before:
                self.log.append(LedgerWrite(kind=plan.kind.value, before=before, after=self.row))
        else:
            self.log.append(LedgerWrite(kind=plan.kind.value, before=before, after=self.row, outcome=outcome,
                                        issued=issued, judgement=plan.judgement, receipt=receipt,
                                        outbox=entry, ordinal=ordinal))
        return receipt, entry

    # --- fence -------------------------------------------------------------------------------

    def ensure_subscription(self, incarnation: str, workflow_id: str | None = None) -> FenceSnapshot:
        """``workflow_id``: the caller's id (default the key's computed one); recorded once, like the
        SQL row (a second id is audited ``WORKFLOW_ID_MISMATCH`` and changes nothing)."""
        row = self.row
        running_as = workflow_id or _computed_workflow_id(self.key)
        if not row.exists:
            row = FenceSnapshot(exists=True, state=S.DISCOVERED)
            self.workflow_id = running_as
        elif self.workflow_id != running_as:
            self.audit.append("WORKFLOW_ID_MISMATCH")
        writes = ensure_writes(row, held=self.incarnation, incarnation=incarnation)
        self.incarnation = writes.pop("incarnation", self.incarnation)
        return self._set(replaced(row, writes))

    def transition(self, writes: dict[str, Any]) -> FenceSnapshot:
        """``FenceLedger._transition``: a ``ledger_flow`` rule's ``writes`` on the row."""
        self.safety_read_seconds = writes.pop("safety_read_seconds", self.safety_read_seconds)
        return self._set(replaced(self.row, writes))

    def prior_allocation(self, req: AllocateRequest) -> ReadTicket | str:
        """``allocation.prior_allocation`` answered from the tables: the ticket an earlier allocation of
        ``req`` holds, or the request id a new one takes (its lookups never wait)."""
        index = {"cycle_id": self.cycle_ids, "request_id": self.request_ids}

        async def find(column: str, value: str) -> ReadRequestRow | None:
            ordinal = index[column].get(value)
            return None if ordinal is None else self.read_requests.get(ordinal)

        try:
            prior_allocation(req, find).send(None)
        except StopIteration as done:
            return done.value
        raise AssertionError("prior_allocation waited")

    async def allocate_read(self, req: AllocateRequest) -> ReadTicket:
        """``FenceLedger.allocate_read``: ``prior_allocation`` (a retry gets the ticket it holds), then
        ``coverage.plan_allocate`` on the row."""
        row = self.row
        decided = self.prior_allocation(req)
        if isinstance(decided, ReadTicket):
            return decided
        request_id = decided
        plan = coverage.plan_allocate(row, session_generation=req.session_generation,
                             subscription_generation=req.subscription_generation, min_ordinal=req.min_ordinal)
        if plan is None:
            return _REFUSED
        if request_id in self.request_ids:
            raise LedgerIntegrityError(
                f"read_requests.request_id UNIQUE: {request_id} already holds an ordinal")
        ordinal = plan.ordinal
        if ordinal in self.read_requests:
            raise LedgerIntegrityError(f"read_requests PRIMARY KEY: ordinal {ordinal} exists")
        self.row = plan.applied(row)
        overdue = self._record_allocation(row)
        self.read_requests[ordinal] = ReadRequestRow(
            ordinal=ordinal, request_id=request_id, session_generation=req.session_generation,
            subscription_generation=req.subscription_generation, trigger_reason=req.trigger,
            notifications_seen=plan.notified, cycle_id=req.cycle_id, outcome=None, completed_at=None)
        self.request_ids[request_id] = ordinal
        if req.cycle_id is not None:
            self.cycle_ids[req.cycle_id] = ordinal
        self.log.append(LedgerWrite(kind="allocate", before=row, after=self.row, outbox=overdue,
                                    ordinal=ordinal))
        return ReadTicket(granted=True, ordinal=ordinal, request_id=request_id,
                          notifications_seen=plan.notified)

    def _draw(self) -> float:
        if self._draws is None:
            self._draws = random.Random(f"{self._seed}/verification")
        return self._draws.random()

    def _record_allocation(self, row: FenceSnapshot) -> OutboxEntry | None:
        """``verification.record_allocation`` for the row as it stood before the grant: a verification of a
        scheduled row, due again ``verification_delay`` later; the ``overdue`` entry of the gap it closed,
        when that breach was not reported yet."""
        period = self.safety_read_seconds
        if row.state != _ACTIVE or period is None:
            return None
        entry = None
        if self.verified_at is not None:  # a chain's first verification closes no gap
            gap = verification_rules.judge_gap(verified_at=self.verified_at, watched_at=self.watched_at,
                                               now=self.now, period_seconds=period)
            entry = self._report_overdue() if gap.report else None
        self.verified_at = self.now
        self.verify_due_at = self.now + timedelta(
            seconds=verification_rules.verification_delay(period, self._draw()))
        return entry

    def mark_active(self, req: MarkActiveRequest) -> FenceSnapshot:
        """``FenceLedger.mark_active``: ``mark_active_writes``; a row it marks keeps its verification
        chain while it holds a version, else starts a new one; due within ``claim_delay`` unless the new
        generation's first read lands (``verification.mark_chain``)."""
        writes = mark_active_writes(self.row, req)
        keep = verification_rules.continues_chain(self.row.last_accepted_digest)
        row = self.transition(writes)
        if writes:
            period = self.safety_read_seconds
            if not keep:
                self.verified_at = self.watched_at = None
            self.verify_due_at = None if period is None \
                else self.now + timedelta(seconds=verification_rules.claim_delay(period))
        return row

    def scheduled_due(self) -> datetime | None:
        """When the row's next verification is due, if the sweep's index holds it (ACTIVE, with a
        safety-read period); None otherwise."""
        if self.safety_read_seconds is None or self.row.state != _ACTIVE:
            return None
        return self.verify_due_at

    def due(self, subject: str, server: str, *, limit: int = 500, ahead: float = 0.0,
            generation: int | None = None) -> Due:
        """``VerificationLedger.due``: the row if its verification is due within ``ahead`` seconds,
        claimed (due again ``claim_delay`` later); and how long until the next is due."""
        due = self.scheduled_due() if (subject, server) == (self.key.subject, self.key.server) else None
        if due is None:
            return Due(uris=[], next_in=None)
        uris: list[str] = []
        looks: list[NotedNotification] = []
        shortest = None
        if due <= self.now + timedelta(seconds=ahead) and limit > 0:
            assert self.safety_read_seconds is not None
            uris.append(self.key.uri)
            if generation is not None:  # the row as claimed: the sweep's look
                looks.append(cast(NotedNotification, self.note_notification(generation, count=False)))
            shortest = self.safety_read_seconds
            due = self.verify_due_at = self.now + timedelta(
                seconds=verification_rules.claim_delay(self.safety_read_seconds))
        return Due(uris=uris, next_in=max(0.0, (due - self.now).total_seconds()), shortest_period=shortest,
                   looks=looks)

    def _report_overdue(self) -> OutboxEntry:
        """``verification.report_overdue``: an ``overdue`` entry naming the current version."""
        entry = OutboxEntry(self._next_id(), OutboxEventType.OVERDUE, self.row.last_receipt_id or 0,
                            self.row.last_accepted_digest, self.row.watermark)
        self.outbox.append(entry)
        self.audit.append("VERIFICATION_OVERDUE")
        return entry

    def watch(self) -> WatchResult:
        """``VerificationLedger.watch``: ``judge_gap`` on the gap still open, a new breach reported."""
        period = self.safety_read_seconds
        if self.row.state != _ACTIVE or period is None:
            return _UNSCHEDULED
        gap = verification_rules.judge_gap(verified_at=self.verified_at, watched_at=self.watched_at,
                                           now=self.now, period_seconds=period)
        entry = self._report_overdue() if gap.report else None
        self.watched_at = self.now
        self.log.append(LedgerWrite(kind="watch", before=self.row, after=self.row, outbox=entry))
        return WatchResult(scheduled=True, verified_at=self.verified_at, gap_seconds=gap.gap_seconds,
                           period_seconds=period, overdue=gap.overdue,
                           outbox_id=entry.outbox_id if entry else None)

    def note_notification(self, generation: int, *, count: bool = True) -> NotedNotification | None:
        """``FenceLedger.note_notification``: ``coverage.plan_note`` on the row (notified + 1; ``count``
        False, the sweep's look: nothing written), the workflow id the row recorded (where the ingress
        signals) and whether the note creates work; None without a row."""
        if not self.row.exists:
            return None
        plan = coverage.plan_note(self.row, generation=generation)
        if count:
            self.row = plan.applied(self.row)
        return NotedNotification(workflow_id=self.workflow_id, fence=self.row, work=plan.work)

    def accept_judged(self, req: AcceptRequest) -> tuple[AcceptResult, str | None]:
        """``FenceLedger.accept_judged``: the answer and the digest of the read it judged (a replay:
        the stored receipt's, not the retry's)."""
        o = req.outcome
        fence = self.row
        issued = issued_read(self.read_requests.get(o.ordinal))
        judgement = self.judge(fence, issued, o, row_uri=self.key.uri if fence.exists else None)
        plan = plan_accept(fence, issued, o, judgement,
                           absorbed=req.absorbed if fence.exists else 0)
        if plan.replay:
            prior = next((r for r in self.receipts if r.ordinal == o.ordinal), None)
            return accept_result(plan, fence, receipt_id=prior.receipt_id if prior else None, outbox_id=None,
                                 ordinal=o.ordinal), prior.digest if prior else None
        receipt, entry = self._apply(plan, outcome=o, issued=issued, ordinal=o.ordinal)
        return accept_result(plan, fence, receipt_id=receipt.receipt_id if receipt else None,
                             outbox_id=entry.outbox_id if entry else None), o.content_digest

    def begin_unsubscribe(self) -> CloseReceipt:
        if not self.row.exists:
            raise LookupError("no subscription")
        plan = plan_close(self.row)
        frozen = plan.fence.close_ordinal if plan.fence is not None else None
        self._apply(plan, ordinal=frozen or 0)
        return close_receipt(self.row)

    def revoke(self) -> FenceSnapshot:
        self._apply(plan_revoke(self.row, source=RevokeSource.PLATFORM, reason="revoked by platform"))
        return self.row

    def confirm_tombstone(self, listed: bool, scan_id: str, proven: bool) -> FenceSnapshot:
        self._apply(plan_tombstone(self.row, listed=listed, proven=proven, scan_id=scan_id))
        return self.row

    def write_audit(self, kind: str) -> int:
        self.audit.append(kind)
        return len(self.audit)


def _start_subscription(led: MemoryLedger, req: StartSubscriptionRequest) -> SubscriptionStarted:
    """``Act.START_SUBSCRIPTION`` as the PostgreSQL ledger runs it: the three activities it stands for."""
    fence, session = led.ensure_subscription(req.ensure.incarnation), led.session
    if not (req.begin and session is not None and begins_at_start(fence)):
        return SubscriptionStarted(fence=fence, session=session)
    begin = BeginSubscriptionRequest(key=req.ensure.key, session_generation=session.generation)
    begun = led.transition(begin_writes(led.row, begin))
    return SubscriptionStarted(fence=fence, session=session, begun=begun)


LEDGER_ACTIVITIES: dict[str, Callable[[MemoryLedger, Any], Any]] = {
    Act.ENSURE: lambda led, req: led.ensure_subscription(req.incarnation),
    Act.LOAD_FENCE: lambda led, req: led.row,
    Act.CURRENT_SESSION: lambda led, req: led.session,
    Act.BEGIN_SUBSCRIPTION: lambda led, req: led.transition(begin_writes(led.row, req)),
    Act.START_SUBSCRIPTION: _start_subscription,
    Act.MARK_ACTIVE: lambda led, req: led.mark_active(req),
    Act.SET_STATE: lambda led, req: led.transition(set_state_writes(led.row, req)),
    Act.BEGIN_UNSUBSCRIBE: lambda led, req: led.begin_unsubscribe(),
    Act.FINISH_UNSUBSCRIBE: lambda led, req: led.transition(finish_unsubscribe_writes(led.row, req)),
    Act.CONFIRM_TOMBSTONE: lambda led, req: led.confirm_tombstone(req.listed, req.scan_id, req.proven),
    Act.REVOKE: lambda led, req: led.revoke(),
    Act.AUDIT: lambda led, req: led.write_audit(req.kind),
    Act.WATCH_VERIFICATIONS: lambda led, req: led.watch(),
}
"""The ledger activities the program schedules, by name: each on ``MemoryLedger`` with its request."""
