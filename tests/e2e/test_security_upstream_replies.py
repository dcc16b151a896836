"""Hostile upstream replies against what they may become once parsed, and requests that time out.

- A 60 MB reply of ``[],[],...`` inside ``_meta`` (valid JSON under the default byte limit, about
  20 million values: 7 GB once the SDK parsed it) from a hostile server (tests/servers/hostile_server.py)
  over streamable HTTP with JSON responses, with SSE responses and over stdio, read by a real
  ``mcpsync worker`` process: each read ends MALFORMED, once, with the reason in the audit, and the
  worker's peak RSS (VmHWM) rises by less than 100 MB.
- A server that never answers one read: 120 reads of it time out, then the session still answers a
  normal read at once, and the timed-out requests' connections and tasks are gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from temporalio.client import Client as TemporalClient

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.worker.ingress.reply_shape import READ_VALUES
from mcpsync.worker.ingress.transport import HTTP_CONNECTIONS, server_transport
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.stack.common import REPO_ROOT
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.records.subscription import SubscriptionKey
from tests import cli_process
from tests.conftest import eventually, ledger_rows, unique
from tests.e2e.test_e2e_subscription import _wait_record

HOSTILE = Path(__file__).parents[1] / "servers" / "hostile_server.py"
MB = 1024 * 1024
GUARD_MB = 600  # past this growth the worker is killed: the test has failed, the box must not swap


def _status_kb(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@contextmanager
def _rss_guard(pid: int) -> Iterator[list[str]]:
    """Kill ``pid`` (SIGKILL) if its RSS grows by more than GUARD_MB while the block runs; the list
    holds what happened, for the test's failure message."""
    base, done, killed = _status_kb(pid, "VmRSS"), threading.Event(), []

    def watch() -> None:
        while not done.wait(0.01):
            try:
                grown = _status_kb(pid, "VmRSS") - base
            except (OSError, AssertionError):
                return
            if grown > GUARD_MB * 1024:
                os.kill(pid, signal.SIGKILL)
                killed.append(f"the worker's RSS grew by {grown // 1024} MB: killed")
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield killed
    finally:
        done.set()
        thread.join()


def _spawn(argv: list[str], log: BinaryIO | None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT if log else None,
                            stdin=subprocess.DEVNULL, env=cli_process.without_database_url())


def _config(path: Path, temporal: TemporalDevServer, db_url: str, queue: str, port: int, ctl: Path,
            names: dict[str, str]) -> None:
    servers = "".join(
        f'[[servers]]\nname = "{names[label]}"\ntransport = "http"\nurl = "http://127.0.0.1:{port}/{label}"\n'
        f'subjects = ["alice"]\n\n' for label in ("json", "sse"))
    servers += (f'[[servers]]\nname = "{names["stdio"]}"\ntransport = "stdio"\n'
                f'command = {json.dumps([sys.executable, str(HOSTILE), str(ctl)])}\nsubjects = ["alice"]\n')
    path.write_text(f'[temporal]\naddress = "{temporal.address}"\ntask_queue = "{queue}"\n\n'
                    f'[database]\nurl = "{db_url}"\n\n' + servers)


async def test_a_sixty_megabyte_reply_of_empty_lists_is_refused_before_it_is_parsed(
        temporal_client: TemporalClient, temporal_server: TemporalDevServer, ledger: Ledger,
        database_url: str, tmp_path: Path) -> None:
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    http = _spawn([sys.executable, str(HOSTILE), str(ctl), "--http"], None)
    names = {label: unique(f"hostile-{label}") for label in ("json", "sse", "stdio")}
    queue = unique("upstreamq")
    config = tmp_path / "mcpsync.toml"
    log = (tmp_path / "worker.log").open("wb")
    worker = None
    try:
        port = int(await eventually(lambda: (ctl / "port").exists() and (ctl / "port").read_text(),
                                    what="the hostile HTTP server's port"))
        _config(config, temporal_server, database_url, queue, port, ctl, names)
        worker = _spawn([sys.executable, "-m", "mcpsync.worker.cli", "--config", str(config), "worker"], log)
        oks = [SubscriptionKey(subject="alice", server=name, uri="hostile://ok") for name in names.values()]
        handles = [await start_subscription(temporal_client, key, task_queue=queue) for key in oks]
        for handle in handles:  # every session is open and has read once: the worker at its working size
            await _wait_record(handle, lambda r: r.last_accepted_digest is not None, "a first read",
                               timeout=60)
        before = _status_kb(worker.pid, "VmHWM")
        bombs = {label: SubscriptionKey(subject="alice", server=name, uri="hostile://bomb")
                 for label, name in names.items()}
        started = time.monotonic()
        with _rss_guard(worker.pid) as killed:
            for key in bombs.values():
                await start_subscription(temporal_client, key, task_queue=queue)

            async def refused() -> list[tuple[str, dict[str, object]]] | None:
                assert not killed, killed
                rows = await ledger_rows(
                    ledger, "SELECT workflow_id, detail FROM audit WHERE kind = 'READ_FAILED'"
                    " AND workflow_id = ANY(%s)", [k.workflow_id for k in bombs.values()])
                return rows if len(rows) == len(bombs) else None

            rows = await eventually(refused, timeout=60, what="a READ_FAILED audit row per transport")
            elapsed = time.monotonic() - started
        grown_mb = (_status_kb(worker.pid, "VmHWM") - before) / 1024
        for workflow_id, detail in rows:
            assert detail["outcome"] == "malformed", (workflow_id, detail)
            assert f"more than {READ_VALUES} JSON values" in str(detail["error"]), (workflow_id, detail)
        for label in bombs:
            reads = (ctl / f"reads-bomb-{label}").read_text().count("read")
            assert reads == 1, f"{label}: the bomb was read {reads} times: a refused reply is final"
        print(f"\n3 bombs refused in {elapsed:.1f} s; worker VmHWM {before // 1024} MB, +{grown_mb:.0f} MB")
        assert grown_mb < 100, f"the worker's peak RSS rose by {grown_mb:.0f} MB"
    finally:
        for proc in (worker, http):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (worker, http):
            if proc is not None:
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
        log.close()


INIT = {"protocolVersion": "2025-11-25", "capabilities": {"resources": {}},
        "serverInfo": {"name": "silent", "version": "1"}}
TIMED_OUT_READS = HTTP_CONNECTIONS + 20


class _Silent:
    """A streamable-HTTP server (JSON responses) that never answers a read of ``demo://never``;
    ``open`` counts its connections that are still open, ``cancels`` the cancel frames POSTed."""

    def __init__(self) -> None:
        self.open = self.cancels = 0

    async def conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                msg = json.loads(await reader.readexactly(int(headers.get("content-length", "0"))) or b"{}")
                self.cancels += msg.get("method") == "notifications/cancelled"
                if "id" not in msg or lines[0].split()[0] != "POST":
                    writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                if msg["method"] == "resources/read" and msg["params"]["uri"] == "demo://never":
                    await reader.read()  # until the client closes the connection
                    return
                result = INIT if msg["method"] == "initialize" else {
                    "contents": [{"uri": "demo://ok", "text": "fine"}]}
                reply = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             + f"content-length: {len(reply)}\r\n\r\n".encode() + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


@pytest.fixture
async def silent_http() -> AsyncIterator[tuple[str, _Silent]]:
    silent = _Silent()
    server = await asyncio.start_server(silent.conn, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/mcp", silent
    finally:
        server.close()


async def test_a_timed_out_request_releases_its_connection_and_task(silent_http: tuple[str, _Silent]) -> None:
    url, silent = silent_http
    cfg = ServerConfig(name="silent", transport="http", url=url)
    async with Client(server_transport(cfg, "alice"), mode="legacy", cache=None,  # type: ignore[arg-type]
                      read_timeout_seconds=0.3) as client:
        tasks = len(asyncio.all_tasks())
        results = await asyncio.gather(
            *(client.read_resource("demo://never") for _ in range(TIMED_OUT_READS)), return_exceptions=True)
        assert all(isinstance(r, MCPError) and r.code == -32001 for r in results), {repr(r) for r in results}
        started = time.monotonic()
        ok = await asyncio.wait_for(client.read_resource("demo://ok"), 5)
        assert ok.contents[0].text == "fine"  # type: ignore[union-attr]
        assert time.monotonic() - started < 1, "the session answers at once after the timed-out reads"
        await eventually(lambda: silent.open <= 2, timeout=5,
                         what=f"the timed-out reads' connections closed (open: {silent.open})")
        await eventually(lambda: len(asyncio.all_tasks()) <= tasks + 2, timeout=5,
                         what=f"the timed-out reads' tasks gone ({len(asyncio.all_tasks())} vs {tasks})")
        assert silent.cancels == 0, "the closed connection is the cancellation: no frame queues for one"
