"""The runner: many schedules, in one process or several, merged into one ``Summary``.

Contract:
- ``run_schedules(seed, start, stop)`` runs schedules ``start``..``stop-1`` of ``seed``;
  ``run_schedules_in_processes`` splits the range over spawned worker processes and merges (the same
  summary as one process gives); ``shrink_failures`` turns the first failures into shrunk traces;
  ``summary_json`` is what ``mcpsync simulate --json`` prints.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sim.attributes import plain_attribute_reads
from sim.model import Invariant, ScheduleResult, SimConfig, schedule_seed
from sim.schedule import run_schedule
from sim.shrinking import shrink

__all__ = ["Summary", "run_schedules", "worker_count", "run_schedules_in_processes", "shrink_failures",
           "merge_summaries", "summary_json"]


def _percentile(sorted_values: Sequence[int], q: float) -> int:
    if not sorted_values:
        return 0
    idx = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[idx]


@dataclass(slots=True)
class Summary:
    """Aggregate of a run of schedules; ``merge_summaries`` combines disjoint index ranges."""

    seed: str
    schedules: int = 0
    events: int = 0
    steps: int = 0
    violations: dict[str, int] = field(default_factory=lambda: {i.value: 0 for i in Invariant})
    failing_schedules: int = 0
    failing_indices: list[int] = field(default_factory=list)  # the first few, in index order
    failures: list[dict[str, Any]] = field(default_factory=list)  # shrunk traces (``shrink_failures``)
    notification_reads: int = 0
    fresh_reads: int = 0
    duplicate_deliveries: int = 0
    covered_updates: int = 0
    convergence: list[int] = field(default_factory=list)
    coverage: dict[str, int] = field(default_factory=dict)


def run_schedules(seed: int | str, start: int, stop: int, config: SimConfig = SimConfig(), *,
                  keep_failures: int = 3) -> Summary:
    """Schedules ``start``..``stop-1`` of ``seed``; failures are recorded by index (``shrink_failures``
    turns the first few into minimal traces once, after merging). Each schedule's result is folded
    into the total at once, so the heap stays one schedule deep (``_collected_per_schedule``). The
    process reads the records' fields without pydantic's hook from then on (``sim.attributes``): only
    a batch of schedules does, not a single ``Simulation`` in a process that runs other code too."""
    plain_attribute_reads()
    total = Summary(seed=str(seed))
    with _collected_per_schedule() as collect:
        for i in range(start, stop):
            _fold(total, i, run_schedule(schedule_seed(seed, i), config))
            del total.failing_indices[keep_failures:]  # in index order: the first few
            collect()
    return total


@contextmanager
def _collected_per_schedule() -> Iterator[Callable[[], object]]:
    """The cyclic garbage collector runs once per schedule (the ``collect`` yielded), not on its
    allocation counts. A schedule's objects (the coroutines, the simulation and its parts) refer to
    each other, so only the collector frees them; collected by count, many survive a young
    collection while their schedule runs and are traversed again in the older generations (about a
    seventh of the CPU time, measured); collected after the schedule, each is traversed once, as
    garbage. Automatic collection is restored on exit."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield lambda: gc.collect(0)
    finally:
        if enabled:
            gc.enable()


def _fold(out: Summary, index: int, r: ScheduleResult) -> None:
    """Add schedule ``index``'s result to ``out`` (its index appended if it failed: the caller cuts the
    list), as ``_absorb`` adds a summary: each violated invariant counts once."""
    out.schedules += 1
    out.events += len(r.events)
    out.steps += r.steps
    if r.violations:
        out.failing_schedules += 1
        out.failing_indices.append(index)
        for invariant in {v.invariant.value for v in r.violations}:
            out.violations[invariant] = out.violations.get(invariant, 0) + 1
    out.notification_reads += r.notification_reads
    out.fresh_reads += r.fresh_reads
    out.duplicate_deliveries += r.duplicate_deliveries
    out.covered_updates += r.covered_updates
    if r.converged_after is not None:
        out.convergence.append(r.converged_after)
    coverage = out.coverage
    for k, v in r.coverage.items():
        coverage[k] = coverage.get(k, 0) + v


def worker_count(requested: int, schedules: int) -> int:
    """Processes for ``schedules`` schedules: ``requested`` (0: one per CPU), at most one per schedule."""
    return max(1, min(requested or os.cpu_count() or 1, schedules))


def run_schedules_in_processes(seed: int | str, start: int, stop: int, config: SimConfig = SimConfig(), *,
                               workers: int = 0, keep_failures: int = 3) -> Summary:
    """``run_schedules`` over ``workers`` processes (0: one per CPU), merged: the same summary as one
    process gives. Four chunks per worker, so a chunk of long schedules does not leave the others
    idle. Processes are spawned, not forked: the caller may hold threads (a Temporal runtime, a
    test session's servers) whose locks a forked child would inherit. ``config`` is pickled: its
    seams must be module-level functions."""
    n = stop - start
    workers = worker_count(workers, n)
    if workers == 1:
        return run_schedules(seed, start, stop, config, keep_failures=keep_failures)
    bounds = [start + n * i // (workers * 4) for i in range(workers * 4 + 1)]
    chunks = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = list(pool.map(run_schedules, [seed] * len(chunks), [a for a, _ in chunks],
                              [b for _, b in chunks], [config] * len(chunks)))
    return merge_summaries(parts, keep_failures=keep_failures)


def shrink_failures(summary: Summary, config: SimConfig = SimConfig(), *, limit: int = 3) -> Summary:
    """Replay and shrink the first ``limit`` failing schedules into ``summary.failures``."""
    summary.failures = []
    for index in summary.failing_indices[:limit]:
        r = run_schedule(schedule_seed(summary.seed, index), config)
        shrunk = shrink(r, config)
        summary.failures.append({"index": index, "original_events": len(r.events),
                                 "trace": shrunk.trace().to_json()})
    return summary


def merge_summaries(parts: Sequence[Summary], *, keep_failures: int = 3) -> Summary:
    out = Summary(seed=parts[0].seed if parts else "")
    for p in parts:
        _absorb(out, p)
    out.failing_indices = sorted(out.failing_indices)[:keep_failures]
    return out


def _absorb(out: Summary, p: Summary) -> None:
    """Add ``p``'s counts to ``out`` (the failing indices appended: the caller sorts and cuts them)."""
    out.schedules += p.schedules
    out.events += p.events
    out.steps += p.steps
    out.failing_schedules += p.failing_schedules
    out.notification_reads += p.notification_reads
    out.fresh_reads += p.fresh_reads
    out.duplicate_deliveries += p.duplicate_deliveries
    out.covered_updates += p.covered_updates
    out.convergence.extend(p.convergence)
    for k, v in p.violations.items():
        out.violations[k] = out.violations.get(k, 0) + v
    for k, v in p.coverage.items():
        out.coverage[k] = out.coverage.get(k, 0) + v
    out.failing_indices.extend(p.failing_indices)


def summary_json(s: Summary, config: SimConfig = SimConfig()) -> dict[str, Any]:
    conv = sorted(s.convergence)
    return {
        "seed": s.seed,
        "schedules": s.schedules,
        "events": s.events,
        "steps": s.steps,
        "faults": sorted(f.value for f in config.faults),
        "violations": dict(sorted(s.violations.items())),
        "violations_total": sum(s.violations.values()),
        "failing_schedules": s.failing_schedules,
        "read_amplification": {
            "reads_per_distinct_change":
                round(s.notification_reads / s.fresh_reads, 4) if s.fresh_reads else 0.0,
            "notification_reads": s.notification_reads,
            "reads_that_saw_a_new_version": s.fresh_reads,
            "duplicate_deliveries_deduped": s.duplicate_deliveries,
            "updates_covered_without_a_read": s.covered_updates,
            "read_on_notification": config.read_on_notification,
        },
        "convergence_steps": {"schedules": len(conv), "p50": _percentile(conv, 0.5),
                              "p99": _percentile(conv, 0.99), "p999": _percentile(conv, 0.999),
                              "max": conv[-1] if conv else 0},
        "coverage": dict(sorted(s.coverage.items())),
        "failures": s.failures,
    }
