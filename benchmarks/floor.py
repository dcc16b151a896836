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
- :class:`StartFloorWorkflow` (the Temporal START floor, issue 12's "initial subscriptions/s") is
  the least a started subscription can be: its run executes ONE activity on the second task queue,
  :meth:`FloorActivities.touch_own_row` (``touch`` on a row of its own, upserted, so concurrent
  workflows do not queue on one row lock), and returns the digest. That is one workflow start, two
  workflow tasks and one cross-queue activity, then the close.
- The SUBSCRIBE start floor is the same workflow running :meth:`FloorActivities.subscribe_own_uri`
  instead: the same transaction, then what a subscription's start asks of its server, a
  ``resources/subscribe`` and a ``resources/read`` of a URI of the sample's own (``uris[sample]``). It
  is the least a start that subscribes can be on this Temporal server and this MCP server, so the
  start rate it gives is the one mcpsync's own work (fences, ledger receipts, the ingress) is measured
  against.
- :func:`measure_starts` first runs a warm-up tenth (not timed), then starts ``n`` of them through
  a semaphore of ``concurrency`` start calls in flight (32: the benchmark's ``subscribe()`` starts
  subscriptions with ``gather_limited(..., 32)``) and waits for every one to complete (the result
  of each, awaited as soon as its start returned). ``subscriptions_per_second`` = ``n`` ÷ wall
  seconds from the first start call to the last completion observed (this process's monotonic
  clock). With ``roles`` (:func:`benchmarks.cost.run_processes`) it also diffs the processes' CPU
  (:func:`benchmarks.cost.cpu_sample`) over the same window, per start; with ``snapshot`` (e.g.
  ``benchmarks.usage.cpu_snapshot``) it returns its value at the window's start and end. Same workers as
  :func:`measure`: in the calling process, on the run's client, stopped when it returns; ``runner``
  (the main worker's ``mcpsync.worker.main.worker.workflow_runner``, so the floor pays the same per-run
  workflow cost as a subscription) is the workflow worker's runner, else the SDK default.
- :func:`prepare_table` creates the scratch table; nothing else in the database is touched.
"""

from __future__ import annotations

import asyncio
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from mcp.shared.exceptions import MCPDeprecationWarning
    from psycopg_pool import AsyncConnectionPool
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client
    from temporalio.worker import Worker, WorkflowRunner
    from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

    from benchmarks import cost
    from benchmarks.common import warmup_count
    from mcpsync.activities.mcp_session import read_digest

__all__ = ["FloorActivities", "FloorResult", "FloorWorkflow", "StartFloorResult", "StartFloorWorkflow",
           "measure", "measure_starts", "prepare_table"]

SIGNAL_GO = "go"
SIGNAL_STOP = "stop"
ACTIVITY_TOUCH = "bench_floor_touch"
ACTIVITY_TOUCH_OWN_ROW = "bench_start_floor_touch"
ACTIVITY_SUBSCRIBE_OWN_URI = "bench_start_floor_subscribe"
START_ROW0 = 1000  # the start floor's rows: START_ROW0 + sample
TABLE = "bench_temporal_floor"
_UPSERT_OWN_ROW = (f"INSERT INTO {TABLE} (id, sample, touched_at) VALUES (%s, %s, clock_timestamp()) "
                   "ON CONFLICT (id) DO UPDATE "
                   "SET sample = excluded.sample, touched_at = excluded.touched_at")


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


@workflow.defn(name="BenchTemporalStartFloor")
class StartFloorWorkflow:
    """Started → one activity on another task queue → completed with the read's digest."""

    @workflow.run
    async def run(self, activity_queue: str, sample: int, activity_name: str = ACTIVITY_TOUCH_OWN_ROW) -> str:
        # One attempt: a floor whose activity fails must fail the run with its error, not time out.
        digest: str = await workflow.execute_activity(activity_name, sample,
                                                      task_queue=activity_queue,
                                                      start_to_close_timeout=timedelta(seconds=30),
                                                      retry_policy=RetryPolicy(maximum_attempts=1))
        return digest


@dataclass
class FloorActivities:
    pool: AsyncConnectionPool[Any]
    mcp: Any  # an entered mcp ``Client`` (cache=None)
    uri: str
    uris: Sequence[str] = ()  # the subscribe start floor's: sample i subscribes and reads uris[i]
    completed: dict[int, float] = field(default_factory=dict)  # sample -> wall time the activity finished
    postgres_s: list[float] = field(default_factory=list)
    read_s: list[float] = field(default_factory=list)
    _events: dict[int, asyncio.Event] = field(default_factory=dict)

    def event(self, sample: int) -> asyncio.Event:
        return self._events.setdefault(sample, asyncio.Event())

    @activity.defn(name=ACTIVITY_TOUCH)
    async def touch(self, sample: int) -> str:
        return await self._touch(sample, f"UPDATE {TABLE} SET sample = %s, touched_at = clock_timestamp() "
                                         "WHERE id = 1",
                                 (sample,))

    @activity.defn(name=ACTIVITY_TOUCH_OWN_ROW)
    async def touch_own_row(self, sample: int) -> str:
        """:meth:`touch` on a row of the sample's own (``START_ROW0 + sample``, upserted): concurrent
        workflows do not queue on one row lock, as subscriptions write rows of their own."""
        return await self._touch(sample, _UPSERT_OWN_ROW, (START_ROW0 + sample, sample))

    @activity.defn(name=ACTIVITY_SUBSCRIBE_OWN_URI)
    async def subscribe_own_uri(self, sample: int) -> str:
        """:meth:`touch_own_row`'s transaction, then ``resources/subscribe`` and ``resources/read`` of
        ``uris[sample]``: what a subscription's start asks of its server."""
        return await self._touch(sample, _UPSERT_OWN_ROW, (START_ROW0 + sample, sample),
                                 subscribe_to=self.uris[sample])

    async def _touch(self, sample: int, sql: str, args: tuple[int, ...], *,
                     subscribe_to: str | None = None) -> str:
        """The transaction, then (with ``subscribe_to``) ``resources/subscribe`` of that URI, then one
        ``resources/read`` of it, else of ``uri``."""
        t0 = time.perf_counter()
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(sql, args)
        t1 = time.perf_counter()
        if subscribe_to is not None:
            with warnings.catch_warnings():  # 2025-11-25's method, as the ingress calls it
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await self.mcp.session.subscribe_resource(subscribe_to)
        digest = read_digest(await self.mcp.read_resource(subscribe_to or self.uri))
        t2 = time.perf_counter()
        self.postgres_s.append(t1 - t0)
        self.read_s.append(t2 - t1)
        self.completed[sample] = time.time()
        self.event(sample).set()
        return digest


async def prepare_table(pool: AsyncConnectionPool[Any]) -> None:
    async with pool.connection() as conn, conn.transaction():
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (id int PRIMARY KEY, sample int, "
                           "touched_at timestamptz)")
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
    # per step between history events (server clock; "sent" is the client's)
    breakdown: dict[str, list[float]]


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
    steps = [("sent", "signaled"), ("signaled", "scheduled"), ("scheduled", "started"),
             ("started", "completed"), ("completed", "ack")]
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


@dataclass
class StartFloorResult:
    n: int  # timed workflows
    concurrency: int  # start calls in flight at most
    warmup: int  # workflows run before the window (not timed)
    start_seconds: float  # first start call -> every start call returned
    seconds: float  # first start call -> last completion observed
    subscriptions_per_second: float  # n / seconds
    postgres: list[float]  # the activities' transactions (timed workflows)
    read: list[float]  # the activities' resources/read (timed workflows)
    cpu: dict[str, Any] | None  # benchmarks.cost.cpu_delta over the window, per start (with ``roles``)
    machine: tuple[Any, Any] | None  # ``snapshot()`` at the window's start and end (with ``snapshot``)


async def measure_starts(client: Client, pool: AsyncConnectionPool[Any], mcp: Any, uri: str, n: int, *,
                         concurrency: int = 32, roles: dict[int, cost.Role] | None = None,
                         snapshot: Callable[[], Any] | None = None,
                         runner: WorkflowRunner | None = None, uris: Sequence[str] = (),
                         timeout: float = 120.0) -> StartFloorResult:
    """``n`` :class:`StartFloorWorkflow` started ``concurrency`` at a time; see the module contract. With
    ``uris`` (at least ``n`` plus the warm-up tenth), the subscribe start floor: sample i subscribes and
    reads ``uris[i]``."""
    tag = uuid.uuid4().hex[:8]
    wf_queue, act_queue = f"bench-start-floor-wf-{tag}", f"bench-start-floor-act-{tag}"
    acts = FloorActivities(pool, mcp, uri, uris)
    warmup = warmup_count(n)
    if uris and len(uris) < n + warmup:
        raise ValueError(f"the subscribe start floor needs {n + warmup} URIs, got {len(uris)}")
    activity_name = ACTIVITY_SUBSCRIBE_OWN_URI if uris else ACTIVITY_TOUCH_OWN_ROW
    await prepare_table(pool)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> float:
        async with gate:
            handle = await client.start_workflow(StartFloorWorkflow.run, args=[act_queue, i, activity_name],
                                                 id=f"bench-temporal-start-floor-{tag}-{i}",
                                                 task_queue=wf_queue)
        started[i] = time.monotonic()
        await handle.result()
        return time.monotonic()

    started: dict[int, float] = {}
    async with Worker(client, task_queue=wf_queue, workflows=[StartFloorWorkflow],
                      workflow_runner=runner or SandboxedWorkflowRunner()), \
            Worker(client, task_queue=act_queue, activities=[acts.touch_own_row, acts.subscribe_own_uri]):
        # One-time costs (the workflow sandbox, pollers, pool connections) are not per start: a warm-up tenth
        # first, as the benchmark's subscribe() does.
        await asyncio.wait_for(asyncio.gather(*(one(n + i) for i in range(warmup))), timeout)
        acts.postgres_s.clear()
        acts.read_s.clear()
        started.clear()
        cpu0 = cost.cpu_sample(roles) if roles else None
        machine0 = snapshot() if snapshot else None
        t0 = time.monotonic()
        done = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(n))), timeout)
        t1 = max(done)
        cpu = cost.cpu_delta(cpu0, cost.cpu_sample(roles), n) if cpu0 is not None and roles else None
        machine = (machine0, snapshot()) if snapshot else None
    seconds = max(t1 - t0, 1e-9)
    return StartFloorResult(
        n=n,
        concurrency=concurrency,
        warmup=warmup,
        start_seconds=round(max(started.values()) - t0, 3) if started else 0.0,
        seconds=seconds,
        subscriptions_per_second=n / seconds,
        postgres=list(acts.postgres_s),
        read=list(acts.read_s),
        cpu=cpu,
        machine=machine,
    )
