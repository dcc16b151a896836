"""The subscription state machine: everything one run knows, as plain deterministic Python.

Contract:
- ``SubscriptionFence`` holds all state of one subscription in one serializable model
  (``FenceState``) and changes it only through the methods below. No I/O, no clock, no
  randomness: the workflow passes times in, a simulator can drive it without Temporal.
- The durable fence in PostgreSQL is authoritative. Every method that follows a ledger answer
  (``adopt``, ``issued``, ``applied``, ``closing``) takes the larger of its own and the ledger's
  ordinals/generations, so state that was rewound by a workflow reset catches up instead of
  reusing an ordinal.
- Main states: DISCOVERED → SUBSCRIBING → ACTIVE → UNSUBSCRIBING → CLOSED | UNSUBSCRIBE_UNKNOWN;
  ACTIVE → TOMBSTONE_PENDING; anything with an unknown identity → RECONCILIATION_REQUIRED. While
  ACTIVE the *phase* shows the read cycle: UPDATE_SEEN (an invalidation waits), READ_PENDING (a
  read is in flight).
- An update signal is a wake-up (``note_update``): a read when idle, at most one FOLLOW_UP while
  reads are in flight. Coverage is the ledger row's level (``mcpsync.workflows.coverage``): a judged
  read owes a FOLLOW_UP iff ``coverage.follow_up_owed`` says so; the run keeps no coverage counters.
- Finished is final: a late verdict or a lagging ledger snapshot never moves a fence out
  of a terminal state; a closing one never reopens.
- Deadlines, not restarted timers: the next poll (no subscribe) or safety re-read (with
  subscribe) is an absolute time, ``read_due_at``, armed when a read is allocated and moved only
  by the next allocation (or a change of the poll period, ``read_deadline.poll_period``, which is
  published as the staleness bound), never later by a wake-up, so the published bound holds under
  any interleaving. The jitter only ever makes it earlier (``read_deadline.jittered``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field

from mcpsync.workflows.coverage import follow_up_owed
from mcpsync.workflows.read_deadline import FAILED_READS, dispatch_margin, jittered, poll_period
from mcpsync.workflows.records.ledger import AcceptResult, AcceptVerdict, FenceSnapshot, ReadTicket
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import CLOSING_STATES as CLOSING
from mcpsync.workflows.records.subscription import (
    MAX_HISTORY_EVENTS,
    CacheScope,
    CloseReceipt,
    ResourceUpdated,
    StalenessBoundSource,
    SubscriptionKey,
    SubscriptionState,
    TriggerReason,
)
from mcpsync.workflows.records.subscription import TERMINAL_STATES as TERMINAL
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1

__all__ = ["should_continue_as_new", "FenceState", "SubscriptionFence", "UpdateDisposition"]

S = SubscriptionState
V = AcceptVerdict
# Read once: on Python 3.11 an ``Enum`` class attribute goes through the metaclass's ``__getattr__`` hook
# (about ten times a plain attribute), and the wait conditions (``until_read_due``, ``read_wanted``),
# ``phase`` and a judged read's bookkeeping (``applied``, ``observed``) run on every activation or read
# (``_ACTIVE`` is used throughout the module).
_ACTIVE = S.ACTIVE
_MOVES_VERSION = frozenset({V.ACCEPTED, V.UNCHANGED, V.TOMBSTONE_PENDING})  # receipt and watermark move
_SAW_CONTENT = frozenset({V.ACCEPTED, V.UNCHANGED, V.GUARDRAIL_REJECTED})
_CURRENT = frozenset({V.ACCEPTED, V.UNCHANGED})  # the read's content is the current version
_FOR_NOTIFICATIONS = frozenset({TriggerReason.UPDATED, TriggerReason.FOLLOW_UP})
_NOT_SUBSCRIBED = frozenset({S.DISCOVERED, S.SUBSCRIBING})

MAX_VARIANTS = 16  # conflict URIs remembered per subscription (bounded state for continue-as-new)

OVERDUE_DETAIL = "verification overdue"
"""How the detail line of a breach the watchdog found begins (``overdue_found``): a read that saw
content clears it (``read_judged``); the ledger's outbox event and audit row stay."""

class UpdateDisposition(StrEnum):
    NOTED = "noted"  # a wake-up: a read is requested, or the read pending or in flight stands for it
    OLD_SESSION = "old_session"  # from a session generation before ours: audit, ignore
    FUTURE_SESSION = "future_session"  # from a generation we have not adopted yet: resubscribe first
    NOT_ACTIVE = "not_active"  # closing, closed, tombstoned: audit, ignore
    WRONG_URI = "wrong_uri"  # identity mismatch: audit, RECONCILIATION_REQUIRED


class FenceState(BaseModel):
    """Everything the workflow knows; carried whole through continue-as-new."""

    key: SubscriptionKey
    state: SubscriptionState = S.DISCOVERED
    session_generation: int = 0
    edition: str = ""
    capabilities: dict[str, bool] = Field(default_factory=dict)
    subscription_generation: int = 0
    last_issued_ordinal: int = 0
    last_accepted_ordinal: int = 0
    watermark: int = 0
    last_accepted_digest: str | None = None
    last_receipt_id: int | None = None
    close_epoch: int = 0
    close_ordinal: int | None = None
    in_flight: list[int] = Field(default_factory=list)
    pending_trigger: TriggerReason | None = None
    last_verdict: AcceptVerdict | None = None
    updates_seen: int = 0
    reads_issued: int = 0
    stale_receipts: int = 0
    stale_after_close: int = 0
    guardrail_rejections: int = 0
    close_requested: bool = False
    close_reason: str = ""
    staleness_bound_seconds: float | None = None  # polling: the effective poll period (``poll_period``)
    staleness_bound_source: StalenessBoundSource | None = None  # which rule set it
    poll_interval_seconds: float | None = None  # polling: the configured interval the period starts from
    last_read_ttl_ms: int | None = None  # ttlMs of the newest read that returned a result
    last_read_cache_scope: CacheScope | None = None  # its cacheScope
    failed_reads: int = 0  # consecutive reads that failed (the poll backoff); a read with content resets it
    read_armed_from: datetime | None = None  # ``requested_at`` the current ``read_due_at`` was armed from
    read_jitter: float = 1.0  # the jitter draw it was armed with (re-armed with the same one)
    tombstone_pending_at: datetime | None = None  # a read first saw not-found (older catalog words are stale)
    content_seen_at: datetime | None = None  # allocation time of the newest read that observed content
    last_accepted_at: datetime | None = None  # when the ledger last made a new version current
    read_due_at: datetime | None = None  # the next poll / safety read is due then (armed at allocation)
    # This chain's mark_active put the row on the ledger's verification schedule (a safety-read period,
    # ``verification_rules``): the ingress's sweep makes its safety reads; the run keeps a watchdog.
    ledger_scheduled: bool = False
    watch_due_at: datetime | None = None  # a watched run's next look at the ledger (``deadline_keeper``)
    reconciliation_since: datetime | None = None  # when RECONCILIATION_REQUIRED began (its bound's start)
    conflict_uris: list[str] = Field(default_factory=list)  # variants seen in this RECONCILIATION_REQUIRED
    reconciled_variants: list[str] = Field(default_factory=list)  # variants catalog evidence already cleared
    ended_at: datetime | None = None  # when the subscription reached a terminal state
    detail: str = ""

    def __setattr__(self, name: str, value: Any) -> None:
        """A field is assigned as pydantic assigns one without ``validate_assignment``: the value into
        the instance's ``__dict__``, the name into its fields set; without pydantic's lookup of a handler
        by name (the run writes its state about 150 times a schedule). Any other name is pydantic's."""
        if name in _FENCE_FIELDS:
            self.__dict__[name] = value
            self.__pydantic_fields_set__.add(name)
        else:
            super().__setattr__(name, value)


_FENCE_FIELDS = frozenset(FenceState.model_fields)


class SubscriptionFence:
    def __init__(self, state: FenceState) -> None:
        self.s = state
        self._placeholders = 0  # per run: slots held for allocations not granted yet are -1, -2, …
        # Per run (``interpreter.PATCH_AFTER_0_2_0``): deadlines are armed a dispatch margin before
        # the period ends, so the read is allocated within the bound; runs that started on 0.2.0 arm
        # them at the whole period (their recorded timers).
        self.dispatch_margin = False

    def explain(self, detail: str) -> None:
        """The operator-facing reason for the current state (Web UI, ``status``); metadata only."""
        self.s.detail = detail

    # --- durable fence ----------------------------------------------------------------

    def adopt(self, snap: FenceSnapshot) -> None:
        """Take the ledger's row: ordinals and generations never go backwards here."""
        if not snap.exists:
            return
        # A field is written only when it changes: most snapshots repeat what the run holds, and a
        # write goes through pydantic's ``__setattr__`` (several times a plain attribute's cost).
        s = self.s
        if snap.last_issued_ordinal > s.last_issued_ordinal:
            s.last_issued_ordinal = snap.last_issued_ordinal
        if snap.last_accepted_ordinal > s.last_accepted_ordinal:
            s.last_accepted_ordinal = snap.last_accepted_ordinal
        if snap.watermark >= s.watermark:  # the version, as ``applied``: a guardrail moves only lastAccepted
            if s.last_accepted_digest != snap.last_accepted_digest:
                s.last_accepted_digest = snap.last_accepted_digest
            if s.last_receipt_id != snap.last_receipt_id:
                s.last_receipt_id = snap.last_receipt_id
            if snap.watermark > s.watermark:
                s.watermark = snap.watermark
        if snap.subscription_generation > s.subscription_generation:
            s.subscription_generation = snap.subscription_generation
        if snap.session_generation > s.session_generation:
            s.session_generation = snap.session_generation
        if snap.close_epoch > s.close_epoch:
            s.close_epoch = snap.close_epoch
        if snap.close_ordinal is not None and snap.close_ordinal != s.close_ordinal:
            s.close_ordinal = snap.close_ordinal
        if snap.state is not None and snap.state != s.state \
                and not (s.state in TERMINAL and snap.state not in TERMINAL) and (
                snap.state in CLOSING or snap.state in TERMINAL or s.state not in CLOSING):
            # The ledger wins, except that a workflow already closing never reopens and a
            # finished one never restarts because a snapshot lagged behind it.
            s.state = snap.state

    # --- subscribe ------------------------------------------------------------------

    def wants_subscribe(self, live_generation: int) -> bool:
        s = self.s
        if s.close_requested or s.state in CLOSING or s.state in TERMINAL:
            return False
        return s.state in _NOT_SUBSCRIBED or live_generation > s.session_generation

    def subscribing(self, snap: FenceSnapshot, edition: str, capabilities: dict[str, bool]) -> bool:
        """The ledger answered begin_subscription; True if we may go on subscribing."""
        self.adopt(snap)
        self.s.edition = edition
        self.s.capabilities = dict(capabilities)
        # A session change invalidates whatever was in flight: those reads can only be stale now
        # (the subscribe's initial read covers what they would have).
        self.s.in_flight.clear()
        return snap.state == S.SUBSCRIBING

    def subscribed(self, snap: FenceSnapshot, *, poll_interval_seconds: float | None,
                   ledger_scheduled: bool = False) -> None:
        """Subscribed (or polling): ACTIVE, and an initial read so a change before subscribe is seen.
        ``ledger_scheduled``: the mark carried a safety-read period (the ledger schedules the safety
        reads): no deadline of the run's own is armed, an earlier one (polling) is dropped."""
        self.adopt(snap)
        if self.s.state == _ACTIVE:
            self.s.pending_trigger = TriggerReason.INITIAL
            self.s.poll_interval_seconds = poll_interval_seconds
            self.s.staleness_bound_seconds = None
            self.s.staleness_bound_source = None
            self.s.ledger_scheduled = ledger_scheduled
            if ledger_scheduled:
                self.s.read_due_at = None
            else:
                self.s.watch_due_at = None
            self._publish_poll_period()

    def start_cycle_reserve(self) -> int:
        """After ``subscribing``: one activity subscribes, marks ACTIVE and makes the initial read,
        whose allocation may come at any point of it, so its slot is held from now (a placeholder).
        A trigger pending before is the initial read's to serve, as ``subscribed`` would replace it."""
        self.s.pending_trigger = None
        return self._hold_slot()

    def _hold_slot(self) -> int:
        """A negative placeholder holds an in-flight slot until the ledger grants an ordinal."""
        self._placeholders += 1
        placeholder = -self._placeholders
        self.s.in_flight.append(placeholder)
        return placeholder

    def start_cycle_subscribed(self, snap: FenceSnapshot, placeholder: int, *, read: bool,
                               ledger_scheduled: bool = False) -> TriggerReason | None:
        """The start activity marked the row (``snap``; ``ledger_scheduled`` as ``subscribed``) and, if
        ``read``, made the initial read: INITIAL, taken as ``reserve_read`` takes it; a trigger set
        meanwhile stays pending. Without a read (the row was not ACTIVE on these generations), exactly
        ``subscribed``: the slot is released, None."""
        window = self.s.pending_trigger
        self.release_placeholder(placeholder)
        self.subscribed(snap, poll_interval_seconds=None, ledger_scheduled=ledger_scheduled)
        if self.s.state != _ACTIVE or not read:
            return None
        self.s.pending_trigger = window
        return TriggerReason.INITIAL

    # --- updates and reads ------------------------------------------------------------

    def note_update(self, sig: ResourceUpdated) -> UpdateDisposition:
        s = self.s
        if sig.uri != s.key.uri:
            return UpdateDisposition.WRONG_URI
        if sig.session_generation < s.session_generation:
            return UpdateDisposition.OLD_SESSION
        if s.state not in (_ACTIVE, S.DISCOVERED, S.SUBSCRIBING):
            return UpdateDisposition.NOT_ACTIVE
        if sig.session_generation > s.session_generation:
            return UpdateDisposition.FUTURE_SESSION
        s.updates_seen += 1
        if s.pending_trigger is None and s.in_flight:
            # The read in flight (or the start's) was allocated before this wake-up's note: it may not
            # observe it, and its accept may even precede the note (answering clean), so one more read
            # is owed (a concurrent one if ``max_concurrent_reads`` allows).
            s.pending_trigger = TriggerReason.FOLLOW_UP
        elif s.pending_trigger is None and s.state == _ACTIVE:
            s.pending_trigger = TriggerReason.UPDATED
        # Else a read is requested and not allocated yet: it is allocated after this note, covering it.
        return UpdateDisposition.NOTED

    def overdue_found(self, gap_seconds: float | None, period_seconds: float | None) -> None:
        """The watchdog's look found no verification within the period (the ledger recorded the
        breach); the run reads itself (``poll_due``)."""
        since = "no verification yet" if gap_seconds is None else f"no verification for {gap_seconds:.0f} s"
        self.s.detail = (f"{OVERDUE_DETAIL}: {since}, over the {period_seconds or 0:g} s bound (no ingress "
                         "swept in time); reading through the workflow")

    def poll_due(self) -> None:
        """The poll / safety-read deadline passed (or a catalog word asks for a verification read)."""
        if self.s.state == _ACTIVE and self.s.pending_trigger is None:
            self.s.pending_trigger = TriggerReason.POLL

    # --- deadlines ----------------------------------------------------------------------

    def read_period(self, safety_read_seconds: float | None) -> float | None:
        """The period the next read is promised within: the published staleness bound when
        polling, else the safety re-read period (None: no periodic read at all)."""
        return self.s.staleness_bound_seconds or safety_read_seconds or None

    def arm_read_deadline(self, *, requested_at: datetime, period_seconds: float | None,
                          jitter: float) -> None:
        """A read allocation requested at ``requested_at`` was granted: the next periodic read is due
        one period (less the dispatch margin) later, jittered early (``read_deadline.jittered``), so its
        allocation falls within the published bound."""
        if not period_seconds:
            self.s.read_due_at = None
            return
        period = self._requested_within(period_seconds)
        self.s.read_due_at = requested_at + timedelta(seconds=period * jittered(jitter))
        self.s.read_armed_from = requested_at
        self.s.read_jitter = jitter

    def _requested_within(self, period_seconds: float) -> float:
        """The period, less the dispatch margin when this run takes it."""
        return period_seconds - (dispatch_margin(period_seconds) if self.dispatch_margin else 0.0)

    def read_promised_by(self) -> datetime | None:
        """The latest time the next periodic read may be requested: one whole period after the read
        the deadline was armed from (``read_due_at`` itself is jittered earlier)."""
        s = self.s
        if s.read_due_at is None or s.read_armed_from is None:
            return s.read_due_at
        return s.read_armed_from + (s.read_due_at - s.read_armed_from) / jittered(s.read_jitter)

    def read_directives(self, outcome: ReadOutcome) -> None:
        """A read came back: keep its ttlMs / cacheScope and the failure count, and republish the
        poll period (and with it the staleness bound) they imply."""
        s = self.s
        if outcome.ttl_ms is not None:
            s.last_read_ttl_ms = outcome.ttl_ms
        if outcome.cache_scope is not None:
            s.last_read_cache_scope = outcome.cache_scope
        if outcome.kind == ReadOutcomeKind.CONTENT:
            s.failed_reads = 0
        elif outcome.kind in FAILED_READS:
            s.failed_reads += 1
        self._publish_poll_period()

    def _publish_poll_period(self) -> None:
        s = self.s
        base = s.poll_interval_seconds
        if not base:
            return
        before = s.staleness_bound_seconds
        period, source = poll_period(base, s.last_read_ttl_ms, s.failed_reads)
        s.staleness_bound_seconds, s.staleness_bound_source = period, source
        if before is not None and period != before and s.read_due_at is not None \
                and s.read_armed_from is not None:
            # The period changed after the deadline was armed: re-arm from the same allocation and
            # jitter draw, so the new bound holds at once and no poll comes sooner than the server
            # allows (no new draw: the run's random draws depend only on its reads).
            self.arm_read_deadline(requested_at=s.read_armed_from, period_seconds=period,
                                   jitter=s.read_jitter)

    def poll_if_due(self, now: datetime, *, period_seconds: float | None) -> bool:
        """At or past the deadline: request the periodic read (trigger POLL). An ACTIVE fence with
        a period but no deadline armed yet arms one from ``now``. True when a read was requested here."""
        s = self.s
        if s.state != _ACTIVE or not period_seconds or self.allocating:
            return False  # an allocation on its way re-arms the deadline when granted
        if s.read_due_at is None:
            s.read_due_at = now + timedelta(seconds=self._requested_within(period_seconds))
        if now >= s.read_due_at and s.pending_trigger is None:
            s.pending_trigger = TriggerReason.POLL
            return True
        return False

    def until_read_due(self, now: datetime) -> timedelta | None:
        """How long the main loop may wait before the periodic read is due; None when no deadline
        applies (not ACTIVE, none armed, a read requested or being allocated)."""
        s = self.s
        if s.state != _ACTIVE or s.read_due_at is None or s.pending_trigger is not None or self.allocating:
            return None
        return max(timedelta(0), s.read_due_at - now)

    @property
    def allocating(self) -> bool:
        """A read's ordinal was requested and not granted yet (a negative placeholder in flight)."""
        in_flight = self.s.in_flight  # a few entries; ``min`` makes no generator (the wait conditions ask)
        return bool(in_flight) and min(in_flight) < 0

    def read_wanted(self, max_in_flight: int = 1) -> TriggerReason | None:
        s = self.s
        if (s.state == _ACTIVE and not s.close_requested and s.pending_trigger is not None
                and len(s.in_flight) < max_in_flight):
            return s.pending_trigger
        return None

    def reserve_read(self, max_in_flight: int) -> tuple[TriggerReason, int]:
        """Start a read for the pending trigger: the trigger is taken (so the loop does not start it
        twice) and a placeholder holds the in-flight slot."""
        trigger = self.read_wanted(max_in_flight)
        assert trigger is not None, "reserve_read without a wanted read"
        self.s.pending_trigger = None
        return trigger, self._hold_slot()

    def release_placeholder(self, placeholder: int) -> None:
        """The allocation answered (or failed); a session change may already have cleared the slot."""
        if placeholder in self.s.in_flight:
            self.s.in_flight.remove(placeholder)

    def refused(self, snap: FenceSnapshot, trigger: TriggerReason) -> None:
        """The ledger refused the allocation; ``snap`` is the reloaded row. Still ACTIVE on the
        session we now know of: the trigger is owed a read (a closed row owes it nothing)."""
        self.adopt(snap)
        if snap.state == _ACTIVE and snap.session_generation == self.s.session_generation:
            self.s.pending_trigger = self.s.pending_trigger or trigger

    def session_lost(self, ordinal: int | None) -> None:
        """A read never reached the ledger (its session gone), or a read cycle failed for good before
        telling its ordinal (None): resubscribe, whose initial read covers any other trigger. An
        ordinal the read burned stays burned."""
        if ordinal in self.s.in_flight:
            self.s.in_flight.remove(ordinal)
        self.s.pending_trigger = TriggerReason.RESUBSCRIBE

    def future_session_seen(self) -> None:
        """A notification from a newer session generation than ours: resubscribe on it."""
        self.s.pending_trigger = self.s.pending_trigger or TriggerReason.RESUBSCRIBE

    def update_reported(self) -> None:
        """A report the ingress made was mirrored (``issued`` / ``applied``): its update was seen."""
        self.s.updates_seen += 1

    def issued(self, ticket: ReadTicket, *, in_flight: bool = True) -> bool:
        """The ledger allocated an ordinal (False: refused). ``in_flight``: the run's own read, judged
        later by ``applied``; not for a report the ingress made, whose verdict follows at once."""
        s = self.s
        if not ticket.granted:
            return False
        s.last_issued_ordinal = max(s.last_issued_ordinal, ticket.ordinal)
        s.reads_issued += 1
        if in_flight:
            s.in_flight.append(ticket.ordinal)
        return True

    def report_deadline(self, requested_at: datetime) -> bool:
        """Whether a reported read requested at ``requested_at`` re-arms the read deadline: only when
        ACTIVE and newer than the read it was armed from (a late report never moves it back)."""
        s = self.s
        return s.state == _ACTIVE and (s.read_armed_from is None or requested_at > s.read_armed_from)

    def applied(self, ordinal: int, result: AcceptResult, *, read_notified: int = 0,
                trigger: TriggerReason | None = None) -> None:
        """The ledger judged a completed read (allocated when the row had counted ``read_notified``
        notifications, for ``trigger``; None: a report from the ingress, which hands over what it
        leaves dirty). Every judged read goes through here: the one place coverage is decided."""
        s = self.s
        if ordinal in s.in_flight:
            s.in_flight.remove(ordinal)
        s.last_verdict = verdict = result.verdict
        if verdict in _MOVES_VERSION:
            # A report judged before a newer read of the run's own can land after it: its receipt
            # stays out, as its digest does (``accepted_digest``), so the record names one read. The
            # watermark, not lastAccepted: a later guardrail-rejected read moves only the latter.
            if result.watermark >= s.watermark:
                s.last_receipt_id = result.receipt_id
            s.last_accepted_ordinal = max(s.last_accepted_ordinal, result.last_accepted_ordinal)
            s.watermark = max(s.watermark, result.watermark)
        # A verdict judged before a close or revocation can land after it: never leave those.
        if verdict in _CURRENT:
            pass  # only the version moves (above)
        elif verdict == V.TOMBSTONE_PENDING:
            if s.state == _ACTIVE:
                s.state = S.TOMBSTONE_PENDING
        elif verdict == V.REVOKED:
            if s.state not in TERMINAL:
                s.state = S.REVOKED
        elif verdict == V.GUARDRAIL_REJECTED:
            s.last_accepted_ordinal = max(s.last_accepted_ordinal, result.last_accepted_ordinal)
            s.guardrail_rejections += 1
            s.detail = f"guardrail rejected read {ordinal}: {result.reason}; previous version stays current"
        elif verdict == V.STALE:
            s.stale_receipts += 1
        elif verdict == V.STALE_AFTER_CLOSE:
            s.stale_after_close += 1
        # A report during the start (not ACTIVE here yet, its slot in flight) is owed after it.
        if s.pending_trigger is None and (s.state == _ACTIVE or s.in_flight) and follow_up_owed(
                result.notified, result.covered, read_notified, handed_over=trigger is None,
                for_notifications=trigger in _FOR_NOTIFICATIONS):
            s.pending_trigger = TriggerReason.FOLLOW_UP

    def accepted_digest(self, digest: str | None, result: AcceptResult) -> None:
        """After ``applied``: the digest of the newest accepted read (a report from the ingress that
        arrives after a newer read of the run's own was judged keeps its older digest out)."""
        if result.verdict in _CURRENT and result.watermark >= self.s.watermark:
            self.s.last_accepted_digest = digest

    def observed(self, result: AcceptResult, *, allocated_at: datetime, now: datetime) -> None:
        """When a judged read (allocated at ``allocated_at``) saw content or not-found: the times
        ``catalog_word_is_stale`` compares catalog measurements with."""
        s = self.s
        if result.verdict in _SAW_CONTENT:
            seen = s.content_seen_at
            s.content_seen_at = allocated_at if seen is None else max(seen, allocated_at)
            if result.verdict == AcceptVerdict.ACCEPTED:
                s.last_accepted_at = now
        elif result.verdict == AcceptVerdict.TOMBSTONE_PENDING:
            s.tombstone_pending_at = now

    def read_judged(self, ordinal: int, outcome: ReadOutcome, result: AcceptResult) -> None:
        """The detail line after a judged read: why it failed, or cleared once a read saw content
        (a failure, a catalog verification or a not-found explanation is then history)."""
        s = self.s
        code = f" (code {outcome.error_code})" if outcome.error_code is not None else ""
        if result.verdict == AcceptVerdict.REJECTED and outcome.kind != ReadOutcomeKind.CONTENT:
            # Classified, audited, bounded: no automatic retry; the next notification or poll reads again.
            s.detail = f"read {ordinal} failed: {outcome.kind.value}{code}"
        elif result.verdict == AcceptVerdict.TOMBSTONE_PENDING and s.state == S.TOMBSTONE_PENDING:
            s.detail = (f"read {ordinal}: not found{code}; waiting for a reconciled catalog to confirm the "
                        f"deletion (or list the URI again)")
        elif result.verdict in _CURRENT and \
                s.detail.startswith(("read ", "not listed in catalog", OVERDUE_DETAIL)):
            s.detail = ""

    def finish(self, now: datetime) -> None:
        """The run loop ended in a terminal state: stamp when (kept through continue-as-new)."""
        if self.finished and self.s.ended_at is None:
            self.s.ended_at = now

    def catalog_word_is_stale(self, *, listed: bool, measured_at: datetime | None) -> bool:
        """A catalog measured before our own read saw the opposite cannot overrule that read:
        listed, measured before a read saw not-found; or unlisted, measured before a read
        (allocated after the measurement) saw content."""
        s = self.s
        if measured_at is None:
            return False
        if listed:
            return s.state == S.TOMBSTONE_PENDING and s.tombstone_pending_at is not None \
                and measured_at < s.tombstone_pending_at
        return s.state == _ACTIVE and s.content_seen_at is not None and measured_at < s.content_seen_at

    # --- identity and catalog ------------------------------------------------------------

    def identity_conflict(self, detail: str, *, now: datetime | None = None,
                          observed_uri: str | None = None) -> bool:
        """RECONCILIATION_REQUIRED: stop accepting until the identity is reconciled (catalog
        evidence, the time bound, or a resume). False if closing/terminal."""
        s = self.s
        if s.state in CLOSING or s.state in TERMINAL:
            return False
        if observed_uri is not None and observed_uri not in s.conflict_uris:
            s.conflict_uris = [*s.conflict_uris, observed_uri][-MAX_VARIANTS:]
        if s.state != S.RECONCILIATION_REQUIRED or s.reconciliation_since is None:
            s.reconciliation_since = now  # a second conflict does not extend the bound
        s.state = S.RECONCILIATION_REQUIRED
        s.pending_trigger = None
        s.detail = detail
        return True

    def reconciliation_deadline(self, now: datetime, max_seconds: float) -> datetime:
        """When RECONCILIATION_REQUIRED resumes without evidence. A fence that entered it without
        a time (adopted from the ledger after a reset) starts the bound now."""
        if self.s.reconciliation_since is None:
            self.s.reconciliation_since = now
        return self.s.reconciliation_since + timedelta(seconds=max_seconds)

    def variant_already_reconciled(self, observed_uri: str) -> bool:
        """A conflict from a variant that catalog evidence already cleared for this subscription:
        not a reason to stop again (a repeated stray or hostile notification cannot freeze it);
        it only invalidates, and the read of our exact URI tells. True when a read was requested."""
        s = self.s
        if observed_uri not in s.reconciled_variants or s.state != _ACTIVE:
            return False
        s.updates_seen += 1
        if s.pending_trigger is None:
            s.pending_trigger = TriggerReason.UPDATED
        return True

    def identity_evidence(self, *, listed: bool, measured_at: datetime | None) -> bool:
        """Does a catalog word reconcile the identity? Only one measured after the conflict began that
        lists the exact URI. Variants listed beside it make an ambiguous pair (both spellings are
        read on an update for either), not a reason to wait."""
        s = self.s
        if s.state != S.RECONCILIATION_REQUIRED or not listed or measured_at is None:
            return False
        if s.reconciliation_since is not None and measured_at < s.reconciliation_since:
            return False
        s.reconciled_variants = [*s.reconciled_variants, *s.conflict_uris][-MAX_VARIANTS:]
        return True

    def resumed(self, snap: FenceSnapshot, detail: str = "") -> None:
        """Back to ACTIVE from RECONCILIATION_REQUIRED or a recreated tombstone: re-read first."""
        self.adopt(snap)
        if self.s.state == _ACTIVE:
            self.s.pending_trigger = TriggerReason.INITIAL
            self.s.reconciliation_since = None
            self.s.conflict_uris = []
            self.s.detail = detail

    # --- close --------------------------------------------------------------------------

    def request_close(self, reason: str) -> None:
        """Freeze intent now; the ledger freezes the ordinal."""
        s = self.s
        if not s.close_requested and s.state not in CLOSING and s.state not in TERMINAL:
            s.close_requested = True
            s.close_reason = reason

    def closing(self, receipt: CloseReceipt) -> None:
        s = self.s
        s.state = receipt.state
        s.close_epoch = max(s.close_epoch, receipt.close_epoch)
        s.close_ordinal = receipt.close_ordinal
        s.last_issued_ordinal = max(s.last_issued_ordinal, receipt.close_ordinal)
        s.pending_trigger = None

    def unsubscribed(self, snap: FenceSnapshot) -> None:
        self.adopt(snap)
        self.s.in_flight.clear()

    def close_receipt(self) -> CloseReceipt:
        s = self.s
        ordinal = s.close_ordinal if s.close_ordinal is not None else s.last_issued_ordinal
        return CloseReceipt(state=s.state if s.state in CLOSING else S.UNSUBSCRIBING,
                            close_epoch=s.close_epoch, close_ordinal=ordinal,
                            last_accepted_ordinal=s.last_accepted_ordinal)

    # --- views ----------------------------------------------------------------------------

    @property
    def phase(self) -> SubscriptionState:
        s = self.s
        if s.state != _ACTIVE:
            return s.state
        if s.in_flight:
            return S.READ_PENDING
        if s.pending_trigger is not None:
            return S.UPDATE_SEEN
        return _ACTIVE

    @property
    def finished(self) -> bool:
        return self.s.state in TERMINAL

    def record(self, *, started_at: datetime | None = None,
               safety_read_seconds: float | None = None) -> ResourceSubscriptionV1:
        s = self.s
        return ResourceSubscriptionV1(
            subject=s.key.subject,
            server=s.key.server,
            uri=s.key.uri,
            state=self.phase,
            session_generation=s.session_generation,
            edition=s.edition,
            capabilities=s.capabilities,
            subscription_generation=s.subscription_generation,
            started_at=started_at,
            ended_at=s.ended_at,
            last_notification_seq=s.updates_seen,
            last_issued_ordinal=s.last_issued_ordinal,
            last_accepted_ordinal=s.last_accepted_ordinal,
            last_accepted_digest=s.last_accepted_digest,
            last_receipt_id=s.last_receipt_id,
            last_verdict=s.last_verdict,
            watermark=s.watermark,
            close_epoch=s.close_epoch,
            close_ordinal=s.close_ordinal,
            reads_issued=s.reads_issued,
            staleness_bound_seconds=s.staleness_bound_seconds,
            staleness_bound_source=(s.staleness_bound_source if s.staleness_bound_seconds is not None
                                    else None),
            last_read_ttl_ms=s.last_read_ttl_ms,
            last_read_cache_scope=s.last_read_cache_scope,
            safety_read_seconds=(safety_read_seconds or None) if s.staleness_bound_seconds is None else None,
            last_accepted_at=s.last_accepted_at,
            last_verified_at=s.content_seen_at,
            next_read_due_at=s.read_due_at if s.state == _ACTIVE else None,
            detail=s.detail,
        )


def should_continue_as_new(*, suggested: bool, history_length: int, reads_in_flight: int,
                           handlers_finished: bool, max_history: int = MAX_HISTORY_EVENTS,
                           target_version_changed: bool = False) -> bool:
    """Continue-as-new once Temporal suggests it (or history is long), or the deployment's current
    build is no longer the one this run is pinned to (upgrade on continue-as-new); never mid-read."""
    if reads_in_flight or not handlers_finished:
        return False
    return suggested or history_length >= max_history or target_version_changed
