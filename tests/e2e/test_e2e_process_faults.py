"""Process faults: the Temporal dev server killed and restarted on its SQLite file, PostgreSQL
(the embedded server from the wheel) stopped and started, while changes keep coming.

Invalidations that arrive while a dependency is down are retried by the ingress, ledger
activities are retried by Temporal: every change still converges and nothing regresses.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from mcpsync.activities.starters import start_subscription
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.main.connect import open_ledger
from mcpsync.worker.stack.postgres import EmbeddedPostgres
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.records.subscription import SubscriptionKey
from tests.conftest import eventually, running_services, unique
from tests.e2e.conftest import SpareFixtures, ingress_received
from tests.e2e.test_e2e_subscription import _wait_record


async def test_temporal_and_postgres_restarts_lose_nothing(own_state_dir: Path,
                                                           spare_fixtures: SpareFixtures) -> None:
    temporal = await TemporalDevServer.start(own_state_dir / "temporal", port=0, ui_port=0)
    pg = await EmbeddedPostgres.start(own_state_dir, database="faults")
    ledger = await open_ledger(pg.url)
    fx = await spare_fixtures.take()
    try:
        client = await Client.connect(temporal.address, data_converter=pydantic_data_converter)
        server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url)
        uri = f"demo://proc/{uuid.uuid4().hex}"
        key = SubscriptionKey(subject="anonymous", server=server.name, uri=uri)
        first = await fx.create(uri, text="v1")
        async with running_services(client, ledger, [server]) as cfg:
            handle = await start_subscription(client, key, task_queue=cfg.temporal.task_queue)
            await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"], "v1")
            await fx.wait_subscribed(uri)

            # Temporal killed (SIGKILL) while a change is notified; restarted on the same file.
            await temporal.kill()
            received = ingress_received(server.name)
            v2 = await fx.edit(uri, text="v2 while Temporal is down")
            # Witness that the change was notified while Temporal was down: the ingress received it.
            await eventually(lambda: ingress_received(server.name) > received, timeout=30,
                             what="v2's notification received by the ingress while Temporal is down")
            await temporal.restart()
            await _wait_record(handle, lambda r: r.last_accepted_digest == v2["committed"]["digest"],
                               "v2 after the Temporal restart", timeout=60)

            # PostgreSQL stopped while a change is notified; started again on the same data dir.
            await pg.stop()
            received = ingress_received(server.name)
            v3 = await fx.edit(uri, text="v3 while PostgreSQL is down")
            # Witness that the change was notified while PostgreSQL was down: the ingress received it.
            await eventually(lambda: ingress_received(server.name) > received, timeout=30,
                             what="v3's notification received by the ingress while PostgreSQL is down")
            pg = await EmbeddedPostgres.start(own_state_dir, database="faults")
            rec = await _wait_record(handle, lambda r: r.last_accepted_digest == v3["committed"]["digest"],
                                     "v3 after the PostgreSQL restart", timeout=90)
        fence = await ledger.load_fence(key)
        assert fence.last_accepted_digest == v3["committed"]["digest"] and fence.watermark == rec.watermark
        statuses = [r.status.value for r in await ledger.reports.receipts(key)]
        accepted = [r.read_ordinal for r in await ledger.reports.receipts(key)
                    if r.status.value == "ACCEPTED"]
        assert accepted == sorted(accepted) and statuses.count("ACCEPTED") >= 3
    finally:
        await fx.stop()
        await ledger.pool.close()
        await pg.stop()
        await temporal.stop()
