"""The subscription program: every decision of one subscription, run by two interpreters.

Contract:
- ``SubscriptionProgram`` is the whole behaviour of ``ResourceSubscriptionWorkflow`` (handlers,
  main loop, read cycle, catalog verdicts, session loss, close, revocation, identity
  reconciliation, continue-as-new timing, the Web UI's detail text), written once as async
  code over a narrow ``Interpreter``. It imports nothing from temporalio and does no I/O.
- Two interpreters run it: ``mcpsync.workflows.subscription`` (Temporal: activities, timers, search
  attributes) and the simulator (``sim/``: an in-memory world under seeded adversarial schedules,
  resets by replaying its inputs), so the simulator judges the program production runs, not a copy.
- Determinism: everything time-, random- or history-dependent comes from the interpreter
  (``now``, ``random``, ``uuid4``, ``continue_as_new_suggested`` …), in the order the code
  asks. Changing the order of interpreter calls changes the commands a Temporal run emits: the
  released corpus (tests/histories/<version>/) must still replay, and a change to released
  code that alters them is patched (docs/upgrades.md).
- The fence (``mcpsync.workflows.subscription_state``, over the rules of
  ``mcpsync.workflows.ledger_rules``) decides what is safe; this module sequences it. A read is one
  activity on the session host's queue (``Act.MCP_READ_CYCLE``): allocate (CAS), read over
  the live session, accept (CAS); the run mirrors its result. At most ``max_concurrent_reads`` in
  flight; updates meanwhile coalesce into one follow-up, judged by the ledger's update counter at
  the allocation. A start is one activity too (``Act.MCP_SUBSCRIBE_CYCLE``: subscribe, mark
  ACTIVE, the initial read cycle) where the server advertises subscribe; before it, a new run's
  ensure, session lookup and begin are one ledger call (``Act.START_SUBSCRIPTION``; runs that took
  ``PATCH_AFTER_0_2_0``).
- Search attributes are upserted when a coroutine blocks, and only if one changed (the details
  panel is not history).
- Staleness promise: the deadline keeper's timer for ``FenceState.read_due_at`` wakes the main loop,
  which never waits past it. A *watched* run (``_watched``: it took ``PATCH_AFTER_0_2_0``, its row
  was marked ACTIVE with a safety-read period, so the ledger schedules its safety reads and the
  ingress's sweep makes them, and no poll bound applies) arms no deadline: the keeper's watchdog
  wakes the loop every ``SubscriptionOptions.watchdog_seconds`` (default
  ``verification_rules.WATCHDOG_HORIZON``, 6 h) to look (``Act.WATCH_VERIFICATIONS``: the ledger
  records a breach as an ``overdue`` outbox event) and, when a verification is overdue now, to read
  through its own read cycle (trigger POLL). A look that finds nothing changes nothing: no search
  attribute, no event but the timer's and the local activity's.
- RECONCILIATION_REQUIRED ends on catalog evidence or after ``reconciliation_max_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from mcpsync.workflows.deadline_keeper import DeadlineKeeper
from mcpsync.workflows.interpreter import PATCH_AFTER_0_2_0, ActivityFailed, Interpreter, WaitKind
from mcpsync.workflows.names import Act
from mcpsync.workflows.read_deadline import resynced_jitter
from mcpsync.workflows.records.ledger import (
    AllocateRequest,
    AuditRequest,
    BeginSubscriptionRequest,
    EnsureRequest,
    FenceSnapshot,
    FinishUnsubscribeRequest,
    KeyRequest,
    MarkActiveRequest,
    SessionQuery,
    StartSubscriptionRequest,
    SubscriptionStarted,
    WatchRequest,
    WatchResult,
)
from mcpsync.workflows.records.mcp_calls import SubscribeRequest, UnsubscribeOutcome, UnsubscribeRequest
from mcpsync.workflows.records.read_cycle import (
    ReadCycleRequest,
    ReadCycleResult,
    ReadReport,
    SubscribeCycleRequest,
    SubscribeCycleResult,
)
from mcpsync.workflows.records.subscription import (
    CatalogObservation,
    CloseReceipt,
    CloseRequest,
    IdentityConflict,
    ResourceUpdated,
    ResumeRequest,
    RevokeLedgerRequest,
    RevokeRequest,
    SessionChanged,
    SessionInfo,
    SubscriptionStart,
    SubscriptionState,
    TriggerReason,
)
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from mcpsync.workflows.subscription_details import Publisher
from mcpsync.workflows.subscription_identity import CatalogAndIdentity
from mcpsync.workflows.subscription_state import (
    FenceState,
    SubscriptionFence,
    UpdateDisposition,
    should_continue_as_new,
)

__all__ = ["SubscriptionProgram"]

SESSION_RECHECK = timedelta(seconds=15)
"""How often a run without a live session asks the ledger again (besides the signal)."""

MAX_DEDUPE_IDS = 256

T = TypeVar("T")

S = SubscriptionState
# Read once: on Python 3.11 an ``Enum`` class attribute goes through the metaclass's ``__getattr__`` hook
# (about ten times a plain attribute), and ``_has_work`` (a wait condition checked on every activation)
# and the main loop's pass compare them.
_ACTIVE, _RESUBSCRIBE = S.ACTIVE, TriggerReason.RESUBSCRIBE
_UNSUBSCRIBING, _TOMBSTONE_PENDING, _RECONCILIATION_REQUIRED = (S.UNSUBSCRIBING, S.TOMBSTONE_PENDING,
                                                                 S.RECONCILIATION_REQUIRED)


class SubscriptionProgram:
    """One run of one subscription. Handlers are the ``on_*`` methods; ``run`` is the main loop."""

    def __init__(self, start: SubscriptionStart, rt: Interpreter) -> None:
        state = (FenceState(key=start.key) if start.carried_state is None
                 else FenceState.model_validate(start.carried_state))
        self.rt = rt
        self.start = start
        self.fence = SubscriptionFence(state)
        self.key = start.key
        self.options = start.options
        self.session: SessionInfo | None = None
        self.identity = CatalogAndIdentity(self)  # catalog words and identity reconciliation
        self.carried_binding = False  # this run continues a chain that was subscribed (continue-as-new)
        self.revocation: RevokeRequest | None = None
        self.session_failures = 0
        self.live_generation = 0  # highest session generation announced by signal
        self.seen_ids: list[str] = list(start.seen_signal_ids)
        self.reads_running = 0  # read cycles started and not yet returned
        self.reloaded = False
        self.start_in_one = False  # per run (``PATCH_AFTER_0_2_0``): a new run's first ledger call begins too
        self.started: SubscriptionStarted | None = None  # that call began: the first pass subscribes on it
        self.publisher = Publisher(rt.publish, start.options)
        # The read deadline's own timer, or a watched run's watchdog.
        self.keeper = DeadlineKeeper(self.fence, rt, watched=self._watched,
                                     horizon=timedelta(seconds=start.options.watchdog_seconds))

    # --- handlers -------------------------------------------------------------------

    async def on_resource_updated(self, sig: ResourceUpdated) -> None:
        if not await self._first_sight(sig):
            return
        await self._note_update(sig)

    async def on_read_reported(self, report: ReadReport) -> None:
        """The ingress read ``report.update``'s change itself (``resource_read``): applied as the run's
        own reads are (``_apply_judged``). A read not judged or granted, or from another session
        generation than this run's, is not applied: the update is noted as a ``resource_updated``."""
        sig = report.update
        if not await self._first_sight(sig):
            return
        cycle = report.cycle
        if not (cycle.judged and sig.session_generation == self.fence.s.session_generation
                and self._apply_judged(cycle, requested_at=report.requested_at, trigger=None)):
            await self._note_update(sig)
        if not self._has_work():
            # Nothing for the main loop to do: no coroutine blocks after this handler to upsert.
            self._flush_search_attributes()

    async def _first_sight(self, sig: ResourceUpdated) -> bool:
        """Dedupe by notification id, then wait for the run to have reloaded the durable fence.
        False: this notification was handled already."""
        if sig.notification_id is not None:
            if sig.notification_id in self.seen_ids:
                return False
            self.seen_ids = (self.seen_ids + [sig.notification_id])[-MAX_DEDUPE_IDS:]
        if not self.reloaded:
            # Signals can be delivered before run() reloaded the fence; let it finish first.
            await self._wait(lambda: self.reloaded, None, WaitKind.RELOAD)
        return True

    async def _note_update(self, sig: ResourceUpdated) -> None:
        disposition = self.fence.note_update(sig)
        self.rt.update_noted(sig.notification_id, disposition)
        if disposition == UpdateDisposition.FUTURE_SESSION:
            self.live_generation = max(self.live_generation, sig.session_generation)
            self.fence.future_session_seen()
        elif disposition in (UpdateDisposition.OLD_SESSION, UpdateDisposition.NOT_ACTIVE,
                             UpdateDisposition.WRONG_URI):
            await self._audit(f"NOTIFICATION_{disposition.value.upper()}", sig.session_generation,
                              {"uri_matches": int(sig.uri == self.key.uri)})
            if disposition == UpdateDisposition.WRONG_URI:
                self.fence.explain("notification for a different URI reached this subscription")
        self._publish()

    def on_session_changed(self, sig: SessionChanged) -> None:
        self.live_generation = max(self.live_generation, sig.session_generation)

    def on_catalog_reconciled(self, obs: CatalogObservation) -> None:
        if obs.uri == self.key.uri:
            self.identity.catalog = obs

    def on_revoke(self, req: RevokeRequest) -> None:
        if self.revocation is None:
            self.revocation = req

    def on_identity_conflict(self, conflict: IdentityConflict) -> None:
        self.identity.conflict = conflict

    def validate_resume(self, req: ResumeRequest) -> None:
        if self.fence.s.state != S.RECONCILIATION_REQUIRED:
            raise ValueError(f"nothing to resume: subscription is {self.fence.s.state.value}")

    async def on_resume(self, req: ResumeRequest) -> ResourceSubscriptionV1:
        self.identity.resume_requested = req
        # A close or revocation handled first finishes the workflow: the resume is then moot.
        await self._wait(lambda: self.identity.resume_requested is None or self.fence.finished, None,
                         WaitKind.RESUME_UPDATE)
        return self.record()

    def first_read_judged(self) -> bool:
        """The first read has been judged, or none will come: the record can answer ``first_read``.

        Judged: the fence holds a verdict of this chain (an earlier incarnation's receipt in the ledger
        row never answers). None will come: it waits for a catalog (TOMBSTONE_PENDING) or an operator
        (RECONCILIATION_REQUIRED), is closing or finished. Only once the run loaded the durable fence."""
        s = self.fence.s
        return self.reloaded and (
            s.last_verdict is not None or s.close_requested or self.fence.finished
            or s.state in (S.TOMBSTONE_PENDING, S.RECONCILIATION_REQUIRED, S.UNSUBSCRIBING))

    async def on_first_read(self) -> ResourceSubscriptionV1:
        """The record once ``first_read_judged`` (at once if it already is). Platform callers start a
        subscription with this update (Update-with-Start) and get the first receipt in one round trip."""
        await self._wait(self.first_read_judged, None, WaitKind.FIRST_READ_UPDATE)
        return self.record()

    def on_close_signal(self, req: CloseRequest) -> None:
        self.fence.request_close(req.reason)

    @staticmethod
    def validate_close(req: CloseRequest) -> None:
        if len(req.reason) > 500:
            raise ValueError("close reason longer than 500 characters")

    async def on_close(self, req: CloseRequest) -> CloseReceipt:
        self.fence.request_close(req.reason)
        await self._wait(lambda: self.fence.finished, None, WaitKind.CLOSE_UPDATE)
        return self.fence.close_receipt()

    def record(self) -> ResourceSubscriptionV1:
        return self.fence.record(started_at=self.rt.start_time(),
                                 safety_read_seconds=self.options.safety_read_seconds)

    # --- main loop ---------------------------------------------------------------------

    async def run(self) -> ResourceSubscriptionV1:
        rt = self.rt
        # Before the first command, so the marker says which code the run started on (docs/upgrades.md).
        patched = rt.patched(PATCH_AFTER_0_2_0)
        self.fence.dispatch_margin = self.keeper.rearm = self.start_in_one = patched
        await self._load_fence()
        self.live_generation = max(self.live_generation, self.fence.s.session_generation)
        self.reloaded = True
        self._publish()
        rt.spawn(self.keeper.run())

        while not self.fence.finished:
            rt.loop_iteration()
            s = self.fence.s
            if self.revocation is not None:
                await self._revoke()
                continue
            if s.close_requested or s.state == _UNSUBSCRIBING:
                await self._close()
                continue
            if self.identity.conflict is not None:
                await self.identity.enter_reconciliation()
                continue
            if self.identity.catalog is not None:
                await self.identity.apply_catalog()
                continue
            if s.state == _TOMBSTONE_PENDING:
                # Only a reconciled catalog confirms the deletion (or shows the URI listed again).
                # A read's reload may adopt a ledger row that already left TOMBSTONE_PENDING (e.g.
                # closed by a run this one was reset past): wake for that too.
                await self._wait(lambda: self.identity.catalog is not None or self.fence.s.close_requested
                                 or self.revocation is not None or self.fence.s.state != S.TOMBSTONE_PENDING,
                                 None, WaitKind.TOMBSTONE)
                continue
            if s.state == _RECONCILIATION_REQUIRED:
                await self.identity.await_reconciliation()
                continue
            if self.session is None or self.fence.wants_subscribe(self.live_generation) \
                    or s.pending_trigger == _RESUBSCRIBE:
                if not await self._ensure_subscribed():
                    await self._wait_for_session()
                continue
            self.fence.poll_if_due(rt.now(), period_seconds=self._read_period())
            if self.fence.read_wanted(self.options.max_concurrent_reads) is not None:
                self._start_read()
                continue
            if self.keeper.look_owed:
                await self._look()
                continue
            if self._continue_as_new_due():
                await self._continue_as_new()
            # The deadline keeper owns the timer; its firing is work like any other.
            await self._wait(self._idle_or_deadline(self.keeper.ticks), None, WaitKind.IDLE)

        self.fence.finish(rt.now())
        await self._wait(lambda: not self.reads_running and rt.all_handlers_finished(), None, WaitKind.DRAIN)
        if self.fence.s.state == S.REVOKED:
            await self._unsubscribe()  # best effort: a revoked subscription should stop notifying
        self._publish()
        self._flush_search_attributes()
        return self.record()

    async def _load_fence(self) -> None:
        """The run's first ledger call: ensure the row (a new subscription) or load it (a continued run).
        A method of its own so that its request and snapshot are not kept in ``run``'s frame for the
        run's lifetime (a cached run is held in the worker's memory)."""
        if self.start.carried_state is None and self.start_in_one:
            # Ensure, the session lookup and begin in one local activity (one marker, one activation):
            # begun only on a row the first pass subscribes at once, with no signal's work before it.
            ensure = EnsureRequest(key=self.key, incarnation=self.rt.first_execution_run_id())
            start = StartSubscriptionRequest(ensure=ensure, begin=not self._served_before_subscribe())
            started = await self._ledger(Act.START_SUBSCRIPTION, start, SubscriptionStarted)
            snap, self.started = started.fence, (started if started.begun is not None else None)
        elif self.start.carried_state is None:
            ensure = EnsureRequest(key=self.key, incarnation=self.rt.first_execution_run_id())
            snap = await self._ledger(Act.ENSURE, ensure, FenceSnapshot)
        else:
            snap = await self._ledger(Act.LOAD_FENCE, KeyRequest(key=self.key), FenceSnapshot)
            self.carried_binding = True
        self.fence.adopt(snap)
        if self.started is not None and self._served_before_subscribe():
            # A signal's work arrived while that call ran (the simulator's interleavings: Temporal
            # delivers signals after a task's local activities): served first; the begun row is adopted
            # and the next pass subscribes again.
            assert self.started.begun is not None
            self.fence.adopt(self.started.begun)
            self.started = None

    def _served_before_subscribe(self) -> bool:
        """Work the main loop serves before it subscribes a DISCOVERED row (in its order: revocation,
        close, identity conflict, catalog word)."""
        return (self.revocation is not None or self.fence.s.close_requested
                or self.identity.conflict is not None or self.identity.catalog is not None)

    def _has_work(self) -> bool:
        s = self.fence.s
        return bool(
            s.close_requested
            or self.fence.read_wanted(self.options.max_concurrent_reads) is not None
            or self.identity.conflict is not None
            or self.identity.catalog is not None
            or self.revocation is not None
            or self.live_generation > s.session_generation
            or s.pending_trigger == _RESUBSCRIBE
            or s.state != _ACTIVE
            or self.keeper.look_owed
            or self._continue_as_new_due()
        )

    def _idle_or_deadline(self, ticks: int) -> Callable[[], bool]:
        """The idle wait: work, or the deadline keeper's timer fired since ``ticks``."""
        return lambda: self._has_work() or self.keeper.ticks != ticks

    def _continue_as_new_due(self) -> bool:
        rt = self.rt
        return should_continue_as_new(
            suggested=rt.continue_as_new_suggested(),
            history_length=rt.history_length(),
            reads_in_flight=len(self.fence.s.in_flight),
            handlers_finished=rt.all_handlers_finished(),
            max_history=self.options.max_history_events,
            target_version_changed=rt.target_version_changed(),
        )

    def _read_period(self) -> float | None:
        """The period of the run's own read deadline: none for a watched run (the ledger schedules it)."""
        return None if self._watched() else self.fence.read_period(self.options.safety_read_seconds)

    def _watched(self) -> bool:
        """The run keeps the watchdog, not a deadline (module contract): this chain's mark carried the
        safety-read period (``FenceState.ledger_scheduled``), this run took the patch, no poll bound."""
        s = self.fence.s
        return s.ledger_scheduled and s.staleness_bound_seconds is None and self._resync_period() is not None

    async def _look(self) -> None:
        """The watchdog fired: the ledger judges the gap since the row's newest verification
        (``verification_rules.judge_gap``) and records a new breach (an ``overdue`` outbox event).
        Overdue: the run reads through its own read cycle, as a poll (a read of its own in flight
        may have been allocated before the ledger judged: it does not stand for one). A look that finds
        nothing changes nothing here."""
        asked_at = self.rt.now()
        found = await self._ledger(Act.WATCH_VERIFICATIONS, WatchRequest(key=self.key), WatchResult)
        self.keeper.looked(asked_at)
        if not found.scheduled:
            # The ledger does not schedule a row this run holds ACTIVE: the row moved on behind it (a
            # reset run's begin; a verdict not reported yet). A read finds out, as a deadline's did: a
            # refused allocation reloads the row.
            self.fence.poll_due()
            return
        if not found.overdue:
            return
        self.fence.overdue_found(found.gap_seconds, found.period_seconds)
        self.fence.poll_due()
        self._publish()

    def _resync_period(self) -> float | None:
        """The safety-read period the ingress may read ahead of (``worker/ingress/resync.py``): only a run
        whose keeper re-arms after such a read (else its timer would fire as well)."""
        return (self.options.safety_read_seconds or None) if self.keeper.rearm else None

    async def _wait_for_session(self) -> None:
        """Back off before asking again: a newer generation announced, a close, or the timer."""
        have = max(self.live_generation, self.fence.s.session_generation)
        self.session_failures += 1
        delay = min(SESSION_RECHECK.total_seconds(), 0.5 * 2 ** min(self.session_failures, 6))
        await self._wait(lambda: self.live_generation > have or self.fence.s.close_requested
                         or self.revocation is not None, timedelta(seconds=delay), WaitKind.SESSION)

    # --- subscribe -------------------------------------------------------------------

    async def _ensure_subscribed(self) -> bool:
        """Bind to the live session and (re)subscribe, or poll where the server has no usable subscribe.
        False when there is no usable session."""
        first, self.started = self.started, None
        if first is not None:  # the run's first ledger call found the session and began on it
            session, begun = first.session, first.begun
        else:
            query = SessionQuery(subject=self.key.subject, server=self.key.server)
            session, begun = await self.rt.ledger(Act.CURRENT_SESSION, query, SessionInfo), None
        if session is None:
            self.fence.explain("no live MCP session for this subject and server")
            self._publish()
            return False
        self.live_generation = max(self.live_generation, session.generation)
        bound = self.session is not None or self.carried_binding
        self.session = session
        if (bound and session.generation == self.fence.s.session_generation and self.fence.s.state == S.ACTIVE
                and self.fence.s.pending_trigger != TriggerReason.RESUBSCRIBE):
            # Already subscribed on this very session (this run, or the run before a continue-as-new,
            # which hands over its state without a gap): rebind without resubscribing. A reset run
            # resubscribes and re-reads (signals may be lost); a lost session sets RESUBSCRIBE.
            return True
        self.session_failures = 0
        snap = begun
        if snap is None:
            begin = BeginSubscriptionRequest(key=self.key, session_generation=session.generation)
            snap = await self._ledger(Act.BEGIN_SUBSCRIPTION, begin, FenceSnapshot)
        caps = {"subscribe": session.subscribe, "listChanged": session.list_changed}
        if not self.fence.subscribing(snap, session.edition, caps):
            # Refused (e.g. a reset run re-dispatched a begin for an older session): this run has
            # not subscribed. Without a binding the next pass subscribes on the live session and
            # publishes its bound, instead of rebinding to a subscription an older run made.
            self.session = None
            self._publish()
            return False
        self._publish()
        if session.subscribe:
            started = await self._start_cycle(session, snap)
            if started is not None and started.active is not None:
                return True  # the server took the subscription: the row was marked (and read) there
            if started is None or started.subscribe.session_generation != session.generation:
                self.session = None
                return False
            # Advertised but refused (nothing was marked): poll instead, publish the bound, never claim
            # real time.
            out = started.subscribe
            await self._audit("SUBSCRIBE_REJECTED", session.generation,
                              {"code": out.error_code, "error": (out.error or "")[:200]})
        mark = MarkActiveRequest(key=self.key, session_generation=session.generation,
                                 subscription_generation=snap.subscription_generation, read_reports=True)
        snap = await self._ledger(Act.MARK_ACTIVE, mark, FenceSnapshot)
        self.fence.subscribed(snap, poll_interval_seconds=self.options.poll_interval_seconds)
        self.fence.explain("polling: server has no usable subscribe")
        self._publish()
        return True

    async def _start_cycle(self, session: SessionInfo, snap: FenceSnapshot) -> SubscribeCycleResult | None:
        """Subscribe, mark ACTIVE and the initial read in one activity, mirrored as ``subscribed`` and
        ``_read`` would. None: it failed for good (what it did is unknown: the row stays SUBSCRIBING here,
        the next pass resubscribes). Without ``active``: the server refused, nothing was marked."""
        placeholder = self.fence.start_cycle_reserve()
        requested_at = self.rt.now()
        req = SubscribeCycleRequest(
            subscribe=SubscribeRequest(key=self.key, session_generation=session.generation),
            mark=MarkActiveRequest(key=self.key, session_generation=session.generation,
                                   subscription_generation=snap.subscription_generation, read_reports=True,
                                   safety_read_seconds=self._resync_period()),
            read=self._read_cycle(session.generation, snap.subscription_generation, TriggerReason.INITIAL,
                                  S.ACTIVE))
        started = await self._mcp(session, Act.MCP_SUBSCRIBE_CYCLE, req, SubscribeCycleResult)
        if started is None or started.active is None:
            self.fence.release_placeholder(placeholder)
            return started
        trigger = self.fence.start_cycle_subscribed(started.active, placeholder,
                                                    read=started.cycle is not None,
                                                    ledger_scheduled=req.mark.safety_read_seconds is not None)
        if self._watched():
            self.keeper.watch_due()  # armed now, so the details published below name it
        self.fence.explain("")
        self._publish()
        if trigger is not None:
            self._cycle_done(started.cycle, trigger, requested_at)
        return started

    # --- reads -------------------------------------------------------------------------

    def _start_read(self) -> None:
        trigger, placeholder = self.fence.reserve_read(self.options.max_concurrent_reads)
        self.reads_running += 1
        self.rt.spawn(self._read_task(trigger, placeholder))

    async def _read_task(self, trigger: TriggerReason, placeholder: int) -> None:
        try:
            await self._read(trigger, placeholder)
        finally:
            self.reads_running -= 1  # also when the run's coroutines are closed (no interpreter calls here)
        if not self._has_work():
            # Otherwise the main loop wakes in this same pass and upserts once when it blocks.
            self._flush_search_attributes()

    def _lost_session(self, ordinal: int | None = None) -> None:
        """Re-bind (the session host has, or will have, a new generation) and resubscribe."""
        self.fence.session_lost(ordinal)
        self.session = None
        self._publish()

    async def _read(self, trigger: TriggerReason, placeholder: int) -> None:
        """One activity allocates, reads and judges (``Act.MCP_READ_CYCLE``); the run applies what it
        did (``_cycle_done``)."""
        s = self.fence.s
        session = self.session
        requested_at = self.rt.now()
        assert session is not None
        req = self._read_cycle(s.session_generation, s.subscription_generation, trigger, s.state)
        try:
            cycle = await self._mcp(session, Act.MCP_READ_CYCLE, req, ReadCycleResult)
        finally:
            self.fence.release_placeholder(placeholder)
        self._cycle_done(cycle, trigger, requested_at)

    def _read_cycle(self, session_generation: int, subscription_generation: int, trigger: TriggerReason,
                    expected_state: SubscriptionState) -> ReadCycleRequest:
        """A read cycle on these generations: past the last ordinal this run knows, with a new request id."""
        s = self.fence.s
        allocate = AllocateRequest(key=self.key, session_generation=session_generation,
                                   subscription_generation=subscription_generation, trigger=trigger,
                                   min_ordinal=s.last_issued_ordinal + 1, request_id=self.rt.uuid4())
        return ReadCycleRequest(allocate=allocate, expected_state=expected_state, close_epoch=s.close_epoch)

    def _cycle_done(self, cycle: ReadCycleResult | None, trigger: TriggerReason,
                    requested_at: datetime) -> None:
        """A cycle the run scheduled (its own read, or its start's) came back; None: it failed for
        good. A granted read is applied by ``_apply_judged``; a refused one re-owes its trigger."""
        if cycle is None:
            # Failed for good: whether it allocated is unknown (an ordinal it burned stays burned; the
            # next allocation goes past it). As with a lost session: re-bind, and the resubscribe's read.
            self._lost_session()
            return
        if not self._apply_judged(cycle, requested_at=requested_at, trigger=trigger):
            assert cycle.fence is not None
            self.fence.refused(cycle.fence, trigger)
            self._publish()

    def _apply_judged(self, cycle: ReadCycleResult, *, requested_at: datetime,
                      trigger: TriggerReason | None) -> bool:
        """The one place a read cycle's answer changes the run's state, whoever read: the run or its
        start (for ``trigger``: in flight here until judged) or the ingress (reported, ``trigger``
        None: never in flight here, what it leaves dirty is handed over). In order: issue, arm the
        deadline, the verdict (coverage), digest, content time, detail, poll period. False: the
        ledger did not grant the read, nothing changed."""
        fence = self.fence
        reported = trigger is None
        ticket = cycle.ticket
        if not fence.issued(ticket, in_flight=not reported):
            return False
        if not reported or fence.report_deadline(requested_at):
            # From the request, not the grant: the ledger allocated no earlier, so the deadline is
            # never later than one period after the read the ledger records.
            jitter = self.rt.random()
            if self._resync_period() is not None and fence.s.staleness_bound_seconds is None:
                jitter = resynced_jitter(jitter)  # the ingress's sweep reads ahead of it
            fence.arm_read_deadline(requested_at=requested_at, period_seconds=self._read_period(),
                                    jitter=jitter)
        outcome, result = cycle.outcome, cycle.accept
        if outcome is None or result is None:  # the session was gone: nothing was judged
            self._lost_session(ticket.ordinal)
            return True
        if reported:
            fence.update_reported()
        # Content time: the read saw it somewhere between ``requested_at`` and now. The later bound is
        # the cautious one: a catalog word measured meanwhile counts as older than our read, so it
        # earns a verification read instead of being believed.
        seen_at = self.rt.now()
        fence.applied(ticket.ordinal, result, read_notified=ticket.notifications_seen, trigger=trigger)
        fence.accepted_digest(outcome.content_digest, result)
        fence.observed(result, allocated_at=seen_at, now=self.rt.now())
        fence.read_judged(ticket.ordinal, outcome, result)
        fence.read_directives(outcome)  # ttlMs / cacheScope / backoff: the next poll period
        self._publish()
        return True

    # --- revocation --------------------------------------------------------------------------

    async def _revoke(self) -> None:
        req, self.revocation = self.revocation, None
        assert req is not None
        revoke = RevokeLedgerRequest(key=self.key, reason=req.reason, source="platform",
                                     effective_at=req.effective_at or self.rt.now())
        snap = await self._ledger(Act.REVOKE, revoke, FenceSnapshot)
        self.fence.adopt(snap)
        if snap.state == S.REVOKED:
            self.fence.explain(f"revoked: {req.reason}")
        self._publish()

    async def _unsubscribe(self) -> bool:
        """Unsubscribe on the bound session when the run subscribed there (not polling). True when
        nothing was owed or the server acked it."""
        session = self.session
        if session is None or not session.subscribe or self.fence.s.staleness_bound_seconds:
            return True
        out = await self._mcp(session, Act.MCP_UNSUBSCRIBE,
                              UnsubscribeRequest(key=self.key, session_generation=session.generation),
                              UnsubscribeOutcome)
        return out is not None and out.acked

    # --- close ---------------------------------------------------------------------------

    async def _close(self) -> None:
        receipt = await self._ledger(Act.BEGIN_UNSUBSCRIBE, KeyRequest(key=self.key), CloseReceipt)
        self.fence.closing(receipt)
        self._publish()
        if receipt.state == S.UNSUBSCRIBING:
            finish = FinishUnsubscribeRequest(key=self.key, acked=await self._unsubscribe())
            snap = await self._ledger(Act.FINISH_UNSUBSCRIBE, finish, FenceSnapshot)
        else:
            snap = await self._ledger(Act.LOAD_FENCE, KeyRequest(key=self.key), FenceSnapshot)
        self.fence.unsubscribed(snap)
        self._publish()

    # --- continue-as-new -------------------------------------------------------------------

    async def _continue_as_new(self) -> None:
        rt = self.rt

        def drained() -> bool:
            return not self.reads_running and rt.all_handlers_finished()

        # A close update waits for the workflow to finish, so it never "finishes" here: serve a close,
        # revocation or conflict first and try again later. A resume update waits for the loop
        # likewise, and a reload may have left ACTIVE meanwhile.
        await self._wait(lambda: drained() or self.fence.s.close_requested or self.revocation is not None
                         or self.identity.conflict is not None or self.identity.resume_requested is not None
                         or self.fence.s.state != S.ACTIVE, None, WaitKind.CONTINUE_AS_NEW)
        if not drained():
            return
        self._flush_search_attributes()
        rt.continue_as_new(SubscriptionStart(
            key=self.key, options=self.options, carried_state=self.fence.s.model_dump(mode="json"),
            seen_signal_ids=self.seen_ids[-MAX_DEDUPE_IDS:]))

    # --- plumbing --------------------------------------------------------------------------

    async def _ledger(self, name: str, arg: Any, result_type: type[T]) -> T:
        result = await self.rt.ledger(name, arg, result_type)
        if result is None:
            raise RuntimeError(f"{name} returned nothing")
        return result

    async def _mcp(self, session: SessionInfo, name: str, arg: Any, result_type: type[T]) -> T | None:
        """An activity on the session host's queue; None when the session is unreachable."""
        self._flush_search_attributes()
        try:
            return await self.rt.mcp(session.task_queue, name, arg, result_type)
        except ActivityFailed as err:
            self.fence.explain(f"{name} failed: {err.cause}")
            return None

    async def _audit(self, kind: str, session_generation: int | None,
                     detail: dict[str, str | int | None]) -> None:
        audit = AuditRequest(kind=kind, key=self.key, session_generation=session_generation, detail=detail)
        await self._ledger(Act.AUDIT, audit, int)

    def _publish(self) -> None:
        self.publisher.details(self.fence, watched=self._watched())

    def _flush_search_attributes(self) -> None:
        self.publisher.search_attributes(self.fence)

    async def _wait(self, condition: Callable[[], bool], timeout: timedelta | None, kind: WaitKind) -> bool:
        self._flush_search_attributes()
        return await self.rt.wait(condition, timeout, kind)
