"""What forgetting superseded verification receipts costs (``mcpsync prune``, retention.py).

Contract:
- ``python -m benchmarks.receipt_prune [-n 1000] [-r 300]`` makes a fresh database (``benchmarks.postgres``:
  ``MCPSYNC_DATABASE_URL``'s server, else an embedded one), migrates it, and writes ``n`` ACTIVE
  subscriptions with ``r`` receipts each straight into the ledger (SQL, no upstream): one ACCEPTED,
  then ``r - 1`` UNCHANGED of the same digest spread over the last 30 days, the fence row naming the
  newest, one ``version_accepted`` outbox row per subscription.
- It prints the table and index bytes per receipt, the ``EXPLAIN (ANALYZE, BUFFERS)`` of one batch of
  the production statement (rolled back), then runs the production ``prune(keep=7 days)`` while one
  connection writes a receipt under its row lock every 10 ms (an accept's shape), and prints the
  receipts forgotten, the time, and those writes' latency before and during the prune; then a second
  prune (nothing left to do) and the rows kept.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import suppress
from datetime import timedelta

from benchmarks.postgres import scratch_ledger
from mcpsync.activities.ledger import retention
from mcpsync.activities.ledger.retention import prune

KEEP = timedelta(days=7)
SEED = [
    """INSERT INTO subscriptions (workflow_id, subject, server, uri, uri_normalized, state,
        last_issued_ordinal, last_accepted_ordinal, last_accepted_digest)
    SELECT 'wf-' || i, 'subj-' || (i %% 10), 'srv', 'demo://r/' || i, 'demo://r/' || i, 'ACTIVE',
           %(r)s, %(r)s, 'sha256:d' || i FROM generate_series(1, %(n)s) i""",
    """INSERT INTO resource_versions (workflow_id, subject, server, uri, mime_type, content_digest, size,
        read_ordinal, session_generation, subscription_generation, request_id, trigger_reason, status,
        accepted_at)
    SELECT 'wf-' || i, 'subj-' || (i %% 10), 'srv', 'demo://r/' || i, 'text/plain', 'sha256:d' || i, 100,
           k, 1, 1, 'rq-' || i || '-' || k, 'safety', CASE WHEN k = 1 THEN 'ACCEPTED' ELSE 'UNCHANGED' END,
           now() - interval '30 days' + (k * interval '30 days' / %(r)s)
    FROM generate_series(1, %(r)s) k, generate_series(1, %(n)s) i ORDER BY k, i""",
    """UPDATE subscriptions s SET last_receipt_id = (SELECT max(receipt_id) FROM resource_versions v
                                                    WHERE v.workflow_id = s.workflow_id)""",
    """INSERT INTO outbox (event_type, workflow_id, subject, server, uri, receipt_id, content_digest,
        read_ordinal)
    SELECT 'version_accepted', workflow_id, subject, server, uri, receipt_id, content_digest, read_ordinal
    FROM resource_versions WHERE status = 'ACCEPTED'""",
    "ANALYZE",
]

# One receipt of another read, as an accept writes it under the fence row's lock.
WRITE = """
INSERT INTO resource_versions (workflow_id, subject, server, uri, content_digest, read_ordinal,
    session_generation, subscription_generation, request_id, trigger_reason, status)
VALUES (%s, 'subj-0', 'srv', 'demo://w', 'sha256:w', %s, 1, 1, 'w', 'safety', 'STALE')
"""


def _quantiles(xs: list[float]) -> str:
    xs = sorted(xs)
    if not xs:
        return "n=0"
    return (f"n={len(xs)} p50={xs[len(xs) // 2] * 1000:.1f} ms p99={xs[int(len(xs) * 0.99)] * 1000:.1f} ms"
            f" max={xs[-1] * 1000:.1f} ms")


async def run(n: int, r: int) -> None:
    async with scratch_ledger("receipt_prune") as ledger:
        async with ledger.pool.connection() as conn:
            started = time.perf_counter()
            for sql in SEED:
                await conn.execute(sql, {"n": n, "r": r} if "%(" in sql else None)
            print(f"seeded {n} subscriptions x {r} receipts in {time.perf_counter() - started:.1f} s")
            cur = await conn.execute("SELECT pg_table_size('resource_versions'),"
                                     " pg_indexes_size('resource_versions'),"
                                     " pg_relation_size('resource_versions_unchanged_age')")
            row = await cur.fetchone()
            assert row is not None
            print("bytes per receipt: table {:.0f}, indexes {:.0f} (the age index {:.1f})".format(
                *(x / (n * r) for x in row)))
        async with ledger.pool.connection() as conn, conn.transaction(force_rollback=True):
            cur = await conn.execute("SELECT now() - %s::interval", (KEEP,))
            row = await cur.fetchone()
            assert row is not None
            cur = await conn.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + retention._RECEIPTS,
                                     {"cutoff": row[0], "batch": retention.RECEIPT_BATCH})
            print("\n".join(str(line[0]) for line in await cur.fetchall()))
        latencies: list[float] = []

        async def writer() -> None:
            async with ledger.pool.connection() as conn:
                for i in range(1, 10**9):
                    t = time.perf_counter()
                    async with conn.transaction():
                        wf = f"wf-{i % n + 1}"
                        await conn.execute("SELECT 1 FROM subscriptions WHERE workflow_id = %s FOR UPDATE",
                                           (wf,))
                        await conn.execute(WRITE, (wf, 10**7 + i))
                    latencies.append(time.perf_counter() - t)
                    await asyncio.sleep(0.01)

        task = asyncio.create_task(writer())
        await asyncio.sleep(5)
        print("writes before the prune:", _quantiles(latencies))
        latencies.clear()
        started = time.perf_counter()
        report = await prune(ledger.pool, keep=KEEP)
        took = time.perf_counter() - started
        during = list(latencies)
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
        print(f"prune: {report.verification_receipts} receipts forgotten in {took:.2f} s")
        print("writes during the prune:", _quantiles(during))
        started = time.perf_counter()
        again = await prune(ledger.pool, keep=KEEP)
        print(f"second prune: {again.verification_receipts} in {time.perf_counter() - started:.2f} s")
        async with ledger.pool.connection() as conn:
            cur = await conn.execute("SELECT status, count(*) FROM resource_versions GROUP BY 1 ORDER BY 1")
            print("kept:", dict(await cur.fetchall()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="subscriptions")
    parser.add_argument("-r", type=int, default=300, help="receipts per subscription")
    args = parser.parse_args()
    asyncio.run(run(args.n, args.r))


if __name__ == "__main__":
    main()
