"""Reads per distinct change under duplicate notifications and concurrent writers (issue 25, "Done when";
issue 46 item 6).

Seven URIs on the fixture server, seven concurrent writers, one per URI, ten changes each, on both
transports. A writer writes its next change ``WRITE_PAUSE_SECONDS`` after the ledger accepted its
last one (the pace is the reads', not that of the Temporal queries the workflow's record answers).
Every change is announced three times, ``COPY_GAP_MS`` apart, and a read takes ``READ_DELAY_MS``, as
a server that announces each write separately and reads from storage: the later copies arrive after
the read at the ingress was sent, which that read cannot cover (workflows/coverage.py). Their key
settles (workflows/ingress.py, Settle): one follow-up read covers them and the writer's next change.
The server counts the reads it serves. Until each URI's last change was accepted, reads per distinct
change must stay at most 1.05 (without the settle: 1.2-1.4, each copy after the send read again at
once, UNCHANGED); every change is accepted and mirrored. After that, until the ingress is idle, the
only reads are the follow-ups of copies that straddled a URI's last read: at most one per URI.
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
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.conftest import ingress_idle
from tests.e2e.test_e2e_subscription import _wait_record

URIS = 7
COPIES = 3
CHANGES = 10
MAX_READS_PER_CHANGE = 1.05
COPY_GAP_MS = 10  # the copies of one change this far apart: the later ones arrive after the read was sent
READ_DELAY_MS = 30  # the server takes this long to serve a read (while they arrive)
WRITE_PAUSE_SECONDS = 0.2  # a writer's next change this long after its last one converged


async def _accepted(ledger: Ledger, server: str, uri: str, digest: str) -> bool:
    """The ledger accepted ``digest`` for ``uri``: the change converged (the workflow mirrors it)."""
    rows = await ledger_rows(ledger, "SELECT last_accepted_digest FROM subscriptions WHERE server = %s "
                             "AND uri = %s", server, uri)
    return bool(rows) and rows[0][0] == digest


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
        await control.faults(notify_copies={uri: COPIES for uri in uris}, notify_copy_gap_ms=COPY_GAP_MS,
                             read_delay_ms={uri: READ_DELAY_MS for uri in uris})
        before = (await control.stats())["reads"]

        async def write(uri: str) -> tuple[str, int]:
            """The writer of ``uri``: its last change, and the server's reads of ``uri`` once it converged."""
            digest = ""
            for i in range(1, CHANGES + 1):
                digest = (await control.edit(uri, text=f"{uri} version {i}"))["committed"]["digest"]
                await eventually(lambda d=digest: _accepted(ledger, server.name, uri, d), timeout=60,
                                 interval=0.01, what=f"change {i} of {uri} accepted")
                if i < CHANGES:
                    await asyncio.sleep(WRITE_PAUSE_SECONDS)
            return digest, (await control.stats())["reads"].get(uri, 0)

        written = await asyncio.gather(*(write(uri) for uri in uris))
        await eventually(lambda: ingress_idle(ledger, control, server.name), timeout=20, interval=0.05,
                         what="the ingress idle")
        idle = (await control.stats())["reads"]
        await asyncio.gather(*(_wait_record(h, lambda r, d=d: r.last_accepted_digest == d, "mirrored")
                               for h, (d, _) in zip(handles, written, strict=True)))
        async with ledger.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT rr.trigger_reason, rr.outcome, (rr.cycle_id LIKE 'ingress/%%') "
                "AS at_ingress, count(*) FROM read_requests rr JOIN subscriptions s ON s.workflow_id = "
                "rr.workflow_id WHERE s.server = %s GROUP BY 1, 2, 3 ORDER BY 4 DESC", (server.name,))
            print(f"{server.transport}: reads by (trigger, verdict, at the ingress): {await cur.fetchall()}")
    reads = sum(n - before.get(uri, 0) for uri, (_, n) in zip(uris, written, strict=True))
    tail = {uri: idle.get(uri, 0) - n for uri, (_, n) in zip(uris, written, strict=True)}
    ratio = reads / (URIS * CHANGES)
    print(f"{server.transport}: {reads} reads for {URIS * CHANGES} changes = {ratio:.3f} reads per change;"
          f" then {sum(tail.values())} follow-ups until the ingress was idle")
    assert all(n <= 1 for n in tail.values()), tail
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
