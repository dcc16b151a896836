"""What the ingress's resync asks the ledger (``FenceLedger.resync_periods``, migration 019) against real
PostgreSQL: the ACTIVE rows of one (subject, server) whose run mirrors reports and said its
safety-read period at ``mark_active``."""

from __future__ import annotations

from mcpsync.activities.ledger import Ledger
from mcpsync.workflows.records.ledger import MarkActiveRequest
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState
from tests.conftest import unique


async def _mark(ledger: Ledger, key: SubscriptionKey, *, read_reports: bool, period: float | None) -> None:
    await ledger.ensure_subscription(key, "inc-1")
    snap = await ledger.begin_subscription(key, 1)
    snap = await ledger.fence.mark_active(MarkActiveRequest(
        key=key, session_generation=1, subscription_generation=snap.subscription_generation,
        read_reports=read_reports, safety_read_seconds=period))
    assert snap.state == SubscriptionState.ACTIVE


async def test_only_active_rows_that_said_their_period_are_resynced(ledger: Ledger) -> None:
    subject = unique("s")

    def key(uri: str, server: str = "srv") -> SubscriptionKey:
        return SubscriptionKey(subject=subject, server=server, uri=uri)

    await _mark(ledger, key("demo://subscribed"), read_reports=True, period=30.0)
    await _mark(ledger, key("demo://polling"), read_reports=True, period=None)  # no period: the timer's
    await _mark(ledger, key("demo://old-run"), read_reports=False, period=30.0)  # reads itself
    await _mark(ledger, key("demo://other", server="other"), read_reports=True, period=30.0)
    await _mark(ledger, key("demo://closing"), read_reports=True, period=60.0)
    assert await ledger.fence.resync_periods(subject, "srv") == {
        "demo://subscribed": 30.0, "demo://closing": 60.0}

    await ledger.begin_unsubscribe(key("demo://closing"))  # no longer ACTIVE: not resynced
    assert await ledger.fence.resync_periods(subject, "srv") == {"demo://subscribed": 30.0}
    assert await ledger.fence.resync_periods(subject, "other") == {"demo://other": 30.0}
