"""The ledger's verification schedule as pure rules (workflows/verification_rules.py): when a verified
row is due again, when a claimed one is, how long a sweep waits, and the watchdog's judgement."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from mcpsync.workflows.read_deadline import dispatch_margin
from mcpsync.workflows.verification_rules import (
    DUE_EARLIEST,
    DUE_SPREAD,
    LONGEST_DELAY_SECONDS,
    SWEEP_AHEAD_SECONDS,
    SWEEP_IDLE_SECONDS,
    SWEEP_MIN_SECONDS,
    claim_delay,
    judge_gap,
    sweep_ahead,
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
    # What the bound keeps for the sweep, its queue and the allocation: the margin and 3 % of the
    # period at the latest draw.
    assert period - delays[-1] >= dispatch_margin(period) + 0.03 * usable - 1e-9


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


@pytest.mark.parametrize(("shortest", "ahead"),
                         [(None, 0.0), (6.0, 0.06), (30.0, 0.3), (300.0, SWEEP_AHEAD_SECONDS)])
def test_a_look_claims_a_hundredth_of_the_shortest_period_ahead_at_most_a_second(shortest: float | None,
                                                                                 ahead: float) -> None:
    assert sweep_ahead(shortest) == pytest.approx(ahead)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("period", [6.0, 300.0])
def test_looks_ahead_never_leave_a_row_late_and_come_about_once_per_ahead(seed: int, period: float) -> None:
    """Many rows of one period, due at random times: a sweep that looks as ``sweep_wait`` says and
    claims ``sweep_ahead`` ahead claims every row by its due time, at most ``ahead`` early, and looks
    no more often than once per ``ahead`` (a row a look, before)."""
    rng = random.Random(seed)
    horizon = period  # 2,000 rows due within one period: several a second at 300 s
    dues = sorted(rng.uniform(0, horizon) for _ in range(2_000))
    t, shortest, looks, claimed_at = 0.0, None, 0, []
    while dues:
        looks += 1
        ahead = sweep_ahead(shortest)
        taken = [d for d in dues if d <= t + ahead]
        dues = dues[len(taken):]
        claimed_at += [(t, d) for d in taken]
        shortest = period if taken or shortest is not None else None
        next_in = dues[0] - t if dues else None
        t += sweep_wait(next_in, min(ahead, sweep_ahead(shortest)))
    assert all(at <= due + SWEEP_MIN_SECONDS for at, due in claimed_at)  # never late (but the first look)
    assert all(due - at <= sweep_ahead(period) + 1e-9 for at, due in claimed_at[1:])
    assert looks <= horizon / min(sweep_ahead(period), SWEEP_IDLE_SECONDS) + 2
    assert looks < 2_000 / 3  # rows share looks


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_a_gap_within_the_period_is_no_breach() -> None:
    gap = judge_gap(verified_at=T0, watched_at=None, now=_at(PERIOD - 1), period_seconds=PERIOD)
    assert (gap.gap_seconds, gap.overdue, gap.report) == (PERIOD - 1, False, False)


def test_a_gap_over_the_period_is_reported_by_whoever_finds_it_first_and_once() -> None:
    late = _at(PERIOD + 1)
    first = judge_gap(verified_at=T0, watched_at=None, now=late, period_seconds=PERIOD)
    assert first.overdue and first.report
    # The watchdog looked at ``late`` and reported it; the same gap, later (still open, or closed by a
    # verification), is not reported again.
    again = judge_gap(verified_at=T0, watched_at=late, now=_at(3600), period_seconds=PERIOD)
    assert again.overdue and not again.report
    # A look made before the gap was overdue reported nothing: the verification that closes it reports.
    early_look = judge_gap(verified_at=T0, watched_at=_at(PERIOD / 2), now=late, period_seconds=PERIOD)
    assert early_look.report


def test_a_chain_without_a_verification_is_overdue_and_reported_once() -> None:
    first = judge_gap(verified_at=None, watched_at=None, now=T0, period_seconds=PERIOD)
    assert first.gap_seconds is None and first.overdue and first.report
    assert not judge_gap(verified_at=None, watched_at=T0, now=T0, period_seconds=PERIOD).report


def test_a_huge_period_is_judged_without_overflow() -> None:
    gap = judge_gap(verified_at=_at(-86_400 * 365), watched_at=None, now=T0, period_seconds=1e12)
    assert not gap.overdue and not gap.report
