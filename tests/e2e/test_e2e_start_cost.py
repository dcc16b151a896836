"""What a new subscription's start writes to its history, on real components (Temporal dev server,
PostgreSQL, the fixture MCP server): the events up to its first idle timer.

A start is two workflow tasks (docs/architecture.md, "The start of a subscription"). The first asks
the one patch (``PATCH_AFTER_0_2_0``: a marker and its ``TemporalChangeVersion`` upsert), ensures the
row, finds the live session and begins a subscription generation in one local activity
(``ledger_start_subscription``: one marker), upserts the search attributes and schedules
``mcp_subscribe_cycle``; the second mirrors the cycle, upserts once and arms the safety-read timer.
16 events (the code with two patch ids and three ledger markers wrote 20; 0.2.0, without a patch, 16).
"""

from __future__ import annotations

import uuid

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.subscription import SubscriptionKey
from tests.conftest import eventually, running_services, unique

START = [
    "WORKFLOW_EXECUTION_STARTED",
    "WORKFLOW_TASK_SCHEDULED", "WORKFLOW_TASK_STARTED", "WORKFLOW_TASK_COMPLETED",
    "MARKER_RECORDED", "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES",  # the patch and its TemporalChangeVersion
    "MARKER_RECORDED",  # ledger_start_subscription: ensure, current session, begin
    "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES",  # SUBSCRIBING
    "ACTIVITY_TASK_SCHEDULED", "ACTIVITY_TASK_STARTED", "ACTIVITY_TASK_COMPLETED",  # mcp_subscribe_cycle
    "WORKFLOW_TASK_SCHEDULED", "WORKFLOW_TASK_STARTED", "WORKFLOW_TASK_COMPLETED",
    "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES",  # ACTIVE, the first read's watermark
    "TIMER_STARTED",  # the watchdog (the ledger schedules the safety reads)
]


async def test_a_new_subscription_starts_in_two_workflow_tasks_and_16_events(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    server = ServerConfig(name=unique("start"), transport="http", url=fx.mcp_url, subjects=["alice"])
    uri = f"demo://start-cost/{uuid.uuid4().hex[:8]}"
    await fx.create(uri, text="first version", mime_type="text/plain")
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        # The start this test is about finds a live session (without one the run waits for it).
        await eventually(lambda: ledger.current_session("alice", server.name), timeout=30,
                         what="a live session")
        handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)

        async def to_first_timer() -> list[HistoryEvent] | None:
            # Nobody queries the run: a query that travels with the first task costs it one more task.
            events = [e async for e in handle.fetch_history_events()]
            timers = [i for i, e in enumerate(events) if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED]
            return events[:timers[0] + 1] if timers else None

        events = await eventually(to_first_timer, timeout=30, what="the first idle timer")
    assert [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in events] == START
    markers = [e.marker_recorded_event_attributes for e in events
               if e.HasField("marker_recorded_event_attributes")]
    assert [m.marker_name for m in markers] == ["core_patch", "core_local_activity"]
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    assert scheduled == [Act.MCP_SUBSCRIBE_CYCLE]
    # The local activity's marker names it (``core_local_activity`` data carries the activity type).
    assert Act.START_SUBSCRIPTION.encode() in markers[1].SerializeToString()
