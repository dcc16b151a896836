"""The scale figure's verification schedule (``benchmarks.scale.verification_schedule``) on real PostgreSQL:
rows made by the ledger's own calls, their verifications moved to known times (the test's clock), judged
against each row's period: a gap closed late and a gap still open at the window's end are both found."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import pytest

from benchmarks.scale import verification_schedule
from mcpsync.activities.ledger import Ledger
from mcpsync.workflows.records.ledger import AllocateRequest, MarkActiveRequest
from mcpsync.workflows.records.subscription import SubscriptionKey, TriggerReason
from tests.conftest import ledger_rows, unique

PERIOD = 120.0


async def _row_verified_at(ledger: Ledger, key: SubscriptionKey, end: datetime, ago: list[float],
                           due_in: float) -> None:
    """A scheduled row verified ``ago`` seconds before ``end`` (one granted allocation each), its
    ``verified_at`` the newest of them and its next verification due ``due_in`` seconds after ``end``."""
    await ledger.ensure_subscription(key, "inc-1")
    snap = await ledger.begin_subscription(key, 1)
    generation = snap.subscription_generation
    await ledger.fence.mark_active(MarkActiveRequest(
        key=key, session_generation=1, subscription_generation=generation, read_reports=True,
        safety_read_seconds=PERIOD))
    for _ in ago:
        ticket = await ledger.fence.allocate_read(AllocateRequest(
            key=key, session_generation=1, subscription_generation=generation, min_ordinal=1,
            request_id=str(uuid.uuid4()), trigger=TriggerReason.POLL))
        assert ticket.granted
    ordinals = [r[0] for r in await ledger_rows(
        ledger, "SELECT ordinal FROM read_requests WHERE workflow_id = %s ORDER BY ordinal", key.workflow_id)]
    assert len(ordinals) == len(ago)
    for ordinal, seconds in zip(ordinals, sorted(ago, reverse=True), strict=True):
        await ledger_rows(ledger, "UPDATE read_requests SET issued_at = %s"
                                  " WHERE workflow_id = %s AND ordinal = %s",
                          end - timedelta(seconds=seconds), key.workflow_id, ordinal)
    await ledger_rows(ledger, "UPDATE subscriptions SET verified_at = %s, verify_due_at = %s"
                              " WHERE workflow_id = %s",
                      end - timedelta(seconds=min(ago)), end + timedelta(seconds=due_in), key.workflow_id)


async def test_gaps_over_the_period_closed_or_open_are_found_and_the_rest_kept(ledger: Ledger) -> None:
    server = unique("bench-srv")
    end: datetime = (await ledger_rows(ledger, "SELECT now()"))[0][0]
    start = end - timedelta(seconds=300)

    def key(name: str) -> SubscriptionKey:
        return SubscriptionKey(subject=unique("s"), server=server, uri=f"bench://doc/{name}")

    # Kept: 100 s apart, the open gap 20 s. Late: one gap of 180 s closed at -130 (1.5 periods), due 5 s
    # ago. Open: nothing since -330 (before the window), 2.75 periods by the end, due since -230.
    await _row_verified_at(ledger, key("kept"), end, [320, 220, 120, 20], due_in=80)
    await _row_verified_at(ledger, key("late"), end, [310, 130, 40], due_in=-5)
    await _row_verified_at(ledger, key("open"), end, [330], due_in=-230)

    v = await verification_schedule(ledger, server, start, end)

    assert v["rows"] == 3 and v["verifications"] == 3 + 2 + 0
    assert v["max_gap_over_period"] == 2.75
    assert v["rows_with_a_gap_over_period"] == 2
    assert [(w["uri"], w["over_period"], w["open_at_end"]) for w in v["worst"]] == [
        ("bench://doc/open", 2.75, True), ("bench://doc/late", 1.5, False),
        ("bench://doc/kept", 0.833, False)]
    assert sorted(v.pop("_row_max_gap_over_period")) == pytest.approx([100 / PERIOD, 1.5, 2.75])
    assert v["at_end"] == {"rows_overdue": 1, "rows_never_verified": 0, "rows_due": 2,
                           "most_late_due_seconds": 230.0}
