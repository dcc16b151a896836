"""The dev server's CPU per signal when the signalled run is in its mutable-state cache, and when it is not.

Contract:
- ``python -m benchmarks.reload_cost [-k 300] [-n 600] [--rounds 6]`` starts two local dev servers (the
  repo's ``.venv/bin/temporal`` through ``TemporalDevServer``, the project's dynamic config) side by side,
  one with ``history.hostLevelCacheMaxSize`` 8096 (every run stays cached) and one with 64, and in this
  process a worker for each that keeps every run cached (so the worker's side is alike). It starts ``k``
  runs of one minimal workflow on each, then sends ``n`` signals a round, round-robin over the ``k`` runs
  (every signal misses a cache of 64 when ``k`` is well above it), 16 in flight, and reports the dev
  server's CPU (utime + stime from /proc, a second of settling included) per signal. Rounds alternate
  between the two servers; round 0 warms up and is left out of the medians.
- Nothing of mcpsync runs here: it tells what the bound on the mutable-state cache in
  ``temporal/dynamic_config.toml`` costs per touch of an evicted run (docs/benchmarks/journal-2026-12-07.md,
  "The dev server's memory"). 64 is the small side, not 16: a cache as small as the runs in use at once
  fails requests with ResourceExhausted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from mcpsync.worker.stack.temporal import TemporalDevServer

__all__ = ["ReloadCostWorkflow", "main"]

QUEUE = "reload-cost"
CACHE_SIZES = (8096, 64)
IN_FLIGHT = 16


@workflow.defn(name="BenchReloadCost")
class ReloadCostWorkflow:
    def __init__(self) -> None:
        self.signals = 0

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.signals < 0)

    @workflow.signal
    def bump(self) -> None:
        self.signals += 1


def _cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


async def _round(pid: int, handles: list[WorkflowHandle[ReloadCostWorkflow, None]], n: int) -> float:
    """Dev server CPU ms per signal for ``n`` signals round-robin over ``handles``."""
    gate = asyncio.Semaphore(IN_FLIGHT)

    async def send(handle: WorkflowHandle[ReloadCostWorkflow, None]) -> None:
        async with gate:
            await handle.signal(ReloadCostWorkflow.bump)

    before = _cpu_ms(pid)
    await asyncio.gather(*(send(handles[i % len(handles)]) for i in range(n)))
    await asyncio.sleep(1.0)  # the workflow tasks the last signals started
    return (_cpu_ms(pid) - before) / n


async def run(k: int, n: int, rounds: int) -> None:
    servers: list[TemporalDevServer] = []
    workers: list[asyncio.Task[None]] = []
    handles: list[list[WorkflowHandle[ReloadCostWorkflow, None]]] = []
    try:
        for size in CACHE_SIZES:
            server = await TemporalDevServer.start(Path(tempfile.mkdtemp(prefix=f"reload-cost-{size}-")),
                                                   port=0, ui_port=0,
                                                   dynamic_config={"history.hostLevelCacheMaxSize": size})
            servers.append(server)
            client = await Client.connect(server.address)
            worker = Worker(client, task_queue=QUEUE, workflows=[ReloadCostWorkflow],
                            workflow_runner=UnsandboxedWorkflowRunner(), max_cached_workflows=k + 100)
            workers.append(asyncio.create_task(worker.run()))
            handles.append([await client.start_workflow(ReloadCostWorkflow.run, id=f"reload-cost-{i}",
                                                        task_queue=QUEUE) for i in range(k)])
        await asyncio.sleep(3.0)
        per_signal: dict[int, list[float]] = {size: [] for size in CACHE_SIZES}
        for r in range(rounds + 1):
            for server, size, runs in zip(servers, CACHE_SIZES, handles, strict=True):
                assert server.pid is not None
                started = time.monotonic()
                ms = await _round(server.pid, runs, n)
                if r > 0:
                    per_signal[size].append(ms)
                print(f"round {r} cache {size}: dev server {ms:.2f} ms CPU per signal, "
                      f"{n / (time.monotonic() - started - 1.0):.0f} signals/s", flush=True)
        for size, values in per_signal.items():
            ordered = sorted(values)
            print(f"cache {size}: median {ordered[len(ordered) // 2]:.2f} ms per signal, rounds "
                  + ", ".join(f"{v:.2f}" for v in values))
    finally:
        for task in workers:
            task.cancel()
        for server in servers:
            await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reload_cost",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("-k", type=int, default=300, help="runs per server (default 300)")
    parser.add_argument("-n", type=int, default=600, help="signals per round and server (default 600)")
    parser.add_argument("--rounds", type=int, default=6, help="measured rounds (default 6)")
    args = parser.parse_args()
    asyncio.run(run(args.k, args.n, args.rounds))


if __name__ == "__main__":
    main()
