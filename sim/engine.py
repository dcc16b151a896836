"""One schedule of the simulator: the world, the production programs over it, the checker.

Contract:
- ``Simulation`` applies one ``Event`` at a time (an inapplicable event is a no-op, which keeps shrunk
  traces replayable), runs the workflow program (``sim.interpreter.ProgramRun`` over
  ``SubscriptionProgram``) until it blocks, carries out its commands as ``Activity`` entries, and
  checks every invariant (``sim.checker``). The session host's routing is the production program too
  (``sim.ingress`` over ``workflows/ingress.py``); the durable side is ``MemoryLedger``.
- It is composed, not inherited: the world's state is its own; ``checker`` (``Checker``), ``cycles``
  (``CycleRunner``) and ``ingress`` (``IngressDriver``) are objects with their own fields that read the
  world through it. Violations and coverage are recorded here (``violate``, ``cover``).
- Time advances one second per step; a TIMER event jumps it to the armed timer's fire time, a SETTLE
  event to the first settling key's due time when that is later, a SWEEP event to the row's next due
  verification. While the ingress sweeps, no jump passes that due time (a timer beyond it waits), and
  after every step the sweep looks if the clock reached it (``IngressDriver.sweep``).
- ``drain`` is the quiet end: everything delivered and completed, timers fired, pending catalog and
  resume words given, one final invalidation, to quiescence; then the verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from mcpsync.workflows.coverage import dirty
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.read_cycle import ReadReport
from mcpsync.workflows.records.subscription import (
    TERMINAL_STATES,
    CatalogObservation,
    IdentityConflict,
    ResourceUpdated,
    RevokeRequest,
    SubscriptionOptions,
    SubscriptionStart,
)
from mcpsync.workflows.records.subscription import SubscriptionState as S
from mcpsync.workflows.subscription_program import WaitKind
from mcpsync.workflows.subscription_state import UpdateDisposition
from sim.checker import Checker
from sim.cycles import CycleRunner, SimSessionActivities
from sim.ingress import IngressDriver
from sim.interpreter import ENDED, RUNNING, ContinueAsNew, ProgramRun, ScheduleActivity, Signal
from sim.ledger import LEDGER_ACTIVITIES, LedgerIntegrityError, MemoryLedger
from sim.model import (
    EPOCH,
    FLUSH_BUDGET,
    KEY,
    MCP_ACTIVITIES,
    WRONG_URI,
    Event,
    Invariant,
    Op,
    Profile,
    ScheduleResult,
    SimConfig,
    Violation,
)
from sim.model import event as make_event
from sim.world import Activity, Checkpoint, McpServer, Message, Oracle

V = AcceptVerdict
ONE_STEP = timedelta(seconds=1)
OP_LABELS = {op: f"op.{op.value}" for op in Op}  # coverage names of applied events
_UPDATE_LABELS = {d: f"update.{d.value}" for d in UpdateDisposition}  # ... of the run's noted updates
# Events for the running chain: inapplicable once it has completed (RESTART is for a completed one).
CHAIN_OPS = frozenset({Op.CLOSE, Op.TIMER, Op.CAN, Op.CHECKPOINT, Op.CATALOG, Op.CONFLICT, Op.RESUME,
                       Op.FIRST_READ, Op.REVOKE})
# Read once: on Python 3.11 an ``Enum`` class attribute goes through the metaclass's ``__getattr__`` hook
# (about ten times a plain attribute), and these are compared on every step.
_TIMER, _SETTLE, _COMPLETE, _EXEC, _DELIVER = Op.TIMER, Op.SETTLE, Op.COMPLETE, Op.EXEC, Op.DELIVER
_DELETE, _RECREATE, _SWEEP = Op.DELETE, Op.RECREATE, Op.SWEEP
_CURRENT = (V.ACCEPTED, V.UNCHANGED)
_CONFIRM_TOMBSTONE, _MCP_UNSUBSCRIBE, _REVOKED = Act.CONFIRM_TOMBSTONE, Act.MCP_UNSUBSCRIBE, S.REVOKED
_CYCLES = frozenset({Act.MCP_READ_CYCLE, Act.MCP_SUBSCRIBE_CYCLE})
_REVOKE = RevokeRequest(reason="simulated platform revocation")  # frozen records: one a process


@cache
def _start(max_concurrent_reads: int, safety_read_seconds: float) -> SubscriptionStart:
    """A new chain's start: the same frozen record for every chain of a profile, so one a process."""
    return SubscriptionStart(key=KEY, options=SubscriptionOptions(
        max_concurrent_reads=max_concurrent_reads, poll_interval_seconds=30.0,
        safety_read_seconds=safety_read_seconds))


class Simulation:
    """One schedule: environment + workflow chain + ledger + checker (the module's contract)."""

    def __init__(self, seed: str, profile: Profile, config: SimConfig) -> None:
        self.seed = seed
        self.profile = profile
        self.config = config
        self.oracle = Oracle()
        self.ledger = MemoryLedger(KEY, judge=config.judge, seed=seed)
        self.ledger.now = EPOCH
        self.host = McpServer(profile.capability, self.ledger)
        self.cycles = CycleRunner(SimSessionActivities(self.host, self.oracle, self.ledger), self.cover)
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
        self.last_activity_id = 0
        self.last_note_id = 0
        self._scan = 0
        self._picked: tuple[Event, Activity] | None = None  # the last event ``picking`` made, and its pick
        self.coverage: dict[str, int] = {}
        self.signals_erased = False  # a reset without reapply dropped delivered signals
        self.now = EPOCH  # the time of the event being applied
        self.exists_history: list[bool] = [True]  # the oracle's ``exists`` after each step (catalog lag)
        self.checker = Checker(self)
        self.ingress = IngressDriver(self, read_on_notification=config.read_on_notification)
        # metrics
        self.last_change_step = 0
        self.duplicate_deliveries = 0
        if profile.session_at_start:
            self.host.open()
        self.wf = self._new_chain()
        self._activate()
        self.checker.check()

    # --- plumbing ----------------------------------------------------------------------------------

    @property
    def chain_running(self) -> bool:
        return self.wf.stage not in ENDED

    def cover(self, name: str) -> None:
        self.coverage[name] = self.coverage.get(name, 0) + 1

    def violate(self, invariant: Invariant, detail: str) -> None:
        self.violations.append(Violation(invariant, self.step, detail))

    def next_activity_id(self) -> int:
        self.last_activity_id += 1
        return self.last_activity_id

    def next_note_id(self) -> int:
        self.last_note_id += 1
        return self.last_note_id

    def _program_run(self, start: SubscriptionStart, incarnation: str) -> ProgramRun:
        wf = ProgramRun(start, incarnation, f"c{self.chain}r{self.run}", EPOCH, self.times[self.step])
        wf.start()
        return wf

    def _new_chain(self) -> ProgramRun:
        self.chain += 1
        self.run += 1
        self.checkpoints.clear()
        self.signal_log.clear()
        return self._program_run(_start(self.profile.max_concurrent_reads, self.profile.safety_read_seconds),
                                 f"chain{self.chain}")

    def _activate(self) -> None:
        """Run the workflow until blocked and carry out its commands (repeat for continue-as-new)."""
        while True:
            wf = self.wf
            wf.clock = self.times[self.step]
            if wf.stage == RUNNING:
                wf.activate()
            if wf.errors:
                for err in wf.errors:
                    invariant = Invariant.LIVELOCK if err.startswith("livelock") else Invariant.WORKFLOW_ERROR
                    self.violate(invariant, err)
                wf.errors.clear()
            if wf.notes:
                for _nid, disposition in wf.notes:
                    self.cover(_UPDATE_LABELS[disposition])
                wf.notes.clear()
            if not wf.commands:  # most steps: the run was not activated, or scheduled nothing
                return
            commands, wf.commands = wf.commands, []
            can: ContinueAsNew | None = None
            for cmd in commands:
                if isinstance(cmd, ScheduleActivity):
                    self.activities.append(Activity(self.next_activity_id(), self.run, cmd.seq, cmd.name,
                                                    cmd.arg))
                else:
                    can = cmd
            if can is None:
                return
            self.cover("continue_as_new")
            self.run += 1
            self.wf = self._program_run(can.start, wf.incarnation)

    def _signal(self, kind: Signal, payload: Any, *, log: bool = True) -> None:
        """Deliver a signal or update to the running chain (dropped when it has completed)."""
        if not self.chain_running:
            return
        if log:
            self.signal_log.append((kind, payload))
        self.wf.signal(kind, payload)

    def _next_time(self, event: Event) -> datetime:
        """One second after the last step; a TIMER event fires the armed timer at its time."""
        at = self.times[self.step] + ONE_STEP
        if event.op == _TIMER and self.chain_running:
            timer_at = self.wf.timer_at
            if timer_at is not None and timer_at > at:
                at = timer_at
        elif event.op == _SETTLE:
            due = self.ingress.settle_due()
            if due is not None and due > at:
                at = due
        elif event.op == _SWEEP:
            due = self.ingress.sweep_due()
            if due is not None and due > at:
                at = due
        return at

    def _candidates(self, name: str, *, executed: bool) -> list[Activity]:
        """What an EXEC (``executed`` False) or a COMPLETE (True: of the current run) event may pick."""
        return [a for a in self.activities if a.name == name and a.executed == executed and not a.poisoned
                and (not executed or a.run == self.run)]

    def _find(self, e: Event, *, executed: bool) -> Activity | None:
        """The activity the EXEC or COMPLETE event ``e`` picks. An event ``picking`` just made is
        applied before anything else changes: its pick is taken as it is (the same one the index
        finds), not searched for again."""
        picked, self._picked = self._picked, None
        if picked is not None and picked[0] is e:
            return picked[1]
        matches = self._candidates(e.act, executed=executed)
        return matches[e.n % len(matches)] if matches else None

    def picking(self, op: Op, act: Activity, fault: str = "") -> Event:
        """The EXEC (or COMPLETE) event that picks ``act``: its index among ``_candidates``."""
        executed, name, run = op == _COMPLETE, act.name, self.run
        n = 0
        for a in self.activities:
            if a is act:
                event = make_event(op, n, name, fault)
                self._picked = (event, act)
                return event
            if a.name == name and a.executed == executed and not a.poisoned \
                    and (not executed or a.run == run):
                n += 1
        raise ValueError(f"{act} is not scheduled")

    # --- events ------------------------------------------------------------------------------------

    def apply(self, event: Event) -> bool:
        """Apply one event, run the workflow to quiescence, check every invariant."""
        at = self._next_time(event)
        self.wf.clock = self.now = self.ledger.now = at
        applied = self._apply(event)
        # The pick ``picking`` made is for this event alone: an equal event is the same object (``event``).
        self._picked = None
        if applied:
            self.ingress.sweep()
            self.step += 1
            self.times.append(at)
            self.exists_history.append(self.oracle.digest is not None)  # ``Oracle.exists``
            self.events.append(event)
            coverage, label = self.coverage, OP_LABELS[event.op]  # ``cover``
            coverage[label] = coverage.get(label, 0) + 1
            self._activate()
            self.checker.check()
        return applied

    def _apply(self, e: Event) -> bool:
        if e.op in CHAIN_OPS and not self.chain_running:
            return False
        return _APPLY[e.op](self, e)

    def _on_change(self, e: Event) -> bool:
        op = e.op
        if (op == _RECREATE) == self.oracle.exists:
            return False
        tokens = e.fault.split("+")
        if op == _DELETE:
            self.oracle.delete()
        else:
            self.oracle.mutate(unsafe="unsafe" in tokens)
        self.last_change_step = self.step + 1
        self.ingress.notify(e.n, "same_id" in tokens)
        return True

    def _on_deliver(self, e: Event) -> bool:
        if not self.queue:
            return False
        msg = self.queue.pop(e.n % len(self.queue))
        if msg.notification_id is not None and msg.notification_id in self.wf.program.seen_ids:
            self.duplicate_deliveries += 1
        if isinstance(msg.payload, ReadReport):
            self.cover("ingress.report_delivered")
            cycle = msg.payload.cycle
            if self.chain_running and cycle.accept is not None \
                    and cycle.ticket.ordinal < self.wf.fence.s.last_accepted_ordinal \
                    and cycle.accept.verdict in _CURRENT:
                # A report older than a verdict the run already holds: ``fence.accepted_digest`` keeps
                # the newer digest.
                self.cover("ingress.report_older_than_view")
        self._signal(msg.kind, msg.payload)
        return True

    def _on_old_note(self, e: Event) -> bool:
        live = self.host.generation
        if live < 2:
            return False
        gen = max(1, live - 1 - e.n)
        if (old := self.ingress.route(gen, f"old{self.next_note_id()}")) is not None:
            self.queue.append(old)
        return True

    def _on_wrong_uri(self, e: Event) -> bool:
        """No row for the variant: ``UnknownUri``."""
        gen = self.host.generation  # the live session's, or the last one's
        if (wrong := self.ingress.route(gen, f"w{self.next_note_id()}", WRONG_URI)) is not None:
            self.queue.append(wrong)
        return True

    def _on_final_note(self, e: Event) -> bool:
        gen = self.host.generation
        # None: the work is owned already (a read in flight or owed)
        final = self.ingress.route(gen, "final")
        if final is None and self.signals_erased and dirty(self.ledger.row) \
                and not self.checker.work_owned():
            # A reset without reapply erased the signal that owned the row's work: nothing else
            # owns it, and a note on a dirty row creates none. The safety read repays it; the
            # drain delivers the final note as the operator's re-signal would (docs/faults.md).
            self.cover("final_note_after_erased_signals")
            final = Message(Signal.UPDATED, ResourceUpdated(uri=KEY.uri, session_generation=gen))
        if final is not None:
            self._signal(final.kind, final.payload, log=False)
        return True

    def _on_settle(self, e: Event) -> bool:
        return self.ingress.release()

    def _on_close(self, e: Event) -> bool:
        self._signal(Signal.CLOSE_SIGNAL if e.fault == "signal" else Signal.CLOSE, None)
        return True

    def _on_exec(self, e: Event) -> bool:
        act = self._find(e, executed=False)
        if act is None:
            return False
        self._execute(act, e.fault)
        return True

    def _on_complete(self, e: Event) -> bool:
        act = self._find(e, executed=True)
        if act is None:
            return False
        self.activities.remove(act)
        if act.result is None and act.name in MCP_ACTIVITIES:
            # retries exhausted: the program sees ActivityFailed
            self.wf.fail(act.seq, "ApplicationError")
        else:
            self.wf.complete(act.seq, act.result)
        return True

    def _on_timer(self, e: Event) -> bool:
        kind = self.wf.pending_timer
        held = self.ingress.sweep_on and self.ingress.holds(self.wf.timer_at)  # a due row comes first
        if kind and not held and self.wf.fire_timer():
            self.cover(f"timer.{kind}")
            return True
        return False

    def _on_reconnect(self, e: Event) -> bool:
        if self.host.live is None:
            return False
        self.host.drop()
        if e.n == 0:
            self.queue.append(Message(Signal.SESSION_CHANGED, self.host.open()))
        return True

    def _on_session_open(self, e: Event) -> bool:
        if self.host.live is not None:
            return False
        self.queue.append(Message(Signal.SESSION_CHANGED, self.host.open()))
        return True

    def _on_can(self, e: Event) -> bool:
        if self.wf.can_suggested:
            return False
        self.wf.suggest_continue_as_new()
        return True

    def _on_checkpoint(self, e: Event) -> bool:
        self._checkpoint()
        return True

    def _on_reset(self, e: Event) -> bool:
        if not self.checkpoints:
            return False
        self._reset(self.checkpoints[-1 - e.n % len(self.checkpoints)], reapply=e.fault == "reapply")
        return True

    def _on_catalog(self, e: Event) -> bool:
        self._scan += 1
        measured = max(0, self.step - e.n)  # a scan measured n steps ago arrives now
        proven = e.fault == "proven"
        self.cover("catalog.proven" if proven else "catalog.unproven")
        self._signal(Signal.CATALOG, CatalogObservation(
            uri=KEY.uri, listed=self.exists_history[measured], scan_id=f"scan{self._scan}",
            snapshot_status="SNAPSHOT_PROVEN" if proven else "SNAPSHOT_UNPROVEN",
            session_generation=self.host.generation, measured_at=self.times[measured]))
        return True

    def _on_conflict(self, e: Event) -> bool:
        self._signal(Signal.CONFLICT, IdentityConflict(observed_uri=WRONG_URI, reason="normalizes alike",
                                                  session_generation=self.host.generation))
        return True

    def _on_resume(self, e: Event) -> bool:
        if self.wf.fence.s.state != S.RECONCILIATION_REQUIRED:
            return False
        self._signal(Signal.RESUME, None)
        return True

    def _on_first_read(self, e: Event) -> bool:
        self._signal(Signal.FIRST_READ, None)
        return True

    def _on_revoke(self, e: Event) -> bool:
        self._signal(Signal.REVOKE, _REVOKE)
        return True

    def _on_restart(self, e: Event) -> bool:
        if self.chain_running:
            return False
        self.wf = self._new_chain()
        return True

    def _execute(self, act: Activity, fault: str) -> None:
        """Run an activity's side effect now. ``lost``: it took effect but its response is lost, so
        Temporal runs it again later (at-least-once)."""
        if act.ingress is not None:
            self.ingress.step(act, fault)
            return
        name, arg = act.name, act.arg
        result: Any
        try:
            if name in LEDGER_ACTIVITIES:
                before = self.ledger.row.state
                result = LEDGER_ACTIVITIES[name](self.ledger, arg)
                if name == _CONFIRM_TOMBSTONE and result.state == _REVOKED and before != _REVOKED \
                        and self.oracle.exists:
                    # a late proven word revoked a resource that exists
                    self.cover("catalog_revoked_existing")
            elif name == _MCP_UNSUBSCRIBE:
                result = self.host.unsubscribe(arg, ack_lost=fault == "ack_lost")
                if fault == "ack_lost":
                    self.cover("unsubscribe_ack_lost")
            elif name in _CYCLES:
                done, result = self.cycles.step(act, fault)
                if fault == "lost":  # the attempt died after this step's effect: the retry starts over
                    act.cycle, act.step = None, 0
                if not done:
                    if fault == "lost":
                        self.cover("lost_response.read_cycle_step")
                    return
            else:
                raise ValueError(f"unknown activity {name}")
        except LedgerIntegrityError as err:
            act.poisoned = True
            self.violate(Invariant.LEDGER_INTEGRITY, f"{name} (retried forever): {err}")
            return
        if fault == "lost":
            self.cover(f"lost_response.{name}")
            return  # the activity stays scheduled: its retry runs the side effect again
        if act.run != self.run:
            self.activities.remove(act)  # an orphan of a reset run: it landed, nobody listens
            self.cover("orphan_landed")
            return
        act.executed, act.result = True, result

    def _checkpoint(self) -> None:
        wf = self.wf
        self.checkpoints.append(Checkpoint(wf, len(wf.log), len(wf.draws), len(self.signal_log)))
        if len(self.checkpoints) > 8:
            self.checkpoints.pop(0)

    def _reset(self, cp: Checkpoint, *, reapply: bool) -> None:
        """Temporal reset: the current run ends (its started activities may still land), a new run
        replays to the checkpoint, then reschedules the activities pending there."""
        self.cover("reset")
        self.run += 1
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
            self.cover("reset_reapply")
            for kind, payload in later:
                self._signal(kind, payload)

    # --- drain -------------------------------------------------------------------------------------------

    def _flush(self) -> bool:
        """Deliver everything pending in FIFO order, no faults, then release settling keys. False if it
        would not quiesce."""
        for _ in range(FLUSH_BUDGET):
            if self.queue:
                self.apply(make_event(_DELIVER))
                continue
            # The current run first; activities of a reset run land last, as a slow old worker would.
            # The first runnable, the first of the current run (or the ingress's) and the first done, in
            # one pass.
            run = self.run
            runnable = current = done = None
            for a in self.activities:
                if a.executed:
                    if done is None and a.run == run:
                        done = a
                elif not a.poisoned:
                    if runnable is None:
                        runnable = a
                    if a.run == run or a.ingress is not None:
                        current = a
                        break  # it comes first: the others are not needed
            if current is not None:
                self.apply(self.picking(_EXEC, current))
            elif done is not None:
                self.apply(self.picking(_COMPLETE, done))
            elif runnable is not None:
                self.apply(self.picking(_EXEC, runnable))
            elif self.ingress.router.work.settling:
                self.apply(make_event(Op.SETTLE))
            else:
                return True
        return False

    def drain(self) -> None:
        """Quiet end: the session host is up (its sweep stopped: the timers fire as they are due),
        every message and activity completes, timers fire, pending catalog/resume words arrive, then
        one final invalidation; to quiescence."""
        self.ingress.sweep_on = False
        if self.host.live is None:
            self.apply(Event(Op.SESSION_OPEN))
        final_sent = False
        for attempt in range(8):
            if not self._flush():
                self.violate(Invariant.NO_CONVERGENCE, "drain did not quiesce")
                return
            if attempt == 0:
                self.checker.check_covered()
            wf = self.wf
            if not self.chain_running:
                break
            state = wf.fence.s.state
            # poll / safety / recheck
            if wf.pending_timer and (wf.main_wait == WaitKind.SESSION or not final_sent):
                self.apply(Event(Op.TIMER))
                continue
            if state == S.TOMBSTONE_PENDING and wf.program.identity.catalog is None:
                self.apply(Event(Op.CATALOG))
                continue
            if state == S.RECONCILIATION_REQUIRED and wf.program.identity.resume_requested is None:
                self.apply(Event(Op.RESUME))
                continue
            if not final_sent:
                final_sent = True
                self.checker.count_reads = False
                self.apply(Event(Op.FINAL_NOTE))
                continue
            break
        self.checker.verdict()

    def result(self) -> ScheduleResult:
        converged_after = None
        row = self.ledger.row
        converged_since = self.checker.converged_since
        if not self.violations and row.state not in TERMINAL_STATES and converged_since is not None:
            converged_after = max(0, converged_since - self.last_change_step)
        return ScheduleResult(seed=self.seed, profile=self.profile, events=list(self.events),
                              violations=list(self.violations), steps=self.step,
                              converged_after=converged_after,
                              notification_reads=self.checker.notification_reads,
                              fresh_reads=self.checker.fresh_reads,
                              duplicate_deliveries=self.duplicate_deliveries,
                              covered_updates=self.ingress.covered_reads_saved, coverage=dict(self.coverage),
                              read_on_notification=self.config.read_on_notification)


# What each event does (``Simulation._apply``): one method per op.
_APPLY: dict[Op, Callable[[Simulation, Event], bool]] = {
    Op.MUTATE: Simulation._on_change,
    Op.DELETE: Simulation._on_change,
    Op.RECREATE: Simulation._on_change,
    Op.DELIVER: Simulation._on_deliver,
    Op.OLD_NOTE: Simulation._on_old_note,
    Op.WRONG_URI: Simulation._on_wrong_uri,
    Op.FINAL_NOTE: Simulation._on_final_note,
    Op.SETTLE: Simulation._on_settle,
    Op.CLOSE: Simulation._on_close,
    Op.EXEC: Simulation._on_exec,
    Op.COMPLETE: Simulation._on_complete,
    Op.TIMER: Simulation._on_timer,
    Op.RECONNECT: Simulation._on_reconnect,
    Op.SESSION_OPEN: Simulation._on_session_open,
    Op.CAN: Simulation._on_can,
    Op.CHECKPOINT: Simulation._on_checkpoint,
    Op.RESET: Simulation._on_reset,
    Op.CATALOG: Simulation._on_catalog,
    Op.CONFLICT: Simulation._on_conflict,
    Op.RESUME: Simulation._on_resume,
    Op.FIRST_READ: Simulation._on_first_read,
    Op.REVOKE: Simulation._on_revoke,
    Op.RESTART: Simulation._on_restart,
    Op.SWEEP: lambda sim, e: sim.ingress.on_sweep(e),
    Op.SWEEP_OFF: lambda sim, e: sim.ingress.on_sweep_off(e),
    Op.SWEEP_ON: lambda sim, e: sim.ingress.on_sweep_on(e),
}
