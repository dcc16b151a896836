"""Benchmark: bad input never costs another subject anything (``mcpsync serve``'s per-subject quotas).

``python -m benchmarks.serve_quota [--reads 600] [--rounds 6] [--event-interval 0.1]`` starts PostgreSQL
(a fresh database on ``MCPSYNC_DATABASE_URL``'s server, else an embedded one), seeds the ledger directly
(no upstream, no Temporal: serve only reads the ledger) and runs ``mcpsync serve`` as a child process
with its default quotas, then, in one run:

1. *before*: subject B reads its one resource ``--reads`` times through serve (the ``mcp`` SDK,
   2026-07-28, over HTTP), one read at a time;
2. subject A (a process of its own) opens its full quota of ``subscriptions/listen`` streams, each
   naming the most URIs a listen may (A's own, then made-up ones), and of ``events/stream`` requests,
   and tries one more of each (its answer is printed);
3. ``--rounds`` rounds of B's reads (``--reads`` in all for each kind): with A holding its quota
   quietly, then while A's outbox gets an event every ``--event-interval`` seconds (each wakes all of
   A's streams and listens).

Prints one JSON document: B's read latency in the three phases and their ratios (the interleaved
rounds compare under the same load from the rest of the box), what A's extra streams were answered,
and the ledger transactions per A event (``pg_stat_database``, in a window of A's events alone, the
inserts and the statistics queries subtracted) before A opens anything and with its quota open.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from benchmarks.common import ratio, summarize
from benchmarks.ledger_seed import emit_event, seed_version
from benchmarks.postgres import server_url
from mcpsync.worker.main.connect import open_ledger
from mcpsync.worker.serve.quota import QuotaLimits
from mcpsync.worker.stack.common import REPO_ROOT

NOISY, QUIET, SERVER = "quota-a", "quota-b", "bench"
TOKENS = {NOISY: "token-a-for-the-benchmark", QUIET: "token-b-for-the-benchmark"}
A_RESOURCES = 20
STATS_FLUSH_S = 11.0
EVENTS_MEASURED = 30  # A's events in each window that counts ledger transactions


async def _client(stack: AsyncExitStack, url: str, token: str) -> McpClient:
    auth = {"Authorization": f"Bearer {token}"}
    http = await stack.enter_async_context(create_mcp_http_client(headers=auth))
    http.timeout = httpx2.Timeout(60)
    return await stack.enter_async_context(
        McpClient(streamable_http_client(url, http_client=http), mode="auto", cache=None))  # type: ignore[arg-type]


async def _reads(client: McpClient, uri: str, n: int) -> list[float]:
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        await client.read_resource(uri)
        took.append(time.perf_counter() - t0)
    return took


async def _xacts(conn: Any) -> int:
    # An idle backend (serve's pooled connections) flushes its counts within PGSTAT_IDLE_INTERVAL (10 s).
    await asyncio.sleep(STATS_FLUSH_S)
    cur = await conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database"
                             " WHERE datname = current_database()")
    row = await cur.fetchone()
    return int(row[0])


async def _stream(raw: httpx2.AsyncClient, url: str, headers: dict[str, str], id_: int,
                  first: asyncio.Future[dict[str, Any]]) -> None:
    """One events/stream request of A, read until cancelled. ``first``: ``{"open": true}`` once its SSE
    response has started, or the JSON-RPC error it was answered (as JSON or as its first SSE frame)."""
    body = {"jsonrpc": "2.0", "id": id_, "method": "events/stream",
            "params": {"name": "resource.changed", "cursor": None}}
    async with raw.stream("POST", url, json=body, headers=headers) as resp:
        if resp.headers.get("content-type", "").startswith("application/json"):
            first.set_result(json.loads(await resp.aread()))
            return
        lines = resp.aiter_lines()
        try:  # a refusal is the stream's first frame, at once; an open stream is quiet until an event
            while not (line := await asyncio.wait_for(anext(lines), 2.0)).startswith("data:"):
                pass
            frame = json.loads(line[5:])
            first.set_result(frame if "error" in frame else {"open": True})
        except TimeoutError:
            first.set_result({"open": True})
        async for _ in lines:
            pass


async def run(reads: int, rounds: int, event_interval: float) -> dict[str, Any]:
    limits = QuotaLimits()
    work = Path(tempfile.mkdtemp(prefix="mcpsync-bench-quota-"))
    async with AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        db_url = await server_url(stack, work)
        ledger = await open_ledger(db_url, max_size=2)
        stack.push_async_callback(ledger.pool.close)
        quiet_uri = "demo://quota/b.md"
        await seed_version(ledger.pool, QUIET, SERVER, "ACTIVE", quiet_uri, b"# B's one resource")
        a_receipts = [await seed_version(ledger.pool, NOISY, SERVER, "ACTIVE", f"demo://quota/a{i}.md",
                                         f"# A {i}".encode()) for i in range(A_RESOURCES)]
        conf = work / "mcpsync.toml"
        conf.write_text(f'[database]\nurl = "{db_url}"\n')
        env = {k: v for k, v in os.environ.items() if k != "MCPSYNC_DATABASE_URL"}
        env["MCPSYNC_SERVE_TOKENS"] = json.dumps(TOKENS)
        serve = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mcpsync.worker.cli", "--config", str(conf), "serve", "--port", "0",
            "--consumer", "bench-quota", cwd=REPO_ROOT, env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
        stack.push_async_callback(serve.wait)
        stack.callback(serve.terminate)
        assert serve.stdout is not None
        url = (await asyncio.wait_for(serve.stdout.readline(), 60)).decode().rsplit(" ", 1)[-1].strip()

        quiet = await _client(stack, url, TOKENS[QUIET])
        await _reads(quiet, quiet_uri, 20)  # warm-up: connections, plans
        stats = await stack.enter_async_context(ledger.pool.connection())
        before = await _reads(quiet, quiet_uri, reads)
        emitted = 0

        async def emit(count: int | None = None) -> None:
            nonlocal emitted
            async with ledger.pool.connection() as conn:
                for _ in itertools.count() if count is None else range(count):
                    await emit_event(conn, a_receipts[emitted % A_RESOURCES])
                    emitted += 1
                    await asyncio.sleep(event_interval)

        async def transactions_per_event(count: int) -> float:
            """Ledger transactions per A event with nothing else running (the inserts and the
            statistics queries subtracted)."""
            x = await _xacts(stats)
            await emit(count)
            await asyncio.sleep(1.0)  # the last events reach every stream
            return round((await _xacts(stats) - x - 1 - count) / count, 2)  # less the stats query itself

        unheld_cost = await transactions_per_event(EVENTS_MEASURED)

        # A's full quota of streams, held by a process of its own (its notifications are not read in
        # this process, where B's latency is measured).
        noisy = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.serve_quota", "--noisy", url, cwd=REPO_ROOT,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        stack.push_async_callback(noisy.wait)
        stack.callback(_close_stdin, noisy)
        assert noisy.stdout is not None
        held = json.loads(await asyncio.wait_for(noisy.stdout.readline(), 120))
        await asyncio.sleep(0.5)  # every stream past its first poll, waiting on the outbox

        # Rounds of B's reads with A quiet, then with A's events flowing: the box's other load falls
        # on both alike.
        idle: list[float] = []
        loaded: list[float] = []
        chunk = max(1, reads // rounds)
        emitted = 0
        for _ in range(rounds):
            idle += await _reads(quiet, quiet_uri, chunk)
            emitter = asyncio.create_task(emit())
            loaded += await _reads(quiet, quiet_uri, chunk)
            emitter.cancel()
            await asyncio.gather(emitter, return_exceptions=True)
            await asyncio.sleep(0.5)  # the last event's fan-out is over before the quiet reads
        events_during_reads = emitted
        held_cost = await transactions_per_event(EVENTS_MEASURED)
        base, quiet_hold, load = summarize(before), summarize(idle), summarize(loaded)
        return {
            "quotas": {"listens": limits.listens, "listen_uris": limits.listen_uris,
                       "event_streams": limits.event_streams},
            **held,
            "b_read_before_a": base,
            "b_read_a_holding_quiet": quiet_hold,
            "b_read_a_holding_with_events": load,
            "p99_ratio_holding_quiet_vs_before": ratio(quiet_hold["p99_ms"], base["p99_ms"]),
            "p50_ratio_with_events_vs_quiet": ratio(load["p50_ms"], quiet_hold["p50_ms"]),
            "p99_ratio_with_events_vs_quiet": ratio(load["p99_ms"], quiet_hold["p99_ms"]),
            "p99_ratio_with_events_vs_before": ratio(load["p99_ms"], base["p99_ms"]),
            "a_events_during_reads": events_during_reads,
            "a_events_per_second": round(1 / event_interval, 1),
            "ledger_transactions_per_a_event_no_stream_open": unheld_cost,
            "ledger_transactions_per_a_event_quota_open": held_cost,
        }


def _close_stdin(proc: asyncio.subprocess.Process) -> None:
    if proc.stdin is not None:
        proc.stdin.close()


async def hold_quota(url: str) -> None:
    """Subject A's side (``--noisy URL``): its full quota of listens (the most URIs each) and of event
    streams, one more of each (its answer), one JSON line on stdout once all are open; held until stdin
    closes."""
    limits = QuotaLimits()
    async with AsyncExitStack() as stack:
        noisy = await _client(stack, url, TOKENS[NOISY])
        wanted = [f"demo://quota/a{i}.md" for i in range(A_RESOURCES)]
        wanted += [f"demo://quota/none-{i:05d}" for i in range(limits.listen_uris - len(wanted))]
        for _ in range(limits.listens):
            await stack.enter_async_context(noisy.listen(resource_subscriptions=wanted))
        try:
            async with noisy.listen(resource_subscriptions=wanted):
                extra_listen: Any = "accepted"
        except MCPError as exc:
            extra_listen = {"code": exc.code, "message": exc.message}
        raw = await stack.enter_async_context(httpx2.AsyncClient(
            timeout=60, limits=httpx2.Limits(max_connections=limits.event_streams + 8)))
        headers = {"Authorization": f"Bearer {TOKENS[NOISY]}",
                   "Accept": "application/json, text/event-stream"}
        headers["mcp-session-id"] = await _legacy_session(raw, url, headers)
        loop = asyncio.get_running_loop()
        firsts: list[asyncio.Future[dict[str, Any]]] = [loop.create_future()
                                                       for _ in range(limits.event_streams + 1)]
        streams = [asyncio.create_task(_stream(raw, url, headers, 100 + i, firsts[i]))
                   for i in range(limits.event_streams)]
        stack.push_async_callback(_cancel_all, streams)
        opened = await asyncio.wait_for(asyncio.gather(*firsts[:-1]), 60)
        extra = asyncio.create_task(_stream(raw, url, headers, 99, firsts[-1]))
        extra_stream = (await asyncio.wait_for(firsts[-1], 60)).get("error", "accepted")
        await asyncio.gather(extra, return_exceptions=True)
        print(json.dumps({"a_listens_open": limits.listens, "a_extra_listen": extra_listen,
                          "a_streams_open": sum(1 for f in opened if f.get("open")),
                          "a_extra_event_stream": extra_stream}), flush=True)
        await asyncio.to_thread(sys.stdin.read)


async def _legacy_session(raw: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> str:
    """A 2025-11-25 session (initialize, initialized): events/stream requests go on it."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}
    session = (await raw.post(url, json=init, headers=headers)).headers["mcp-session-id"]
    await raw.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                   headers={**headers, "mcp-session-id": session})
    return str(session)


async def _cancel_all(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve_quota", description=__doc__.split("\n\n")[0])
    p.add_argument("--reads", type=int, default=600, help="B's reads per phase (default 600)")
    p.add_argument("--rounds", type=int, default=6,
                   help="rounds of B's reads with A quiet, then with A's events (default 6)")
    p.add_argument("--event-interval", type=float, default=0.1,
                   help="seconds between A's outbox events while they flow (default 0.1)")
    p.add_argument("--noisy", metavar="URL", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.noisy is not None:
        asyncio.run(hold_quota(args.noisy))
        return
    print(json.dumps(asyncio.run(run(args.reads, args.rounds, args.event_interval)), indent=2))


if __name__ == "__main__":
    main()
