"""MCP activities that run over the live sessions of one ingress process (its task queue).

Contract:
- One set of activities serves every (subject, server) session its process holds: each
  request names the key and the session generation it was allocated for, and runs over the
  live session ``SessionLookup(subject, server)`` returns. No live session for that key in this
  process (never held, lease lost, lost, replaced) is the same answer as an older generation:
  SESSION_LOST / "session generation is gone", nothing sent to any server.
- ``mcp_read`` calls ``resources/read`` on the *current* session and only if its
  generation is the one the workflow allocated the read for; otherwise it answers
  SESSION_LOST and reads nothing. The body enters the content store, keyed by (subject, digest),
  only in the accept's transaction and only when the verdict releases it (``FenceLedger.accept_judged``:
  the read cycle hands it over in memory; a standalone ``mcp_read`` parks it in ``content_pending``
  for its accept). The activity returns digest and metadata only.
- Errors are classified, never guessed: not found (-32002, or -32602 naming the
  URI / saying "not found"), denied (auth-like codes), malformed content (bad
  base64, wrong types, over the size limit), session lost (connection closed).
  A read timeout is raised so Temporal retries it.
- A read records the result's ``ttlMs`` / ``cacheScope`` (2026-07-28; the SDK fills 0 / private
  on older editions) in the outcome: metadata for receipts and the poll period, never a cache.
- ``mcp_subscribe`` / ``mcp_unsubscribe`` use ``resources/subscribe`` on
  2025-11-25 and one ``subscriptions/listen`` stream per URI on 2026-07-28.
- A listen stream that ends under us (backlog overflow, dropped without the graceful close,
  or closed by the server) is a gap: ``on_stream_lost`` is told why, then the session is lost.
  Overflow is either backlog: the SDK's (unconsumed events on the stream) or the consumer's
  (``on_uri_updated`` raised ``BacklogOverflow``: it cannot hold one more notification).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import warnings
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.client.subscriptions import SubscriptionLost
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from mcpsync.activities.guardrails import GuardrailChain, default_chain
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.content import ReadBody
from mcpsync.activities.meters import NO_METERS, Meters
from mcpsync.workflows.digest import ContentPart, content_digest
from mcpsync.workflows.ledger_rules import marked_active
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.base import replaced
from mcpsync.workflows.records.ledger import AcceptRequest, KeyRequest
from mcpsync.workflows.records.mcp_calls import (
    ReadOutcome,
    ReadOutcomeKind,
    ReadRequest,
    SubscribeOutcome,
    SubscribeRequest,
    UnsubscribeOutcome,
    UnsubscribeRequest,
)
from mcpsync.workflows.records.read_cycle import (
    ReadCycleRequest,
    ReadCycleResult,
    SubscribeCycleRequest,
    SubscribeCycleResult,
)
from mcpsync.workflows.records.subscription import CacheScope, SubscriptionKey

__all__ = ["BacklogOverflow", "LiveSession", "SessionLookup", "StreamLoss", "McpSessionActivities",
           "classify_error", "content_parts", "read_digest", "MULTIPART_MIME",
           "metadata_text", "MAX_METADATA_CHARS"]

log = logging.getLogger("mcpsync.session")

MULTIPART_MIME = "application/vnd.mcpsync.contents+json"
NOT_FOUND_CODES = {-32002}
CONNECTION_CLOSED = -32000
REQUEST_TIMEOUT = -32001
PARSE_ERROR = -32700
PROTOCOL_CODES = {-32700, -32600, -32601}
DENIED_HINTS = ("unauthorized", "forbidden", "permission", "access denied", "not authorized")

UriHandler = Callable[[str, int], Awaitable[None]]
SessionLookup = Callable[[str, str], "LiveSession | None"]  # (subject, server) -> live session held here
# (uri or None: list_changed, why, detail)
LossHandler = Callable[[str | None, "StreamLoss", str], Awaitable[None]]


class BacklogOverflow(RuntimeError):
    """Raised by an ``on_uri_updated`` handler whose backlog is full: the notification it was given
    is not kept, so the listen stream that carried it is lost to overflow (a gap)."""


class StreamLoss(StrEnum):
    """Why a 2026-07-28 listen stream ended under us (audit ``LISTEN_STREAM_LOST``)."""

    OVERFLOW = "overflow"  # a backlog cap: the SDK's unconsumed events, or the consumer's (BacklogOverflow)
    DROPPED = "dropped"  # ended without the server's graceful close (an error, the connection)
    ENDED = "ended"  # the server closed it gracefully: still no more notifications on it


def _loss_reason(exc: BaseException) -> StreamLoss:
    cause = exc.__cause__
    if isinstance(cause, MCPError) and "backlog exceeded" in (cause.message or ""):
        return StreamLoss.OVERFLOW
    return StreamLoss.DROPPED
LIST_CHANGED_STREAM = "\x00list_changed"  # key of the list_changed stream in LiveSession.listens


def classify_error(err: MCPError) -> ReadOutcomeKind | None:
    """Outcome kind for an MCP error; None means transient (retry)."""
    msg = (err.message or "").lower()
    data = err.data if isinstance(err.data, dict) else {}
    if err.code in NOT_FOUND_CODES \
        or (err.code == types.INVALID_PARAMS and ("uri" in data or "not found" in msg)):
        return ReadOutcomeKind.NOT_FOUND
    if "byte limit" in msg and err.code in (CONNECTION_CLOSED, PARSE_ERROR):
        # One response larger than the transport's bound (the SSE event cap, the JSON response
        # or stdio line bound of worker/ingress/transport_bounds.py). That request failed, the session did
        # not; counting it as lost would reconnect and re-read it forever.
        return ReadOutcomeKind.MALFORMED
    if err.code == CONNECTION_CLOSED:
        return ReadOutcomeKind.SESSION_LOST
    if err.code == REQUEST_TIMEOUT:
        return None
    if any(h in msg for h in DENIED_HINTS):
        return ReadOutcomeKind.DENIED
    if err.code in PROTOCOL_CODES:
        return ReadOutcomeKind.PROTOCOL
    if err.code == types.INTERNAL_ERROR:
        return ReadOutcomeKind.TRANSIENT
    return ReadOutcomeKind.MALFORMED


@dataclass
class LiveSession:
    """One initialized MCP session of (subject, server) at one generation."""

    subject: str
    server: str
    generation: int
    client: Client
    edition: str
    server_name: str
    server_version: str
    max_content_bytes: int
    on_uri_updated: UriHandler
    guardrails: GuardrailChain = field(default_factory=default_chain)  # the server's release rules
    on_stream_lost: LossHandler | None = None  # told (once per stream) before the session is marked lost
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    listens: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    @property
    def modern(self) -> bool:
        return self.edition == "2026-07-28"

    async def listen(self, uri: str) -> None:
        """Open (once) a listen stream for ``uri``; returns after the server acknowledged it."""
        task = self.listens.get(uri)
        if task is not None and not task.done():
            return
        acked: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def stream() -> None:
            try:
                async with self.client.listen(resource_subscriptions=[uri]) as sub:
                    acked.set_result(None)
                    async for event in sub:
                        event_uri = getattr(event, "uri", None)
                        if isinstance(event_uri, str):
                            await self.on_uri_updated(event_uri, self.generation)
                # The server closed it gracefully: no error, but no notification will come on it
                # either, so it is a gap like any other (unlisten cancels this task instead).
                await self._stream_lost(uri, StreamLoss.ENDED, "the server closed the listen stream")
            except BacklogOverflow as exc:
                # The consumer could not keep this event: lost like an overflow of the SDK's backlog.
                await self._stream_lost(uri, StreamLoss.OVERFLOW, str(exc))
            except SubscriptionLost as exc:
                # No replay on 2026-07-28: a lost stream (backlog overflow, a drop) is a gap.
                await self._stream_lost(uri, _loss_reason(exc), str(exc.__cause__ or exc))
            except Exception as exc:
                if not acked.done():
                    acked.set_exception(exc)
                else:
                    await self._stream_lost(uri, StreamLoss.DROPPED, f"{type(exc).__name__}: {exc}")
            finally:
                if not acked.done():
                    acked.set_exception(RuntimeError("listen stream ended before acknowledgment"))

        self.listens[uri] = asyncio.create_task(stream(), name=f"listen:{self.server}")
        await acked

    async def _stream_lost(self, uri: str | None, why: StreamLoss, detail: str) -> None:
        """A listen stream of this session is gone: updates during the gap are lost by design, so
        the whole session goes (the host opens a new generation; every subscription on it
        resubscribes and re-reads). Audited first, unless the session is already going."""
        if self.lost.is_set():
            return
        log.warning("listen stream lost (server=%s generation=%s): %s", self.server, self.generation,
                    why.value)
        if self.on_stream_lost is not None:
            try:
                await self.on_stream_lost(uri, why, detail[:300])
            except Exception:  # the audit must never keep the session from being replaced
                log.exception("could not record the lost listen stream")
        self.lost.set()

    async def unlisten(self, uri: str) -> None:
        task = self.listens.pop(uri, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def close_listens(self) -> None:
        for uri in list(self.listens):
            await self.unlisten(uri)

    async def listen_list_changed(self, on_list_changed: Callable[[], None]) -> bool:
        """2026-07-28: open (once) a listen stream for resources list_changed only.

        Returns False when the server does not honour ``resourcesListChanged``. A dropped
        stream may have swallowed a notification, so it counts as one and loses the session.
        The stream lives in ``listens`` under a key no URI can have, so ``close_listens``
        closes it with the rest."""
        task = self.listens.get(LIST_CHANGED_STREAM)
        if task is not None and not task.done():
            return True
        acked: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

        async def stream() -> None:
            try:
                async with self.client.listen(resources_list_changed=True) as sub:
                    honoured = bool(sub.honored.resources_list_changed)
                    acked.set_result(honoured)
                    if not honoured:
                        return
                    async for _event in sub:
                        on_list_changed()
                on_list_changed()
                await self._stream_lost(None, StreamLoss.ENDED, "the server closed the list_changed stream")
            except Exception as exc:  # SubscriptionLost included: no replay on 2026-07-28
                if not acked.done():
                    acked.set_exception(exc)
                    return
                on_list_changed()
                why = _loss_reason(exc) if isinstance(exc, SubscriptionLost) else StreamLoss.DROPPED
                await self._stream_lost(None, why, f"list_changed stream: {exc.__cause__ or exc}")

        self.listens[LIST_CHANGED_STREAM] = asyncio.create_task(stream(), name=f"listen-list:{self.server}")
        return await acked


MAX_METADATA_CHARS = 256
"""Server-supplied metadata strings (a content's MIME type, serverInfo name and version) are kept to
this many characters: they travel in activity results, signals, receipts and outbox rows, and a
multi-megabyte one would make every one of them fail (docs/security.md)."""


def metadata_text(value: str | None) -> str | None:
    """``value`` cut to ``MAX_METADATA_CHARS`` (None stays None)."""
    return value if value is None or len(value) <= MAX_METADATA_CHARS else value[:MAX_METADATA_CHARS]


def content_parts(result: types.ReadResourceResult, limit: int | None = None) -> list[ContentPart]:
    """The parts of a read as mcpsync digests them (text as UTF-8, blobs base64-decoded).

    Raises ValueError for invalid base64, an unknown content type, or more than ``limit`` bytes."""
    parts: list[ContentPart] = []
    total = 0
    for c in result.contents:
        if isinstance(c, types.TextResourceContents):
            data = c.text.encode("utf-8")
            parts.append(ContentPart("text", metadata_text(c.mime_type), data))
        elif isinstance(c, types.BlobResourceContents):
            try:
                data = base64.b64decode(c.blob, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("blob content is not valid base64") from None
            parts.append(ContentPart("blob", metadata_text(c.mime_type), data))
        else:
            raise ValueError(f"unsupported content type {type(c).__name__}")
        total += len(data)
        if limit is not None and total > limit:
            raise ValueError(f"content larger than the {limit}-byte limit")
    return parts


def read_digest(result: types.ReadResourceResult) -> str:
    """The content digest mcpsync records for this read (what receipts and the fixture name)."""
    return content_digest(content_parts(result))


class McpSessionActivities:
    """Activities bound to one ingress; ``current(subject, server)`` returns its live session or None."""

    def __init__(self, current: SessionLookup, ledger: Ledger, meters: Meters = NO_METERS) -> None:
        self.current = current
        self.ledger = ledger
        self.meters = meters
        self._truncations_audited: set[tuple[str, str, int]] = set()  # (subject, server, session generation)

    def all(self) -> list[Callable[..., Any]]:
        """The session queue's activities the workflows schedule. ``subscribe`` and ``read`` are the
        cycles' steps, called in-process (``mcp_subscribe_cycle``, ``mcp_read_cycle``), and no activities:
        no workflow schedules them, and no released (0.2.0) history holds one (tests/histories/0.2.0)."""
        return [self.unsubscribe, self.read_cycle, self.subscribe_cycle]

    async def _audit_truncated_mime(self, live: LiveSession, uri: str,
                                    result: types.ReadResourceResult) -> None:
        """A MIME type longer than ``MAX_METADATA_CHARS`` is cut (``metadata_text``); the first one of a
        session generation (in this process) is audited ``METADATA_TRUNCATED`` with its length and digest."""
        long = next((c.mime_type for c in result.contents
                     if c.mime_type is not None and len(c.mime_type) > MAX_METADATA_CHARS), None)
        seen = (live.subject, live.server, live.generation)
        if long is None or seen in self._truncations_audited:
            return
        self._truncations_audited.add(seen)
        with suppress(Exception):  # an audit row must not fail the read
            digest = hashlib.sha256(long.encode("utf-8", "surrogatepass")).hexdigest()
            await self.ledger.journal.audit("METADATA_TRUNCATED", subject=live.subject, server=live.server,
                                            uri=uri,
                                    session_generation=live.generation,
                                    detail={"field": "mimeType",
                                            "reason": f"longer than {MAX_METADATA_CHARS} characters",
                                            "length": len(long), "kept": MAX_METADATA_CHARS,
                                            "sha256": digest})

    def _session(self, key: SubscriptionKey, generation: int) -> LiveSession | None:
        live = self.current(key.subject, key.server)
        if live is None or live.generation != generation or live.lost.is_set():
            return None
        return live

    async def subscribe(self, req: SubscribeRequest) -> SubscribeOutcome:
        live = self._session(req.key, req.session_generation)
        if live is None:
            current = self.current(req.key.subject, req.key.server)
            return SubscribeOutcome(ok=False, session_generation=current.generation if current else 0,
                                    error="session generation is gone")
        try:
            if live.modern:
                await live.listen(req.key.uri)
            else:
                with warnings.catch_warnings():  # the 2025-11-25 API is exactly what this edition needs
                    warnings.simplefilter("ignore", MCPDeprecationWarning)
                    await live.client.session.subscribe_resource(req.key.uri)
        except MCPError as err:
            if err.code == CONNECTION_CLOSED:
                live.lost.set()
                return SubscribeOutcome(ok=False, session_generation=0, error_code=err.code,
                                        error="connection closed")
            return SubscribeOutcome(ok=False, session_generation=live.generation, error_code=err.code,
                                    error=err.message[:300])
        return SubscribeOutcome(ok=True, session_generation=live.generation)

    @activity.defn(name=Act.MCP_UNSUBSCRIBE)
    async def unsubscribe(self, req: UnsubscribeRequest) -> UnsubscribeOutcome:
        live = self._session(req.key, req.session_generation)
        if live is None:
            # The session that held the subscription is gone, and with it the subscription;
            # but no ACK was received, so the fence records UNSUBSCRIBE_UNKNOWN.
            return UnsubscribeOutcome(acked=False, error="session generation is gone")
        try:
            if live.modern:
                await live.unlisten(req.key.uri)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", MCPDeprecationWarning)
                    await live.client.session.unsubscribe_resource(req.key.uri)
        except MCPError as err:
            return UnsubscribeOutcome(acked=False, error=f"{err.code}: {err.message[:200]}")
        return UnsubscribeOutcome(acked=True)

    async def read(self, req: ReadRequest) -> ReadOutcome:
        """The read alone, outside a cycle: its accept is a separate call (``FenceLedger.accept``),
        so a releasable body waits in ``content_pending`` for it (``ContentLedger.stage``)."""
        outcome, body = await self._read(req)
        if body is not None:
            await self.ledger.content.stage(req.key, req.ordinal, body)
        return outcome

    async def _read(self, req: ReadRequest) -> tuple[ReadOutcome, ReadBody | None]:
        """``resources/read`` on the live session: the outcome (digest and metadata) and, when the
        guardrail releases it, the body for the accept to store. Nothing is stored here."""
        base: dict[str, Any] = {
            "key": req.key, "ordinal": req.ordinal, "request_id": req.request_id,
            "session_generation": req.session_generation,
            "subscription_generation": req.subscription_generation, "trigger": req.trigger,
        }
        live = self._session(req.key, req.session_generation)
        if live is None:
            return ReadOutcome(kind=ReadOutcomeKind.SESSION_LOST, error="session generation is gone",
                               **base), None
        base.update(server_name=live.server_name, server_version=live.server_version, edition=live.edition)
        try:
            with self.meters.read_timer(req.key.server, req.request_id):
                result = await live.client.read_resource(req.key.uri)
        except MCPError as err:
            kind = classify_error(err)
            if kind is None:
                raise ApplicationError(f"read timed out: {err.message[:200]}", type="ReadTimeout") from None
            if kind == ReadOutcomeKind.SESSION_LOST:
                live.lost.set()
            return ReadOutcome(kind=kind, error_code=err.code, error=err.message[:300], **base,
                               completed_at=datetime.now(UTC)), None
        except ValidationError as err:
            return ReadOutcome(kind=ReadOutcomeKind.MALFORMED,
                               error=f"invalid result: {err.error_count()} errors",
                               **base, completed_at=datetime.now(UTC)), None
        await self._audit_truncated_mime(live, req.key.uri, result)
        try:
            parts, body, mime = self._parts(result, live.max_content_bytes)
        except ValueError as err:
            return ReadOutcome(kind=ReadOutcomeKind.MALFORMED, error=str(err)[:300], **base,
                               completed_at=datetime.now(UTC)), None
        digest = content_digest(parts)
        base.update(ttl_ms=result.ttl_ms, cache_scope=CacheScope(result.cache_scope))
        rejection = live.guardrails.check(parts)
        # Only releasable content goes on to the accept: a rejected body never reaches the store.
        kept = None if rejection is not None else ReadBody(
            digest=digest, mime_type=mime, kind=parts[0].kind if len(parts) == 1 else "multipart", body=body)
        return ReadOutcome(kind=ReadOutcomeKind.CONTENT, content_digest=digest, mime_type=mime,
                           size=len(body), content_count=len(parts), guardrail_rejection=rejection,
                           completed_at=datetime.now(UTC), **base), kept

    @activity.defn(name=Act.MCP_READ_CYCLE)
    async def read_cycle(self, req: ReadCycleRequest) -> ReadCycleResult:
        """One round trip per read: allocate the ordinal (CAS, committed before the request is sent),
        ``resources/read`` on the live session, judge and accept (CAS): the fence rules of
        ``allocate_read`` / ``mcp_read`` / ``accept``, called as they are, in this order.

        Idempotent on retry: the allocation is keyed by this scheduled activity (``cycle_id``), so a
        retry gets the same ordinal, reads again, and an accept that already committed replays its
        verdict. Refused: the durable fence comes back for the workflow to adopt. A read that
        found its session gone is returned unjudged (the workflow resubscribes)."""
        info = activity.info()
        return await self.run_cycle(req, cycle_id=f"{info.workflow_run_id}/{info.activity_id}")

    async def run_cycle(self, req: ReadCycleRequest, *, cycle_id: str,
                        absorb: Callable[[], int] | None = None) -> ReadCycleResult:
        """The read cycle itself, for the activity and for the ingress, which reads a notified change
        without a Temporal hop (``ingress_rules.ingress_read_request``) and reports it to the workflow.
        ``cycle_id`` keys the allocation (a retry under the same id gets the same ordinal). No lock
        against a concurrent cycle of the same subscription: both are cycle allocations, so only the
        newest allocation can become current (``judge_read``: an older one is STALE). The ticket's
        ``notifications_seen`` is the row's count at the allocation: what the read covers if it
        observes the resource (``workflows/coverage.py``). ``absorb`` (the ingress's) is called once
        the allocation is granted, just before the request is sent: the notifications it returns
        arrived before the send, so the read covers them, and its accept counts them
        (``AcceptRequest.absorbed``)."""
        alloc = replaced(req.allocate, {"cycle_id": cycle_id})
        ticket = await self.ledger.fence.allocate_read(alloc)
        if not ticket.granted:
            return ReadCycleResult(ticket=ticket,
                                   fence=await self.ledger.fence.load_fence(KeyRequest(key=alloc.key)))
        absorbed = absorb() if absorb is not None else 0
        outcome, body = await self._read(ReadRequest(
            key=alloc.key, session_generation=alloc.session_generation,
            subscription_generation=alloc.subscription_generation, ordinal=ticket.ordinal,
            request_id=ticket.request_id, trigger=alloc.trigger))
        if outcome.kind == ReadOutcomeKind.SESSION_LOST:
            return ReadCycleResult(ticket=ticket, outcome=outcome)
        accept_req = AcceptRequest(outcome=outcome, expected_state=req.expected_state,
                                   close_epoch=req.close_epoch, absorbed=absorbed)
        # the body enters the store only here
        result, judged = await self.ledger.fence.accept_judged(accept_req, body)
        self.meters.receipt_judged(accept_req, result)
        if judged != outcome.content_digest:  # a retry after a committed accept: name the read it judged
            outcome = outcome.model_copy(update={"content_digest": judged})
        return ReadCycleResult(ticket=ticket, outcome=outcome, accept=result)

    @activity.defn(name=Act.MCP_SUBSCRIBE_CYCLE)
    async def subscribe_cycle(self, req: SubscribeCycleRequest) -> SubscribeCycleResult:
        """A subscription's start in one round trip: ``subscribe``, then ``mark_active`` (CAS:
        SUBSCRIBING on both generations → ACTIVE), then the initial read cycle (``run_cycle``), each
        called as it is on its own, in this order. It stops after the first step that did not go
        through: a subscribe the server refused comes back unmarked (the workflow decides: poll or
        resubscribe); a row that is not ACTIVE on these generations comes back unread.

        Idempotent on retry: subscribing twice on one session is harmless, ``mark_active`` on a
        row it already marked returns that row (ACTIVE, same generations), and the read cycle is
        keyed by this scheduled activity as ``mcp_read_cycle`` is."""
        info = activity.info()
        return await self.run_subscribe_cycle(req, cycle_id=f"{info.workflow_run_id}/{info.activity_id}")

    async def run_subscribe_cycle(self, req: SubscribeCycleRequest, *, cycle_id: str) -> SubscribeCycleResult:
        subscribed = await self.subscribe(req.subscribe)
        if not subscribed.ok:
            return SubscribeCycleResult(subscribe=subscribed)
        active = await self.ledger.fence.mark_active(req.mark)
        if not marked_active(active, session_generation=req.mark.session_generation,
                             subscription_generation=req.mark.subscription_generation):
            return SubscribeCycleResult(subscribe=subscribed, active=active)
        cycle = await self.run_cycle(req.read, cycle_id=cycle_id)
        return SubscribeCycleResult(subscribe=subscribed, active=active, cycle=cycle)

    @staticmethod
    def _parts(result: types.ReadResourceResult, limit: int) -> tuple[list[ContentPart], bytes, str | None]:
        parts = content_parts(result, limit)
        if not parts:
            raise ValueError("read returned no contents")
        if len(parts) == 1:
            return parts, parts[0].data, parts[0].mime_type
        import json

        envelope = json.dumps([
            {"kind": p.kind, "mime_type": p.mime_type, "data_b64": base64.b64encode(p.data).decode()}
            for p in parts
        ]).encode()
        return parts, envelope, MULTIPART_MIME
