"""The session host's routing program (``workflows/ingress.py``) run over the simulated world.

Contract:
- ``IngressDriver`` is one object of a ``Simulation`` (``sim.ingress``) with its own fields (the
  production ``IngressRouter`` and the pulses it was offered). A notification that reaches the session
  host is offered to the router; a key that becomes ready is processed at once
  (``IngressRouter.process``), its effects performed over the world: the note on ``MemoryLedger``,
  signals and reports queued as messages to the workflow, and the read cycle as the ``INGRESS_READ``
  pseudo-activity whose three steps (allocate, read, accept) are events of their own, so
  notifications, deliveries and resets interleave with it. The program's ``absorb`` runs at the read
  step, once the allocation is granted, as in ``McpSessionActivities.run_cycle``.
- What the checker needs to know about the world (which oracle version a note or an absorbed pulse
  announced, which ordinals the ingress was granted) is recorded here, next to the effects; the
  routing decisions are the program's alone.
- Time is the simulation's clock in seconds since ``EPOCH``: each pulse is offered with it, and a key
  the program left settling (``Turn.SETTLING``) is processed by the ``settle`` event (``release``),
  which the engine applies no earlier than the key is due.
- The sweep of the ledger's due verifications is production's ``Resync.look``
  (``worker/ingress/resync.py``: room, ``due``, ``feed`` into the router's background lane) over
  ``MemoryLedger.due``. While the ingress sweeps (``sweep_on``, the profile's start, the
  ``sweep_off`` / ``sweep_on`` events) on a live session, it looks whenever the clock reached the
  row's due time (``sweep``, after every step), and the clock never jumps past that time (``holds``:
  a timer beyond it waits; the ``sweep`` event jumps to it). A healthy ingress's work follows its look
  at once (``_dispatch``, the dispatch the simulator models): the fed key's read is allocated in the
  look's step; its read and accept are events of their own.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from mcpsync.activities.ledger.verification import Due
from mcpsync.worker.ingress.resync import Resync, ResyncHost
from mcpsync.workflows.ingress import Effect as IngressEffect
from mcpsync.workflows.ingress import (
    IngressRouter,
    Key,
    Note,
    Offer,
    ReadCycle,
    ReportRead,
    SignalUpdated,
    Stamp,
    Stamped,
    Turn,
    UnknownUri,
)
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.read_cycle import ReadCycleResult
from mcpsync.workflows.records.subscription import ResourceUpdated
from sim.interpreter import Signal
from sim.ledger import LedgerIntegrityError, MemoryLedger
from sim.model import EPOCH, INGRESS_READ, KEY, Event, Invariant
from sim.world import Activity, Message

if TYPE_CHECKING:
    from sim.engine import Simulation

__all__ = ["Processing", "IngressDriver"]

_VERDICT_LABELS = {v: f"ingress.verdict.{v.value}" for v in AcceptVerdict}  # coverage names, made once
# Read once (an ``Enum`` class attribute goes through the metaclass's slow ``__getattr__`` on 3.11).
_OFFER_READY, _READY, _SETTLING = Offer.READY, Turn.READY, Turn.SETTLING
_UPDATED, _READ_REPORTED = Signal.UPDATED, Signal.READ_REPORTED
SWEPT = "s"  # the ingress id of the sweep's synthetic notes starts so (a notification's: "n", "old", "w")


@dataclass(slots=True)
class Processing:
    """One run of ``IngressRouter.process`` for a key: the suspended program and what the world
    knows about it (the pulse it stands for, the change it announced, what its read absorbed)."""

    program: Generator[IngressEffect, Any, Turn]
    nid: str = ""  # the ingress id of the newest pulse it processes
    change: int = 0  # the newest oracle version those pulses announced
    generation: int = 0
    taken: bool = False  # it took its key's pulses (at the key's note, or at its stamp after a look)
    no_work_before: int = 0
    cycle: ReadCycle | None = None  # the read cycle it waits for
    absorbed: int = 0  # pulses its read took (``AcceptRequest.absorbed``)
    absorbed_change: int = 0  # the newest change they announced
    synchronous: bool = True  # still inside the call that offered the pulse
    signalled: list[Message] = field(default_factory=list)  # wake-ups it signalled synchronously


class _SweepHost:
    """What ``Resync.look`` asks of its session host (``host.ledger.verification.due``), on the model."""

    def __init__(self, ledger: MemoryLedger) -> None:
        self.ledger = self
        self.verification = self
        self._memory = ledger

    async def due(self, subject: str, server: str, *, limit: int = 500, ahead: float = 0.0,
                  generation: int | None = None) -> Due:
        return self._memory.due(subject, server, limit=limit, ahead=ahead, generation=generation)


class IngressDriver:
    """Performs the routing program's effects over the world of ``sim`` (the module's contract)."""

    def __init__(self, sim: Simulation, *, read_on_notification: bool) -> None:
        self.sim = sim
        # the session host's routing program (production's), its work queue keyed (URI, generation)
        self.router = IngressRouter(KEY.subject, KEY.server, host_id="sim",
                                    read_on_notification=read_on_notification)
        # per key: the newest pulse's id and change since it was got
        self._pulses: dict[Key, tuple[str, int]] = {}
        self.covered_reads_saved = 0  # notes that created no work (``coverage.plan_note``)
        # the session host's sweep (production's), and whether it runs
        self.resync = Resync(self.router, subject=KEY.subject, server=KEY.server, ready=self._swept,
                             host=cast(ResyncHost, _SweepHost(sim.ledger)))
        self.sweep_on = sim.profile.sweep

    def notify(self, copies: int, same_id: bool) -> None:
        """The server announces the oracle's newest change on the live session, ``copies`` times
        (``same_id``: Temporal delivers the first routed wake-up again instead)."""
        live = self.sim.host.live
        if live is None or live.generation not in self.sim.host.subscribed:
            return  # nobody subscribed on the live session: the server sends nothing
        note = self.sim.next_note_id()
        first: Message | None = None
        for i in range(copies):
            if same_id and first is not None:
                self.sim.queue.append(first)  # the same routed signal delivered again (one ingress id)
                continue
            nid = f"n{note}" if i == 0 else f"n{note}.{i}"
            first = self.route(live.generation, nid, change=self.sim.oracle.version)
            if first is not None:
                self.sim.queue.append(first)

    def route(self, generation: int, nid: str, uri: str = KEY.uri, change: int = 0) -> Message | None:
        """A notification reaches the session host (``SessionHost._enqueue``): offered to the router's
        work queue, and a key that became ready is processed now. Answers the ``resource_updated``
        message the processing signalled before it waited for anything (the caller queues it), or None."""
        key = (uri, generation)
        _, prior = self._pulses.get(key, ("", 0))
        self._pulses[key] = (nid, max(prior, change))
        if self.router.offer(uri, generation, now=self._seconds(self.sim.now)) != _OFFER_READY:
            self.sim.cover("ingress.queued")
            return None
        signalled = self._process()
        return signalled[0] if signalled else None

    @staticmethod
    def _seconds(at: datetime) -> float:
        return (at - EPOCH).total_seconds()

    def settle_due(self) -> datetime | None:
        """When the first settling key is due (None: none settles)."""
        due = self.router.work.next_due()
        return None if due is None else EPOCH + timedelta(seconds=due)

    def release(self) -> bool:
        """The session host's settle timer: every settling key due now is processed (True: any was)."""
        released = self.router.release(self._seconds(self.sim.now))
        for _ in range(released):
            self.sim.cover("ingress.settled")
            self.sim.queue.extend(self._process())
        return released > 0

    def _process(self) -> list[Message]:
        p = Processing(self.router.process(), no_work_before=self.router.no_work)
        self._resume(p, None)
        p.synchronous = False
        return p.signalled

    def _resume(self, p: Processing, answer: Any) -> None:
        """Run ``p``'s program until it waits for its read cycle or ends."""
        while True:
            try:
                effect = p.program.send(answer)
            except StopIteration as stop:
                if self.router.no_work > p.no_work_before:
                    self.sim.cover("update.ingress_no_work")
                    self.covered_reads_saved += 1
                if stop.value == _READY:  # the key is ready again
                    self.sim.cover("ingress.queued_routed")
                    self.sim.queue.extend(self._process())
                elif stop.value == _SETTLING:
                    self.sim.cover("ingress.settling")
                return
            if isinstance(effect, ReadCycle):
                self._start_read(p, effect)
                return
            answer = self._perform(p, effect)

    def _perform(self, p: Processing, effect: IngressEffect) -> Any:
        if isinstance(effect, Note):
            self._takes(p, effect.uri, effect.generation)
            counted = self.sim.ledger.row.notifications_seen
            noted = (self.sim.ledger.note_notification(effect.generation, count=effect.count)
                     if effect.uri == KEY.uri else None)
            if noted is not None and noted.fence.notifications_seen > counted:
                # the checker holds the change to the count this note made (a note from a session the
                # row has left is not counted: it announces nothing about the current one)
                self.sim.checker.noted(noted.fence.notifications_seen, p.change)
            return noted
        if isinstance(effect, UnknownUri):
            # No row for a URI variant. The world lets its wake-up reach the workflow anyway (production's
            # ingress audits it instead): that exercises ``resource_updated``'s WRONG_URI defence.
            self._signalled(p, Message(_UPDATED, ResourceUpdated(
                uri=effect.uri, session_generation=effect.generation, notification_id=p.nid)))
            return None
        if isinstance(effect, Stamp):
            if not p.taken:  # the sweep's look stood for the key's note
                self._takes(p, effect.uri, effect.generation)
            live = self.sim.host.live
            update = ResourceUpdated(uri=effect.uri, session_generation=effect.generation,
                                     received_at=self.sim.now, notification_id=p.nid)
            return Stamped(update, self.sim.now, f"ingress-{self.sim.last_activity_id + 1}",
                           live.generation if live is not None else None)
        if isinstance(effect, SignalUpdated):
            if p.cycle is not None:
                self.sim.cover("ingress.fallback")
            self._signalled(p, Message(_UPDATED, effect.update))
            return True
        if isinstance(effect, ReportRead):
            self.sim.cover("ingress.report")
            self.sim.queue.append(Message(_READ_REPORTED, effect.report))
            return True
        return []  # Siblings: the world has one URI; nothing else is asked of it

    def _takes(self, p: Processing, uri: str, generation: int) -> None:
        """``p`` routes (``uri``, ``generation``): it stands for the pulses that key holds."""
        p.nid, p.change = self._pulses.pop((uri, generation), (p.nid, p.change))
        p.generation = generation
        p.taken = True

    def _signalled(self, p: Processing, msg: Message) -> None:
        if p.synchronous:
            p.signalled.append(msg)
        else:
            self.sim.queue.append(msg)

    def _start_read(self, p: Processing, cycle: ReadCycle) -> None:
        p.cycle = cycle
        self.sim.activities.append(Activity(self.sim.next_activity_id(), 0, 0, INGRESS_READ, cycle.request,
                                            ingress=p))
        self.sim.cover("ingress.read")

    def step(self, act: Activity, fault: str) -> None:
        """One step of the ingress's read (``McpSessionActivities.run_cycle``, via ``CycleRunner.step``).
        No retry: a step whose answer is lost (``lost``: it took effect) or a read that failed makes
        ``run_cycle`` raise, and the program falls back to ``resource_updated``."""
        p = act.ingress
        assert p is not None and p.cycle is not None
        absorb = None if p.cycle.absorb is None else partial(self._absorb, p)
        try:
            done, result = self.sim.cycles.step(act, fault, p.cycle.cycle_id, absorb)
        except LedgerIntegrityError as err:
            self.sim.violate(Invariant.LEDGER_INTEGRITY, f"{act.name}: {err}")
            done, result = True, None
        if act.ticket is not None:
            self.sim.checker.ingress_granted(act.ticket.ordinal, swept=p.nid.startswith(SWEPT))
            rr = self.sim.ledger.read_requests.get(act.ticket.ordinal)
            if p.absorbed and rr is not None and rr["completed_at"] is not None:
                # counted by the accept (a lost answer too: it took effect): the checker holds the
                # change to that count
                self.sim.checker.absorbed(act.ticket.notifications_seen + p.absorbed, p.absorbed_change)
                p.absorbed = 0
        if fault == "lost":
            self.sim.cover("ingress.lost_response")
            done, result = True, None
        if done:
            self.sim.activities.remove(act)
            if isinstance(result, ReadCycleResult) and result.judged:
                assert result.accept is not None
                self.sim.cover(_VERDICT_LABELS[result.accept.verdict])
            self._resume(p, result if isinstance(result, ReadCycleResult) else None)

    def _absorb(self, p: Processing) -> int:
        """The program's ``absorb`` (``WorkQueue.take``), which ``run_cycle`` calls once the read is
        allocated, before it is sent; the checker learns which change the pulses it took announced."""
        assert p.cycle is not None and p.cycle.absorb is not None
        taken = p.cycle.absorb()
        if taken:
            self.sim.cover("ingress.absorbed")
            _, p.absorbed_change = self._pulses.pop((KEY.uri, p.generation), ("", 0))
            p.absorbed = taken
        return taken

    # --- the sweep --------------------------------------------------------------------------------

    def sweep_due(self) -> datetime | None:
        """When the sweep looks next: the row's due verification while the ingress sweeps on a live
        session (None: it does not look)."""
        if not self.sweep_on or self.sim.host.live is None:
            return None
        return self.sim.ledger.scheduled_due()

    def holds(self, at: datetime | None) -> bool:
        """A jump of the clock to ``at`` would pass a due verification the sweep looks at first."""
        due = self.sweep_due()
        return due is not None and at is not None and at > due

    def can_jump(self) -> bool:
        """The ``sweep`` event applies: the sweep looks at a due time, and the ingress owes nothing (a
        jump over its work in flight would model a stalled ingress, not a sweeping one)."""
        return self.sweep_due() is not None and not self.router.owes()

    def sweep(self) -> None:
        """The sweep's look (``Resync.look``) when it runs and the row's verification is due now, then
        the work it fed (``_dispatch``)."""
        if not self.sweep_on:
            return
        due = self.sweep_due()
        live = self.sim.host.live
        if due is None or due > self.sim.now or live is None:
            return
        self.sim.cover("sweep.look")
        key = (KEY.uri, live.generation)
        if key not in self._pulses:  # the synthetic note's ingress id (production stamps a fresh one)
            self._pulses[key] = (f"{SWEPT}{self.sim.next_note_id()}", 0)
        look = self.resync.look(live.generation)
        try:
            look.send(None)
        except StopIteration:
            pass
        else:  # pragma: no cover - ``MemoryLedger.due`` never waits
            raise AssertionError("the sweep's look waited")
        self._dispatch(live.generation)

    def _swept(self) -> None:
        """``Resync.feed`` made a key ready: a router processes it now."""
        self.sim.cover("sweep.fed")
        self.sim.queue.extend(self._process())

    def _dispatch(self, generation: int) -> None:
        """The ingress's work after a look, at once: settling keys due now are processed and its reads
        on ``generation`` not allocated yet are allocated. A key still busy (a read in flight, allocated
        before; settling, not due yet) holds the verification back: the gap it spans is not the sweep's
        to keep (``Checker.sweep_held``)."""
        self.release()
        for act in [a for a in self.sim.activities
                    if a.ingress is not None and a.cycle is None and a.ingress.generation == generation]:
            self.sim.cover("sweep.dispatched")
            self.step(act, "")
        key = (KEY.uri, generation)
        if self.sim.ledger.verified_at != self.sim.now \
                and (key in self.router.work.processing or key in self.router.work.settling):
            self.sim.cover("sweep.busy")
            self.sim.checker.sweep_held()

    def on_sweep(self, e: Event) -> bool:
        """``sweep``: the clock jumped to the due time (``Simulation._next_time``); the look follows."""
        return self.can_jump()

    def on_sweep_off(self, e: Event) -> bool:
        """``sweep_off``: the ingress stops sweeping; ``kill``: it dies, and its session with it."""
        if not self.sweep_on:
            return False
        self.sweep_on = False
        if e.fault == "kill":
            self.sim.cover("sweep.kill")
            self.sim.host.drop()
        else:
            self.sim.cover("sweep.stop")
        return True

    def on_sweep_on(self, e: Event) -> bool:
        """``sweep_on``: the sweep runs again; after a kill, an ingress comes back with a new session."""
        if self.sweep_on:
            return False
        self.sweep_on = True
        self.sim.cover("sweep.start")
        if self.sim.host.live is None:
            self.sim.queue.append(Message(Signal.SESSION_CHANGED, self.sim.host.open()))
        return True
