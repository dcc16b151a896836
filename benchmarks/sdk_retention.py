"""What a cached Temporal run keeps per command, outside mcpsync (temporalio's core, in one process).

Contract:
- ``python -m benchmarks.sdk_retention [--kinds signal,timer_cancel,upsert,local_activity,details] [-n 200]
  [-k 50]`` starts a local dev server (the repo's ``.venv/bin/temporal``) and one worker in this
  process, and ``n`` runs of a minimal workflow. Each signal makes every run take one workflow task
  and emit one command of the kind measured: none (``signal``), a timer started and cancelled by the
  next signal (``timer_cancel``: what the deadline keeper's re-arm does on a safety read), a search
  attribute upsert (``upsert``), a local activity (``local_activity``: a ledger call), or no
  command but a new 1 KB current-details text (``details``: the Web UI's panel mcpsync rewrites).
- The process's RSS and glibc's in-use bytes (``mallinfo2().uordblks``: native and Python objects
  over 512 bytes) are sampled after two warm-up signals and after ``k`` more, and again once every
  run continued-as-new and its successor took two signals: per command per run, and what is left
  per run after the runs that held the commands ended.
- Nothing of mcpsync runs here: it tells the SDK's share of the idle growth
  (docs/benchmarks/journal-2026-12-06.md, "Where the idle growth is").
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

__all__ = ["main"]

KINDS = ("signal", "timer_cancel", "upsert", "local_activity", "details")
_KEY = SearchAttributeKey.for_int("SdkRetentionCounter")
_TEMPORAL = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "temporal"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]


def _sample() -> tuple[int, int]:
    """(RSS, glibc in-use bytes) of this process, after a collection."""
    gc.collect()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))
    return rss, int(libc.mallinfo2().uordblks)


@activity.defn(name="sdk_retention_echo")
async def _echo(arg: str) -> str:
    return "r" * 200


@workflow.defn(name="SdkRetention", sandboxed=False)
class _Retention:
    def __init__(self) -> None:
        self.seen = 0
        self.handled = 0
        self.cont = False

    @workflow.signal
    def poke(self, cont: bool) -> None:
        self.seen += 1
        self.cont = self.cont or cont

    @workflow.query
    def handled_count(self) -> int:
        return self.handled

    def _signalled(self, count: int) -> Callable[[], bool]:
        return lambda: self.seen >= count

    @workflow.run
    async def run(self, kind: str, base: int) -> None:
        self.handled = base
        taken = 0  # signals this run has acted on
        while True:
            taken += 1
            if kind == "timer_cancel":
                try:
                    await workflow.wait_condition(self._signalled(taken), timeout=timedelta(hours=1))
                except TimeoutError:
                    pass
            else:
                await workflow.wait_condition(self._signalled(taken))
            if self.cont:
                workflow.continue_as_new(args=[kind, self.handled + 1])
            if kind == "upsert":
                workflow.upsert_search_attributes([_KEY.value_set(self.seen)])
            elif kind == "details":  # the Web UI's details panel (no command: WFT completion metadata)
                workflow.set_current_details(f"{self.seen} " + "d" * 1000)
            elif kind == "local_activity":
                await workflow.execute_local_activity(_echo, "x" * 50,
                                                      start_to_close_timeout=timedelta(seconds=10))
            self.handled += 1


async def _handled(client: Client, ids: list[str], target: int) -> None:
    for wid in ids:
        handle = client.get_workflow_handle(wid)
        while await handle.query(_Retention.handled_count) < target:  # noqa: ASYNC110 (another process)
            await asyncio.sleep(0.05)


async def measure(kind: str, n: int, k: int) -> dict[str, float]:
    """Bytes per command per run, and per run left after continue-as-new (see the contract)."""
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=str(_TEMPORAL),
                                                search_attributes=[_KEY], dev_server_log_level="error")
    async with env:
        client, queue = env.client, f"sdk-retention-{kind}"
        async with Worker(client, task_queue=queue, workflows=[_Retention], activities=[_echo],
                          max_cached_workflows=max(1000, 2 * n)):
            ids = [f"{kind}-{i}-{time.time_ns()}" for i in range(n)]
            for wid in ids:
                await client.start_workflow(_Retention.run, args=[kind, 0], id=wid, task_queue=queue)
            signals = 0

            async def signal_all(cont: bool = False, check: bool = False) -> None:
                nonlocal signals
                signals += 1
                await asyncio.gather(*(client.get_workflow_handle(w).signal(_Retention.poke, cont)
                                       for w in ids))
                await _handled(client, ids if check else ids[-3:], signals)

            await signal_all()
            await signal_all(check=True)
            before = _sample()
            for i in range(k):
                await signal_all(check=i == k - 1)
            after = _sample()
            await signal_all(cont=True)  # every run continues-as-new; its successor starts
            await signal_all()
            await signal_all(check=True)
            await asyncio.sleep(1)
            replaced = _sample()
    return {
        "rss_bytes_per_command": (after[0] - before[0]) / (n * k),
        "in_use_bytes_per_command": (after[1] - before[1]) / (n * k),
        "rss_bytes_per_run_after_continue_as_new": (replaced[0] - before[0]) / n,
        "in_use_bytes_per_run_after_continue_as_new": (replaced[1] - before[1]) / n,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sdk_retention")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    p.add_argument("-n", type=int, default=200, help="runs (default 200)")
    p.add_argument("-k", type=int, default=50, help="signals measured per run (default 50)")
    args = p.parse_args(argv)
    for kind in args.kinds.split(","):
        if kind not in KINDS:
            p.error(f"unknown kind {kind!r}")
        r = asyncio.run(measure(kind, args.n, args.k))
        print(f"{kind}: n={args.n} k={args.k}: per command per run: RSS {r['rss_bytes_per_command']:.0f} B, "
              f"in use {r['in_use_bytes_per_command']:.0f} B; per run after continue-as-new (vs before the k "
              f"commands): RSS {r['rss_bytes_per_run_after_continue_as_new'] / 1024:+.1f} KiB, in use "
              f"{r['in_use_bytes_per_run_after_continue_as_new'] / 1024:+.1f} KiB", flush=True)


if __name__ == "__main__":
    main()
