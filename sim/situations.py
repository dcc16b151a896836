"""Situations: named sequences of operations a trace drives the program through.

Each situation is a sequence of operations a rule of the program or the ledger exists for (a reset
re-dispatching a finished allocation, a close arriving during the continue-as-new wait, ...); its name
carries the label of its entry in docs/simulation.md. ``observe`` names the situations a trace
reaches, so a trace can be searched for (``search``: seeded schedules that contain the situation,
shrunk to the shortest that still does and stays clean) and a stored trace can be checked to still
reach its situation when the program changes.

``python -m sim.situations SEED START STOP [NAME ...]`` prints the shrunk traces it finds as JSON.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from mcpsync.workflows.allocation import rederivations
from mcpsync.workflows.interpreter import WaitKind
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import AcceptVerdict, AllocateRequest, ReadTicket
from mcpsync.workflows.records.subscription import CLOSING_STATES, SubscriptionState
from sim.interpreter import Signal
from sim.model import ALL_FAULTS, SUBSCRIBE_CYCLE_READ, Event, Fault, Op, SimConfig, Trace, schedule_seed
from sim.schedule import run_schedule, simulation_of
from sim.shrinking import delta_debug
from sim.world import Activity

S = SubscriptionState
V = AcceptVerdict
CYCLES = (Act.MCP_READ_CYCLE, Act.MCP_SUBSCRIBE_CYCLE)
TERMINAL = (S.REVOKED, S.CLOSED, S.UNSUBSCRIBE_UNKNOWN)
SEARCH_CONFIG = SimConfig(faults=ALL_FAULTS - {Fault.CONCURRENT_READS})


def _base(act: Activity) -> int:
    """The step at which ``act`` allocates (its read cycle's first step)."""
    return SUBSCRIBE_CYCLE_READ if act.name == Act.MCP_SUBSCRIBE_CYCLE else 0


def _allocation(act: Activity) -> AllocateRequest:
    arg = act.arg
    return arg.read.allocate if act.name == Act.MCP_SUBSCRIBE_CYCLE else arg.allocate


def observe(trace: Trace, config: SimConfig = SimConfig()) -> tuple[set[str], bool]:
    """Replay ``trace`` event by event (then the drain) and name the situations it reached;
    also whether the replay was clean (no violation)."""
    sim = simulation_of(trace, config)
    tags: set[str] = set()
    allocated: set[int] = set()  # activity ids whose read cycle allocated once already
    covered_at_checkpoint: dict[int, int] = {}
    for e in trace.events:
        wf = sim.wf
        running = sim.chain_running
        wait = wf.main_wait if running else None
        act = sim._find(e, executed=e.op == Op.COMPLETE) if e.op in (Op.EXEC, Op.COMPLETE) else None
        state = wf.fence.s.state if running else None
        row = sim.ledger.row
        armed = running and wf.fence.s.read_due_at is not None
        watching = running and wf.fence.s.watch_due_at is not None
        can_before = sim.coverage.get("continue_as_new", 0)
        saved_before = sim.ingress.covered_reads_saved
        erased: list[Signal] = []
        cp = None
        if e.op == Op.RESET and sim.checkpoints:
            cp = sim.checkpoints[-1 - e.n % len(sim.checkpoints)]
            erased = [kind for kind, _ in sim.signal_log[cp.signal_index:]]
        msg_kind = sim.queue[e.n % len(sim.queue)].kind if e.op == Op.DELIVER and sim.queue else ""
        before: set[str] = set()  # kept only if the event applies
        # --- before: what the event meets
        if act is not None and e.op == Op.EXEC and act.name in CYCLES and act.step == _base(act):
            if act.aid in allocated:
                before.add("F1.retried_allocate")
            asked = _allocation(act)  # by request id only: the workflow sets no cycle id
            held = sim.ledger.prior_allocation(asked)  # a pending ticket, or the id a new allocation takes
            chain = rederivations(asked.request_id, held if isinstance(held, str) else held.request_id)
            if isinstance(held, ReadTicket) and chain == 0 and act.aid not in allocated:
                before.add("F11.reset_reasks_pending")  # another activity (a reset run's) asks again
                if row.notifications_seen > held.notifications_seen:
                    before.add("F11.reasked_after_a_note")
            if chain >= 1:
                before.add("F1.reset_redispatch")
            if chain >= 2:
                before.add("F6.second_reset_same_point")
        if e.op in (Op.CLOSE, Op.REVOKE) and running and wf.program.identity.resume_requested is not None:
            before.add("F2.resume_then_close" if e.op == Op.CLOSE else "F2.resume_then_revoke")
        if msg_kind == Signal.SESSION_CHANGED and running and wf.fence.allocating \
                and wf.program.reads_running:
            before.add("F3.session_change_while_reading")
        # the step (1: read, 2: accept) of a workflow's cycle whose read covers notes the row has not
        covering_step = act.step - _base(act) if e.op == Op.EXEC and act is not None \
            and act.ingress is None and act.name in CYCLES and act.ticket is not None \
            and act.ticket.notifications_seen > row.covered else None
        if covering_step == 1 and e.fault in ("error", "malformed"):
            before.add("F7.covering_read_failed")
        if wait == WaitKind.CONTINUE_AS_NEW:
            before.add("continue_as_new_wait")
        if e.op == Op.CLOSE and wait == WaitKind.CONTINUE_AS_NEW:
            before.add("F9.close_during_can_wait")
        if e.op == Op.RESUME and wait == WaitKind.CONTINUE_AS_NEW:
            before.add("F13.resume_during_can_wait")  # unreachable: the wait steps aside for a resume first
        if e.op == Op.COMPLETE and act is not None and act.name in CYCLES and state in TERMINAL:
            cycle = getattr(act.result, "cycle", act.result)
            verdict = getattr(getattr(cycle, "accept", None), "verdict", None)
            if verdict is not None and verdict != V.REVOKED:
                before.add("F10.verdict_after_terminal")
                if verdict == V.TOMBSTONE_PENDING:
                    before.add("F10.tombstone_after_revoked")
        if e.op == Op.RESET and e.fault != "reapply" and Signal.UPDATED in erased and cp is not None \
                and saved_before > covered_at_checkpoint.get(id(cp), saved_before):
            before.add("F14.reset_drops_covered_updates")
            before.add("F14.reset_drops_covered_updates_" + ("safety" if trace.profile.safety_read_seconds
                                                            else "no_safety"))
        if e.op == Op.CATALOG and wait == WaitKind.IDLE and state == S.ACTIVE and armed \
                and wf.fence.s.staleness_bound_seconds is not None:
            before.add("staleness.catalog_word_while_poll_armed")
        runs_before = sim.run
        stale_before = sim.coverage.get("verdict.STALE", 0)
        # --- the event
        applied = sim.apply(e)
        if not applied:
            continue
        tags |= before
        # --- after
        if act is not None and act.name in CYCLES and act.ticket is not None:
            allocated.add(act.aid)
        if e.op == Op.CHECKPOINT and sim.checkpoints:
            covered_at_checkpoint[id(sim.checkpoints[-1])] = sim.ingress.covered_reads_saved
        if covering_step == 2 and runs_before > 1 and sim.coverage.get("verdict.STALE", 0) > stale_before:
            tags.add("F7.covering_read_stale_after_reset")
        if wait == WaitKind.CONTINUE_AS_NEW and sim.chain_running and sim.wf.fence.s.state != S.ACTIVE \
                and sim.wf.fence.s.state not in TERMINAL:
            tags.add("F13.left_active_during_can_wait")  # the state a resume update during the wait needs
            if e.op not in (Op.CONFLICT, Op.CLOSE, Op.REVOKE):
                tags.add("F13.adopted_during_can_wait")  # a reload adopted it (not a signal of ours)
        if e.op == Op.RESET and e.fault != "reapply" and sim.chain_running:
            if sim.wf.fence.s.state == S.RECONCILIATION_REQUIRED and sim.ledger.row.state in CLOSING_STATES:
                tags.add("F8.reset_past_close_in_reconciliation")
        if sim.coverage.get("continue_as_new", 0) > can_before and armed:
            tags.add("staleness.continue_as_new_while_deadline_armed")
        if sim.coverage.get("continue_as_new", 0) > can_before and watching:
            tags.add("staleness.continue_as_new_while_watchdog_armed")
    if "staleness.catalog_word_while_poll_armed" in tags and not sim.coverage.get("timer.poll"):
        tags.discard("staleness.catalog_word_while_poll_armed")
    sim.drain()
    return tags, not sim.result().violations


def shrink_to(trace: Trace, name: str, config: SimConfig = SimConfig(), *, budget: int = 1500,
              bites: Callable[[Trace], bool] | None = None) -> Trace:
    """The shortest event list (1-minimal within ``budget`` replays) that still reaches ``name`` cleanly
    (and, with ``bites``, that a reverted rule still makes violate: a trace with teeth)."""
    def keeps(events: list[Event]) -> list[Event] | None:
        candidate = replace(trace, events=tuple(events))
        tags, clean = observe(candidate, config)
        return events if clean and name in tags and (bites is None or bites(candidate)) else None

    events = delta_debug(trace.events, keeps, budget)
    return replace(trace, events=tuple(events), violations=())


def search(seed: str, start: int, stop: int, names: Iterable[str],
           config: SimConfig = SEARCH_CONFIG, *, bites: Callable[[Trace],
                                                                 bool] | None = None) -> dict[str, Trace]:
    """Seeded schedules ``start``..``stop-1``: for each wanted situation, the first clean schedule
    that reaches it (and that ``bites``), shrunk."""
    wanted = set(names)
    found: dict[str, Trace] = {}
    for index in range(start, stop):
        if not wanted:
            break
        trace = run_schedule(schedule_seed(seed, index), config).trace()
        tags, clean = observe(trace, config)
        for name in sorted(tags & wanted):
            if clean and (bites is None or bites(trace)):
                found[name] = shrink_to(trace, name, config, bites=bites)
                wanted.discard(name)
                print(f"{name}: {schedule_seed(seed, index)} -> {len(found[name].events)} events",
                      file=sys.stderr)
    return found


def main(argv: Sequence[str]) -> None:
    """``SEED START STOP NAME...``; ``--faults a,b,c``: only those fault classes (a denser search)."""
    args = list(argv)
    config = SEARCH_CONFIG
    if "--faults" in args:
        at = args.index("--faults")
        config = replace(config, faults=frozenset(Fault(f) for f in args[at + 1].split(",")))
        del args[at:at + 2]
    seed, start, stop, *names = args
    found = search(seed, int(start), int(stop), names, config)
    print(json.dumps({name: t.to_json() for name, t in found.items()}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
