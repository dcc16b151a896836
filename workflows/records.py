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

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "DEFAULT_TASK_QUEUE",
    "CatalogObservation",
    "CloseReceipt",
    "CloseRequest",
    "Edition",
    "ReadOutcome",
    "ReadOutcomeKind",
    "ReadRequest",
    "ReadTicket",
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
    "UnsubscribeRequest",
    "UnsubscribeOutcome",
    "AllocateRequest",
    "FenceSnapshot",
    "session_task_queue",
    "EnsureRequest",
    "KeyRequest",
    "SessionQuery",
    "BeginSubscriptionRequest",
    "MarkActiveRequest",
    "FinishUnsubscribeRequest",
    "AuditRequest",
]

DEFAULT_TASK_QUEUE = "mcpsync"
"""Task queue of the main worker: workflows and ledger activities."""


class _Frozen(BaseModel):
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


class TriggerReason(StrEnum):
    INITIAL = "initial"  # first read after (re)subscribe: a change before subscribe is not missed
    UPDATED = "updated"  # notifications/resources/updated (or a listen ResourceUpdated event)
    FOLLOW_UP = "follow_up"  # an update arrived while a read was in flight
    POLL = "poll"  # no subscribe capability: periodic read with jitter
    RESUBSCRIBE = "resubscribe"  # new session generation


def session_task_queue(subject: str, server: str) -> str:
    """The task queue bound to the live MCP session of (subject, server)."""
    return f"mcpsync-session/{server}/{subject}"


class SubscriptionKey(_Frozen):
    """Identity of one subscription: the URI is the exact string as listed, never normalized."""

    subject: str = Field(min_length=1, max_length=200)
    server: str = Field(min_length=1, max_length=200)
    uri: str = Field(min_length=1, max_length=16384)

    @property
    def workflow_id(self) -> str:
        # The URI can be long and contain anything; the id hashes it and keeps the
        # readable parts. The exact URI lives in the memo and search attributes.
        h = hashlib.sha256(f"{self.subject}\0{self.server}\0{self.uri}".encode()).hexdigest()[:24]
        return f"mcpsync-sub/{self.server}/{self.subject}/{h}"


class SubscriptionStart(_Frozen):
    """Workflow input. ``carried_state`` (a dumped ``FenceState``) is set only by continue-as-new."""

    key: SubscriptionKey
    carried_state: dict[str, Any] | None = None
    seen_signal_ids: list[str] = Field(default_factory=list)


class SessionInfo(_Frozen):
    """The live session of one (subject, server) as the session host recorded it."""

    subject: str
    server: str
    generation: int
    edition: str
    subscribe: bool
    list_changed: bool
    server_name: str = ""
    server_version: str = ""
    task_queue: str
    opened_at: datetime


# --- messages into the workflow -------------------------------------------------


class ResourceUpdated(_Frozen):
    """Signal ``resource_updated``: an invalidation, never content."""

    uri: str
    session_generation: int
    received_at: datetime | None = None
    notification_id: str | None = None  # ingress-assigned id, for dedupe and audit


class SessionChanged(_Frozen):
    """Signal ``session_changed``: the session host opened a new session generation."""

    session_generation: int


class CloseRequest(_Frozen):
    """Update/signal ``close``."""

    reason: str = "requested"


class CatalogObservation(_Frozen):
    """Signal ``catalog_reconciled``: what a reconciled catalog says about one subscribed URI.

    Sent by CatalogWorkflow after an A/B reconciliation. ``listed`` False confirms a
    TOMBSTONE_PENDING subscription's deletion; True returns it to ACTIVE (recreated)."""

    uri: str
    listed: bool
    scan_id: str
    snapshot_status: str  # SNAPSHOT_UNPROVEN | SNAPSHOT_PROVEN
    session_generation: int
    measured_at: datetime | None = None


class CloseReceipt(_Frozen):
    state: SubscriptionState
    close_epoch: int
    close_ordinal: int
    last_accepted_ordinal: int


# --- activity contracts ----------------------------------------------------------


class SubscribeRequest(_Frozen):
    key: SubscriptionKey
    session_generation: int


class SubscribeOutcome(_Frozen):
    ok: bool
    session_generation: int
    error_code: int | None = None
    error: str | None = None


class UnsubscribeRequest(_Frozen):
    key: SubscriptionKey
    session_generation: int


class UnsubscribeOutcome(_Frozen):
    acked: bool
    error: str | None = None


class AllocateRequest(_Frozen):
    """Ask the ledger for the next read ordinal (CAS against the durable fence)."""

    key: SubscriptionKey
    session_generation: int
    subscription_generation: int
    min_ordinal: int  # the workflow's own lastIssuedOrdinal + 1; the ledger may go higher
    request_id: str
    trigger: TriggerReason


class ReadTicket(_Frozen):
    """A read the fence issued: ordinal and request id are on record before dispatch."""

    granted: bool
    ordinal: int = 0
    request_id: str = ""
    reason: str = ""


class ReadRequest(_Frozen):
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
    MALFORMED = "malformed"
    SESSION_LOST = "session_lost"  # the session generation is gone: nothing was read


class ReadOutcome(_Frozen):
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
    completed_at: datetime | None = None


class AcceptVerdict(StrEnum):
    ACCEPTED = "ACCEPTED"  # new version: receipt + outbox row
    UNCHANGED = "UNCHANGED"  # same digest as current: receipt, no outbox row
    STALE = "STALE"  # ordinal <= lastAccepted: stale receipt only
    STALE_AFTER_CLOSE = "STALE_AFTER_CLOSE"  # subscription no longer ACTIVE: audit only
    TOMBSTONE_PENDING = "TOMBSTONE_PENDING"  # not found while ACTIVE
    REJECTED = "REJECTED"  # unknown identity / generation mismatch: audit + reconciliation


class AcceptRequest(_Frozen):
    outcome: ReadOutcome
    expected_state: SubscriptionState  # the workflow's view; the ledger re-checks it in SQL
    close_epoch: int


class AcceptResult(_Frozen):
    verdict: AcceptVerdict
    receipt_id: int | None = None
    outbox_id: int | None = None
    watermark: int = 0
    last_accepted_ordinal: int = 0
    reason: str = ""


class FenceSnapshot(_Frozen):
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


class EnsureRequest(_Frozen):
    """Create the fence row; ``incarnation`` is the workflow chain's first run id.

    A CLOSED row is reopened (as a new incarnation, ordinals kept) only by a chain
    that did not close it: a reset of the closing chain never reopens it."""

    key: SubscriptionKey
    incarnation: str


class KeyRequest(_Frozen):
    key: SubscriptionKey


class SessionQuery(_Frozen):
    subject: str
    server: str


class BeginSubscriptionRequest(_Frozen):
    key: SubscriptionKey
    session_generation: int


class MarkActiveRequest(_Frozen):
    key: SubscriptionKey
    session_generation: int
    subscription_generation: int


class FinishUnsubscribeRequest(_Frozen):
    key: SubscriptionKey
    acked: bool


class AuditRequest(_Frozen):
    kind: str
    key: SubscriptionKey
    session_generation: int | None = None
    detail: dict[str, str | int | None] = Field(default_factory=dict)


# --- records ----------------------------------------------------------------------


class ResourceVersionV1(_Frozen):
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


class ResourceSubscriptionV1(_Frozen):
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
    watermark: int = 0
    close_epoch: int = 0
    close_ordinal: int | None = None
    reads_issued: int = 0
    staleness_bound_seconds: float | None = None  # published when polling (no subscribe)
    detail: str = ""

