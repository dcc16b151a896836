"""Interop with MCP servers nobody here wrote, on the real stack (Temporal dev server, PostgreSQL).

- ``@modelcontextprotocol/server-everything`` (npm, installed by ``scripts/install-npm-servers``
  into ``.state/npm``) over stdio and streamable HTTP, edition 2025-11-25: subscribe to two of
  its static documents and one dynamic resource, converge to the digest of a direct read,
  nudge updates on mcpsync's own session, tombstone a URI it never had and a session
  resource that disappears with its session, close cleanly.
- A tiny ``mcp.server.mcpserver.MCPServer`` over streamable HTTP: 2026-07-28 through
  ``subscriptions/listen`` (an edit by another client reaches mcpsync's stream), and what
  mcpsync does when the same server is configured for 2025-11-25 (no subscribe: polling).

server-everything keeps its simulated updates per MCP session: ``toggle-subscriber-updates``
only affects the session that calls it (stdio: the process; HTTP: the Mcp-Session-Id). No
outside client can make it notify mcpsync's session, so these tests run the session host
themselves and call the tool over the host's live session, as an operator's tool would.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
import signal
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from temporalio.client import Client as TemporalClient
from temporalio.client import WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.mcp_session import classify_error, read_digest
from mcpsync.activities.starters import start_subscription
from mcpsync.activities.workflow_updates import execute_update
from mcpsync.worker.ingress.session_host import SessionHost
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.names import QUERY_SUBSCRIPTION, UPDATE_CLOSE
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.mcp_calls import ReadOutcomeKind
from mcpsync.workflows.records.subscription import (
    CloseReceipt,
    CloseRequest,
    SubscriptionKey,
    SubscriptionState,
    TriggerReason,
)
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from tests.conftest import eventually, running_services, unique
from tests.e2e.conftest import ingress_settled, notifications_seen

ROOT = Path(__file__).resolve().parents[2]
NPM_PREFIX = Path(os.environ.get("MCPSYNC_NPM_PREFIX", ROOT / ".state" / "npm"))
EVERYTHING = NPM_PREFIX / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
DOC_PREFIX = "demo://resource/static/document/"
SUBJECT = "alice"


def everything_entry() -> Path:
    """server-everything's entry point; a clear failure (not a skip) when the install step was not run."""
    if not EVERYTHING.is_file():
        pytest.fail(f"{EVERYTHING} is missing: run scripts/install-npm-servers (scripts/bootstrap runs it)")
    return EVERYTHING


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_port(port: int, proc: asyncio.subprocess.Process, timeout: float = 15.0) -> None:
    async def up() -> bool:
        if proc.returncode is not None:
            raise AssertionError(f"server process exited with {proc.returncode} before listening on {port}")
        try:
            _r, w = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            return False
        w.close()
        return True

    await eventually(up, timeout=timeout, interval=0.05, what=f"a server listening on port {port}")


class NodeHttpServer:
    """server-everything over streamable HTTP on a fixed port; restartable (a new process, same URL)."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log = tmp / f"everything-{self.port}.log"
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                "node", str(everything_entry()), "streamableHttp", env={**os.environ, "PORT": str(self.port)},
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            )
        await wait_port(self.port, self.proc)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()


def stdio_children(marker: str) -> list[int]:
    """Pids of this process's children whose environment carries ``MCPSYNC_INTEROP_TAG=<marker>``."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == me and f"MCPSYNC_INTEROP_TAG={marker}".encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


@asynccontextmanager
async def hosted(client: TemporalClient, ledger: Ledger,
                 server: ServerConfig) -> AsyncIterator[tuple[str, SessionHost]]:
    """The main worker (``running_services``) plus the session host of (SUBJECT, server), held by the test."""
    async with running_services(client, ledger, []) as cfg:
        host = SessionHost(server, SUBJECT, ledger, client)
        task = asyncio.create_task(host.run(), name=f"test-host:{server.name}")
        try:
            await eventually(lambda: host.live is not None, timeout=30,
                             what=f"a live session to {server.name}")
            yield cfg.temporal.task_queue, host
        finally:
            host.stop()
            task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await task


async def record(handle: WorkflowHandle) -> ResourceSubscriptionV1:
    rec: ResourceSubscriptionV1 = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
    return rec


async def wait_record(handle: WorkflowHandle, pred: Callable[[ResourceSubscriptionV1], bool], what: str,
                      timeout: float = 30.0) -> ResourceSubscriptionV1:
    async def check() -> ResourceSubscriptionV1 | None:
        rec = await record(handle)
        return rec if pred(rec) else None

    result: ResourceSubscriptionV1 = await eventually(check, timeout=timeout, interval=0.1, what=what)
    return result


async def outbox_for(ledger: Ledger, key: SubscriptionKey) -> list[dict[str, Any]]:
    return [dict(r) for r in await ledger.reports.outbox_after(0, 100_000)
            if r["workflow_id"] == key.workflow_id]


async def close(handle: WorkflowHandle) -> CloseReceipt:
    receipt: CloseReceipt = await execute_update(handle, UPDATE_CLOSE, [CloseRequest(reason="interop test")],
                                                 result_type=CloseReceipt)
    return receipt


# --- server-everything -------------------------------------------------------------------------


@pytest.fixture(params=["stdio", "http"])
async def everything(request: pytest.FixtureRequest,
                     tmp_path: Path) -> AsyncIterator[tuple[ServerConfig, Any]]:
    """(config, restart): the server config and an async callable that loses the host's session."""
    marker = uuid.uuid4().hex
    common: dict[str, Any] = dict(name=unique("everything"), edition="2025-11-25", subjects=[SUBJECT],
                                  ping_interval_seconds=1.0, ping_timeout_seconds=3.0,
                                  read_timeout_seconds=10.0)
    if request.param == "stdio":
        cfg = ServerConfig(transport="stdio", command=["node", str(everything_entry()), "stdio"],
                           env={"MCPSYNC_INTEROP_TAG": marker}, **common)

        async def lose_session() -> None:
            pids = stdio_children(marker)
            assert pids, "the session host's server-everything process was not found"
            for pid in pids:  # processes this test's session host started
                os.kill(pid, signal.SIGKILL)

        yield cfg, lose_session
        return
    node = NodeHttpServer(tmp_path)
    await node.start()

    async def restart() -> None:
        await node.stop()
        await node.start()

    try:
        yield ServerConfig(transport="http", url=node.url, **common), restart
    finally:
        await node.stop()


def direct_client(cfg: ServerConfig) -> Client:
    if cfg.transport == "stdio":
        server: Any = StdioServerParameters(command=cfg.command[0], args=cfg.command[1:])
    else:
        server = cfg.url
    return Client(server, mode="legacy", cache=None)


async def test_everything_subscribe_converge_nudge_tombstone_close(
        temporal_client: TemporalClient, ledger: Ledger, everything: tuple[ServerConfig, Any]) -> None:
    server, lose_session = everything
    missing = f"{DOC_PREFIX}mcpsync-missing-{uuid.uuid4().hex[:8]}.md"

    # What the server says to a client of our own: the documents, their digests, its not-found.
    async with direct_client(server) as direct:
        assert direct.protocol_version == "2025-11-25"
        caps = direct.server_capabilities.resources
        assert caps is not None and caps.subscribe and caps.list_changed
        listed = [r.uri for r in (await direct.list_resources()).resources]
        docs = [u for u in listed if u.startswith(DOC_PREFIX)][:2]
        assert len(docs) == 2, listed
        expected = {u: read_digest(await direct.read_resource(u)) for u in docs}
        with pytest.raises(MCPError) as not_found:
            await direct.read_resource(missing)
        with pytest.raises(MCPError) as internal:
            await direct.read_resource("demo://resource/dynamic/text/not-a-number")
    # An internal error says nothing about the resource (no deletion, no malformed body): TRANSIENT,
    # a REJECTED read with a READ_FAILED audit; the next notification, poll or safety read tries again.
    assert internal.value.code == -32603 and classify_error(internal.value) == ReadOutcomeKind.TRANSIENT
    assert not_found.value.code == -32602
    assert not_found.value.message.startswith("MCP error -32602: Resource ") \
        and "not found" in not_found.value.message
    assert classify_error(not_found.value) == ReadOutcomeKind.NOT_FOUND

    dynamic = "demo://resource/dynamic/text/7"  # content carries the server's clock (1 s resolution)
    async with hosted(temporal_client, ledger, server) as (task_queue, host):
        keys = {u: SubscriptionKey(subject=SUBJECT, server=server.name, uri=u) for u in [*docs, dynamic]}
        handles = {u: await start_subscription(temporal_client, k, task_queue=task_queue)
                   for u, k in keys.items()}
        for uri in docs:
            rec = await wait_record(handles[uri], lambda r, u=uri: r.state == SubscriptionState.ACTIVE
                                    and r.last_accepted_digest == expected[u], f"{uri} converged")
            assert rec.edition == "2025-11-25"
            assert rec.capabilities == {"subscribe": True, "listChanged": True}
            assert rec.staleness_bound_seconds is None  # real subscriptions, no polling
            rows = await outbox_for(ledger, keys[uri])
            assert [r["content_digest"] for r in rows] == [expected[uri]]
        await wait_record(handles[dynamic], lambda r: r.last_accepted_digest is not None,
                          "dynamic resource read")
        # Models the server's clock, which ticks in whole seconds (the dynamic resource's content is
        # that clock): after 1.1 s its next read falls in a later second, so it is a new version.
        await asyncio.sleep(1.1)

        # Nudge: server-everything notifies only the session that toggled, so toggle on the host's session.
        live = host.live
        assert live is not None
        result = await live.client.call_tool("toggle-subscriber-updates", {})
        assert not result.is_error
        try:
            for uri in docs:  # an updated notification -> a fenced read -> same digest -> UNCHANGED receipt
                await eventually(lambda u=uri: _has_receipt(ledger, keys[u], AcceptVerdict.UNCHANGED,
                                                            TriggerReason.UPDATED),
                                 timeout=15, what=f"an UNCHANGED receipt after an update of {uri}")
            # The dynamic resource changes every second: the update yields a new version and outbox row.
            await eventually(lambda: _outbox_count(ledger, keys[dynamic], 2), timeout=15,
                             what="a second version of the dynamic resource")
        finally:
            await live.client.call_tool("toggle-subscriber-updates", {})  # switch the server back off
        for uri in docs:
            assert [r["content_digest"] for r in await outbox_for(ledger, keys[uri])] == [expected[uri]]
            fence = await ledger.load_fence(keys[uri])
            assert fence.last_accepted_digest == expected[uri] and fence.watermark >= 2

        # A URI the server never had: subscribe is acknowledged, the read says -32602 -> TOMBSTONE_PENDING.
        mkey = SubscriptionKey(subject=SUBJECT, server=server.name, uri=missing)
        mhandle = await start_subscription(temporal_client, mkey, task_queue=task_queue)
        await wait_record(mhandle, lambda r: r.state == SubscriptionState.TOMBSTONE_PENDING,
                          "missing URI tombstoned")
        assert await outbox_for(ledger, mkey) == []
        assert [r.status for r in await ledger.reports.receipts(mkey)] == [AcceptVerdict.TOMBSTONE_PENDING]

        # A template URI with a bad id answers -32603 "Unknown resource": an internal error is no
        # proof of absence, so the read is rejected (READ_FAILED audit) and nothing is tombstoned.
        bkey = SubscriptionKey(subject=SUBJECT, server=server.name,
                               uri="demo://resource/dynamic/text/not-a-number")
        bhandle = await start_subscription(temporal_client, bkey, task_queue=task_queue)

        async def read_failed() -> list[dict[str, Any]]:
            return [dict(r) for r in await ledger.reports.audit_rows("READ_FAILED", 10_000)
                    if r["workflow_id"] == bkey.workflow_id]

        await eventually(read_failed, timeout=15, what="a READ_FAILED audit for the -32603 read")
        # The audit row commits inside the activity; the workflow mirrors the rejection one task later.
        brec = await wait_record(bhandle, lambda r: r.state == SubscriptionState.ACTIVE,
                                 "rejected read judged", timeout=15)
        assert brec.last_accepted_digest is None
        assert await ledger.reports.receipts(bkey) == [] and await outbox_for(ledger, bkey) == []
        handles[bkey.uri], keys[bkey.uri] = bhandle, bkey  # closed with the others below

        # A session resource: it exists only in the session that created it.
        name = f"mcpsync-{uuid.uuid4().hex[:8]}.txt"
        data = "data:text/plain;base64," + base64.b64encode(b"session-scoped resource").decode()
        made = await live.client.call_tool("gzip-file-as-resource", {"name": name, "data": data})
        assert not made.is_error, made
        session_uri = f"demo://resource/session/{name}"
        skey = SubscriptionKey(subject=SUBJECT, server=server.name, uri=session_uri)
        shandle = await start_subscription(temporal_client, skey, task_queue=task_queue)
        # It was read (an application/gzip body: ACCEPTED, or GUARDRAIL_REJECTED where policy bars binaries).
        await eventually(lambda: ledger.reports.receipts(skey), timeout=30, what="the session resource read")
        # The receipt commits inside the accept activity; the workflow mirrors it one task later.
        srec = await wait_record(shandle, lambda r: r.state == SubscriptionState.ACTIVE,
                                 "session resource ACTIVE", timeout=15)
        outbox_before = await outbox_for(ledger, skey)
        generation = live.generation

        await lose_session()  # the server's session ends; so does every session resource in it
        await wait_record(shandle, lambda r: r.state == SubscriptionState.TOMBSTONE_PENDING
                          and r.session_generation > generation, "session resource tombstoned", timeout=45)
        assert await outbox_for(ledger, skey) == outbox_before, "a tombstone never writes an outbox row"
        assert (await ledger.reports.receipts(skey))[-1].status == AcceptVerdict.TOMBSTONE_PENDING
        assert (await ledger.load_fence(skey)).last_accepted_digest == srec.last_accepted_digest
        for uri in docs:  # the documents resubscribed on the new session and still hold their digest
            await wait_record(handles[uri], lambda r: r.state == SubscriptionState.ACTIVE
                              and r.session_generation > generation, f"{uri} resubscribed", timeout=45)
            assert (await ledger.load_fence(keys[uri])).last_accepted_digest == expected[uri]

        for uri, handle in handles.items():
            receipt = await close(handle)
            assert receipt.state == SubscriptionState.CLOSED, (uri, receipt)
            final = await temporal_client.get_workflow_handle(
                keys[uri].workflow_id, result_type=ResourceSubscriptionV1).result()
            assert final.state == SubscriptionState.CLOSED
        # Tombstoned subscriptions close too (no unsubscribe owed to a resource that is gone).
        assert (await close(mhandle)).state in (SubscriptionState.CLOSED,
                                                SubscriptionState.UNSUBSCRIBE_UNKNOWN)


async def _more_seen(ledger: Ledger, key: SubscriptionKey, before: int) -> bool:
    return await notifications_seen(ledger, key) > before


async def _has_receipt(ledger: Ledger, key: SubscriptionKey, status: AcceptVerdict,
                       trigger: TriggerReason) -> bool:
    return any(r.status == status and r.trigger == trigger for r in await ledger.reports.receipts(key))


async def _outbox_count(ledger: Ledger, key: SubscriptionKey, at_least: int) -> bool:
    return len(await outbox_for(ledger, key)) >= at_least


# --- a Python MCPServer (2026-07-28) --------------------------------------------------------------

TINY_SERVER = '''
"""A tiny mcp.server.mcpserver.MCPServer over streamable HTTP: one resource and tools that edit it."""
import asyncio, json, os, socket, sys
import uvicorn
from mcp.server.mcpserver import Context, MCPServer

URI = "tiny://notes/current"
state = {"text": "revision 1"}
app = MCPServer("tiny-mcpserver", version="0.0.1")


@app.resource(URI, name="current-notes", mime_type="text/plain")
def current() -> str:
    return state["text"]


@app.tool()
async def edit(text: str, ctx: Context) -> str:
    """Replace the notes and publish a resource-updated event to listen streams."""
    state["text"] = text
    await ctx.notify_resource_updated(URI)
    return "ok"


@app.tool()
async def bump(ctx: Context) -> str:
    """Append a mark and publish a resource-updated event (a nudge with no arguments)."""
    state["text"] += "+"
    await ctx.notify_resource_updated(URI)
    return "ok"


@app.tool()
async def touch(uri: str, ctx: Context) -> str:
    """Publish a resource-updated event for any URI, changing nothing (a marker event)."""
    await ctx.notify_resource_updated(uri)
    return "ok"


async def main(ready: str) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app.streamable_http_app(), log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    with open(ready + ".tmp", "w") as f:
        json.dump({"url": f"http://127.0.0.1:{sock.getsockname()[1]}/mcp", "pid": os.getpid()}, f)
    os.replace(ready + ".tmp", ready)
    await task


asyncio.run(main(sys.argv[1]))
'''
TINY_URI = "tiny://notes/current"


@asynccontextmanager
async def tiny_mcpserver(tmp: Path) -> AsyncIterator[str]:
    """Run the tiny MCPServer in a subprocess; yields its streamable-HTTP URL."""
    script, ready = tmp / "tiny_mcpserver.py", tmp / "tiny_mcpserver.ready.json"
    script.write_text(TINY_SERVER)
    with open(tmp / "tiny_mcpserver.log", "wb") as log:
        proc = await asyncio.create_subprocess_exec(sys.executable, str(script), str(ready),
                                                    stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        async def url() -> str | None:
            if proc.returncode is not None:
                raise AssertionError(f"tiny MCPServer exited with {proc.returncode}: "
                                     f"{(tmp / 'tiny_mcpserver.log').read_text()[-2000:]}")
            with suppress(OSError, ValueError, binascii.Error):
                return str(json.loads(ready.read_text())["url"])
            return None

        yield await eventually(url, timeout=20, interval=0.05, what="the tiny MCPServer")
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@pytest.fixture
async def tiny_url(tmp_path: Path) -> AsyncIterator[str]:
    async with tiny_mcpserver(tmp_path) as url:
        yield url


async def test_mcpserver_2026_listen_converges_tombstones_closes(temporal_client: TemporalClient,
                                                                 ledger: Ledger, tiny_url: str) -> None:
    server = ServerConfig(name=unique("tiny"), transport="http", url=tiny_url, edition="2026-07-28",
                          subjects=[SUBJECT])
    async with Client(tiny_url, mode="auto", cache=None) as direct:
        assert direct.protocol_version == "2026-07-28"
        caps = direct.server_capabilities.resources
        # MCPServer serves subscriptions/listen, so 2026-07-28 advertises subscribe and listChanged.
        assert caps is not None and caps.subscribe and caps.list_changed
        first = read_digest(await direct.read_resource(TINY_URI))
        with pytest.raises(MCPError) as not_found:
            await direct.read_resource("tiny://notes/missing")
        assert not_found.value.code == -32602 and classify_error(not_found.value) == ReadOutcomeKind.NOT_FOUND

        key = SubscriptionKey(subject=SUBJECT, server=server.name, uri=TINY_URI)
        mkey = SubscriptionKey(subject=SUBJECT, server=server.name, uri="tiny://notes/missing")
        async with running_services(temporal_client, ledger, [server]) as cfg:
            tq = cfg.temporal.task_queue
            handle = await start_subscription(temporal_client, key, task_queue=tq)
            rec = await wait_record(handle, lambda r: r.state == SubscriptionState.ACTIVE
                                    and r.last_accepted_digest == first, "initial version over 2026-07-28")
            assert rec.edition == "2026-07-28" and rec.staleness_bound_seconds is None

            # Another client edits: the event goes through the server's bus to mcpsync's listen stream.
            edited = await direct.call_tool("edit", {"text": "revision 2"})
            assert not edited.is_error
            second = read_digest(await direct.read_resource(TINY_URI))
            assert second != first
            await wait_record(handle, lambda r: r.last_accepted_digest == second, "edit converged via listen")
            assert [r["content_digest"] for r in await outbox_for(ledger, key)] == [first, second]
            triggers = [r.trigger for r in await ledger.reports.receipts(key)
                        if r.status == AcceptVerdict.ACCEPTED]
            assert triggers[-1] == TriggerReason.UPDATED

            mhandle = await start_subscription(temporal_client, mkey, task_queue=tq)
            await wait_record(mhandle, lambda r: r.state == SubscriptionState.TOMBSTONE_PENDING,
                              "missing tombstoned")
            assert await outbox_for(ledger, mkey) == []

            assert (await close(handle)).state == SubscriptionState.CLOSED
            reads, seen = await ledger.reports.read_count(key), await notifications_seen(ledger, key)
            marks = await notifications_seen(ledger, mkey)
            await direct.call_tool("edit", {"text": "revision 3, after close"})
            # Witness: a later event from the same server, for the URI still subscribed, reached the
            # ingress (recorded on its row), and the ingress settled every notification it received.
            assert not (await direct.call_tool("touch", {"uri": mkey.uri})).is_error
            await eventually(lambda: _more_seen(ledger, mkey, marks), what="the later marker event recorded")
            await eventually(lambda: ingress_settled(ledger, server.name), what="every notification routed")
            assert await ledger.reports.read_count(key) == reads, "no read after CLOSED"
            assert await notifications_seen(ledger, key) == seen, "the listen stream ended with the close"
            await close(mhandle)


async def test_mcpserver_as_2025_has_no_subscribe_so_mcpsync_polls(temporal_client: TemporalClient,
                                                                   ledger: Ledger, tiny_url: str) -> None:
    """MCPServer has no resources/subscribe handler: on 2025-11-25 it advertises subscribe=false."""
    server = ServerConfig(name=unique("tiny25"), transport="http", url=tiny_url, edition="2025-11-25",
                          subjects=[SUBJECT])
    async with Client(tiny_url, mode="legacy", cache=None) as direct:
        caps = direct.server_capabilities.resources
        assert caps is not None and not caps.subscribe and not caps.list_changed
        expected = read_digest(await direct.read_resource(TINY_URI))
    key = SubscriptionKey(subject=SUBJECT, server=server.name, uri=TINY_URI)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
        rec = await wait_record(handle, lambda r: r.state == SubscriptionState.ACTIVE
                                and r.last_accepted_digest == expected, "initial read without subscribe")
        # Never pretends to be real time: it polls and publishes its staleness bound.
        assert rec.edition == "2025-11-25"
        assert rec.capabilities == {"subscribe": False, "listChanged": False}
        assert rec.staleness_bound_seconds == 30.0
        assert "polling" in rec.detail
        assert (await close(handle)).state == SubscriptionState.CLOSED
