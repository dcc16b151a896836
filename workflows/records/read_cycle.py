"""Records of the one-round-trip cycles on a session host's queue, and the ingress's report.

Contract: a read (allocate, read, accept) or a start (subscribe, mark ACTIVE, the initial read) is one
activity whose result says how far it got; ``ReadReport`` carries the ingress's own read cycle to the
workflow. Digests and verdicts only, never content.
"""

from __future__ import annotations

from datetime import datetime

from mcpsync.workflows.records.base import FrozenRecord
from mcpsync.workflows.records.ledger import (
    AcceptResult,
    AllocateRequest,
    FenceSnapshot,
    MarkActiveRequest,
    ReadTicket,
)
from mcpsync.workflows.records.mcp_calls import ReadOutcome, SubscribeOutcome, SubscribeRequest
from mcpsync.workflows.records.subscription import ResourceUpdated, SubscriptionState

__all__ = ["ReadCycleRequest", "ReadCycleResult", "ReadReport", "SubscribeCycleRequest",
           "SubscribeCycleResult"]


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
