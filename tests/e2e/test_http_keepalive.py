"""Connection reuse over streamable HTTP (``worker/ingress/keepalive.py``) through the transport mcpsync
really opens (``session_transport.server_transport``), over real sockets:

- the fixture server (a subprocess): 50 sequential reads on one session open almost no connection
  and their median stays low; bursts of 50 concurrent reads reuse the connections of the burst before;
  its sockets have TCP_NODELAY (a plain client on a kept connection is not held either);
- a server with Nagle's algorithm on its sockets (written here, as uvicorn writes an SSE response:
  headers, event, end): kept connections do not make a read wait for the client's delayed ACK;
- a response that never ends is closed after the drain's time bound, one whose tail passes the byte
  bound at once, a response closed under cancellation or the session's close at once, and a GET
  stream is never drained.
Latency bounds are loose (a shared 2-core box, and the suite runs two workers): a read that waits for a
delayed ACK takes at least Linux's minimum delay of 40 ms, so a median under ``SEQUENTIAL_MEDIAN`` says
most reads did not wait; unloaded, the median is 2-10 ms
(docs/benchmarks/journal-2026-12-06.md, "Streamable HTTP keeps its connections")."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio
import httpx2
from mcp import Client

from mcpsync.fixture import FixtureProcess
from mcpsync.worker.ingress.keepalive import DRAIN_BYTES, DRAIN_SECONDS, KeepAliveTransport
from mcpsync.worker.ingress.transport import server_transport
from mcpsync.worker.main.config import ServerConfig
from tests.conftest import eventually

SEQUENTIAL_MEDIAN = 0.035  # seconds
INIT = {"protocolVersion": "2025-11-25", "capabilities": {"resources": {}},
        "serverInfo": {"name": "sse-writer", "version": "1"}}


@contextmanager
def tcp_connects() -> Iterator[list[str]]:
    """The TCP connections httpcore opens meanwhile (its connection logger, at DEBUG only here)."""
    opened: list[str] = []

    class _Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("connect_tcp.complete"):
                opened.append(record.getMessage())

    logger = logging.getLogger("httpcore2.connection")
    handler, level = _Count(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield opened
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


async def timed_reads(client: Client, uri: str, n: int) -> list[float]:
    seconds = []
    for _ in range(n):
        start = time.perf_counter()
        result = await client.read_resource(uri)
        seconds.append(time.perf_counter() - start)
        assert result.contents, uri
    return seconds


async def test_fixture_reads_reuse_connections(fx: FixtureProcess) -> None:
    uri = "demo://keepalive/doc"
    await fx.create(uri, text="kept " * 40, mime_type="text/plain")
    cfg = ServerConfig(name="fx", transport="http", url=fx.mcp_url)
    async with Client(server_transport(cfg, "anonymous"), mode="legacy", cache=None) as client:  # type: ignore[arg-type]
        await client.read_resource(uri)
        with tcp_connects() as opened:
            seconds = await timed_reads(client, uri, 50)
        assert len(opened) <= 3, f"{len(opened)} connections for 50 sequential reads"
        median = statistics.median(seconds)
        assert median <= SEQUENTIAL_MEDIAN, f"median {median * 1000:.1f} ms"

        with tcp_connects() as opened:
            for _ in range(3):
                results = await asyncio.gather(*(client.read_resource(uri) for _ in range(50)))
                assert all(r.contents[0].text == "kept " * 40 for r in results)  # type: ignore[union-attr]
        assert len(opened) <= 75, f"{len(opened)} connections for 3 bursts of 50 concurrent reads"


async def test_fixture_response_not_held_by_nagle(fx: FixtureProcess) -> None:
    """The fixture's sockets have TCP_NODELAY: on one kept connection, with a plain client (no
    ``KeepAliveTransport``, whose early ACK would hide it), a read's event is not held behind its
    headers until a delayed ACK."""
    uri = "demo://keepalive/plain"
    await fx.create(uri, text="plain", mime_type="text/plain")
    headers = {"accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "plain", "version": "0"}}}
    async with httpx2.AsyncClient(timeout=30) as http:
        async with http.stream("POST", fx.mcp_url, json=init, headers=headers) as response:
            await response.aread()
            headers["mcp-session-id"] = response.headers["mcp-session-id"]
        await http.post(fx.mcp_url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                        headers=headers)
        seconds = []
        with tcp_connects() as opened:
            for i in range(1, 21):
                start = time.perf_counter()
                read = {"jsonrpc": "2.0", "id": i, "method": "resources/read", "params": {"uri": uri}}
                async with http.stream("POST", fx.mcp_url, headers=headers, json=read) as response:
                    assert b'"plain"' in await response.aread()
                seconds.append(time.perf_counter() - start)
    assert not opened  # read whole, each response leaves its connection to the next
    median = statistics.median(seconds)
    assert median <= SEQUENTIAL_MEDIAN, f"median {median * 1000:.1f} ms"


# --- a server written here: SSE in three writes, optionally with Nagle's algorithm on ---


@dataclass
class Conn:
    opened: float
    uris: list[str] = field(default_factory=list)
    event_at: float | None = None  # when the last response event was written
    closed: float | None = None  # when the client closed it
    get: bool = False


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class SseWriter:
    """A streamable-HTTP MCP server (2025-11-25) answering every request in SSE as uvicorn with
    sse-starlette does: the headers, the event and the body's end, three writes. ``demo://endless...``
    never ends its body, ``demo://tail`` writes 2 x ``DRAIN_BYTES`` of comments after the event and
    never ends; a GET is a stream of one comment that never ends. ``nagle``: TCP_NODELAY off."""

    def __init__(self, *, nagle: bool = False) -> None:
        self.nagle = nagle
        self.conns: list[Conn] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> SseWriter:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/mcp"

    def serving(self, uri: str) -> Conn:
        (conn,) = [c for c in self.conns if uri in c.uris]
        return conn

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        if self.nagle:
            writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        conn = Conn(opened=loop.time())
        self.conns.append(conn)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
                method = head.split(" ", 1)[0]
                lines = head.split("\r\n")[1:]
                headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                sse = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nmcp-session-id: s1\r\n" \
                      b"transfer-encoding: chunked\r\n\r\n"
                if method == "GET":
                    conn.get = True
                    writer.write(sse)
                    writer.write(_chunk(b": stream\n\n"))
                    await reader.read(1)  # held until the client closes it
                    return
                if method != "POST" or "id" not in (msg := json.loads(body)):
                    status = b"202 Accepted" if method == "POST" else b"200 OK"
                    writer.write(b"HTTP/1.1 " + status + b"\r\ncontent-length: 0\r\n\r\n")
                    continue
                uri = (msg.get("params") or {}).get("uri", "")
                conn.uris.append(uri)
                result = (INIT if msg["method"] == "initialize"
                          else {"contents": [{"uri": uri, "text": "fine"}]})
                event = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
                writer.write(sse)
                await writer.drain()
                writer.write(_chunk(b"event: message\r\ndata: " + event + b"\r\n\r\n"))
                await writer.drain()
                conn.event_at = loop.time()
                if uri == "demo://tail":
                    writer.write(_chunk(b": " + b"x" * (2 * DRAIN_BYTES) + b"\n\n"))
                if uri.startswith("demo://endless") or uri == "demo://tail":
                    await reader.read(1)  # the body never ends: held until the client closes it
                    return
                writer.write(b"0\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            conn.closed = loop.time()
            writer.close()


def _client(url: str) -> Client:
    cfg = ServerConfig(name="sse", transport="http", url=url)
    return Client(server_transport(cfg, "anonymous"), mode="legacy", cache=None)  # type: ignore[arg-type]


def _posts(server: SseWriter) -> list[Conn]:
    return [c for c in server.conns if not c.get]


async def test_nagle_server_kept_connection_does_not_wait() -> None:
    async with SseWriter(nagle=True) as server, _client(server.url) as client:
        await client.read_resource("demo://ok")
        seconds = await timed_reads(client, "demo://ok", 30)
        median = statistics.median(seconds)
        assert median <= SEQUENTIAL_MEDIAN, f"median {median * 1000:.1f} ms"
        assert len(_posts(server)) <= 3, f"{len(_posts(server))} connections for 32 requests"


async def test_endless_response_closed_after_the_drain_bounds() -> None:
    async with SseWriter() as server, _client(server.url) as client:
        start = time.perf_counter()
        result = await client.read_resource("demo://endless")
        assert time.perf_counter() - start < DRAIN_SECONDS / 2, "the read waited for its drain"
        assert result.contents[0].text == "fine"  # type: ignore[union-attr]
        endless = server.serving("demo://endless")
        assert endless.closed is None  # drained in the background, for now

        await client.read_resource("demo://tail")
        tail = server.serving("demo://tail")
        await eventually(lambda: tail.closed is not None, timeout=DRAIN_SECONDS / 2,
                         what="a tail past the byte bound closes its connection at once")

        await eventually(lambda: endless.closed is not None, timeout=DRAIN_SECONDS + 3,
                         what="an endless response closed after the time bound")
        assert endless.event_at is not None and endless.closed is not None
        held = endless.closed - endless.event_at
        assert DRAIN_SECONDS * 0.9 <= held, f"closed after {held:.2f} s"

        assert (await client.read_resource("demo://ok")).contents  # the session goes on
        # A server that held a stream open past the bound would hold a connection that long per
        # request: the session drains no more, and the next such response closes at once.
        await client.read_resource("demo://endless/again")
        again = server.serving("demo://endless/again")
        await eventually(lambda: again.closed is not None, timeout=DRAIN_SECONDS / 2,
                         what="once a drain timed out, an early-closed response closes at once")


async def test_session_close_ends_its_drains() -> None:
    async with SseWriter() as server:
        async with _client(server.url) as client:
            await client.read_resource("demo://endless")
            endless = server.serving("demo://endless")
            assert endless.closed is None
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "mcpsync-sse-drain"]
        await eventually(lambda: endless.closed is not None, timeout=DRAIN_SECONDS / 2,
                         what="the session's close closes a connection being drained")


async def test_cancelled_or_get_stream_closed_at_once() -> None:
    """A POST response closed under cancellation, and a GET stream closed plainly, are not drained."""
    read = {"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": "demo://endless"}}
    headers = {"accept": "application/json, text/event-stream"}
    async with SseWriter() as server, httpx2.AsyncClient(transport=KeepAliveTransport(
            httpx2.AsyncHTTPTransport())) as http:
        with anyio.CancelScope() as scope:
            async with http.stream("POST", server.url, json=read, headers=headers) as response:
                async for _ in response.aiter_raw():
                    scope.cancel()
                    await anyio.sleep(5)  # cancelled here: the response closes under cancellation
        post = server.serving("demo://endless")
        await eventually(lambda: post.closed is not None, timeout=DRAIN_SECONDS / 2,
                         what="a response closed under cancellation closes its connection at once")

        async with http.stream("GET", server.url, headers=headers) as response:
            async for _ in response.aiter_raw():
                break
        (get,) = [c for c in server.conns if c.get]
        await eventually(lambda: get.closed is not None, timeout=DRAIN_SECONDS / 2,
                         what="a GET stream closes its connection at once")
