"""Catalog reconciliation records (``CatalogWorkflow``): keys, policies, scans, catalogs, rollout.

Contract:
- ``resourceDiscoveryScan.v1`` (one full scan) and ``resourceCatalog.v1`` (two matching scans)
  are versioned wire names; cursors are never stored, only keyed digests of them.
- ``RolloutPolicy`` stages a server's rollout (shadow, a percentage of URIs, all).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from mcpsync.workflows.records.base import FrozenRecord
from mcpsync.workflows.records.subscription import CacheScope

__all__ = ["SnapshotStatus", "ScanStatus", "RolloutMode", "CatalogKey", "CatalogPolicy", "CatalogStart",
           "ListChanged", "SnapshotEvidence", "ResourceDiscoveryScanV1", "CatalogSnapshot", "RolloutPolicy"]


class SnapshotStatus(StrEnum):
    """What a reconciled catalog may claim. There is no status for one scan: it proves nothing."""

    SNAPSHOT_UNPROVEN = "SNAPSHOT_UNPROVEN"  # two matching full scans, no snapshot proof
    SNAPSHOT_PROVEN = "SNAPSHOT_PROVEN"  # ... and every page bound to one negotiated snapshot id


class ScanStatus(StrEnum):
    COMPLETE = "COMPLETE"  # every cursor followed to the end, nothing suspicious
    CURSOR_LOOP = "CURSOR_LOOP"  # a cursor came back within one scan
    PAGE_CAP = "PAGE_CAP"  # more pages than the policy allows (an endless listing)
    INVALID_CURSOR = "INVALID_CURSOR"  # the server rejected one of its own cursors (-32602)
    INCONSISTENT = "INCONSISTENT"  # a URI twice, or a descriptor that changed between pages
    SESSION_LOST = "SESSION_LOST"  # the session generation ended before the scan did
    FAILED = "FAILED"  # any other error; the detail is in ``problems``


class RolloutMode(StrEnum):
    SHADOW = "shadow"  # compute and record everything, publish nothing
    PERCENT = "percent"  # act for a deterministic hash-bucketed share of URIs
    ALL = "all"


class CatalogKey(FrozenRecord):
    """Identity of one catalog view: everything discovered is per (subject, server)."""

    subject: str = Field(min_length=1, max_length=200)
    server: str = Field(min_length=1, max_length=200)

    @property
    def workflow_id(self) -> str:
        h = hashlib.sha256(f"{self.subject}\0{self.server}".encode()).hexdigest()[:16]
        return f"mcpsync-catalog/{self.server}/{self.subject}/{h}"


class CatalogPolicy(FrozenRecord):
    """Refresh and action policy of one CatalogWorkflow (its input; tests shorten the intervals)."""

    rescan_seconds: float = Field(default=300.0, gt=0)  # no listChanged: the only freshness source
    rescan_seconds_with_list_changed: float = Field(default=1800.0, gt=0)  # catches lost notifications
    jitter_fraction: float = Field(default=0.2, ge=0, lt=1)  # reviews land in [1-j, 1] x interval
    page_cap: int = Field(default=10_000, ge=1)  # pages per scan (both lists) before PAGE_CAP
    immediate_restarts: int = Field(default=3, ge=0)  # restarts without delay, then backoff
    restart_backoff_seconds: float = Field(default=1.0, gt=0)
    restart_backoff_max_seconds: float = Field(default=60.0, gt=0)
    session_recheck_seconds: float = Field(default=15.0, gt=0)
    reconcile_allowance_seconds: float = Field(default=5.0, ge=0)  # a reconciliation's own time, in the bound
    signal_subscriptions: bool = True  # send catalog_reconciled to this view's subscriptions
    auto_subscribe_prefixes: tuple[str, ...] = ()  # new URIs starting with one of these get subscribed


class CatalogStart(FrozenRecord):
    """CatalogWorkflow input. ``carried_state`` (a dumped ``CatalogState``) only via continue-as-new."""

    key: CatalogKey
    policy: CatalogPolicy = CatalogPolicy()
    carried_state: dict[str, Any] | None = None


class ListChanged(FrozenRecord):
    """Signal ``list_changed``: the session host received resources list_changed.

    ``count`` is the number of list_changed notifications that session generation has
    received so far (monotonic), the same counter the scan activities read."""

    session_generation: int
    count: int
    received_at: datetime | None = None


class SnapshotEvidence(FrozenRecord):
    """What the pages of one scan say about the ``io.mcpsync/snapshot`` extension."""

    negotiated: bool = False
    snapshot_id: str | None = None  # the one id every page carried, when bound
    pages: int = 0
    pages_with_id: int = 0
    distinct_ids: int = 0
    bound: bool = False  # negotiated, one id on every page, claimed set digests match the pages
    reason: str = ""


class ResourceDiscoveryScanV1(FrozenRecord):
    """``resourceDiscoveryScan.v1``: one full scan of resources/list + resources/templates/list.

    Cursors are never stored: ``page_cursor_digests`` holds a keyed digest per page
    (``start`` for a list's first page), comparable only within one session host."""

    record: Literal["resourceDiscoveryScan.v1"] = "resourceDiscoveryScan.v1"
    scan_id: str
    reconciliation_id: str
    label: Literal["A", "B"]
    subject: str
    server: str
    session_generation: int
    edition: str = ""
    status: ScanStatus
    first_request_at: datetime | None = None
    completed_at: datetime | None = None
    page_cursor_digests: list[str] = Field(default_factory=list)
    page_count: int = 0
    resource_count: int = 0
    template_count: int = 0
    uri_set_digest: str | None = None
    descriptor_set_digest: str | None = None
    template_set_digest: str | None = None
    list_changed_before: int = 0  # session's list_changed counter before the first request
    list_changed_after: int = 0  # ... and after the last response
    notifications_observed: int = 0  # list_changed during the scan (after - before)
    snapshot: SnapshotEvidence = SnapshotEvidence()
    problems: list[str] = Field(default_factory=list)
    # MCP 2026-07-28 caching directives of the resources/list pages (None: no page answered, or the
    # scan row records none): the shortest ttlMs, and private if any page said private.
    list_ttl_ms: int | None = None
    list_cache_scope: CacheScope | None = None


class CatalogSnapshot(FrozenRecord):
    """``resourceCatalog.v1``: a reconciled catalog (two matching scans) as the ledger published it."""

    record: Literal["resourceCatalog.v1"] = "resourceCatalog.v1"
    catalog_id: int
    subject: str
    server: str
    reconciliation_id: str
    scan_a: str
    scan_b: str
    status: SnapshotStatus
    status_reason: str = ""
    session_generation: int
    snapshot_id: str | None = None
    window_started_at: datetime  # scan A's first request
    measured_at: datetime  # scan B's completion
    staleness_bound_seconds: float
    next_review_at: datetime
    uri_set_digest: str
    descriptor_set_digest: str
    template_set_digest: str
    resource_count: int
    template_count: int
    added: int = 0
    removed: int = 0
    changed: int = 0
    initial: bool = False  # the first catalog of this view: everything counts as added
    rollout_mode: RolloutMode = RolloutMode.ALL
    published_at: datetime | None = None


class RolloutPolicy(FrozenRecord):
    """Staged rollout of one server (PostgreSQL ``rollout_policies``; absent = ALL)."""

    server: str
    mode: RolloutMode = RolloutMode.ALL
    percent: float = Field(default=100.0, ge=0, le=100)
