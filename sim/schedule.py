"""The schedule generator: seeded, online (each event chosen from what is enabled now), and replay.

Contract:
- ``run_schedule(seed)`` draws a ``Profile`` and 10..2*mean-10 events from ``random.Random(seed)``, each
  picked with weights among the events enabled in the simulation's current state, runs them,
  drains and judges; ``replay(trace)`` re-runs a trace's events (inapplicable ones are skipped) and
  the same drain. Every random choice is recorded in the ``Event``: a trace needs no generator.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

from mcpsync.workflows.names import Act
from mcpsync.workflows.records.subscription import SubscriptionState as S
from sim.engine import Simulation
from sim.model import (
    INGRESS_READ,
    SUBSCRIBE_CYCLE_READ,
    Event,
    Fault,
    Op,
    Profile,
    ScheduleResult,
    SimConfig,
    Trace,
)
from sim.world import Activity

__all__ = ["run_schedule", "replay", "simulation_of"]


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
        return sim.picking(Op.EXEC, a, fault)

    def deliver_event() -> Event:
        n = 0
        if Fault.REORDER in F and len(sim.queue) > 1 and rng.random() < 0.4:
            n = rng.randrange(1, len(sim.queue))
        return Event(Op.DELIVER, n=n)

    if scheduled:
        add(30, exec_event)
    if executed:
        add(30, lambda: sim.picking(Op.COMPLETE, rng.choice(executed)))
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
    return _drained(sim)


def simulation_of(trace: Trace, config: SimConfig) -> Simulation:
    """A ``Simulation`` of ``trace``'s seed and profile, with the session host's setting it ran with."""
    config = replace(config, read_on_notification=config.read_on_notification and trace.read_on_notification)
    return Simulation(trace.seed, trace.profile, config)


def replay(trace: Trace, config: SimConfig = SimConfig()) -> ScheduleResult:
    """Re-run a trace's events (inapplicable ones are skipped), then the same drain."""
    sim = simulation_of(trace, config)
    for event in trace.events:
        sim.apply(event)
    return _drained(sim)


def _drained(sim: Simulation) -> ScheduleResult:
    """Drain and judge; the result keeps the events before the drain (a replay derives the drain again)."""
    generated = list(sim.events)
    sim.drain()
    result = sim.result()
    result.events = generated
    return result
