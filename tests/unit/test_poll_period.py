"""The poll period of a server without subscribe (workflows/read_deadline.py,
workflows/subscription_state.py, docs/caching.md): the configured interval, never faster than the
last read's ttlMs, backed off after failed reads, the published staleness bound saying which rule
set it, and the dispatch margin that keeps the next read's allocation within that bound. Pure,
deterministic code: no stack needed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mcpsync.workflows.read_deadline import BACKOFF_CAP, dispatch_margin, poll_period
from mcpsync.workflows.records.ledger import FenceSnapshot
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import (
    CacheScope,
    StalenessBoundSource,
    SubscriptionKey,
    SubscriptionState,
    TriggerReason,
)
from mcpsync.workflows.subscription_state import FenceState, SubscriptionFence

KEY = SubscriptionKey(subject="alice", server="fx", uri="demo://doc")
T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
SRC = StalenessBoundSource


@pytest.mark.parametrize(("ttl_ms", "failed", "expected"), [
    (None, 0, (30.0, SRC.CONFIG)),
    (0, 0, (30.0, SRC.CONFIG)),  # 0: immediately stale, the interval stands
    (10_000, 0, (30.0, SRC.CONFIG)),  # a short ttl never makes us poll faster than configured
    (120_000, 0, (120.0, SRC.TTL)),  # a long ttl: never faster than the server allows
    (None, 1, (60.0, SRC.BACKOFF)),
    (None, 2, (120.0, SRC.BACKOFF)),
    (None, 50, (30.0 * BACKOFF_CAP, SRC.BACKOFF)),  # capped
    (120_000, 2, (120.0, SRC.TTL)),  # backoff below the ttl: the ttl still sets it
    (120_000, 3, (240.0, SRC.BACKOFF)),
])
def test_poll_period_rules(ttl_ms: int | None, failed: int,
                           expected: tuple[float, StalenessBoundSource]) -> None:
    assert poll_period(30.0, ttl_ms, failed) == expected


def _polling_fence() -> SubscriptionFence:
    fence = SubscriptionFence(FenceState(key=KEY))
    snap = FenceSnapshot(exists=True, state=SubscriptionState.ACTIVE, session_generation=1,
                         subscription_generation=1)
    fence.subscribed(snap, poll_interval_seconds=30.0)
    return fence


def _outcome(kind: ReadOutcomeKind, ttl_ms: int | None = None,
             scope: CacheScope | None = None) -> ReadOutcome:
    return ReadOutcome(kind=kind, key=KEY, ordinal=1, request_id="r", session_generation=1,
                       subscription_generation=1, trigger=TriggerReason.POLL, ttl_ms=ttl_ms,
                       cache_scope=scope)


def test_the_deadline_follows_the_period_the_last_read_implies() -> None:
    fence = _polling_fence()
    s = fence.s
    assert (s.staleness_bound_seconds, s.staleness_bound_source) == (30.0, SRC.CONFIG)
    fence.arm_read_deadline(requested_at=T0, period_seconds=fence.read_period(None), jitter=0.5)
    assert s.read_due_at == T0 + timedelta(seconds=30 * 0.9)

    # The read tells a 120 s ttl: the deadline armed with 30 s moves out (same jitter), bound says ttl.
    fence.read_directives(_outcome(ReadOutcomeKind.CONTENT, 120_000, CacheScope.PUBLIC))
    assert (s.staleness_bound_seconds, s.staleness_bound_source) == (120.0, SRC.TTL)
    assert s.read_due_at == T0 + timedelta(seconds=120 * 0.9)
    rec = fence.record()
    assert rec.staleness_bound_source == SRC.TTL and rec.last_read_ttl_ms == 120_000
    assert rec.last_read_cache_scope == CacheScope.PUBLIC

    # Failures back off past the ttl; a read without a result keeps the last known ttl.
    for _ in range(3):
        fence.read_directives(_outcome(ReadOutcomeKind.TRANSIENT))
    assert (s.staleness_bound_seconds, s.staleness_bound_source) == (240.0, SRC.BACKOFF)
    assert s.last_read_ttl_ms == 120_000 and s.failed_reads == 3

    # Content again: the backoff resets and the deadline comes back in, within the new bound at once.
    fence.read_directives(_outcome(ReadOutcomeKind.CONTENT, 0, CacheScope.PRIVATE))
    assert (s.staleness_bound_seconds, s.staleness_bound_source) == (30.0, SRC.CONFIG)
    assert s.read_due_at == T0 + timedelta(seconds=30 * 0.9)
    assert s.failed_reads == 0


def test_not_found_and_denied_do_not_back_off() -> None:
    fence = _polling_fence()
    fence.read_directives(_outcome(ReadOutcomeKind.NOT_FOUND))
    fence.read_directives(_outcome(ReadOutcomeKind.DENIED))
    assert fence.s.failed_reads == 0 and fence.s.staleness_bound_source == SRC.CONFIG


def test_with_subscribe_no_bound_is_published_whatever_the_ttl() -> None:
    fence = SubscriptionFence(FenceState(key=KEY))
    snap = FenceSnapshot(exists=True, state=SubscriptionState.ACTIVE, session_generation=1,
                         subscription_generation=1)
    fence.subscribed(snap, poll_interval_seconds=None)
    fence.read_directives(_outcome(ReadOutcomeKind.CONTENT, 600_000, CacheScope.PUBLIC))
    rec = fence.record(safety_read_seconds=300.0)
    assert rec.staleness_bound_seconds is None and rec.staleness_bound_source is None
    assert rec.safety_read_seconds == 300.0  # notifications, not the ttl, drive reads; safety reads stay
    assert rec.last_read_ttl_ms == 600_000


@pytest.mark.parametrize("period", [5.0, 6.0, 30.0, 300.0])
@pytest.mark.parametrize("jitter", [0.0, 0.5, 0.999999])
def test_with_the_dispatch_margin_the_read_is_requested_a_margin_before_the_bound(
        period: float, jitter: float) -> None:
    # A run that took the patch (``PATCH_AFTER_0_2_0``): whatever the jitter draw, the deadline (and the
    # latest time the keeper's promise allows) lies a margin before the period, so one dispatch
    # of up to the margin still allocates the read within the published bound.
    fence = SubscriptionFence(FenceState(key=KEY))
    fence.dispatch_margin = True
    fence.s.state = SubscriptionState.ACTIVE
    fence.arm_read_deadline(requested_at=T0, period_seconds=period, jitter=jitter)
    margin = dispatch_margin(period)
    assert 0 < margin <= 2.0
    latest = T0 + timedelta(seconds=period - margin)
    assert fence.s.read_due_at is not None and fence.s.read_due_at <= latest
    assert fence.read_promised_by() == latest
    # An ACTIVE fence without a deadline arms one the same margin short of the period.
    unarmed = SubscriptionFence(FenceState(key=KEY, state=SubscriptionState.ACTIVE))
    unarmed.dispatch_margin = True
    unarmed.poll_if_due(T0, period_seconds=period)
    assert unarmed.s.read_due_at == latest


def test_without_the_patch_a_run_arms_its_deadlines_at_the_whole_period() -> None:
    # Runs that started on 0.2.0 (no patch marker) replay with their recorded timers.
    fence = SubscriptionFence(FenceState(key=KEY))
    fence.s.state = SubscriptionState.ACTIVE
    fence.arm_read_deadline(requested_at=T0, period_seconds=30.0, jitter=0.999999)
    assert fence.read_promised_by() == T0 + timedelta(seconds=30.0)

