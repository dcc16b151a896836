"""Identity reconciliation that cannot be frozen, the workflow's side, on the real stack.

A notification for an encoding variant of a subscribed URI sends the subscription to
RECONCILIATION_REQUIRED (it is never routed as if it were the exact URI). An operator's ``resume``
frees it, and so does evidence: a reconciled catalog measured after the conflict that lists the
exact URI resolves it at once (``IDENTITY_RECONCILED``, with the evidence), the same variant never
freezes it again, and without evidence it resumes after ``reconciliation_max_seconds``
(``RECONCILIATION_TIMED_OUT``): a stray or hostile notification cannot freeze a subscription.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from temporalio.client import Client, WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.names import SIGNAL_CATALOG_RECONCILED
from mcpsync.workflows.records.subscription import (
    CatalogObservation,
    SubscriptionKey,
    SubscriptionOptions,
    SubscriptionState,
)
from tests.conftest import eventually, running_services, unique
from tests.e2e.test_e2e_fence import _audit_for
from tests.e2e.test_e2e_subscription import _wait_record

S = SubscriptionState
READING = (S.ACTIVE, S.UPDATE_SEEN, S.READ_PENDING, S.VERSION_ACCEPTED)


def _pair() -> tuple[str, str]:
    tag = uuid.uuid4().hex
    return f"file:///srv/{tag}/Caf%c3%a9.txt", f"FILE:///srv/{tag}/Caf%C3%A9.txt"


def _server(fx: FixtureProcess) -> ServerConfig:
    # No catalog workflow: the evidence is signalled by hand, so the test controls its timing.
    return ServerConfig(name=unique("id"), transport="http", url=fx.mcp_url, subjects=["alice"],
                        catalog=False)


async def _conflicted(client: Client, fx: FixtureProcess, server: ServerConfig, task_queue: str, exact: str,
                      variant: str, *, max_seconds: float) -> tuple[SubscriptionKey, WorkflowHandle]:
    """Subscribe the exact URI (both spellings exist on the server), then a notification for the
    variant: the subscription is in RECONCILIATION_REQUIRED."""
    key = SubscriptionKey(subject="alice", server=server.name, uri=exact)
    first = await fx.create(exact, text="exact")
    await fx.create(variant, text="variant")
    handle = await start_subscription(client, key, task_queue=task_queue,
                                      options=SubscriptionOptions(reconciliation_max_seconds=max_seconds))
    await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"], "initial")
    await fx.notify(variant, unsolicited=True)
    await _wait_record(handle, lambda r: r.state == S.RECONCILIATION_REQUIRED, "conflict")
    return key, handle


async def test_a_stray_variant_notification_cannot_freeze_a_subscription(temporal_client: Client,
                                                                         ledger: Ledger,
                                                                         fx: FixtureProcess) -> None:
    exact, variant = _pair()
    server = _server(fx)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle = await _conflicted(temporal_client, fx, server, cfg.temporal.task_queue, exact, variant,
                                        max_seconds=3)
        rec = await _wait_record(handle, lambda r: r.state in READING, "resumed by the time bound",
                                 timeout=20)
        assert "timed out" in rec.detail or rec.detail == ""
        # The audit row is written right after the state change the record shows: wait for it.
        timed_out = await eventually(lambda: _audit_for(ledger, "RECONCILIATION_TIMED_OUT", key),
                                     what="audit")
        assert timed_out and timed_out[0]["detail"]["max_seconds"] == 3
        change = await fx.edit(exact, text="exact v2")  # real changes are read again
        await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                           "change read")


async def test_catalog_evidence_reconciles_identity_and_the_same_variant_never_freezes_again(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    exact, variant = _pair()
    server = _server(fx)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle = await _conflicted(temporal_client, fx, server, cfg.temporal.task_queue, exact, variant,
                                        max_seconds=600)
        conflict_at = datetime.now(UTC)

        def word(scan: str, measured_at: datetime, listed: bool = True) -> CatalogObservation:
            return CatalogObservation(uri=exact, listed=listed, scan_id=scan,
                                      snapshot_status="SNAPSHOT_UNPROVEN", session_generation=0,
                                      measured_at=measured_at)

        # No evidence: measured before the conflict, or the exact URI not listed.
        await handle.signal(SIGNAL_CATALOG_RECONCILED, word("before", conflict_at - timedelta(minutes=5)))
        await handle.signal(SIGNAL_CATALOG_RECONCILED, word("unlisted", conflict_at + timedelta(seconds=1),
                                                            listed=False))
        rec = await _wait_record(handle, lambda r: r.state == S.RECONCILIATION_REQUIRED, "still waiting")
        assert not await _audit_for(ledger, "IDENTITY_RECONCILED", key)
        # Evidence: a catalog measured after the conflict that lists the exact URI.
        await handle.signal(SIGNAL_CATALOG_RECONCILED, word("evidence", datetime.now(UTC)))
        rec = await _wait_record(handle, lambda r: r.state in READING, "reconciled by the catalog",
                                 timeout=15)
        reconciled = await eventually(lambda: _audit_for(ledger, "IDENTITY_RECONCILED", key), what="audit")
        assert reconciled[0]["detail"]["scan_id"] == "evidence"
        # The same stray variant again: an invalidation of the exact URI, never another freeze.
        reads = await ledger.reports.read_count(key)
        await fx.notify(variant, unsolicited=True)
        await eventually(lambda: _audit_for(ledger, "NORMALIZED_URI_MATCH_ALREADY_RECONCILED", key),
                         what="the known variant audited")
        await eventually(lambda: _more_reads(ledger, key, reads), what="a read of the exact URI")
        rec = await _wait_record(handle, lambda r: r.state in READING, "still reading")
        assert rec.state != S.RECONCILIATION_REQUIRED
        change = await fx.edit(exact, text="exact v2")
        await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                           "change read")


async def _more_reads(ledger: Ledger, key: SubscriptionKey, before: int) -> bool:
    return await ledger.reports.read_count(key) > before
