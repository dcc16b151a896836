"""Benchmark of ``mcpsync serve``: upstream change → a downstream client has read the new content.

``python -m benchmarks.serve --listeners 100 --changes 20`` starts its own stack (Temporal dev server,
PostgreSQL: ``MCPSYNC_DATABASE_URL`` or an embedded one, the fixture upstream over HTTP, mcpsync's
services in this process) and ``mcpsync serve`` as a child process, then:

- one *measuring* downstream client (``mcp`` SDK, 2025-11-25, subscribed through serve) reads on
  every ``updated`` notification until it has the new digest; latency = upstream edit committed →
  that read returned the new bytes (digest checked);
- next to it, in the same run, a *direct* client subscribed to the upstream itself, which reads on
  every notification: the floor a client without mcpsync sees (no proof, no receipt);
- ``--listeners`` more downstream clients subscribed through serve, each counting notifications:
  every change must reach every listener;
- serve's CPU (``/proc/<pid>/stat`` utime + stime) over the churn, per delivered notification.

Prints one JSON document (p50/p99 in ms for both paths, deliveries, CPU per notification).
Keep ``--listeners`` ≤ 100 on a shared box; 1,000 once for the record (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPDeprecationWarning

from benchmarks.common import percentile, temporal_and_ledger, until
from benchmarks.postgres import server_url
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import Config, ServerConfig, TemporalConfig
from mcpsync.worker.main.services import run_services
from mcpsync.worker.serve.server import FRESHNESS_META
from mcpsync.worker.stack.common import REPO_ROOT
from mcpsync.workflows.records.subscription import SubscriptionKey

SUBJECT = "bench"
TOKEN = "bench-token-0123456789"
URI = "demo://bench/serve.md"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# serve under cProfile: the CLI ends with os._exit (no interpreter teardown), so the stats are written
# in front of it. argv: PATH, then the CLI's arguments.
_PROFILED = """
import cProfile, os, sys
path, sys.argv = sys.argv[1], ["mcpsync", *sys.argv[2:]]
profiler, exit_now = cProfile.Profile(), os._exit
def _exit(code):
    profiler.disable()
    profiler.dump_stats(path)
    exit_now(code)
os._exit = _exit
from mcpsync.worker.cli.root import main
profiler.enable()
main()
"""


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class _Reader:
    """A client that reads ``URI`` on every updated notification and records when a digest first appears."""

    def __init__(self, digest_of: Any) -> None:
        self.digest_of = digest_of
        self.seen: dict[str, float] = {}
        self.client: McpClient | None = None
        self._wake = asyncio.Event()

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self._wake.set()

    async def run(self) -> None:
        assert self.client is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            read = await self.client.read_resource(URI)
            digest = self.digest_of(read)
            if digest is not None:
                self.seen.setdefault(digest, time.monotonic())


async def _both_saw(digest: str, *readers: _Reader) -> bool:
    return all(digest in r.seen for r in readers)


async def _client(stack: AsyncExitStack, url: str, token: str | None, handler: Any) -> McpClient:
    headers = {"Authorization": f"Bearer {token}"} if token else None
    hc = await stack.enter_async_context(create_mcp_http_client(headers=headers))
    return await stack.enter_async_context(
        McpClient(
            streamable_http_client(url, http_client=hc), mode="legacy", cache=None, message_handler=handler
        )
    )


async def run(listeners: int, changes: int, interval: float, profile: Path | None = None) -> dict[str, Any]:
    with warnings.catch_warnings():  # resources/subscribe on purpose: the 2025-11-25 path is measured
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        return await _run(listeners, changes, interval, profile)


async def _run(listeners: int, changes: int, interval: float, profile: Path | None) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="mcpsync-bench-serve-"))
    async with AsyncExitStack() as stack:
        stack.callback(shutil.rmtree, work, True)
        db_url = await server_url(stack, work)
        temporal, client, ledger = await temporal_and_ledger(stack, work / "temporal", db_url)
        fx = await FixtureProcess.start_http(work / "fx", seed="none")
        stack.push_async_callback(fx.stop)
        server = ServerConfig(name="bench", transport="http", url=fx.mcp_url, subjects=[SUBJECT])
        config = Config(
            temporal=TemporalConfig(address=temporal.address, task_queue="bench-serve"), servers=[server]
        )
        services = asyncio.create_task(run_services(config, client, ledger))
        stack.callback(services.cancel)
        first = await fx.create(URI, text="v0", mime_type="text/plain")
        await start_subscription(
            client, SubscriptionKey(subject=SUBJECT, server="bench", uri=URI), task_queue="bench-serve"
        )
        conf = work / "mcpsync.toml"
        conf.write_text(f'[database]\nurl = "{db_url}"\n')
        env = {k: v for k, v in os.environ.items() if k != "MCPSYNC_DATABASE_URL"}
        env["MCPSYNC_SERVE_TOKENS"] = json.dumps({SUBJECT: TOKEN})
        launcher = ("-c", _PROFILED, str(profile)) if profile is not None else ("-m", "mcpsync.worker.cli")
        serve = await asyncio.create_subprocess_exec(
            sys.executable,
            *launcher,
            "--config",
            str(conf),
            "serve",
            "--port",
            "0",
            "--consumer",
            "bench-serve",
            "--client-buffer",
            "4096",
            cwd=REPO_ROOT,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        stack.push_async_callback(serve.wait)
        stack.callback(serve.terminate)
        assert serve.stdout is not None
        serve_url = (await asyncio.wait_for(serve.stdout.readline(), 60)).decode().rsplit(" ", 1)[-1].strip()

        def serve_digest(read: types.ReadResourceResult) -> str | None:
            return (read.meta or {}).get(FRESHNESS_META, {}).get("digest")

        def direct_digest(read: types.ReadResourceResult) -> str | None:
            part = read.contents[0]
            return expected_by_text.get(part.text) if isinstance(part, types.TextResourceContents) else None

        expected_by_text: dict[str, str] = {}
        via_serve, direct = _Reader(serve_digest), _Reader(direct_digest)
        via_serve.client = await _client(stack, serve_url, TOKEN, via_serve.on_message)
        direct.client = await _client(stack, fx.mcp_url, None, direct.on_message)
        deadline = time.monotonic() + 60
        while True:  # serve lists it once the first version is accepted
            if (await via_serve.client.list_resources()).resources or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        for reader in (via_serve, direct):
            await reader.client.subscribe_resource(URI)  # type: ignore[union-attr]
        tasks = [asyncio.create_task(via_serve.run()), asyncio.create_task(direct.run())]
        counts = [0] * listeners

        def counter(i: int) -> Any:
            async def handler(message: Any) -> None:
                if isinstance(message, types.ResourceUpdatedNotification):
                    counts[i] += 1

            return handler

        t_connect = time.monotonic()
        sem = asyncio.Semaphore(32)
        stop = asyncio.Event()
        subscribed = 0

        async def listener(i: int) -> None:  # enters and exits its client in its own task (anyio scopes)
            nonlocal subscribed
            async with AsyncExitStack() as own:
                async with sem:
                    c = await _client(own, serve_url, TOKEN, counter(i))
                    await c.subscribe_resource(URI)
                    subscribed += 1
                await stop.wait()

        listener_tasks = [asyncio.create_task(listener(i)) for i in range(listeners)]
        while subscribed < listeners:
            failed = [t for t in listener_tasks if t.done()]
            if failed:
                failed[0].result()
            await asyncio.sleep(0.05)
        connect_s = time.monotonic() - t_connect
        await asyncio.sleep(1.0)
        baseline = list(counts)
        cpu0 = _cpu_seconds(serve.pid)
        edits: list[tuple[str, float]] = []
        for i in range(changes):
            text = f"v{i + 1} {time.time()}"
            t0 = time.monotonic()
            edit = await fx.edit(URI, text=text, mime_type="text/plain")
            digest = edit["committed"]["digest"]
            expected_by_text[text] = digest
            edits.append((digest, t0))
            await asyncio.sleep(interval)
        await until(lambda: _both_saw(edits[-1][0], via_serve, direct), timeout=60, interval=0.1)

        async def every_listener_saw_every_change() -> bool:
            return all(c - b >= changes for c, b in zip(counts, baseline, strict=True))

        await until(every_listener_saw_every_change, timeout=2.0, interval=0.05)  # at most 2 s for stragglers
        cpu = _cpu_seconds(serve.pid) - cpu0
        stop.set()
        await asyncio.gather(*listener_tasks, return_exceptions=True)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        serve_ms = [(via_serve.seen[d] - t0) * 1000 for d, t0 in edits if d in via_serve.seen]
        direct_ms = [(direct.seen[d] - t0) * 1000 for d, t0 in edits if d in direct.seen]
        delivered = sum(c - b for c, b in zip(counts, baseline, strict=True))
        del first
        return {
            "listeners": listeners,
            "changes": changes,
            "interval_s": interval,
            "listener_connect_s": round(connect_s, 2),
            "serve_read_ms": {
                "p50": percentile(serve_ms, 50),
                "p99": percentile(serve_ms, 99),
                "n": len(serve_ms),
            },
            "direct_read_ms": {
                "p50": percentile(direct_ms, 50),
                "p99": percentile(direct_ms, 99),
                "n": len(direct_ms),
            },
            "listener_notifications": delivered,
            "listeners_missing_notifications": sum(
                1 for c, b in zip(counts, baseline, strict=True) if c == b
            ),
            "serve_cpu_s": round(cpu, 3),
            "serve_cpu_ms_per_notification": round(cpu * 1000 / max(1, delivered + len(serve_ms)), 3),
        }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--listeners", type=int, default=100, help="downstream listeners through serve (default 100)"
    )
    p.add_argument("--changes", type=int, default=20, help="upstream edits (default 20)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between edits (default 0.5)")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="PATH",
        help="run serve under cProfile and write its stats to PATH (python -m pstats PATH)",
    )
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(run(args.listeners, args.changes, args.interval, args.profile)), indent=2))


if __name__ == "__main__":
    main()
