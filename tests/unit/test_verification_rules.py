"""The ledger's verification schedule as pure rules (workflows/verification_rules.py): when a verified
row is due again, when a claimed one is, how long a sweep waits, and the watchdog's judgement."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mcpsync.workflows.read_deadline import dispatch_margin
from mcpsync.workflows.verification_rules import (
    DUE_EARLIEST,
    DUE_SPREAD,
    LONGEST_DELAY_SECONDS,
    SWEEP_IDLE_SECONDS,
    SWEEP_MIN_SECONDS,
    claim_delay,
    judge_watch,
    sweep_wait,
    verification_delay,
)

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
PERIOD = 30.0


@pytest.mark.parametrize("period", [0.5, 3.0, 30.0, 300.0, 86_400.0])
def test_a_verification_is_due_again_within_its_band_and_leaves_the_bounds_slack(period: float) -> None:
    usable = period - dispatch_margin(period)
    draws = [0.0, 0.25, 0.5, 0.999999]
    delays = [verification_delay(period, d) for d in draws]
    assert delays == sorted(delays)  # a later draw, a later due time: the jitter spreads rows
    assert delays[0] == pytest.approx(DUE_EARLIEST * usable)
    assert delays[-1] < (DUE_EARLIEST + DUE_SPREAD) * usable
    # What the bound keeps for the sweep, its queue and the allocation: the margin and a twentieth
    # of the period at the latest draw.
    assert period - delays[-1] >= dispatch_margin(period) + 0.05 * usable - 1e-9


@pytest.mark.parametrize(("period", "claim"), [(0.5, 1.0), (3.0, 1.0), (30.0, 1.5), (300.0, 15.0)])
def test_a_claimed_row_waits_a_twentieth_of_its_period_and_at_least_a_second(period: float,
                                                                             claim: float) -> None:
    assert claim_delay(period) == pytest.approx(claim)


@pytest.mark.parametrize("period", [1e15, float("inf")])
def test_no_row_is_due_further_ahead_than_the_longest_delay(period: float) -> None:
    assert verification_delay(period, 0.0) == claim_delay(period) == LONGEST_DELAY_SECONDS
    assert verification_delay(1e8, 0.5) < LONGEST_DELAY_SECONDS  # three years: the rule's own


@pytest.mark.parametrize(("next_in", "wait"), [
    (None, SWEEP_IDLE_SECONDS), (0.0, SWEEP_MIN_SECONDS), (0.01, SWEEP_MIN_SECONDS), (2.5, 2.5),
    (SWEEP_IDLE_SECONDS + 1, SWEEP_IDLE_SECONDS), (1e12, SWEEP_IDLE_SECONDS)])
def test_a_sweep_waits_until_the_next_row_is_due_within_its_bounds(next_in: float | None,
                                                                   wait: float) -> None:
    assert sweep_wait(next_in) == wait


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_verifications_within_the_period_are_no_breach() -> None:
    j = judge_watch(verified_at=_at(-10), worst_gap_seconds=25.0, watched_at=_at(-3600), now=T0,
                    period_seconds=PERIOD)
    assert (j.breached, j.overdue_now, j.report) == (False, False, False)
    assert j.widest_gap_seconds == 25.0
    # Exactly one period open is still within the bound (the bound is "at most one period apart").
    j = judge_watch(verified_at=_at(-PERIOD), worst_gap_seconds=0.0, watched_at=None, now=T0,
                    period_seconds=PERIOD)
    assert not j.breached and not j.overdue_now


def test_a_closed_gap_over_the_period_is_reported_though_the_row_is_fresh_now() -> None:
    j = judge_watch(verified_at=_at(-5), worst_gap_seconds=41.0, watched_at=_at(-3600), now=T0,
                    period_seconds=PERIOD)
    assert (j.breached, j.overdue_now, j.report) == (True, False, True)
    assert j.widest_gap_seconds == 41.0


def test_an_open_gap_over_the_period_is_reported_once_and_asks_for_a_read_each_look() -> None:
    first = judge_watch(verified_at=_at(-100), worst_gap_seconds=0.0, watched_at=_at(-3600), now=T0,
                        period_seconds=PERIOD)
    assert (first.breached, first.overdue_now, first.report) == (True, True, True)
    assert first.widest_gap_seconds == 100.0
    # The next look finds the same open gap, which the previous look (at T0) saw overdue already.
    again = judge_watch(verified_at=_at(-100), worst_gap_seconds=0.0, watched_at=T0, now=_at(3600),
                        period_seconds=PERIOD)
    assert (again.breached, again.overdue_now, again.report) == (True, True, False)
    # A previous look made while the gap was still within the period did not see it: report.
    unseen = judge_watch(verified_at=_at(-100), worst_gap_seconds=0.0, watched_at=_at(-90), now=T0,
                         period_seconds=PERIOD)
    assert unseen.report
    # A gap widened since the last look (a verification recorded it) is news even while overdue.
    widened = judge_watch(verified_at=_at(-100), worst_gap_seconds=PERIOD + 1, watched_at=_at(-50), now=T0,
                          period_seconds=PERIOD)
    assert widened.report


def test_a_row_never_verified_in_its_chain_is_overdue_and_reported_once() -> None:
    first = judge_watch(verified_at=None, worst_gap_seconds=0.0, watched_at=None, now=T0,
                        period_seconds=PERIOD)
    assert (first.breached, first.overdue_now, first.report) == (True, True, True)
    assert first.widest_gap_seconds == 0.0  # no gap between verifications was measured
    again = judge_watch(verified_at=None, worst_gap_seconds=0.0, watched_at=T0, now=_at(60),
                        period_seconds=PERIOD)
    assert (again.overdue_now, again.report) == (True, False)


def test_a_huge_period_is_judged_without_overflow() -> None:
    j = judge_watch(verified_at=_at(-86_400 * 365), worst_gap_seconds=0.0, watched_at=None, now=T0,
                    period_seconds=1e12)
    assert not j.breached and not j.report
