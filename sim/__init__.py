"""Deterministic simulator: the production programs under seeded adversarial schedules.

Contract:
- Pure and deterministic: no I/O, no wall clock, no threads, no hashing of ``id()``s; randomness only
  from ``random.Random`` seeded per schedule (``schedule_seed``). The same seed, config and code give
  the same events and the same result.
- Runs the SAME code production runs, not a re-implementation: the workflow is
  ``SubscriptionProgram`` interpreted by ``sim.interpreter.ProgramRun``; the session host's routing is
  ``workflows/ingress.IngressRouter`` driven by ``sim.ingress``; the ledger is ``sim.ledger.MemoryLedger``,
  which applies the pure plans ``activities/ledger/fence.py`` applies.
- The environment is adversarial and seeded (``sim.world``, ``sim.schedule``): an oracle server,
  notifications dropped, duplicated, delayed, reordered, from old sessions or for a URI variant;
  activities executed and completed in any order, at least once; session loss, continue-as-new,
  workflow reset with or without signal reapply, catalog words, identity conflicts, close, revoke,
  restart. Invariants (``sim.checker``) are checked after every step and at the quiet end; a
  failing schedule shrinks (``sim.shrinking``) to a replayable ``Trace``.
"""
