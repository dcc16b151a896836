"""The ledger's CPU per unchanged verification read, in-process: the read cycle's two ledger calls
(``FenceLedger.allocate_read``, then ``accept_judged`` with the read's body, verdict UNCHANGED) with
no MCP server and no Temporal, from ``--concurrency`` callers at once (the ingress's routers).

``python -m benchmarks.ledger_cost [--url postgresql://postgres@127.0.0.1:5432/postgres]`` makes a
scratch database on that server (dropped after), ``--subscriptions`` ACTIVE rows each holding one
version, then ``--reads`` cycles, each on a subscription no other caller holds, and prints one JSON
line: the client's process CPU per read and the PostgreSQL server's (utime + stime of every process
of the server's uid, from /proc: the server must be on this machine, and anything else it runs at
the time counts too, so interleave runs to compare). ``--max-batch 1`` runs each call alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.content import ReadBody
from mcpsync.worker.main.connect import open_ledger
from mcpsync.worker.main.event_loop import run as run_on_loop
from mcpsync.workflows.digest import ContentPart, content_digest
from mcpsync.workflows.records.ledger import AcceptRequest, AcceptVerdict, AllocateRequest, MarkActiveRequest
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason

MIME = "text/markdown"
BODY = b"# unchanged\n" * 40
DIGEST = content_digest([ContentPart("text", MIME, BODY)])


def server_cpu_seconds(uid: int) -> float:
    """utime + stime of every live process of ``uid`` (the PostgreSQL server's backends and helpers)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / ticks


def server_uid(admin_url: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:  # its backend, alive while asked
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        return Path(f"/proc/{row[0]}").stat().st_uid


async def cycle(ledger: Ledger, key: SubscriptionKey, generation: int) -> AcceptVerdict:
    """One read cycle as ``McpSessionActivities.run_cycle`` makes it, the read itself left out."""
    ticket = await ledger.fence.allocate_read(AllocateRequest(
        key=key, session_generation=1, subscription_generation=generation, min_ordinal=1,
        request_id=f"{key.workflow_id}/{uuid.uuid4().hex}", trigger=TriggerReason.POLL,
        cycle_id=uuid.uuid4().hex))
    assert ticket.granted, ticket
    outcome = ReadOutcome(kind=ReadOutcomeKind.CONTENT, key=key, ordinal=ticket.ordinal,
                          request_id=ticket.request_id, session_generation=1,
                          subscription_generation=generation, trigger=TriggerReason.POLL,
                          content_digest=DIGEST, mime_type=MIME, size=len(BODY))
    result, _ = await ledger.fence.accept_judged(
        AcceptRequest(outcome=outcome, expected_state=SubscriptionState.ACTIVE, close_epoch=0),
        ReadBody(digest=DIGEST, mime_type=MIME, kind="text", body=BODY))
    return result.verdict


async def setup(ledger: Ledger, n: int) -> list[tuple[SubscriptionKey, int]]:
    keys = []
    for i in range(n):
        key = SubscriptionKey(subject="bench", server="srv", uri=f"demo://doc/{i}")
        await ledger.ensure_subscription(key, "inc-1")
        generation = (await ledger.begin_subscription(key, 1)).subscription_generation
        await ledger.fence.mark_active(MarkActiveRequest(
            key=key, session_generation=1, subscription_generation=generation, read_reports=True,
            safety_read_seconds=300.0))
        await cycle(ledger, key, generation)  # the version every later read finds unchanged
        keys.append((key, generation))
    return keys


async def measure(url: str, args: argparse.Namespace, uid: int) -> dict[str, object]:
    ledger = await open_ledger(url, max_size=args.concurrency)
    try:
        for name in ("_allocations", "_accepts"):
            if (coalescer := getattr(ledger.fence, name, None)) is not None and args.max_batch:
                coalescer.max_batch = args.max_batch
        keys = await setup(ledger, args.subscriptions)
        free: asyncio.Queue[tuple[SubscriptionKey, int]] = asyncio.Queue()
        for k in keys:
            free.put_nowait(k)
        verdicts: dict[str, int] = {}
        left = args.reads

        async def caller() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                key, generation = await free.get()
                verdict = await cycle(ledger, key, generation)
                verdicts[verdict.value] = verdicts.get(verdict.value, 0) + 1
                free.put_nowait((key, generation))

        pg0, cpu0, wall0 = server_cpu_seconds(uid), time.process_time(), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(args.concurrency)))
        pg, cpu, wall = server_cpu_seconds(uid) - pg0, time.process_time() - cpu0, time.perf_counter() - wall0
        batches = {name: (c.batches, c.largest) for name in ("_allocations", "_accepts")
                   if (c := getattr(ledger.fence, name, None)) is not None}
    finally:
        await ledger.pool.close()
    return {"reads": args.reads, "concurrency": args.concurrency, "max_batch": args.max_batch,
            "client_ms_per_read": round(cpu / args.reads * 1000, 3),
            "postgres_ms_per_read": round(pg / args.reads * 1000, 3),
            "reads_per_s": round(args.reads / wall, 1), "verdicts": verdicts, "batches": batches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--subscriptions", type=int, default=200)
    parser.add_argument("--reads", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-batch", type=int, default=0, help="the largest batch (0: as built)")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    name = f"ledger_cost_{os.getpid()}"
    with psycopg.connect(args.url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = psycopg.conninfo.make_conninfo(args.url, dbname=name)
        result = run_on_loop(measure(url, args, server_uid(args.url)))  # uvloop, as the ingress
    finally:
        with psycopg.connect(args.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    print(json.dumps({"label": args.label, **result}))


if __name__ == "__main__":
    main()
