"""What search-attribute upserts and a patch marker cost the dev server per started workflow.

Contract:
- ``python -m benchmarks.upsert_cost [-n 300] [--rounds 3]`` starts a local dev server (the repo's
  ``.venv/bin/temporal``, the project's search attributes) and, in this process, a workflow worker and
  an activity worker on a second task queue. Each round starts ``n`` runs of each variant of one
  minimal workflow, 32 start calls in flight (as the benchmark's start floor), and reports the dev
  server's CPU (``benchmarks.cost``: utime + stime from /proc) per run and the runs per second:
  - 0: started → one activity on the second queue → completed (the start floor's shape);
  - 1: and one upsert (state + session generation) in the first task, as a subscription's start;
  - 2: and one more upsert (state) in the second task, as a subscription's ACTIVE;
  - 3: and a ``workflow.patched`` marker (which also upserts ``TemporalChangeVersion``);
  - 4 (``PRIMED``): the Temporal shape of a start whose subscribe and first read were done before it
    (docs/decisions/0005, option 2): one task with the patch marker, one local activity and one
    upsert (ACTIVE), then completed: no activity on the second queue, no second task.
  Each round also reports this process's CPU per run (the workers and the client).
- Nothing of mcpsync runs here: it tells how much of a subscription start's dev-server cost its
  upserts and patch marker are (docs/benchmarks/journal-2026-12-06.md, "The subscribe start floor, and
  what the dev server spends on a start").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from benchmarks import cost
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.names import SA_SESSION_GENERATION, SA_STATE

__all__ = ["UpsertCostWorkflow", "main"]

STATE = SearchAttributeKey.for_keyword(SA_STATE)
GENERATION = SearchAttributeKey.for_int(SA_SESSION_GENERATION)
WORKFLOW_QUEUE, ACTIVITY_QUEUE = "upsert-cost-wf", "upsert-cost-act"
CONCURRENCY = 32
PRIMED = 4


@activity.defn(name="upsert_cost_noop")
async def noop(sample: int) -> int:
    return sample


@workflow.defn(name="BenchUpsertCost")
class UpsertCostWorkflow:
    @workflow.run
    async def run(self, variant: int) -> int:
        if variant == PRIMED:
            workflow.patched("upsert-cost")
            done_here: int = await workflow.execute_local_activity(
                "upsert_cost_noop", variant, start_to_close_timeout=timedelta(seconds=30))
            workflow.upsert_search_attributes([STATE.value_set("ACTIVE"), GENERATION.value_set(1)])
            return done_here
        if variant >= 1:
            workflow.upsert_search_attributes([STATE.value_set("SUBSCRIBING"), GENERATION.value_set(1)])
        if variant >= 3:
            workflow.patched("upsert-cost")
        done: int = await workflow.execute_activity("upsert_cost_noop", variant, task_queue=ACTIVITY_QUEUE,
                                                    start_to_close_timeout=timedelta(seconds=30))
        if variant >= 2:
            workflow.upsert_search_attributes([STATE.value_set("ACTIVE")])
        return done


async def _round(client: Client, server_pid: int, variant: int, n: int) -> tuple[float, float, float]:
    """(dev server CPU ms per run, this process's CPU ms per run, runs per second) for ``n`` runs of
    ``variant``."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one() -> None:
        async with gate:
            handle = await client.start_workflow(UpsertCostWorkflow.run, variant, task_queue=WORKFLOW_QUEUE,
                                                 id=f"upsert-cost-{variant}-{uuid.uuid4().hex}")
        await handle.result()

    roles = {server_pid: cost.Role.TEMPORAL_DEV_SERVER, os.getpid(): cost.Role.BENCHMARK_PROCESS}
    cpu0, t0 = cost.cpu_sample(roles), time.monotonic()
    await asyncio.gather(*(one() for _ in range(n)))
    seconds = time.monotonic() - t0
    per_run = cost.cpu_delta(cpu0, cost.cpu_sample(roles), n)["by_process_ms_per_change"]
    return (per_run[cost.Role.TEMPORAL_DEV_SERVER.value], per_run[cost.Role.BENCHMARK_PROCESS.value],
            n / seconds)


async def run(n: int, rounds: int) -> None:
    server = await TemporalDevServer.start(Path(tempfile.mkdtemp(prefix="upsert-cost-")), port=0, ui_port=0)
    try:
        pid = server.pid
        assert pid is not None
        client = await Client.connect(server.address)
        async with Worker(client, task_queue=WORKFLOW_QUEUE, workflows=[UpsertCostWorkflow],
                          activities=[noop], workflow_runner=UnsandboxedWorkflowRunner()), \
                Worker(client, task_queue=ACTIVITY_QUEUE, activities=[noop]):
            for variant in (0, PRIMED):  # warm-up: pollers, caches, the first runs of each shape
                await _round(client, pid, variant, max(1, n // 6))
            for r in range(rounds):
                for variant in (0, 1, 2, 3, PRIMED):
                    ms, here, rate = await _round(client, pid, variant, n)
                    print(f"round {r} variant {variant}: dev server {ms:.1f} ms CPU per run, this process "
                          f"{here:.1f} ms, {rate:.1f} runs/s", flush=True)
    finally:
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.upsert_cost",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("-n", type=int, default=300, help="runs per variant and round (default 300)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the five variants (default 3)")
    args = parser.parse_args()
    asyncio.run(run(args.n, args.rounds))


if __name__ == "__main__":
    main()
