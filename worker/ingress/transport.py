"""The MCP transport a session host opens to one server for one subject.

Contract:
- stdio: the configured command as a child process, the subject's credential in its environment,
  its stdout lines bounded by the budget of the request each answers (``transport_bounds``: the
  transport notes the method of every request it sends).
- streamable HTTP: a bearer header, a connection pool sized for concurrent activities and reads at
  the ingress whose connections are reused (``http_keepalive``), response bodies and events bounded
  by their request's budget at the transport (``transport_bounds``); a request the client abandons
  (timed out, cancelled) releases its connection and task at once (``http_abandon``); the HTTP
  client is closed with the session.
- Credentials come from the environment variable the config names and go nowhere else.
- An open failure is described in one line (``describe_open_failure``): where, and what went wrong.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import httpx2
from mcp import StdioServerParameters
from mcp.client._transport import TransportStreams
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCRequest

from mcpsync.worker.ingress import http_abandon
from mcpsync.worker.ingress.keepalive import KeepAliveTransport
from mcpsync.worker.ingress.transport_bounds import (
    RequestMethods,
    bounded_http_transport,
    install,
    stdio_bounds,
    transport_limit,
)
from mcpsync.worker.main.config import ServerConfig

__all__ = ["server_transport", "describe_open_failure", "HTTP_CONNECTIONS", "SessionOpenError"]


http_abandon.install()  # a timed-out request's POST releases its connection and task
install()  # the SDK's stdio reader holds no line over its budget (transport_bounds)


class SessionOpenError(RuntimeError):
    """The MCP server could not be started, reached or initialized."""


def server_transport(cfg: ServerConfig, subject: str) -> object:
    """The MCP transport for ``subject``'s session with ``cfg``: stdio (the subject's credential in
    the child's environment) or streamable HTTP (a bearer header). Credentials
    come from the environment variable the config names and go nowhere else."""
    token_var = cfg.token_env.get(subject)
    token = os.environ.get(token_var) if token_var else None
    if cfg.transport == "stdio":
        env = dict(cfg.env)
        env.setdefault("MCPSYNC_SUBJECT", subject)
        if token_var and token is not None:
            env[token_var] = token
        params = StdioServerParameters(command=cfg.command[0], args=cfg.command[1:], env=env, cwd=cfg.cwd)
        return _stdio(params, transport_limit(cfg.max_content_bytes))
    assert cfg.url is not None
    headers = {"Authorization": f"Bearer {token}"} if token else None
    # The SDK caps one SSE event at 1 MiB; a read result is one event, so allow our own content
    # limit (JSON escaping and base64 need up to ~2x) and classify larger bodies ourselves. A JSON
    # (non-SSE) response has the same bound, at the transport, before the SDK reads it whole.
    return _streamable_http(cfg.url, headers, transport_limit(cfg.max_content_bytes))


@asynccontextmanager
async def _stdio(params: StdioServerParameters, read_bytes: int) -> AsyncIterator[TransportStreams]:
    """The SDK's stdio transport, its lines bounded by their requests' budgets (``transport_bounds``):
    the reader learns each request's method from the ids this session sends."""
    requests = RequestMethods()
    async with AsyncExitStack() as stack:
        with stdio_bounds(read_bytes, requests):  # the reader task starts in here and keeps them
            read, write = await stack.enter_async_context(stdio_client(params))
        yield read, _RecordingSend(write, requests)


class _RecordingSend:
    """The session's write stream, noting the method of each request it sends."""

    def __init__(self, inner: Any, requests: RequestMethods) -> None:
        self.inner, self.requests = inner, requests

    async def send(self, item: SessionMessage) -> None:
        if isinstance(item.message, JSONRPCRequest):
            self.requests.sent(item.message.id, item.message.method)
        await self.inner.send(item)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def __aenter__(self) -> _RecordingSend:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inner.__aexit__(*exc)


@asynccontextmanager
async def _streamable_http(url: str, headers: dict[str, str] | None,
                           limit: int) -> AsyncIterator[TransportStreams]:
    """The SDK's streamable HTTP transport over our own client, closed after the session (the SDK
    closes only a client it made): its pool and the drains still running end with the session."""
    async with _http_client(headers, limit) as http_client, \
            streamable_http_client(url, http_client=http_client, max_sse_event_size=limit) as streams:
        yield streams


HTTP_CONNECTIONS = 100
"""Connections one session may open to its MCP server (httpx's default) and, unlike httpx's
default of 20, may also keep idle: each POST of the streamable HTTP transport is a request of its
own, and the activities and the routers' reads at the ingress run concurrently on one session: a
burst of concurrent requests needs as many connections, and keeping them lets the next burst reuse
them instead of opening new ones (``http_keepalive`` returns each to the pool at its body's end)."""


KEEPALIVE_SECONDS = 1.0
"""How long an idle connection is kept: less than the shortest common server idle timeout (gunicorn
2 s, uvicorn and Node 5 s), so that the client never sends a request on a connection the server is
closing at that moment (a POST lost that way fails its request)."""


def _http_client(headers: dict[str, str] | None, limit: int) -> httpx2.AsyncClient:
    """``create_mcp_http_client`` (the SDK's timeouts: 30 s, 300 s for a held stream) with a pool
    that keeps as many connections idle as it may open (``HTTP_CONNECTIONS``) and reuses them
    (``http_keepalive``), and JSON responses bounded to ``limit`` bytes (``transport_bounds``)."""
    limits = httpx2.Limits(max_connections=HTTP_CONNECTIONS, max_keepalive_connections=HTTP_CONNECTIONS,
                           keepalive_expiry=KEEPALIVE_SECONDS)
    transport = bounded_http_transport(limit, KeepAliveTransport(httpx2.AsyncHTTPTransport(limits=limits)))
    return httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT,
                                                                       read=MCP_DEFAULT_SSE_READ_TIMEOUT),
                              transport=transport)


def describe_open_failure(cfg: ServerConfig, exc: BaseException) -> str:
    where = cfg.target
    inner = exc
    while isinstance(inner, BaseExceptionGroup) and inner.exceptions:
        inner = inner.exceptions[0]
    if isinstance(inner, TimeoutError):
        what = "no initialize response within 30 s"
    elif isinstance(inner, FileNotFoundError):
        what = f"command not found: {cfg.command[0] if cfg.command else ''}"
    else:
        what = f"{type(inner).__name__}: {str(inner)[:200]}"
    return f"cannot open MCP server {cfg.name!r} ({cfg.transport} {where}): {what}"
