"""Subscription records: identity, options, state and the messages into the workflow.

Contract:
- ``SubscriptionKey`` is the exact (subject, server, URI) as listed, never normalized; it names
  the workflow id a new subscription starts under.
- ``SubscriptionStart`` / ``SubscriptionOptions`` are the workflow's input; the signal and update
  payloads (``ResourceUpdated``, ``SessionChanged``, ``IdentityConflict``, ``CatalogObservation``,
  ``RevokeRequest``, ``CloseRequest``, ``ResumeRequest``) carry invalidations and words, never content.
- ``SubscriptionState`` / ``TriggerReason`` are the enums every layer names states and reads by;
  ``TERMINAL_STATES`` is the one definition of "finished".
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from mcpsync.workflows.records.base import FrozenRecord
from mcpsync.workflows.uris import MAX_URI_LENGTH, uri_problem, uri_slug

__all__ = ["SubscriptionState", "TERMINAL_STATES", "CLOSING_STATES", "TriggerReason", "CacheScope",
           "StalenessBoundSource", "SubscriptionKey", "MAX_HISTORY_EVENTS", "SubscriptionOptions",
           "SubscriptionStart",
           "SessionInfo", "ResourceUpdated", "SessionChanged", "IdentityConflict", "ResumeRequest",
           "TombstoneRequest", "RevokeRequest", "RevokeLedgerRequest", "CloseRequest", "CatalogObservation",
           "CloseReceipt", "WATCHDOG_SECONDS"]


class SubscriptionState(StrEnum):
    DISCOVERED = "DISCOVERED"
    SUBSCRIBING = "SUBSCRIBING"
    ACTIVE = "ACTIVE"
    UPDATE_SEEN = "UPDATE_SEEN"
    READ_PENDING = "READ_PENDING"
    # Never produced: an accepted read leaves the phase ACTIVE. It stays because 0.2.0 publishes it: the
    # design's state machine names it, ``resourceSubscription.v1.state`` takes it, and
    # ``mcpsync_unresolved_subscriptions`` lists every unresolved state (this one at 0) for dashboards.
    VERSION_ACCEPTED = "VERSION_ACCEPTED"
    UNSUBSCRIBING = "UNSUBSCRIBING"
    CLOSED = "CLOSED"
    UNSUBSCRIBE_UNKNOWN = "UNSUBSCRIBE_UNKNOWN"
    TOMBSTONE_PENDING = "TOMBSTONE_PENDING"
    TOMBSTONED = "TOMBSTONED"
    RECONCILIATION_REQUIRED = "RECONCILIATION_REQUIRED"
    REVOKED = "REVOKED"  # the subject lost access: content purged, never served again from cache


TERMINAL_STATES = frozenset({SubscriptionState.CLOSED, SubscriptionState.UNSUBSCRIBE_UNKNOWN,
                             SubscriptionState.TOMBSTONED, SubscriptionState.REVOKED})
"""The one definition of "finished": main states that never reopen (in this incarnation). A
StrEnum set, so ledger rows' plain strings test against it too (``"REVOKED" in TERMINAL_STATES``)."""


CLOSING_STATES = frozenset({SubscriptionState.UNSUBSCRIBING, SubscriptionState.CLOSED,
                            SubscriptionState.UNSUBSCRIBE_UNKNOWN})
"""Main states of a subscription that is closing or closed: a read is never accepted in them."""


class TriggerReason(StrEnum):
    INITIAL = "initial"  # first read after (re)subscribe: a change before subscribe is not missed
    UPDATED = "updated"  # notifications/resources/updated (or a listen ResourceUpdated event)
    FOLLOW_UP = "follow_up"  # an update arrived while a read was in flight
    POLL = "poll"  # no subscribe capability: periodic read with jitter
    RESUBSCRIBE = "resubscribe"  # new session generation
    # no read: a reconciled catalog confirmed a deletion (the TOMBSTONED receipt's trigger)
    CATALOG = "catalog"


class CacheScope(StrEnum):
    """MCP 2026-07-28 ``cacheScope`` of a list or read result (``Cache-Control: public/private``).

    mcpsync never shares a stored body across subjects whatever the scope (docs/caching.md):
    it is recorded so consumers and audits can see what the server declared."""

    PUBLIC = "public"
    PRIVATE = "private"


class StalenessBoundSource(StrEnum):
    """Which rule set a polling subscription's published staleness bound (docs/caching.md)."""

    CONFIG = "config"  # SubscriptionOptions.poll_interval_seconds
    TTL = "ttl"  # the last read's ttlMs was longer: never poll faster than the server allows
    BACKOFF = "backoff"  # consecutive failed reads stretched the period


class SubscriptionKey(FrozenRecord):
    """Identity of one subscription: the URI is the exact string as listed, never normalized."""

    subject: str = Field(min_length=1, max_length=200)
    server: str = Field(min_length=1, max_length=200)
    uri: str = Field(min_length=1, max_length=MAX_URI_LENGTH)

    @field_validator("uri")
    @classmethod
    def _uri_is_usable(cls, uri: str) -> str:
        problem = uri_problem(uri)
        if problem is not None:
            raise ValueError(problem)
        return uri

    @property
    def workflow_id(self) -> str:
        """The id a NEW subscription starts under: ``mcpsync-sub/<server>/<subject>/<slug>-<hash>``.

        Only for a key the ledger has no row for: a running subscription's row records its id (older
        ones: ``legacy_workflow_id``), and routing reads that (``FenceLedger.workflow_id_of``;
        docs/upgrades.md,
        "Workflow ids"). The slug (``uris.uri_slug``) is a bounded readable label of a URI that can be
        long and contain anything, the hash keeps ids unique; the exact URI is in the workflow input and
        static details, and up to 255 bytes in the ``McpUri`` search attribute."""
        return f"mcpsync-sub/{self.server}/{self.subject}/{uri_slug(self.uri)}-{self._hash()}"

    @property
    def legacy_workflow_id(self) -> str:
        """The id scheme before readable ids (``mcpsync-sub/<server>/<subject>/<hash>``, the same hash).
        Nothing routes by it: subscriptions started under it are found through their ledger row.
        Kept so operators and tests can name such a workflow."""
        return f"mcpsync-sub/{self.server}/{self.subject}/{self._hash()}"

    def _hash(self) -> str:
        return hashlib.sha256(f"{self.subject}\0{self.server}\0{self.uri}".encode()).hexdigest()[:24]


MAX_HISTORY_EVENTS = 500
"""``SubscriptionOptions.max_history_events``' default."""

WATCHDOG_SECONDS = 6 * 3600.0
"""``SubscriptionOptions.watchdog_seconds``' default: ``verification_rules.WATCHDOG_HORIZON``, which
says why six hours."""


class SubscriptionOptions(FrozenRecord):
    """Per-subscription knobs; the defaults suit production."""

    poll_interval_seconds: float = Field(default=30.0, gt=0)  # read period without usable subscribe
    max_concurrent_reads: int = Field(default=1, ge=1, le=8)  # >1: a newer read may overtake an older one
    # Continue-as-new at this history length even if Temporal has not suggested it. A cached run keeps
    # the SDK's state of every command it issued until it ends (~350 B of worker memory per history
    # event, docs/benchmarks.md): 500 events (~5 h at the 300 s safety period) bounds a run at
    # ~170 KiB, where the server's suggestion (~4,096 events) let it reach ~1.4 MiB.
    max_history_events: int = Field(default=MAX_HISTORY_EVENTS, ge=100)
    # Notifications are only SHOULD and can be lost: even with subscribe, re-read this often so a
    # lost notification costs at most this much staleness (0 disables; silence then proves nothing).
    safety_read_seconds: float = Field(default=300.0, ge=0)
    # RECONCILIATION_REQUIRED is bounded: a reconciled catalog measured after the conflict that lists
    # the exact URI resolves it at once; without such evidence it resumes (audited) after this long,
    # so a stray or hostile notification can never freeze a subscription.
    reconciliation_max_seconds: float = Field(default=900.0, gt=0)
    # A run whose safety reads the ledger schedules (the ingress's sweep: ``verification_rules``) keeps
    # no per-period timer: its watchdog wakes this often to ask the ledger whether every verification
    # kept the bound, and reads itself when one is overdue. A breach is detected within this.
    watchdog_seconds: float = Field(default=WATCHDOG_SECONDS, gt=0)

    @model_serializer(mode="wrap")
    def _known_to_older_builds(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """``watchdog_seconds`` is dumped only when it differs from its default: the previous build
        forbids a field it does not know, and a run moving back to it (continue-as-new) must still
        decode its input (docs/upgrades.md, "Rollback")."""
        data: dict[str, Any] = handler(self)
        if data.get("watchdog_seconds") == WATCHDOG_SECONDS:
            del data["watchdog_seconds"]
        return data


class SubscriptionStart(FrozenRecord):
    """Workflow input. ``carried_state`` (a dumped ``FenceState``) is set only by continue-as-new."""

    key: SubscriptionKey
    options: SubscriptionOptions = Field(default_factory=SubscriptionOptions)
    carried_state: dict[str, Any] | None = None
    seen_signal_ids: list[str] = Field(default_factory=list)


class SessionInfo(FrozenRecord):
    """The live session of one (subject, server) as the session host recorded it."""

    subject: str
    server: str
    generation: int
    edition: str
    subscribe: bool
    list_changed: bool
    server_name: str = ""
    server_version: str = ""
    task_queue: str  # the owning ingress process's queue: its MCP activities run over this session
    opened_at: datetime


class ResourceUpdated(FrozenRecord):
    """Signal ``resource_updated``: an invalidation, never content."""

    uri: str
    session_generation: int
    received_at: datetime | None = None
    notification_id: str | None = None  # ingress-assigned id, for dedupe and audit
    sequence: int | None = None  # the ledger's update counter for this URI once this one was recorded


class SessionChanged(FrozenRecord):
    """Signal ``session_changed``: the session host opened a new session generation."""

    session_generation: int


class IdentityConflict(FrozenRecord):
    """Signal ``identity_conflict``: a notification or listing matched this URI only after
    normalization (or two listed URIs normalize alike). The subscription stops accepting
    until ``resume``; nothing is routed to a different resource."""

    observed_uri: str
    reason: str
    session_generation: int = 0


class ResumeRequest(FrozenRecord):
    """Update ``resume``: an operator or a catalog reconciliation cleared RECONCILIATION_REQUIRED."""

    reason: str = "resolved"


class TombstoneRequest(FrozenRecord):
    key: SubscriptionKey
    listed: bool
    scan_id: str
    proven: bool = False


class RevokeRequest(FrozenRecord):
    """Signal ``revoke``: the platform withdrew the subject's access to this URI (or to all)."""

    reason: str = "revoked by platform"
    effective_at: datetime | None = None  # when access ended; revocation latency counts from here


class RevokeLedgerRequest(FrozenRecord):
    key: SubscriptionKey
    reason: str
    source: str  # platform | read_denied | catalog
    effective_at: datetime


class CloseRequest(FrozenRecord):
    """Update/signal ``close``."""

    reason: str = "requested"


class CatalogObservation(FrozenRecord):
    """Signal ``catalog_reconciled``: what a reconciled catalog says about one subscribed URI.

    Sent by CatalogWorkflow after an A/B reconciliation. ``listed`` False confirms a
    TOMBSTONE_PENDING subscription's deletion; True returns it to ACTIVE (recreated)."""

    uri: str
    listed: bool
    scan_id: str
    snapshot_status: str  # SNAPSHOT_UNPROVEN | SNAPSHOT_PROVEN
    session_generation: int
    measured_at: datetime | None = None
    # Other URIs that catalog listed which normalize like ``uri`` (RFC 3986 §6.2.2) but differ:
    # the evidence identity reconciliation needs (empty: the exact URI has no variant listed).
    variants: list[str] = Field(default_factory=list)


class CloseReceipt(FrozenRecord):
    state: SubscriptionState
    close_epoch: int
    close_ordinal: int
    last_accepted_ordinal: int
