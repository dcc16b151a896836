"""The ingress's resync rule: when a subscribed URI is read at the ingress before its safety read is due.

Contract:
- Pure: times are plain seconds on one clock the caller keeps (the ingress's monotonic clock), no
  I/O. ``resync_due_at`` says when a URI whose last read was allocated at ``last_read_at`` is read
  again at the ingress, as if notified; ``sweep_seconds`` how often the ingress compares.
- Level-based: the ingress compares "last read at" with "due at" on every sweep; the comparison
  only decides *when* a synthetic note is fed to the router, never whether a read is correct. To
  the coverage rule a synthetic note is a spurious notification (``coverage.plan_note``), so the
  published staleness bound is still the workflow's own deadline timer's; the resync only makes
  the timer rarely fire.
- Due before the earliest deadline a resynced run can arm (``read_deadline.RESYNCED_JITTER_FLOOR``):
  at ``RESYNC_FRACTION`` of it, which leaves a sweep and a dispatch before the timer could fire.
"""

from __future__ import annotations

from collections.abc import Iterable

from mcpsync.workflows.read_deadline import RESYNCED_JITTER_FLOOR, dispatch_margin, jittered

__all__ = ["EARLIEST_JITTER", "RESYNC_FRACTION", "SWEEP_FRACTION", "resync_due_at", "sweep_seconds"]

EARLIEST_JITTER = jittered(RESYNCED_JITTER_FLOOR)
"""The earliest fraction of the requested-within period a resynced run's deadline falls at."""

RESYNC_FRACTION = 0.9
"""The resync is due at this fraction of the workflow's earliest deadline."""

SWEEP_FRACTION = 0.02
SWEEP_MIN_SECONDS = 0.2
SWEEP_MAX_SECONDS = 1.0
"""The ingress sweeps every 2 % of the shortest period (between 0.2 s and 1 s): well inside the gap
``RESYNC_FRACTION`` leaves before the earliest deadline (a tenth of it, 7 % of the period), and often
enough that one sweep's batch is small (10,000 URIs at a 300 s period: ~37 a sweep, not ~190)."""


def resync_due_at(last_read_at: float, period_seconds: float) -> float:
    """When a URI last read at ``last_read_at`` (its allocation requested then) is read again at the
    ingress: before the earliest time the workflow's deadline for the same read could fire."""
    earliest = EARLIEST_JITTER * (period_seconds - dispatch_margin(period_seconds))
    return last_read_at + RESYNC_FRACTION * earliest


def sweep_seconds(periods: Iterable[float]) -> float:
    """How often the ingress compares last reads with their due times: ``SWEEP_FRACTION`` of the
    shortest period, clamped; the longest sweep when there is no period at all."""
    shortest = min(periods, default=None)
    if shortest is None:
        return SWEEP_MAX_SECONDS
    return min(SWEEP_MAX_SECONDS, max(SWEEP_MIN_SECONDS, shortest * SWEEP_FRACTION))
