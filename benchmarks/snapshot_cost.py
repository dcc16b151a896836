"""What one refresh of the ledger's gauges costs (``metrics.read_snapshot``), on a ledger with history.

Contract:
- ``python -m benchmarks.snapshot_cost [-n 5000] [-r 60] [--runs 20]`` makes a fresh database
  (``benchmarks.postgres``: ``MCPSYNC_DATABASE_URL``'s server, else an embedded one), migrates it,
  and writes ``n`` ACTIVE subscriptions with ``r`` completed reads each straight into the ledger (SQL,
  no upstream), as a binary before migration 025 left them: the reads spread over 10 days, each with
  its receipt (one ACCEPTED, then UNCHANGED), the fence row naming the newest. Then it counts them
  onto the rows with migration 025's own SQL (the time is the migration's on such a ledger), and
  prints the median and the maximum of ``runs`` production ``read_snapshot`` calls, and each
  snapshot query's time (median of ``runs``).
- ``seed`` and ``timed`` are what a comparison with another version of the queries reuses.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from importlib import resources
from typing import Any

from psycopg_pool import AsyncConnectionPool

from benchmarks.postgres import scratch_ledger
from mcpsync.activities.ledger.metrics import (
    SNAPSHOT_QUERIES,
    freshness_bounds,
    read_snapshot,
    snapshot_params,
)

SEED = [
    """INSERT INTO subscriptions (workflow_id, subject, server, uri, uri_normalized, state, created_at,
        last_issued_ordinal, last_accepted_ordinal, watermark, last_accepted_digest)
    SELECT 'wf-' || i, 'subj-' || (i %% 10), 'srv-' || (i %% 4), 'demo://r/' || i, 'demo://r/' || i,
           'ACTIVE', now() - interval '10 days', %(r)s, %(r)s, %(r)s, 'sha256:d' || i
    FROM generate_series(1, %(n)s) i""",
    """INSERT INTO read_requests (workflow_id, ordinal, request_id, session_generation,
        subscription_generation, trigger_reason, issued_at, completed_at, outcome)
    SELECT 'wf-' || i, k, 'rq-' || i || '-' || k, 1, 1, 'safety',
           now() - interval '10 days' + (k * interval '10 days' / (%(r)s + 1)),
           now() - interval '10 days' + (k * interval '10 days' / (%(r)s + 1)) + interval '1 second',
           CASE WHEN k = 1 THEN 'ACCEPTED' ELSE 'UNCHANGED' END
    FROM generate_series(1, %(r)s) k, generate_series(1, %(n)s) i ORDER BY k, i""",
    """INSERT INTO resource_versions (workflow_id, subject, server, uri, mime_type, content_digest, size,
        read_ordinal, session_generation, subscription_generation, request_id, trigger_reason, status,
        accepted_at)
    SELECT r.workflow_id, s.subject, s.server, s.uri, 'text/plain', s.last_accepted_digest, 100, r.ordinal,
           1, 1, r.request_id, r.trigger_reason, r.outcome, r.completed_at
    FROM read_requests r JOIN subscriptions s USING (workflow_id) ORDER BY r.ordinal, r.workflow_id""",
    """UPDATE subscriptions s SET last_receipt_id = (SELECT max(receipt_id) FROM resource_versions v
                                                    WHERE v.workflow_id = s.workflow_id)""",
]


async def seed(pool: AsyncConnectionPool, n: int, r: int) -> float:
    """``n`` subscriptions with ``r`` reads and receipts each, counted onto the rows by migration 025's
    SQL; the seconds that counting took."""
    async with pool.connection() as conn:
        for sql in SEED:
            await conn.execute(sql, {"n": n, "r": r})
        counting = resources.files("mcpsync.activities.ledger.migrations").joinpath(
            "025_ledger_gauges.sql").read_text()
        started = time.perf_counter()
        await conn.execute(counting)  # several statements: no parameters
        took = time.perf_counter() - started
        await conn.execute("VACUUM ANALYZE")
    return took


async def timed(pool: AsyncConnectionPool, runs: int, queries: dict[str, str], snapshot: Any,
                ) -> tuple[list[float], dict[str, float]]:
    """``runs`` calls of ``snapshot(pool, 0)`` (seconds each) and each of ``queries``' median seconds."""
    calls = []
    for _ in range(runs):
        started = time.perf_counter()
        await snapshot(pool, 0)
        calls.append(time.perf_counter() - started)
    params = snapshot_params(0, freshness_bounds())
    each: dict[str, float] = {}
    async with pool.connection() as conn:
        for name, sql in queries.items():
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                cur = await conn.execute(sql, params if "%(" in sql else None)
                await cur.fetchall()
                times.append(time.perf_counter() - started)
            each[name] = statistics.median(times)
    return calls, each


def show(label: str, calls: list[float], each: dict[str, float]) -> None:
    print(f"{label}: read_snapshot median {statistics.median(calls) * 1000:.1f} ms,"
          f" max {max(calls) * 1000:.1f} ms; per query (median, ms): "
          + ", ".join(f"{k} {v * 1000:.2f}" for k, v in each.items()))


async def run(n: int, r: int, runs: int) -> None:
    async with scratch_ledger("snapshot_cost") as ledger:
        started = time.perf_counter()
        counting = await seed(ledger.pool, n, r)
        print(f"seeded {n} subscriptions x {r} reads and receipts in {time.perf_counter() - started:.1f} s;"
              f" migration 025's counting took {counting:.2f} s")
        show("snapshot", *await timed(ledger.pool, runs, SNAPSHOT_QUERIES, read_snapshot))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5000, help="subscriptions")
    parser.add_argument("-r", type=int, default=60, help="reads (and receipts) per subscription")
    parser.add_argument("--runs", type=int, default=20, help="timed calls")
    args = parser.parse_args()
    asyncio.run(run(args.n, args.r, args.runs))


if __name__ == "__main__":
    main()
