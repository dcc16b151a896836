"""End to end on real components: Temporal dev server, PostgreSQL, the fixture MCP server.

Subscribe → mutate through the control plane → the workflow accepts a version
whose digest equals the committed one → one outbox row per change; close → CLOSED.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.activities.workflow_updates import execute_update
from mcpsync.fixture import FixtureControl, FixtureProcess, stdio_command, wait_ready_file
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.names import QUERY_SUBSCRIPTION, UPDATE_CLOSE
from mcpsync.workflows.records.subscription import (
    CloseReceipt,
    CloseRequest,
    SubscriptionKey,
    SubscriptionState,
)
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from tests.conftest import eventually, running_services, unique
from tests.e2e.conftest import audited, notifications_seen


@dataclass
class Served:
    server: ServerConfig
    control: FixtureControl


async def _outbox_for(ledger: Ledger, key: SubscriptionKey) -> list[dict[str, object]]:
    return [r for r in await ledger.reports.outbox_after(0, 10_000) if r["workflow_id"] == key.workflow_id]


async def _wait_record(handle, pred, what: str,
                       timeout: float = 30.0) -> ResourceSubscriptionV1:  # type: ignore[no-untyped-def]
    started = False

    async def check() -> ResourceSubscriptionV1 | None:
        nonlocal started
        # Not before the run's first workflow task completed: a query that travels with that task
        # costs the run one more (docs/architecture.md, "The start of a subscription").
        started = started or any([e async for e in handle.fetch_history_events()
                                  if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED])
        if not started:
            return None
        rec = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
        return rec if pred(rec) else None

    # A query every 50 ms: a wait ends about when its condition holds; a query adds no history event.
    return await eventually(check, timeout=timeout, interval=0.05, what=what)


async def _converge_and_close(client: Client, ledger: Ledger, server: ServerConfig, control: FixtureControl,
                              uri: str, subject: str, expect_edition: str) -> None:
    key = SubscriptionKey(subject=subject, server=server.name, uri=uri)
    first = await control.create(uri, text="version one", mime_type="text/plain")
    async with running_services(client, ledger, [server]) as cfg:
        handle = await start_subscription(client, key, task_queue=cfg.temporal.task_queue)
        # Starting twice is idempotent: same workflow, same run.
        again = await start_subscription(client, key, task_queue=cfg.temporal.task_queue)
        assert again.result_run_id == handle.result_run_id
        rec = await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                                 "initial read accepted")
        assert rec.edition == expect_edition
        assert rec.state == SubscriptionState.ACTIVE

        mutation = await control.edit(uri, text="version two")
        rec = await _wait_record(handle, lambda r: r.last_accepted_digest == mutation["committed"]["digest"],
                                 "updated version accepted")
        rows = await _outbox_for(ledger, key)
        assert [r["content_digest"] for r in rows] == [first["committed"]["digest"],
                                                       mutation["committed"]["digest"]]
        fence = await ledger.load_fence(key)
        assert fence.last_accepted_digest == mutation["committed"]["digest"]
        assert fence.watermark == rec.watermark and rec.watermark >= 2

        receipt = await execute_update(handle, UPDATE_CLOSE, [CloseRequest(reason="test")],
                                       result_type=CloseReceipt)
        assert receipt.state == SubscriptionState.CLOSED
        assert receipt.close_ordinal == fence.last_issued_ordinal
        final = await client.get_workflow_handle(key.workflow_id, result_type=ResourceSubscriptionV1).result()
        assert final.state == SubscriptionState.CLOSED
        # The record says when it ended (it stayed null before), and that no read is due any more.
        assert final.ended_at is not None and final.started_at is not None \
            and final.ended_at >= final.started_at
        assert final.next_read_due_at is None and final.last_accepted_at is not None
        reads_before = await ledger.reports.read_count(key)
        stats = await control.stats()
        served_before, sent_before = stats["reads"].get(uri, 0), stats["notifications_sent"].get(uri, 0)
        seen_before = await notifications_seen(ledger, key)
        await control.edit(uri, text="version three after close")
        # Witnesses before the absence: the server's notifier handled the change (nothing queued), and
        # the run has ended (result above), so nothing but a notification could still cause a read.
        await control.wait_notified(timeout=30)
        if expect_edition == "2025-11-25":
            # An update after the close demonstrably reaches the reconciler: the session unsubscribed,
            # so push one at it anyway; the ingress records it on the ledger row and, the run having
            # ended, audits it NOTIFICATION_NO_WORKFLOW (the last step of its routing).
            await control.notify(uri, unsolicited=True)
            await eventually(lambda: audited(ledger, "NOTIFICATION_NO_WORKFLOW", key.workflow_id), timeout=30,
                             what="the update after the close routed to the ended run")
            assert await notifications_seen(ledger, key) > seen_before
        else:
            # 2026-07-28 has no unsolicited updates: the listen stream closed with the subscription,
            # so the drained notifier sent the change to no stream of ours.
            assert (await control.stats())["notifications_sent"].get(uri, 0) == sent_before
        assert await ledger.reports.read_count(key) == reads_before, "no read after CLOSED"
        assert (await control.stats())["reads"].get(uri, 0) == served_before, "no resources/read after CLOSED"
        # The close told consumers once ('closed'); nothing after it.
        assert [r["event_type"] for r in await _outbox_for(ledger, key)] == \
            ["version_accepted", "version_accepted", "closed"]
        stats = await control.stats()
        assert json.dumps(stats)  # the oracle answered


@pytest.mark.parametrize("edition", ["2025-11-25", "2026-07-28"])
async def test_http_subscription_converges_and_closes(temporal_client: Client, ledger: Ledger,
                                                      fx: FixtureProcess, edition: str) -> None:
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, edition=edition,
                          subjects=["alice"])
    await _converge_and_close(temporal_client, ledger, server, fx, f"demo://doc/{uuid.uuid4().hex}",
                              "alice", edition)


@pytest.mark.parametrize("edition", ["2025-11-25", "2026-07-28"])
async def test_stdio_subscription_converges_and_closes(temporal_client: Client, ledger: Ledger,
                                                       tmp_path: Path, edition: str) -> None:
    ready = tmp_path / "ready.json"
    command, env = stdio_command(ready_file=ready, seed="none")
    server = ServerConfig(name=unique("fx"), transport="stdio", command=command, env=env, edition=edition,
                          subjects=["bob"])
    # The session host spawns the server; its control plane announces itself in the ready file.
    uri = f"file:///srv/{uuid.uuid4().hex}.txt"
    key = SubscriptionKey(subject="bob", server=server.name, uri=uri)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        info = await wait_ready_file(ready, timeout=20)
        async with FixtureControl(info["control_url"]) as control:
            first = await control.create(uri, text="one", mime_type="text/plain")
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
            await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                               "initial read over stdio")
            m = await control.edit(uri, text="two")
            rec = await _wait_record(handle, lambda r: r.last_accepted_digest == m["committed"]["digest"],
                                     "update over stdio")
            assert rec.edition == edition
            receipt = await execute_update(handle, UPDATE_CLOSE, [CloseRequest()], result_type=CloseReceipt)
            assert receipt.state == SubscriptionState.CLOSED
    assert [r["event_type"] for r in await _outbox_for(ledger, key)] == \
        ["version_accepted", "version_accepted", "closed"]
