"""When the next periodic read is due: the poll period of a server without subscribe.

Contract:
- Pure functions of the configured interval, the last read's ttlMs and the count of consecutive
  failed reads; no clock. ``SubscriptionFence`` (``mcpsync.workflows.subscription_state``) arms
  the deadline from them and publishes the period as the staleness bound.
"""

from __future__ import annotations

from mcpsync.workflows.records import ReadOutcomeKind, StalenessBoundSource

__all__ = ["BACKOFF_CAP", "FAILED_READS", "poll_period"]

BACKOFF_CAP = 8.0
"""Consecutive failed reads double the poll period, up to this many times the configured interval."""

FAILED_READS = frozenset({ReadOutcomeKind.MALFORMED, ReadOutcomeKind.PROTOCOL, ReadOutcomeKind.TRANSIENT})
"""Read outcomes that count towards the poll backoff: the server answered, but not with content."""


def poll_period(interval_seconds: float, ttl_ms: int | None, failed_reads: int) -> tuple[float, StalenessBoundSource]:
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
