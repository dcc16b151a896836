"""Regression traces of the simulator's fixed findings, re-derived on the 0.2.0 program.

Each trace in ``sim_traces/`` reproduces the *situation* of one finding of docs/simulation.md (the
same sequence of operations: a reset at the point, a close during the continue-as-new wait, ...),
found by ``sim.situations.search`` in seeded schedules and shrunk. Every trace must replay clean
and still reach its situation (else the program changed under it: re-derive it). Some have teeth:
with the production rule they guard reverted (monkeypatched), the replay reports the violation.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from mcpsync.workflows import write_plan
from mcpsync.workflows.interpreter import WaitKind
from mcpsync.workflows.records.ledger import AcceptVerdict, AllocateRequest, FenceSnapshot, ReadTicket
from mcpsync.workflows.records.subscription import ResumeRequest, SubscriptionStart
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from mcpsync.workflows.subscription_identity import CatalogAndIdentity
from mcpsync.workflows.subscription_program import SubscriptionProgram
from mcpsync.workflows.subscription_state import SubscriptionFence
from sim.ledger import LedgerIntegrityError, MemoryLedger
from sim.model import Invariant, Trace
from sim.schedule import replay
from sim.situations import observe

TRACES = Path(__file__).parent / "sim_traces"
PATHS = sorted(TRACES.glob("*.json"))


def _load(name: str) -> tuple[Trace, dict[str, Any]]:
    doc = json.loads((TRACES / f"{name}.json").read_text())
    return Trace.from_json(doc), doc


def test_every_finding_has_its_trace() -> None:
    # Every finding whose situation the baseline
    # program can still reach keeps a trace (the others are explained in docs/simulation.md).
    stems = {p.stem for p in PATHS}
    for prefix in ("F1-retried-allocate", "F1-reset-redispatch", "F9-", "F13-", "F2-resume-then-close",
                   "F2-resume-then-revoke", "F3-", "F6-", "F7-covering-read-failed",
                   "F7-covering-read-stale-after-reset", "F8-", "F10-verdict-lands-after-revocation",
                   "F11-retried-allocation-keeps-its-counter", "F14-",
                   "staleness-catalog-word-restarts-poll-timer",
                   "staleness-continue-as-new-restarts-deadline-timer"):
        assert any(s.startswith(prefix) for s in stems), prefix


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_fixed_finding_trace_replays_clean_and_reaches_its_situation(path: Path) -> None:
    doc = json.loads(path.read_text())
    assert doc["finding"] and doc["situation"]
    trace = Trace.from_json(doc)
    result = replay(trace)
    assert not result.violations, result.trace().violations
    tags, clean = observe(trace)
    assert clean
    assert doc["situation"] in tags, (f"the trace no longer reaches {doc['situation']}: re-derive it "
                                      f"({sorted(tags)})")


# --- teeth: the production rule reverted, the same trace reports the violation ------------------------


def _violated(trace: Trace) -> set[Invariant]:
    return {v.invariant for v in replay(trace).violations}


def test_catalog_word_trace_catches_a_timer_restarted_by_the_word(monkeypatch: pytest.MonkeyPatch) -> None:
    trace, _ = _load("staleness-catalog-word-restarts-poll-timer")
    assert not _violated(trace)
    apply_catalog = CatalogAndIdentity.apply_catalog

    async def restarting(self: CatalogAndIdentity) -> None:  # the rule before read_due_at (F12)
        await apply_catalog(self)
        program = self.program
        period = program._read_period()
        if period and program.fence.s.read_due_at is not None:
            now, s = program.rt.now(), program.fence.s
            s.read_due_at, s.read_armed_from = now + timedelta(seconds=period), now

    monkeypatch.setattr(CatalogAndIdentity, "apply_catalog", restarting)
    assert Invariant.STALENESS_BOUND in _violated(trace)


def test_continue_as_new_trace_catches_a_deadline_timer_restarted_by_the_new_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    trace, _ = _load("staleness-continue-as-new-restarts-deadline-timer")
    assert not _violated(trace)
    init = SubscriptionProgram.__init__

    def forgetting(self: SubscriptionProgram, *args: Any) -> None:  # the new run starts its timer afresh
        init(self, *args)
        if self.start.carried_state is not None:
            self.fence.s.read_due_at = self.fence.s.read_armed_from = None

    monkeypatch.setattr(SubscriptionProgram, "__init__", forgetting)
    assert Invariant.STALENESS_BOUND in _violated(trace)


@pytest.mark.parametrize("name", ["F2-resume-then-close", "F2-resume-then-revoke"])
def test_resume_traces_catch_a_resume_update_that_ignores_the_finished_fence(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    trace, _ = _load(name)
    assert not _violated(trace)

    async def on_resume(self: SubscriptionProgram, req: ResumeRequest) -> ResourceSubscriptionV1:  # before F2
        self.identity.resume_requested = req
        await self._wait(lambda: self.identity.resume_requested is None, None, WaitKind.RESUME_UPDATE)
        return self.record()

    monkeypatch.setattr(SubscriptionProgram, "on_resume", on_resume)
    assert _violated(trace)


def test_placeholder_trace_catches_a_release_that_assumes_the_slot_is_still_there(
        monkeypatch: pytest.MonkeyPatch) -> None:
    trace, _ = _load("F3-placeholder-cleared")
    assert not _violated(trace)

    def release(self: SubscriptionFence, placeholder: int) -> None:  # before F3
        self.s.in_flight.remove(placeholder)

    monkeypatch.setattr(SubscriptionFence, "release_placeholder", release)
    assert Invariant.WORKFLOW_ERROR in _violated(trace)


def test_close_during_continue_as_new_wait_trace_catches_a_wait_only_for_handlers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    trace, _ = _load("F9-close-during-continue-as-new-wait")
    assert not _violated(trace)

    async def continue_as_new(self: SubscriptionProgram) -> None:  # before F9: only a drained run goes on
        rt = self.rt
        await self._wait(lambda: not self.reads_running and rt.all_handlers_finished(), None,
                         WaitKind.CONTINUE_AS_NEW)
        rt.continue_as_new(SubscriptionStart(key=self.key, options=self.options,
                                             carried_state=self.fence.s.model_dump(mode="json"),
                                             seen_signal_ids=self.seen_ids))

    monkeypatch.setattr(SubscriptionProgram, "_continue_as_new", continue_as_new)
    assert Invariant.NO_CONVERGENCE in _violated(trace)


# The allocation rules (F1, F6) live in the ledger's SQL; the simulator's MemoryLedger models them.
# Reverting the model's rule shows the traces reach it (teeth for the model, not for ledger.py).

def _unique_refuses(refuses: Callable[[MemoryLedger, AllocateRequest], bool]
                    ) -> Callable[..., Awaitable[ReadTicket]]:
    allocate = MemoryLedger.allocate_read

    async def allocate_read(self: MemoryLedger, req: AllocateRequest) -> ReadTicket:
        if refuses(self, req):
            raise LedgerIntegrityError(f"read_requests.request_id UNIQUE: {req.request_id}")
        return await allocate(self, req)

    return allocate_read


def _chain(ledger: MemoryLedger, request_id: str) -> int:
    """How many finished allocations the request id's derivation chain holds."""
    n = 0
    while (prior := ledger.request_ids.get(request_id)) is not None \
            and ledger.read_requests[prior]["completed_at"] is not None:
        n, request_id = n + 1, f"{request_id}/{prior}"
    return n


@pytest.mark.parametrize(("name", "refuses"), [
    # before F1: any id asked again is refused, a retry's (same cycle) or a reset run's
    ("F1-retried-allocate", lambda led, req: req.request_id in led.request_ids
     or req.cycle_id in led.cycle_ids),
    ("F1-reset-redispatch", lambda led, req: _chain(led, req.request_id) >= 1),
    # before F6: the derivation does not follow the chain (a second reset re-derives the same id)
    ("F6-second-reset-same-point", lambda led, req: _chain(led, req.request_id) >= 2),
], ids=["F1-retried", "F1-reset", "F6"])
def test_allocation_traces_catch_the_model_without_its_idempotence(
        name: str, refuses: Callable[[MemoryLedger, AllocateRequest], bool],
        monkeypatch: pytest.MonkeyPatch) -> None:
    trace, _ = _load(name)
    assert not _violated(trace)
    monkeypatch.setattr(MemoryLedger, "allocate_read", _unique_refuses(refuses))
    assert Invariant.LEDGER_INTEGRITY in _violated(trace)


@pytest.mark.parametrize("name", ["F7-covering-read-failed", "F7-covering-read-stale-after-reset"])
def test_covering_read_traces_catch_a_read_that_covers_without_observing(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    trace, _ = _load(name)
    assert not _violated(trace)

    def covered_after(row: FenceSnapshot, verdict: AcceptVerdict, read_notified: int) -> int | None:
        return None if read_notified <= row.covered else read_notified  # before F7: any judged read covers

    monkeypatch.setattr(write_plan, "covered_after", covered_after)
    assert Invariant.COVERED_UNREAD in _violated(trace)
