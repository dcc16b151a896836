"""The ledger's verification schedule and the watchdog's judgement of it.

Contract:
- Pure: times are datetimes and seconds the caller passes in (the ledger's transaction time, the
  workflow's ``now``), no I/O, no clock of its own.
- A *verification* is a granted read allocation of a scheduled row (ACTIVE, subscribed, with a
  safety-read period: ``subscriptions.safety_read_seconds``), whoever asked for it: the ingress's
  sweep, a notification, the workflow's own read. The transaction that grants it records it on the
  row (``activities/ledger/verification.py``): ``verified_at`` := now, ``verify_due_at`` := now +
  ``verification_delay`` (jittered); a gap it closes that exceeds the period is a breach, reported
  in that transaction (``judge_gap``). ``mark_active`` (a new subscription generation) continues the
  row's chain while the row holds a version (``continues_chain``), else starts a new one.
- The schedule is the ledger's: the ingress holding the (subject, server) lease sweeps rows whose
  ``verify_due_at`` passed (one indexed query), level-based: a new lease holder finds every overdue
  row at once. A swept row is claimed (due again ``claim_delay`` later) so a read that is refused
  or fails is tried again without a hot loop; the next granted allocation re-arms it.
- The published bound: consecutive verifications at most one period apart. A sweep feeds a due row
  at 0.92-0.97 of the period (less the dispatch margin), which leaves the margin and 3 % of the
  period for the sweep's interval, the queue and the allocation.
- The watchdog (the workflow's rare timer, ``WATCHDOG_HORIZON``) judges the gap still open
  (``judge_gap``): over the period, it is a breach no verification closed (nobody sweeps); it is
  reported, and the workflow reads through its own activity now. Each breach is reported once
  (an ``overdue`` outbox event), by whoever finds it first.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from mcpsync.workflows.read_deadline import dispatch_margin
from mcpsync.workflows.records.subscription import WATCHDOG_SECONDS

__all__ = ["CLAIM_FRACTION", "DUE_EARLIEST", "DUE_SPREAD", "LONGEST_DELAY_SECONDS", "SWEEP_AHEAD_FRACTION",
           "SWEEP_AHEAD_SECONDS", "SWEEP_IDLE_SECONDS", "SWEEP_MIN_SECONDS", "WATCHDOG_HORIZON",
           "GapJudgement", "claim_delay", "continues_chain", "judge_gap", "sweep_ahead", "sweep_wait",
           "verification_delay"]

DUE_EARLIEST = 0.92
DUE_SPREAD = 0.05
"""A verification is due again at 0.92-0.97 of the period (less the dispatch margin) after it: the
jitter spreads subscriptions started together (a twentieth of the period each verification, which
adds up as a random walk), and the rest of the period (the margin and 3 % of it) is the sweep's
slack: its interval (``sweep_ahead``, 1 % at most), the router's queue and the allocation. Each
read is a cost paid per period, so the band sits as late as that slack allows."""

CLAIM_FRACTION = 0.05
"""A row the sweep fed is due again after this fraction of its period unless a granted allocation
re-arms it sooner (its read was refused, failed or overflowed the queue)."""

LONGEST_DELAY_SECONDS = 10 * 365 * 86_400.0
"""No row is due more than ten years ahead, whatever its period: PostgreSQL's interval arithmetic on
``now()`` overflows for absurd periods (1e15 s), and a decade is no schedule anyone keeps."""

SWEEP_IDLE_SECONDS = 5.0
"""The longest a sweeping ingress waits between two looks at the ledger: it also sleeps until the
earliest due row, so a look finds new rows (a subscription's start) within this."""

SWEEP_MIN_SECONDS = 0.05
"""The shortest wait between two looks (a row due at once is not looked for in a busy loop)."""

SWEEP_AHEAD_SECONDS = 1.0
SWEEP_AHEAD_FRACTION = 0.01
"""A look also claims the rows due within ``sweep_ahead`` of now (each read at most that much early),
and the next look comes no sooner: a (subject, server) with many rows is looked at about once a
second, not once a row (a look is four statements). 1 % of the shortest period the sweep has
claimed, at most a second: a row is read early by at most a hundredth of its period, never late."""

WATCHDOG_HORIZON = timedelta(seconds=WATCHDOG_SECONDS)
"""How often a workflow whose row the ledger schedules wakes to ask the ledger whether every
verification since its last look kept the bound (six hours; ``SubscriptionOptions.watchdog_seconds``
sets it per subscription). Four firings a day (a timer and one local activity each: eight billable
actions) keep an idle subscription under ten actions a day; a breach (no ingress sweeping) is
detected and repaired within this horizon."""


def verification_delay(period_seconds: float, draw: float) -> float:
    """Seconds after a verification until the next is due, for a draw in [0, 1)."""
    delay = (period_seconds - dispatch_margin(period_seconds)) * (DUE_EARLIEST + DUE_SPREAD * draw)
    return min(LONGEST_DELAY_SECONDS, delay)


def claim_delay(period_seconds: float) -> float:
    """Seconds a swept row waits before it is due again if no granted allocation re-arms it."""
    return min(LONGEST_DELAY_SECONDS, max(1.0, period_seconds * CLAIM_FRACTION))


def continues_chain(last_accepted_digest: str | None) -> bool:
    """Whether ``mark_active`` on a new subscription generation keeps the row's verification chain: it
    does while the row holds a version (``last_accepted_digest``), since consumers hold that version
    through the resubscribe (a lost session, an ingress killed and none sweeping), and the
    resubscribe's first read closes the gap since the previous generation's newest verification like
    any other verification. A row without one (new, or reopened for a new incarnation: consumers were
    told it closed) starts a chain whose first read has no predecessor."""
    return last_accepted_digest is not None


def sweep_ahead(shortest_period: float | None) -> float:
    """How far ahead a look claims, given the shortest period among the rows a sweep has claimed
    (None: none yet, so only rows due now)."""
    if shortest_period is None:
        return 0.0
    return min(SWEEP_AHEAD_SECONDS, SWEEP_AHEAD_FRACTION * shortest_period)


def sweep_wait(next_in: float | None, ahead: float = 0.0) -> float:
    """Seconds a sweeping ingress waits after a look whose ledger said the next row is due in
    ``next_in`` seconds (None: no row is scheduled), when the next look claims ``ahead`` seconds ahead
    and this one claimed at least that far: until ``ahead`` before that row is due, but no sooner than
    ``ahead`` (every row the look left is due later than that), within ``SWEEP_MIN_SECONDS`` and
    ``SWEEP_IDLE_SECONDS``."""
    if next_in is None:
        return SWEEP_IDLE_SECONDS
    return min(SWEEP_IDLE_SECONDS, max(SWEEP_MIN_SECONDS, ahead, next_in - ahead))


@dataclass(frozen=True, slots=True)
class GapJudgement:
    """A verification gap judged against the period: its length (None: the chain has no verification
    yet), whether it exceeds the period (``overdue``), and whether that breach is one not reported
    yet (``report``)."""

    gap_seconds: float | None
    overdue: bool
    report: bool


def judge_gap(*, verified_at: datetime | None, watched_at: datetime | None, now: datetime,
              period_seconds: float) -> GapJudgement:
    """The gap from the row's newest verification (``verified_at``) to ``now``: closed by a
    verification granted now (``record_allocation``), or still open when the watchdog looks
    (``watch``). A chain with no verification yet is overdue (its first read is owed). The breach
    was reported already when the watchdog's previous look (``watched_at``) found this same gap
    overdue: one report per gap, whoever finds it first."""
    if verified_at is None:
        return GapJudgement(gap_seconds=None, overdue=True, report=watched_at is None)
    gap = (now - verified_at).total_seconds()
    overdue = gap > period_seconds
    seen = watched_at is not None and (watched_at - verified_at).total_seconds() > period_seconds
    return GapJudgement(gap_seconds=gap, overdue=overdue, report=overdue and not seen)
