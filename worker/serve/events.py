"""The draft Events extension (``io.modelcontextprotocol/events``, SEP-3415) on ``mcpsync serve``:
EXPERIMENTAL.

Contract (docs/serve.md, "Events extension"):
- One event type, ``resource.changed``: every outbox event of the caller's subject (new version,
  tombstone, revocation, close; not ``overdue``, which changes no resource), ``data`` being the
  ``outboxEvent.v1`` envelope (JSON) without bodies.
- ``events/list`` names it (delivery ``["poll", "push"]``). ``events/stream {name, cursor, maxAgeMs}``
  is the push delivery (``stream_events``): the same events as ``notifications/events/event`` on the request's
  stream, a heartbeat with the cursor during quiet periods. ``events/poll {name, cursor, maxEvents,
  maxAgeMs}`` answers ``{events, cursor, truncated, hasMore, nextPollMs}``. ``cursor: null``
  starts from now (no events, a fresh cursor). A cursor is the outbox position, sealed for the
  subject: a forged one, or another subject's, is -32602. Events come from the outbox table, not
  from memory, so a client resuming with its last cursor gets every event after it, across serve
  restarts. A cursor below what retention pruned answers ``truncated: true`` with the events from
  the oldest kept position: the client must list again (``resources/list``), as ``outbox resync``.
- ``maxAgeMs`` (poll and stream), as the draft defines it: replay starts at the later of the cursor
  and now − maxAgeMs; events of the subject after the cursor created before that floor are skipped
  and the answer says ``truncated: true``. Ignored with ``cursor: null`` (which already means now).
- A subject holds at most its ``event_streams`` quota of streams at once (-32005 past it); the streams
  of a subject woken by one event at the same cursor share one poll (``SharedPages``); a heartbeat
  makes no query. Events announcing a version the visibility rule hides are not replayed.
- Each event: ``eventId`` (opaque and stable for the subject: dedupe by it; ``CursorSigner.event_id``),
  ``name``, ``timestamp`` (the row's created_at), ``data`` (``outboxEvent.v1`` without its global
  ``position`` and ``outbox_id``, which would tell other subjects' activity), and (a deviation for
  poll) its own ``cursor``.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, Notification, RequestParams
from pydantic import ConfigDict, Field

from mcpsync.activities.ledger.outbox import event_from_row
from mcpsync.activities.ledger.serve import outbox_top, subject_events
from mcpsync.worker.serve.cursors import BadCursor
from mcpsync.worker.serve.quota import Quota

if TYPE_CHECKING:
    from mcpsync.worker.serve.server import ServeHub, ServeServer

__all__ = [
    "EVENT_NAME",
    "EXTENSION",
    "EventsPollParams",
    "EventsStreamParams",
    "SharedPages",
    "poll_events",
    "register_events",
    "stream_events",
]

EXTENSION = "io.modelcontextprotocol/events"
EVENT_NAME = "resource.changed"
NOT_FOUND = -32011  # the draft's NotFound
MAX_EVENTS = 500
NEXT_POLL_MS = 1000
HEARTBEAT_S = 15.0
_GLOBAL_ORDER = {"position", "outbox_id"}  # the outbox's order across subjects: never served


class EventsPollParams(RequestParams):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str
    arguments: dict[str, Any] | None = None
    cursor: str | None = None
    max_events: int | None = Field(default=None, alias="maxEvents")
    max_age_ms: int | None = Field(default=None, alias="maxAgeMs")


class EventsStreamParams(RequestParams):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str
    arguments: dict[str, Any] | None = None
    cursor: str | None = None
    max_age_ms: int | None = Field(default=None, alias="maxAgeMs")


class _EventNotification(Notification[dict[str, Any], str]):
    method: str
    params: dict[str, Any]


class EventsListParams(RequestParams):
    model_config = ConfigDict(extra="allow")

    cursor: str | None = None


async def poll_events(hub: ServeHub, subject: str, params: EventsPollParams) -> dict[str, Any]:
    """``events/poll`` for ``subject`` (the handler's body; see the module contract)."""
    if params.name != EVENT_NAME:
        raise MCPError(code=NOT_FOUND, message=f"Unknown event: {params.name}", data={"kind": "event"})
    limit = params.max_events or 100
    if not 1 <= limit <= MAX_EVENTS:
        raise MCPError(code=INVALID_PARAMS, message=f"maxEvents must be between 1 and {MAX_EVENTS}")
    top, pruned = await outbox_top(hub.pool)
    if params.cursor is None:
        return {
            "events": [],
            "cursor": hub.signer.sign("E", str(top), subject),
            "truncated": False,
            "hasMore": False,
            "nextPollMs": NEXT_POLL_MS,
        }
    try:
        after = int(hub.signer.verify("E", params.cursor, subject))
    except (BadCursor, ValueError) as exc:
        raise MCPError(
            code=INVALID_PARAMS, message=f"Invalid cursor: {exc}", data={"reason": "invalid_cursor"}
        ) from None
    if params.max_age_ms is not None and params.max_age_ms < 0:
        raise MCPError(code=INVALID_PARAMS, message="maxAgeMs must not be negative")
    not_before = (
        datetime.now(UTC) - timedelta(milliseconds=params.max_age_ms)
        if params.max_age_ms is not None
        else None
    )
    rows, too_old = await subject_events(hub.pool, subject, max(after, pruned), limit, not_before)
    truncated = after < pruned or too_old
    events = []
    for row in rows:
        envelope = event_from_row(row)
        events.append(
            {
                "eventId": hub.signer.event_id(subject, envelope.position),
                "name": EVENT_NAME,
                "timestamp": envelope.created_at.isoformat(),
                "data": json.loads(envelope.model_dump_json(exclude=_GLOBAL_ORDER)),
                "cursor": hub.signer.sign("E", str(envelope.position), subject),
            }
        )
    has_more = len(rows) == limit
    position = rows[-1]["position"] if has_more else max([top, after, *(r["position"] for r in rows[-1:])])
    return {
        "events": events,
        "cursor": hub.signer.sign("E", str(position), subject),
        "truncated": truncated,
        "hasMore": has_more,
        "nextPollMs": 0 if has_more else NEXT_POLL_MS,
    }


class SharedPages:
    """One outbox query per subject, cursor and outbox tick, shared by that subject's event streams:
    the streams woken by one event at the same cursor await one poll, so a subject's full quota of
    streams costs the ledger one query per event, not one per stream. Nothing is kept for a subject
    once its last stream ends (``forget``)."""

    def __init__(self) -> None:
        self._pages: dict[str, tuple[asyncio.Event, dict[str, asyncio.Future[dict[str, Any]]]]] = {}

    def __len__(self) -> int:
        return len(self._pages)

    async def page(self, hub: ServeHub, subject: str, cursor: str, tick: asyncio.Event) -> dict[str, Any]:
        held = self._pages.get(subject)
        if held is None or held[0] is not tick:  # a new tick: the pages of the last one are old news
            held = self._pages[subject] = (tick, {})
        shared = held[1].get(cursor)
        if shared is None:
            params = EventsPollParams(name=EVENT_NAME, cursor=cursor, maxEvents=100)
            shared = held[1][cursor] = asyncio.ensure_future(poll_events(hub, subject, params))
        return await asyncio.shield(shared)  # a stream that goes away does not cancel the others' poll

    def forget(self, subject: str) -> None:
        self._pages.pop(subject, None)


async def stream_events(
    hub: ServeHub, ctx: ServerRequestContext[Any, Any], subject: str, params: EventsStreamParams
) -> dict[str, Any]:
    """``events/stream``: the push delivery. Sends ``notifications/events/event`` (each with its cursor
    and ``_meta.subscriptionId``) on the request's own stream, read from the outbox exactly as poll
    does, woken by the outbox follower (one query shared by the subject's streams at the same cursor,
    ``SharedPages``); ``notifications/events/heartbeat`` with the current cursor at once
    when nothing is pending (the stream's headers and its confirmation) and after every ``HEARTBEAT_S``
    of quiet (no query: the outbox follower wakes the stream when there is something to read). Runs
    until the client cancels or disconnects, holding one of the subject's ``event_streams`` slots.
    One page at a time: a client that stops reading holds up only its own stream (its writes block),
    never the others."""
    request_id = ctx.request_id
    if request_id is None:
        raise MCPError(code=INVALID_PARAMS, message="events/stream requires a request id")
    if params.name != EVENT_NAME:
        raise MCPError(code=NOT_FOUND, message=f"Unknown event: {params.name}", data={"kind": "event"})
    with hub.quotas.hold(Quota.EVENT_STREAMS, subject):
        try:
            return await _stream(hub, ctx, subject, params, request_id)
        finally:
            if hub.quotas.live(Quota.EVENT_STREAMS, subject) == 1:  # the subject's last stream
                hub.shared_pages.forget(subject)


async def _stream(
    hub: ServeHub,
    ctx: ServerRequestContext[Any, Any],
    subject: str,
    params: EventsStreamParams,
    request_id: Any,
) -> dict[str, Any]:
    meta = {"subscriptionId": request_id}
    cursor, max_age_ms = params.cursor, params.max_age_ms
    first = True
    while True:
        tick = hub.events_tick(subject)
        if cursor is None or max_age_ms is not None:  # where the stream starts: its own query
            page = await poll_events(
                hub,
                subject,
                EventsPollParams(name=params.name, cursor=cursor, maxEvents=100, maxAgeMs=max_age_ms),
            )
        else:
            page = await hub.shared_pages.page(hub, subject, cursor, tick)
        max_age_ms = None  # the floor bounds where the stream starts; then it follows every event
        for event in page["events"]:
            note = _EventNotification(method="notifications/events/event", params={**event, "_meta": meta})
            await ctx.session.send_notification(note, related_request_id=request_id)  # type: ignore[arg-type]
        cursor = page["cursor"]
        if page["truncated"]:
            note = _EventNotification(
                method="notifications/events/heartbeat",
                params={"cursor": cursor, "truncated": True, "_meta": meta},
            )
            await ctx.session.send_notification(note, related_request_id=request_id)  # type: ignore[arg-type]
        if page["hasMore"]:
            continue
        if first and not page["events"] and not page["truncated"]:
            # Nothing pending: a heartbeat now sends the stream's headers and confirms the stream at
            # once (a client's read timeout would otherwise run until the first heartbeat).
            note = _EventNotification(
                method="notifications/events/heartbeat", params={"cursor": cursor, "_meta": meta}
            )
            await ctx.session.send_notification(note, related_request_id=request_id)  # type: ignore[arg-type]
        first = False
        while not tick.is_set():
            try:
                await asyncio.wait_for(tick.wait(), HEARTBEAT_S)
            except TimeoutError:
                note = _EventNotification(
                    method="notifications/events/heartbeat", params={"cursor": cursor, "_meta": meta}
                )
                await ctx.session.send_notification(note, related_request_id=request_id)  # type: ignore[arg-type]


def register_events(server: ServeServer, hub: ServeHub) -> None:
    async def events_list(ctx: ServerRequestContext[Any, Any], params: EventsListParams) -> dict[str, Any]:
        hub.subject_of(ctx)
        return {
            "events": [
                {
                    "name": EVENT_NAME,
                    "description": "A subscribed resource changed for this subject: a new accepted version, "
                    "a tombstone, "
                    "a revocation or a close (data: mcpsync outboxEvent.v1, no body). Experimental.",
                    "delivery": ["poll", "push"],
                    "inputSchema": {"type": "object", "properties": {}},
                    "payloadSchema": {
                        "type": "object",
                        "description": "mcpsync outboxEvent.v1 (docs/outbox.md)",
                    },
                }
            ]
        }

    async def events_poll(ctx: ServerRequestContext[Any, Any], params: EventsPollParams) -> dict[str, Any]:
        return await poll_events(hub, hub.subject_of(ctx), params)

    async def events_stream(
        ctx: ServerRequestContext[Any, Any], params: EventsStreamParams
    ) -> dict[str, Any]:
        return await stream_events(hub, ctx, hub.subject_of(ctx), params)

    server.add_request_handler("events/list", EventsListParams, events_list)  # type: ignore[arg-type]
    server.add_request_handler("events/stream", EventsStreamParams, events_stream)  # type: ignore[arg-type]
    server.add_request_handler("events/poll", EventsPollParams, events_poll)  # type: ignore[arg-type]
