"""Time to the first receipt: Update-with-Start vs start + polling the query.

Contract:
- One fresh stack (dev server on free ports, a fresh database, the fixture over HTTP, one
  in-process worker), like a ``benchmarks.run`` run. Each sample subscribes a fresh URI (its
  content created first) and times, on the client clock, the call until the caller holds the
  record with the first receipt: ``start_subscription_first_read`` (one call) against
  ``start_subscription`` followed by the ``subscription`` query every ``--poll-ms`` until the
  record has a verdict (how a caller learned it before). The two alternate, so load drifts hit
  both; a few warm-up subscriptions go first.
- Prints one JSON document {update_with_start_ms, start_and_poll_ms: {samples, p50, max}}.

Run: ``.venv/bin/python -m benchmarks.first_read [--samples 10] [--poll-ms 50]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from typing import Any

from temporalio.client import Client

from benchmarks.common import percentile, temporal_and_ledger
from benchmarks.postgres import Postgres
from mcpsync.activities.starters import start_subscription, start_subscription_first_read
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import Config, ServerConfig, TemporalConfig
from mcpsync.worker.main.services import run_services
from mcpsync.workflows.names import QUERY_SUBSCRIPTION
from mcpsync.workflows.records.subscription import SubscriptionKey
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1

TASK_QUEUE = "mcpsync-bench-first-read"
SUBJECT = "bench"


async def _with_update(client: Client, key: SubscriptionKey) -> float:
    t0 = time.perf_counter()
    _, record = await start_subscription_first_read(client, key, task_queue=TASK_QUEUE)
    assert record.last_verdict is not None, record
    return (time.perf_counter() - t0) * 1000


async def _with_polling(client: Client, key: SubscriptionKey, poll_s: float) -> float:
    t0 = time.perf_counter()
    handle = await start_subscription(client, key, task_queue=TASK_QUEUE)
    while True:
        record = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
        if record.last_verdict is not None:
            return (time.perf_counter() - t0) * 1000
        await asyncio.sleep(poll_s)


def _summary(values: list[float]) -> dict[str, Any]:
    return {"samples": [round(v, 1) for v in values], "p50": round(percentile(values, 50) or 0, 1),
            "max": round(max(values), 1)}


async def main(samples: int, poll_ms: float, warmup: int) -> dict[str, Any]:
    pg = Postgres()
    await pg.start()
    name = f"mcpsync_bench_fr_{uuid.uuid4().hex[:6]}"
    async with AsyncExitStack() as stack:
        stack.push_async_callback(pg.stop)
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mcpsync-first-read-")))
        db_url = await pg.create(name)
        stack.push_async_callback(pg.drop, name)
        temporal, client, ledger = await temporal_and_ledger(stack, work / "temporal", db_url, pool_size=8)
        fx = await FixtureProcess.start_http(work, seed="none")
        stack.push_async_callback(fx.stop)
        server = ServerConfig(name="bench", transport="http", url=fx.mcp_url, subjects=[SUBJECT])
        config = Config(temporal=TemporalConfig(address=temporal.address, task_queue=TASK_QUEUE),
                        servers=[server])
        services = asyncio.create_task(run_services(config, client, ledger))

        async def stop_services() -> None:
            services.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await services

        stack.push_async_callback(stop_services)

        async def fresh(tag: str) -> SubscriptionKey:
            uri = f"bench://first-read/{tag}-{uuid.uuid4().hex[:8]}"
            await fx.create(uri, text=f"{uri} v1")
            return SubscriptionKey(subject=SUBJECT, server=server.name, uri=uri)

        for _ in range(warmup):  # session host connected, workers warm
            await asyncio.wait_for(_with_update(client, await fresh("warmup")), 60)
        updates: list[float] = []
        polls: list[float] = []
        for _ in range(samples):
            updates.append(await asyncio.wait_for(_with_update(client, await fresh("uws")), 60))
            polls.append(await asyncio.wait_for(_with_polling(client, await fresh("poll"), poll_ms / 1000),
                                                60))
        return {"update_with_start_ms": _summary(updates), "start_and_poll_ms": _summary(polls),
                "poll_interval_ms": poll_ms}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--poll-ms", type=float, default=50.0, help="query interval of the polling variant")
    parser.add_argument("--warmup", type=int, default=3)
    a = parser.parse_args()
    print(json.dumps(asyncio.run(main(a.samples, a.poll_ms, a.warmup)), indent=2))
