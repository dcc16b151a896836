"""The ledger's verification schedule and the watchdog's judgement of it.

Contract:
- Pure: times are datetimes and seconds the caller passes in (the ledger's transaction time, the
  workflow's ``now``), no I/O, no clock of its own.
- A *verification* is a granted read allocation of a scheduled row (ACTIVE, subscribed, with a
  safety-read period: ``subscriptions.safety_read_seconds``), whoever asked for it: the ingress's
  sweep, a notification, the workflow's own read. The transaction that grants it records it on the
  row (``activities/ledger/verification.py``): ``verified_at`` := now, ``verify_due_at`` := now +
  ``verification_delay`` (jittered), ``worst_gap_seconds`` := the widest gap between consecutive
  verifications since the watchdog last looked. ``mark_active`` starts a new chain (a new
  subscription generation's first read has no predecessor).
- The schedule is the ledger's: the ingress holding the (subject, server) lease sweeps rows whose
  ``verify_due_at`` passed (one indexed query), level-based: a new lease holder finds every overdue
  row at once. A swept row is claimed (due again ``claim_delay`` later) so a read that is refused
  or fails is tried again without a hot loop; the next granted allocation re-arms it.
- The published bound: consecutive verifications at most one period apart. A sweep feeds a due row
  at 0.85-0.95 of the period (less the dispatch margin), which leaves the margin and a tenth of the
  period for the sweep's interval, the queue and the allocation.
- The watchdog (the workflow's rare timer, ``WATCHDOG_HORIZON``) asks ``judge_watch``: a gap over
  the period since its last look is a breach (an ``overdue`` outbox event); a current gap over the
  period also asks the workflow to read through its own activity now.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from mcpsync.workflows.read_deadline import dispatch_margin

__all__ = ["CLAIM_FRACTION", "DUE_EARLIEST", "DUE_SPREAD", "LONGEST_DELAY_SECONDS", "SWEEP_IDLE_SECONDS",
           "SWEEP_MIN_SECONDS", "WATCHDOG_HORIZON", "WatchJudgement", "claim_delay", "judge_watch",
           "overdue_gap_seen", "sweep_wait", "verification_delay"]

DUE_EARLIEST = 0.85
DUE_SPREAD = 0.10
"""A verification is due again at 0.85-0.95 of the period (less the dispatch margin) after it: the
jitter spreads subscriptions started together, and the rest of the period is the sweep's slack."""

CLAIM_FRACTION = 0.05
"""A row the sweep fed is due again after this fraction of its period unless a granted allocation
re-arms it sooner (its read was refused, failed or overflowed the queue)."""

LONGEST_DELAY_SECONDS = 10 * 365 * 86_400.0
"""No row is due more than ten years ahead, whatever its period: sooner than its period asks is
always safe, and the due time stays within PostgreSQL's interval and timestamp ranges (a period of
1e15 s would overflow them, and with them the allocation that records the verification)."""

SWEEP_IDLE_SECONDS = 5.0
"""The longest a sweeping ingress waits between two looks at the ledger: it also sleeps until the
earliest due row, so a look finds new rows (a subscription's start) within this."""

SWEEP_MIN_SECONDS = 0.05
"""The shortest wait between two looks: a look that left rows due (more than one batch, or rows a
running allocation held locked) looks again this soon, not in a hot loop."""

WATCHDOG_HORIZON = timedelta(hours=6)
"""How often a workflow whose row the ledger schedules wakes to ask the ledger whether every
verification since its last look kept the bound. Four firings a day (a timer and one local activity
each: eight billable actions) keep an idle subscription under ten actions a day; a breach (no
ingress sweeping) is detected and repaired within this horizon."""


def verification_delay(period_seconds: float, draw: float) -> float:
    """Seconds after a verification until the next is due, for a draw in [0, 1)."""
    delay = (period_seconds - dispatch_margin(period_seconds)) * (DUE_EARLIEST + DUE_SPREAD * draw)
    return min(LONGEST_DELAY_SECONDS, delay)


def claim_delay(period_seconds: float) -> float:
    """Seconds a swept row waits before it is due again if no granted allocation re-arms it."""
    return min(LONGEST_DELAY_SECONDS, max(1.0, period_seconds * CLAIM_FRACTION))


def sweep_wait(next_in: float | None) -> float:
    """Seconds a sweeping ingress waits after a look whose ledger said the next row is due in
    ``next_in`` seconds (None: no row is scheduled): until then, within ``SWEEP_MIN_SECONDS`` and
    ``SWEEP_IDLE_SECONDS``."""
    if next_in is None:
        return SWEEP_IDLE_SECONDS
    return min(SWEEP_IDLE_SECONDS, max(SWEEP_MIN_SECONDS, next_in))


@dataclass(frozen=True, slots=True)
class WatchJudgement:
    """What the watchdog learns: the widest gap since its last look (the current open gap included),
    whether that breached the period, whether the row is overdue now (no verification within the
    period: the workflow reads itself), and whether the breach is new (``report``: not the same open
    gap the previous look already found overdue)."""

    widest_gap_seconds: float
    breached: bool
    overdue_now: bool
    report: bool


def overdue_gap_seen(*, verified_at: datetime | None, watched_at: datetime | None,
                     period_seconds: float) -> bool:
    """Whether the watchdog's previous look (``watched_at``) found the gap open since ``verified_at``
    overdue already, and so reported it: the verification that closes it does not widen
    ``worst_gap_seconds`` by it (``record_allocation``), and a later look finding it still open
    does not report it again (``judge_watch``). One breach, one report."""
    return watched_at is not None and (
        verified_at is None or (watched_at - verified_at).total_seconds() > period_seconds)


def judge_watch(*, verified_at: datetime | None, worst_gap_seconds: float, watched_at: datetime | None,
                now: datetime, period_seconds: float) -> WatchJudgement:
    """The watchdog's rule over the row's recorded levels (``verified_at``, ``worst_gap_seconds``, the
    previous look's ``watched_at``) and ``now``. A row never verified in this chain (``verified_at``
    None) is overdue now: its first read is owed."""
    open_gap = (now - verified_at).total_seconds() if verified_at is not None else float("inf")
    overdue_now = open_gap > period_seconds
    widest = max(worst_gap_seconds, open_gap if verified_at is not None else 0.0)
    breached = widest > period_seconds or overdue_now
    # The previous look already saw this open gap overdue, and no verification widened a gap since.
    seen = overdue_now and worst_gap_seconds <= period_seconds \
        and overdue_gap_seen(verified_at=verified_at, watched_at=watched_at, period_seconds=period_seconds)
    return WatchJudgement(widest_gap_seconds=widest, breached=breached, overdue_now=overdue_now,
                          report=breached and not seen)
