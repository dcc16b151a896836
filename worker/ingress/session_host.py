"""Session host and notification ingress for one (subject, server).

Contract:
- Holds at most one live MCP session per (subject, server). Each successful initialize is recorded in the
  ledger and gets a session generation one above any before it; the negotiated edition and capabilities go
  with it.
- Belongs to one ``mcpsync.worker.ingress.process.Ingress`` (its process), whose
  identity is this host's lease holder
  name and whose one task queue, recorded in the session row at each open, is where the
  subscribe/unsubscribe/read/scan activities of this (subject, server) run over the live session. A host made
  without an ingress is an ingress of one: it runs that ingress's worker itself. A session that replaced one
  recorded with another ingress's queue has the ingress adopt that queue (``Ingress.adopt``).
- Routing is a program (``mcpsync.workflows.ingress.IngressRouter``: note, read here or signal, per key),
  run here over PostgreSQL, the live session and Temporal (``_drive`` / ``_perform``); a read here is
  reported as ``resource_read`` (digest and verdict, never content). A URI with no subscription, or a
  subscription with no running workflow, gets an audit row; nothing is guessed and no workflow is ever
  started from here.
- URI identity (docs/identity.md): a notification only invalidates. When its exact URI is subscribed, every
  other live subscription whose URI normalizes alike (a listed ambiguous pair,
  ``FenceLedger.normalized_siblings``)
  is invalidated too, each with ITS OWN exact URI (audit AMBIGUOUS_SIBLING_INVALIDATED). When only a
  normalized form matches, it is an identity conflict for each such subscription (``_unknown_uri``).
- resources list_changed (2025-11-25 notification; 2026-07-28: one list_changed-only listen stream per
  session, opened before the session is published) is counted per session generation (``list_changed_count``,
  read by the catalog scan activities) and becomes a coalesced ``list_changed`` signal to the CatalogWorkflow
  of (subject, server), which is never started from here.
- A lost session (transport closed, ping timeout, a listen stream lost to backlog overflow, dropped or closed:
  audit ``LISTEN_STREAM_LOST`` with the reason) is reopened with exponential backoff; every non-terminal
  subscription is then signalled ``session_changed`` so it resubscribes and re-reads (trigger ``initial``).
- Notifications wait in the router's work queue, merged per (URI, generation) and bounded per generation by
  ``max_pending_notifications``: one more is a backlog overflow (the listen stream that carried it is lost,
  reason ``overflow``; on 2025-11-25 the session), never a dropped notification. A key notified after
  its read was sent settles (``workflows/ingress.py``, Settle): ``_settle_loop`` hands it to a router
  once due, on the event loop's clock, which ``_enqueue`` stamps each offer with.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
import warnings
from collections import Counter
from collections.abc import Coroutine, Generator
from contextlib import suppress
from datetime import UTC, datetime
from functools import partial
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning
from temporalio.client import Client as TemporalClient
from temporalio.service import RPCError, RPCStatusCode

from mcpsync import __version__
from mcpsync.activities.guardrails import GuardrailChain, default_chain
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.mcp_session import (
    MAX_METADATA_CHARS,
    BacklogOverflow,
    LiveSession,
    StreamLoss,
    metadata_text,
)
from mcpsync.worker.ingress.process import Ingress
from mcpsync.worker.ingress.transport import SessionOpenError, describe_open_failure, server_transport
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.observe import metrics
from mcpsync.workflows.ingress import (
    Effect,
    IngressRouter,
    Note,
    Offer,
    ReadCycle,
    ReportRead,
    RouteFailed,
    SiblingInvalidated,
    Siblings,
    SignalUpdated,
    Stamp,
    Stamped,
    Turn,
    UnknownUri,
)
from mcpsync.workflows.names import (
    SIGNAL_IDENTITY_CONFLICT,
    SIGNAL_LIST_CHANGED,
    SIGNAL_RECONCILE,
    SIGNAL_RESOURCE_READ,
    SIGNAL_RESOURCE_UPDATED,
    SIGNAL_SESSION_CHANGED,
)
from mcpsync.workflows.records.catalog import CatalogKey, ListChanged
from mcpsync.workflows.records.read_cycle import ReadCycleResult
from mcpsync.workflows.records.subscription import (
    TERMINAL_STATES,
    IdentityConflict,
    ResourceUpdated,
    SessionChanged,
)
from mcpsync.workflows.uris import unparsed_uri_problem

__all__ = ["SessionHost", "SessionOpenError", "server_transport"]

log = logging.getLogger("mcpsync.ingress")

ROUTE_RETRY_SECONDS = 120.0
# The (subject, server) lease is granted for LEASE_HOLD_FRACTION of ``lease_seconds`` and renewed every
# LEASE_RENEW_FRACTION of it; a standby retries when the holder's lease runs out (plus the slack), so a
# holder that dies is replaced within lease_seconds (docs/deploy.md).
LEASE_HOLD_FRACTION = 0.85
LEASE_RENEW_FRACTION = 0.2
LEASE_WAKE_SLACK_SECONDS = 0.02
RECONCILE_REASON_URI_CHARS = 200  # the catalog keeps reasons short; a URI can be 8 KiB
AUDIT_ROWS_PER_SESSION = 50
"""UNKNOWN_URI and NOTIFICATION_URI_REJECTED audit rows one session generation may cause, per kind;
past it one ``<kind>_SUPPRESSED`` row says so and the rest are only counted (a server naming
100,000 URIs nobody subscribed to must not write 100,000 rows)."""
AUDIT_URI_CHARS = 256  # of a rejected URI, the audit row keeps this much and the SHA-256 of the rest


class SessionHost:
    def __init__(self, server: ServerConfig, subject: str, ledger: Ledger, temporal: TemporalClient,
                 *, ingress: Ingress | None = None, guardrails: GuardrailChain | None = None) -> None:
        self.server = server
        self.subject = subject
        self.ledger = ledger
        # rows of (subject, server)
        self._audit = partial(ledger.journal.audit, subject=subject, server=server.name)
        self.temporal = temporal
        self._own_ingress = ingress is None
        self.ingress = ingress if ingress is not None else Ingress(temporal, ledger)
        self.host_id = self.ingress.identity
        self.guardrails = guardrails if guardrails is not None else default_chain(
            max_bytes=server.release_max_bytes, mime_allow=server.mime_allow)
        self.live: LiveSession | None = None
        # The work queue of keys (URI, generation) and the routing program (``IngressRouter``); the
        # routers wait on ``_queue`` (one token per ready key). One router at a time per key.
        self.router = IngressRouter(subject, server.name, host_id=self.host_id,
                                    read_on_notification=server.read_on_notification,
                                    max_pending=server.max_pending_notifications)
        self._queue: asyncio.Queue[None] = asyncio.Queue()
        self._settling = asyncio.Event()  # a key began to settle: ``_settle_loop`` looks at its due time
        self.resync = self.ingress.resync(self, lambda: self._queue.put_nowait(None))  # ingress/resync.py
        self._stopping = asyncio.Event()
        self._lease_lost = asyncio.Event()
        # list_changed notifications received per session generation (monotonic): the scan
        # activities read it around each scan, the CatalogWorkflow gets it by signal.
        self._list_changed: Counter[int] = Counter()
        self._list_changed_pending = asyncio.Event()
        self.uris_rejected = 0  # notifications with an unsubscribable URI (too long, control characters)
        self.audits_suppressed = 0
        self._audits: Counter[tuple[str, int]] = Counter()  # (kind, generation) -> rows written or refused
        self._audit_tasks: set[asyncio.Task[None]] = set()

    # --- lifecycle -------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until ``stop()``: the router, and while this host holds the (subject, server)
        lease, the session and the reconnect loop. Several hosts (in several ingress processes)
        may run for one (subject, server); exactly one owns the session at a time."""
        self.ingress.attach(self.subject, self.server.name, self)
        tasks = [asyncio.create_task(self._route_loop(), name=f"router:{self.server.name}:{n}")
                 for n in range(self.server.route_concurrency)]
        tasks.append(asyncio.create_task(self._list_changed_loop(), name=f"list-changed:{self.server.name}"))
        tasks.append(asyncio.create_task(self._settle_loop(), name=f"settle:{self.server.name}"))
        tasks.append(asyncio.create_task(self.resync.run(), name=f"resync:{self.server.name}"))
        if self._own_ingress:
            worker = asyncio.create_task(self.ingress.run(), name=f"ingress:{self.server.name}")
            # A worker that fails stops the host; ``run`` then raises its error (the finally below).
            worker.add_done_callback(lambda t: None if t.cancelled() or t.exception() is None
                                     else self.stop())
            tasks.append(worker)
        try:
            while not self._stopping.is_set():
                if not await self._acquire_lease():
                    continue
                renew = asyncio.create_task(self._renew_lease(), name=f"lease:{self.server.name}")
                try:
                    await self._session_loop()
                finally:
                    renew.cancel()
                    with suppress(asyncio.CancelledError):
                        await renew
                if self._stopping.is_set():
                    with suppress(Exception):
                        await self.ledger.sessions.release_lease(self.subject, self.server.name, self.host_id)
        finally:
            self.ingress.detach(self.subject, self.server.name, self)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with suppress(asyncio.CancelledError):
                    await task

    async def _acquire_lease(self) -> bool:
        ttl = self.server.lease_seconds
        if await self.ledger.sessions.acquire_lease(self.subject, self.server.name, self.host_id,
                                           ttl * LEASE_HOLD_FRACTION):
            self._lease_lost.clear()
            log.info("lease %s/%s acquired by %s", self.server.name, self.subject, self.host_id)
            return True
        # A standby: try again when the holder's lease would run out, at most ttl/3 from now.
        wait = ttl / 3
        with suppress(Exception):
            remaining = await self.ledger.sessions.lease_remaining(self.subject, self.server.name)
            wait = min(wait, (remaining or 0.0) + LEASE_WAKE_SLACK_SECONDS)
        with suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), wait)
        return False

    async def _renew_lease(self) -> None:
        ttl = self.server.lease_seconds
        while True:
            await asyncio.sleep(ttl * LEASE_RENEW_FRACTION)
            try:
                held = await self.ledger.sessions.acquire_lease(self.subject, self.server.name, self.host_id,
                                                       ttl * LEASE_HOLD_FRACTION)
            except Exception:  # PostgreSQL away: keep serving until the lease would have run out
                log.warning("lease %s/%s: renewal failed", self.server.name, self.subject)
                continue
            if not held:
                log.warning("lease %s/%s lost by %s", self.server.name, self.subject, self.host_id)
                self._lease_lost.set()
                if self.live is not None:
                    self.live.lost.set()
                return

    def stop(self) -> None:
        self._stopping.set()
        if self.live is not None:
            self.live.lost.set()

    async def check(self) -> str:
        """Open and close one session; returns the negotiated edition or raises SessionOpenError."""
        client = await self._enter(self._client())
        try:
            return client.protocol_version
        finally:
            with suppress(Exception):
                await asyncio.wait_for(client.__aexit__(None, None, None), timeout=5)

    async def _enter(self, client: Client) -> Client:
        try:
            await asyncio.wait_for(client.__aenter__(), timeout=30)
        except Exception as exc:
            with suppress(Exception):
                await asyncio.wait_for(client.__aexit__(None, None, None), timeout=5)
            raise SessionOpenError(describe_open_failure(self.server, exc)) from None
        return client

    async def _session_loop(self) -> None:
        backoff = 0.25
        while not self._stopping.is_set() and not self._lease_lost.is_set():
            try:
                await self._one_session()
                backoff = 0.25
            except SessionOpenError as exc:
                log.warning("session %s/%s: %s; retrying in %.1fs", self.server.name, self.subject, exc,
                            backoff)
            if self._stopping.is_set() or self._lease_lost.is_set():
                break
            with suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), backoff)
            backoff = min(backoff * 2, 15.0)

    def _client(self) -> Client:
        cfg = self.server
        server = server_transport(cfg, self.subject)
        # A version pin would skip server/discover and synthesize empty capabilities: probe instead.
        mode = "legacy" if cfg.edition == "2025-11-25" else "auto"
        return Client(server, mode=mode, cache=None, message_handler=self._on_message,  # type: ignore[arg-type]
                      read_timeout_seconds=cfg.read_timeout_seconds,
                      client_info=types.Implementation(name="mcpsync", version=__version__))

    async def _one_session(self) -> None:
        client = await self._enter(self._client())
        live: LiveSession | None = None
        try:
            if self.server.edition == "2026-07-28" and client.protocol_version != "2026-07-28":
                raise SessionOpenError(f"server {self.server.name!r} negotiated {client.protocol_version}, "
                                       "but the config requires edition 2026-07-28")
            await self._check_edition(client.protocol_version)
            res = client.server_capabilities.resources
            capabilities = {"resources": res is not None, "subscribe": bool(res and res.subscribe),
                            "listChanged": bool(res and res.list_changed)}
            impl = client.server_info
            previous = await self.ledger.sessions.session_holder(self.subject, self.server.name)
            info = await self.ledger.sessions.open_session(
                subject=self.subject, server=self.server.name, edition=client.protocol_version,
                capabilities=capabilities, server_name=metadata_text(impl.name if impl else "") or "",
                server_version=metadata_text(impl.version if impl else "") or "",
                task_queue=self.ingress.task_queue, host_id=self.host_id)
            if info is None:  # the lease lapsed while the session connected: another host may hold it
                log.warning("lease %s/%s lapsed before the session opened (%s)", self.server.name,
                            self.subject, self.host_id)
                self._lease_lost.set()
                return
            await self._audit_truncated_info(impl, info.generation)
            live = LiveSession(
                subject=self.subject, server=self.server.name, generation=info.generation, client=client,
                edition=client.protocol_version, server_name=info.server_name,
                server_version=info.server_version, max_content_bytes=self.server.max_content_bytes,
                on_uri_updated=self._enqueue, guardrails=self.guardrails,
                on_stream_lost=lambda uri, why, detail: self._stream_lost(info.generation, uri, why, detail))
            if live.modern and capabilities["listChanged"]:
                # Before the session is published to activities: no scan may start uncounted.
                try:
                    await live.listen_list_changed(lambda: self._note_list_changed(live.generation))
                except Exception as exc:
                    log.warning("session %s/%s: list_changed stream refused (%s); catalogs rely on rescans",
                                self.server.name, self.subject, type(exc).__name__)
            self.live = live
            if self._lease_lost.is_set():
                # The lease was lost after the session opened and before it was published here: the
                # renewal found no session to end. It ends now; the host waits for the lease again.
                return
            if previous is not None:  # runs may have tasks left on the queue of the session it replaced
                self.ingress.adopt(*previous)
            log.info("session %s/%s open: generation=%d edition=%s subscribe=%s listChanged=%s",
                     self.server.name, self.subject, info.generation, live.edition,
                     capabilities["subscribe"], capabilities["listChanged"])
            await self._announce(info.generation)
            await self._watch(live)
        finally:
            self.live = None
            if live is not None:
                await live.close_listens()
                with suppress(Exception):
                    await self.ledger.sessions.close_session(self.subject, self.server.name, live.generation)
            with suppress(Exception):
                await asyncio.wait_for(client.__aexit__(None, None, None), timeout=5)

    async def _audit_truncated_info(self, impl: types.Implementation | None, generation: int) -> None:
        """serverInfo name/version longer than ``MAX_METADATA_CHARS`` are cut (``metadata_text``): one
        ``METADATA_TRUNCATED`` row per session generation says which and how long they were."""
        long = {f: len(v) for f, v in (("serverInfo.name", impl.name if impl else ""),
                                       ("serverInfo.version", impl.version if impl else ""))
                if v and len(v) > MAX_METADATA_CHARS}
        if long:
            with suppress(Exception):  # an audit row must not keep the session from opening
                await self._audit("METADATA_TRUNCATED", session_generation=generation,
                                  detail={"fields": long, "kept": MAX_METADATA_CHARS,
                                          "reason": f"longer than {MAX_METADATA_CHARS} characters"})

    async def _stream_lost(self, generation: int, uri: str | None, why: StreamLoss, detail: str) -> None:
        """Audit ``LISTEN_STREAM_LOST`` (why: overflow / dropped / ended; no URI: the list_changed
        stream); the session is replaced next."""
        await self._audit("LISTEN_STREAM_LOST", uri=uri, session_generation=generation,
                          detail={"reason": why.value, "stream": "resource" if uri else "list_changed",
                                  "error": detail})

    async def _check_edition(self, negotiated: str) -> None:
        """An ``EDITION_MISMATCH`` audit row and a warning, once per session, when the server negotiated
        another edition than the configured one. An older edition (e.g. 2024-11-05) is served with the
        2025-11-25 rules (the same methods); the negotiated edition is recorded in every receipt."""
        configured = self.server.edition
        if configured == "auto" or negotiated == configured:
            return
        log.warning("session %s/%s: configured edition %s, server negotiated %s (served with the %s rules)",
                    self.server.name, self.subject, configured, negotiated,
                    "2026-07-28" if negotiated == "2026-07-28" else "2025-11-25")
        with suppress(Exception):  # an audit row must not keep the session from opening
            await self._audit("EDITION_MISMATCH", detail={"configured": configured, "negotiated": negotiated})

    async def _watch(self, live: LiveSession) -> None:
        """Return when the session is lost: a ping that fails or times out, or a lost stream."""
        while not live.lost.is_set():
            with suppress(TimeoutError):
                await asyncio.wait_for(live.lost.wait(), self.server.ping_interval_seconds)
            if live.lost.is_set():
                break
            try:
                await asyncio.wait_for(self._probe(live), self.server.ping_timeout_seconds)
            except Exception as exc:
                log.warning("session %s/%s generation %d lost: %s", self.server.name, self.subject,
                            live.generation, type(exc).__name__)
                live.lost.set()

    @staticmethod
    async def _probe(live: LiveSession) -> None:
        # ping is gone on 2026-07-28; server/discover is its cheapest round trip there.
        if live.modern:
            await live.client.session.send_discover(live.edition)
        else:
            with warnings.catch_warnings():  # deprecated only for 2026-07-28, which this branch is not
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                await live.client.send_ping()

    async def _announce(self, generation: int) -> None:
        changed = SessionChanged(session_generation=generation)
        subscriptions = await self.ledger.fence.subscriptions_for(self.subject, self.server.name)
        for workflow_id, _uri, state in subscriptions:
            if state not in TERMINAL_STATES:
                await self._signal(workflow_id, SIGNAL_SESSION_CHANGED, changed, "SESSION_CHANGE_NO_WORKFLOW",
                                   generation)

    # --- notifications -------------------------------------------------------------------

    async def _on_message(self, message: object) -> None:
        live = self.live
        if live is None and isinstance(message, types.ResourceUpdatedNotification
                                                | types.ResourceListChangedNotification):
            # Before initialization finished (or after the session was dropped): lifecycle misuse.
            with suppress(Exception):
                await self._audit("NOTIFICATION_OUTSIDE_SESSION", detail={"method": message.method},
                                  uri=str(getattr(message.params, "uri", ""))[:2048] or None)
            return
        generation = live.generation if live is not None else 0
        if isinstance(message, types.ResourceUpdatedNotification):
            try:
                await self._enqueue(str(message.params.uri), generation)
            except BacklogOverflow as exc:
                # 2026-07-28: this is the SDK's tee of a listen event; the stream that carried it
                # meets the same full backlog and is lost to overflow. 2025-11-25: no stream to
                # lose, so the session goes (a gap: every subscription re-reads on the next one).
                if live is not None and not live.modern and not live.lost.is_set():
                    log.warning("session %s/%s generation %d lost: %s", self.server.name, self.subject,
                                generation, exc)
                    live.lost.set()
        elif isinstance(message, types.ResourceListChangedNotification):
            self._note_list_changed(generation)
        elif isinstance(message, Exception):
            log.warning("session %s/%s transport error: %s", self.server.name, self.subject,
                        type(message).__name__)

    def list_changed_count(self, generation: int) -> int:
        return self._list_changed[generation]

    def _note_list_changed(self, generation: int) -> None:
        # Count now (scans compare counts); signal from a task (never block the receive loop).
        self._list_changed[generation] += 1
        self._list_changed_pending.set()

    async def _list_changed_loop(self) -> None:
        """Signal the CatalogWorkflow of (subject, server) with the latest count; never start it.

        Bursts coalesce into one signal carrying the newest count; each becomes one audit row."""
        key = CatalogKey(subject=self.subject, server=self.server.name)
        while True:
            await self._list_changed_pending.wait()
            self._list_changed_pending.clear()
            generation = max(self._list_changed, default=0)
            sig = ListChanged(session_generation=generation, count=self.list_changed_count(generation),
                              received_at=datetime.now(UTC))
            try:
                await self._audit("LIST_CHANGED", session_generation=generation, detail={"count": sig.count})
                await self._signal(key.workflow_id, SIGNAL_LIST_CHANGED, sig, "LIST_CHANGED_NO_CATALOG",
                                   generation)
            except RPCError as err:
                log.warning("list_changed signal failed (server=%s): %s", self.server.name, err)
            except Exception:
                log.exception("list_changed routing failed (server=%s)", self.server.name)

    async def _enqueue(self, uri: str, generation: int) -> None:
        # The receive loop never waits on PostgreSQL or Temporal: it only offers to the work queue; a
        # full one raises BacklogOverflow (the caller loses the stream that carried the notification).
        problem = unparsed_uri_problem(uri)
        if problem is not None:
            # No subscription can have this URI: it goes nowhere (not the queue, not the metrics),
            # and costs at most one bounded audit row.
            self.uris_rejected += 1
            self._audit_later("NOTIFICATION_URI_REJECTED", generation, uri=uri[:AUDIT_URI_CHARS],
                              detail={"reason": problem, "uri_length": len(uri), "uri_sha256":
                                      hashlib.sha256(uri.encode("utf-8", "surrogatepass")).hexdigest()})
            return
        metrics.note_notification(self, uri)
        offer = self.router.offer(uri, generation, now=asyncio.get_running_loop().time())
        if offer == Offer.OVERFLOW:
            raise BacklogOverflow(f"session host backlog exceeded {self.server.max_pending_notifications}"
                                  " unrouted notifications")
        if offer == Offer.READY:
            self._queue.put_nowait(None)

    async def _route_loop(self) -> None:
        """One of ``route_concurrency`` routers: one ready key at a time, routed by the router's
        program (``IngressRouter.process``), its effects performed here (``_perform``)."""
        while True:
            await self._queue.get()
            turn = await self._drive(self.router.process())
            if turn == Turn.READY:
                self._queue.put_nowait(None)
            elif turn == Turn.SETTLING:
                self._settling.set()

    async def _settle_loop(self) -> None:
        """Hands each settling key to the routers once it is due (``IngressRouter.release`` on the
        event loop's clock, the one ``_enqueue`` offers with)."""
        loop = asyncio.get_running_loop()
        while True:
            due = self.router.work.next_due()
            wait = None if due is None else max(0.0, due - loop.time())
            with suppress(TimeoutError):
                await asyncio.wait_for(self._settling.wait(), wait)
            self._settling.clear()
            for _ in range(self.router.release(loop.time())):
                self._queue.put_nowait(None)

    async def _drive(self, program: Generator[Effect, Any, Turn]) -> Turn:
        """Run ``program`` to its end: perform each effect it yields and send back the answer; an
        effect that raises is thrown into it. Cancelled: the program is closed (its key is done)."""
        answer: Any = None
        error: BaseException | None = None
        started = asyncio.get_running_loop().time()
        try:
            while True:
                try:
                    effect = program.throw(error) if error is not None else program.send(answer)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                answer, error = None, None
                try:
                    answer = await (self._route_failed(effect, started) if isinstance(effect, RouteFailed)
                                    else self._perform(effect))
                except Exception as exc:  # noqa: BLE001 - the program decides (RouteFailed)
                    error = exc
        finally:
            program.close()

    async def _perform(self, effect: Effect) -> Any:  # noqa: PLR0911 - one branch per effect
        match effect:
            case Note(uri=uri, generation=generation, count=count):
                return await self.ledger.fence.note_notification(self.subject, self.server.name, uri,
                                                                 generation, count=count)
            case UnknownUri(uri=uri, generation=generation):
                return await self._unknown_uri(uri, generation)
            case Stamp(uri=uri, generation=generation):
                live, at = self.live, datetime.now(UTC)
                update = ResourceUpdated(uri=uri, session_generation=generation, received_at=at,
                                         notification_id=uuid.uuid4().hex)
                return Stamped(update, at, uuid.uuid4().hex, live.generation if live is not None else None)
            case ReadCycle():
                return await self._read_here(effect)
            case SignalUpdated(workflow_id=workflow_id, update=sig):
                return await self._signal(workflow_id, SIGNAL_RESOURCE_UPDATED, sig,
                                          "NOTIFICATION_NO_WORKFLOW", sig.session_generation, uri=sig.uri)
            case ReportRead(workflow_id=workflow_id, report=report):
                sig = report.update
                return await self._signal(workflow_id, SIGNAL_RESOURCE_READ, report,
                                          "NOTIFICATION_NO_WORKFLOW", sig.session_generation, uri=sig.uri)
            case Siblings(uri=uri):
                return await self.ledger.fence.normalized_siblings(self.subject, self.server.name, uri)
            case SiblingInvalidated():
                return await self._audit(
                    "AMBIGUOUS_SIBLING_INVALIDATED", uri=effect.sibling_uri, workflow_id=effect.workflow_id,
                    session_generation=effect.generation,
                    detail={"observed_uri": effect.observed_uri, "sibling_uri": effect.sibling_uri})
        raise TypeError(f"unknown ingress effect {effect!r}")

    async def _route_failed(self, failed: RouteFailed, started: float) -> bool:
        """PostgreSQL or Temporal briefly away must not lose an invalidation: route again after a
        backoff (0.2 s doubling, at most 5 s) until ``ROUTE_RETRY_SECONDS`` after the routing
        ``started``, then record the loss (the next notification or a poll repairs it)."""
        exc, uri, generation = failed.error, failed.uri, failed.generation
        delay = min(0.2 * 2 ** failed.attempt, 5.0)
        if asyncio.get_running_loop().time() + delay > started + ROUTE_RETRY_SECONDS:
            log.error("routing a notification failed for %.0fs, giving up (server=%s): %s",
                      ROUTE_RETRY_SECONDS, self.server.name, type(exc).__name__)
            with suppress(Exception):
                await self._audit("NOTIFICATION_NOT_ROUTED", uri=uri[:2048], session_generation=generation,
                                  detail={"error": type(exc).__name__})
            return False
        log.warning("routing a notification failed (server=%s): %s; retrying in %.1fs",
                    self.server.name, type(exc).__name__, delay)
        await asyncio.sleep(delay)
        return True

    def _audit_budgeted(self, kind: str, generation: int, *, uri: str,
                        detail: dict[str, object]) -> Coroutine[Any, Any, int] | None:
        """The write of one more ``kind`` audit row of this session generation: ``kind`` itself within
        ``AUDIT_ROWS_PER_SESSION``, one ``<kind>_SUPPRESSED`` row at the limit, then None (counted)."""
        n = self._audits[(kind, generation)]
        self._audits[(kind, generation)] = n + 1
        if n >= AUDIT_ROWS_PER_SESSION:
            self.audits_suppressed += 1
            if n > AUDIT_ROWS_PER_SESSION:
                return None
            detail = {"after_rows": AUDIT_ROWS_PER_SESSION, "first_suppressed": detail}
            kind = f"{kind}_SUPPRESSED"
        return self._audit(kind, uri=uri, session_generation=generation, detail=detail)

    def _audit_later(self, kind: str, generation: int, *, uri: str, detail: dict[str, object]) -> None:
        """A budgeted audit row, written off the receive loop (which never waits on PostgreSQL)."""
        audit = self._audit_budgeted(kind, generation, uri=uri, detail=detail)
        if audit is None:
            return

        async def write() -> None:
            with suppress(Exception):
                await audit

        task = asyncio.get_running_loop().create_task(write())
        self._audit_tasks.add(task)
        task.add_done_callback(self._audit_tasks.discard)

    async def _unknown_uri(self, uri: str, generation: int) -> None:
        """No exact match. A match after RFC 3986 normalization is an identity conflict for that
        subscription (an ``identity_conflict`` signal, audit NORMALIZED_URI_MATCH: it stops accepting
        until the conflict is resolved); it is never routed as if it were it. The CatalogWorkflow is
        asked for the evidence that resolves it (which URIs are listed; audit IDENTITY_NO_CATALOG when
        there is none: the workflow's time bound resolves it). UNKNOWN_URI rows are budgeted per
        session generation (``AUDIT_ROWS_PER_SESSION``)."""
        audit = self._audit_budgeted("UNKNOWN_URI", generation, uri=uri, detail={})
        if audit is not None:
            await audit
        siblings = await self.ledger.fence.normalized_siblings(self.subject, self.server.name, uri)
        sig = IdentityConflict(observed_uri=uri, session_generation=generation,
                               reason="notification URI matches only after normalization")
        for workflow_id, subscribed in siblings:
            await self._audit("NORMALIZED_URI_MATCH", uri=uri, workflow_id=workflow_id,
                              session_generation=generation, detail={"subscribed_uri": subscribed})
            with suppress(RPCError):
                await self.temporal.get_workflow_handle(workflow_id).signal(SIGNAL_IDENTITY_CONFLICT, sig)
        if siblings:  # the CatalogWorkflow of (subject, server) is asked to reconcile, never started
            reason = f"identity conflict: {uri[:RECONCILE_REASON_URI_CHARS]}"
            catalog = CatalogKey(subject=self.subject, server=self.server.name).workflow_id
            await self._signal(catalog, SIGNAL_RECONCILE, reason, "IDENTITY_NO_CATALOG", generation,
                               detail={"reason": reason})

    async def _read_here(self, cycle: ReadCycle) -> ReadCycleResult | None:
        """The read cycle on this ingress's live session. None when it failed or took longer than
        ``ingress_read_timeout_seconds`` (the program then signals the workflow, which reads itself; an
        ordinal this one burned stays burned, and an accept that committed unseen is superseded by
        that read's newer allocation)."""
        try:
            return await asyncio.wait_for(
                self.ingress.mcp.run_cycle(cycle.request, cycle_id=cycle.cycle_id, absorb=cycle.absorb),
                self.server.ingress_read_timeout_seconds)
        except Exception as exc:  # noqa: BLE001 - any failure falls back to the workflow's own read
            log.warning("read at the ingress failed (server=%s): %s; signalling the workflow",
                        self.server.name, type(exc).__name__)
            return None

    async def _signal(self, workflow_id: str, name: str, payload: object, missing: str, generation: int,
                      **audit: Any) -> bool:
        """Signal ``workflow_id``; False, with an audit row ``missing``, when it is not running (this host
        never starts a workflow)."""
        try:
            await self.temporal.get_workflow_handle(workflow_id).signal(name, payload)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            await self._audit(missing, workflow_id=workflow_id, session_generation=generation, **audit)
            return False
        return True
