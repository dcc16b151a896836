"""The simulator as a release gate, and proof that its checker catches broken fences.

- A bounded run (5,000 seeded schedules, every fault class except the opt-in concurrent
  reads) must keep the seed's safety invariants at zero (``SAFETY_INVARIANTS``).
- The full gate (every invariant, liveness included) must be clean too. Every finding the
  simulator made (F1-F3, F5-F11) was fixed in fence.py / ledger.py / subscription.py; its
  minimal trace stays here as a regression test whose replay must come out clean.
  F4 (max_concurrent_reads > 1) is a documented limit, kept out of the gate.
- Deliberately broken judge functions, injected through ``SimConfig.judge``, are caught
  and shrunk to short replayable traces; the same seed gives the same JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from worker.stack import REPO_ROOT
from workflows.fence import IssuedRead, Judgement, judge_read
from workflows.records import (
    FenceSnapshot,
    ReadOutcome,
    SubscriptionState,
)
from workflows.simulation import (
    ALL_FAULTS,
    SAFETY_INVARIANTS,
    Event,
    Fault,
    Invariant,
    Op,
    Profile,
    SimConfig,
    Summary,
    Trace,
    replay,
    run_schedule,
    run_schedules,
    schedule_seed,
    shrink,
    summary_json,
)

S = SubscriptionState
GATE_SCHEDULES = 5000
GATE_CONFIG = SimConfig(faults=ALL_FAULTS - {Fault.CONCURRENT_READS})
# A small fault set, for tests that need a quick clean baseline to see an injected bug.
CLEAN_CONFIG = SimConfig(faults=ALL_FAULTS - {Fault.CONCURRENT_READS, Fault.RETRY, Fault.RESET, Fault.CONFLICT,
                                              Fault.SESSION_LOSS, Fault.CLOSE, Fault.POLLING})


@pytest.fixture(scope="module")
def gate() -> Summary:
    return run_schedules("ci-gate", 0, GATE_SCHEDULES, GATE_CONFIG, keep_failures=1)


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
                 "verdict.REVOKED", "update.old_session", "update.coalesced", "update.future_session",
                 "op.recreate", "op.restart", "op.catalog", "op.resume", "lost_response.ledger_accept",
                 "timer.poll", "timer.safety", "timer.reconcile"):
        assert cov.get(name, 0) > 0, name
    assert report["convergence_steps"]["schedules"] > GATE_SCHEDULES // 4


def test_bounded_gate_keeps_every_invariant_at_zero(gate: Summary) -> None:
    report = summary_json(gate, GATE_CONFIG)
    assert report["violations_total"] == 0, (report["violations"], gate.failing_indices)


# --- fixed findings: minimal traces that reproduced them (replay must stay clean) --------------------

FIXED_FINDINGS: dict[str, dict[str, Any]] = {
    # F1: ledger_allocate_read's response is lost after commit; Temporal retries it with the same
    # request_id and read_requests.request_id UNIQUE rejects it forever. The read task never
    # returns, its placeholder holds the only in-flight slot: no read ever again. Fixed: the same
    # uncompleted request id gets the same ticket.
    "F1_retried_allocate": {
        "seed": "f:9",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "complete", "act": "ledger_mark_active"},
            {"op": "exec", "act": "ledger_allocate_read", "fault": "lost"},
        ],
    },
    # F1 again through a workflow reset: the reset run re-dispatches the allocation pending at the
    # reset point with the same request_id. Fixed: a completed id gets a new ordinal under "<id>/<ordinal>".
    "F1_reset_redispatch": {
        "seed": "f:4",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "complete", "act": "ledger_mark_active"},
            {"op": "checkpoint"},
            {"op": "reset", "fault": "reapply"},
        ],
    },
    # F2: a resume update accepted in RECONCILIATION_REQUIRED, then a close wins the loop: the update
    # waits for resume_requested None forever, all_handlers_finished() never holds, run() never returns.
    # Fixed: the resume update also returns once the fence finished.
    "F2_resume_then_close": {
        "seed": "f:1023",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "complete", "act": "ledger_mark_active"},
            {"op": "conflict"},
            {"op": "resume"},
            {"op": "close"},
        ],
    },
    "F2_resume_then_revoke": {
        "seed": "f:1709",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": False},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "session_open"},
            {"op": "conflict"},
            {"op": "deliver"},
            {"op": "revoke"},
            {"op": "resume"},
        ],
    },
    # F3: a session change while the read's allocation is outstanding: subscribing() clears in_flight,
    # the read task's ``finally: in_flight.remove(placeholder)`` raised ValueError; trigger lost.
    # Fixed: the placeholder is removed only if still there.
    "F3_placeholder_cleared": {
        "seed": "f:76",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "complete", "act": "ledger_mark_active"},
            {"op": "reconnect"},
            {"op": "deliver", "n": 1},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
        ],
    },
    # F6: two resets to the same point re-derive the same follow-on request id ("<id>/<ordinal>");
    # read_requests.request_id UNIQUE refused the second forever. Fixed: the derivation follows the chain.
    "F6_second_reset_same_point": {
        "seed": "ci-gate:3886",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "complete", "act": "ledger_mark_active"},
            {"op": "exec", "act": "ledger_allocate_read"},
            {"op": "checkpoint"},
            {"op": "complete", "act": "ledger_allocate_read"},
            {"op": "exec", "act": "mcp_read"},
            {"op": "complete", "act": "mcp_read"},
            {"op": "exec", "act": "ledger_accept"},
            {"op": "reset", "fault": "reapply"},
            {"op": "reset"},
        ],
    },
    # F7: an update recorded by the ingress before a read was allocated was skipped as COVERED, then
    # that read failed (malformed): the change went unread until the safety re-read. Fixed: a failed
    # or abandoned covering read hands its covered updates a FOLLOW_UP read.
    "F7_covering_read_failed": {
        "seed": "ci-gate:569",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "complete", "act": "ledger_mark_active"},
            {"op": "delete", "n": 1},
            {"op": "exec", "act": "ledger_allocate_read"},
            {"op": "complete", "act": "ledger_allocate_read"},
            {"op": "exec", "act": "mcp_read", "fault": "malformed"},
        ],
    },
    # F8: reset (without reapply) past a durable close while RECONCILIATION_REQUIRED: a read's reload
    # adopted the UNSUBSCRIBING row but the loop kept waiting for a resume. Fixed: the wait also wakes
    # when the state leaves RECONCILIATION_REQUIRED (TOMBSTONE_PENDING likewise).
    "F8_reset_past_close_in_reconciliation": {
        "seed": "ci-gate:977",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "complete", "act": "ledger_mark_active"},
            {"op": "conflict"},
            {"op": "exec", "act": "ledger_set_state"},
            {"op": "complete", "act": "ledger_set_state"},
            {"op": "checkpoint"},
            {"op": "exec", "act": "ledger_audit"},
            {"op": "complete", "act": "ledger_audit"},
            {"op": "close"},
            {"op": "exec", "act": "ledger_begin_unsubscribe"},
            {"op": "reset"},
        ],
    },
    # F7 again: after a reset the covering read was judged STALE (an orphan of the old run won);
    # a STALE or STALE_AFTER_CLOSE covering read now hands its covered updates a read too.
    "F7_covering_read_stale_after_reset": {
        "seed": "release-100k:17414",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "complete", "act": "ledger_mark_active"},
            {"op": "checkpoint"},
            {"op": "exec", "act": "ledger_allocate_read"},
            {"op": "complete", "act": "ledger_allocate_read"},
            {"op": "exec", "act": "mcp_read", "fault": "error"},
            {"op": "complete", "act": "mcp_read"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "mutate", "n": 3, "fault": "same_id"},
            {"op": "reset", "fault": "reapply"},
            {"op": "exec", "act": "ledger_allocate_read"},
            {"op": "complete", "act": "ledger_allocate_read"},
        ],
    },
    # F9: continue-as-new waits for every handler to finish, but a close update waits for the workflow
    # to finish: deadlock. Fixed: the wait also wakes for a close, revocation or conflict, served first.
    "F9_close_during_continue_as_new_wait": {
        "seed": "release-100k:26923",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "can"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "complete", "act": "ledger_mark_active"},
            {"op": "checkpoint"},
            {"op": "exec", "act": "ledger_allocate_read"},
            {"op": "complete", "act": "ledger_allocate_read"},
            {"op": "exec", "act": "mcp_read"},
            {"op": "reconnect"},
            {"op": "deliver"},
            {"op": "complete", "act": "mcp_read"},
            {"op": "exec", "act": "ledger_accept"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "reset"},
            {"op": "exec", "act": "ledger_allocate_read"},
            {"op": "complete", "act": "ledger_allocate_read"},
            {"op": "close"},
        ],
    },
    # F10: an accept judged before the revocation returned TOMBSTONE_PENDING after the workflow had
    # adopted REVOKED; applied() moved a finished fence back to TOMBSTONE_PENDING and the close update
    # never returned. Fixed: late verdicts (and lagging snapshots) never leave a terminal state.
    "F10_verdict_lands_after_revocation": {
        "seed": "release-100k:32513",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "reconnect"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "deliver"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "complete", "act": "ledger_mark_active"},
            {"op": "exec", "act": "ledger_allocate_read"},
            {"op": "complete", "act": "ledger_allocate_read"},
            {"op": "delete", "n": 1},
            {"op": "exec", "act": "mcp_read"},
            {"op": "complete", "act": "mcp_read"},
            {"op": "exec", "act": "ledger_accept"},
            {"op": "deliver"},
            {"op": "old_note", "n": 1},
            {"op": "deliver"},
            {"op": "revoke"},
            {"op": "exec", "act": "ledger_revoke"},
            {"op": "complete", "act": "ledger_revoke"},
            {"op": "complete", "act": "ledger_accept"},
            {"op": "close"},
        ],
    },
    # F11: a reset run re-asked an allocation still pending: the idempotent ticket carried today's update
    # counter, so a notification recorded after the original allocation counted as covered by a read
    # served before the change. Fixed: read_requests keeps the counter its allocation saw.
    "F11_retried_allocation_keeps_its_counter": {
        "seed": "release-100k:64250",
        "profile": {"capability": "subscribe", "max_concurrent_reads": 1, "session_at_start": True},
        "events": [
            {"op": "exec", "act": "ledger_ensure_subscription"},
            {"op": "complete", "act": "ledger_ensure_subscription"},
            {"op": "exec", "act": "ledger_current_session"},
            {"op": "complete", "act": "ledger_current_session"},
            {"op": "exec", "act": "ledger_begin_subscription"},
            {"op": "complete", "act": "ledger_begin_subscription"},
            {"op": "exec", "act": "mcp_subscribe"},
            {"op": "complete", "act": "mcp_subscribe"},
            {"op": "exec", "act": "ledger_mark_active"},
            {"op": "complete", "act": "ledger_mark_active"},
            {"op": "exec", "act": "ledger_allocate_read"},
            {"op": "checkpoint"},
            {"op": "complete", "act": "ledger_allocate_read"},
            {"op": "exec", "act": "mcp_read"},
            {"op": "complete", "act": "mcp_read"},
            {"op": "reset", "fault": "reapply"},
            {"op": "mutate", "n": 1},
            {"op": "exec", "act": "ledger_allocate_read"},
            {"op": "exec", "act": "ledger_accept"},
            {"op": "complete", "act": "ledger_allocate_read"},
        ],
    },
}

# F4 (SubscriptionOptions.max_concurrent_reads > 1): ordinal order is not serve order. Read 3 was
# allocated after read 2 but served before the next mutation, so accepting 2 then 3 regresses.
F4_CONCURRENT_READS = {
    "seed": "f:6718",
    "profile": {"capability": "subscribe", "max_concurrent_reads": 3, "session_at_start": True},
    "events": [
        {"op": "exec", "act": "ledger_ensure_subscription"},
        {"op": "complete", "act": "ledger_ensure_subscription"},
        {"op": "exec", "act": "ledger_current_session"},
        {"op": "complete", "act": "ledger_current_session"},
        {"op": "exec", "act": "ledger_begin_subscription"},
        {"op": "complete", "act": "ledger_begin_subscription"},
        {"op": "exec", "act": "mcp_subscribe"},
        {"op": "complete", "act": "mcp_subscribe"},
        {"op": "mutate", "n": 1},
        {"op": "exec", "act": "ledger_mark_active"},
        {"op": "complete", "act": "ledger_mark_active"},
        {"op": "exec", "act": "ledger_allocate_read"},
        {"op": "deliver", "n": 1},
        {"op": "mutate", "n": 1},
        {"op": "deliver"},
        {"op": "exec", "act": "ledger_allocate_read"},
        {"op": "exec", "act": "ledger_allocate_read"},
        {"op": "complete", "n": 2, "act": "ledger_allocate_read"},
        {"op": "complete", "act": "ledger_allocate_read"},
        {"op": "exec", "n": 1, "act": "mcp_read"},
        {"op": "exec", "act": "mcp_read"},
        {"op": "complete", "n": 1, "act": "mcp_read"},
        {"op": "complete", "act": "ledger_allocate_read"},
        {"op": "exec", "act": "ledger_accept"},
        {"op": "mutate", "n": 1},
        {"op": "exec", "act": "mcp_read"},
        {"op": "complete", "act": "mcp_read"},
        {"op": "complete", "act": "mcp_read"},
        {"op": "exec", "n": 1, "act": "ledger_accept"},
    ],
}


def _trace(doc: dict[str, Any]) -> Trace:
    return Trace.from_json(json.loads(json.dumps(doc)))  # through JSON, as a user would replay it


@pytest.mark.parametrize("name", sorted(FIXED_FINDINGS))
def test_fixed_finding_stays_fixed(name: str) -> None:
    result = replay(_trace(FIXED_FINDINGS[name]))
    assert not result.violations, result.violations


TRACES = Path(__file__).parent / "sim_traces"
STALENESS_TRACES = sorted(TRACES.glob("staleness-*.json"))


@pytest.mark.parametrize("path", STALENESS_TRACES, ids=[p.stem for p in STALENESS_TRACES])
def test_staleness_bound_finds_restarted_timers_and_deadlines_keep_it(path: Path) -> None:
    # Issue 15: a catalog word (or a continue-as-new) restarted the poll / safety timer, so the
    # published bound was broken. The pre-patch program (read_deadlines=False, what runs recorded
    # before PATCH_READ_DEADLINES still execute) violates staleness_bound; deadlines keep it.
    trace = Trace.from_json(json.loads(path.read_text()))
    old = replay(trace, SimConfig(read_deadlines=False))
    assert [v.invariant for v in old.violations] == [Invariant.STALENESS_BOUND], old.violations
    assert [f"{v.invariant.value}@{v.step}: {v.detail}" for v in old.violations] == list(trace.violations)
    new = replay(trace)
    assert not new.violations, new.violations


FINDING_TRACES = sorted(TRACES.glob("finding-*.json"))


@pytest.mark.parametrize("path", FINDING_TRACES, ids=[p.stem for p in FINDING_TRACES])
def test_fixed_finding_trace_replays_clean(path: Path) -> None:
    # Shrunk traces of findings made after the in-file FIXED_FINDINGS (each file says what it found).
    result = replay(Trace.from_json(json.loads(path.read_text())))
    assert not result.violations, result.violations


def test_staleness_bound_is_found_by_random_schedules_of_the_old_program() -> None:
    # Not only the stored traces: the generator itself finds the restarted timer within a few
    # hundred schedules, so the gate would have caught it.
    old = run_schedules("legacy-timers", 0, 300, SimConfig(faults=GATE_CONFIG.faults, read_deadlines=False))
    assert old.violations[Invariant.STALENESS_BOUND.value] > 0
    assert {k for k, v in old.violations.items() if v} == {Invariant.STALENESS_BOUND.value}


def test_concurrent_reads_regress_versions() -> None:
    result = replay(_trace(F4_CONCURRENT_READS))
    assert [v.invariant for v in result.violations][:1] == [Invariant.VERSION_REGRESSION]


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
    return judge_read(row.model_copy(update={"last_accepted_ordinal": 0}), issued, outcome, row_uri=row_uri)


@pytest.mark.parametrize(("judge", "faults", "caught"), [
    (judge_ignoring_close, CLEAN_CONFIG.faults | {Fault.CLOSE},
     {Invariant.OUTBOX_AFTER_CLOSE, Invariant.NOT_ACTIVE_WRITE, Invariant.LATE_TOMBSTONE}),
    (judge_without_ordinal_fence, CLEAN_CONFIG.faults | {Fault.RESET},
     {Invariant.VERSION_REGRESSION}),
])
def test_broken_judge_is_caught_and_shrunk(judge: Any, faults: frozenset[Fault], caught: set[Invariant]) -> None:
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
    first = json.dumps(summary_json(run_schedules("det", 0, 300)), sort_keys=True)
    second = json.dumps(summary_json(run_schedules("det", 0, 300)), sort_keys=True)
    assert first == second
    assert json.dumps(summary_json(run_schedules("det2", 0, 300)), sort_keys=True) != first


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
    events = (Event(Op.MUTATE, n=1), Event(Op.CHECKPOINT), Event(Op.CAN), Event(Op.MUTATE, n=2, fault="same_id"),
              Event(Op.RESET, fault="reapply"), Event(Op.MUTATE, n=1))
    result = replay(Trace("lifecycle", Profile(), events), GATE_CONFIG)
    assert not result.violations, result.violations
    assert result.coverage.get("reset") == 1 and result.converged_after is not None


# --- the command ---------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "worker.cli", "simulate", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)


def test_simulate_command_gates_and_replays(tmp_path: Path) -> None:
    run = _cli("--schedules", "200", "--seed", "cli", "--workers", "1", "--json")
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["schedules"] == 200 and report["violations_total"] == 0
    assert "concurrent_reads" not in report["faults"]  # F4 is out of the gate unless asked for
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps(FIXED_FINDINGS["F9_close_during_continue_as_new_wait"]))
    again = _cli("--replay", str(fixed))
    assert again.returncode == 0 and "no violation" in again.stdout
    f4 = tmp_path / "f4.json"
    f4.write_text(json.dumps(F4_CONCURRENT_READS))
    broken = _cli("--replay", str(f4))
    assert broken.returncode == 1 and "version_regression" in broken.stdout + broken.stderr
