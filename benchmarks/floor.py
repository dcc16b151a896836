"""The Temporal floor (issue 12.1): the least a durable read cycle can cost on this Temporal server.

Contract:
- :class:`FloorWorkflow` is a minimal workflow, not mcpsync's: each ``go`` signal makes it run ONE
  activity (:meth:`FloorActivities.touch`) on a SECOND task queue, then record the sample as done.
  That is one signal, two workflow tasks and one activity dispatched across task queues: the
  smallest shape a notification-driven reconciler with a per-session read queue can take.
- :meth:`FloorActivities.touch` does one PostgreSQL transaction (an UPDATE of a scratch row in the
  run's database) and one MCP ``resources/read`` of ``uri`` on its own mcp client session
  (``cache=None``) against the run's fixture server; it returns the read's digest only (no body
  in history).
- :func:`measure` sends ``samples`` signals one at a time (the next only after the previous was
  acknowledged, so the figure is the idle latency, like the raw floor) and reports, per sample,
  signal sent (client clock) → the workflow task that took the activity's result completed
  (``WORKFLOW_TASK_COMPLETED`` after the sample's ``ACTIVITY_TASK_COMPLETED`` in the fetched
  history, server clock on the same host). The workers run in the calling process, on the run's
  client (and so its metrics runtime), and stop when :func:`measure` returns.
- :func:`prepare_table` creates the scratch table; nothing else in the database is touched.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from psycopg_pool import AsyncConnectionPool
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client
    from temporalio.worker import Worker

    from mcpsync.activities.mcp_session import read_digest

__all__ = ["FloorActivities", "FloorResult", "FloorWorkflow", "measure", "prepare_table"]

SIGNAL_GO = "go"
SIGNAL_STOP = "stop"
ACTIVITY_TOUCH = "bench_floor_touch"
TABLE = "bench_temporal_floor"


@workflow.defn(name="BenchTemporalFloor")
class FloorWorkflow:
    """Signal → one activity on another task queue → recorded as done."""

    def __init__(self) -> None:
        self._pending: list[int] = []
        self._done = 0
        self._stop = False

    @workflow.run
    async def run(self, activity_queue: str) -> int:
        while True:
            await workflow.wait_condition(lambda: bool(self._pending) or self._stop)
            if not self._pending:
                return self._done
            sample = self._pending.pop(0)
            await workflow.execute_activity(ACTIVITY_TOUCH, sample, task_queue=activity_queue,
                                            start_to_close_timeout=timedelta(seconds=30))
            self._done += 1

    @workflow.signal(name=SIGNAL_GO)
    def go(self, sample: int) -> None:
        self._pending.append(sample)

    @workflow.signal(name=SIGNAL_STOP)
    def stop(self) -> None:
        self._stop = True


@dataclass
class FloorActivities:
    pool: AsyncConnectionPool[Any]
    mcp: Any  # an entered mcp ``Client`` (cache=None)
    uri: str
    completed: dict[int, float] = field(default_factory=dict)  # sample -> wall time the activity finished
    postgres_s: list[float] = field(default_factory=list)
    read_s: list[float] = field(default_factory=list)
    _events: dict[int, asyncio.Event] = field(default_factory=dict)

    def event(self, sample: int) -> asyncio.Event:
        return self._events.setdefault(sample, asyncio.Event())

    @activity.defn(name=ACTIVITY_TOUCH)
    async def touch(self, sample: int) -> str:
        t0 = time.perf_counter()
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(f"UPDATE {TABLE} SET sample = %s, touched_at = clock_timestamp() WHERE id = 1",
                               (sample,))
        t1 = time.perf_counter()
        digest = read_digest(await self.mcp.read_resource(self.uri))
        t2 = time.perf_counter()
        self.postgres_s.append(t1 - t0)
        self.read_s.append(t2 - t1)
        self.completed[sample] = time.time()
        self.event(sample).set()
        return digest


async def prepare_table(pool: AsyncConnectionPool[Any]) -> None:
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (id int PRIMARY KEY, sample int, touched_at timestamptz)")
        await conn.execute(f"INSERT INTO {TABLE} (id, sample) VALUES (1, -1) ON CONFLICT (id) DO NOTHING")


@dataclass
class FloorResult:
    totals: list[float]  # signal sent -> workflow acknowledged, seconds
    activity_done: list[float]  # signal sent -> activity finished (in this process)
    postgres: list[float]  # the activity's transaction
    read: list[float]  # the activity's resources/read
    history_events: int
    workflow_tasks: int
    missing: int  # samples without an acknowledgement in the history (not counted)
    breakdown: dict[str, list[float]]  # per step between history events (server clock; "sent" is the client's)


async def measure(client: Client, pool: AsyncConnectionPool[Any], mcp: Any, uri: str, samples: int, *,
                  pause: float = 0.2, timeout: float = 30.0) -> FloorResult:
    """``samples`` sequential signals; see the module contract for what is timed."""
    tag = uuid.uuid4().hex[:8]
    wf_queue, act_queue = f"bench-floor-wf-{tag}", f"bench-floor-act-{tag}"
    acts = FloorActivities(pool, mcp, uri)
    await prepare_table(pool)
    sent: dict[int, float] = {}
    async with Worker(client, task_queue=wf_queue, workflows=[FloorWorkflow]), \
            Worker(client, task_queue=act_queue, activities=[acts.touch]):
        handle = await client.start_workflow(FloorWorkflow.run, act_queue, id=f"bench-temporal-floor-{tag}",
                                             task_queue=wf_queue)
        await asyncio.sleep(pause)  # the first workflow task is not part of any sample
        for i in range(samples):
            done = acts.event(i)
            sent[i] = time.time()
            await handle.signal(SIGNAL_GO, i)
            await asyncio.wait_for(done.wait(), timeout)
            # The acknowledgement is read from the history afterwards; the pause lets it land before the next
            # signal, so samples do not share workflow tasks.
            await asyncio.sleep(pause)
        await handle.signal(SIGNAL_STOP)
        await asyncio.wait_for(handle.result(), timeout)
        history = await handle.fetch_history()

    # Per sample, in history order: signaled, activity scheduled / started / completed, acknowledged.
    marks: dict[str, list[float]] = {k: [] for k in ("signaled", "scheduled", "started", "completed", "ack")}
    kinds = {EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED: "signaled",
             EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "scheduled",
             EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED: "started",
             EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: "completed"}
    waiting = False
    tasks = 0
    for ev in history.events:
        at = ev.event_time.seconds + ev.event_time.nanos / 1e9
        kind = kinds.get(ev.event_type)
        if kind is not None:
            marks[kind].append(at)
            waiting = waiting or kind == "completed"
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            tasks += 1
            if waiting:
                marks["ack"].append(at)
                waiting = False
    acks = marks["ack"]
    totals = [acks[i] - sent[i] for i in range(min(len(acks), samples))]
    steps = [("sent", "signaled"), ("signaled", "scheduled"), ("scheduled", "started"), ("started", "completed"),
             ("completed", "ack")]
    marks["sent"] = [sent[i] for i in range(samples)]
    breakdown = {f"{a}_to_{b}": [marks[b][i] - marks[a][i] for i in range(len(totals))]
                 for a, b in steps if len(marks[a]) >= len(totals) and len(marks[b]) >= len(totals)}
    return FloorResult(
        totals=totals,
        activity_done=[acts.completed[i] - sent[i] for i in range(samples) if i in acts.completed],
        postgres=acts.postgres_s,
        read=acts.read_s,
        history_events=len(history.events),
        workflow_tasks=tasks,
        missing=samples - len(totals),
        breakdown=breakdown,
    )
