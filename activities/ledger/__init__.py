"""The PostgreSQL ledger, assembled: one store, one object per concern, and their activities.

Contract:
- ``Ledger(pool)`` builds every concern once, from one ``LedgerStore`` (the pool), and hands the
  fence the same journal, content store and sessions:
  ``sessions`` (``mcpsync.activities.ledger.sessions``: sessions, leases), ``fence``
  (``mcpsync.activities.ledger.fence``: subscription rows, reads, receipts, the sole acceptance point,
  close, tombstone, revocation), ``content`` (``mcpsync.activities.ledger.content``: the body store),
  ``journal`` (``mcpsync.activities.ledger.journal``: audit log, outbox), ``verification``
  (``mcpsync.activities.ledger.verification``: the verification schedule, the watchdog's look) and ``reports``
  (``mcpsync.activities.ledger.reports``: read-only views for tests and diagnostics).
- ``activities(meters)`` lists the ledger's Temporal activities: the concerns' own methods,
  decorated where they are defined (no wrapper layer); their names are ``mcpsync.workflows.names.Act``.
- Callers use the concerns by their own names (``ledger.fence.accept``, ``ledger.reports.receipts``);
  the facade adds only, for an activity (which takes one request model), a plain-argument form that
  builds that request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from mcpsync.activities.ledger.content import ContentLedger
from mcpsync.activities.ledger.fence import FenceLedger
from mcpsync.activities.ledger.journal import Journal
from mcpsync.activities.ledger.reports import AuditRow, LedgerReports, OutboxRow
from mcpsync.activities.ledger.sessions import SessionLedger
from mcpsync.activities.ledger.store import LedgerStore
from mcpsync.activities.ledger.verification import VerificationLedger
from mcpsync.workflows.records.ledger import (
    BeginSubscriptionRequest,
    FenceSnapshot,
    FinishUnsubscribeRequest,
    KeyRequest,
    MarkActiveRequest,
    NotedNotification,
    SessionQuery,
    SetStateRequest,
)
from mcpsync.workflows.records.subscription import (
    CloseReceipt,
    RevokeLedgerRequest,
    SessionInfo,
    SubscriptionKey,
    SubscriptionState,
    TombstoneRequest,
)

__all__ = ["Ledger", "NotedNotification", "OutboxRow", "AuditRow"]


class Ledger:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool
        self.store = LedgerStore(pool)
        self.sessions = SessionLedger(self.store)
        self.content = ContentLedger(self.store)
        self.journal = Journal(self.store)
        self.fence = FenceLedger(self.store, journal=self.journal, content=self.content,
                                 sessions=self.sessions)
        self.reports = LedgerReports(self.store)
        self.verification = VerificationLedger(self.store)

    def activities(self) -> list[Callable[..., Any]]:
        """Every ledger activity of the main task queue."""
        return [*self.sessions.activities(), *self.fence.activities(), *self.journal.activities(),
                *self.verification.activities()]

    # --- activities called with plain arguments --------------------------------------------------

    async def current_session(self, subject: str, server: str) -> SessionInfo | None:
        return await self.sessions.current_session(SessionQuery(subject=subject, server=server))

    async def ensure_subscription(self, key: SubscriptionKey, incarnation: str,
                                  workflow_id: str | None = None) -> FenceSnapshot:
        """The ENSURE activity's row, for a workflow running under ``workflow_id`` (the activity
        passes its caller's; default ``key.workflow_id``, the id a new key starts under)."""
        return await self.fence.ensure_row(key, incarnation, workflow_id=workflow_id or key.workflow_id)

    async def load_fence(self, key: SubscriptionKey) -> FenceSnapshot:
        return await self.fence.load_fence(KeyRequest(key=key))

    async def begin_subscription(self, key: SubscriptionKey, session_generation: int) -> FenceSnapshot:
        return await self.fence.begin_subscription(
            BeginSubscriptionRequest(key=key, session_generation=session_generation))

    async def mark_active(self, key: SubscriptionKey, session_generation: int,
                          subscription_generation: int, *, read_reports: bool = False) -> FenceSnapshot:
        return await self.fence.mark_active(MarkActiveRequest(
            key=key, session_generation=session_generation, subscription_generation=subscription_generation,
            read_reports=read_reports))

    async def set_state(self, key: SubscriptionKey, state: SubscriptionState, *,
                        allowed_from: Sequence[str]) -> FenceSnapshot:
        return await self.fence.set_state(SetStateRequest(
            key=key, state=state, allowed_from=[SubscriptionState(s) for s in allowed_from]))

    async def begin_unsubscribe(self, key: SubscriptionKey) -> CloseReceipt:
        return await self.fence.begin_unsubscribe(KeyRequest(key=key))

    async def finish_unsubscribe(self, key: SubscriptionKey, acked: bool) -> FenceSnapshot:
        return await self.fence.finish_unsubscribe(FinishUnsubscribeRequest(key=key, acked=acked))

    async def confirm_tombstone(self, key: SubscriptionKey, *, listed: bool, scan_id: str,
                                proven: bool = False) -> FenceSnapshot:
        return await self.fence.confirm_tombstone(TombstoneRequest(key=key, listed=listed, scan_id=scan_id,
                                                                   proven=proven))

    async def revoke(self, key: SubscriptionKey, *, reason: str, source: str,
                     effective_at: datetime) -> FenceSnapshot:
        return await self.fence.revoke(RevokeLedgerRequest(key=key, reason=reason, source=source,
                                                           effective_at=effective_at))
