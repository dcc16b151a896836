"""Deterministic simulator: the fence's own pure code under seeded adversarial schedules.

Contract:
- Pure and deterministic: no I/O, no wall clock, no threads, no hashing of ``id()``s;
  randomness only from ``random.Random`` seeded per schedule (``schedule_seed``). The same
  seed, config and code give the same events and the same result, byte for byte.
- Drives the SAME code production runs, not a re-implementation: the workflow side is
  ``mcpsync.workflows.subscription_program.SubscriptionProgram`` (the program ``ResourceSubscriptionWorkflow``
  runs), interpreted by ``sim.runtime.ProgramRun``; the durable side is the fence rules
  (``allocate_ordinal``, ``judge_read`` …) turned into write plans by ``mcpsync.workflows.write_plan``
  and applied by ``MemoryLedger``, an in-memory model of the PostgreSQL tables
  (``subscriptions``, ``read_requests``, ``resource_versions``, ``outbox``, ``audit``,
  ``mcp_sessions``) that applies the same plans as ``activities/ledger_fence.py``, including
  the UNIQUE/CHECK constraints of ``001_ledger.sql`` (a write SQL would reject is reported,
  never silently applied).
- The session host's ingress (``worker/session_host.py: _route``: ``Ledger.note_notification``
  bumps the row's update counter, then the signal carries it as ``ResourceUpdated.sequence``)
  is modelled by ``Simulation._route``; its reads at the ingress (``_deliver``: ``fence.ingress_read_request``,
  ``run_cycle``, the ``resource_read`` report or the fallback signal, pulses queued behind a read and
  skipped as covered) by ``Simulation._read_at_ingress`` and the ``INGRESS_READ`` pseudo-activity.
- The environment is adversarial and seeded: an oracle server (committed content
  versions, mutations, deletes, recreates; a read is answered with the content current
  when it is *served*), notifications (dropped, duplicated, delayed, reordered, from old
  session generations, for a different URI), activities executed and completed in any
  order and at least once (a lost response re-executes), lost unsubscribe ACKs, poll and
  safety-read timers, session loss and reconnect, continue-as-new (``FenceState`` JSON
  round trip), workflow reset to an earlier snapshot (with or without signal reapply; the
  durable row persists and the old run's started activities still land), catalog
  reconciliations (proven or not, measured late), identity conflicts and resume, close,
  and restart of a closed key as a new incarnation. Time advances one second per step,
  and a TIMER event jumps it to the armed timer's fire time (a timer armed for a deadline
  fires at that deadline, not "whenever"): it feeds ``workflow.now()``, catalog
  ``measured_at`` and the staleness-bound check.
- Invariants (``Invariant``) are checked after EVERY step against the oracle; at the end
  the schedule drains (remaining events, then one final invalidation, to quiescence)
  and must have converged. A failing schedule shrinks (ddmin) to a short ``Trace``
  (seed + profile + events) that ``replay`` reproduces from JSON.
"""

from __future__ import annotations

import multiprocessing
import os
import random
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from mcpsync.workflows.coverage import dirty, plan_allocate, plan_note
from mcpsync.workflows.digest import ContentPart, content_digest
from mcpsync.workflows.ingress_rules import ingress_read_request
from mcpsync.workflows.ledger_rules import IssuedRead, Judgement, judge_read, marked_active
from mcpsync.workflows.names import Act
from mcpsync.workflows.program_runtime import WaitKind
from mcpsync.workflows.records import (
    AcceptRequest,
    AcceptResult,
    AcceptVerdict,
    AllocateRequest,
    CacheScope,
    CatalogObservation,
    CloseReceipt,
    FenceSnapshot,
    IdentityConflict,
    NotedNotification,
    ReadCycleRequest,
    ReadCycleResult,
    ReadOutcome,
    ReadOutcomeKind,
    ReadReport,
    ReadRequest,
    ReadTicket,
    ResourceUpdated,
    RevokeRequest,
    SessionInfo,
    SubscribeCycleRequest,
    SubscribeCycleResult,
    SubscribeOutcome,
    SubscribeRequest,
    SubscriptionKey,
    SubscriptionOptions,
    SubscriptionStart,
    SubscriptionState,
    TriggerReason,
    UnsubscribeOutcome,
    UnsubscribeRequest,
)
from mcpsync.workflows.subscription_state import TERMINAL
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
from sim.runtime import ContinueAsNew, ProgramRun, RunStage, ScheduleActivity, Signal

__all__ = [
    "Invariant",
    "SAFETY_INVARIANTS",
    "Violation",
    "Fault",
    "ALL_FAULTS",
    "Op",
    "Event",
    "Profile",
    "Trace",
    "SimConfig",
    "JudgeFn",
    "INGRESS_READ",
    "LedgerIntegrityError",
    "MemoryLedger",
    "Oracle",
    "SessionHost",
    "Simulation",
    "ScheduleResult",
    "Summary",
    "schedule_seed",
    "run_schedule",
    "replay",
    "shrink",
    "run_schedules",
    "merge_summaries",
    "shrink_failures",
    "summary_json",
]

S = SubscriptionState
V = AcceptVerdict
KEY = SubscriptionKey(subject="sim", server="oracle", uri="oracle://doc/a")
WRONG_URI = "oracle://doc/%61"  # the same resource only after percent-decoding: never routed
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # fixed: the simulator has no clock
CLOSING = frozenset({S.UNSUBSCRIBING, S.CLOSED, S.UNSUBSCRIBE_UNKNOWN})
ENDED = TERMINAL  # CLOSED, UNSUBSCRIBE_UNKNOWN, TOMBSTONED, REVOKED: never reopen in this incarnation
INVALIDATIONS = frozenset({"version_accepted", "tombstoned"})  # outbox rows a read or catalog makes
MCP_ACTIVITIES = frozenset({Act.MCP_UNSUBSCRIBE, Act.MCP_READ_CYCLE, Act.MCP_SUBSCRIBE_CYCLE})  # on the session queue
FLUSH_BUDGET = 3000  # drain steps before we call it a failure to quiesce
# A read the ingress makes itself (``worker/session_host.py: _deliver`` -> ``McpSessionActivities.run_cycle``):
# a pseudo-activity of the session host, not of any run (a workflow reset does not touch it), executed in
# the read cycle's three steps. Its verdict is reported (``resource_read``) or it falls back to a signal.
INGRESS_READ = "ingress_read_cycle"
SUBSCRIBE_CYCLE_READ = 2  # MCP_SUBSCRIBE_CYCLE: subscribe (step 0), mark (1), then the read cycle's three steps


# --- invariants and violations ---------------------------------------------------------------


class Invariant(StrEnum):
    VERSION_REGRESSION = "version_regression"  # durable ordinals/watermark or accepted oracle version went back
    NOT_ACTIVE_WRITE = "not_active_write"  # version/tombstone/outbox row while the row was not ACTIVE (or other gen)
    LATE_TOMBSTONE = "late_tombstone"  # TOMBSTONE_PENDING from a read issued before a close
    OUTBOX_AFTER_CLOSE = "outbox_after_close"  # outbox row after the close fence froze
    UNCOMMITTED_DIGEST = "uncommitted_digest"  # an accepted digest the oracle never committed
    ORDINAL_ORDER = "ordinal_order"  # ordinals not unique and monotonic
    LEDGER_INTEGRITY = "ledger_integrity"  # a write PostgreSQL would reject (UNIQUE/CHECK): the activity never succeeds
    WORKFLOW_ERROR = "workflow_error"  # an exception in workflow code
    LIVELOCK = "livelock"  # the main loop spins without blocking (Temporal: deadlocked workflow task)
    NO_CONVERGENCE = "no_convergence"  # quiet end, drained, final invalidation: not the oracle's last state
    COVERED_UNREAD = "covered_unread"  # quiet end, before any timer: an update skipped as COVERED, change unread
    # an idle ACTIVE subscription with a published bound (poll interval, or the safety period) armed its
    # next wake-up later than one bound after the last read the ledger allocated (or armed none)
    STALENESS_BOUND = "staleness_bound"


SAFETY_INVARIANTS = frozenset({
    Invariant.VERSION_REGRESSION, Invariant.NOT_ACTIVE_WRITE, Invariant.LATE_TOMBSTONE,
    Invariant.OUTBOX_AFTER_CLOSE, Invariant.UNCOMMITTED_DIGEST, Invariant.ORDINAL_ORDER,
})
"""The seed's release gates: what the fences promise whatever the schedule (the rest is liveness)."""


@dataclass(frozen=True, slots=True)
class Violation:
    invariant: Invariant
    step: int
    detail: str


# --- faults, events, profiles, traces ------------------------------------------------------


class Fault(StrEnum):
    """Fault classes the generator may use (all by default); each can be switched off."""

    DROP = "drop"  # a change emits no notification
    DUPLICATE = "duplicate"  # a change emits 2-3 notifications (same or distinct ingress ids)
    REORDER = "reorder"  # queued messages delivered out of order
    OLD_SESSION = "old_session"  # notifications stamped with an older session generation
    WRONG_URI = "wrong_uri"  # a notification naming a URI variant
    DELETE = "delete"  # oracle deletes / recreates
    CLOSE = "close"  # close requests (update and signal)
    LOST_ACK = "lost_ack"  # unsubscribe ACK lost
    SESSION_LOSS = "session_loss"  # session dropped; reconnect as a new generation (maybe after a gap)
    READ_FAILURE = "read_failure"  # a read's activity fails or its result is malformed
    REVOKE = "revoke"  # a read is denied (the judge revokes) or the platform revokes
    GUARDRAIL = "guardrail"  # some content versions are not releasable to a model
    RETRY = "retry"  # an activity's response is lost after it took effect: it runs again
    CONTINUE_AS_NEW = "continue_as_new"
    RESET = "reset"  # workflow reset to an earlier snapshot
    CATALOG = "catalog"  # catalog_reconciled observations
    CONFLICT = "conflict"  # identity_conflict signals and resume updates
    RESTART = "restart"  # a closed key started again (new incarnation)
    CONCURRENT_READS = "concurrent_reads"  # profiles with SubscriptionOptions.max_concurrent_reads > 1
    POLLING = "polling"  # servers without subscribe, or that reject it


ALL_FAULTS = frozenset(Fault)


class Op(StrEnum):
    MUTATE = "mutate"  # oracle commits new content; n = notification copies (0: dropped);
    # fault tokens joined by "+": "same_id" (duplicates share the ingress id), "unsafe" (guardrail rejects it)
    DELETE = "delete"  # oracle deletes the resource; n = notification copies
    RECREATE = "recreate"  # oracle recreates it with new content; n = notification copies
    DELIVER = "deliver"  # network delivers the n-th queued message (n > 0: reordered)
    OLD_NOTE = "old_note"  # a notification from session generation (live - 1 - n)
    WRONG_URI = "wrong_uri"  # a notification for a URI variant
    CLOSE = "close"  # close update (fault "signal": the fire-and-forget signal)
    EXEC = "exec"  # the n-th scheduled activity named ``act`` runs
    # (fault: lost | ack_lost | denied | error | malformed)
    COMPLETE = "complete"  # the n-th executed activity named ``act`` returns to the workflow
    TIMER = "timer"  # the main loop's timer fires (poll, safety re-read or session recheck)
    RECONNECT = "reconnect"  # the session is lost; a new generation opens (n = 1: after a gap)
    SESSION_OPEN = "session_open"  # the session host opens a new generation after a gap
    CAN = "can"  # Temporal suggests continue-as-new
    CHECKPOINT = "checkpoint"  # remember the workflow as it is now (a reset point)
    RESET = "reset"  # reset to the n-th newest checkpoint (fault "reapply": later signals reapplied)
    CATALOG = "catalog"  # a reconciled catalog says whether the URI is listed, as measured n steps ago
    # (fault "proven": SNAPSHOT_PROVEN, which may revoke; otherwise SNAPSHOT_UNPROVEN)
    CONFLICT = "conflict"  # identity_conflict signal
    RESUME = "resume"  # resume update
    RESTART = "restart"  # start the key again after its chain finished
    REVOKE = "revoke"  # the platform's revoke signal
    FINAL_NOTE = "final_note"  # drain: one final invalidation from the live session
    FIRST_READ = "first_read"  # the first_read update (Update-with-Start's); in written traces only


@dataclass(frozen=True, slots=True)
class Event:
    op: Op
    n: int = 0
    act: str = ""
    fault: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op.value}
        if self.n:
            out["n"] = self.n
        if self.act:
            out["act"] = self.act
        if self.fault:
            out["fault"] = self.fault
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Event:
        return cls(op=Op(obj["op"]), n=int(obj.get("n", 0)), act=str(obj.get("act", "")),
                   fault=str(obj.get("fault", "")))


@dataclass(frozen=True, slots=True)
class Profile:
    """Per-schedule environment: what the server does and how the workflow is configured."""

    capability: str = "subscribe"  # "subscribe" | "none" (polls) | "rejects" (advertised, refused: polls)
    max_concurrent_reads: int = 1  # SubscriptionOptions.max_concurrent_reads
    session_at_start: bool = True
    safety_read_seconds: float = 300.0  # SubscriptionOptions.safety_read_seconds (0: no safety re-read)

    def to_json(self) -> dict[str, Any]:
        return {"capability": self.capability, "max_concurrent_reads": self.max_concurrent_reads,
                "session_at_start": self.session_at_start, "safety_read_seconds": self.safety_read_seconds}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Profile:
        return cls(capability=str(obj["capability"]), max_concurrent_reads=int(obj["max_concurrent_reads"]),
                   session_at_start=bool(obj.get("session_at_start", True)),
                   safety_read_seconds=float(obj.get("safety_read_seconds", 300.0)))


@dataclass(frozen=True, slots=True)
class Trace:
    """A replayable schedule: ``replay(Trace.from_json(json.loads(text)))`` reproduces it."""

    seed: str
    profile: Profile
    events: tuple[Event, ...]
    violations: tuple[str, ...] = ()
    # The session host's ``read_on_notification`` setting the trace ran with (``SimConfig``).
    read_on_notification: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "profile": self.profile.to_json(), "read_on_notification": self.read_on_notification,
                "events": [e.to_json() for e in self.events], "violations": list(self.violations)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Trace:
        return cls(seed=str(obj["seed"]), profile=Profile.from_json(obj["profile"]),
                   events=tuple(Event.from_json(e) for e in obj["events"]),
                   violations=tuple(obj.get("violations", ())),
                   read_on_notification=bool(obj.get("read_on_notification", True)))


JudgeFn = Callable[..., Judgement]
"""``judge_read``'s signature: ``(row, issued, outcome, *, row_uri) -> Judgement`` (a seam for tests)."""

@dataclass(frozen=True)
class SimConfig:
    mean_events: int = 50  # events per schedule before the drain (uniform in [10, 2*mean-10])
    faults: frozenset[Fault] = ALL_FAULTS
    judge: JudgeFn = judge_read
    shrink_budget: int = 3000  # replays the shrinker may spend on one failing schedule
    # The session host's ``ServerConfig.read_on_notification``: a notified change of a row whose run
    # mirrors reports (``fence.ingress_read_request``) is read by the session host and reported
    # (``resource_read``); pulses for that (URI, generation) queue behind the read. False: every update
    # is signalled for the workflow to read.
    read_on_notification: bool = True


def schedule_seed(seed: int | str, index: int) -> str:
    return f"{seed}:{index}"


# --- the in-memory ledger ----------------------------------------------------------------------


class LedgerIntegrityError(Exception):
    """PostgreSQL would reject this transaction (UNIQUE or CHECK); nothing was written."""


@dataclass(slots=True)
class ReadRequestRow:
    ordinal: int
    request_id: str
    session_generation: int
    subscription_generation: int
    trigger: TriggerReason
    outcome: str | None = None
    completed: bool = False  # completed_at IS NOT NULL
    notifications_seen: int = 0  # the row's update counter at allocation
    in_cycle: bool = False  # read_requests.cycle_id IS NOT NULL


@dataclass(frozen=True, slots=True)
class Receipt:
    receipt_id: int
    ordinal: int
    digest: str | None
    status: AcceptVerdict
    request_id: str


@dataclass(frozen=True, slots=True)
class OutboxEntry:
    outbox_id: int
    event_type: str
    receipt_id: int
    digest: str | None
    ordinal: int


@dataclass(frozen=True, slots=True)
class LedgerWrite:
    """One committed ledger transaction, as the invariant checker sees it."""

    kind: str  # allocate | accept | close | tombstone | state | revoke (``PlanKind`` for planned writes)
    before: FenceSnapshot
    after: FenceSnapshot
    outcome: ReadOutcome | None = None
    issued: IssuedRead | None = None
    judgement: Judgement | None = None
    receipt: Receipt | None = None
    outbox: OutboxEntry | None = None
    ordinal: int = 0


_VERDICT_VALUES = {v.value for v in AcceptVerdict}
SUBSCRIBABLE = frozenset({S.DISCOVERED, S.SUBSCRIBING, S.ACTIVE, S.TOMBSTONE_PENDING, S.RECONCILIATION_REQUIRED})


class MemoryLedger:
    """The PostgreSQL ledger (``activities/ledger_fence.py``) for one subscription row, in memory.

    accept / close / tombstone / revoke apply the plan ``mcpsync.workflows.write_plan`` makes, the plan
    the SQL ledger applies; the other statements are modelled one by one. Each method is one
    transaction: it either raises ``LedgerIntegrityError`` having written nothing, or commits
    and appends a ``LedgerWrite`` to ``log``. Not modelled: staged rollouts (no policy row: every
    invalidation is written), the content store and its purge, the ``revocations`` row."""

    def __init__(self, key: SubscriptionKey, judge: JudgeFn = judge_read) -> None:
        self.key = key
        self.judge = judge
        self.row = FenceSnapshot(exists=False)
        self.incarnation = ""
        self.workflow_id = ""  # subscriptions.workflow_id: recorded by the ensure that creates the row
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

    def _next_id(self) -> int:
        self._ids += 1
        return self._ids

    def _set(self, kind: str, after: FenceSnapshot) -> FenceSnapshot:
        before, self.row = self.row, after
        if after != before:
            self.log.append(LedgerWrite(kind=kind, before=before, after=after))
        return after

    def _apply(self, plan: WritePlan, *, outcome: ReadOutcome | None = None, issued: IssuedRead | None = None,
               ordinal: int = 0) -> tuple[Receipt | None, OutboxEntry | None]:
        """Apply ``plan`` to the locked row as one transaction (the SQL applier's statements, in memory)."""
        before = self.row
        if plan.receipt is not None and plan.receipt.of_read and plan.receipt.ordinal in self.receipt_ordinals:
            raise LedgerIntegrityError(f"resource_versions_once: a receipt for ordinal {plan.receipt.ordinal} exists")
        if not plan.writes and plan.kind != PlanKind.ACCEPT:  # every judged read is logged, written or not
            return None, None
        if plan.audit is not None:
            self.audit.append(plan.audit.kind)
        if plan.read_request_outcome is not None and outcome is not None \
                and (rr := self.read_requests.get(outcome.ordinal)) is not None:
            rr.outcome, rr.completed = plan.read_request_outcome, True
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
            entry = OutboxEntry(self._next_id(), ob.event.value, target or 0, ob.content_digest, ob.ordinal)
            self.outbox.append(entry)
        if plan.fence is not None:
            self.row = plan.fence.applied(before, receipt_id)
        if plan.kind == PlanKind.STATE:
            if self.row != before:
                self.log.append(LedgerWrite(kind=plan.kind.value, before=before, after=self.row))
        else:
            self.log.append(LedgerWrite(kind=plan.kind.value, before=before, after=self.row, outcome=outcome,
                                        issued=issued, judgement=plan.judgement, receipt=receipt, outbox=entry,
                                        ordinal=ordinal))
        return receipt, entry

    # --- fence -------------------------------------------------------------------------------

    def ensure_subscription(self, incarnation: str, workflow_id: str | None = None) -> FenceSnapshot:
        """``workflow_id``: the caller's id (default the key's computed one); recorded once, like the
        SQL row (a second id is audited ``WORKFLOW_ID_MISMATCH`` and changes nothing)."""
        row = self.row
        running_as = workflow_id or self.key.workflow_id
        if not row.exists:
            row = FenceSnapshot(exists=True, state=S.DISCOVERED)
            self.incarnation = incarnation
            self.workflow_id = running_as
        elif self.workflow_id != running_as:
            self.audit.append("WORKFLOW_ID_MISMATCH")
        if self.incarnation != incarnation and row.state in ENDED:
            row = row.model_copy(update={"state": S.DISCOVERED, "close_ordinal": None})
            self.incarnation = incarnation
        if row.state not in CLOSING:
            self.incarnation = incarnation
        return self._set("state", row)

    def load_fence(self) -> FenceSnapshot:
        return self.row

    def current_session(self) -> SessionInfo | None:
        return self.session

    def begin_subscription(self, session_generation: int) -> FenceSnapshot:
        row = self.row
        if row.state in SUBSCRIBABLE and row.session_generation <= session_generation:
            row = row.model_copy(update={"state": S.SUBSCRIBING, "session_generation": session_generation,
                                         "subscription_generation": row.subscription_generation + 1})
        return self._set("state", row)

    def mark_active(self, session_generation: int, subscription_generation: int, *,
                    read_reports: bool = False) -> FenceSnapshot:
        """``read_reports``: the run mirrors reads the ingress makes; set or cleared with the
        transition, like ``subscriptions.read_reports``."""
        row = self.row
        if (row.state == S.SUBSCRIBING and row.session_generation == session_generation
                and row.subscription_generation == subscription_generation):
            row = row.model_copy(update={"state": S.ACTIVE, "read_reports": read_reports})
        return self._set("state", row)

    def set_state(self, state: SubscriptionState, allowed_from: Iterable[SubscriptionState]) -> FenceSnapshot:
        row = self.row
        if row.state in set(allowed_from):
            row = row.model_copy(update={"state": state})
        return self._set("state", row)

    def allocate_read(self, req: AllocateRequest) -> ReadTicket:
        row = self.row
        if req.cycle_id is not None and (held := self.cycle_ids.get(req.cycle_id)) is not None:
            # A retry of the read cycle that already allocated: the same ticket (``allocate_read``).
            rr = self.read_requests[held]
            return ReadTicket(granted=True, ordinal=held, request_id=rr.request_id,
                              notifications_seen=rr.notifications_seen)
        request_id = req.request_id
        while (prior := self.request_ids.get(request_id)) is not None:
            if not self.read_requests[prior].completed:
                # The same allocation asked again (a retry after a lost response): same ticket.
                return ReadTicket(granted=True, ordinal=prior, request_id=request_id,
                                  notifications_seen=self.read_requests[prior].notifications_seen)
            # A reset run re-derived a request id already used and finished: a new read, own id.
            request_id = f"{request_id}/{prior}"
        plan = plan_allocate(row, session_generation=req.session_generation,
                             subscription_generation=req.subscription_generation, min_ordinal=req.min_ordinal)
        if plan is None:
            return ReadTicket(granted=False, reason="fence refused: not ACTIVE or generation mismatch")
        if request_id in self.request_ids:
            raise LedgerIntegrityError(f"read_requests.request_id UNIQUE: {request_id} already holds an ordinal")
        ordinal = plan.ordinal
        if ordinal in self.read_requests:
            raise LedgerIntegrityError(f"read_requests PRIMARY KEY: ordinal {ordinal} exists")
        self.row = row.model_copy(update={"last_issued_ordinal": ordinal, "allocated_sequence": plan.notified})
        self.read_requests[ordinal] = ReadRequestRow(ordinal, request_id, req.session_generation,
                                                     req.subscription_generation, req.trigger,
                                                     notifications_seen=plan.notified,
                                                     in_cycle=req.cycle_id is not None)
        self.request_ids[request_id] = ordinal
        if req.cycle_id is not None:
            self.cycle_ids[req.cycle_id] = ordinal
        self.log.append(LedgerWrite(kind="allocate", before=row, after=self.row, ordinal=ordinal))
        return ReadTicket(granted=True, ordinal=ordinal, request_id=request_id,
                          notifications_seen=plan.notified)

    def note_notification(self, generation: int, now: datetime) -> NotedNotification | None:
        """``FenceLedger.note_notification``: ``coverage.plan_note`` on the row (notified + 1), the
        workflow id the row recorded (where the ingress signals) and whether the note creates work;
        None without a row."""
        if not self.row.exists:
            return None
        plan = plan_note(self.row, generation=generation)
        self.row = self.row.model_copy(update={"notifications_seen": plan.notified})
        return NotedNotification(workflow_id=self.workflow_id, fence=self.row, work=plan.work)

    def accept(self, req: AcceptRequest) -> AcceptResult:
        o = req.outcome
        fence = self.row
        rr = self.read_requests.get(o.ordinal)
        issued = None if rr is None else IssuedRead(
            ordinal=rr.ordinal, request_id=rr.request_id, session_generation=rr.session_generation,
            subscription_generation=rr.subscription_generation,
            completed_verdict=AcceptVerdict(rr.outcome) if rr.outcome in _VERDICT_VALUES else None,
            in_cycle=rr.in_cycle, notified=rr.notifications_seen,
        )
        plan = plan_accept(fence, issued, o, self.judge(fence, issued, o, row_uri=self.key.uri if fence.exists else None),
                           absorbed=req.absorbed if fence.exists else 0)
        if plan.replay:
            prior = next((r.receipt_id for r in self.receipts if r.ordinal == o.ordinal), None)
            return accept_result(plan, fence, receipt_id=prior, outbox_id=None)
        receipt, entry = self._apply(plan, outcome=o, issued=issued, ordinal=o.ordinal)
        return accept_result(plan, fence, receipt_id=receipt.receipt_id if receipt else None,
                             outbox_id=entry.outbox_id if entry else None)

    def begin_unsubscribe(self) -> CloseReceipt:
        if not self.row.exists:
            raise LookupError("no subscription")
        plan = plan_close(self.row)
        frozen = plan.fence.close_ordinal if plan.fence is not None else None
        self._apply(plan, ordinal=frozen or 0)
        return close_receipt(self.row)

    def finish_unsubscribe(self, acked: bool) -> FenceSnapshot:
        return self.set_state(S.CLOSED if acked else S.UNSUBSCRIBE_UNKNOWN, [S.UNSUBSCRIBING])

    def revoke(self) -> FenceSnapshot:
        self._apply(plan_revoke(self.row, source=RevokeSource.PLATFORM, reason="revoked by platform"))
        return self.row

    def confirm_tombstone(self, listed: bool, scan_id: str, proven: bool) -> FenceSnapshot:
        self._apply(plan_tombstone(self.row, listed=listed, proven=proven, scan_id=scan_id))
        return self.row

    def write_audit(self, kind: str) -> int:
        self.audit.append(kind)
        return len(self.audit)


# --- the oracle server and the session host -----------------------------------------------------


class Oracle:
    """The resource as the server holds it: every committed state has a version number and a
    unique digest (``None`` while deleted)."""

    def __init__(self) -> None:
        self.version = 1
        self.digest: str | None = self._content(1)
        self.committed: dict[str, int] = {self.digest: 1}
        self.unsafe: set[int] = set()  # versions the guardrail chain refuses to release

    @staticmethod
    def _content(version: int) -> str:
        return content_digest([ContentPart("text", "text/plain", f"oracle content v{version}".encode())])

    @property
    def exists(self) -> bool:
        return self.digest is not None

    def mutate(self, *, unsafe: bool = False) -> None:
        self.version += 1
        self.digest = self._content(self.version)
        self.committed[self.digest] = self.version
        if unsafe:
            self.unsafe.add(self.version)

    def delete(self) -> None:
        self.version += 1
        self.digest = None


@dataclass(frozen=True, slots=True)
class Message:
    """A signal on its way to the workflow (the network + ingress + Temporal frontend)."""

    kind: str  # updated | session_changed | read_reported
    generation: int
    notification_id: str | None = None
    uri: str = KEY.uri
    change: int = 0  # the oracle version that emitted it (0: not a change notification)
    sequence: int | None = None  # ResourceUpdated.sequence the ingress stamped (None: no fence row)
    report: ReadReport | None = None  # read_reported: what the ingress read


class SessionHost:
    """The MCP server's sessions plus our session host: MIRROR(activities/mcp_session.py)."""

    def __init__(self, capability: str, ledger: MemoryLedger) -> None:
        self.capability = capability
        self.ledger = ledger
        self.live: SessionInfo | None = None
        self.generation = 0
        self.subscribed: set[int] = set()  # session generations holding a server-side subscription

    def open(self) -> int:
        self.generation += 1
        self.live = SessionInfo(subject=KEY.subject, server=KEY.server, generation=self.generation,
                                edition="2025-11-25", subscribe=self.capability != "none", list_changed=False,
                                server_name="oracle", server_version="1", task_queue="mcpsync-session/oracle/sim",
                                opened_at=EPOCH)
        self.ledger.session = self.live
        return self.generation

    def drop(self) -> None:
        if self.live is not None:
            self.subscribed.discard(self.live.generation)
        self.live = None
        self.ledger.session = None

    def _live(self, generation: int) -> SessionInfo | None:
        return self.live if self.live is not None and self.live.generation == generation else None

    def subscribe(self, req: SubscribeRequest) -> SubscribeOutcome:
        live = self._live(req.session_generation)
        if live is None:
            return SubscribeOutcome(ok=False, session_generation=self.live.generation if self.live else 0,
                                    error="session generation is gone")
        if self.capability == "rejects":
            return SubscribeOutcome(ok=False, session_generation=live.generation, error_code=-32601,
                                    error="Method not found")
        self.subscribed.add(live.generation)
        return SubscribeOutcome(ok=True, session_generation=live.generation)

    def unsubscribe(self, req: UnsubscribeRequest, *, ack_lost: bool) -> UnsubscribeOutcome | None:
        live = self._live(req.session_generation)
        if live is None:
            return UnsubscribeOutcome(acked=False, error="session generation is gone")
        self.subscribed.discard(live.generation)
        return None if ack_lost else UnsubscribeOutcome(acked=True)

    def read(self, req: ReadRequest, oracle: Oracle, *, fault: str) -> ReadOutcome | None:
        base: dict[str, Any] = {"key": req.key, "ordinal": req.ordinal, "request_id": req.request_id,
                                "session_generation": req.session_generation,
                                "subscription_generation": req.subscription_generation, "trigger": req.trigger}
        if self._live(req.session_generation) is None:
            return ReadOutcome(kind=ReadOutcomeKind.SESSION_LOST, error="session generation is gone", **base)
        if fault == "error":
            return None  # retries exhausted: ActivityError, the workflow's _mcp answers None
        # The oracle stamps the version it served into server_version (metadata only) so the
        # checker can tell which committed state a receipt came from.
        base["server_version"] = f"v{oracle.version}"
        if fault == "denied":
            return ReadOutcome(kind=ReadOutcomeKind.DENIED, error_code=-32001, error="denied", **base)
        if fault == "malformed":
            return ReadOutcome(kind=ReadOutcomeKind.MALFORMED, error="invalid result", **base)
        if oracle.digest is None:
            return ReadOutcome(kind=ReadOutcomeKind.NOT_FOUND, error_code=-32002, error="not found", **base)
        rejection = "simulated guardrail" if oracle.version in oracle.unsafe else None
        # Every third version carries a ttlMs longer than the 30 s poll interval: the poll period
        # (and the deadline armed before the read came back) grows, and shrinks again after it.
        ttl_ms = 45_000 if oracle.version % 3 == 0 else 0
        return ReadOutcome(kind=ReadOutcomeKind.CONTENT, content_digest=oracle.digest, mime_type="text/plain",
                           size=20, content_count=1, guardrail_rejection=rejection, ttl_ms=ttl_ms,
                           cache_scope=CacheScope.PRIVATE, **base)


# --- the workflow, replicated ---------------------------------------------------------------------


# --- the simulation: environment, scheduler, checker ----------------------------------------------

@dataclass(slots=True)
class Activity:
    aid: int
    run: int
    seq: int  # the command's sequence number in its run
    name: str
    arg: Any
    executed: bool = False
    result: Any = None
    poisoned: bool = False  # PostgreSQL rejects it every time: it never completes
    # The read cycle (Act.MCP_READ_CYCLE) runs in three steps, each its own event: allocate, read,
    # accept. ``step`` is the next one; a lost attempt starts again at 0 (the ledger's cycle id
    # hands the retry the same ticket, and a committed accept replays).
    step: int = 0
    ticket: ReadTicket | None = None
    outcome: ReadOutcome | None = None
    ingress: IngressRoute | None = None  # INGRESS_READ: the routing it belongs to
    active: FenceSnapshot | None = None  # MCP_SUBSCRIBE_CYCLE: the row its mark answered


@dataclass(slots=True)
class IngressRoute:
    """One processing of the ingress's work-queue key (KEY.uri, ``generation``) that reads at the
    ingress (``SessionHost._deliver``). ``sig`` is the update it reads for (the ``resource_read``
    report's, or the fallback ``resource_updated``'s); ``asked``: when it asked for the allocation
    (``requested_at``)."""

    generation: int
    sig: ResourceUpdated
    change: int
    notified: int  # the row's count after the note this processing made
    asked: datetime | None = None
    absorbed: int = 0  # pulses taken into the read (``AcceptRequest.absorbed``: 1 for a group)
    absorbed_change: int = 0  # the newest change they announced


@dataclass(slots=True)
class PulseGroup:
    """Pulses for the key (KEY.uri, generation) that arrived while it was processed (the work queue's
    dirty mark): it is processed again, as the newest of them, once the processing ends."""

    nid: str  # the newest pulse's ingress id
    change: int  # the newest change any of them announced
    pulses: int = 1


@dataclass(slots=True)
class Checkpoint:
    run: ProgramRun  # the run the checkpoint was taken in; a reset replays its first ``inputs`` inputs
    inputs: int
    draws: int
    signal_index: int


@dataclass(slots=True)
class ScheduleResult:
    seed: str
    profile: Profile
    events: list[Event]
    violations: list[Violation]
    steps: int = 0
    converged_after: int | None = None  # steps from the oracle's last change to convergence
    notification_reads: int = 0  # judged reads triggered by updated / follow_up
    fresh_reads: int = 0  # ... that served an oracle version no earlier read had served
    duplicate_deliveries: int = 0
    covered_updates: int = 0  # updates that skipped their read as COVERED
    coverage: dict[str, int] = field(default_factory=dict)
    read_on_notification: bool = True  # the ingress read notified changes itself

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    def trace(self) -> Trace:
        return Trace(seed=self.seed, profile=self.profile, events=tuple(self.events),
                     violations=tuple(f"{v.invariant.value}@{v.step}: {v.detail}" for v in self.violations),
                     read_on_notification=self.read_on_notification)


class Simulation:
    """One schedule: environment + workflow chain + ledger + checker. ``apply`` one event at a
    time (inapplicable events are no-ops, which keeps shrunk traces replayable)."""

    def __init__(self, seed: str, profile: Profile, config: SimConfig) -> None:
        self.seed = seed
        self.profile = profile
        self.config = config
        self.oracle = Oracle()
        self.ledger = MemoryLedger(KEY, judge=config.judge)
        self.host = SessionHost(profile.capability, self.ledger)
        self.queue: list[Message] = []
        self.activities: list[Activity] = []
        self.checkpoints: list[Checkpoint] = []
        self.signal_log: list[tuple[Signal, Any]] = []
        self.violations: list[Violation] = []
        self.events: list[Event] = []
        self.step = 0
        self.times: list[datetime] = [EPOCH]  # the clock after each step (index = step)
        self.chain = 0
        self.run = 0
        self._aid = 0
        self._note_id = 0
        self._scan = 0
        self.coverage: dict[str, int] = {}
        # checker state
        self._log_seen = 0
        self._prev = FenceSnapshot(exists=False)
        self._accepted_version = 0
        self._max_allocated = 0
        self._max_outbox_ordinal = 0
        self._close_fences: list[int] = []
        self._flagged: set[Invariant] = set()
        self._last_allocated_at: datetime | None = None  # when the ledger last granted a read ordinal
        self.signals_erased = False  # a reset without reapply dropped delivered signals
        self.now = EPOCH  # the time of the event being applied
        self._late_timers: set[datetime | None] = set()  # wake-ups already reported as too late
        self._note_change: dict[str, int] = {}  # notification id -> the oracle version that emitted it
        self._noted_change: dict[int, int] = {}  # the row's notified count -> the change that note announced
        self._ingress_ordinals: set[int] = set()  # ordinals the ingress's reads were granted
        self._clean_flagged: set[str] = set()
        self.exists_history: list[bool] = [True]  # the oracle's ``exists`` after each step (catalog lag)
        # the session host's work queue for KEY.uri, per session generation: the read processing the key
        # now (``SimConfig.read_on_notification``), and pulses that arrived meanwhile (its dirty mark)
        self._ingress_routing: dict[int, Activity] = {}
        self._ingress_queued: dict[int, PulseGroup] = {}
        # metrics
        self.last_change_step = 0
        self.converged_since: int | None = 0
        self.count_reads = True
        self.notification_reads = 0  # reads triggered by updated/follow_up that reached the judge
        self.fresh_reads = 0  # ... of which served an oracle version no earlier read had served
        self.observed: set[int] = set()
        self.duplicate_deliveries = 0
        self.covered_reads_saved = 0  # notes that created no work (``coverage.plan_note``)
        if profile.session_at_start:
            self.host.open()
        self.wf = self._new_chain()
        self._activate()
        self._check()

    # --- plumbing ----------------------------------------------------------------------------------

    def _cover(self, name: str) -> None:
        self.coverage[name] = self.coverage.get(name, 0) + 1

    def _program_run(self, start: SubscriptionStart, incarnation: str) -> ProgramRun:
        wf = ProgramRun(start, incarnation, f"c{self.chain}r{self.run}", EPOCH, self.times[self.step])
        wf.start()
        return wf

    def _new_chain(self) -> ProgramRun:
        self.chain += 1
        self.run += 1
        self.checkpoints.clear()
        self.signal_log.clear()
        options = SubscriptionOptions(max_concurrent_reads=self.profile.max_concurrent_reads,
                                      poll_interval_seconds=30.0, safety_read_seconds=self.profile.safety_read_seconds)
        return self._program_run(SubscriptionStart(key=KEY, options=options), f"chain{self.chain}")

    @property
    def chain_running(self) -> bool:
        return self.wf.stage not in (RunStage.DONE, RunStage.WEDGED)

    def _activate(self) -> None:
        """Run the workflow until blocked and carry out its commands (repeat for continue-as-new)."""
        while True:
            wf = self.wf
            wf.clock = self.times[self.step]
            if wf.stage == RunStage.RUNNING:
                wf.activate()
            for err in wf.errors:
                invariant = Invariant.LIVELOCK if err.startswith("livelock") else Invariant.WORKFLOW_ERROR
                self._violate(invariant, err)
            wf.errors.clear()
            for _nid, disposition in wf.notes:
                self._cover(f"update.{disposition.value}")
            wf.notes.clear()
            commands, wf.commands = wf.commands, []
            can: ContinueAsNew | None = None
            for cmd in commands:
                if isinstance(cmd, ScheduleActivity):
                    self._aid += 1
                    self.activities.append(Activity(self._aid, self.run, cmd.seq, cmd.name, cmd.arg))
                else:
                    can = cmd
            if can is None:
                return
            self._cover("continue_as_new")
            self.run += 1
            self.wf = self._program_run(can.start, wf.incarnation)

    def _violate(self, invariant: Invariant, detail: str) -> None:
        self.violations.append(Violation(invariant, self.step, detail))

    def _signal(self, kind: Signal, payload: Any, *, log: bool = True) -> None:
        """Deliver a signal or update to the running chain (dropped when it has completed)."""
        if not self.chain_running:
            return
        if log:
            self.signal_log.append((kind, payload))
        self.wf.signal(kind, payload)

    def _next_time(self, event: Event) -> datetime:
        """One second after the last step; a TIMER event fires the armed timer at its time."""
        at = self.times[self.step] + timedelta(seconds=1)
        timer_at = self.wf.timer_at
        if event.op == Op.TIMER and self.chain_running and timer_at is not None and timer_at > at:
            at = timer_at
        return at

    def _route(self, generation: int, nid: str, uri: str = KEY.uri, change: int = 0) -> Message | None:
        """The session host's processing of the work-queue key (``uri``, ``generation``)
        (``SessionHost._enqueue`` / ``_route`` / ``_deliver``): while the key is processed, the pulse
        marks it dirty (``_queue_pulse``); else ``note_notification`` (``coverage.plan_note``), then
        the ingress reads the change itself (``_read_at_ingress``) or signals ``resource_updated`` when
        the note created work. Stamped when the notification reaches the ingress; the queue models
        Temporal's delivery after that. None: nothing is signalled now."""
        if uri == KEY.uri:
            if generation in self._ingress_routing:
                self._queue_pulse(generation, nid, change)
                return None
            noted = self.ledger.note_notification(generation, self.now)
            if noted is not None:
                self._noted_change[noted.fence.notifications_seen] = change
                if self._read_at_ingress(noted, generation, nid, change):
                    if change:
                        self._note_change[nid] = change
                    return None
                if not noted.work:
                    self._cover("update.ingress_no_work")
                    self.covered_reads_saved += 1
                    return None
        if change:
            self._note_change[nid] = change
        return Message("updated", generation, nid, uri, change)

    # --- reads at the ingress ------------------------------------------------------------------------

    def _read_at_ingress(self, noted: NotedNotification, generation: int, nid: str, change: int) -> bool:
        """MIRROR(worker/session_host.py: _deliver): on the live session of ``generation``, the production
        rule (``fence.ingress_read_request``) decides whether the ingress reads the change itself. If so the
        read becomes an ``INGRESS_READ`` pseudo-activity (allocate / read / accept, each its own step)."""
        live = self.host.live
        if not self.config.read_on_notification or live is None or live.generation != generation:
            return False
        req = ingress_read_request(noted, KEY, generation=generation, request_id=f"ingress-{self._aid + 1}")
        if req is None:
            self._cover("ingress.no_request")
            return False
        self._aid += 1
        sig = ResourceUpdated(uri=KEY.uri, session_generation=generation, received_at=self.now,
                              notification_id=nid)
        act = Activity(self._aid, 0, 0, INGRESS_READ, req,
                       ingress=IngressRoute(generation, sig, change, noted.fence.notifications_seen))
        self.activities.append(act)
        self._ingress_routing[generation] = act
        self._cover("ingress.read")
        return True

    def _queue_pulse(self, generation: int, nid: str, change: int) -> None:
        """``WorkQueue.add`` for a key being processed: it is marked dirty (merged with the others)."""
        self._cover("ingress.queued")
        group = self._ingress_queued.get(generation)
        if group is None:
            self._ingress_queued[generation] = PulseGroup(nid, change)
        else:
            group.nid, group.change = nid, max(group.change, change)
            group.pulses += 1

    def _ingress_step(self, act: Activity, fault: str) -> None:
        """One step of the ingress's read (``McpSessionActivities.run_cycle``, via ``_read_cycle_step``).
        No retry: a step whose answer is lost (``lost``: it took effect) or a read that failed makes
        ``run_cycle`` raise, and the ingress falls back to ``resource_updated``."""
        route = act.ingress
        assert route is not None
        if act.step == 0:
            # ``asked`` / ``requested_at``: production takes it in ``_deliver`` just before the allocation
            # (after the note); the simulator at the allocation step.
            route.asked = self.now
        elif act.step == 1 and act.ticket is not None and act.ticket.granted:
            # ``WorkQueue.take`` once the read is allocated, just before it is sent (``run_cycle(absorb=)``):
            # pulses since the note are absorbed, and its accept counts them (``AcceptRequest.absorbed``):
            # this read, sent after they arrived, observes their change.
            if (group := self._ingress_queued.pop(route.generation, None)) is not None:
                self._cover("ingress.absorbed")
                route.absorbed, route.absorbed_change = 1, group.change
        try:
            done, result = self._read_cycle_step(act, fault)
        except LedgerIntegrityError as err:
            self._violate(Invariant.LEDGER_INTEGRITY, f"{act.name}: {err}")
            done, result = True, None
        if act.ticket is not None and act.ticket.granted:
            self._ingress_ordinals.add(act.ticket.ordinal)
            rr = self.ledger.read_requests.get(act.ticket.ordinal)
            if route.absorbed and rr is not None and rr.completed:
                # counted by the accept (a lost answer too: it took effect): the checker holds the
                # change to that count
                n = act.ticket.notifications_seen + route.absorbed
                self._noted_change[n] = max(self._noted_change.get(n, 0), route.absorbed_change)
                route.absorbed = 0
        if fault == "lost":
            self._cover("ingress.lost_response")
            done, result = True, None
        if done:
            self._ingress_done(act, result)

    def _ingress_done(self, act: Activity, result: Any) -> None:
        """``SessionHost._deliver`` after its read: judged: report it (``resource_read``). Else
        ``resource_updated`` (the row stays dirty: the workflow reads). Then the processing ends
        (``WorkQueue.done``): a key marked dirty meanwhile is processed again."""
        route = act.ingress
        assert route is not None
        self.activities.remove(act)
        gen, sig = route.generation, route.sig
        del self._ingress_routing[gen]
        if isinstance(result, ReadCycleResult) and result.judged:
            assert result.accept is not None and route.asked is not None
            self._cover(f"ingress.verdict.{result.accept.verdict.value}")
            self._cover("ingress.report")
            report = ReadReport(update=sig, requested_at=route.asked, cycle=result)
            self.queue.append(Message("read_reported", gen, sig.notification_id, KEY.uri, route.change,
                                      report=report))
        else:
            self._cover("ingress.fallback")
            self.queue.append(Message("updated", gen, sig.notification_id, KEY.uri, route.change))
        group = self._ingress_queued.pop(gen, None)
        if group is None:
            return
        self._cover("ingress.queued_routed")
        if (msg := self._route(gen, group.nid, change=group.change)) is not None:
            self.queue.append(msg)

    def _notify(self, copies: int, same_id: bool) -> None:
        live = self.host.live
        if live is None or live.generation not in self.host.subscribed:
            return  # nobody subscribed on the live session: the server sends nothing
        self._note_id += 1
        first: Message | None = None
        for i in range(copies):
            if same_id and first is not None:
                self.queue.append(first)  # the same routed signal delivered again (one ingress id)
                continue
            nid = f"n{self._note_id}" if i == 0 else f"n{self._note_id}.{i}"
            first = self._route(live.generation, nid, change=self.oracle.version)
            if first is not None:
                self.queue.append(first)

    def _find(self, name: str, n: int, *, executed: bool) -> Activity | None:
        matches = [a for a in self.activities if a.name == name and a.executed == executed and not a.poisoned
                   and (not executed or a.run == self.run)]
        return matches[n % len(matches)] if matches else None

    # --- events ------------------------------------------------------------------------------------

    def apply(self, event: Event) -> bool:
        """Apply one event, run the workflow to quiescence, check every invariant."""
        at = self._next_time(event)
        self.wf.clock = self.now = at
        applied = self._apply(event)
        if applied:
            self.step += 1
            self.times.append(at)
            self.exists_history.append(self.oracle.exists)
            self.events.append(event)
            self._cover(f"op.{event.op.value}")
            self._activate()
            self._check()
        return applied

    def _apply(self, e: Event) -> bool:
        op = e.op
        if op in (Op.MUTATE, Op.DELETE, Op.RECREATE):
            if (op == Op.MUTATE and not self.oracle.exists) or (op == Op.DELETE and not self.oracle.exists) \
                    or (op == Op.RECREATE and self.oracle.exists):
                return False
            tokens = e.fault.split("+")
            if op == Op.DELETE:
                self.oracle.delete()
            else:
                self.oracle.mutate(unsafe="unsafe" in tokens)
            self.last_change_step = self.step + 1
            self._notify(e.n, "same_id" in tokens)
            return True
        if op == Op.DELIVER:
            if not self.queue:
                return False
            msg = self.queue.pop(e.n % len(self.queue))
            if msg.kind == "session_changed":
                self._signal(Signal.SESSION_CHANGED, msg.generation)
            elif msg.kind == "read_reported":
                assert msg.report is not None
                if msg.notification_id is not None and msg.notification_id in self.wf.program.seen_ids:
                    self.duplicate_deliveries += 1
                self._cover("ingress.report_delivered")
                cycle = msg.report.cycle
                if self.chain_running and cycle.accept is not None and cycle.ticket.ordinal < \
                        self.wf.fence.s.last_accepted_ordinal and cycle.accept.verdict in (V.ACCEPTED, V.UNCHANGED):
                    # A report older than a verdict the run already holds: ``fence.accepted_digest`` keeps
                    # the newer digest.
                    self._cover("ingress.report_older_than_view")
                self._signal(Signal.READ_REPORTED, msg.report)
            else:
                if msg.notification_id is not None and msg.notification_id in self.wf.program.seen_ids:
                    self.duplicate_deliveries += 1
                self._signal(Signal.UPDATED, ResourceUpdated(uri=msg.uri, session_generation=msg.generation,
                                                        notification_id=msg.notification_id,
                                                        sequence=msg.sequence))
            return True
        if op == Op.OLD_NOTE:
            live = self.host.generation
            if live < 2:
                return False
            self._note_id += 1
            gen = max(1, live - 1 - e.n)
            if (old := self._route(gen, f"old{self._note_id}")) is not None:
                self.queue.append(old)
            return True
        if op == Op.WRONG_URI:
            gen = self.host.live.generation if self.host.live else self.host.generation
            self._note_id += 1
            # No fence row for the variant: nothing stamped. (Production's ingress does not route it to
            # this workflow at all; delivering it exercises resource_updated's WRONG_URI defence.)
            if (wrong := self._route(gen, f"w{self._note_id}", WRONG_URI)) is not None:
                self.queue.append(wrong)
            return True
        if op == Op.FINAL_NOTE:
            gen = self.host.live.generation if self.host.live else self.host.generation
            final = self._route(gen, "final")
            if final is not None:  # else the work is owned already (a read in flight or owed)
                self._signal(Signal.UPDATED, ResourceUpdated(uri=KEY.uri, session_generation=gen), log=False)
            elif self.signals_erased and dirty(self.ledger.row) and not self._work_owned():
                # A reset without reapply erased the signal that owned the row's work: nothing else
                # owns it, and a note on a dirty row creates none. The safety read repays it; the
                # drain delivers the final note as the operator's re-signal would (docs/faults.md).
                self._cover("final_note_after_erased_signals")
                self._signal(Signal.UPDATED, ResourceUpdated(uri=KEY.uri, session_generation=gen), log=False)
            return True
        if op == Op.CLOSE:
            if not self.chain_running:
                return False
            self._signal(Signal.CLOSE_SIGNAL if e.fault == "signal" else Signal.CLOSE, None)
            return True
        if op == Op.EXEC:
            act = self._find(e.act, e.n, executed=False)
            if act is None:
                return False
            self._execute(act, e.fault)
            return True
        if op == Op.COMPLETE:
            act = self._find(e.act, e.n, executed=True)
            if act is None:
                return False
            self.activities.remove(act)
            if act.result is None and act.name in MCP_ACTIVITIES:
                self.wf.fail(act.seq, "ApplicationError")  # retries exhausted: the program sees ActivityFailed
            else:
                self.wf.complete(act.seq, act.result)
            return True
        if op == Op.TIMER:
            kind = self.wf.pending_timer if self.chain_running else ""
            if kind and self.wf.fire_timer():
                self._cover(f"timer.{kind}")
                return True
            return False
        if op == Op.RECONNECT:
            if self.host.live is None:
                return False
            self.host.drop()
            if e.n == 0:
                self.queue.append(Message("session_changed", self.host.open()))
            return True
        if op == Op.SESSION_OPEN:
            if self.host.live is not None:
                return False
            self.queue.append(Message("session_changed", self.host.open()))
            return True
        if op == Op.CAN:
            if not self.chain_running or self.wf.can_suggested:
                return False
            self.wf.suggest_continue_as_new()
            return True
        if op == Op.CHECKPOINT:
            if not self.chain_running:
                return False
            self._checkpoint()
            return True
        if op == Op.RESET:
            if not self.checkpoints:
                return False
            self._reset(self.checkpoints[-1 - e.n % len(self.checkpoints)], reapply=e.fault == "reapply")
            return True
        if op == Op.CATALOG:
            if not self.chain_running:
                return False
            self._scan += 1
            measured = max(0, self.step - e.n)  # a scan measured n steps ago arrives now
            proven = e.fault == "proven"
            self._cover("catalog.proven" if proven else "catalog.unproven")
            self._signal(Signal.CATALOG, CatalogObservation(
                uri=KEY.uri, listed=self.exists_history[measured], scan_id=f"scan{self._scan}",
                snapshot_status="SNAPSHOT_PROVEN" if proven else "SNAPSHOT_UNPROVEN",
                session_generation=self.host.generation, measured_at=self.times[measured]))
            return True
        if op == Op.CONFLICT:
            if not self.chain_running:
                return False
            self._signal(Signal.CONFLICT, IdentityConflict(observed_uri=WRONG_URI, reason="normalizes alike",
                                                      session_generation=self.host.generation))
            return True
        if op == Op.RESUME:
            if not self.chain_running or self.wf.fence.s.state != S.RECONCILIATION_REQUIRED:
                return False
            self._signal(Signal.RESUME, None)
            return True
        if op == Op.FIRST_READ:
            if not self.chain_running:
                return False
            self._signal(Signal.FIRST_READ, None)
            return True
        if op == Op.REVOKE:
            if not self.chain_running:
                return False
            self._signal(Signal.REVOKE, RevokeRequest(reason="simulated platform revocation"))
            return True
        if op == Op.RESTART:
            if self.chain_running:
                return False
            self.wf = self._new_chain()
            return True
        raise ValueError(f"unknown op {op}")

    def _execute(self, act: Activity, fault: str) -> None:
        """Run an activity's side effect now. ``lost``: it took effect but its response is lost, so
        Temporal runs it again later (at-least-once)."""
        if act.ingress is not None:
            self._ingress_step(act, fault)
            return
        name, arg, led = act.name, act.arg, self.ledger
        result: Any
        try:
            if name == Act.ENSURE:
                result = led.ensure_subscription(arg.incarnation)
            elif name == Act.LOAD_FENCE:
                result = led.load_fence()
            elif name == Act.CURRENT_SESSION:
                result = led.current_session()
            elif name == Act.BEGIN_SUBSCRIPTION:
                result = led.begin_subscription(arg.session_generation)
            elif name == Act.MARK_ACTIVE:
                result = led.mark_active(arg.session_generation, arg.subscription_generation,
                                         read_reports=arg.read_reports)
            elif name == Act.BEGIN_UNSUBSCRIBE:
                result = led.begin_unsubscribe()
            elif name == Act.FINISH_UNSUBSCRIBE:
                result = led.finish_unsubscribe(arg.acked)
            elif name == Act.AUDIT:
                result = led.write_audit(arg.kind)
            elif name == Act.SET_STATE:
                result = led.set_state(arg.state, arg.allowed_from)
            elif name == Act.CONFIRM_TOMBSTONE:
                before = led.row.state
                result = led.confirm_tombstone(arg.listed, arg.scan_id, arg.proven)
                if result.state == S.REVOKED and before != S.REVOKED and self.oracle.exists:
                    self._cover("catalog_revoked_existing")  # a late proven word revoked a resource that exists
            elif name == Act.REVOKE:
                result = led.revoke()
            elif name == Act.MCP_UNSUBSCRIBE:
                result = self.host.unsubscribe(arg, ack_lost=fault == "ack_lost")
                if fault == "ack_lost":
                    self._cover("unsubscribe_ack_lost")
            elif name in (Act.MCP_READ_CYCLE, Act.MCP_SUBSCRIBE_CYCLE):
                done, result = (self._read_cycle_step(act, fault) if name == Act.MCP_READ_CYCLE
                                else self._subscribe_cycle_step(act, fault))
                if fault == "lost":
                    act.step = 0  # the attempt died after this step's effect: the retry starts over
                if not done:
                    if fault == "lost":
                        self._cover("lost_response.read_cycle_step")
                    return
            else:
                raise ValueError(f"unknown activity {name}")
        except LedgerIntegrityError as err:
            act.poisoned = True
            self._violate(Invariant.LEDGER_INTEGRITY, f"{name} (retried forever): {err}")
            return
        if fault == "lost":
            self._cover(f"lost_response.{name}")
            return  # the activity stays scheduled: its retry runs the side effect again
        if act.run != self.run:
            self.activities.remove(act)  # an orphan of a reset run: it landed, nobody listens
            self._cover("orphan_landed")
            return
        act.executed, act.result = True, result

    def _subscribe_cycle_step(self, act: Activity, fault: str) -> tuple[bool, Any]:
        """One step of ``McpSessionActivities.subscribe_cycle``: subscribe, mark (``marked_active``
        decides whether to read), then the three steps of the read cycle; (done, result)."""
        req: SubscribeCycleRequest = act.arg
        if act.step == 0:
            out = self.host.subscribe(req.subscribe)
            if not out.ok:
                return True, SubscribeCycleResult(subscribe=out)
            act.step = 1
            return False, None
        ok = SubscribeOutcome(ok=True, session_generation=req.subscribe.session_generation)
        if act.step == 1:
            m = req.mark
            active = self.ledger.mark_active(m.session_generation, m.subscription_generation,
                                             read_reports=m.read_reports)
            if not marked_active(active, session_generation=m.session_generation,
                                 subscription_generation=m.subscription_generation):
                self._cover("start_cycle.not_marked")
                return True, SubscribeCycleResult(subscribe=ok, active=active)
            act.active, act.step = active, SUBSCRIBE_CYCLE_READ
            return False, None
        done, cycle = self._read_cycle_step(act, fault, req.read, base=SUBSCRIBE_CYCLE_READ)
        if not done:
            return False, None
        if cycle is None:
            return True, None  # retries exhausted: the program sees ActivityFailed
        self._cover("start_cycle")
        return True, SubscribeCycleResult(subscribe=ok, active=act.active, cycle=cycle)

    def _read_cycle_step(self, act: Activity, fault: str, req: ReadCycleRequest | None = None, *,
                         base: int = 0) -> tuple[bool, Any]:
        """One step of ``McpSessionActivities.read_cycle`` (the same calls, in the same order);
        (done, result). Other events may run between the steps, as between its awaits. ``req`` and
        ``base``: the read cycle inside a start (``_subscribe_cycle_step``), from its step ``base``."""
        req = req if req is not None else act.arg
        assert isinstance(req, ReadCycleRequest)
        led = self.ledger
        step = act.step - base
        if step == 0:
            cycle_id = f"ingress/a{act.aid}" if act.ingress is not None else f"run{act.run}/a{act.aid}"
            granted = led.allocate_read(req.allocate.model_copy(update={"cycle_id": cycle_id}))
            if not granted.granted:
                return True, ReadCycleResult(ticket=granted, fence=led.load_fence())
            act.ticket, act.step = granted, base + 1
            return False, None
        ticket = act.ticket
        assert ticket is not None
        if step == 1:
            a = req.allocate
            outcome = self.host.read(ReadRequest(key=a.key, session_generation=a.session_generation,
                                                 subscription_generation=a.subscription_generation,
                                                 ordinal=ticket.ordinal, request_id=ticket.request_id,
                                                 trigger=a.trigger), self.oracle, fault=fault)
            if outcome is None:
                return True, None  # retries exhausted: the program sees ActivityFailed
            if outcome.kind == ReadOutcomeKind.SESSION_LOST:
                return True, ReadCycleResult(ticket=ticket, outcome=outcome)
            act.outcome, act.step = outcome, base + 2
            return False, None
        assert act.outcome is not None
        absorbed = act.ingress.absorbed if act.ingress is not None else 0
        result = led.accept(AcceptRequest(outcome=act.outcome, expected_state=req.expected_state, absorbed=absorbed,
                                          close_epoch=req.close_epoch))
        self._cover("read_cycle")
        self._cover(f"verdict.{result.verdict.value}")
        return True, ReadCycleResult(ticket=ticket, outcome=act.outcome, accept=result)

    def _checkpoint(self) -> None:
        wf = self.wf
        self.checkpoints.append(Checkpoint(wf, len(wf.log), len(wf.draws), len(self.signal_log)))
        if len(self.checkpoints) > 8:
            self.checkpoints.pop(0)

    def _reset(self, cp: Checkpoint, *, reapply: bool) -> None:
        """Temporal reset: the current run ends (its started activities may still land), a new run
        replays to the checkpoint, then reschedules the activities pending there."""
        self._cover("reset")
        self.run += 1
        # A reset run replays history to the reset point, then draws with a new random seed; the
        # activities pending there are scheduled again (as its ``commands``).
        wf = ProgramRun.replayed(cp.run, cp.inputs, cp.draws, f"c{self.chain}r{self.run}")
        wf.clock = self.times[self.step]
        later = self.signal_log[cp.signal_index:]
        del self.signal_log[cp.signal_index:]
        self.wf = wf
        # Activities of older runs not yet started are dropped by the matching service.
        # The ingress's reads are no run's: they go on.
        self.activities = [a for a in self.activities
                           if (a.run == self.run - 1 and not a.executed) or a.ingress is not None]
        if later and not reapply:
            self.signals_erased = True
        if reapply:
            self._cover("reset_reapply")
            for kind, payload in later:
                self._signal(kind, payload)

    # --- invariants -----------------------------------------------------------------------------------

    def _check(self) -> None:
        row = self.ledger.row
        prev = self._prev
        committed = self.oracle.committed
        if prev.exists:
            if row.last_accepted_ordinal < prev.last_accepted_ordinal or row.watermark < prev.watermark:
                self._violate(Invariant.VERSION_REGRESSION,
                              f"durable lastAccepted/watermark {prev.last_accepted_ordinal}/{prev.watermark} -> "
                              f"{row.last_accepted_ordinal}/{row.watermark}")
            if row.last_issued_ordinal < prev.last_issued_ordinal:
                self._violate(Invariant.ORDINAL_ORDER, f"lastIssued {prev.last_issued_ordinal} -> "
                                                       f"{row.last_issued_ordinal}")
        if row.exists and (row.last_accepted_ordinal > row.last_issued_ordinal
                           or row.watermark > row.last_issued_ordinal):
            self._violate(Invariant.LEDGER_INTEGRITY, "CHECK lastAccepted/watermark <= lastIssued")
        if row.last_accepted_digest is not None and row.last_accepted_digest not in committed:
            self._violate(Invariant.UNCOMMITTED_DIGEST, f"row digest {row.last_accepted_digest[:20]}")
        self._prev = row
        log = self.ledger.log
        for w in log[self._log_seen:]:
            self._check_write(w)
        self._log_seen = len(log)
        self._check_clean()
        self._check_read_deadline()
        if self._converged():
            if self.converged_since is None:
                self.converged_since = self.step
        else:
            self.converged_since = None

    def _check_read_deadline(self) -> None:
        """STALENESS_BOUND: an idle ACTIVE subscription on a live session, with a published bound
        (the poll interval, or the safety re-read period), must have armed its next wake-up no
        later than one bound after the last read the ledger allocated. Observed from outside:
        the ledger's allocation time and the timer the workflow armed, not the fence's deadline."""
        wf = self.wf
        if not self.chain_running or wf.main_wait != WaitKind.IDLE or self._last_allocated_at is None:
            return
        s = wf.fence.s
        if s.state != S.ACTIVE or wf.program.session is None or s.close_requested or s.pending_trigger is not None \
                or s.in_flight or wf.program.reads_running:
            return  # a read (or resubscribe) is already on its way, or no read is possible
        bound = s.staleness_bound_seconds if s.staleness_bound_seconds is not None \
            else self.profile.safety_read_seconds
        if not bound:
            return
        promised = self._last_allocated_at + timedelta(seconds=bound)
        wake = wf.timer_at
        if (wake is None or wake > promised) and wake not in self._late_timers:
            self._late_timers.add(wake)
            late = "never" if wake is None else f"at +{(wake - self._last_allocated_at).total_seconds():.1f} s"
            self._violate(Invariant.STALENESS_BOUND,
                          f"last read allocated {self._last_allocated_at:%H:%M:%S}, bound {bound:.0f} s, "
                          f"next wake-up {late}")

    def _check_write(self, w: LedgerWrite) -> None:
        if w.kind == "allocate":
            self._last_allocated_at = self.times[self.step]
            if w.ordinal <= self._max_allocated:
                self._violate(Invariant.ORDINAL_ORDER, f"allocated {w.ordinal} after {self._max_allocated}")
            self._max_allocated = max(self._max_allocated, w.ordinal)
            return
        if w.kind == "close":
            self._close_fences.append(w.ordinal)
            self._cover("close_fenced")
            return
        if w.kind == "tombstone":
            if w.before.state != S.TOMBSTONE_PENDING:
                self._violate(Invariant.NOT_ACTIVE_WRITE, f"tombstone confirmed from {w.before.state}")
            return
        if w.kind == "revoke":
            self._cover(f"revoked_from.{w.before.state}")
            if w.before.state in ENDED:
                self._violate(Invariant.NOT_ACTIVE_WRITE, f"revocation outbox row from {w.before.state}")
            return
        if w.kind != "accept":
            return
        o, j, before = w.outcome, w.judgement, w.before
        assert o is not None and j is not None
        if o.kind in (ReadOutcomeKind.CONTENT, ReadOutcomeKind.NOT_FOUND) and o.server_version.startswith("v"):
            served_version = int(o.server_version[1:])
            if self.count_reads and o.trigger in (TriggerReason.UPDATED, TriggerReason.FOLLOW_UP):
                self.notification_reads += 1
                self.fresh_reads += served_version not in self.observed
            self.observed.add(served_version)
        status = w.receipt.status if w.receipt else None
        invalidation = w.outbox if w.outbox is not None and w.outbox.event_type in INVALIDATIONS else None
        version_write = (status in (V.ACCEPTED, V.UNCHANGED, V.TOMBSTONE_PENDING, V.GUARDRAIL_REJECTED)
                         or w.outbox is not None)
        fence = max(self._close_fences, default=0)
        fenced = bool(self._close_fences) and o.ordinal <= fence
        if version_write:
            issued = w.issued
            if (before.state != S.ACTIVE or o.session_generation != before.session_generation
                    or o.subscription_generation != before.subscription_generation or issued is None
                    or issued.session_generation != o.session_generation
                    or issued.subscription_generation != o.subscription_generation):
                self._violate(Invariant.NOT_ACTIVE_WRITE,
                              f"{status} ordinal {o.ordinal} while row {before.state} gen "
                              f"{before.session_generation}/{before.subscription_generation}, read gen "
                              f"{o.session_generation}/{o.subscription_generation}")
        if status == V.TOMBSTONE_PENDING and fenced:
            self._violate(Invariant.LATE_TOMBSTONE, f"ordinal {o.ordinal} <= close ordinal {fence}")
        if invalidation is not None:
            if before.state in CLOSING or before.state in ENDED or fenced:
                self._violate(Invariant.OUTBOX_AFTER_CLOSE, f"outbox ordinal {o.ordinal} (row {before.state}, "
                                                            f"close ordinal {fence})")
            if invalidation.ordinal <= self._max_outbox_ordinal:
                self._violate(Invariant.ORDINAL_ORDER, f"outbox ordinal {invalidation.ordinal} after "
                                                       f"{self._max_outbox_ordinal}")
            self._max_outbox_ordinal = max(self._max_outbox_ordinal, invalidation.ordinal)
        if status in (V.ACCEPTED, V.UNCHANGED) and (o.content_digest is None
                                                    or o.content_digest not in self.oracle.committed):
            self._violate(Invariant.UNCOMMITTED_DIGEST, f"{status} digest {o.content_digest} never committed")
        if w.after.last_accepted_ordinal != before.last_accepted_ordinal or status in (V.ACCEPTED, V.UNCHANGED):
            served = int(o.server_version[1:]) if o.server_version.startswith("v") else 0
            if served < self._accepted_version:
                self._violate(Invariant.VERSION_REGRESSION,
                              f"{status} ordinal {o.ordinal} serves oracle v{served} over accepted "
                              f"v{self._accepted_version}")
            self._accepted_version = max(self._accepted_version, served)

    def _converged(self) -> bool:
        row = self.ledger.row
        if not row.exists:
            return False
        if self.oracle.exists:
            if row.state != S.ACTIVE:
                return False
            if self.oracle.version in self.oracle.unsafe:  # not releasable: the fence must have read it
                return self._accepted_version == self.oracle.version
            return row.last_accepted_digest == self.oracle.digest
        return row.state in (S.TOMBSTONE_PENDING, S.TOMBSTONED)

    # --- drain and verdict -------------------------------------------------------------------------------

    def _flush(self) -> bool:
        """Deliver everything pending in FIFO order, no faults. False if it would not quiesce."""
        for _ in range(FLUSH_BUDGET):
            if self.queue:
                self.apply(Event(Op.DELIVER))
                continue
            # The current run first; activities of a reset run land last, as a slow old worker would.
            runnable = [a for a in self.activities if not a.executed and not a.poisoned]
            current = [a for a in runnable if a.run == self.run or a.ingress is not None]
            if current:
                self.apply(Event(Op.EXEC, act=current[0].name, n=self._index_of(current[0], executed=False)))
                continue
            done = [a for a in self.activities if a.executed and a.run == self.run]
            if done:
                self.apply(Event(Op.COMPLETE, act=done[0].name, n=self._index_of(done[0], executed=True)))
                continue
            if runnable:
                self.apply(Event(Op.EXEC, act=runnable[0].name, n=self._index_of(runnable[0], executed=False)))
                continue
            return True
        return False

    def _index_of(self, act: Activity, *, executed: bool) -> int:
        same = [a for a in self.activities if a.name == act.name and a.executed == executed and not a.poisoned
                and (not executed or a.run == self.run)]
        return same.index(act)

    def drain(self) -> None:
        """Quiet end: the session host is up, every message and activity completes, timers fire,
        pending catalog/resume words arrive, then one final invalidation; to quiescence."""
        if self.host.live is None:
            self.apply(Event(Op.SESSION_OPEN))
        final_sent = False
        for attempt in range(8):
            if not self._flush():
                self._violate(Invariant.NO_CONVERGENCE, "drain did not quiesce")
                return
            if attempt == 0:
                self._check_covered()
            wf = self.wf
            if not self.chain_running:
                break
            state = wf.fence.s.state
            if wf.pending_timer and (wf.main_wait == WaitKind.SESSION or not final_sent):  # poll / safety / recheck
                self.apply(Event(Op.TIMER))
                continue
            if state == S.TOMBSTONE_PENDING and wf.program.catalog is None:
                self.apply(Event(Op.CATALOG))
                continue
            if state == S.RECONCILIATION_REQUIRED and wf.program.resume_requested is None:
                self.apply(Event(Op.RESUME))
                continue
            if not final_sent:
                final_sent = True
                self.count_reads = False
                self.apply(Event(Op.FINAL_NOTE))
                continue
            break
        self._verdict()

    def _work_owned(self) -> bool:
        """Someone will read KEY without a new notification: the workflow has a read pending or in
        flight, or a signal or report is on its way to it, or the ingress is processing the key."""
        s = self.wf.fence.s
        return bool(s.pending_trigger is not None or s.in_flight or self._ingress_routing or self._ingress_queued
                    or any(m.kind in ("updated", "read_reported") for m in self.queue))

    def _check_clean(self) -> None:
        """Every step: a clean ACTIVE row (``notified == covered``) says the read that set ``covered`` was
        allocated after every note it counts was recorded, so an accepted read served the newest change
        any of them announced (``COVERED_UNREAD`` otherwise)."""
        row = self.ledger.row
        if not row.exists or row.state != S.ACTIVE or dirty(row) or "covered_unread" in self._clean_flagged:
            return
        noted = max((c for n, c in self._noted_change.items() if n <= row.covered), default=0)
        if noted > self._accepted_version:
            self._clean_flagged.add("covered_unread")
            self._violate(Invariant.COVERED_UNREAD,
                          f"the row is clean (notified = covered = {row.covered}) but a note announced oracle "
                          f"v{noted} and the newest read accepted served v{self._accepted_version}")

    def _check_covered(self) -> None:
        """Everything delivered and completed, no timer fired yet, the subscription ACTIVE and idle:
        the row's work must be owned (``workflows/coverage.py``).
        Dirty with notes recorded after the newest allocation, or the newest allocation the ingress's
          (it hands over what it leaves dirty): work nobody owns was lost. (The workflow's own read
          that observed nothing, with no later note, is the failed-read contract: no automatic retry.)"""
        wf, row = self.wf, self.ledger.row
        s = wf.fence.s
        if (not self.chain_running or wf.main_wait != WaitKind.IDLE or row.state != S.ACTIVE or s.state != S.ACTIVE
                or self._work_owned()):
            return
        if dirty(row) and (row.notifications_seen > row.allocated_sequence or row.last_issued_ordinal in self._ingress_ordinals) \
                and not self.signals_erased:
            self._violate(Invariant.COVERED_UNREAD,
                          f"the row is dirty (notified {row.notifications_seen} > covered {row.covered}, newest "
                          f"allocation at {row.allocated_sequence}) and nobody owns the work")

    def _verdict(self) -> None:
        wf, row = self.wf, self.ledger.row
        if wf.stage == RunStage.WEDGED:
            return  # already reported as a livelock or workflow error
        if row.state in ENDED or wf.fence.finished:
            if wf.stage != RunStage.DONE:
                self._violate(Invariant.NO_CONVERGENCE, f"row {row.state}, workflow stuck waiting for "
                                                        f"{wf.main_wait} (read tasks {wf.program.reads_running}, "
                                                        f"close updates {wf.handlers_running(Signal.CLOSE)}, resume "
                                                        f"updates {wf.handlers_running(Signal.RESUME)})")
            return
        if wf.fence.s.close_requested or wf.handlers_running(Signal.CLOSE):
            # A close the run took (or an update still waiting) must finish the chain by the quiet end,
            # whatever the content: a close stuck behind a wait (F9) leaves an ACTIVE, converged row.
            self._violate(Invariant.NO_CONVERGENCE, f"close requested, row {row.state}, workflow {wf.stage.value} "
                                                    f"waiting for {wf.main_wait}")
            return
        if not self._converged():
            self._violate(Invariant.NO_CONVERGENCE,
                          f"row {row.state} digest {str(row.last_accepted_digest)[:16]} vs oracle "
                          f"v{self.oracle.version} {str(self.oracle.digest)[:16]}; workflow {wf.stage.value} "
                          f"waiting for {wf.main_wait} "
                          f"state {wf.fence.s.state} in_flight {wf.fence.s.in_flight}")
            return
        if wf.fence.s.state != row.state:
            self._violate(Invariant.NO_CONVERGENCE, f"workflow believes {wf.fence.s.state}, ledger says {row.state}")
            return
        if wf.handlers_running(Signal.FIRST_READ):
            # Converged means a read was judged (or none will come): the update must have answered.
            self._violate(Invariant.NO_CONVERGENCE, f"first_read update still waiting in {wf.fence.s.state}")

    def result(self) -> ScheduleResult:
        converged_after = None
        row = self.ledger.row
        if not self.violations and row.state not in ENDED and self.converged_since is not None:
            converged_after = max(0, self.converged_since - self.last_change_step)
        return ScheduleResult(seed=self.seed, profile=self.profile, events=list(self.events),
                              violations=list(self.violations), steps=self.step, converged_after=converged_after,
                              notification_reads=self.notification_reads, fresh_reads=self.fresh_reads,
                              duplicate_deliveries=self.duplicate_deliveries,
                              covered_updates=self.covered_reads_saved, coverage=dict(self.coverage),
                              read_on_notification=self.config.read_on_notification)


# --- schedule generation ----------------------------------------------------------------------------------


def _profile(rng: random.Random, faults: frozenset[Fault]) -> Profile:
    capability = "subscribe"
    if Fault.POLLING in faults:
        capability = rng.choices(["subscribe", "none", "rejects"], [75, 15, 10])[0]
    reads = 1
    if Fault.CONCURRENT_READS in faults and rng.random() < 0.2:
        reads = rng.choice([2, 3])
    session_at_start = rng.random() < 0.9
    safety = 0.0 if rng.random() < 0.25 else 300.0  # some servers run with the safety re-read disabled
    return Profile(capability=capability, max_concurrent_reads=reads, session_at_start=session_at_start,
                   safety_read_seconds=safety)


def _next_event(rng: random.Random, sim: Simulation, faults: frozenset[Fault]) -> Event:
    """Pick one enabled event, weighted; every random choice is recorded in the Event."""
    F = faults
    wf = sim.wf
    options: list[tuple[float, Callable[[], Event]]] = []

    def add(weight: float, make: Callable[[], Event]) -> None:
        options.append((weight, make))

    def copies() -> int:
        if Fault.DROP in F and rng.random() < 0.15:
            return 0
        if Fault.DUPLICATE in F and rng.random() < 0.2:
            return rng.choice([2, 3])
        return 1

    def change(op: Op) -> Event:
        n = copies()
        tokens = []
        if n > 1 and rng.random() < 0.5:
            tokens.append("same_id")
        if op != Op.DELETE and Fault.GUARDRAIL in F and rng.random() < 0.08:
            tokens.append("unsafe")
        return Event(op, n=n, fault="+".join(tokens))

    scheduled = [a for a in sim.activities if not a.executed and not a.poisoned]
    executed = [a for a in sim.activities if a.executed and a.run == sim.run]

    def reads(a: Activity) -> bool:  # the step that sends resources/read
        return (a.name in (Act.MCP_READ_CYCLE, INGRESS_READ) and a.step == 1) \
            or (a.name == Act.MCP_SUBSCRIBE_CYCLE and a.step == SUBSCRIBE_CYCLE_READ + 1)

    def exec_event() -> Event:
        a = rng.choice(scheduled)
        fault = ""
        if a.name == Act.MCP_UNSUBSCRIBE and Fault.LOST_ACK in F and rng.random() < 0.3:
            fault = "ack_lost"
        elif reads(a) and Fault.READ_FAILURE in F and rng.random() < 0.05:
            fault = rng.choice(["error", "malformed"])
        elif reads(a) and Fault.REVOKE in F and rng.random() < 0.01:
            fault = "denied"
        elif Fault.RETRY in F and rng.random() < 0.05:
            fault = "lost"
        return Event(Op.EXEC, n=sim._index_of(a, executed=False), act=a.name, fault=fault)

    def complete_event() -> Event:
        a = rng.choice(executed)
        return Event(Op.COMPLETE, n=sim._index_of(a, executed=True), act=a.name)

    def deliver_event() -> Event:
        n = 0
        if Fault.REORDER in F and len(sim.queue) > 1 and rng.random() < 0.4:
            n = rng.randrange(1, len(sim.queue))
        return Event(Op.DELIVER, n=n)

    if scheduled:
        add(30, exec_event)
    if executed:
        add(30, complete_event)
    if sim.queue:
        add(18, deliver_event)
    if sim.oracle.exists:
        add(9, lambda: change(Op.MUTATE))
        if Fault.DELETE in F:
            add(1.2, lambda: change(Op.DELETE))
    elif Fault.DELETE in F:
        add(3, lambda: change(Op.RECREATE))
    running = sim.chain_running
    timer = wf.pending_timer if running else ""
    if timer:
        # Poll (30 s) and session recheck (<= 15 s) timers fire often; the safety re-read (300 s) rarely.
        add(0.4 if timer in ("safety", "reconcile") else 4, lambda: Event(Op.TIMER))
    if Fault.OLD_SESSION in F and sim.host.generation >= 2:
        add(0.6, lambda: Event(Op.OLD_NOTE, n=rng.randrange(2)))
    if Fault.WRONG_URI in F:
        add(0.3, lambda: Event(Op.WRONG_URI))
    if Fault.CLOSE in F and running and not wf.fence.s.close_requested:
        add(0.7, lambda: Event(Op.CLOSE, fault="signal" if rng.random() < 0.3 else ""))
    if Fault.SESSION_LOSS in F:
        if sim.host.live is not None:
            add(1, lambda: Event(Op.RECONNECT, n=int(rng.random() < 0.3)))
        else:
            add(6, lambda: Event(Op.SESSION_OPEN))
    elif sim.host.live is None:
        add(6, lambda: Event(Op.SESSION_OPEN))
    if Fault.CONTINUE_AS_NEW in F and running and not wf.can_suggested:
        add(1, lambda: Event(Op.CAN))
    if Fault.RESET in F:
        if running:
            add(1.5, lambda: Event(Op.CHECKPOINT))
        if sim.checkpoints:
            add(1.5, lambda: Event(Op.RESET, n=rng.randrange(len(sim.checkpoints)),
                                 fault="reapply" if rng.random() < 0.5 else ""))
    def catalog_event() -> Event:
        lag = rng.choice([0, 0, 1, 3, 8])  # the scan was measured this many steps before it arrives
        return Event(Op.CATALOG, n=lag, fault="proven" if rng.random() < 0.5 else "")

    if Fault.CATALOG in F and running:
        add(3 if wf.fence.s.state == S.TOMBSTONE_PENDING else 0.3, catalog_event)
    if Fault.CONFLICT in F and running:
        add(0.2, lambda: Event(Op.CONFLICT))
        if wf.fence.s.state == S.RECONCILIATION_REQUIRED:
            add(3, lambda: Event(Op.RESUME))
    if Fault.REVOKE in F and running:
        add(0.2, lambda: Event(Op.REVOKE))
    if Fault.RESTART in F and not running:
        add(2, lambda: Event(Op.RESTART))
    total = sum(w for w, _ in options)
    pick = rng.random() * total
    for weight, make in options:
        pick -= weight
        if pick <= 0:
            return make()
    return options[-1][1]()


def run_schedule(seed: str, config: SimConfig = SimConfig()) -> ScheduleResult:
    """Generate one schedule from ``seed`` online (each event chosen from what is enabled now),
    run it, drain it, judge it."""
    rng = random.Random(seed)
    profile = _profile(rng, config.faults)
    sim = Simulation(seed, profile, config)
    low = 10
    length = rng.randint(low, max(low, 2 * config.mean_events - low))
    for _ in range(length):
        sim.apply(_next_event(rng, sim, config.faults))
    generated = list(sim.events)
    sim.drain()
    result = sim.result()
    result.events = generated  # the drain is re-derived on replay
    return result


def replay(trace: Trace, config: SimConfig = SimConfig()) -> ScheduleResult:
    """Re-run a trace's events (inapplicable ones are skipped), then the same drain, with the
    session host's setting the trace ran with."""
    config = replace(config, read_on_notification=config.read_on_notification and trace.read_on_notification)
    sim = Simulation(trace.seed, trace.profile, config)
    for event in trace.events:
        sim.apply(event)
    generated = list(sim.events)
    sim.drain()
    result = sim.result()
    result.events = generated
    return result


def delta_debug(events: Sequence[Event], accept: Callable[[list[Event]], list[Event] | None],
                budget: int) -> list[Event]:
    """Delta-debugging (ddmin): drop chunks of ``events`` while ``accept`` keeps the candidate, until
    the list is 1-minimal or ``budget`` calls of ``accept`` are spent. ``accept`` answers the events to
    go on from (the candidate, or what replaying it kept) or None for a candidate that lost the property."""
    left = budget
    current = list(events)
    chunks = 2
    while len(current) >= 2 and left > 0:
        size = max(1, len(current) // chunks)
        reduced = False
        for start in range(0, len(current), size):
            if left <= 0:
                break
            left -= 1
            kept = accept(current[:start] + current[start + size:])
            if kept is not None:
                current, reduced = list(kept), True
                chunks = max(chunks - 1, 2)
                break
        if not reduced:
            if size == 1:
                break
            chunks = min(len(current), chunks * 2)
    return current


def shrink(result: ScheduleResult, config: SimConfig = SimConfig(), *,
           target: Invariant | None = None) -> ScheduleResult:
    """Delta-debugging: the shortest event list (1-minimal within the budget) that still
    violates ``target`` (default: the first violated invariant)."""
    target = target or result.violations[0].invariant
    best = [result]

    def fails(events: list[Event]) -> list[Event] | None:
        r = replay(Trace(result.seed, result.profile, tuple(events)), config)
        if not any(v.invariant == target for v in r.violations):
            return None
        best[0] = r
        return list(r.events)

    delta_debug(result.events, fails, config.shrink_budget)
    return best[0]


# --- many schedules --------------------------------------------------------------------------------------


def _percentile(sorted_values: Sequence[int], q: float) -> int:
    if not sorted_values:
        return 0
    idx = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[idx]


@dataclass(slots=True)
class Summary:
    """Aggregate of a run of schedules; ``merge_summaries`` combines disjoint index ranges."""

    seed: str
    schedules: int = 0
    events: int = 0
    steps: int = 0
    violations: dict[str, int] = field(default_factory=lambda: {i.value: 0 for i in Invariant})
    failing_schedules: int = 0
    failing_indices: list[int] = field(default_factory=list)  # the first few, in index order
    failures: list[dict[str, Any]] = field(default_factory=list)  # shrunk traces (``shrink_failures``)
    notification_reads: int = 0
    fresh_reads: int = 0
    duplicate_deliveries: int = 0
    covered_updates: int = 0
    convergence: list[int] = field(default_factory=list)
    coverage: dict[str, int] = field(default_factory=dict)


def run_schedules(seed: int | str, start: int, stop: int, config: SimConfig = SimConfig(), *,
                  keep_failures: int = 3) -> Summary:
    """Schedules ``start``..``stop-1`` of ``seed``; failures are recorded by index (``shrink_failures``
    turns the first few into minimal traces once, after merging)."""
    summary = Summary(seed=str(seed))
    for index in range(start, stop):
        r = run_schedule(schedule_seed(seed, index), config)
        summary.schedules += 1
        summary.events += len(r.events)
        summary.steps += r.steps
        summary.notification_reads += r.notification_reads
        summary.fresh_reads += r.fresh_reads
        summary.duplicate_deliveries += r.duplicate_deliveries
        summary.covered_updates += r.covered_updates
        for name, count in r.coverage.items():
            summary.coverage[name] = summary.coverage.get(name, 0) + count
        if r.converged_after is not None:
            summary.convergence.append(r.converged_after)
        if r.failed:
            summary.failing_schedules += 1
            for inv in {v.invariant for v in r.violations}:
                summary.violations[inv.value] += 1
            if len(summary.failing_indices) < keep_failures:
                summary.failing_indices.append(index)
    return summary


def worker_count(requested: int, schedules: int) -> int:
    """Processes for ``schedules`` schedules: ``requested`` (0: one per CPU), at most one per schedule."""
    return max(1, min(requested or os.cpu_count() or 1, schedules))


def run_schedules_in_processes(seed: int | str, start: int, stop: int, config: SimConfig = SimConfig(), *,
                               workers: int = 0, keep_failures: int = 3) -> Summary:
    """``run_schedules`` over ``workers`` processes (0: one per CPU), merged: the same summary as one
    process gives. Four chunks per worker, so a chunk of long schedules does not leave the others
    idle. Processes are spawned, not forked: the caller may hold threads (a Temporal runtime, a
    test session's servers) whose locks a forked child would inherit. ``config`` is pickled: its
    seams must be module-level functions."""
    n = stop - start
    workers = worker_count(workers, n)
    if workers == 1:
        return run_schedules(seed, start, stop, config, keep_failures=keep_failures)
    bounds = [start + n * i // (workers * 4) for i in range(workers * 4 + 1)]
    chunks = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = list(pool.map(run_schedules, [seed] * len(chunks), [a for a, _ in chunks], [b for _, b in chunks],
                              [config] * len(chunks)))
    return merge_summaries(parts, keep_failures=keep_failures)


def shrink_failures(summary: Summary, config: SimConfig = SimConfig(), *, limit: int = 3) -> Summary:
    """Replay and shrink the first ``limit`` failing schedules into ``summary.failures``."""
    summary.failures = []
    for index in summary.failing_indices[:limit]:
        r = run_schedule(schedule_seed(summary.seed, index), config)
        shrunk = shrink(r, config)
        summary.failures.append({"index": index, "original_events": len(r.events),
                                 "trace": shrunk.trace().to_json()})
    return summary


def merge_summaries(parts: Sequence[Summary], *, keep_failures: int = 3) -> Summary:
    out = Summary(seed=parts[0].seed if parts else "")
    for p in parts:
        out.schedules += p.schedules
        out.events += p.events
        out.steps += p.steps
        out.failing_schedules += p.failing_schedules
        out.notification_reads += p.notification_reads
        out.fresh_reads += p.fresh_reads
        out.duplicate_deliveries += p.duplicate_deliveries
        out.covered_updates += p.covered_updates
        out.convergence.extend(p.convergence)
        for k, v in p.violations.items():
            out.violations[k] = out.violations.get(k, 0) + v
        for k, v in p.coverage.items():
            out.coverage[k] = out.coverage.get(k, 0) + v
        out.failing_indices.extend(p.failing_indices)
    out.failing_indices = sorted(out.failing_indices)[:keep_failures]
    return out


def summary_json(s: Summary, config: SimConfig = SimConfig()) -> dict[str, Any]:
    conv = sorted(s.convergence)
    return {
        "seed": s.seed,
        "schedules": s.schedules,
        "events": s.events,
        "steps": s.steps,
        "faults": sorted(f.value for f in config.faults),
        "violations": dict(sorted(s.violations.items())),
        "violations_total": sum(s.violations.values()),
        "failing_schedules": s.failing_schedules,
        "read_amplification": {
            "reads_per_distinct_change": round(s.notification_reads / s.fresh_reads, 4) if s.fresh_reads else 0.0,
            "notification_reads": s.notification_reads,
            "reads_that_saw_a_new_version": s.fresh_reads,
            "duplicate_deliveries_deduped": s.duplicate_deliveries,
            "updates_covered_without_a_read": s.covered_updates,
            "read_on_notification": config.read_on_notification,
        },
        "convergence_steps": {"schedules": len(conv), "p50": _percentile(conv, 0.5), "p99": _percentile(conv, 0.99),
                              "p999": _percentile(conv, 0.999), "max": conv[-1] if conv else 0},
        "coverage": dict(sorted(s.coverage.items())),
        "failures": s.failures,
    }
