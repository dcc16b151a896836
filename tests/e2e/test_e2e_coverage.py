"""Reads per distinct change under duplicate notifications and concurrent writers (issue 25, "Done when").

Seven URIs on the fixture server, one writer per URI in lockstep rounds (the seven edits of a
round run concurrently; the next round starts once every change of this one converged), every
change announced three times back to back, ten changes per URI, on both transports. The server
counts the reads it serves: reads per distinct change must stay at most 1.05, and every change
must be accepted.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureControl, FixtureProcess, stdio_command, wait_ready_file
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.records.subscription import SubscriptionKey
from tests.conftest import running_services, unique
from tests.e2e.test_e2e_subscription import _wait_record

URIS = 7
COPIES = 3
CHANGES = 10
MAX_READS_PER_CHANGE = 1.05


async def _run(temporal_client: Client, ledger: Ledger, server: ServerConfig, uris: list[str],
               connect: Callable[[], Awaitable[FixtureControl]]) -> float:
    """``connect`` returns the fixture's control plane once the session host runs (stdio spawns it)."""
    async with running_services(temporal_client, ledger, [server]) as cfg:
        control = await connect()
        for uri in uris:
            await control.create(uri, text=f"{uri} version 0", mime_type="text/plain")
        handles: list[WorkflowHandle[Any, Any]] = []
        for uri in uris:
            key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
            handles.append(await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue))
        await asyncio.gather(*(_wait_record(h, lambda r: r.watermark >= 1, "initial read accepted",
                                            timeout=60)
                               for h in handles))
        for uri in uris:
            await control.wait_subscribed(uri, timeout=20)
        await control.faults(notify_copies={uri: COPIES for uri in uris})
        before = (await control.stats())["reads"]

        for i in range(1, CHANGES + 1):
            edits = await asyncio.gather(*(control.edit(uri, text=f"{uri} version {i}") for uri in uris))
            await asyncio.gather(*(
                _wait_record(h, lambda r, d=e["committed"]["digest"]: r.last_accepted_digest == d,
                             f"change {i} of {uri} accepted", timeout=60)
                for h, e, uri in zip(handles, edits, uris, strict=True)))
        after = (await control.stats())["reads"]
        async with ledger.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT rr.trigger_reason, rr.outcome, (rr.cycle_id LIKE 'ingress/%%') "
                "AS at_ingress, count(*) FROM read_requests rr JOIN subscriptions s ON s.workflow_id = "
                "rr.workflow_id WHERE s.server = %s GROUP BY 1, 2, 3 ORDER BY 4 DESC", (server.name,))
            print(f"{server.transport}: reads by (trigger, verdict, at the ingress): {await cur.fetchall()}")
    per_uri = {uri: after.get(uri, 0) - before.get(uri, 0) for uri in uris}
    reads = sum(per_uri.values())
    ratio = reads / (URIS * CHANGES)
    print(f"{server.transport}: {reads} reads for {URIS * CHANGES} changes = {ratio:.3f} reads per change;"
          f" per URI {sorted(per_uri.values())}")
    return ratio


async def test_http_seven_writers_three_copies_read_once_per_change(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, edition="2025-11-25",
                          subjects=["alice"])
    uris = [f"demo://coverage/{n}/{uuid.uuid4().hex}" for n in range(URIS)]

    async def connect() -> FixtureControl:
        return fx

    try:
        ratio = await _run(temporal_client, ledger, server, uris, connect)
    finally:
        await fx.faults(reset=True)
    assert ratio <= MAX_READS_PER_CHANGE, ratio


@pytest.mark.parametrize("edition", ["2025-11-25"])
async def test_stdio_seven_writers_three_copies_read_once_per_change(
        temporal_client: Client, ledger: Ledger, tmp_path: Path, edition: str) -> None:
    ready = tmp_path / "ready.json"
    command, env = stdio_command(ready_file=ready, seed="none")
    server = ServerConfig(name=unique("fx"), transport="stdio", command=command, env=env, edition=edition,
                          subjects=["alice"])
    uris = [f"file:///srv/coverage/{n}/{uuid.uuid4().hex}.txt" for n in range(URIS)]
    opened: list[FixtureControl] = []

    async def connect() -> FixtureControl:
        info = await wait_ready_file(ready, timeout=20)
        opened.append(FixtureControl(info["control_url"]))
        return opened[-1]

    try:
        ratio = await _run(temporal_client, ledger, server, uris, connect)
    finally:
        for control in opened:
            await control.aclose()
    assert ratio <= MAX_READS_PER_CHANGE, ratio
