"""Fuzz pass over the parsers that take an upstream server's bytes before the SDK does
(worker/ingress/reply_shape.py, worker/ingress/transport_bounds.py): the
structural scanner, the SSE event counter,
the stdio line bound (``BoundedLines``) and the HTTP body and event streams.

The contract, for any input cut into any chunks: nothing is raised but the named error
(``ShapeError``; over HTTP ``ResponseTooLarge`` / ``EventTooLarge``); a message over its budget (values,
depth, bytes) is refused; a JSON-RPC reply within it is accepted, unchanged. The oracle counts the
parsed value (containers, object keys and scalars), which the scanner never builds."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcpsync.worker.ingress.reply_shape import Budget, ShapeError, ShapeScanner, SseShape, budget_for
from mcpsync.worker.ingress.transport_bounds import (
    BoundedLines,
    EventTooLarge,
    RequestMethods,
    ResponseTooLarge,
    bounded_http_transport,
    stdio_bounds,
)

FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
SMALL = Budget(bytes=10**9, values=40, depth=6, source="fuzz")

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=5), max_leaves=60)

noise = st.text(alphabet=st.characters(exclude_characters='"\n'), max_size=300)  # no id, one line


def _values(value: Any) -> int:
    if isinstance(value, list):
        return 1 + sum(_values(v) for v in value)
    if isinstance(value, dict):
        return 1 + sum(1 + _values(v) for v in value.values())
    return 1


def _depth(value: Any) -> int:
    if isinstance(value, list | dict):
        inner = value.values() if isinstance(value, dict) else value
        return 1 + max((_depth(v) for v in inner), default=0)
    return 0


def _reply(result: Any, request_id: int = 7) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"_meta": {"x": result}}}


def _cut(data: Any, cuts: list[int]) -> list[Any]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in zip(points, points[1:], strict=False)]


def _over(message: Any, budget: Budget) -> bool:
    return _values(message) > budget.values or _depth(message) > budget.depth


@FUZZ
@given(json_values, st.lists(st.integers(0, 10**6), max_size=8), st.booleans(), st.booleans(), st.booleans())
def test_the_scanner_refuses_exactly_the_messages_over_their_budget(
        value: Any, cuts: list[int], as_bytes: bool, ascii_only: bool, pretty: bool) -> None:
    message = _reply(value)
    text = json.dumps(message, ensure_ascii=ascii_only, indent=1 if pretty else None)
    data = text.encode() if as_bytes else text
    scanner = ShapeScanner(SMALL)
    try:
        for chunk in _cut(data, cuts):
            scanner.feed(chunk)
    except ShapeError:
        assert _over(message, SMALL), "a message within its budget was refused"
    else:
        assert not _over(message, SMALL), "a message over its budget was accepted"
        assert scanner.values == _values(message) and scanner.depth == 0 and not scanner.in_string


@FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 10**6), max_size=8))
def test_the_scanner_and_the_event_counter_raise_nothing_else_on_any_bytes(data: bytes,
                                                                          cuts: list[int]) -> None:
    for counter in (ShapeScanner(SMALL), SseShape(SMALL)):
        try:
            for chunk in _cut(data, cuts):
                counter.feed(chunk)
        except ShapeError:
            pass


@FUZZ
@given(st.lists(json_values, min_size=1, max_size=4), st.sampled_from([b"\n", b"\r\n", b"\r"]),
       st.lists(st.integers(0, 10**6), max_size=8), st.booleans())
def test_each_event_is_counted_alone_whatever_its_line_ends_and_chunks(
        values: list[Any], eol: bytes, cuts: list[int], noise: bool) -> None:
    messages = [_reply(v, i) for i, v in enumerate(values)]
    body = b""
    for message in messages:
        text = json.dumps(message, indent=1).encode()  # several lines: several data: lines
        if noise:
            body += b": a comment" + eol + b"id: 1" + eol + b"event: message" + eol
        body += b"".join(b"data:" + (b" " if i % 2 else b"") + line + eol
                         for i, line in enumerate(text.split(b"\n"))) + eol
    events = SseShape(SMALL)
    try:
        for chunk in _cut(body, cuts):
            events.feed(chunk)
    except ShapeError:
        assert any(_over(m, SMALL) for m in messages), "events within their budget were refused"
    else:
        assert not any(_over(m, SMALL) for m in messages), "an event over its budget was accepted"


def _lines(read_bytes: int, requests: RequestMethods) -> BoundedLines:
    with stdio_bounds(read_bytes, requests):
        return BoundedLines(None)  # type: ignore[arg-type]  # _feed never touches the stream


@FUZZ
@given(st.lists(st.tuples(json_values, st.booleans(), noise), max_size=6),
       st.lists(st.integers(0, 10**6), max_size=8), st.integers(50, 3000))
def test_stdio_lines_come_out_whole_within_their_budget_or_as_an_error(
        items: list[tuple[Any, bool, str]], cuts: list[int], read_bytes: int) -> None:
    """Each item is a reply (its id first, as Python servers write, or last, as TypeScript servers
    do) to a read of its own, then a line of noise."""
    requests, lines, replies = RequestMethods(), [], {}
    for request_id, (value, id_last, noise) in enumerate(items):
        requests.sent(request_id, "resources/read")
        body = {"jsonrpc": "2.0", "result": {"_meta": {"x": value}}}
        message = {**body, "id": request_id} if id_last else {"id": request_id, **body}
        replies[request_id] = json.dumps(message)
        lines += [replies[request_id], noise]
    bounded = _lines(read_bytes, requests)
    out = "".join(bounded._feed(chunk) for chunk in _cut("".join(line + "\n" for line in lines), cuts))
    assert out == "" or out.endswith("\n"), "only whole lines come out"
    budget = budget_for("resources/read", read_bytes)
    got = out.split("\n")[:-1]
    for line in got:
        assert len(line) <= max(budget.bytes, budget_for(None, read_bytes).bytes)
    for request_id, line in replies.items():
        if len(line) <= budget.bytes:
            assert line in got, "a reply within its budget passes unchanged"
        else:
            head = '{"jsonrpc": "2.0", "id": ' + str(request_id)
            refused = [json.loads(g) for g in got if g.startswith(head)]
            assert line not in got and refused and refused[0]["error"]["code"] == -32700, got
            assert "byte limit" in refused[0]["error"]["message"]


def test_a_stdio_notification_over_its_budget_is_dropped_with_a_warning(caplog: Any) -> None:
    bounded = _lines(4096, RequestMethods())
    huge = json.dumps({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                       "params": {"uri": "x" * (budget_for(None, 4096).bytes + 1)}})
    ok = json.dumps({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "y"}})
    with caplog.at_level("WARNING", logger="mcpsync.ingress"):
        out = bounded._feed(huge + "\n" + ok + "\n")
    assert out == ok + "\n", "the notification over its budget is dropped, the next one passes"
    assert "dropped: response over the byte limit" in caplog.text and "xxxx" not in caplog.text


@FUZZ
@given(json_values, st.integers(100, 4000), st.booleans(), st.lists(st.integers(0, 10**6), max_size=8))
def test_http_bodies_and_events_are_refused_only_with_the_named_errors(
        value: Any, read_bytes: int, sse: bool, cuts: list[int]) -> None:
    message = _reply(value)
    data = json.dumps(message).encode()
    budget = budget_for("resources/read", read_bytes)
    # An event's data is its data lines, each with the newline that joins them.
    refused = len(data) + (1 if sse else 0) > budget.bytes or _over(message, budget)
    body = b"event: message\ndata: " + data + b"\n\n" if sse else data
    got, error = asyncio.run(_fetch(body, _cut(body, cuts), sse, read_bytes))
    if error is None:
        assert got == body and not refused, "a body over its budget was accepted"
    else:
        assert isinstance(error, EventTooLarge if sse else ResponseTooLarge), repr(error)
        assert refused and "byte limit" in str(error), str(error)


class _Chunks(httpx2.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


class _Upstream(httpx2.AsyncBaseTransport):
    def __init__(self, chunks: list[bytes], content_type: str) -> None:
        self.chunks, self.content_type = chunks, content_type

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": self.content_type}, stream=_Chunks(self.chunks))


async def _fetch(body: bytes, chunks: list[bytes], sse: bool,
                 read_bytes: int) -> tuple[bytes, Exception | None]:
    """POST a resources/read through ``bounded_http_transport`` to an upstream answering ``chunks``."""
    upstream = _Upstream(chunks, "text/event-stream" if sse else "application/json")
    async with httpx2.AsyncClient(transport=bounded_http_transport(read_bytes, upstream)) as client:
        request = {"jsonrpc": "2.0", "id": 7, "method": "resources/read", "params": {"uri": "x"}}
        try:
            async with client.stream("POST", "http://upstream/mcp", json=request) as response:
                return b"".join([chunk async for chunk in response.aiter_raw()]), None
        except (ResponseTooLarge, EventTooLarge) as err:
            return b"", err


def test_a_server_request_that_reuses_a_pending_id_leaves_the_reply_its_budget() -> None:
    """The server numbers its own requests (ping) as it likes: one with a pending read's id must not
    take that read's budget away from the read's reply (2 MiB: over any other message's 1 MiB)."""
    requests = RequestMethods()
    requests.sent(1, "resources/read")
    bounded = _lines(4 * 1024 * 1024, requests)
    ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    contents = [{"uri": "a", "text": "x" * 2**21}]
    reply = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"contents": contents}})
    assert bounded._feed(ping + "\n" + reply + "\n") == ping + "\n" + reply + "\n"
