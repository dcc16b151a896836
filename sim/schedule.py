"""The schedule generator: seeded, online (each event chosen from what is enabled now), and replay.

Contract:
- ``run_schedule(seed)`` draws a ``Profile`` and 10..2*mean-10 events from ``random.Random(seed)``, each
  picked with weights among the events enabled in the simulation's current state, runs them,
  drains and judges; ``replay(trace)`` re-runs a trace's events (inapplicable ones are skipped) and
  the same drain. Every random choice is recorded in the ``Event``: a trace needs no generator.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from functools import cache

from mcpsync.workflows.names import Act
from mcpsync.workflows.records.subscription import SubscriptionState as S
from sim.engine import Simulation
from sim.interpreter import ENDED
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
from sim.model import event as make_event
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
    # The session host sweeps the ledger's due verifications from the start (always, unless its stops
    # are a fault class of the run).
    sweep = Fault.SWEEP_STOP not in faults or rng.random() < 0.75
    return Profile(capability=capability, max_concurrent_reads=reads, session_at_start=session_at_start,
                   safety_read_seconds=safety, sweep=sweep)


# Enum members read once: on Python 3.11 an ``Enum`` class attribute goes through the metaclass's
# ``__getattr__`` hook (about ten times a plain attribute), and ``_next_event`` runs before every event.
_EXEC, _COMPLETE, _DELIVER, _MUTATE = (30, Op.EXEC), (30, Op.COMPLETE), (18, Op.DELIVER), (9, Op.MUTATE)
_DELETE, _RECREATE = (1.2, Op.DELETE), (3, Op.RECREATE)
_OLD_NOTE, _WRONG_URI, _CLOSE = (0.6, Op.OLD_NOTE), (0.3, Op.WRONG_URI), (0.7, Op.CLOSE)
_RECONNECT, _SESSION_OPEN, _CAN = (1, Op.RECONNECT), (6, Op.SESSION_OPEN), (1, Op.CAN)
_CHECKPOINT, _RESET = (1.5, Op.CHECKPOINT), (1.5, Op.RESET)
_CONFLICT, _RESUME, _REVOKE, _RESTART = (0.2, Op.CONFLICT), (3, Op.RESUME), (0.2, Op.REVOKE), (2, Op.RESTART)
_TIMER_OFTEN, _TIMER_RARELY = (4, Op.TIMER), (0.4, Op.TIMER)
_CATALOG_TOMBSTONE, _CATALOG = (3, Op.CATALOG), (0.3, Op.CATALOG)
_SETTLE = (6, Op.SETTLE)
_SWEEP, _SWEEP_OFF, _SWEEP_ON = (1.5, Op.SWEEP), (0.4, Op.SWEEP_OFF), (0.6, Op.SWEEP_ON)
_TOMBSTONE_PENDING, _RECONCILIATION_REQUIRED = S.TOMBSTONE_PENDING, S.RECONCILIATION_REQUIRED
_RARE_TIMERS = frozenset({"safety", "reconcile", "watchdog"})


class _O:
    """The members ``_make`` compares after every pick, as plain class attributes (read once, for the
    same reason)."""

    EXEC, COMPLETE, DELIVER = Op.EXEC, Op.COMPLETE, Op.DELIVER
    MUTATE, DELETE, RECREATE = Op.MUTATE, Op.DELETE, Op.RECREATE
    OLD_NOTE, CLOSE, RECONNECT, RESET, CATALOG = Op.OLD_NOTE, Op.CLOSE, Op.RECONNECT, Op.RESET, Op.CATALOG
    SWEEP_OFF = Op.SWEEP_OFF
    LOST_ACK, READ_FAILURE, REVOKE, RETRY, REORDER = Fault.LOST_ACK, Fault.READ_FAILURE, Fault.REVOKE, \
        Fault.RETRY, Fault.REORDER
    GUARDRAIL, DROP, DUPLICATE = Fault.GUARDRAIL, Fault.DROP, Fault.DUPLICATE
    MCP_UNSUBSCRIBE, MCP_READ_CYCLE, MCP_SUBSCRIBE_CYCLE = Act.MCP_UNSUBSCRIBE, Act.MCP_READ_CYCLE, \
        Act.MCP_SUBSCRIBE_CYCLE


@dataclass(frozen=True, slots=True)
class _Enabled:
    """Which fault classes a schedule draws from (``Fault in faults``, asked once per fault set)."""

    delete: bool
    old_session: bool
    wrong_uri: bool
    close: bool
    session_loss: bool
    continue_as_new: bool
    reset: bool
    catalog: bool
    conflict: bool
    revoke: bool
    restart: bool
    sweep_stop: bool
    faults: frozenset[Fault]


@cache
def _enabled(faults: frozenset[Fault]) -> _Enabled:
    return _Enabled(faults=faults, delete=Fault.DELETE in faults, old_session=Fault.OLD_SESSION in faults,
                    wrong_uri=Fault.WRONG_URI in faults, close=Fault.CLOSE in faults,
                    session_loss=Fault.SESSION_LOSS in faults,
                    continue_as_new=Fault.CONTINUE_AS_NEW in faults, reset=Fault.RESET in faults,
                    catalog=Fault.CATALOG in faults, conflict=Fault.CONFLICT in faults,
                    revoke=Fault.REVOKE in faults, restart=Fault.RESTART in faults,
                    sweep_stop=Fault.SWEEP_STOP in faults)


def _next_event(rng: random.Random, sim: Simulation, f: _Enabled) -> Event:
    """Pick one enabled event, weighted; every random choice is recorded in the Event."""
    wf = sim.wf
    # What an EXEC and a COMPLETE may pick, in one pass (in list order, as ``picking`` indexes them).
    scheduled: list[Activity] = []
    executed: list[Activity] = []
    run = sim.run
    for a in sim.activities:
        if not a.executed:
            if not a.poisoned:
                scheduled.append(a)
        elif a.run == run:
            executed.append(a)
    ingress, host = sim.ingress, sim.host
    # (weight, the op that event applies), in a fixed order: the draw picks by cumulative weight
    options: list[tuple[float, Op]] = []
    add = options.append
    if scheduled:
        add(_EXEC)
    if executed:
        add(_COMPLETE)
    if sim.queue:
        add(_DELIVER)
    if ingress.router.work.settling:
        add(_SETTLE)
    if sim.oracle.digest is not None:  # it exists
        add(_MUTATE)
        if f.delete:
            add(_DELETE)
    elif f.delete:
        add(_RECREATE)
    running = wf.stage not in ENDED  # ``sim.chain_running``
    timer = wf.pending_timer if running else ""
    # the sweep's next look, if it looks (``IngressDriver.sweep_due``)
    swept = ingress.sweep_due() if ingress.sweep_on else None
    if timer and (swept is None or (at := wf.timer_at) is None or at <= swept):  # a due row comes first
        # Poll (30 s) and session recheck (<= 15 s) timers fire often; the safety re-read (300 s) and the
        # watchdog (6 h) rarely.
        add(_TIMER_RARELY if timer in _RARE_TIMERS else _TIMER_OFTEN)
    if swept is not None and not ingress.router.owes():  # ``IngressDriver.can_jump``
        add(_SWEEP)
    if f.sweep_stop:
        add(_SWEEP_OFF if ingress.sweep_on else _SWEEP_ON)
    if f.old_session and host.generation >= 2:
        add(_OLD_NOTE)
    if f.wrong_uri:
        add(_WRONG_URI)
    s = wf.program.fence.s
    if f.close and running and not s.close_requested:
        add(_CLOSE)
    if f.session_loss:
        if host.live is not None:
            add(_RECONNECT)
        else:
            add(_SESSION_OPEN)
    elif host.live is None:
        add(_SESSION_OPEN)
    if f.continue_as_new and running and not wf.can_suggested:
        add(_CAN)
    if f.reset:
        if running:
            add(_CHECKPOINT)
        if sim.checkpoints:
            add(_RESET)
    if running:
        state = s.state
        if f.catalog:
            add(_CATALOG_TOMBSTONE if state == _TOMBSTONE_PENDING else _CATALOG)
        if f.conflict:
            add(_CONFLICT)
            if state == _RECONCILIATION_REQUIRED:
                add(_RESUME)
        if f.revoke:
            add(_REVOKE)
    elif f.restart:
        add(_RESTART)
    total = 0.0
    for weight, _ in options:
        total += weight
    pick = rng.random() * total
    op = options[-1][1]
    for weight, candidate in options:
        pick -= weight
        if pick <= 0:
            op = candidate
            break
    return _make(op, rng, sim, f.faults, scheduled, executed)


def _make(op: Op, rng: random.Random, sim: Simulation, F: frozenset[Fault],
          scheduled: list[Activity], executed: list[Activity]) -> Event:
    """The picked event, with the random choices it makes (drawn after the pick, in this order)."""
    if op == _O.EXEC:
        a = rng.choice(scheduled)
        fault = ""
        if a.name == _O.MCP_UNSUBSCRIBE and _O.LOST_ACK in F and rng.random() < 0.3:
            fault = "ack_lost"
        elif (reads := _reads(a)) and _O.READ_FAILURE in F and rng.random() < 0.05:
            fault = rng.choice(["error", "malformed"])
        elif reads and _O.REVOKE in F and rng.random() < 0.01:
            fault = "denied"
        elif _O.RETRY in F and rng.random() < 0.05:
            fault = "lost"
        return sim.picking(_O.EXEC, a, fault)
    if op == _O.COMPLETE:
        return sim.picking(_O.COMPLETE, rng.choice(executed))
    if op == _O.DELIVER:
        n = 0
        if _O.REORDER in F and len(sim.queue) > 1 and rng.random() < 0.4:
            n = rng.randrange(1, len(sim.queue))
        return make_event(_O.DELIVER, n=n)
    if op in (_O.MUTATE, _O.DELETE, _O.RECREATE):
        n = _copies(rng, F)
        tokens = []
        if n > 1 and rng.random() < 0.5:
            tokens.append("same_id")
        if op != _O.DELETE and _O.GUARDRAIL in F and rng.random() < 0.08:
            tokens.append("unsafe")
        return make_event(op, n=n, fault="+".join(tokens))
    if op == _O.OLD_NOTE:
        return make_event(_O.OLD_NOTE, n=rng.randrange(2))
    if op == _O.CLOSE:
        return make_event(_O.CLOSE, fault="signal" if rng.random() < 0.3 else "")
    if op == _O.RECONNECT:
        return make_event(_O.RECONNECT, n=int(rng.random() < 0.3))
    if op == _O.RESET:
        return make_event(_O.RESET, n=rng.randrange(len(sim.checkpoints)),
                     fault="reapply" if rng.random() < 0.5 else "")
    if op == _O.CATALOG:
        lag = rng.choice([0, 0, 1, 3, 8])  # the scan was measured this many steps before it arrives
        return make_event(_O.CATALOG, n=lag, fault="proven" if rng.random() < 0.5 else "")
    if op == _O.SWEEP_OFF:  # alive but not sweeping, or killed (its session lost with it)
        return make_event(_O.SWEEP_OFF, fault="kill" if rng.random() < 0.3 else "")
    # TIMER, SETTLE, SWEEP, SWEEP_ON, WRONG_URI, SESSION_OPEN, CAN, CHECKPOINT, CONFLICT, RESUME, REVOKE,
    # RESTART
    return make_event(op)


def _copies(rng: random.Random, F: frozenset[Fault]) -> int:
    """How many notifications a change sends (dropped, duplicated)."""
    if _O.DROP in F and rng.random() < 0.15:
        return 0
    if _O.DUPLICATE in F and rng.random() < 0.2:
        return rng.choice([2, 3])
    return 1


def _reads(a: Activity) -> bool:
    """The step that sends resources/read."""
    return (a.name in (_O.MCP_READ_CYCLE, INGRESS_READ) and a.step == 1) \
        or (a.name == _O.MCP_SUBSCRIBE_CYCLE and a.step == SUBSCRIBE_CYCLE_READ + 1)


def run_schedule(seed: str, config: SimConfig = SimConfig()) -> ScheduleResult:
    """Generate one schedule from ``seed`` online (each event chosen from what is enabled now),
    run it, drain it, judge it."""
    rng = random.Random(seed)
    profile = _profile(rng, config.faults)
    sim = Simulation(seed, profile, config)
    low = 10
    length = rng.randint(low, max(low, 2 * config.mean_events - low))
    enabled = _enabled(config.faults)
    for _ in range(length):
        sim.apply(_next_event(rng, sim, enabled))
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
