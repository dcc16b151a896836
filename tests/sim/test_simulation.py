"""The simulator as a release gate, and proof that its checker catches broken fences.

- A bounded run (5,000 seeded schedules, every fault class except the opt-in concurrent
  reads) must keep the seed's safety invariants at zero (``SAFETY_INVARIANTS``).
- The full gate (every invariant, liveness included) must be clean too.
- Deliberately broken judge functions, injected through ``SimConfig.judge``, are caught
  and shrunk to short replayable traces; the same seed gives the same JSON.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from mcpsync.workflows import coverage
from mcpsync.workflows.coverage import NotePlan
from mcpsync.workflows.ledger_rules import IssuedRead, Judgement, judge_read
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import AcceptResult, AcceptVerdict, FenceSnapshot, OutboxEventType
from mcpsync.workflows.records.mcp_calls import ReadOutcome
from mcpsync.workflows.records.subscription import ResourceUpdated, SubscriptionState
from mcpsync.workflows.subscription_state import SubscriptionFence
from mcpsync.workflows.verification_rules import GapJudgement
from sim.engine import Simulation
from sim.interpreter import Signal
from sim.model import (
    ALL_FAULTS,
    INGRESS_READ,
    KEY,
    SAFETY_INVARIANTS,
    Event,
    Fault,
    Invariant,
    Op,
    Profile,
    SimConfig,
    Trace,
    schedule_seed,
)
from sim.runner import Summary, run_schedules, run_schedules_in_processes, summary_json
from sim.schedule import replay, run_schedule
from sim.shrinking import shrink
from tests import cli_process

S = SubscriptionState
GATE_SCHEDULES = 5000
GATE_CONFIG = SimConfig(faults=ALL_FAULTS - {Fault.CONCURRENT_READS})
# A small fault set, for tests that need a quick clean baseline to see an injected bug.
CLEAN_CONFIG = SimConfig(faults=ALL_FAULTS - {Fault.CONCURRENT_READS, Fault.RETRY, Fault.RESET,
                                              Fault.CONFLICT, Fault.SESSION_LOSS, Fault.CLOSE, Fault.POLLING})


@pytest.fixture(scope="module")
def gate() -> Summary:
    return run_schedules_in_processes("ci-gate", 0, GATE_SCHEDULES, GATE_CONFIG, keep_failures=1)


def test_bounded_gate_keeps_safety_invariants_at_zero(gate: Summary) -> None:
    report = summary_json(gate, GATE_CONFIG)
    assert report["schedules"] == GATE_SCHEDULES
    assert {i.value: report["violations"][i.value] for i in SAFETY_INVARIANTS} == \
        {i.value: 0 for i in SAFETY_INVARIANTS}, report["violations"]
    # The gate must actually exercise what it claims to.
    cov = report["coverage"]
    for name in ("continue_as_new", "reset", "reset_reapply", "orphan_landed", "unsubscribe_ack_lost",
                 "close_fenced", "verdict.ACCEPTED", "verdict.UNCHANGED", "verdict.STALE",
                 "verdict.STALE_AFTER_CLOSE", "verdict.TOMBSTONE_PENDING", "verdict.GUARDRAIL_REJECTED",
                 "verdict.REVOKED", "update.old_session", "update.noted", "update.future_session",
                 "op.recreate", "op.restart", "op.catalog", "op.resume", "read_cycle",
                 "lost_response.mcp_read_cycle", "lost_response.read_cycle_step",
                 "timer.poll", "timer.safety", "timer.reconcile", "timer.watchdog",
                 # reads at the ingress: reported, fallen back, pulses absorbed by the read, processed again
                 # at once, or (notified after the read was sent) settled first
                 "ingress.report_delivered", "ingress.fallback", "ingress.lost_response", "ingress.absorbed",
                 "update.ingress_no_work",
                 "ingress.queued_routed", "ingress.settling", "ingress.settled", "ingress.verdict.ACCEPTED",
                 "ingress.verdict.STALE",
                 # the sweep of the ledger's due verifications: looks, their reads allocated at once, the
                 # sweep stopped, killed and back; gaps over the period (the watchdog's)
                 "op.sweep", "sweep.look", "sweep.dispatched", "sweep.stop", "sweep.kill", "sweep.start",
                 "verification.overdue_gap"):
        assert cov.get(name, 0) > 0, name
    assert report["convergence_steps"]["schedules"] > GATE_SCHEDULES // 4


def test_bounded_gate_keeps_every_invariant_at_zero(gate: Summary) -> None:
    report = summary_json(gate, GATE_CONFIG)
    assert report["violations_total"] == 0, (report["violations"], gate.failing_indices)


# --- fixed findings: minimal traces that reproduced them (replay must stay clean) --------------------




def _trace(doc: dict[str, Any]) -> Trace:
    return Trace.from_json(json.loads(json.dumps(doc)))  # through JSON, as a user would replay it


def test_a_note_from_a_session_the_row_left_is_not_held_against_its_count() -> None:
    # The ingress's read for generation 1 outlives a reconnect; the key, marked dirty by a change
    # meanwhile, is processed again and noted on generation 1 after the row moved to generation 2:
    # the note is not counted (``coverage.plan_note``), so the checker must not hold its change to
    # the count the row already had (found at seed ``ingress-run-2026-12-05:92216``).
    doc = {
        "seed": "ingress-run-2026-12-05:92216", "read_on_notification": True,
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True,
                    "safety_read_seconds": 300.0},
        "events": [
        {"op": "exec", "act": "ledger_start_subscription"},
        {"op": "complete", "act": "ledger_start_subscription"},
        {"op": "exec", "act": "ledger_current_session"},
        {"op": "complete", "act": "ledger_current_session"}, {"op": "delete", "n": 1},
        {"op": "exec", "act": "ledger_begin_subscription"},
        {"op": "complete", "act": "ledger_begin_subscription"},
        {"op": "exec", "act": "mcp_subscribe_cycle"}, {"op": "exec", "act": "mcp_subscribe_cycle"},
        {"op": "recreate", "n": 2}, {"op": "exec", "act": "mcp_subscribe_cycle"},
        {"op": "exec", "act": "mcp_subscribe_cycle"}, {"op": "exec", "act": "mcp_subscribe_cycle"},
        {"op": "mutate", "n": 1}, {"op": "reconnect"}, {"op": "complete", "act": "mcp_subscribe_cycle"},
        {"op": "deliver"}, {"op": "exec", "act": "ledger_current_session"},
        {"op": "complete", "act": "ledger_current_session"},
        {"op": "exec", "act": "ledger_begin_subscription"},
        ],
    }
    result = replay(_trace(doc))
    assert not result.violations, result.violations
    assert result.converged_after is not None


def test_catalog_word_for_an_active_listed_subscription_does_not_spin() -> None:
    # Found at c81d8bf: a catalog_reconciled signal to an ACTIVE subscription made _has_work() true
    # forever (livelock). Fixed since; keep it fixed.
    result = replay(Trace("regression:catalog", Profile(), (Event(Op.CATALOG),)))
    assert not result.violations


# --- the checker catches broken fences -----------------------------------------------------------


def judge_ignoring_close(row: FenceSnapshot, issued: IssuedRead | None, outcome: ReadOutcome, *,
                         row_uri: str | None) -> Judgement:
    """A broken acceptance point that forgot the close fence."""
    if row.state in (S.UNSUBSCRIBING, S.CLOSED, S.UNSUBSCRIBE_UNKNOWN):
        row = row.model_copy(update={"state": S.ACTIVE})
    return judge_read(row, issued, outcome, row_uri=row_uri)


def judge_without_ordinal_fence(row: FenceSnapshot, issued: IssuedRead | None, outcome: ReadOutcome, *,
                                row_uri: str | None) -> Judgement:
    """A broken acceptance point that forgot readOrdinal > lastAcceptedOrdinal."""
    return judge_read(row.model_copy(update={"last_accepted_ordinal": 0, "last_issued_ordinal": 0}), issued,
                      outcome, row_uri=row_uri)


@pytest.mark.parametrize(("judge", "faults", "caught"), [
    (judge_ignoring_close, CLEAN_CONFIG.faults | {Fault.CLOSE},
     {Invariant.OUTBOX_AFTER_CLOSE, Invariant.NOT_ACTIVE_WRITE, Invariant.LATE_TOMBSTONE}),
    (judge_without_ordinal_fence, CLEAN_CONFIG.faults | {Fault.RESET},
     {Invariant.VERSION_REGRESSION}),
])
def test_broken_judge_is_caught_and_shrunk(judge: Any, faults: frozenset[Fault],
                                           caught: set[Invariant]) -> None:
    config = SimConfig(faults=faults, judge=judge)
    for index in range(3000):
        result = run_schedule(schedule_seed("broken", index), config)
        hit = [v.invariant for v in result.violations if v.invariant in caught]
        if hit:
            break
    else:
        pytest.fail("the checker never noticed the broken judge")
    small = shrink(result, config, target=hit[0])
    assert len(small.events) <= 25 and len(small.events) < len(result.events), len(small.events)
    again = replay(_trace(small.trace().to_json()), config)
    assert hit[0] in {v.invariant for v in again.violations}
    healthy = replay(_trace(small.trace().to_json()), SimConfig(faults=faults))
    assert not [v for v in healthy.violations if v.invariant in caught]


# --- determinism and the drain ----------------------------------------------------------------------


def test_same_seed_same_json() -> None:
    first = json.dumps(summary_json(run_schedules("det", 0, 100)), sort_keys=True)
    second = json.dumps(summary_json(run_schedules("det", 0, 100)), sort_keys=True)
    assert first == second
    assert json.dumps(summary_json(run_schedules("det2", 0, 100)), sort_keys=True) != first


def test_replay_reproduces_the_online_run() -> None:
    for index in range(60):
        online = run_schedule(schedule_seed("replay", index))
        again = replay(_trace(online.trace().to_json()))
        assert (again.violations, again.steps, again.converged_after, again.coverage) == \
            (online.violations, online.steps, online.converged_after, online.coverage)


def test_lost_notification_converges_through_the_drain() -> None:
    # The only change loses its notification; the quiet end's final invalidation still converges.
    trace = Trace("quiet", Profile(), (Event(Op.MUTATE, n=0),))
    result = replay(trace)
    assert not result.violations and result.converged_after is not None


def test_continue_as_new_and_reset_keep_the_fence() -> None:
    events = (Event(Op.MUTATE, n=1), Event(Op.CHECKPOINT), Event(Op.CAN),
              Event(Op.MUTATE, n=2, fault="same_id"), Event(Op.RESET, fault="reapply"), Event(Op.MUTATE, n=1))
    result = replay(Trace("lifecycle", Profile(), events), GATE_CONFIG)
    assert not result.violations, result.violations
    assert result.coverage.get("reset") == 1 and result.converged_after is not None


# --- the command ---------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return cli_process.run(["simulate", *args], timeout=300)


def test_simulate_command_gates_and_replays(tmp_path: Path) -> None:
    run = _cli("--schedules", "200", "--seed", "cli", "--workers", "1", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["schedules"] == 200 and report["violations_total"] == 0
    assert "concurrent_reads" not in report["faults"]  # F4 is out of the gate unless asked for
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps(Trace("cli-clean", Profile(), (Event(Op.MUTATE, n=1),
                                                               Event(Op.CLOSE))).to_json()))
    again = _cli("--replay", str(clean))
    assert again.returncode == 0 and "no violation" in again.stdout


@pytest.mark.parametrize("events", [
    (Event(Op.FIRST_READ), Event(Op.MUTATE, n=1)),  # delivered with the start (Update-with-Start)
    (Event(Op.MUTATE, n=1), Event(Op.FIRST_READ), Event(Op.MUTATE, n=1)),  # to a running subscription
    (Event(Op.FIRST_READ), Event(Op.DELETE, n=1)),  # the URI is gone: TOMBSTONE_PENDING answers it
    (Event(Op.FIRST_READ), Event(Op.CONFLICT), Event(Op.FIRST_READ), Event(Op.RESUME)),
    (Event(Op.FIRST_READ), Event(Op.CLOSE)),
])
def test_first_read_update_answers_once_a_read_was_judged(events: tuple[Event, ...]) -> None:
    # The verdict flags a first_read update still waiting once the subscription converged.
    result = replay(Trace("first-read", Profile(), events), GATE_CONFIG)
    assert not result.violations, result.violations


# --- reads at the ingress ----------------------------------------------------------------------------

def _settled(config: SimConfig = SimConfig()) -> Simulation:
    """A subscription ACTIVE and idle after its initial read (every event recorded in ``sim.events``)."""
    sim = Simulation("ingress", Profile(), config)
    sim._flush()
    assert sim.ledger.row.state == S.ACTIVE and sim.ledger.row.read_reports
    return sim


def test_a_step_that_gives_the_run_no_input_does_not_activate_it() -> None:
    """As in Temporal, the run is activated only by an input (``ProgramRun.activate``): a change at the
    oracle and the ingress's read of it (three activity steps) give the workflow nothing until the
    report is delivered, and no activation is run or logged for them (a reset replays none)."""
    sim = _settled()
    wf = sim.wf
    activations, logged = wf.activations, len(wf.log)
    sim.apply(Event(Op.MUTATE, n=1))
    for _ in range(3):
        assert sim.apply(Event(Op.EXEC, act=INGRESS_READ))
    assert (wf.activations, len(wf.log)) == (activations, logged) and sim.queue
    sim.apply(Event(Op.DELIVER))
    assert wf.activations == activations + 1
    assert [op for _, op, _ in wf.log[logged:]] == ["signal", "activate"]


def test_ingress_read_reports_and_the_workflow_schedules_no_read() -> None:
    # A notified change is read by the session host (allocate / read / accept, three steps) and
    # reported (resource_read); the workflow mirrors the verdict (the row is clean after it) and
    # schedules no read activity of its own for it.
    sim = _settled()
    first_new = sim.last_activity_id + 1
    sim.apply(Event(Op.MUTATE, n=1))
    assert [a.name for a in sim.activities] == [INGRESS_READ]
    for _ in range(3):
        sim.apply(Event(Op.EXEC, act=INGRESS_READ))
    assert sim.queue and sim.queue[0].kind == "read_reported"
    sim.apply(Event(Op.DELIVER))
    scheduled = {a.name for a in sim.activities if a.aid >= first_new}
    assert not scheduled, scheduled
    assert sim.ledger.row.last_accepted_digest == sim.oracle.digest and sim.checker.converged()
    assert sim.wf.fence.s.last_accepted_digest == sim.oracle.digest
    cov = sim.coverage
    assert cov["ingress.report_delivered"] == 1 and "ingress.fallback" not in cov
    assert (sim.ledger.row.covered == sim.ledger.row.notifications_seen
            and sim.wf.fence.s.pending_trigger is None)
    # The same events as a trace replay to the same end, clean, with nothing scheduled after the change.
    trace = Trace("ingress", Profile(), tuple(sim.events))
    again = replay(_trace(trace.to_json()))
    assert not again.violations and again.coverage.get("ingress.report", 0) >= 1


def test_a_wake_up_at_the_ingress_is_the_update_it_stamped() -> None:
    # Without reads at the ingress, ``resource_updated`` carries the update the routing program stamped
    # (its receive time and ingress id), as the session host signals it.
    sim = _settled(SimConfig(read_on_notification=False))
    sim.apply(Event(Op.MUTATE, n=1))
    received_at = sim.now
    sim.apply(Event(Op.DELIVER))
    assert sim.signal_log[-1] == (Signal.UPDATED, ResourceUpdated(
        uri=KEY.uri, session_generation=sim.host.generation, received_at=received_at,
        notification_id=f"n{sim.last_note_id}"))


def _absorbed_prefix() -> list[Event]:
    """A change notified three times: the first pulse is noted and starts a read at the ingress, the
    copies mark the key dirty; the read is allocated, takes them (``WorkQueue.take``) and is sent."""
    sim = _settled()
    sim.apply(Event(Op.MUTATE, n=3))
    sim.apply(Event(Op.EXEC, act=INGRESS_READ))
    sim.apply(Event(Op.EXEC, act=INGRESS_READ))
    return list(sim.events)


def test_copies_that_arrived_before_the_ingress_read_was_requested_are_absorbed() -> None:
    events = (*_absorbed_prefix(), Event(Op.EXEC, act=INGRESS_READ))
    result = replay(Trace("ingress-absorb", Profile(), events))
    assert not result.violations, result.violations
    assert result.coverage.get("ingress.absorbed") == 1 and "ingress.queued_routed" not in result.coverage


def test_a_change_notified_between_the_allocation_and_the_send_is_absorbed_by_that_read() -> None:
    # The read at the ingress is allocated, then a second change is committed and notified before the
    # read is sent: the read observes it, its accept counts the pulse, and the key is not read again.
    sim = _settled()
    sim.apply(Event(Op.MUTATE, n=1))
    sim.apply(Event(Op.EXEC, act=INGRESS_READ))  # allocate
    sim.apply(Event(Op.MUTATE, n=1))  # the key is processing: marked dirty
    for _ in range(2):
        sim.apply(Event(Op.EXEC, act=INGRESS_READ))  # read (takes the pulse), accept
    assert sim.coverage.get("ingress.absorbed") == 1 and "ingress.queued_routed" not in sim.coverage
    row = sim.ledger.row
    assert row.last_accepted_digest == sim.oracle.digest and row.covered == row.notifications_seen
    result = replay(Trace("ingress-between", Profile(), tuple(sim.events)))
    assert not result.violations, result.violations


def test_a_change_notified_after_the_send_is_noted_and_read_again_once_it_settled() -> None:
    sim = _settled()
    sim.apply(Event(Op.MUTATE, n=1))
    sim.apply(Event(Op.EXEC, act=INGRESS_READ))  # allocate
    sim.apply(Event(Op.EXEC, act=INGRESS_READ))  # read (sent)
    sim.apply(Event(Op.MUTATE, n=1))  # the key is processing: marked dirty
    sim.apply(Event(Op.EXEC, act=INGRESS_READ))  # accept: the key settles (workflows/ingress.py)
    assert sim.coverage.get("ingress.settling") == 1 and "ingress.absorbed" not in sim.coverage
    assert not sim.activities and sim.ingress.router.owes()  # owned, not read yet
    sim.apply(Event(Op.MUTATE, n=2))  # a change notified while it settles merges into its follow-up
    assert sim.apply(Event(Op.SETTLE)) and not sim.apply(Event(Op.SETTLE))
    assert [a.name for a in sim.activities] == [INGRESS_READ]
    for _ in range(3):
        sim.apply(Event(Op.EXEC, act=INGRESS_READ))
    assert sim.ledger.row.last_accepted_digest == sim.oracle.digest
    result = replay(Trace("ingress-after-send", Profile(), tuple(sim.events)))
    assert not result.violations, result.violations


def test_a_pulse_that_arrived_after_the_ingress_read_was_requested_is_processed_again() -> None:
    result = replay(Trace("ingress-late", Profile(), (*_absorbed_prefix(), Event(Op.DELETE, n=1))))
    assert not result.violations, result.violations
    assert result.coverage.get("ingress.settled") == 1 and result.coverage.get("ingress.absorbed") == 1
    assert result.converged_after is None and result.coverage.get("verdict.TOMBSTONE_PENDING")


# --- mutation checks: the production rule weakened, the simulator finds it ---------------------------

def _dirty_as_clean(*_: Any, **__: Any) -> bool:
    """``coverage.follow_up_owed`` weakened: a dirty row after a judged read is treated as clean."""
    return False


def _failed_reads_cover(row: FenceSnapshot, verdict: Any, read_notified: int) -> int | None:
    """``coverage.covered_after`` weakened: any judged read covers its allocation, one that observed
    nothing (failed, stale) included."""
    return read_notified if read_notified > row.covered else None


_REAL_PLAN_NOTE = coverage.plan_note


def _dirtying_note_creates_no_work(row: FenceSnapshot, *, generation: int) -> NotePlan:
    """``coverage.plan_note`` weakened: a note that makes a clean ACTIVE row dirty creates no work
    (unless a read is in flight). With reads at the ingress it is masked (the ingress reads whatever
    ``work`` says); the workflow's own reads (``read_on_notification = false``) depend on it."""
    plan = _REAL_PLAN_NOTE(row, generation=generation)
    if row.notifications_seen <= row.covered and row.allocated_sequence <= row.covered \
            and row.state == S.ACTIVE and row.session_generation == generation:
        return NotePlan(notified=plan.notified, work=False)
    return plan


_REAL_APPLIED = SubscriptionFence.applied


def _late_report_moves_the_receipt(fence: SubscriptionFence, ordinal: int, result: AcceptResult,
                                   **kwargs: Any) -> None:
    """``SubscriptionFence.applied`` as before 1cb9fb6: every accepted verdict moves ``last_receipt_id``,
    a report of an older read that lands after a newer verdict included (the record then names two reads)."""
    _REAL_APPLIED(fence, ordinal, result, **kwargs)
    if result.verdict in (AcceptVerdict.ACCEPTED, AcceptVerdict.UNCHANGED, AcceptVerdict.TOMBSTONE_PENDING):
        fence.s.last_receipt_id = result.receipt_id


@pytest.mark.parametrize("module, name, broken, config", [
    ("mcpsync.workflows.subscription_state", "follow_up_owed", _dirty_as_clean, GATE_CONFIG),
    ("mcpsync.workflows.write_plan", "covered_after", _failed_reads_cover, GATE_CONFIG),
    ("mcpsync.workflows.coverage", "plan_note", _dirtying_note_creates_no_work,
     replace(GATE_CONFIG, read_on_notification=False)),
    ("mcpsync.workflows.subscription_state.SubscriptionFence", "applied", _late_report_moves_the_receipt,
     GATE_CONFIG),
], ids=["dirty-as-clean", "failed-reads-cover", "dirtying-note-no-work", "late-report-moves-receipt"])
def test_a_weakened_coverage_rule_is_found_and_shrunk(monkeypatch: pytest.MonkeyPatch, module: str, name: str,
                                                     broken: Any, config: SimConfig) -> None:
    """The production module's rule (or a class's method), weakened in place (the SQL ledger and the
    simulator use the same code): random schedules find a violation, shrunk to a short trace that is
    clean with the real rule."""
    monkeypatch.setattr(f"{module}.{name}", broken)
    _found_and_shrunk(monkeypatch, name, config, None)  # found at 44, 0, 53 and 12 (2026-12-07)


def _found_and_shrunk(monkeypatch: pytest.MonkeyPatch, name: str, config: SimConfig,
                      target: Invariant | None) -> None:
    """Schedules of the seed ``mutant-<name>`` until one violates ``target`` (None: anything), shrunk to
    a short trace that still does and that is clean once the weakened rule is restored."""
    for index in range(6000):  # stops at the first
        found = run_schedule(schedule_seed(f"mutant-{name}", index), config)
        if any(target in (None, v.invariant) for v in found.violations):
            break
    else:
        pytest.fail(f"the simulator never noticed the weakened {name}")
    target = target or found.violations[0].invariant
    small = shrink(found, config, target=target)
    assert len(small.events) <= 25, small.events
    hit = next(v for v in small.violations if v.invariant == target)
    print(f"{name}: schedule {index}: {target.value}: {len(small.events)} events: {hit.detail}")
    monkeypatch.undo()
    assert not replay(_trace(small.trace().to_json()), config).violations


# --- the verification schedule: the sweep keeps the bound, the watchdog finds what it missed ---------

def _due_late(period_seconds: float, draw: float) -> float:
    """``verification_rules.verification_delay`` weakened: the next verification is due after the whole
    period (and a second), so even a sweep that looks on time reads too late."""
    return period_seconds + 1


async def _look_skipped(program: Any) -> None:
    """``SubscriptionProgram._look`` weakened: the watchdog fires and asks the ledger nothing (no gap
    judged, no overdue report, no read of its own)."""
    program.keeper.looked(program.rt.now())


def _gap_never_overdue(**_: Any) -> GapJudgement:
    """``verification_rules.judge_gap`` weakened: no gap is ever over the period."""
    return GapJudgement(gap_seconds=None, overdue=False, report=False)


@pytest.mark.parametrize("module, name, broken, target", [
    ("mcpsync.workflows.verification_rules", "verification_delay", _due_late, Invariant.VERIFICATION_GAP),
    ("mcpsync.workflows.subscription_program.SubscriptionProgram", "_look", _look_skipped,
     Invariant.OVERDUE_MISSED),
    ("mcpsync.workflows.verification_rules", "judge_gap", _gap_never_overdue, Invariant.OVERDUE_MISSED),
], ids=["due-after-the-period", "watchdog-look-skipped", "gap-never-overdue"])
def test_a_weakened_verification_rule_is_found_and_shrunk(monkeypatch: pytest.MonkeyPatch, module: str,
                                                          name: str, broken: Any, target: Invariant) -> None:
    """A verification rule weakened in place is found by its invariant and shrunk: a due time computed
    wrongly breaks the bound a sweeping ingress keeps (``verification_gap``); a watchdog that skips the
    ledger's judgement leaves an overdue row unreported and unread (``overdue_missed``). Found at
    schedules 35, 3 and 0, shrunk to 6, 1 and 1 events (2026-12-07)."""
    monkeypatch.setattr(f"{module}.{name}", broken)
    _found_and_shrunk(monkeypatch, name, GATE_CONFIG, target)


def _sweeping() -> Simulation:
    """A subscription ACTIVE and idle after its initial read, its session host sweeping."""
    sim = Simulation("sweep", Profile(sweep=True), SimConfig())
    sim._flush()
    assert sim.ledger.row.state == S.ACTIVE and sim.ledger.scheduled_due() is not None
    return sim


def test_the_sweep_reads_a_due_row_at_its_due_time_and_the_watchdog_one_it_stopped_for() -> None:
    sim = _sweeping()
    period = Profile().safety_read_seconds
    verified, due = sim.ledger.verified_at, sim.ledger.scheduled_due()
    assert verified is not None and due is not None
    assert 0.84 * period <= (due - verified).total_seconds() <= 0.95 * period  # the ledger's jitter
    # While the ingress sweeps, the watchdog's timer (six hours) waits behind the due row; the sweep
    # event jumps to the due time, and the look's read at the ingress is allocated in that step.
    assert sim.wf.pending_timer == "watchdog" and not sim.apply(Event(Op.TIMER))
    ordinals = sim.ledger.row.last_issued_ordinal
    assert sim.apply(Event(Op.SWEEP)) and sim.now == due
    assert sim.ledger.row.last_issued_ordinal == ordinals + 1 and sim.ledger.verified_at == due
    for _ in range(2):
        sim.apply(Event(Op.EXEC, act=INGRESS_READ))  # read, accept: unchanged, it stays in the ledger
    assert not sim.activities and not sim.queue and sim.coverage.get("ingress.verdict.UNCHANGED") == 1
    # The ingress stops sweeping: the watchdog fires six hours on, reports the gap and reads.
    assert sim.apply(Event(Op.SWEEP_OFF)) and sim.apply(Event(Op.TIMER))
    sim._flush()
    overdue = [e for e in sim.ledger.outbox if e.event_type == OutboxEventType.OVERDUE]
    assert len(overdue) == 1 and sim.ledger.verified_at is not None and sim.ledger.verified_at > due
    result = replay(Trace("sweep", Profile(sweep=True), tuple(sim.events)))
    assert not result.violations, result.violations
    assert result.coverage.get("sweep.dispatched") == 1 and result.coverage.get("verification.overdue_gap")


# --- the start in one round trip -------------------------------------------------------------

def test_a_start_is_one_activity_that_subscribes_marks_and_reads() -> None:
    # A new subscription's start schedules one session-queue activity (five steps: subscribe, mark,
    # allocate, read, accept) and nothing else before it is ACTIVE with its initial read judged.
    sim = Simulation("start", Profile(), SimConfig())
    sim._flush()
    assert sim.ledger.row.state == S.ACTIVE and sim.ledger.row.read_reports
    assert sim.ledger.safety_read_seconds == Profile().safety_read_seconds  # the period the resync reads by
    names = [e.act for e in sim.events if e.op == Op.EXEC]
    assert names.count(Act.MCP_SUBSCRIBE_CYCLE) == 5 and Act.MCP_SUBSCRIBE not in names, names
    assert Act.MCP_READ_CYCLE not in names and Act.MARK_ACTIVE not in names, names
    assert sim.wf.fence.s.last_accepted_digest == sim.oracle.digest and sim.coverage["start_cycle"] == 1


def test_updates_noted_during_a_start_are_judged_without_reads_at_the_ingress() -> None:
    # Without reads at the ingress every update during a start reaches the run as a signal: a follow-up
    # the start's read did not cover must be kept (dropping it left changes unread: no_convergence).
    summary = run_schedules_in_processes("start-window", 0, 1000, SimConfig(faults=GATE_CONFIG.faults,
                                                                                     read_on_notification=False))
    assert not any(summary.violations.values()), summary.violations
    assert summary.coverage["start_cycle"] > 500 and summary.coverage["lost_response.mcp_subscribe_cycle"] > 0


def test_a_record_that_misnames_the_fence_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record check judges the fence state's receipt, watermark and digest; production's record (what
    the query answers) must name the same three, or the quiet end reports ``record_one_read``."""
    real = SubscriptionFence.record

    def misnamed(fence: SubscriptionFence, **kwargs: Any) -> Any:
        r = real(fence, **kwargs)
        return r.model_copy(update={"watermark": r.watermark + 1}) if r.last_receipt_id is not None else r

    monkeypatch.setattr(SubscriptionFence, "record", misnamed)
    found = next((r for r in (run_schedule(schedule_seed("misnamed", i)) for i in range(20))
                  if r.violations), None)
    assert found is not None
    assert {v.invariant for v in found.violations} == {Invariant.RECORD_ONE_READ}
    assert "fence state" in found.violations[0].detail


def test_the_simulator_reads_record_fields_without_pydantics_hook() -> None:
    """``sim.attributes``: once a batch of schedules ran, a record class of mcpsync has CPython's generic
    attribute lookup (``BaseModel``, for other models, keeps pydantic's); its fields read as before and
    a miss raises pydantic's message."""
    import ctypes

    from sim.attributes import _slot, plain_attribute_reads

    run_schedules("attributes", 0, 1)
    assert plain_attribute_reads() == 0  # once a process: done by the batch
    generic = ctypes.cast(ctypes.pythonapi.PyObject_GenericGetAttr, ctypes.c_void_p).value
    assert _slot(FenceSnapshot).value == generic and _slot(BaseModel).value != generic
    row = FenceSnapshot(exists=True, state=S.ACTIVE)
    assert (row.exists, row.state, getattr(row, "nope", None)) == (True, S.ACTIVE, None)
    with pytest.raises(AttributeError, match="'FenceSnapshot' object has no attribute 'nope'"):
        row.nope  # type: ignore[attr-defined]  # noqa: B018
