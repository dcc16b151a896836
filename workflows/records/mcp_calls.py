"""Records of the MCP calls a session host makes for a subscription: subscribe, unsubscribe, read.

Contract:
- ``ReadOutcome`` is what a read returned: digest and metadata (and the 2026-07-28 caching
  directives), never the body; ``ReadOutcomeKind`` classifies every way a read can end.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from mcpsync.workflows.records.base import FrozenRecord
from mcpsync.workflows.records.subscription import CacheScope, SubscriptionKey, TriggerReason

__all__ = ["SubscribeRequest", "SubscribeOutcome", "UnsubscribeRequest", "UnsubscribeOutcome", "ReadRequest",
           "ReadOutcomeKind", "ReadOutcome"]


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
