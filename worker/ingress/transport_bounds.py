"""Bounds at the MCP transports, before anything is parsed (docs/security.md).

Every message from a server has a budget (``reply_shape.budget_for``): bytes, JSON values and nesting
depth, by the method of the request it answers: a read's bytes from ``max_content_bytes``
(``transport_limit``), a list page's and any other message's fixed. The budget is checked on the
raw text as it arrives, in O(1) memory beyond what the transport holds anyway, so a reply that
would become gigabytes once parsed is refused before the SDK parses it.

Contract:
- Streamable HTTP: ``bounded_http_transport(limit, inner)`` is an httpx transport that reads the
  method of each request it sends and bounds the response's body by that method's budget:
  ``application/json`` (a larger Content-Length fails at once, a longer or over-complex body as
  soon as it passes) with ``ResponseTooLarge``, an ``httpx.StreamError``: the SDK turns it into a
  JSON-RPC error (-32700) for that one request; ``text/event-stream`` per event with
  ``EventTooLarge``, an ``httpx.SSEError``: the SDK fails that one request (-32000, "SSE stream
  failed: ..."). Either message says "byte limit", and ``classify_error`` makes the read MALFORMED
  with that reason (final: not retried). The session stays up.
- stdio: the SDK splits the server's stdout into lines in an unbounded buffer. ``install()``
  replaces the text stream its reader uses with ``BoundedLines``, which takes its bounds from the
  context it was created in (``stdio_bounds``, set by the session's transport): no line longer than
  the largest budget is ever held, and a line over its own method's budget (the request id at its
  start or end, the method from ``RequestMethods``) is read to its end and dropped; in its place the
  reader gets a JSON-RPC error (-32700, the reason) for that request id (none found: nothing, and a
  WARNING log line; a request times out). Memory: one largest budget per session.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NamedTuple

import httpx2
from anyio.streams.text import TextReceiveStream

from mcpsync.worker.ingress.reply_shape import (
    Budget,
    ShapeError,
    ShapeScanner,
    SseShape,
    budget_for,
    ceiling,
    over_bytes,
)

__all__ = ["BoundedLines", "EventTooLarge", "MAX_MESSAGE_URIS", "RequestMethods", "ResponseTooLarge",
           "bounded_http_transport", "install", "request_method", "stdio_bounds", "transport_limit"]

log = logging.getLogger("mcpsync.ingress")
PARSE_ERROR = -32700
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



def transport_limit(max_content_bytes: int) -> int:
    """The bytes one read's response may take on the wire for a body of ``max_content_bytes``: JSON
    escaping and base64 need up to about twice the body, plus the envelope."""
    return 2 * max_content_bytes + 65536


def _too_many_uris() -> str:
    return f"response names more than {MAX_MESSAGE_URIS} URIs (the byte limit's item bound)"


class ResponseTooLarge(httpx2.StreamError):
    """A JSON response passed its budget (bytes, URIs, values or depth)."""


class EventTooLarge(httpx2.SSEError):
    """A server-sent event passed its budget: the SDK fails the request the stream answers."""


class _UriCount:
    """``"uri"`` and ``"uriTemplate"`` keys in a body that arrives in chunks: per key, the previous
    chunk's last len(key) - 1 bytes are kept, so a key split between chunks is counted once, and none
    fits wholly in its carry (so none is counted twice)."""

    def __init__(self, keys: tuple[str, ...] | tuple[bytes, ...]) -> None:
        self.count, self.keys = 0, keys
        self.carries = [key[:0] for key in keys]

    def feed(self, chunk: Any) -> None:
        """Count ``chunk`` (``str`` or ``bytes``, as the keys); ``ShapeError`` past ``MAX_MESSAGE_URIS``."""
        for i, key in enumerate(self.keys):
            window = self.carries[i] + chunk[:len(key) - 1]
            self.count += window.count(key) + chunk.count(key)
            tail = chunk if len(chunk) >= len(key) - 1 else self.carries[i] + chunk
            self.carries[i] = tail[-(len(key) - 1):]
        if self.count > MAX_MESSAGE_URIS:
            raise ShapeError(_too_many_uris())


class _LimitedStream(httpx2.AsyncByteStream):
    """A JSON response body within ``budget``, counted as it streams."""

    def __init__(self, inner: httpx2.AsyncByteStream, budget: Budget, declared: int | None) -> None:
        self.inner, self.budget, self.declared = inner, budget, declared

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.declared is not None and self.declared > self.budget.bytes:
            raise ResponseTooLarge(over_bytes(self.budget))
        seen, uris, shape = 0, _UriCount(_URI_KEYS_BYTES), ShapeScanner(self.budget)
        async for chunk in self.inner:
            seen += len(chunk)
            try:
                if seen > self.budget.bytes:
                    raise ShapeError(over_bytes(self.budget))
                uris.feed(chunk)
                shape.feed(chunk)
            except ShapeError as err:
                raise ResponseTooLarge(str(err)) from None
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class _LimitedEvents(httpx2.AsyncByteStream):
    """An event-stream body whose every event is within ``budget``, counted as it streams."""

    def __init__(self, inner: httpx2.AsyncByteStream, budget: Budget) -> None:
        self.inner, self.budget = inner, budget

    async def __aiter__(self) -> AsyncIterator[bytes]:
        events = SseShape(self.budget)
        async for chunk in self.inner:
            try:
                events.feed(chunk)
            except ShapeError as err:
                raise EventTooLarge(str(err)) from None
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


def request_method(request: httpx2.Request) -> str | None:
    """The JSON-RPC method a POST of the streamable HTTP transport carries (None: a GET, or no
    method: the response carries notifications only)."""
    if request.method != "POST":
        return None
    try:
        message = json.loads(request.content)
    except (ValueError, httpx2.RequestNotRead):
        return None
    method = message.get("method") if isinstance(message, dict) else None
    return method if isinstance(method, str) else None


class _BoundedTransport(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport, read_bytes: int) -> None:
        self.inner, self.read_bytes = inner, read_bytes

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        budget = budget_for(request_method(request), self.read_bytes)
        response = await self.inner.handle_async_request(request)
        content_type = response.headers.get("content-type", "").lower()
        assert isinstance(response.stream, httpx2.AsyncByteStream)
        if content_type.startswith("application/json"):
            declared = response.headers.get("content-length")
            response.stream = _LimitedStream(response.stream, budget,
                                             int(declared) if declared and declared.isdigit() else None)
        elif content_type.startswith("text/event-stream"):
            response.stream = _LimitedEvents(response.stream, budget)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def bounded_http_transport(limit: int, inner: httpx2.AsyncBaseTransport) -> httpx2.AsyncBaseTransport:
    """``inner`` (an httpx transport) whose responses stay within their request's budget, a read's
    bytes being ``limit`` (``transport_limit``)."""
    return _BoundedTransport(inner, limit)


class RequestMethods:
    """The method of each of the newest ``MAX_REMEMBERED`` requests a stdio session sent, by id. An
    answer does not remove its request: the server's own requests (ping, sampling) number their ids
    as they like, and one that reused a pending id must not take that request's method away. The
    SDK never reuses an id within a session."""

    MAX_REMEMBERED = 4096

    def __init__(self) -> None:
        self.methods: OrderedDict[object, str] = OrderedDict()

    def sent(self, request_id: object, method: str) -> None:
        self.methods[request_id] = method
        self.methods.move_to_end(request_id)
        while len(self.methods) > self.MAX_REMEMBERED:
            self.methods.popitem(last=False)

    def method(self, request_id: object) -> str | None:
        return self.methods.get(request_id)


class _StdioBounds(NamedTuple):
    read_bytes: int
    requests: RequestMethods


_BOUNDS: ContextVar[_StdioBounds | None] = ContextVar("mcpsync_stdio_bounds", default=None)


@contextmanager
def stdio_bounds(read_bytes: int, requests: RequestMethods) -> Iterator[None]:
    """The bounds of stdio transports opened inside this block (their reader task copies them): a
    read may take ``read_bytes``; ``requests`` names the method of each id sent."""
    token = _BOUNDS.set(_StdioBounds(read_bytes, requests))
    try:
        yield
    finally:
        _BOUNDS.reset(token)


class BoundedLines(TextReceiveStream):
    """``TextReceiveStream`` that only ever hands out whole lines within their budget; a line over it
    becomes one JSON-RPC error line for its request id."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        bounds = _BOUNDS.get() or _StdioBounds(transport_limit(32 * 1024 * 1024), RequestMethods())
        self.read_bytes, self.requests = bounds.read_bytes, bounds.requests
        self.top = ceiling(self.read_bytes)
        self._new_line()

    def _new_line(self) -> None:
        self.parts: list[str] = []  # the current line so far, never over its budget
        self.size = 0  # characters in ``parts`` (a list, not ``+=``: a line of many chunks stays linear)
        self.shape = ShapeScanner(self.top)
        self.uris = _UriCount(_URI_KEYS)
        self.budget: Budget | None = None  # the line's own, once its request id is known
        self.head = self.tail = ""  # the line's first and last characters, to find its request id
        self.refused: str | None = None  # why the line is dropped: the rest of it is read and discarded

    async def receive(self) -> str:
        while True:
            out = self._feed(await super().receive())
            if out:
                return out

    def _feed(self, chunk: str) -> str:
        out: list[str] = []
        parts = chunk.split("\n")
        for i, part in enumerate(parts):
            if len(self.head) < _HEAD:
                self.head += part[:_HEAD - len(self.head)]
            self.tail = (self.tail + part[-_TAIL:])[-_TAIL:]
            if self.refused is None:
                try:
                    self._take(part)
                except ShapeError as err:
                    self.refused, self.parts = str(err), []
            if i < len(parts) - 1:
                out.append(self._end_line())
        return "".join(out)

    def _take(self, part: str) -> None:
        if self.budget is None and len(self.head) >= _HEAD:
            found = _ID_FIRST.search(self.head)
            if found is not None:
                self._judge(self._budget(found))
        budget = self.budget or self.top
        if self.size + len(part) > budget.bytes:
            raise ShapeError(over_bytes(budget))
        self.uris.feed(part)
        self.shape.feed(part)
        self.parts.append(part)
        self.size += len(part)

    def _budget(self, found: re.Match[str]) -> Budget:
        return budget_for(self.requests.method(json.loads(found.group(1))), self.read_bytes)

    def _judge(self, budget: Budget) -> None:
        self.budget = budget
        if self.size > budget.bytes:
            raise ShapeError(over_bytes(budget))
        self.shape.check(budget)

    def _end_line(self) -> str:
        found = _ID_FIRST.search(self.head) or _ID_LAST.search(self.tail)
        line = "".join(self.parts)
        if self.refused is None:
            try:
                self._judge(self._budget(found) if found else budget_for(None, self.read_bytes))
            except ShapeError as err:
                self.refused = str(err)
        out = line + "\n" if self.refused is None else _error_line(found, self.refused)
        self._new_line()
        return out


def _error_line(found: re.Match[str] | None, reason: str) -> str:
    if found is None:  # no request to fail: the caller's timeout will
        log.warning("stdio: a message without a request id was dropped: %s", reason)
        return ""
    error = {"code": PARSE_ERROR, "message": reason}
    return json.dumps({"jsonrpc": "2.0", "id": json.loads(found.group(1)), "error": error}) + "\n"


def install() -> None:
    """Make the SDK's stdio reader use ``BoundedLines`` (it looks the name up at call time)."""
    import mcp.client.stdio as stdio

    stdio.TextReceiveStream = BoundedLines  # type: ignore[misc]
