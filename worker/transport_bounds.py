"""Byte bounds at the MCP transports, before anything is parsed (docs/security.md).

Contract:
- Streamable HTTP: ``bounded_http_transport(limit, inner)`` is an httpx transport whose
  ``application/json`` responses stop at ``limit`` bytes (a larger Content-Length fails at once,
  a longer body as soon as it passes the limit) with ``ResponseTooLarge``, an ``httpx.StreamError``:
  the SDK turns it into a JSON-RPC error (-32700) for that one request, whose message says
  "byte limit", and ``classify_error`` makes the read MALFORMED with that reason. The session
  stays up. (SSE events are bounded by the SDK's ``max_sse_event_size``.)
- stdio: the SDK splits the server's stdout into lines in an unbounded buffer. ``install()``
  replaces the text stream its reader uses with ``BoundedLines``: no line longer than the
  limit in effect when the transport was opened (``stdio_line_limit``, a context variable the
  session host sets) is ever held; the rest of such a line is read and dropped, and in its place
  the reader gets a JSON-RPC error (-32700, "byte limit") for the request id found at the start
  of the line (none found: nothing, the request times out). Memory: one limit per session.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import httpx2
from anyio.streams.text import TextReceiveStream

__all__ = ["BoundedLines", "ResponseTooLarge", "bounded_http_transport", "install", "stdio_line_limit",
           "transport_limit"]

PARSE_ERROR = -32700
_DEFAULT_LIMIT = 2 * 32 * 1024 * 1024 + 65536  # the default max_content_bytes' transport limit
_ID = r'"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)'
# Python servers: id before result
_ID_FIRST = re.compile(r'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?' + _ID)
_ID_LAST = re.compile(_ID + r'\s*\}\s*$')  # TypeScript servers: {result, jsonrpc, id}
_HEAD = _TAIL = 256  # characters of an oversize line kept to find its request id
MAX_MESSAGE_URIS = 100_000
"""No message may name more URIs than this (``"uri"`` and ``"uriTemplate"`` keys, counted on the raw
line or body before it is parsed; inside a JSON string the quotes are escaped, so a body cannot fake
one): a page of a million small descriptors fits in the byte limit but would cost the ingress about a gigabyte
parsed. Equal to the catalog scan's item cap (activities/catalog_scan.py ``MAX_SCAN_ITEMS``): a page past it
would stop the scan anyway."""
_URI_KEYS = ('"uri"', '"uriTemplate"')  # a resource's, a template's
_URI_KEYS_BYTES = tuple(k.encode() for k in _URI_KEYS)


def _uri_keys(text: str) -> int:
    return sum(text.count(k) for k in _URI_KEYS)
_LIMIT: ContextVar[int] = ContextVar("mcpsync_stdio_line_limit", default=_DEFAULT_LIMIT)


def transport_limit(max_content_bytes: int) -> int:
    """The bytes one response may take on the wire for a body of ``max_content_bytes``: JSON
    escaping and base64 need up to about twice the body, plus the envelope."""
    return 2 * max_content_bytes + 65536


def _too_many_uris() -> str:
    return f"response names more than {MAX_MESSAGE_URIS} URIs (the byte limit's item bound)"


class ResponseTooLarge(httpx2.StreamError):
    """A JSON response passed the transport's byte limit."""


def _too_large(limit: int) -> str:
    return f"response over the byte limit of {limit} bytes (max_content_bytes)"


class _LimitedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int, declared: int | None) -> None:
        self.inner, self.limit, self.declared = inner, limit, declared

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.declared is not None and self.declared > self.limit:
            raise ResponseTooLarge(_too_large(self.limit))
        seen = uris = 0
        # Per key, the previous chunk's last len(key) - 1 bytes: a key split between chunks is
        # counted once, and none fits wholly in its carry (so none is counted twice).
        carries = [b""] * len(_URI_KEYS_BYTES)
        async for chunk in self.inner:
            seen += len(chunk)
            if seen > self.limit:
                raise ResponseTooLarge(_too_large(self.limit))
            for i, key in enumerate(_URI_KEYS_BYTES):
                window = carries[i] + chunk[:len(key) - 1]
                uris += window.count(key) + chunk.count(key)
                tail = chunk if len(chunk) >= len(key) - 1 else carries[i] + chunk
                carries[i] = tail[-(len(key) - 1):]
            if uris > MAX_MESSAGE_URIS:
                raise ResponseTooLarge(_too_many_uris())
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class _BoundedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int) -> None:
        self.inner, self.limit = inner, limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self.inner.handle_async_request(request)
        if response.headers.get("content-type", "").lower().startswith("application/json"):
            declared = response.headers.get("content-length")
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            response.stream = _LimitedStream(response.stream, self.limit,
                                             int(declared) if declared and declared.isdigit() else None)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def bounded_http_transport(limit: int, inner: httpx2.AsyncBaseTransport) -> httpx2.AsyncBaseTransport:
    """``inner`` (an httpx transport) whose JSON responses stop at ``limit`` bytes."""
    return _BoundedTransport(inner, limit)


@contextmanager
def stdio_line_limit(limit: int) -> Any:
    """The line limit for stdio transports opened inside this block (their reader task copies it)."""
    token = _LIMIT.set(limit)
    try:
        yield
    finally:
        _LIMIT.reset(token)


class BoundedLines(TextReceiveStream):
    """``TextReceiveStream`` that only ever hands out whole lines of at most the limit in effect
    when it was created; an oversize line becomes one JSON-RPC error line for its request id."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit = _LIMIT.get()
        self.parts: list[str] = []  # the current line so far, never longer than the limit
        self.size = 0  # characters in ``parts`` (a list, not ``+=``: a line of many chunks stays linear)
        self.dropping = False  # inside an oversize line: its head and tail are kept, the rest dropped
        self.head = self.tail = ""

    async def receive(self) -> str:
        while True:
            out = self._feed(await super().receive())
            if out:
                return out

    def _feed(self, chunk: str) -> str:
        out: list[str] = []
        parts = chunk.split("\n")
        for i, part in enumerate(parts):
            ended = i < len(parts) - 1
            if self.dropping:
                self.tail = (self.tail + part)[-_TAIL:]
                if ended:
                    out.append(self._error_line())
                    self.dropping, self.head, self.tail = False, "", ""
                continue
            if self.size + len(part) > self.limit:
                whole = "".join(self.parts) + part
                self.head, self.tail = whole[:_HEAD], whole[-_TAIL:]
                self.parts, self.size = [], 0
                if ended:
                    out.append(self._error_line())
                    self.head = self.tail = ""
                else:
                    self.dropping = True
                continue
            self.parts.append(part)
            self.size += len(part)
            if ended:
                line = "".join(self.parts)
                self.parts, self.size = [], 0
                if _uri_keys(line) > MAX_MESSAGE_URIS:
                    self.head, self.tail = line[:_HEAD], line[-_TAIL:]
                    out.append(self._error_line(_too_many_uris()))
                    self.head = self.tail = ""
                else:
                    out.append(line + "\n")
        return "".join(out)

    def _error_line(self, message: str | None = None) -> str:
        found = _ID_FIRST.search(self.head) or _ID_LAST.search(self.tail)
        if found is None:
            return ""  # no request to fail: the caller's timeout will
        error = {"code": PARSE_ERROR, "message": message or _too_large(self.limit)}
        return json.dumps({"jsonrpc": "2.0", "id": json.loads(found.group(1)), "error": error}) + "\n"


def install() -> None:
    """Make the SDK's stdio reader use ``BoundedLines`` (it looks the name up at call time)."""
    import mcp.client.stdio as stdio

    stdio.TextReceiveStream = BoundedLines  # type: ignore[misc]
