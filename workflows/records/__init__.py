"""The records and messages mcpsync exchanges: one pydantic model a concept, one module a concern.

Contract:
- Every model is frozen and serializable through ``temporalio.contrib.pydantic.pydantic_data_converter``;
  workflows, activities, the ledger and the CLI all speak these types and nothing else. No model
  carries a resource body or a credential: content travels as a digest plus metadata.
- Versioned record names (``resourceSubscription.v1`` ...) are stable wire names: a change that
  breaks readers gets a new version, never an edit in place.
- One module per concern: ``base`` (``FrozenRecord``), ``subscription`` (identity, options, states,
  the messages into the workflow), ``mcp_calls`` (subscribe, unsubscribe, read), ``ledger`` (the
  fence row, allocation, acceptance), ``read_cycle`` (the one-round-trip cycles, the ingress's
  report), ``versioned`` (``resourceVersion.v1``, ``resourceSubscription.v1``), ``catalog``.
- This package re-exports every public name, so ``from mcpsync.workflows.records import X`` is the
  one import path for its many importers (workflows, activities, worker, sim, tests) whichever
  module defines ``X``; a model's module does not enter its JSON (payloads and history are
  unchanged by where a model lives).
"""

from __future__ import annotations

from mcpsync.workflows.records.base import (
    DEFAULT_TASK_QUEUE,
    Edition,
    FrozenRecord,
)
from mcpsync.workflows.records.catalog import (
    CatalogKey,
    CatalogPolicy,
    CatalogSnapshot,
    CatalogStart,
    ListChanged,
    ResourceDiscoveryScanV1,
    RolloutMode,
    RolloutPolicy,
    ScanStatus,
    SnapshotEvidence,
    SnapshotStatus,
)
from mcpsync.workflows.records.ledger import (
    AcceptRequest,
    AcceptResult,
    AcceptVerdict,
    AllocateRequest,
    AuditRequest,
    BeginSubscriptionRequest,
    EnsureRequest,
    FenceSnapshot,
    FinishUnsubscribeRequest,
    KeyRequest,
    MarkActiveRequest,
    NotedNotification,
    OutboxEventType,
    ReadTicket,
    SessionQuery,
    SetStateRequest,
)
from mcpsync.workflows.records.mcp_calls import (
    ReadOutcome,
    ReadOutcomeKind,
    ReadRequest,
    SubscribeOutcome,
    SubscribeRequest,
    UnsubscribeOutcome,
    UnsubscribeRequest,
)
from mcpsync.workflows.records.read_cycle import (
    ReadCycleRequest,
    ReadCycleResult,
    ReadReport,
    SubscribeCycleRequest,
    SubscribeCycleResult,
)
from mcpsync.workflows.records.subscription import (
    CLOSING_STATES,
    TERMINAL_STATES,
    CacheScope,
    CatalogObservation,
    CloseReceipt,
    CloseRequest,
    IdentityConflict,
    ResourceUpdated,
    ResumeRequest,
    RevokeLedgerRequest,
    RevokeRequest,
    SessionChanged,
    SessionInfo,
    StalenessBoundSource,
    SubscriptionKey,
    SubscriptionOptions,
    SubscriptionStart,
    SubscriptionState,
    TombstoneRequest,
    TriggerReason,
)
from mcpsync.workflows.records.versioned import (
    ResourceSubscriptionV1,
    ResourceVersionV1,
)

__all__ = [
    "DEFAULT_TASK_QUEUE",
    "FrozenRecord",
    "Edition",
    "SubscriptionState",
    "TERMINAL_STATES",
    "CLOSING_STATES",
    "TriggerReason",
    "CacheScope",
    "StalenessBoundSource",
    "SubscriptionKey",
    "SubscriptionOptions",
    "SubscriptionStart",
    "SessionInfo",
    "ResourceUpdated",
    "SessionChanged",
    "IdentityConflict",
    "ResumeRequest",
    "TombstoneRequest",
    "RevokeRequest",
    "RevokeLedgerRequest",
    "CloseRequest",
    "CatalogObservation",
    "CloseReceipt",
    "SubscribeRequest",
    "SubscribeOutcome",
    "UnsubscribeRequest",
    "UnsubscribeOutcome",
    "ReadRequest",
    "ReadOutcomeKind",
    "ReadOutcome",
    "AllocateRequest",
    "ReadTicket",
    "AcceptVerdict",
    "OutboxEventType",
    "AcceptRequest",
    "AcceptResult",
    "FenceSnapshot",
    "NotedNotification",
    "EnsureRequest",
    "SetStateRequest",
    "KeyRequest",
    "SessionQuery",
    "BeginSubscriptionRequest",
    "MarkActiveRequest",
    "FinishUnsubscribeRequest",
    "AuditRequest",
    "ReadCycleRequest",
    "ReadCycleResult",
    "ReadReport",
    "SubscribeCycleRequest",
    "SubscribeCycleResult",
    "ResourceVersionV1",
    "ResourceSubscriptionV1",
    "SnapshotStatus",
    "ScanStatus",
    "RolloutMode",
    "CatalogKey",
    "CatalogPolicy",
    "CatalogStart",
    "ListChanged",
    "SnapshotEvidence",
    "ResourceDiscoveryScanV1",
    "CatalogSnapshot",
    "RolloutPolicy",
]
