"""The versioned records mcpsync publishes: ``resourceVersion.v1`` and ``resourceSubscription.v1``.

Contract:
- The ``record`` literal is a stable wire name: a change that breaks readers gets a new version,
  never an edit in place.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from mcpsync.workflows.records.base import FrozenRecord
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import (
    CacheScope,
    StalenessBoundSource,
    SubscriptionState,
    TriggerReason,
)

__all__ = ["ResourceVersionV1", "ResourceSubscriptionV1"]


class ResourceVersionV1(FrozenRecord):
    """``resourceVersion.v1``: one accepted (or stale) read, as stored in the ledger."""

    record: Literal["resourceVersion.v1"] = "resourceVersion.v1"
    receipt_id: int
    uri: str
    mime_type: str | None
    content_digest: str | None
    read_ordinal: int
    subject: str
    server: str
    server_name: str
    server_version: str
    edition: str
    session_generation: int
    subscription_generation: int
    request_id: str
    trigger: TriggerReason
    status: AcceptVerdict
    accepted_at: datetime
    ttl_ms: int | None = None  # the read result's ttlMs (None: the receipt records none)
    cache_scope: CacheScope | None = None  # the read result's cacheScope


class ResourceSubscriptionV1(FrozenRecord):
    """``resourceSubscription.v1``: the workflow's view of one subscription."""

    record: Literal["resourceSubscription.v1"] = "resourceSubscription.v1"
    subject: str
    server: str
    uri: str
    state: SubscriptionState
    session_generation: int = 0
    edition: str = ""
    capabilities: dict[str, bool] = Field(default_factory=dict)
    subscription_generation: int = 0
    started_at: datetime | None = None
    ended_at: datetime | None = None
    last_notification_seq: int = 0  # updates seen (this run chain)
    last_issued_ordinal: int = 0
    last_accepted_ordinal: int = 0
    last_accepted_digest: str | None = None
    last_receipt_id: int | None = None
    last_verdict: AcceptVerdict | None = None  # the ledger's verdict on the newest judged read (this chain)
    watermark: int = 0
    close_epoch: int = 0
    close_ordinal: int | None = None
    reads_issued: int = 0
    staleness_bound_seconds: float | None = None  # published when polling (no subscribe): the poll period
    staleness_bound_source: StalenessBoundSource | None = None  # which rule set it (docs/caching.md)
    last_read_ttl_ms: int | None = None  # ttlMs of the latest read that returned a result
    last_read_cache_scope: CacheScope | None = None  # cacheScope of that read
    safety_read_seconds: float | None = None  # with subscribe: the re-read period bounding lost notifications
    last_accepted_at: datetime | None = None  # when the ledger last made a new version current
    last_verified_at: datetime | None = None  # allocation time of the newest read that saw content
    # deadline of the next poll / safety read the run keeps (None: none due, or the ledger schedules the
    # safety reads and the run keeps only a watchdog: docs/caching.md)
    next_read_due_at: datetime | None = None
    detail: str = ""
