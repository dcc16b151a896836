"""The records and messages mcpsync exchanges: one pydantic model a concept.

Contract:
- Every model here is frozen and serializable through
  ``temporalio.contrib.pydantic.pydantic_data_converter``; workflows, activities,
  the ledger and the CLI all speak these types and nothing else.
- No model carries a resource body or a credential. Content travels as a digest
  (``sha256:<hex>``) plus metadata; bodies live only in the PostgreSQL content store.
- Versioned record names (``resourceSubscription.v1`` ...) are stable wire names:
  a change that breaks readers gets a new version, never an edit in place.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mcpsync.workflows.uris import MAX_URI_LENGTH, uri_problem, uri_slug

__all__ = [
    "FrozenRecord",
    "TERMINAL_STATES",
    "CLOSING_STATES",
    "OutboxEventType",
    "DEFAULT_TASK_QUEUE",
    "CatalogObservation",
    "CloseReceipt",
    "CloseRequest",
    "IdentityConflict",
    "ResumeRequest",
    "RevokeRequest",
    "RevokeLedgerRequest",
    "SubscriptionOptions",
    "TombstoneRequest",
    "Edition",
    "ReadOutcome",
    "ReadOutcomeKind",
    "ReadRequest",
    "ReadTicket",
    "ReadCycleRequest",
    "ReadCycleResult",
    "ReadReport",
    "AcceptRequest",
    "AcceptResult",
    "AcceptVerdict",
    "ResourceSubscriptionV1",
    "ResourceUpdated",
    "ResourceVersionV1",
    "SessionChanged",
    "SessionInfo",
    "SubscribeOutcome",
    "SubscribeRequest",
    "SubscriptionKey",
    "SubscriptionStart",
    "SubscriptionState",
    "TriggerReason",
    "CacheScope",
    "StalenessBoundSource",
    "UnsubscribeRequest",
    "UnsubscribeOutcome",
    "AllocateRequest",
    "FenceSnapshot",
    "NotedNotification",
    "EnsureRequest",
    "KeyRequest",
    "SetStateRequest",
    "SessionQuery",
    "BeginSubscriptionRequest",
    "MarkActiveRequest",
    "SubscribeCycleRequest",
    "SubscribeCycleResult",
    "FinishUnsubscribeRequest",
    "AuditRequest",
]

DEFAULT_TASK_QUEUE = "mcpsync"
"""Task queue of the main worker: workflows and ledger activities."""


class FrozenRecord(BaseModel):
    """The base of every mcpsync record: immutable, and unknown fields are an error, not ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid")


Edition = Literal["2025-11-25", "2026-07-28"]


class SubscriptionState(StrEnum):
    DISCOVERED = "DISCOVERED"
    SUBSCRIBING = "SUBSCRIBING"
    ACTIVE = "ACTIVE"
    UPDATE_SEEN = "UPDATE_SEEN"
    READ_PENDING = "READ_PENDING"
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
    CATALOG = "catalog"  # no read: a reconciled catalog confirmed a deletion (the TOMBSTONED receipt's trigger)


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
        """The id a NEW subscription of this key starts under: ``mcpsync-sub/<server>/<subject>/<slug>-<hash>``.

        Computed only for a key the ledger has no row for: once a subscription runs, its row
        records the id it runs under (older ones: ``legacy_workflow_id``) and everything that
        routes to it reads that (``mcpsync.activities.ledger.Ledger.workflow_id_of``; docs/upgrades.md,
        "Workflow ids").
        The URI can be long and contain anything: the slug (``mcpsync.workflows.uris.uri_slug``) is a
        bounded readable label, the hash keeps ids unique. The exact URI is in the memo and
        search attributes."""
        return f"mcpsync-sub/{self.server}/{self.subject}/{uri_slug(self.uri)}-{self._hash()}"

    @property
    def legacy_workflow_id(self) -> str:
        """The id scheme before readable ids (``mcpsync-sub/<server>/<subject>/<hash>``, the same hash).
        Nothing routes by it: subscriptions started under it are found through their ledger row.
        Kept so operators and tests can name such a workflow."""
        return f"mcpsync-sub/{self.server}/{self.subject}/{self._hash()}"

    def _hash(self) -> str:
        return hashlib.sha256(f"{self.subject}\0{self.server}\0{self.uri}".encode()).hexdigest()[:24]


class SubscriptionOptions(FrozenRecord):
    """Per-subscription knobs; the defaults suit production."""

    poll_interval_seconds: float = Field(default=30.0, gt=0)  # read period without usable subscribe
    max_concurrent_reads: int = Field(default=1, ge=1, le=8)  # >1: a newer read may overtake an older one
    max_history_events: int = Field(default=20_000, ge=100)  # continue-as-new even if not suggested
    # Notifications are only SHOULD and can be lost: even with subscribe, re-read this often so a
    # lost notification costs at most this much staleness (0 disables; silence then proves nothing).
    safety_read_seconds: float = Field(default=300.0, ge=0)
    # RECONCILIATION_REQUIRED is bounded: a reconciled catalog measured after the conflict that lists
    # the exact URI resolves it at once; without such evidence it resumes (audited) after this long,
    # so a stray or hostile notification can never freeze a subscription.
    reconciliation_max_seconds: float = Field(default=900.0, gt=0)


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


# --- messages into the workflow -------------------------------------------------


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


# --- activity contracts ----------------------------------------------------------


class SubscribeRequest(FrozenRecord):
    key: SubscriptionKey
    session_generation: int


class SubscribeOutcome(FrozenRecord):
    ok: bool
    session_generation: int
    error_code: int | None = None
    error: str | None = None


class UnsubscribeRequest(FrozenRecord):
    key: SubscriptionKey
    session_generation: int


class UnsubscribeOutcome(FrozenRecord):
    acked: bool
    error: str | None = None


class AllocateRequest(FrozenRecord):
    """Ask the ledger for the next read ordinal (CAS against the durable fence)."""

    key: SubscriptionKey
    session_generation: int
    subscription_generation: int
    min_ordinal: int  # the workflow's own lastIssuedOrdinal + 1; the ledger may go higher
    request_id: str
    trigger: TriggerReason
    # Set by the one-round-trip read activity, never by the workflow: the scheduled activity's
    # identity (run id / activity id), the same on every retry. The ledger answers a retry with
    # the ticket that activity already holds, so a retry after a committed accept replays it.
    cycle_id: str | None = None


class ReadTicket(FrozenRecord):
    """A read the fence issued: ordinal and request id are on record before dispatch."""

    granted: bool
    ordinal: int = 0
    request_id: str = ""
    reason: str = ""
    notifications_seen: int = 0  # the ledger's update counter when the read was allocated


class ReadRequest(FrozenRecord):
    key: SubscriptionKey
    session_generation: int
    subscription_generation: int
    ordinal: int
    request_id: str
    trigger: TriggerReason


class ReadOutcomeKind(StrEnum):
    CONTENT = "content"
    NOT_FOUND = "not_found"
    DENIED = "denied"
    MALFORMED = "malformed"  # the result does not parse as declared (types, base64, size)
    PROTOCOL = "protocol"  # the server broke the protocol (method not found, invalid request)
    TRANSIENT = "transient"  # timeouts and dependency errors that outlived their retries
    SESSION_LOST = "session_lost"  # the session generation is gone: nothing was read


class ReadOutcome(FrozenRecord):
    """What a read returned: digest and metadata only, never the body."""

    kind: ReadOutcomeKind
    key: SubscriptionKey
    ordinal: int
    request_id: str
    session_generation: int
    subscription_generation: int
    trigger: TriggerReason
    content_digest: str | None = None
    mime_type: str | None = None
    size: int = 0
    content_count: int = 0
    server_name: str = ""
    server_version: str = ""
    edition: str = ""
    error_code: int | None = None
    error: str | None = None
    guardrail_rejection: str | None = None  # why the content may not be released for model input
    completed_at: datetime | None = None
    # 2026-07-28 caching directives of the read result (older editions: the SDK's defaults 0 / private).
    # None: no result (an error). ttl_ms is a freshness hint, never a poll interval (docs/caching.md).
    ttl_ms: int | None = None
    cache_scope: CacheScope | None = None


class AcceptVerdict(StrEnum):
    ACCEPTED = "ACCEPTED"  # new version: receipt + outbox row
    UNCHANGED = "UNCHANGED"  # same digest as current: receipt, no outbox row
    STALE = "STALE"  # ordinal <= lastAccepted: stale receipt only
    STALE_AFTER_CLOSE = "STALE_AFTER_CLOSE"  # subscription no longer ACTIVE: audit only
    TOMBSTONE_PENDING = "TOMBSTONE_PENDING"  # not found while ACTIVE
    REJECTED = "REJECTED"  # unknown identity / generation mismatch: audit + reconciliation
    TOMBSTONED = "TOMBSTONED"  # deletion confirmed by a reconciled catalog: receipt + outbox row
    GUARDRAIL_REJECTED = "GUARDRAIL_REJECTED"  # read fine, not releasable to a model: receipt, no outbox
    REVOKED = "REVOKED"  # the read was denied: the subscription is revoked


# ``outbox.event_type``: what an ``outboxEvent.v1`` tells consumers (docs/outbox.md). A comment,
# not a docstring: the docstring would enter the envelope's published JSON schema.
class OutboxEventType(StrEnum):
    VERSION_ACCEPTED = "version_accepted"  # a new digest became current
    TOMBSTONED = "tombstoned"  # a reconciled catalog confirmed the deletion
    REVOKED = "revoked"  # the subject lost access: drop everything named in ``invalidates``
    CLOSED = "closed"  # the subscription stopped being tracked (closed / unsubscribed): nothing named in
    # ``invalidates`` is kept fresh any more; drop it or mark it untracked
    VERSION_CURRENT = "version_current"  # resync only: the current version of an ACTIVE subscription


class AcceptRequest(FrozenRecord):
    outcome: ReadOutcome
    expected_state: SubscriptionState  # the workflow's view; the ledger re-checks it in SQL
    close_epoch: int
    # Set by the ingress: notifications it absorbed into this read (they arrived after the read was
    # allocated, before it was sent, so it observes their change). The accept counts them under the
    # row lock and the read covers them (``coverage.covered_after``): whatever it judges, no other
    # read can make the row clean without having been allocated after them.
    absorbed: int = 0


class AcceptResult(FrozenRecord):
    verdict: AcceptVerdict
    receipt_id: int | None = None
    outbox_id: int | None = None
    watermark: int = 0
    last_accepted_ordinal: int = 0
    reason: str = ""
    notified: int = 0  # the row's notification count after this accept (``workflows/coverage.py``)
    covered: int = 0  # the row's ``covered`` after this accept: dirty while notified > covered


class FenceSnapshot(FrozenRecord):
    """The durable fence row as PostgreSQL holds it (reloaded after reset/rollback)."""

    exists: bool
    state: SubscriptionState | None = None
    session_generation: int = 0
    subscription_generation: int = 0
    last_issued_ordinal: int = 0
    last_accepted_ordinal: int = 0
    watermark: int = 0
    close_epoch: int = 0
    close_ordinal: int | None = None
    last_accepted_digest: str | None = None
    last_receipt_id: int | None = None
    notifications_seen: int = 0  # notifications the ingress recorded (*notified*, ``workflows/coverage.py``)
    covered: int = 0  # ``notified`` at the allocation of the newest judged read that observed the resource
    allocated_sequence: int = 0  # ``notified`` at the newest allocation
    # The run that made it ACTIVE mirrors reads the ingress makes (``resource_read``): set or
    # cleared by ``mark_active`` with the request's ``read_reports``.
    read_reports: bool = False


class ReadCycleRequest(FrozenRecord):
    """One round trip per read (``Act.MCP_READ_CYCLE`` on the session host's queue): allocate the
    ordinal (CAS, committed before the request is sent), ``resources/read``, judge and accept (CAS)."""

    allocate: AllocateRequest
    expected_state: SubscriptionState
    close_epoch: int


class ReadCycleResult(FrozenRecord):
    """What the read cycle did: the ticket; when refused, the durable fence; when read, the
    outcome (digest and metadata only); when judged, the ledger's verdict."""

    ticket: ReadTicket
    fence: FenceSnapshot | None = None
    outcome: ReadOutcome | None = None
    accept: AcceptResult | None = None

    @property
    def judged(self) -> bool:
        """The ledger judged the read (a verdict to mirror); else it was refused or lost its session."""
        return self.ticket.granted and self.outcome is not None and self.accept is not None


class ReadReport(FrozenRecord):
    """Signal ``resource_read``: the ingress read a notified change itself (one read cycle, the
    fence rules of ``McpSessionActivities.run_cycle``) and reports it: digest and verdict, never content.

    ``update`` is the notification it read for (the workflow notes it after mirroring the read,
    which covers it); ``requested_at``: when the ingress asked for the allocation (the read's
    deadline is armed from it, as from a read of the workflow's own)."""

    update: ResourceUpdated
    requested_at: datetime
    cycle: ReadCycleResult


class NotedNotification(FrozenRecord):
    """``note_notification``'s answer (the ledger's, and the simulator's model of it): where the
    ingress signals, the row after this notification, and whether it creates work."""

    workflow_id: str  # the id the subscription's workflow runs under (its ledger row's record)
    fence: FenceSnapshot
    work: bool = True  # the notification creates work (``coverage.plan_note``)


class EnsureRequest(FrozenRecord):
    """Create the fence row; ``incarnation`` is the workflow chain's first run id.

    A CLOSED row is reopened (as a new incarnation, ordinals kept) only by a chain
    that did not close it: a reset of the closing chain never reopens it."""

    key: SubscriptionKey
    incarnation: str


class SetStateRequest(FrozenRecord):
    key: SubscriptionKey
    state: SubscriptionState
    allowed_from: list[SubscriptionState]


class KeyRequest(FrozenRecord):
    key: SubscriptionKey


class SessionQuery(FrozenRecord):
    subject: str
    server: str


class BeginSubscriptionRequest(FrozenRecord):
    key: SubscriptionKey
    session_generation: int


class MarkActiveRequest(FrozenRecord):
    key: SubscriptionKey
    session_generation: int
    subscription_generation: int
    read_reports: bool = False  # the run mirrors ingress reads (``resource_read``); every run does


class SubscribeCycleRequest(FrozenRecord):
    """A subscription's start in one round trip (``Act.MCP_SUBSCRIBE_CYCLE`` on the session host's
    queue): ``subscribe`` on the live session; once the server took it, ``mark`` (SUBSCRIBING →
    ACTIVE, CAS on both generations); once ACTIVE, the initial ``read`` cycle."""

    subscribe: SubscribeRequest
    mark: MarkActiveRequest
    read: ReadCycleRequest


class SubscribeCycleResult(FrozenRecord):
    """What the start did: the subscribe outcome; ``active``: the row after ``mark`` (None: the
    server did not take the subscription, so nothing was marked); ``cycle``: the initial read cycle
    (None: the row was not ACTIVE on these generations, so nothing was read)."""

    subscribe: SubscribeOutcome
    active: FenceSnapshot | None = None
    cycle: ReadCycleResult | None = None


class FinishUnsubscribeRequest(FrozenRecord):
    key: SubscriptionKey
    acked: bool


class AuditRequest(FrozenRecord):
    kind: str
    key: SubscriptionKey
    session_generation: int | None = None
    detail: dict[str, str | int | None] = Field(default_factory=dict)


# --- records ----------------------------------------------------------------------


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
    ttl_ms: int | None = None  # the read result's ttlMs (None: receipts from before migration 009)
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
    next_read_due_at: datetime | None = None  # deadline of the next poll / safety read (None: none due)
    detail: str = ""



# --- catalog reconciliation (CatalogWorkflow) ---------------------------------------

__all__ += [
    "CatalogKey",
    "CatalogPolicy",
    "CatalogSnapshot",
    "CatalogStart",
    "ListChanged",
    "ResourceDiscoveryScanV1",
    "RolloutMode",
    "RolloutPolicy",
    "ScanStatus",
    "SnapshotEvidence",
    "SnapshotStatus",
]


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
    # MCP 2026-07-28 caching directives of the resources/list pages (None: no page answered, or a
    # scan from before migration 009): the shortest ttlMs, and private if any page said private.
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
