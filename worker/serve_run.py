"""The ``mcpsync serve`` process: ledger pool, the outbox follower, and the HTTP or stdio transport.

Contract:
- Tokens come from the environment: ``MCPSYNC_SERVE_TOKENS`` is a JSON object ``{subject: token}``
  (``tokens_from_environment``). Tokens are never logged or printed.
- HTTP: the streamable-HTTP app at ``/mcp`` behind ``_Gate``: unknown or missing bearer token → 401
  (nothing listed), a request body over ``max_request_bytes`` → 413; once listening, one line on
  stdout: ``mcpsync serve: listening on http://HOST:PORT/mcp``. stdio: the MCP session on
  stdin/stdout for ``stdio_subject`` (nothing else on stdout).
- The follower is the durable outbox consumer ``config.consumer`` (registered on first use at the
  outbox's end, no subject filter): each batch is fanned out (``ServeHub.announce``) and then acknowledged, so
  a
  serve process killed between the two announces the batch again on restart (duplicates, never
  a loss). A gap (retention pruned unacknowledged events) is a resync: every connected client is
  told to list and read again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from mcp.server.stdio import stdio_server
from psycopg_pool import AsyncConnectionPool
from sse_starlette.sse import AppStatus
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcpsync.activities.outbox import OutboxConsumer, consumer_infos
from mcpsync.worker.serve import ServeConfig, ServeHub, ServeServer, build_server
from mcpsync.worker.serve_cursors import CursorSigner
from mcpsync.worker.serve_rejections import follow_rejections

__all__ = ["follow_outbox", "run_serve", "tokens_from_environment"]

logger = logging.getLogger("mcpsync.serve")


def tokens_from_environment(env: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """``MCPSYNC_SERVE_TOKENS`` ({subject: token}) as (token, subject) pairs; ValueError if malformed."""
    raw = (env if env is not None else dict(os.environ)).get("MCPSYNC_SERVE_TOKENS", "")
    if not raw.strip():
        return ()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        raise ValueError("MCPSYNC_SERVE_TOKENS must be a JSON object {subject: token}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) and v for k,
                                             v in data.items()):
        raise ValueError("MCPSYNC_SERVE_TOKENS must be a JSON object {subject: token} of non-empty strings")
    return tuple((token, subject) for subject, token in data.items())


async def _reply(send: Send, status: int, body: bytes, extra: list[tuple[bytes,
                                                                         bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


class _Gate:
    """401 for an unknown or missing bearer token; 413 for an oversized body."""

    def __init__(self, app: ASGIApp, hub: ServeHub) -> None:
        self.app = app
        self.hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        auth = headers.get(b"authorization")
        if self.hub.subject_for_authorization(auth.decode("latin-1") if auth else None) is None:
            await _reply(send, 401, b'{"error":"unauthorized: unknown or missing bearer token"}',
                         [(b"www-authenticate", b'Bearer realm="mcpsync-serve"')])
            return
        limit = self.hub.config.max_request_bytes
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await _reply(send, 413, json.dumps({"error": f"request body over {limit} bytes"}).encode())
            return
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, bounded, send)
        except _TooLarge:
            await _reply(send, 413, json.dumps({"error": f"request body over {limit} bytes"}).encode())


class _TooLarge(Exception):
    pass


async def follow_outbox(hub: ServeHub) -> None:
    """Fan the outbox out to connected clients, forever; acknowledge after each batch."""
    consumer = OutboxConsumer(hub.pool, hub.config.consumer, register=True)
    if not await consumer_infos(hub.pool, hub.config.consumer):
        # A new consumer starts at the outbox's end, not at position 0: history is in the ledger
        # (clients list and read the current versions); replaying it would only announce old news.
        start = await consumer.resync()
        await consumer.ack(start.position)
    while True:
        try:
            async for batch in consumer.follow(idle_timeout=5.0):
                if batch.gap is not None:
                    resync = await consumer.resync()
                    await hub.announce_relist({e.subject for e in resync.events} | {s.subject for s in
                                                                                    hub.sessions.values()})
                    await consumer.ack(resync.position)
                    continue
                for event in batch.events:
                    await hub.announce(event)
                await consumer.ack(batch.position)
        except asyncio.CancelledError:
            raise
        except Exception:  # the database went away for a moment: follow again from the acked position
            logger.exception("outbox follower failed; retrying in 1 s")
            await asyncio.sleep(1.0)


async def run_serve(config: ServeConfig, pool: AsyncConnectionPool, database_url: str,
                    on_listening: Callable[[str], None] | None = None) -> None:
    """Serve until cancelled (HTTP) or until stdin closes (stdio). ``on_listening`` gets the HTTP URL
    instead of the line on stdout (``mcpsync up`` prints it among its own)."""
    import uvicorn

    hub = ServeHub(config, pool, CursorSigner.from_environment(database_url))
    server: ServeServer = build_server(hub)
    follower = asyncio.create_task(follow_outbox(hub), name="serve-outbox")
    rejections = asyncio.create_task(follow_rejections(hub), name="serve-rejections")
    try:
        if config.transport == "stdio":
            async with stdio_server() as (read_stream, write_stream):
                await server.run(read_stream, write_stream, server.create_initialization_options())
            return
        # IPPROTO_TCP so that asyncio sets TCP_NODELAY on the accepted sockets (it skips proto 0): with
        # Nagle's algorithm a response's small writes wait ~40 ms for a kept-alive client's delayed ACK.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((config.host, config.port))
        sock.listen(1024)
        sock.setblocking(False)
        app: Any = _Gate(server.streamable_http_app(streamable_http_path="/mcp", host=config.host,
                                                    max_request_body_size=config.max_request_bytes), hub)
        uv = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_config=None, access_log=False,
                                           timeout_graceful_shutdown=1))
        task = asyncio.create_task(uv.serve(sockets=[sock]))
        while not uv.started:
            if task.done():
                task.result()
                raise RuntimeError("serve exited before it started")
            await asyncio.sleep(0.01)
        url = f"http://{config.host}:{sock.getsockname()[1]}/mcp"
        if on_listening is not None:
            on_listening(url)
        else:
            print(f"mcpsync serve: listening on {url}", flush=True)
        try:
            await asyncio.shield(task)  # a cancel (SIGTERM, Ctrl-C) stops uvicorn gracefully below
        finally:
            hub.close_all_streams()
            AppStatus.should_exit = True
            uv.should_exit = True
            with suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
    finally:
        follower.cancel()
        rejections.cancel()
        await asyncio.gather(follower, rejections, return_exceptions=True)
        sys.stdout.flush()
