"""Safety reads at the ingress (worker/ingress/resync.py: the sweep of the ledger's due verifications)
and the workflow's watchdog on the real stack: Temporal dev server, PostgreSQL, the fixture MCP
server over HTTP with subscribe.

A subscription with a short safety-read period and no change gets its verifications from the
ingress's sweep: read at the ingress as if notified (ledger trigger ``updated``, receipt UNCHANGED)
and kept in the ledger: the workflow gets no signal for them, schedules no read and keeps one timer
(the watchdog's, six hours), not one per safety period; no gap between reads exceeds the bound. On a
server with ``read_on_notification: false`` the sweep wakes the workflow (``resource_updated``),
which reads: the bound holds too. When the sweep stops (its ingress and session stay up), the
watchdog (``watchdog_seconds``, short here) finds the verification overdue: the ledger records an
``overdue`` outbox event and the run reads through its own read-cycle activity (trigger ``poll``),
within the bound plus the horizon.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.converter import PayloadConverter

from benchmarks.staleness import gaps_between_reads
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.names import QUERY_SUBSCRIPTION, SIGNAL_RESOURCE_READ, SIGNAL_RESOURCE_UPDATED, Act
from mcpsync.workflows.records.ledger import OutboxEventType
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionOptions, SubscriptionState
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from mcpsync.workflows.verification_rules import SWEEP_IDLE_SECONDS
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.test_e2e_subscription import _wait_record

SAFETY_SECONDS = 6.0  # the sweep reads a row 4.6-5.2 s after its newest verification
READS = 3  # safety reads after the initial one, nothing changing
# The first look that finds a new row comes up to SWEEP_IDLE_SECONDS after it started; then a read
# each period, a little less.
READS_TIMEOUT = SWEEP_IDLE_SECONDS + (READS + 3) * SAFETY_SECONDS
WATCHDOG_SECONDS = 4.0  # the unswept subscriptions' watchdog: a read overdue is found within this
LOOK_SECONDS = 10.0  # a swept subscription's watchdog that looks during the test (and finds nothing)
DISPATCH_SLACK = 2.0  # the look and the read cycle's dispatch on a loaded box (the bound itself has no slack)


async def _history(handle: WorkflowHandle) -> dict[str, int]:
    """Counts of the history's events; timers also by the wait kind their summary names
    (``timers_started:watchdog``, ``timers_canceled:deadline``, ...)."""
    counts = {"read_cycles": 0, "timers_started": 0, "timers_fired": 0, "timers_canceled": 0, "reports": 0,
              "updates": 0}
    kinds: dict[int, str] = {}  # timer-started event id -> its wait kind

    def count(what: str, kind: str) -> None:
        counts[what] += 1
        counts[f"{what}:{kind}"] = counts.get(f"{what}:{kind}", 0) + 1

    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            summary = event.user_metadata.summary
            kinds[event.event_id] = PayloadConverter.default.from_payload(summary, str) \
                if event.user_metadata.HasField("summary") else ""
            count("timers_started", kinds[event.event_id])
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            counts["read_cycles"] += event.activity_task_scheduled_event_attributes.activity_type.name \
                == Act.MCP_READ_CYCLE
        elif event.event_type == EventType.EVENT_TYPE_TIMER_FIRED:
            count("timers_fired", kinds[event.timer_fired_event_attributes.started_event_id])
        elif event.event_type == EventType.EVENT_TYPE_TIMER_CANCELED:
            count("timers_canceled", kinds[event.timer_canceled_event_attributes.started_event_id])
        elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            name = event.workflow_execution_signaled_event_attributes.signal_name
            counts["reports"] += name == SIGNAL_RESOURCE_READ
            counts["updates"] += name == SIGNAL_RESOURCE_UPDATED
    return counts


COMMANDS = frozenset({EventType.EVENT_TYPE_MARKER_RECORDED, EventType.EVENT_TYPE_TIMER_STARTED,
                      EventType.EVENT_TYPE_TIMER_CANCELED, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
                      EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES})
TASK = frozenset({EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED})


async def _looks(handle: WorkflowHandle) -> list[list[str]]:
    """What each workflow task woken by a timer alone (the watchdog's) wrote: its command events."""
    tasks: list[tuple[list[int], list[str]]] = []
    inputs: list[int] = []
    async for event in handle.fetch_history_events():
        t = event.event_type
        if t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            tasks.append((inputs, []))
            inputs = []
        elif t in COMMANDS and tasks:
            tasks[-1][1].append(EventType.Name(t).removeprefix("EVENT_TYPE_"))
        elif t not in TASK:
            inputs.append(t)
    return [commands for woken_by, commands in tasks if woken_by == [EventType.EVENT_TYPE_TIMER_FIRED]]


async def _reads(ledger: Ledger, key: SubscriptionKey) -> tuple[list[str], float]:
    """The triggers of the reads after the initial one, and the longest gap between reads (the open
    gap to now included: ``benchmarks.staleness.gaps_between_reads``)."""
    rows = await ledger_rows(ledger, "SELECT trigger_reason, issued_at FROM read_requests"
                                     " WHERE workflow_id=%s ORDER BY ordinal", key.workflow_id)
    now = (await ledger_rows(ledger, "SELECT now()"))[0][0]
    times = [r[1] for r in rows]
    return [r[0] for r in rows[1:]], max(gaps_between_reads(times, times[0], now))


def _accounted(triggers: list[str], history: dict[str, int], *, woken: bool = False) -> bool:
    """The history shows every read the workflow made and none in flight: each watchdog read's
    read-cycle activity done (the watchdog fires and the activity is scheduled first, its row after);
    ``woken``: the sweep signals the workflow, which reads (its ``updated`` reads too)."""
    own = len(triggers) if woken else triggers.count("poll")
    return history["read_cycles"] == own and history["timers_fired"] >= triggers.count("poll")


async def _reads_accounted(ledger: Ledger, key: SubscriptionKey, handle: WorkflowHandle,
                           count: int, *, woken: bool = False) -> tuple[list[str], float, dict[str, int]]:
    """Wait (at most ``READS_TIMEOUT``) for ``count`` reads after the initial one, each in the history."""
    async def check() -> tuple[list[str], float, dict[str, int]] | None:
        triggers, gap = await _reads(ledger, key)
        history = await _history(handle)
        return (triggers, gap, history) \
            if len(triggers) >= count and _accounted(triggers, history, woken=woken) else None

    return await eventually(check, timeout=READS_TIMEOUT, interval=0.5, what=f"{count} reads of {key.uri}")


async def _overdue_events(ledger: Ledger, key: SubscriptionKey) -> int:
    rows = await ledger_rows(ledger, "SELECT count(*) FROM outbox WHERE workflow_id=%s AND event_type=%s",
                             key.workflow_id, OutboxEventType.OVERDUE.value)
    return int(rows[0][0])


async def _quiet_subscription(client: Client, ledger: Ledger, fx: FixtureProcess, server: ServerConfig,
                              queue: str, reads: int = READS, *, watchdog: float | None = None,
                              woken: bool = False,
                              ) -> tuple[SubscriptionKey, WorkflowHandle, list[str], float, dict[str, int]]:
    key = SubscriptionKey(subject="alice", server=server.name, uri=f"demo://resync/{uuid.uuid4().hex}")
    await fx.create(key.uri, text="v1")
    options = SubscriptionOptions(safety_read_seconds=SAFETY_SECONDS)
    if watchdog is not None:
        options = SubscriptionOptions(safety_read_seconds=SAFETY_SECONDS, watchdog_seconds=watchdog)
    handle = await start_subscription(client, key, task_queue=queue, options=options)
    await _wait_record(handle, lambda r: r.state == SubscriptionState.ACTIVE and r.last_issued_ordinal > 0,
                       "subscribed and read")
    return key, handle, *await _reads_accounted(ledger, key, handle, reads, woken=woken)


async def test_safety_reads_go_through_the_ingress_and_the_watchdog_reads_when_none_does(
        temporal_client: Client, ledger: Ledger, tmp_path: Path) -> None:
    async with await FixtureProcess.start_http(tmp_path, seed="none") as fx:
        resynced, stopped = (ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url,
                                          subjects=["alice"], catalog=False) for _ in range(2))
        unswept = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=["alice"],
                               catalog=False, read_on_notification=False)
        async with running_services(temporal_client, ledger, [resynced, stopped, unswept]) as cfg:
            queue = cfg.temporal.task_queue

            async def resync_stopped() -> tuple[int, list[str], float, int]:
                key, handle, *_ = await _quiet_subscription(temporal_client, ledger, fx, stopped, queue, 1,
                                                            watchdog=WATCHDOG_SECONDS)
                # The sweep stops (its ingress and session stay): nobody reads; the watchdog finds it.
                resync = next(t for t in asyncio.all_tasks() if t.get_name() == f"resync:{stopped.name}")
                resync.cancel()
                await asyncio.sleep(0.5)  # a read the sweep fed just before is judged meanwhile
                before_stop = len((await _reads(ledger, key))[0])
                after, whole_gap, _ = await _reads_accounted(ledger, key, handle, before_stop + 2)
                return before_stop, after, whole_gap, await _overdue_events(ledger, key)

            async def never_swept() -> tuple[list[str], float, dict[str, int], int, ResourceSubscriptionV1]:
                key, handle, triggers, gap, history = await _quiet_subscription(
                    temporal_client, ledger, fx, unswept, queue, 2, woken=True)
                record = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
                return triggers, gap, history, await _overdue_events(ledger, key), record

            async def swept_and_looked() -> tuple[list[str], dict[str, int], list[list[str]], int]:
                key, handle, triggers, _, _ = await _quiet_subscription(temporal_client, ledger, fx, resynced,
                                                                        queue, watchdog=LOOK_SECONDS)
                looks = await eventually(lambda: _looks(handle), timeout=3 * LOOK_SECONDS, interval=0.5,
                                         what=f"a look of {key.uri}'s watchdog")
                return triggers, await _history(handle), looks, await _overdue_events(ledger, key)

            # Each server its own subscriptions, all at once: the stopped resync is a server's own.
            resynced_run, looked_run, stopped_run, unswept_run = await asyncio.gather(
                _quiet_subscription(temporal_client, ledger, fx, resynced, queue), swept_and_looked(),
                resync_stopped(), never_swept())
    _, _, triggers, gap, history = resynced_run
    l_triggers, l_history, looks, l_overdue = looked_run
    before_stop, after, whole_gap, stopped_overdue = stopped_run
    u_triggers, u_gap, u_history, u_overdue, u_record = unswept_run

    # Through the ingress: read as if notified, kept in the ledger (no signal); the workflow scheduled
    # no read and keeps no timer per safety period: its one timer is the watchdog's (six hours: it
    # never fired).
    assert len(triggers) >= 3 and set(triggers) == {"updated"}, triggers
    assert history["read_cycles"] == 0 and history["timers_fired"] == 0, history
    # Its one watchdog timer, never cancelled, and no deadline timer at all (a run that started before
    # its session was live may also have backed off on a session timer: not a period's).
    assert history["timers_started:watchdog"] == 1 and "timers_canceled:watchdog" not in history, history
    assert "timers_started:deadline" not in history, history
    assert history["timers_started"] == 1 + history.get("timers_started:session", 0), history
    assert history["reports"] == 0 and history["updates"] == 0, history
    assert gap <= SAFETY_SECONDS, gap
    # A watchdog that looks while the ingress keeps the bound finds nothing: a look writes its local
    # activity's marker and the next timer, nothing else (no search attribute, no read of the run's
    # own), and no overdue event.
    assert looks and all(commands == ["MARKER_RECORDED", "TIMER_STARTED"] for commands in looks), looks
    assert set(l_triggers) == {"updated"} and l_history["read_cycles"] == 0 and l_overdue == 0, \
        (l_triggers, l_history, l_overdue)
    # Its watchdog's timers are never cancelled and no deadline is armed (a session back-off may be).
    assert "timers_canceled:watchdog" not in l_history, l_history
    assert "timers_started:deadline" not in l_history, l_history
    # The sweep stopped (after reading): the watchdog found the verification overdue (an ``overdue``
    # outbox event) and the run read through its own read cycle, within the bound plus the horizon.
    assert before_stop >= 1 and set(after[:before_stop]) == {"updated"}, (before_stop, after)
    assert len(after) - before_stop >= 2 and set(after[before_stop:]) == {"poll"}, (before_stop, after)
    assert stopped_overdue >= 1, stopped_overdue
    assert whole_gap <= SAFETY_SECONDS + WATCHDOG_SECONDS + DISPATCH_SLACK, whole_gap
    # Nothing read at the ingress: the sweep wakes the workflow (resource_updated), which reads within
    # the bound; nothing is overdue.
    assert set(u_triggers) == {"updated"} and u_overdue == 0, (u_triggers, u_overdue)
    assert u_history["read_cycles"] == len(u_triggers) and u_history["updates"] >= len(u_triggers), u_history
    assert u_gap <= SAFETY_SECONDS, u_gap
    # Its record claims no deadline of the run's own: the ledger schedules its safety reads.
    assert u_record.next_read_due_at is None and u_record.safety_read_seconds == SAFETY_SECONDS
