"""The ``mcpsync serve`` process: ledger pool, the outbox follower, and the HTTP or stdio transport.

Contract:
- Tokens come from the environment: ``MCPSYNC_SERVE_TOKENS`` is a JSON object ``{subject: token}``
  (``serve_tokens``). Tokens are never logged or printed.
- HTTP: the streamable-HTTP app at ``/mcp`` behind ``serve_gate.Gate`` (Host 421, Origin 403, token
  401, body 413, the session bound to its subject), on uvicorn's h11 protocol bounded by
  ``serve_connections`` (head timeout, connection cap); allowed Host and Origin values default to
  ``default_hosts`` / ``default_origins`` of the bind address and the bound port. Session ids never
  reach a log above DEBUG (``redact_session_ids``). Once listening, one line on
  stdout: ``mcpsync serve: listening on http://HOST:PORT/mcp``. stdio: the MCP session on
  stdin/stdout for ``stdio_subject`` (nothing else on stdout).
- The follower reads the outbox from its end and registers nothing (``follow_unregistered``: no
  consumer row, nothing held back from retention, no lag to alert on) unless ``config.consumer``
  names a durable consumer (``serve --consumer NAME``; registered on first use at the outbox's
  end, no subject filter): then each batch is fanned out (``ServeHub.announce``) and then
  acknowledged, so a serve process killed between the two announces the batch again on restart
  (duplicates, never a loss). A gap (retention pruned events before they were read) tells every
  connected client to list and read again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import sys
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from psycopg_pool import AsyncConnectionPool
from sse_starlette.sse import AppStatus

from mcpsync.activities.ledger.outbox import OutboxConsumer, consumer_infos, follow_unregistered
from mcpsync.worker.serve.connections import MAX_HEAD_BYTES, bounded_protocol
from mcpsync.worker.serve.cursors import CursorSigner
from mcpsync.worker.serve.gate import Gate, HostRules, default_hosts, default_origins
from mcpsync.worker.serve.rejections import follow_rejections
from mcpsync.worker.serve.server import ServeConfig, ServeHub, ServeServer, build_server
from mcpsync.worker.serve.tokens import subject_for_authorization, tokens_from_environment
from mcpsync.worker.stack.common import state_dir

__all__ = ["follow_outbox", "redact_session_ids", "run_serve", "tokens_from_environment"]

logger = logging.getLogger("mcpsync.serve")


class _SessionIdFilter(logging.Filter):
    """Above DEBUG, the SDK's session-id-bearing log lines lose the id (a session id is a credential
    for its session's streams)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG:
            record.msg, record.args = _SESSION_ID.sub("<session id>", record.getMessage()), None
        return True


_SESSION_ID = re.compile(r"[0-9a-fA-F]{32}")
_SDK_SESSION_LOGGERS = ("mcp.server.streamable_http_manager", "mcp.server.streamable_http")


def redact_session_ids() -> None:
    """Install ``_SessionIdFilter`` on the SDK loggers that name sessions (idempotent)."""
    for name in _SDK_SESSION_LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(f, _SessionIdFilter) for f in target.filters):
            target.addFilter(_SessionIdFilter())


async def follow_outbox(hub: ServeHub) -> None:
    """Fan the outbox out to connected clients, forever: from the outbox's end with nothing
    registered, or as the durable consumer ``config.consumer`` when one is named."""
    while True:
        try:
            if hub.config.consumer is None:
                await _follow_unregistered(hub)
            else:
                await _follow_durable(hub, hub.config.consumer)
        except asyncio.CancelledError:
            raise
        except Exception:  # the database went away for a moment: follow again
            logger.exception("outbox follower failed; retrying in 1 s")
            await asyncio.sleep(1.0)


async def _follow_unregistered(hub: ServeHub) -> None:
    """Announce every event from now on; a gap (retention pruned positions before they were read)
    tells every connected client to list and read again."""
    async for events, gap in follow_unregistered(hub.pool, idle_timeout=5.0):
        if gap is not None:
            await hub.announce_relist({s.subject for s in hub.sessions.values()})
        for event in events:
            await hub.announce(event)


async def _follow_durable(hub: ServeHub, name: str) -> None:
    """Announce each batch, then acknowledge it (at least once across restarts)."""
    consumer = OutboxConsumer(hub.pool, name, register=True)
    if not await consumer_infos(hub.pool, name):
        # A new consumer starts at the outbox's end, not at position 0: history is in the ledger
        # (clients list and read the current versions); replaying it would only announce old news.
        start = await consumer.resync()
        await consumer.ack(start.position)
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


async def run_serve(config: ServeConfig, pool: AsyncConnectionPool, signer: CursorSigner | None = None,
                    on_listening: Callable[[str], None] | None = None) -> None:
    """Serve until cancelled (HTTP) or until stdin closes (stdio). ``on_listening`` gets the HTTP URL
    instead of the line on stdout (``mcpsync up`` prints it among its own)."""
    import uvicorn

    hub = ServeHub(config, pool, signer if signer is not None else CursorSigner.for_serve(state_dir()))
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
        port = sock.getsockname()[1]
        rules = HostRules.of(config.allowed_hosts or default_hosts(config.host, port),
                             config.allowed_origins or default_origins(config.host, port))
        # The gate checks Host and Origin on every bind (the SDK's own check, off here, only on localhost).
        mcp_app = server.streamable_http_app(
            streamable_http_path="/mcp", host=config.host, max_request_body_size=config.max_request_bytes,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        app: Any = Gate(mcp_app, rules=rules,
                        subject_for=lambda auth: subject_for_authorization(config.tokens, auth),
                        max_request_bytes=config.max_request_bytes)
        redact_session_ids()
        uv = uvicorn.Server(uvicorn.Config(
            app, lifespan="on", log_config=None, access_log=False, timeout_graceful_shutdown=1,
            http=bounded_protocol(config.header_timeout, config.max_connections),
            h11_max_incomplete_event_size=MAX_HEAD_BYTES))
        task = asyncio.create_task(uv.serve(sockets=[sock]))
        while not uv.started:
            if task.done():
                task.result()
                raise RuntimeError("serve exited before it started")
            await asyncio.sleep(0.01)
        url = f"http://{config.host}:{port}/mcp"
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
