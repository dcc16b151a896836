"""Records of the fence ledger: allocation, acceptance, the durable fence row, ledger requests.

Contract:
- ``FenceSnapshot`` is the PostgreSQL fence row as the ledger holds it; every workflow decision
  that follows the ledger adopts it.
- ``AllocateRequest`` / ``ReadTicket``: a read's ordinal, on record before the read is sent.
- ``AcceptRequest`` / ``AcceptResult`` / ``AcceptVerdict``: the sole acceptance point's question
  and answer (the answer carries the row's ``notified`` and ``covered``, ``workflows/coverage.py``).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from mcpsync.workflows.records.base import FrozenRecord
from mcpsync.workflows.records.mcp_calls import ReadOutcome
from mcpsync.workflows.records.subscription import (
    SessionInfo,
    SubscriptionKey,
    SubscriptionState,
    TriggerReason,
)

__all__ = ["AllocateRequest", "ReadTicket", "AcceptVerdict", "OutboxEventType", "AcceptRequest",
           "AcceptResult", "FenceSnapshot", "NotedNotification", "EnsureRequest", "SetStateRequest",
           "KeyRequest", "SessionQuery", "BeginSubscriptionRequest", "StartSubscriptionRequest",
           "SubscriptionStarted", "MarkActiveRequest",
           "FinishUnsubscribeRequest", "AuditRequest"]


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
    OVERDUE = "overdue"  # the watchdog found verifications further apart than the staleness bound


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


class StartSubscriptionRequest(FrozenRecord):
    """A new run's first ledger call (``Act.START_SUBSCRIPTION``): ``ensure``, then the live session
    of its subject and server, then, when ``begin`` and the ensured row is one the run subscribes at
    once (``ledger_flow.begins_at_start``), ``begin_subscription`` on that session."""

    ensure: EnsureRequest
    begin: bool


class SubscriptionStarted(FrozenRecord):
    """What ``StartSubscriptionRequest`` did: the ensured row, the live session (None: none open) and
    the row after ``begin_subscription`` on it (None: not begun)."""

    fence: FenceSnapshot
    session: SessionInfo | None = None
    begun: FenceSnapshot | None = None


class MarkActiveRequest(FrozenRecord):
    key: SubscriptionKey
    session_generation: int
    subscription_generation: int
    read_reports: bool = False  # the run mirrors ingress reads (``resource_read``); every run does
    # The subscribed run's safety-read period: the ledger schedules the row's verifications by it
    # (``verification_rules``), and the ingress's sweep reads the URI when one is due.
    safety_read_seconds: float | None = None


class FinishUnsubscribeRequest(FrozenRecord):
    key: SubscriptionKey
    acked: bool


class AuditRequest(FrozenRecord):
    kind: str
    key: SubscriptionKey
    session_generation: int | None = None
    detail: dict[str, str | int | None] = Field(default_factory=dict)


class WatchRequest(FrozenRecord):
    """The watchdog's look at the ledger's verifications of ``key`` (``ledger_watch_verifications``),
    against the row's safety-read period."""

    key: SubscriptionKey


class WatchResult(FrozenRecord):
    """What the look found (``verification_rules.judge_gap`` on the gap still open): ``overdue``, the
    run reads through its own activity; a new breach was recorded in the same transaction
    (``outbox_id``: its ``overdue`` outbox event). ``scheduled`` False: the row is not on the ledger's
    schedule (not ACTIVE, or no safety-read period): nothing was judged."""

    scheduled: bool
    verified_at: datetime | None = None
    gap_seconds: float | None = None
    period_seconds: float | None = None
    overdue: bool = False
    outbox_id: int | None = None
