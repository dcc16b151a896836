"""Revocation orchestration: the ledger revokes first, then the workflows are told to mirror it.

Contract:
- ``revoke_subject`` records the revocation in one ledger transaction, then signals each
  workflow it revoked, at most ``REVOKE_SIGNALS_IN_FLIGHT`` at a time; with ``wait`` it reports
  which workflows' records say REVOKED (``Revocation``). ``revoke`` is the same without waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.fence import SubjectRevocation
from mcpsync.worker.main.bulk import settle_all
from mcpsync.workflows.names import (
    QUERY_SUBSCRIPTION,
    SIGNAL_REVOKE,
)
from mcpsync.workflows.records.subscription import RevokeRequest, SubscriptionState
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1

__all__ = ["REVOKE_SIGNALS_IN_FLIGHT", "Revocation", "revoke", "revoke_subject"]


REVOKE_SIGNALS_IN_FLIGHT = 32


@dataclass(frozen=True)
class Revocation:
    """What ``revoke_subject`` did: the ledger's record, and which workflows mirrored it."""

    ledger: SubjectRevocation
    signalled: list[str]  # live workflows told (the ledger had already revoked them)
    mirrored: list[str] | None = None  # with ``wait``: the signalled workflows whose record says REVOKED
    pending: list[str] | None = None  # with ``wait``: those that had not when the wait ran out


async def revoke_subject(client: Client, ledger: Ledger, *, subject: str, server: str, uri: str | None,
                         reason: str = "revoked by platform", effective_at: datetime | None = None,
                         wait: float | None = None) -> Revocation:
    """revoke(subject, server, uri|*): the ledger first, then the workflows.

    One ledger transaction (``FenceLedger.revoke_subject``) covers every subscription of the
    subject on that server, finished ones included: from its commit on no body of them is released
    or stored, whether or not a worker runs. Then each subscription it moved to REVOKED is signalled
    so its workflow mirrors the state (a workflow that is gone needs nothing). ``wait``: seconds to
    wait for every signalled workflow's record to say REVOKED (``mirrored`` / ``pending``)."""
    effective = effective_at or datetime.now(UTC)
    record = await ledger.fence.revoke_subject(subject, server, uri, reason=reason, effective_at=effective)
    # The ledger has revoked them all; the signals only let the workflows mirror it, so they go out
    # REVOKE_SIGNALS_IN_FLIGHT at a time (a whole subject may hold thousands of subscriptions).
    async def tell(workflow_id: str) -> bool:
        try:
            await client.get_workflow_handle(workflow_id).signal(
                SIGNAL_REVOKE, RevokeRequest(reason=reason, effective_at=effective))
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return False  # no workflow: the ledger's word is all there is
        return True

    told = await settle_all(record.revoked, tell, limit=REVOKE_SIGNALS_IN_FLIGHT)
    signalled = [w for w, ok in zip(record.revoked, told, strict=True) if ok]
    if wait is None:
        return Revocation(ledger=record, signalled=signalled)
    mirrored, pending = await _wait_mirrored(client, signalled, timeout=wait)
    return Revocation(ledger=record, signalled=signalled, mirrored=mirrored, pending=pending)


async def _wait_mirrored(client: Client, workflow_ids: Sequence[str], *, timeout: float) -> tuple[list[str],
                                                                                                  list[str]]:
    """(mirrored, not yet) among ``workflow_ids`` after at most ``timeout`` seconds: a workflow has
    mirrored the revocation once its record (query ``subscription``) says REVOKED. A workflow that
    cannot answer (no worker) is asked again until the time runs out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    async def one(workflow_id: str) -> bool:
        handle = client.get_workflow_handle(workflow_id)
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return False
            with suppress(Exception):  # no worker polling, or a query that timed out: ask again
                record = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1,
                                            rpc_timeout=timedelta(seconds=max(0.5, min(5.0, left))))
                if record.state == SubscriptionState.REVOKED:
                    return True
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))

    results = await asyncio.gather(*(one(w) for w in workflow_ids))
    mirrored = [w for w, ok in zip(workflow_ids, results, strict=True) if ok]
    return mirrored, [w for w in workflow_ids if w not in mirrored]


async def revoke(client: Client, ledger: Ledger, *, subject: str, server: str, uri: str | None,
                 reason: str = "revoked by platform", effective_at: datetime | None = None) -> list[str]:
    """``revoke_subject`` without waiting; the ids of the workflows it signalled."""
    return (await revoke_subject(client, ledger, subject=subject, server=server, uri=uri, reason=reason,
                                 effective_at=effective_at)).signalled
