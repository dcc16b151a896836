"""The verification schedule's pure rules (``workflows/verification_rules.py``): when a verified row is
due again, and how a gap is judged and reported once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mcpsync.workflows.read_deadline import dispatch_margin
from mcpsync.workflows.verification_rules import claim_delay, judge_gap, verification_delay

T0 = datetime(2026, 12, 7, tzinfo=UTC)


@pytest.mark.parametrize("period", [1.0, 3.0, 30.0, 300.0, 86_400.0])
def test_a_verification_is_due_again_inside_the_period_with_the_margin_and_slack_left(period: float) -> None:
    earliest, latest = verification_delay(period, 0.0), verification_delay(period, 0.999999)
    assert 0 < earliest < latest
    # The sweep's interval, the queue and the allocation fit in what is left before the period ends.
    assert latest <= period - dispatch_margin(period) - 0.05 * (period - dispatch_margin(period))
    assert earliest >= 0.8 * (period - dispatch_margin(period))


def test_a_claim_waits_a_fraction_of_the_period_never_under_a_second() -> None:
    assert claim_delay(300.0) == pytest.approx(15.0)
    assert claim_delay(3.0) == 1.0
    assert claim_delay(0.001) == 1.0


def test_a_gap_within_the_period_is_no_breach() -> None:
    gap = judge_gap(verified_at=T0, watched_at=None, now=T0 + timedelta(seconds=299), period_seconds=300)
    assert (gap.gap_seconds, gap.overdue, gap.report) == (299, False, False)


def test_a_gap_over_the_period_is_reported_by_whoever_finds_it_first_and_once() -> None:
    late = T0 + timedelta(seconds=301)
    first = judge_gap(verified_at=T0, watched_at=None, now=late, period_seconds=300)
    assert first.overdue and first.report
    # The watchdog looked at ``late`` and reported it; the same gap, later (still open, or closed by a
    # verification), is not reported again.
    again = judge_gap(verified_at=T0, watched_at=late, now=late + timedelta(hours=1), period_seconds=300)
    assert again.overdue and not again.report
    # A look made before the gap was overdue reported nothing: the verification that closes it reports.
    early_look = judge_gap(verified_at=T0, watched_at=T0 + timedelta(seconds=100), now=late,
                           period_seconds=300)
    assert early_look.report


def test_a_chain_without_a_verification_is_overdue_and_reported_once() -> None:
    first = judge_gap(verified_at=None, watched_at=None, now=T0, period_seconds=300)
    assert first.gap_seconds is None and first.overdue and first.report
    assert not judge_gap(verified_at=None, watched_at=T0, now=T0, period_seconds=300).report
