"""Helpers shared by the benchmark's modules (``benchmarks.run``, ``benchmarks.staleness``, ...).

Contract: small utilities: a nearest-rank percentile and a latency summary of it, a rounded ratio, a
polling wait on an async predicate, ``asyncio.gather`` with a concurrency limit, an evenly spread sample,
and one-statement reads of the ledger (rows, or the first column of the first row); the run's subject and
task queue; a Temporal dev server with a client and the ledger, on an exit stack
(``temporal_and_ledger``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TypeVar

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime

from mcpsync.activities.ledger import Ledger
from mcpsync.worker.main.connect import open_ledger
from mcpsync.worker.stack.temporal import TemporalDevServer

__all__ = ["SUBJECT", "TASK_QUEUE", "fetch_rows", "fetch_scalar", "gather_limited", "percentile", "ratio",
           "spread", "summarize", "temporal_and_ledger", "until", "warmup_count"]

T = TypeVar("T")

SUBJECT = "bench"
TASK_QUEUE = "mcpsync-bench"


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    s = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(s)))
    return s[min(rank, len(s)) - 1]


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(interval)
    return await predicate()


def spread(items: Sequence[T], k: int) -> list[T]:
    """At most ``k`` of ``items``, evenly spaced from the first (all of them when there are no more):
    a sample that spans start order, so early and late subscriptions are both in it."""
    if len(items) <= k:
        return list(items)
    return [items[i * len(items) // k] for i in range(k)]


def warmup_count(n: int) -> int:
    """Starts run before a timed window of ``n`` (a tenth, at least one): one-time costs (pools, caches,
    imports) are not per start. The startup phase and the start floors warm up alike."""
    return max(1, n // 10)


async def gather_limited(coros: Sequence[Awaitable[Any]], limit: int) -> list[Any]:
    gate = asyncio.Semaphore(limit)

    async def one(c: Awaitable[Any]) -> Any:
        async with gate:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


async def fetch_scalar(ledger: Ledger, sql: str, args: Sequence[Any] = ()) -> Any:
    async with ledger.pool.connection() as conn:
        row = await (await conn.execute(sql, args)).fetchone()
    return None if row is None else row[0]


async def fetch_rows(ledger: Ledger, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    async with ledger.pool.connection() as conn:
        return list(await (await conn.execute(sql, args)).fetchall())


def summarize(values: Sequence[float]) -> dict[str, Any]:
    def ms(v: float | None) -> float | None:
        return None if v is None else round(v * 1000, 2)

    return {
        "samples": len(values),
        "p50_ms": ms(percentile(values, 50)),
        "p90_ms": ms(percentile(values, 90)),
        "p99_ms": ms(percentile(values, 99)),
        "p999_ms": ms(percentile(values, 99.9)),
        "max_ms": ms(max(values) if values else None),
        "mean_ms": ms(sum(values) / len(values) if values else None),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else round(a / b, 3)



async def temporal_and_ledger(stack: AsyncExitStack, temporal_dir: Path, db_url: str, *, pool_size: int = 16,
                              runtime: Runtime | None = None) -> tuple[TemporalDevServer, Client, Ledger]:
    """A Temporal dev server storing in ``temporal_dir``, a client on it (pydantic payloads, ``runtime``'s
    metrics) and the ledger on ``db_url`` (``pool_size`` connections); ``stack`` closes and stops them."""
    temporal = await TemporalDevServer.start(temporal_dir, port=0, ui_port=0)
    stack.push_async_callback(temporal.stop)
    client = await Client.connect(temporal.address, data_converter=pydantic_data_converter, runtime=runtime)
    ledger = await open_ledger(db_url, max_size=pool_size)
    stack.push_async_callback(ledger.pool.close)
    return temporal, client, ledger
