"""Helpers shared by the benchmark's modules (``benchmarks.run``, ``benchmarks.staleness``).

Contract: small utilities: a nearest-rank percentile, a polling wait on an async predicate,
``asyncio.gather`` with a concurrency limit, and one-statement reads of the ledger (rows, or the
first column of the first row).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mcpsync.activities.ledger import Ledger

__all__ = ["fetch_rows", "fetch_scalar", "gather_limited", "percentile", "until"]


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
