"""Deterministic simulator: the production programs under seeded adversarial schedules.

Contract:
- Pure and deterministic: no I/O, no wall clock, no threads, no hashing of ``id()``s; randomness only
  from ``random.Random`` seeded per schedule (``schedule_seed``). The same seed, config and code give
  the same events and the same result.
- Runs the SAME code production runs, not a re-implementation: the workflow is
  ``SubscriptionProgram`` interpreted by ``sim.runtime.ProgramRun``; the session host's routing is
  ``workflows/ingress.IngressRouter`` driven by ``sim.ingress``; the ledger is ``sim.ledger.MemoryLedger``,
  which applies the pure plans ``activities/ledger_fence.py`` applies.
- The environment is adversarial and seeded (``sim.world``, ``sim.schedule``): an oracle server,
  notifications dropped, duplicated, delayed, reordered, from old sessions or for a URI variant;
  activities executed and completed in any order, at least once; session loss, continue-as-new,
  workflow reset with or without signal reapply, catalog words, identity conflicts, close, revoke,
  restart. Invariants (``sim.checker``) are checked after every step and at the quiet end; a
  failing schedule shrinks (``sim.shrinking``) to a replayable ``Trace``.

This module is the simulator's public face: ``mcpsync simulate`` and the tests import from here.
"""

from __future__ import annotations

from sim.engine import Simulation
from sim.ledger import LedgerIntegrityError, LedgerWrite, MemoryLedger
from sim.model import (
    ALL_FAULTS,
    INGRESS_READ,
    KEY,
    SAFETY_INVARIANTS,
    SUBSCRIBE_CYCLE_READ,
    Event,
    Fault,
    Invariant,
    JudgeFn,
    Op,
    Profile,
    ScheduleResult,
    SimConfig,
    Trace,
    Violation,
    schedule_seed,
)
from sim.runner import (
    Summary,
    merge_summaries,
    run_schedules,
    run_schedules_in_processes,
    shrink_failures,
    summary_json,
    worker_count,
)
from sim.schedule import replay, run_schedule
from sim.shrinking import delta_debug, shrink
from sim.world import Activity, Checkpoint, McpServer, Message, Oracle

__all__ = [
    "Invariant", "SAFETY_INVARIANTS", "Violation", "Fault", "ALL_FAULTS", "Op", "Event", "Profile", "Trace",
    "SimConfig", "JudgeFn", "INGRESS_READ", "KEY", "SUBSCRIBE_CYCLE_READ", "LedgerIntegrityError",
    "LedgerWrite", "MemoryLedger", "Oracle", "McpServer", "Message", "Activity", "Checkpoint", "Simulation",
    "ScheduleResult",
    "Summary", "schedule_seed", "run_schedule", "replay", "delta_debug", "shrink", "run_schedules",
    "run_schedules_in_processes", "worker_count", "merge_summaries", "shrink_failures", "summary_json",
]
