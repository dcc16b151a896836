"""The run's Temporal floors (``benchmarks.floor``) as sections of its report: the read floor (signal ->
one activity -> acknowledged) and the start floor (n one-activity workflows started like subscriptions),
both reading ``TEMPORAL_FLOOR_URI`` through an MCP client session of their own
(:func:`temporal_floor_session`) on the run's fixture, over the transport a session host opens
(``mcpsync.worker.ingress.transport.server_transport``: the same HTTP client, connection pool and
bounds), so the floor's read costs what the ingress's read costs. The subscribe start floor
(:func:`measure_temporal_start_floor` with ``subscribe=True``) subscribes and reads URIs of its own,
``start_floor_uris``, which the session creates on the same fixture and nothing ever changes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client as McpClient
from mcp import StdioServerParameters
from temporalio.client import Client

from benchmarks import cost, floor
from benchmarks.common import gather_limited, summarize, warmup_count
from benchmarks.usage import cpu_report, cpu_snapshot
from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureControl, FixtureProcess, stdio_command, wait_ready_file
from mcpsync.worker.ingress.transport import server_transport
from mcpsync.worker.main.config import ServerConfig, WorkflowRunnerKind
from mcpsync.worker.main.worker import workflow_runner

__all__ = ["TEMPORAL_FLOOR_URI", "measure_temporal_floor", "measure_temporal_start_floor", "start_floor_uris",
           "temporal_floor_session"]


TEMPORAL_FLOOR_URI = "bench://temporal-floor"


def start_floor_uris(n: int) -> list[str]:
    """The subscribe start floor's URIs for ``n`` timed starts and their warm-up tenth."""
    return [f"bench://temporal-start-floor/{i}" for i in range(n + warmup_count(n))]


@asynccontextmanager
async def temporal_floor_session(fixture: FixtureProcess | None, work: Path,
                                 start_uris: Sequence[str] = ()) -> AsyncIterator[Any]:
    """The Temporal floors' own MCP client session (``cache=None``) on the run's fixture, holding
    ``TEMPORAL_FLOOR_URI`` and ``start_uris``: over HTTP the system's fixture process, over stdio a twin
    fixture process of its own (a stdio server has one client)."""
    ready = work / "ready-temporal-floor.json"
    target: Any
    if fixture is not None:
        await gather_limited([fixture.create(uri, text="temporal floor", mime_type="text/plain")
                              for uri in [TEMPORAL_FLOOR_URI, *start_uris]], 16)
        target = server_transport(ServerConfig(name="temporal-floor", transport="http", url=fixture.mcp_url),
                                  "temporal-floor")
    else:
        command, env = stdio_command(ready_file=ready, seed="none", log_level="WARNING")
        target = StdioServerParameters(command=command[0], args=command[1:], env=env)
    # The edition the benchmark's ingress speaks (ServerConfig's default, 2025-11-25: resources/subscribe).
    mcp = McpClient(target, mode="legacy", cache=None,
                    client_info=types.Implementation(name="bench-temporal-floor", version="0"))
    await asyncio.wait_for(mcp.__aenter__(), 30)
    try:
        if fixture is None:
            ctl = FixtureControl((await wait_ready_file(ready, timeout=30))["control_url"])
            try:
                await gather_limited([ctl.create(uri, text="temporal floor", mime_type="text/plain")
                                      for uri in [TEMPORAL_FLOOR_URI, *start_uris]], 16)
            finally:
                await ctl.aclose()
        yield mcp
    finally:
        with suppress(BaseException):  # a transport torn down mid-close must not fail the report
            await asyncio.wait_for(mcp.__aexit__(None, None, None), 10)


async def measure_temporal_floor(client: Client, ledger: Ledger, mcp: Any, samples: int) -> dict[str, Any]:
    """``benchmarks.floor.measure`` on the run's dev server and database, reading ``TEMPORAL_FLOOR_URI`` on
    ``mcp`` (:func:`temporal_floor_session`)."""
    res = await floor.measure(client, ledger.pool, mcp, TEMPORAL_FLOOR_URI, samples)
    ms = summarize(res.totals)
    return {
        **ms,
        "missing": res.missing,
        "signal_to_activity_done_p50_ms": summarize(res.activity_done)["p50_ms"],
        "activity_postgres_p50_ms": summarize(res.postgres)["p50_ms"],
        "activity_read_p50_ms": summarize(res.read)["p50_ms"],
        "steps_p50_ms": {k: summarize(v)["p50_ms"] for k, v in res.breakdown.items()},
        "history_events": res.history_events,
        "workflow_tasks_completed": res.workflow_tasks,
        "what": "benchmarks.floor: signal sent -> the workflow task that took the result of ONE activity "
                "(one PostgreSQL UPDATE transaction + one MCP resources/read, own session, cache=None) run "
                "on a second task queue completed (server's event time); sequential, idle, same dev "
                "server, database, fixture",
        "_totals": res.totals,
    }


async def measure_temporal_start_floor(client: Client, ledger: Ledger, mcp: Any, n: int,
                                       roles: dict[int, cost.Role] | None,
                                       runner: WorkflowRunnerKind, *,
                                       subscribe: bool = False) -> dict[str, Any]:
    """``benchmarks.floor.measure_starts``: ``n`` minimal workflows of one activity each, started 32 at a time
    like ``subscribe()`` starts subscriptions, on the main worker's workflow runner; CPU of ``roles`` over the
    window. ``subscribe``: the subscribe start floor (the activity subscribes and reads
    ``start_floor_uris(n)``, which :func:`temporal_floor_session` must have created)."""
    res = await floor.measure_starts(client, ledger.pool, mcp, TEMPORAL_FLOOR_URI, n, concurrency=32,
                                     roles=roles, snapshot=cpu_snapshot, runner=workflow_runner(runner),
                                     uris=start_floor_uris(n) if subscribe else ())
    mcp_work = ("one MCP resources/subscribe + resources/read of a URI of its own (start_floor_uris)"
                if subscribe else "one MCP resources/read")
    out: dict[str, Any] = {
        "subscriptions_per_s": round(res.subscriptions_per_second, 1),
        "n": res.n,
        "workflow_runner": runner.value,
        "concurrency": res.concurrency,
        "warmup": res.warmup,
        "start_seconds": round(res.start_seconds, 3),
        "seconds": round(res.seconds, 3),
        "activity_postgres_p50_ms": summarize(res.postgres)["p50_ms"],
        "activity_read_p50_ms": summarize(res.read)["p50_ms"],  # the subscribe floor's: subscribe + read
        "cpu_ms_per_start": None,
        "by_process_ms_per_start": None,
        "machine_busy_pct": None,
        "other_processes_pct_of_machine": None,
        "what": "benchmarks.floor.measure_starts: after a warm-up tenth, n workflows "
                "(BenchTemporalStartFloor: ONE activity = one PostgreSQL transaction upserting a row of "
                f"its own + {mcp_work}, own session, cache=None, on a second task queue, then "
                "return) started with at most 32 start calls in flight, as subscribe() starts "
                "subscriptions; n / (first start call -> last completion observed); n = "
                "startup.subscriptions_measured capped at 200; same dev server, database, fixture; workers "
                "in the benchmark process (one interpreter), the workflow worker on the main worker's runner",
    }
    if res.machine is not None:
        box = cpu_report(*res.machine)
        out["machine_busy_pct"] = box["machine_busy_pct"]
        out["other_processes_pct_of_machine"] = box["other_processes_pct_of_machine"]
        out["machine_note"] = ("the whole box over the same window (cpu_report): other processes = busy "
                               "minus this process tree and PostgreSQL, i.e. other agents competing for "
                               "the same cores")
    if res.cpu is not None:
        by = res.cpu["by_process_ms_per_change"]
        mine = (cost.Role.BENCHMARK_PROCESS.value, cost.Role.TEMPORAL_DEV_SERVER.value)
        out["cpu_ms_per_start"] = round(sum(by[k] or 0.0 for k in mine), 1)
        out["by_process_ms_per_start"] = by
        out["cpu_note"] = ("cpu_ms_per_start = benchmark_process (the floor's workers and client; the idle "
                           "naive baseline) + temporal_dev_server, utime+stime from /proc over the window "
                           "/ n (benchmarks.cost); by_process_ms_per_start has every role, the floor's "
                           "PostgreSQL transactions and fixture reads and the idle mcpsync processes "
                           "included")
    return out

