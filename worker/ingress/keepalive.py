"""Connection reuse for streamable HTTP, without making a request wait for it.

Contract:
- The SDK (``mcp.client.streamable_http``) closes a POST's ``text/event-stream`` response as soon as
  the JSON-RPC response event has arrived, before the body's end, and httpcore closes a connection
  whose body was not read to its end: without this, every MCP request opens a new TCP (and TLS)
  connection. ``KeepAliveTransport`` wraps an httpx transport. Closing such a response (POST, 2xx,
  SSE, read from, not at its end) returns at once; a background task reads the rest, at most
  ``DRAIN_BYTES`` and ``DRAIN_SECONDS``. At the body's end the connection returns to the pool; past
  either bound, or on any error, it is closed, as without the drain. The caller never waits for it.
- Closed at once, as without the drain: a response closed during a cancellation (at 2026-07-28
  closing a request's stream is its cancellation, which must reach the server now), one never read
  from, one whose read failed, and every other response (the GET notification stream among them).
- When a response's headers arrive, the connection's pending ACK is sent at once (Linux
  ``TCP_QUICKACK``; elsewhere nothing). A server with Nagle's algorithm on (e.g. an asyncio server
  handed a listen socket made without ``IPPROTO_TCP``: asyncio then leaves ``TCP_NODELAY`` off) holds
  the event written after the headers until the client ACKs them, and a kept connection delays that
  ACK by 40 ms or more (delayed ACK; a new plain-TCP connection ACKs its first segments at once). One
  ``setsockopt`` per response.
- A server that keeps a response's stream open past ``DRAIN_SECONDS`` would hold a pooled connection
  that long for every request (a session at 100 requests/s would exhaust its pool): after the first
  drain that times out, the transport drains no more and closes such responses at once, as without the
  drain, for the rest of the session.
- ``aclose`` cancels the drains still running (each closes its connection), then closes the pool;
  a response closed after that is closed at once.
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import anyio
import httpx2

__all__ = ["DRAIN_BYTES", "DRAIN_SECONDS", "KeepAliveTransport"]

DRAIN_BYTES = 64 * 1024
"""The most a drain reads past the point where the response was closed: the rest of a response whose
JSON-RPC response has arrived is the body's end and at most a few events, not a stream's worth."""
DRAIN_SECONDS = 1.0
"""How long a drain waits for the body's end: a server that ends the stream with its last event
(the fixture, server-everything) sends it well under a millisecond after; one that keeps the stream
open past this has its connection closed."""
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


def _cancelling() -> bool:
    """Whether the current task is being cancelled (an anyio cancel scope, as the SDK uses, or a
    plain ``Task.cancel``)."""
    task = asyncio.current_task()
    return (task is not None and task.cancelling() > 0) or anyio.current_effective_deadline() == -math.inf


def _ack_now(response: httpx2.Response) -> None:
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if _QUICKACK is None or sock is None:
        return
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
    except OSError:
        pass  # a socket that is not TCP, or already closed: nothing is pending


class _DrainOnClose(httpx2.AsyncByteStream):
    """The response stream of one POST: ``aclose`` before the end hands the rest to a drain."""

    def __init__(self, inner: httpx2.AsyncByteStream, owner: KeepAliveTransport) -> None:
        self.inner, self.owner = inner, owner
        # The inner iterator, kept here (not in this generator's frame): the drain continues it,
        # and closing this generator (httpx does, when the response's iterators are collected) must
        # not close it.
        self.it: AsyncIterator[bytes] | None = None
        self.ended = self.failed = self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.it = it = self.inner.__aiter__()
        while True:
            try:
                chunk = await it.__anext__()
            except StopAsyncIteration:
                self.ended = True
                return
            except BaseException:
                self.failed = True
                raise
            yield chunk

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        if (self.it is None or self.ended or self.failed or self.owner.closed or self.owner.streams_held_open
                or _cancelling()):
            await self.inner.aclose()
            return
        self.owner.start_drain(self._drain(self.it))

    async def _drain(self, it: AsyncIterator[bytes]) -> None:
        seen = 0
        try:
            async with asyncio.timeout(DRAIN_SECONDS):
                while seen <= DRAIN_BYTES:
                    try:
                        seen += len(await it.__anext__())
                    except StopAsyncIteration:
                        break
        except TimeoutError:
            self.owner.streams_held_open = True  # this server keeps its streams open: drain no more
        except Exception:
            pass  # a read error: the connection is closed below, as without the drain
        finally:
            self.it = None
            # At the body's end this hands the connection back to the pool; before it, closes it.
            await self.inner.aclose()


class KeepAliveTransport(httpx2.AsyncBaseTransport):
    """An httpx transport that ACKs response headers at once and drains POST SSE responses closed
    before their end in the background (module docstring)."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner
        self.drains: set[asyncio.Task[None]] = set()
        self.closed = False
        self.streams_held_open = False  # a drain timed out: close early-closed responses at once

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        _ack_now(response)
        if (request.method == "POST" and 200 <= response.status_code < 300
                and response.headers.get("content-type", "").lower().startswith("text/event-stream")):
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            response.stream = _DrainOnClose(response.stream, self)
        return response

    def start_drain(self, drain: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(drain, name="mcpsync-sse-drain")
        self.drains.add(task)
        task.add_done_callback(self.drains.discard)

    async def aclose(self) -> None:
        self.closed = True
        drains = list(self.drains)
        for task in drains:
            task.cancel()
        await asyncio.gather(*drains, return_exceptions=True)
        await self.inner.aclose()
