"""Coalescing at the ingress, reads at the ingress and the one-round-trip read on the real stack (issue 12).

Temporal dev server, PostgreSQL and the fixture MCP server over streamable HTTP: a server that
sends every change five times. Both ways every change converges:
- reads at the ingress (the default): the ingress reads each change itself and reports it
  (``resource_read``); the workflow schedules no read for it and gets no ``resource_updated``;
- signalled (``read_on_notification = false``): fewer signals than notifications (a note on a row
  already dirty, with no read allocated since, creates no work: ``coverage.plan_note``), and each read is one
  ``mcp_read_cycle`` activity whose receipt the ledger holds before the workflow hears of it.
"""

from __future__ import annotations

import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.names import SIGNAL_RESOURCE_READ, SIGNAL_RESOURCE_UPDATED, Act
from mcpsync.workflows.records.subscription import SubscriptionKey
from tests.conftest import ledger_rows, running_services, unique
from tests.e2e.test_e2e_subscription import _wait_record

COPIES = 5
CHANGES = 4


@pytest.mark.parametrize("read_at_ingress", [True, False], ids=["read-at-ingress", "signalled"])
async def test_duplicate_notifications_cost_fewer_signals_and_every_change_converges(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess, read_at_ingress: bool) -> None:
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, edition="2025-11-25",
                          subjects=["alice"], read_on_notification=read_at_ingress)
    uri = f"demo://coalesce/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    await fx.create(uri, text="version 0", mime_type="text/plain")
    # Every edit is announced COPIES times at once; a read takes 300 ms, so copies arrive while the
    # read the first one caused is still on its way.
    await fx.faults(notify_copies={uri: COPIES}, read_delay_ms={uri: 300})
    try:
        async with running_services(temporal_client, ledger, [server]) as cfg:
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
            await _wait_record(handle, lambda r: r.watermark >= 1, "initial read accepted")
            await fx.wait_subscribed(uri)
            noted_before = (await ledger.load_fence(key)).notifications_seen
            for i in range(1, CHANGES + 1):
                edit = await fx.edit(uri, text=f"version {i}")
                digest = edit["committed"]["digest"]
                await _wait_record(handle, lambda r, d=digest: r.last_accepted_digest == d,
                                   f"change {i} accepted", timeout=30)
            noted = (await ledger.load_fence(key)).notifications_seen - noted_before

            signals = reports = reads = starts = 0
            async for event in handle.fetch_history_events():
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                    name = event.workflow_execution_signaled_event_attributes.signal_name
                    signals += name == SIGNAL_RESOURCE_UPDATED
                    reports += name == SIGNAL_RESOURCE_READ
                elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    name = event.activity_task_scheduled_event_attributes.activity_type.name
                    assert name not in (Act.MCP_READ, Act.MCP_SUBSCRIBE), "one round trip each: start, read"
                    reads += name == Act.MCP_READ_CYCLE
                    starts += name == Act.MCP_SUBSCRIBE_CYCLE
    finally:
        await fx.faults(reset=True)

    # Copies that arrive while one is queued merge in the session host; the rest are recorded in
    # the ledger (``noted``), and of those only updates nothing stands for become signals.
    print(f"noted {noted}, signals {signals}, reports {reports}, read cycles {reads}, start cycles {starts}")
    assert starts == 1, starts  # subscribe, mark active and the initial read: one activity
    if read_at_ingress:
        # Each change is read where it arrived; copies that arrived before that read was sent are
        # covered by it (counted by its accept) and never reach the workflow.
        assert signals == 0, signals
        assert CHANGES <= reports <= noted, (reports, noted)
        assert reads == 0, reads  # the initial read was the start's
    else:
        assert noted > CHANGES, noted
        assert reports == 0 and signals < noted, (reports, signals, noted)
        # One read cycle per change (and at most one follow-up per change); the initial read was the start's.
        assert CHANGES <= reads <= 2 * CHANGES, reads
    receipts = await ledger_rows(ledger, "SELECT rv.status FROM resource_versions rv JOIN subscriptions s"
                                         " ON s.workflow_id = rv.workflow_id WHERE s.uri = %s", uri)
    assert sum(1 for (status,) in receipts if status == "ACCEPTED") == CHANGES + 1


async def test_a_read_that_fails_at_the_ingress_is_reported_and_the_workflow_reads_itself(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    """The ingress's read is judged REJECTED (the server fails it): the report is mirrored (the
    covering read observed nothing), so the update earns the workflow's own read, as a signal would."""
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, edition="2025-11-25",
                          subjects=["alice"])
    uri = f"demo://coalesce/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    await fx.create(uri, text="version 0", mime_type="text/plain")
    try:
        async with running_services(temporal_client, ledger, [server]) as cfg:
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
            await _wait_record(handle, lambda r: r.watermark >= 1, "initial read accepted")
            await fx.wait_subscribed(uri)
            await fx.faults(fail_reads={uri: -32603})
            await fx.edit(uri, text="version 1")
            await _wait_record(handle, lambda r: r.reads_issued >= 3, "the reported read and the "
                                                                      "workflow's own",
                               timeout=30)
            await fx.faults(reset=True)
            edit = await fx.edit(uri, text="version 2")
            digest = edit["committed"]["digest"]
            await _wait_record(handle, lambda r: r.last_accepted_digest == digest, "version 2 accepted",
                               timeout=30)
            order: list[str] = []
            async for event in handle.fetch_history_events():
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                    order.append(event.workflow_execution_signaled_event_attributes.signal_name)
                elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    order.append(event.activity_task_scheduled_event_attributes.activity_type.name)
    finally:
        await fx.faults(reset=True)
    reads = [name for name in order if name in (Act.MCP_SUBSCRIBE_CYCLE, Act.MCP_READ_CYCLE,
                                                SIGNAL_RESOURCE_READ)]
    # the start's initial read; the failed report and the workflow's own read it earned; version 2's report
    assert reads == [Act.MCP_SUBSCRIBE_CYCLE, SIGNAL_RESOURCE_READ, Act.MCP_READ_CYCLE,
                     SIGNAL_RESOURCE_READ], order
    audits = await ledger_rows(ledger, "SELECT kind FROM audit WHERE uri = %s AND kind = 'READ_FAILED'", uri)
    assert len(audits) >= 2, audits  # the ingress's read and the workflow's


async def test_a_read_slower_than_the_ingress_timeout_falls_back_to_the_workflow(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    """A server slower than ``ingress_read_timeout_seconds``: the ingress abandons its read (the
    routers must not wait on it) and signals ``resource_updated``; the workflow reads with its own
    timeout and the change is accepted."""
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, edition="2025-11-25",
                          subjects=["alice"], ingress_read_timeout_seconds=0.3)
    uri = f"demo://coalesce/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    await fx.create(uri, text="version 0", mime_type="text/plain")
    try:
        async with running_services(temporal_client, ledger, [server]) as cfg:
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
            await _wait_record(handle, lambda r: r.watermark >= 1, "initial read accepted")
            await fx.wait_subscribed(uri)
            await fx.faults(read_delay_ms={uri: 1000})
            edit = await fx.edit(uri, text="version 1")
            digest = edit["committed"]["digest"]
            await _wait_record(handle, lambda r: r.last_accepted_digest == digest, "version 1 accepted",
                               timeout=30)
            signals: list[str] = []
            reads = 0
            async for event in handle.fetch_history_events():
                if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                    signals.append(event.workflow_execution_signaled_event_attributes.signal_name)
                elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    reads += event.activity_task_scheduled_event_attributes.activity_type.name in (
                        Act.MCP_READ_CYCLE, Act.MCP_SUBSCRIBE_CYCLE)
    finally:
        await fx.faults(reset=True)
    assert SIGNAL_RESOURCE_UPDATED in signals and SIGNAL_RESOURCE_READ not in signals, signals
    assert reads == 2, reads  # the initial read and the one the fallback signal earned
    receipts = await ledger_rows(ledger, "SELECT rv.status, rv.content_digest FROM resource_versions rv"
                                         " JOIN subscriptions s ON s.workflow_id = rv.workflow_id"
                                         " WHERE s.uri = %s", uri)
    assert ("ACCEPTED", digest) in receipts, receipts
