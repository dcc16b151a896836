"""Temporal activities over the ledger (main task queue).

Contract: thin, idempotent wrappers. Each takes one request model from
``workflows.records`` and returns one; retries are safe because every write is
a compare-and-set or keyed insert (``accept`` answers a retried call with the
verdict already committed). ``ensure_subscription`` records the calling workflow's
own id in the row (``activity.info().workflow_id``): the id routers use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import activity

from activities.ledger import Ledger
from activities.meters import NO_METERS, Meters
from workflows.names import Act
from workflows.records import (
    AcceptRequest,
    AcceptResult,
    AllocateRequest,
    AuditRequest,
    BeginSubscriptionRequest,
    CloseReceipt,
    EnsureRequest,
    FenceSnapshot,
    FinishUnsubscribeRequest,
    KeyRequest,
    MarkActiveRequest,
    ReadTicket,
    RevokeLedgerRequest,
    SessionInfo,
    SessionQuery,
    SetStateRequest,
    TombstoneRequest,
)

__all__ = ["LedgerActivities"]


class LedgerActivities:
    def __init__(self, ledger: Ledger, meters: Meters = NO_METERS) -> None:
        self.ledger = ledger
        self.meters = meters

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.ensure_subscription,
            self.load_fence,
            self.current_session,
            self.begin_subscription,
            self.mark_active,
            self.allocate_read,
            self.accept,
            self.begin_unsubscribe,
            self.finish_unsubscribe,
            self.audit,
            self.set_state,
            self.confirm_tombstone,
            self.revoke,
        ]

    @activity.defn(name=Act.ENSURE)
    async def ensure_subscription(self, req: EnsureRequest) -> FenceSnapshot:
        # The row records the id the calling workflow really runs under (whatever scheme or starter
        # chose it), so every router finds it without recomputing it from the key.
        return await self.ledger.ensure_subscription(req.key, req.incarnation,
                                                     workflow_id=activity.info().workflow_id)

    @activity.defn(name=Act.LOAD_FENCE)
    async def load_fence(self, req: KeyRequest) -> FenceSnapshot:
        return await self.ledger.load_fence(req.key)

    @activity.defn(name=Act.CURRENT_SESSION)
    async def current_session(self, req: SessionQuery) -> SessionInfo | None:
        return await self.ledger.current_session(req.subject, req.server)

    @activity.defn(name=Act.BEGIN_SUBSCRIPTION)
    async def begin_subscription(self, req: BeginSubscriptionRequest) -> FenceSnapshot:
        return await self.ledger.begin_subscription(req.key, req.session_generation)

    @activity.defn(name=Act.MARK_ACTIVE)
    async def mark_active(self, req: MarkActiveRequest) -> FenceSnapshot:
        return await self.ledger.mark_active(req.key, req.session_generation, req.subscription_generation)

    @activity.defn(name=Act.ALLOCATE_READ)
    async def allocate_read(self, req: AllocateRequest) -> ReadTicket:
        return await self.ledger.allocate_read(req)

    @activity.defn(name=Act.ACCEPT)
    async def accept(self, req: AcceptRequest) -> AcceptResult:
        result = await self.ledger.accept(req)
        self.meters.receipt_judged(req, result)
        return result

    @activity.defn(name=Act.BEGIN_UNSUBSCRIBE)
    async def begin_unsubscribe(self, req: KeyRequest) -> CloseReceipt:
        return await self.ledger.begin_unsubscribe(req.key)

    @activity.defn(name=Act.FINISH_UNSUBSCRIBE)
    async def finish_unsubscribe(self, req: FinishUnsubscribeRequest) -> FenceSnapshot:
        return await self.ledger.finish_unsubscribe(req.key, req.acked)

    @activity.defn(name=Act.AUDIT)
    async def audit(self, req: AuditRequest) -> int:
        return await self.ledger.audit(
            req.kind,
            subject=req.key.subject,
            server=req.key.server,
            uri=req.key.uri,
            workflow_id=await self.ledger.workflow_id_of(req.key),
            session_generation=req.session_generation,
            detail=dict(req.detail),
        )

    @activity.defn(name=Act.SET_STATE)
    async def set_state(self, req: SetStateRequest) -> FenceSnapshot:
        return await self.ledger.set_state(req.key, req.state, allowed_from=[s.value for s in req.allowed_from])

    @activity.defn(name=Act.CONFIRM_TOMBSTONE)
    async def confirm_tombstone(self, req: TombstoneRequest) -> FenceSnapshot:
        return await self.ledger.confirm_tombstone(req.key, listed=req.listed, scan_id=req.scan_id,
                                                   proven=req.proven)

    @activity.defn(name=Act.REVOKE)
    async def revoke(self, req: RevokeLedgerRequest) -> FenceSnapshot:
        return await self.ledger.revoke(req.key, reason=req.reason, source=req.source, effective_at=req.effective_at)
