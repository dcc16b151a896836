"""When the next periodic read is due: the poll period of a server without subscribe.

Contract:
- Pure functions of the configured interval, the last read's ttlMs and the count of consecutive
  failed reads; no clock. ``SubscriptionFence`` (``mcpsync.workflows.subscription_state``) arms
  the deadline from them and publishes the period as the staleness bound.
- The bound is a promise about the read's allocation, dispatch included: the deadline is armed a
  dispatch margin (``dispatch_margin``) before the period ends, so the read that the timer starts
  is allocated within the published bound as long as its dispatch (a workflow task, the read
  cycle's activity, the allocation) takes less than the margin.
"""

from __future__ import annotations

from mcpsync.workflows.records.mcp_calls import ReadOutcomeKind
from mcpsync.workflows.records.subscription import StalenessBoundSource

__all__ = ["BACKOFF_CAP", "FAILED_READS", "RESYNCED_JITTER_FLOOR", "dispatch_margin",
           "jittered", "poll_period", "resynced_jitter"]

BACKOFF_CAP = 8.0
"""Consecutive failed reads double the poll period, up to this many times the configured interval."""

DISPATCH_MARGIN_FRACTION = 0.1
DISPATCH_MARGIN_MAX_SECONDS = 2.0
"""The dispatch margin: a tenth of the period, at most two seconds (dispatch on a busy box takes
tenths of a second to about a second; a long period needs no more than a short one)."""

FAILED_READS = frozenset({ReadOutcomeKind.MALFORMED, ReadOutcomeKind.PROTOCOL, ReadOutcomeKind.TRANSIENT})
"""Read outcomes that count towards the poll backoff: the server answered, but not with content."""


def poll_period(interval_seconds: float, ttl_ms: int | None,
                failed_reads: int) -> tuple[float, StalenessBoundSource]:
    """The period a server without subscribe is polled at, and which rule set it.

    Never faster than the configured interval nor than the server's ``ttlMs`` allows (a freshness
    hint: reading again before it runs out is wasted load, MCP 2026-07-28); after consecutive failed
    reads the interval doubles per failure up to ``BACKOFF_CAP`` × the interval (the spec asks any
    polling to back off). The jitter is applied where the deadline is armed."""
    period, source = interval_seconds, StalenessBoundSource.CONFIG
    if ttl_ms and ttl_ms / 1000 > period:
        period, source = ttl_ms / 1000, StalenessBoundSource.TTL
    if failed_reads > 0:
        backed_off = interval_seconds * min(2.0 ** min(failed_reads, 16), BACKOFF_CAP)
        if backed_off > period:
            period, source = backed_off, StalenessBoundSource.BACKOFF
    return period, source


def dispatch_margin(period_seconds: float) -> float:
    """How long before the end of ``period_seconds`` the periodic read is requested at the latest,
    so that its allocation, after one dispatch, still falls within the period."""
    return min(DISPATCH_MARGIN_MAX_SECONDS, period_seconds * DISPATCH_MARGIN_FRACTION)


def jittered(jitter: float) -> float:
    """The fraction of its period a deadline armed with ``jitter`` (in [0, 1)) falls at: 0.8–1.0."""
    return 0.8 + 0.2 * jitter


RESYNCED_JITTER_FLOOR = 0.75
"""A safety read the ingress makes ahead of the deadline (``worker/ingress/resync.py``) needs no wide jitter
on the timer behind it, and the ingress must read before the earliest deadline the run can arm: a
run whose rows are resynced maps its draw into [0.75, 1), so its deadline falls at 0.95–1.0 of the
period (less the dispatch margin) and the resync, a little before, reads about as often as the
timer's 0.8–1.0 did."""


def resynced_jitter(draw: float) -> float:
    """The jitter a resynced safety deadline is armed with, from the run's draw in [0, 1)."""
    return RESYNCED_JITTER_FLOOR + (1.0 - RESYNCED_JITTER_FLOOR) * draw
