"""``mcpsync serve``: an MCP server whose resources are one subject's subscribed resources.

Contract (docs/serve.md):
- mcp 2.3 lowlevel ``Server``, both editions on one transport (as the fixture server):
  2025-11-25 ``resources/subscribe`` / ``unsubscribe`` with ``notifications/resources/updated`` and
  ``list_changed``; 2026-07-28 ``subscriptions/listen`` (the SDK's ``ListenHandler``, one
  in-memory bus per subject) and ``ttlMs`` / ``cacheScope`` on list and read results (ttl 0,
  private: every body is one subject's).
- Subject: HTTP ``Authorization: Bearer <token>`` through the configured tokens (the HTTP layer,
  ``serve_gate``, answers 401 to unknown or missing tokens before any MCP handling and binds each
  session to its subject); stdio: the configured subject.
- ``resources/list``: one ledger snapshot per listing, paged with sealed cursors that name the
  snapshot (kept in memory, the subject's ``--max-snapshots`` newest); a cursor of an evicted snapshot,
  another subject's or a forged one is -32602 and the client lists again from the start. Each later page of
  a snapshot is re-checked against the visibility rule: after a revocation an old cursor pages only
  what is still visible.
- What a subject sees (list, read, subscribe, listen priming, events) is decided by one rule,
  ``activities/ledger/visibility.py``: nothing of a revoked scope, whatever the subscription's state.
- Quotas per subject (``serve_quota``): listens, URIs per listen, event streams, listing snapshots,
  sessions; past one, -32005 naming it (snapshots: the subject's oldest is dropped). A stream's slot
  and its bus registration are released when it ends.
- ``resources/read``: the body from the content store through ``released_content`` (own subject,
  guardrail released, not revoked, digest checked), exactly as read upstream. Not found: -32602
  (2026-07-28) / -32002 (2025-11-25); refused: -32003 with the reason; ``_meta``
  ``io.mcpsync/requireFresh: true`` and not fresh: -32004 with the reason, never the body.
- Notifications come from the outbox (``serve_run`` follows it, unregistered or as a named
  durable consumer, and calls ``ServeHub.announce``), and for a guardrail-rejected version (no
  outbox event) from its audit row (``serve_rejections``, ``ServeHub.announce_updated``): the read
  is then refused with the reason.
  Each legacy session's pending notifications are level-based (``serve_pending``: one pending
  ``updated`` per URI, one ``list_changed`` flag, the oldest first), drained by its own task; a
  session with more than ``client_buffer`` distinct URIs waiting unread is cut off: its
  subscriptions are dropped and it is told why in a ``notifications/message`` (level error), the
  last thing it gets. Listen streams are bounded by the SDK's handler (not coalesced).
- Bodies and tokens are never logged.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    ResourcesListChanged,
    ResourceUpdated,
    ServerEvent,
)
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from psycopg_pool import AsyncConnectionPool

from mcpsync import __version__
from mcpsync.activities.ledger.outbox import WITHDRAWING, OutboxEventType, OutboxEventV1
from mcpsync.activities.ledger.released import ContentKind, ContentNotFound, ContentRefused, released_content
from mcpsync.activities.ledger.serve import (
    ServedResource,
    freshness_meta,
    list_served,
    rejection_reason,
    served_resource,
    served_uris,
    still_visible,
)
from mcpsync.worker.serve.cursors import BadCursor, CursorSigner
from mcpsync.worker.serve.events import SharedPages
from mcpsync.worker.serve.pending import Added, PendingNotifications
from mcpsync.worker.serve.quota import Quota, QuotaLimits, Quotas
from mcpsync.worker.serve.tokens import subject_for_authorization

__all__ = ["DENIED", "LEGACY_NOT_FOUND", "NOT_FRESH", "ServeConfig", "ServeHub", "build_server"]

logger = logging.getLogger("mcpsync.serve")

LEGACY_NOT_FOUND = -32002
DENIED = -32003
NOT_FRESH = -32004
FRESHNESS_META = "io.mcpsync/freshness"
REQUIRE_FRESH = "io.mcpsync/requireFresh"


@dataclass(frozen=True, slots=True)
class ServeConfig:
    transport: Literal["http", "stdio"] = "http"
    host: str = "127.0.0.1"
    port: int = 0
    tokens: tuple[tuple[str, str], ...] = ()  # (token, subject)
    stdio_subject: str | None = None
    page_size: int = 50
    max_age_seconds: float | None = None  # the published staleness bound (None: push-driven, no age limit)
    consumer: str | None = None  # a durable outbox consumer name; None: follow unregistered
    client_buffer: int = 256  # distinct URIs pending per legacy client before it is cut off
    max_request_bytes: int = 1_000_000
    name: str = "mcpsync-serve"
    allowed_hosts: tuple[str, ...] = ()  # empty: serve_gate.default_hosts of the bind
    allowed_origins: tuple[str, ...] = ()  # empty: serve_gate.default_origins of the bind
    header_timeout: float = 10.0  # seconds to send a request's head (serve_connections)
    max_connections: int = 1024  # open HTTP connections (serve_connections)
    quotas: QuotaLimits = field(default_factory=QuotaLimits)  # per subject (docs/serve.md, "Quotas")



@dataclass(eq=False, slots=True)
class _Session:
    key: int
    connection: Connection
    subject: str
    pending: PendingNotifications
    subscriptions: set[str] = field(default_factory=set)
    sender: asyncio.Task[None] | None = None
    cut_off: str | None = None


class _PrimedBus:
    """One listen stream's view of its subject's bus: ``first`` reaches the listener as soon as it
    subscribes (before any later event), then the subject's events as published."""

    def __init__(self, bus: InMemorySubscriptionBus, first: list[ServerEvent]) -> None:
        self._bus = bus
        self._first = first

    async def publish(self, event: ServerEvent) -> None:
        await self._bus.publish(event)

    def subscribe(self, listener: Callable[[ServerEvent], None]) -> Callable[[], None]:
        unsubscribe = self._bus.subscribe(listener)
        for event in self._first:
            listener(event)
        return unsubscribe


class ServeHub:
    """Shared state of one serve process: the ledger pool, sessions, listen buses, snapshots."""

    def __init__(self, config: ServeConfig, pool: AsyncConnectionPool, signer: CursorSigner) -> None:
        self.config = config
        self.pool = pool
        self.signer = signer
        self.sessions: dict[int, _Session] = {}
        self._buses: dict[str, InMemorySubscriptionBus] = {}
        self._listens: set[ListenHandler] = set()
        self._snapshots: dict[str, OrderedDict[str, list[ServedResource]]] = {}  # by subject, oldest first
        self.quotas = Quotas(config.quotas)
        self.shared_pages = SharedPages()
        self._keys = itertools.count(1)
        self._ticks: dict[str, asyncio.Event] = {}
        # sent: notifications sent to legacy sessions; coalesced: ones merged into one already pending
        self.stats = {"announced": 0, "sent": 0, "coalesced": 0, "cut_off": 0, "reads": 0, "lists": 0}

    # -- subjects ----------------------------------------------------------------------
    def subject_for_authorization(self, authorization: str | None) -> str | None:
        return subject_for_authorization(self.config.tokens, authorization)

    def subject_of(self, ctx: ServerRequestContext[Any, Any]) -> str:
        request = ctx.request
        if request is None:
            if self.config.stdio_subject is None:
                raise MCPError(code=DENIED, message="Forbidden: no subject configured for stdio")
            return self.config.stdio_subject
        headers = getattr(request, "headers", None)
        subject = self.subject_for_authorization(
            headers.get("authorization") if headers is not None else None
        )
        if subject is None:  # the HTTP gate answers 401 first; this is the belt to its braces
            raise MCPError(code=DENIED, message="Forbidden: unknown or missing bearer token")
        return subject

    # -- legacy sessions ---------------------------------------------------------------
    def legacy_session(self, ctx: ServerRequestContext[Any, Any]) -> _Session | None:
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None
        connection = getattr(ctx.session, "_connection", None)  # mcp 2.3: the per-connection object
        if not isinstance(connection, Connection):
            return None
        key = connection.state.get("serve_session_key")
        if isinstance(key, int) and key in self.sessions:
            session = self.sessions[key]
            if self.subject_of(ctx) != session.subject:  # another subject's token on this session's id
                raise MCPError(code=DENIED, message="Forbidden: this session belongs to another subject")
            return session
        subject = self.subject_of(ctx)
        self.quotas.take(Quota.SESSIONS, subject)
        key = next(self._keys)
        connection.state["serve_session_key"] = key
        session = _Session(key, connection, subject, PendingNotifications(self.config.client_buffer))
        session.sender = asyncio.get_running_loop().create_task(
            self._drain(session), name=f"serve-session-{key}"
        )
        self.sessions[key] = session
        connection.exit_stack.callback(self._close_session, key)
        return session

    def _close_session(self, key: int) -> None:
        session = self.sessions.pop(key, None)
        if session is None:
            return
        self.quotas.give_back(Quota.SESSIONS, session.subject)
        if session.sender is not None:
            session.sender.cancel()

    async def _drain(self, session: _Session) -> None:
        while True:
            kind, uri = await session.pending.take()
            try:
                # No time bound: a send cancelled half way through the SDK's streams leaves the
                # session unable to send again. A stuck client holds only this task (its pending set
                # grows and it is cut off); its disconnect ends the session and cancels the task.
                if kind == "updated" and uri is not None:
                    await session.connection.send_resource_updated(uri)
                elif kind == "list_changed":
                    await session.connection.send_resource_list_changed()
                else:
                    await session.connection.log("error", {"reason": uri}, logger="mcpsync.serve")
                self.stats["sent"] += 1
            except Exception:  # a dead or stuck client must not stop its own sender for good
                logger.warning("could not send %s to session %d", kind, session.key)
            if kind == "cut_off":  # the last thing the session gets
                return

    def enqueue(self, session: _Session, kind: Literal["updated", "list_changed"], uri: str | None) -> None:
        added = session.pending.add(kind, uri)
        if added is Added.MERGED:
            self.stats["coalesced"] += 1
        elif added is Added.FULL:
            reason = (
                f"cut off: {session.pending.limit} notifications waiting unread; "
                "subscriptions dropped, reconnect and list again"
            )
            session.cut_off = reason
            session.subscriptions.clear()
            self.stats["cut_off"] += 1
            logger.warning("session %d cut off (slow client)", session.key)
            session.pending.finish(("cut_off", reason))

    # -- 2026-07-28 listen ---------------------------------------------------------------
    def bus(self, subject: str) -> InMemorySubscriptionBus:
        bus = self._buses.get(subject)
        if bus is None:
            bus = self._buses[subject] = InMemorySubscriptionBus()
        return bus

    async def listen(
        self, ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """One ``subscriptions/listen`` stream: the SDK's ``ListenHandler`` over the subject's bus, primed
        with one ``ResourceUpdated`` for each requested URI that has a current accepted version (the
        subscribe rule, docs/serve.md)."""
        subject = self.subject_of(ctx)
        wanted = params.notifications.resource_subscriptions or []
        self.quotas.check_size(Quota.LISTEN_URIS, len(wanted))
        with self.quotas.hold(Quota.LISTENS, subject):
            current = await served_uris(self.pool, subject, wanted) if wanted else set()
            first: list[ServerEvent] = [ResourceUpdated(u) for u in dict.fromkeys(wanted) if u in current]
            handler = ListenHandler(
                _PrimedBus(self.bus(subject), first),
                max_subscriptions=1,
                max_buffered_events=self.config.client_buffer,
            )
            self._listens.add(handler)
            try:
                return await handler(ctx, params)
            finally:
                self._listens.discard(handler)
                if self.quotas.live(Quota.LISTENS, subject) == 1:  # the last one: drop the subject's bus
                    self._buses.pop(subject, None)

    def close_all_streams(self) -> None:
        for handler in list(self._listens):
            handler.close()

    # -- outbox fan-out ----------------------------------------------------------------
    def events_tick(self, subject: str) -> asyncio.Event:
        """An event set at the subject's next outbox event (events/stream waits on it)."""
        tick = self._ticks.get(subject)
        if tick is None:
            tick = self._ticks[subject] = asyncio.Event()
        return tick

    async def announce(self, event: OutboxEventV1) -> None:
        """Fan one outbox event out to the subject's connected clients (never blocks on a client). An
        ``overdue`` event changes no resource: nothing to announce."""
        if event.event_type == OutboxEventType.OVERDUE:
            return
        self.stats["announced"] += 1
        tick = self._ticks.pop(event.subject, None)
        if tick is not None:
            tick.set()
        catalog_changed = event.event_type in WITHDRAWING or event.previous_digest is None
        for session in list(self.sessions.values()):
            if session.subject != event.subject:
                continue
            if event.uri in session.subscriptions:
                self.enqueue(session, "updated", event.uri)
                if event.event_type in WITHDRAWING:
                    session.subscriptions.discard(event.uri)
            if catalog_changed:
                self.enqueue(session, "list_changed", None)
        bus = self._buses.get(event.subject)
        if bus is not None:
            await bus.publish(ResourceUpdated(event.uri))
            if catalog_changed:
                await bus.publish(ResourcesListChanged())

    async def announce_updated(self, subject: str, uri: str) -> None:
        """``updated`` for one URI to the subject's clients subscribed to it, with no outbox event
        behind it (a guardrail rejection: ``serve_rejections``)."""
        for session in list(self.sessions.values()):
            if session.subject == subject and uri in session.subscriptions:
                self.enqueue(session, "updated", uri)
        bus = self._buses.get(subject)
        if bus is not None:
            await bus.publish(ResourceUpdated(uri))

    def live_registrations(self) -> int:
        """Everything held for open streams and sessions: quota slots, listen handlers, listeners on
        the subjects' buses (0 once every stream and session has ended)."""
        listeners = sum(len(getattr(bus, "_listeners", ())) for bus in self._buses.values())
        return self.quotas.held() + len(self._listens) + listeners + len(self._buses) + len(self.shared_pages)

    async def announce_relist(self, subjects: set[str]) -> None:
        """After a gap: every client of these subjects must list and read again."""
        for subject in subjects:  # event streams poll again
            tick = self._ticks.pop(subject, None)
            if tick is not None:
                tick.set()
        for session in list(self.sessions.values()):
            if session.subject in subjects:
                for uri in list(session.subscriptions):
                    self.enqueue(session, "updated", uri)
                self.enqueue(session, "list_changed", None)
        for subject in subjects:
            bus = self._buses.get(subject)
            if bus is not None:
                await bus.publish(ResourcesListChanged())

    # -- listing snapshots -------------------------------------------------------------
    def _remember(self, subject: str, items: list[ServedResource], top: int) -> str:
        """Keep a snapshot; past the subject's quota its own oldest is dropped (never another's)."""
        sid = f"{top}-{next(self._keys)}"
        held = self._snapshots.setdefault(subject, OrderedDict())
        held[sid] = items
        while len(held) > self.config.quotas.snapshots:
            held.popitem(last=False)
        return sid

    async def page(self, subject: str, cursor: str | None) -> tuple[list[ServedResource], str | None]:
        size = self.config.page_size
        if cursor is None or cursor == "":
            top, items = await list_served(self.pool, subject)
            sid, offset = (self._remember(subject, items, top) if len(items) > size else ""), 0
        else:
            try:
                sid, _, off = self.signer.verify("L", cursor, subject).partition("~")
                offset = int(off)
            except (BadCursor, ValueError) as exc:
                raise MCPError(
                    code=INVALID_PARAMS,
                    message=f"Invalid cursor: {exc}; list again from the start",
                    data={"reason": "invalid_cursor"},
                ) from None
            items_held = self._snapshots.get(subject, OrderedDict()).get(sid)
            if items_held is None:
                raise MCPError(
                    code=INVALID_PARAMS,
                    message="Invalid cursor: its listing snapshot expired; list again from the start",
                    data={"reason": "snapshot_expired"},
                )
            items = items_held
        chunk = items[offset : offset + size]
        if offset and chunk:  # a later page of a snapshot: a revocation since then hides what it covers
            visible = await still_visible(self.pool, subject, [r.receipt_id for r in chunk])
            chunk = [r for r in chunk if r.receipt_id in visible]
        following = offset + size
        next_cursor = self.signer.sign("L", f"{sid}~{following}", subject) if following < len(items) else None
        return chunk, next_cursor


def _annotations(r: ServedResource) -> types.Annotations:
    """``lastModified``: when the served version was accepted (moves only with a new version)."""
    return types.Annotations(last_modified=r.accepted_at.isoformat())


def _not_found(uri: str, protocol_version: str) -> MCPError:
    code = INVALID_PARAMS if protocol_version in MODERN_PROTOCOL_VERSIONS else LEGACY_NOT_FOUND
    return MCPError(code=code, message=f"Resource not found: {uri}", data={"uri": uri})


class ServeServer(Server[Any]):
    """Lowlevel server advertising subscribe and listChanged on both editions."""

    def __init__(self, hub: ServeHub, **kwargs: Any) -> None:
        super().__init__(hub.config.name, version=__version__, **kwargs)
        self.hub = hub

    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        caps = super().get_capabilities(
            notification_options, experimental_capabilities, extensions, protocol_version=protocol_version
        )
        experimental = {
            **(caps.experimental or {}),
            "io.modelcontextprotocol/events": {"status": "experimental", "delivery": ["poll", "push"]},
        }
        return caps.model_copy(
            update={
                "resources": types.ResourcesCapability(subscribe=True, list_changed=True),
                "experimental": experimental,
            }
        )


class _SessionMiddleware:
    def __init__(self, hub: ServeHub) -> None:
        self.hub = hub

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.request_id is not None:
            self.hub.legacy_session(ctx)
        return await call_next(ctx)


def build_server(hub: ServeHub) -> ServeServer:
    from mcpsync.worker.serve.events import register_events

    max_age = hub.config.max_age_seconds

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        hub.stats["lists"] += 1
        subject = hub.subject_of(ctx)
        chunk, next_cursor = await hub.page(subject, params.cursor if params is not None else None)
        resources = [
            types.Resource(
                uri=r.uri,
                name=r.name,
                title=r.title,
                mime_type=r.mime_type,
                size=r.size,
                annotations=_annotations(r),
                _meta={FRESHNESS_META: freshness_meta(r, max_age)},
            )
            for r in chunk
        ]
        return types.ListResourcesResult(
            resources=resources, next_cursor=next_cursor, ttl_ms=0, cache_scope="private"
        )

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        hub.stats["reads"] += 1
        subject = hub.subject_of(ctx)
        served = await served_resource(hub.pool, subject, params.uri)
        if served is None:
            raise _not_found(params.uri, ctx.protocol_version)
        meta = freshness_meta(served, max_age)
        if served.guardrail_rejected:
            why = await rejection_reason(hub.pool, served.workflow_id)
            raise MCPError(
                code=DENIED,
                message="Forbidden: the newest version was not released by the guardrail "
                f"(GUARDRAIL_REJECTED: {why or 'no reason recorded'}); the older accepted version is "
                "not current",
                data={"uri": params.uri, "reason": why, FRESHNESS_META: meta},
            )
        if params.meta is not None and params.meta.get(REQUIRE_FRESH) is True and not meta["fresh"]:
            raise MCPError(
                code=NOT_FRESH,
                message=f"Not fresh: {meta.get('notFreshBecause')}",
                data={"uri": params.uri, FRESHNESS_META: meta},
            )
        try:
            content = await released_content(hub.pool, receipt_id=served.body_receipt_id, subject=subject)
        except ContentRefused as exc:
            raise MCPError(code=DENIED, message=f"Forbidden: {exc}", data={"uri": params.uri}) from None
        except ContentNotFound as exc:
            raise MCPError(
                code=DENIED, message=f"Content unavailable: {exc}", data={"uri": params.uri}
            ) from None
        item_meta = {FRESHNESS_META: meta}
        part: types.TextResourceContents | types.BlobResourceContents
        if content.kind == ContentKind.TEXT:
            part = types.TextResourceContents(
                uri=params.uri,
                mime_type=content.mime_type,
                text=content.body.decode("utf-8"),
                _meta=item_meta,
            )
        else:
            part = types.BlobResourceContents(
                uri=params.uri,
                mime_type=content.mime_type,
                blob=base64.b64encode(content.body).decode("ascii"),
                _meta=item_meta,
            )
        return types.ReadResourceResult(
            contents=[part], ttl_ms=0, cache_scope="private", _meta={FRESHNESS_META: meta}
        )

    async def subscribe(
        ctx: ServerRequestContext[Any, Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        session = hub.legacy_session(ctx)
        if session is None:
            raise MCPError(code=INTERNAL_ERROR, message="No session for subscribe")
        if session.cut_off is not None:
            raise MCPError(code=INTERNAL_ERROR, message=session.cut_off)
        if await served_resource(hub.pool, session.subject, params.uri) is None:
            raise _not_found(params.uri, ctx.protocol_version)
        session.subscriptions.add(params.uri)
        hub.enqueue(session, "updated", params.uri)  # the subscribe rule: read the current version now
        return types.EmptyResult()

    async def list_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        hub.subject_of(ctx)
        return types.ListResourceTemplatesResult(resource_templates=[])  # every resource is listed by URI

    async def unsubscribe(
        ctx: ServerRequestContext[Any, Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        session = hub.legacy_session(ctx)
        if session is not None:
            session.subscriptions.discard(params.uri)
        return types.EmptyResult()

    server = ServeServer(
        hub,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_subscriptions_listen=hub.listen,
    )
    server.middleware.append(_SessionMiddleware(hub))
    register_events(server, hub)
    return server
