"""Server probe: characterize a real MCP server before onboarding it (``mcpsync probe``).

Contract:
- ``probe_server(server, subject=...)`` opens its own session(s) with the configured
  transport and credentials and returns a ``ProbeReport`` (``serverProbe.v1``): negotiated
  edition (and what the other negotiation mode gets), implementation, capabilities,
  snapshot-id extension support (an ``experimental`` or ``extensions`` key containing
  "snapshot"), two full list scans (page size, cursor stability, cursor loops),
  ``lastModified`` presence, the not-found error code (and how mcpsync classifies it),
  whether subscribe really works, and every MCP error code seen on the way.
- It does not change the server: it lists, reads, subscribes and unsubscribes (or opens
  and closes one ``subscriptions/listen`` stream) in its own sessions, all of which end
  with the probe. Proof that updates arrive needs the server to change, so it is only
  attempted with a ``Nudge``: server-specific actions that do change server state
  (``nudge="auto"`` picks a known one by server identity, e.g. server-everything's
  ``toggle-subscriber-updates`` tool, called again afterwards to switch it back off).
- Resource bodies never appear in the report: reads are reduced to digests
  (``mcpsync.workflows.digest.content_digest``), cursors to digests of the cursor strings.
- A server that cannot be started, reached or initialized raises ``ProbeError`` with the
  reason; every other failure is recorded in the report, never raised.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from pydantic import Field

from mcpsync import __version__
from mcpsync.activities.mcp_session import classify_error, content_parts
from mcpsync.worker.ingress.session_host import server_transport
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.digest import content_digest
from mcpsync.workflows.records.base import FrozenRecord

__all__ = [
    "KNOWN_NUDGES",
    "CallableNudge",
    "EditionProbe",
    "ErrorSeen",
    "ListingProbe",
    "NotFoundProbe",
    "Nudge",
    "ProbeCapabilities",
    "ProbeError",
    "ProbeReport",
    "ReadProbe",
    "ScanProbe",
    "SubscribeProbe",
    "SubscribeVerdict",
    "ToolNudge",
    "probe_server",
]

MODERN = "2026-07-28"
MAX_PAGES = 500
"""A scan that has not ended after this many pages is reported incomplete (``page_limit``)."""


class ProbeError(RuntimeError):
    """The server could not be started, reached or initialized: nothing could be probed."""



# --- report ---------------------------------------------------------------------------------


class ErrorSeen(FrozenRecord):
    method: str
    code: int
    message: str


class EditionProbe(FrozenRecord):
    """What one negotiation mode got: ``legacy`` (initialize) or ``auto`` (server/discover first)."""

    mode: Literal["legacy", "auto"]
    negotiated: str | None = None
    error: str | None = None


class ProbeCapabilities(FrozenRecord):
    resources: bool
    subscribe: bool
    list_changed: bool
    experimental: list[str] = Field(default_factory=list)
    extensions: list[str] = Field(default_factory=list)
    snapshot_extension: str | None = None  # the capability key that names snapshot support, if any
    raw: dict[str, Any] = Field(default_factory=dict)  # ServerCapabilities as the server sent them

    @property
    def snapshot(self) -> bool:
        return self.snapshot_extension is not None


class ScanProbe(FrozenRecord):
    """One full ``resources/list`` scan."""

    pages: int
    resources: int
    page_sizes: list[int]
    cursor_digests: list[str]  # sha256 prefix of each next cursor, in order (cursors are opaque)
    listing_digest: str  # over the URIs in listed order
    complete: bool
    problem: str | None = None  # "cursor_loop" | "page_limit" | "error -32602: ..."
    elapsed_ms: float


class ListingProbe(FrozenRecord):
    scans: list[ScanProbe]
    paginated: bool
    page_size: int | None  # the size of a non-final page; None when one page held everything
    cursors_stable: bool  # both scans returned identical cursor strings
    listing_stable: bool  # both scans listed the same URIs in the same order
    resources: int
    with_last_modified: int  # listed resources carrying annotations.lastModified
    with_size: int
    templates: int | None  # None: resources/templates/list failed (see errors)
    template_uris: list[str] = Field(default_factory=list)


class ReadProbe(FrozenRecord):
    """``resources/read`` of one listed resource, as mcpsync would digest it."""

    uri: str
    ok: bool
    digest: str | None = None
    mime_type: str | None = None
    parts: int = 0
    size: int = 0
    error_code: int | None = None


class NotFoundProbe(FrozenRecord):
    uri: str
    code: int | None  # None: the read did not fail
    message: str | None = None
    # mcpsync.activities.mcp_session.classify_error: not_found / malformed / ...
    classified_as: str | None = None


SubscribeVerdict = Literal["verified", "ack_only", "no_update", "rejected", "not_advertised", "no_resource"]


class SubscribeProbe(FrozenRecord):
    """Whether subscribe really works: ack, and (when nudged) an update within the bound."""

    uri: str | None
    method: Literal["resources/subscribe", "subscriptions/listen"] | None
    advertised: bool
    acked: bool | None = None
    ack_ms: float | None = None
    honored: bool | None = None  # listen: the server kept the URI in its honored filter
    error_code: int | None = None
    error: str | None = None
    nudge: str | None = None  # what was done to make the server change; None = not nudged
    update_within_bound: bool | None = None  # None: not attempted (no nudge)
    update_ms: float | None = None  # from the nudge to the first update for the URI
    bound_seconds: float
    unsubscribed: bool | None = None
    verdict: SubscribeVerdict
    detail: str = ""


class ProbeReport(FrozenRecord):
    """``serverProbe.v1``: one probe of one server for one subject."""

    record: Literal["serverProbe.v1"] = "serverProbe.v1"
    server: str
    subject: str
    transport: Literal["stdio", "http"]
    target: str  # the command or the (redacted) URL
    requested_edition: str
    edition: str  # negotiated by the probe's main session
    server_name: str
    server_version: str
    editions: list[EditionProbe]
    capabilities: ProbeCapabilities
    listing: ListingProbe
    read: ReadProbe | None
    not_found: NotFoundProbe
    subscribe: SubscribeProbe
    error_codes: list[int]  # distinct MCP error codes seen, sorted
    errors: list[ErrorSeen]
    notifications: dict[str, int]  # notification method -> count received during the probe
    started_at: datetime
    duration_ms: float


# --- nudges -----------------------------------------------------------------------------------


class Nudge(Protocol):
    """Makes the server emit an update for ``uri`` on the probe's session. It changes server state."""

    @property
    def description(self) -> str: ...

    async def start(self, client: Client, uri: str) -> None: ...

    async def stop(self, client: Client, uri: str) -> None: ...


@dataclass(frozen=True)
class ToolNudge:
    """Call a server tool (no arguments) on the probe's session; ``toggle``: call it again to undo."""

    tool: str
    toggle: bool = False

    @property
    def description(self) -> str:
        return f"tool {self.tool}" + (" (called again afterwards to switch it off)" if self.toggle else "")

    async def start(self, client: Client, uri: str) -> None:
        result = await client.call_tool(self.tool, {})
        if isinstance(result, types.CallToolResult) and result.is_error:
            raise RuntimeError(f"tool {self.tool} reported an error")

    async def stop(self, client: Client, uri: str) -> None:
        if self.toggle:
            await client.call_tool(self.tool, {})


@dataclass(frozen=True)
class CallableNudge:
    """A nudge from code: ``fn(uri)`` makes the server change (e.g. a fixture's control plane)."""

    fn: Callable[[str], Awaitable[object]]
    label: str = "callable"

    @property
    def description(self) -> str:
        return self.label

    async def start(self, client: Client, uri: str) -> None:
        await self.fn(uri)

    async def stop(self, client: Client, uri: str) -> None:
        return None


KNOWN_NUDGES: dict[str, Nudge] = {
    # @modelcontextprotocol/server-everything: per-session simulated updates every 5 s for the
    # URIs that session subscribed to (first one at once); the same tool switches them off.
    "mcp-servers/everything": ToolNudge("toggle-subscriber-updates", toggle=True),
}


# --- probing ----------------------------------------------------------------------------------


class _Recorder:
    def __init__(self) -> None:
        self.errors: list[ErrorSeen] = []
        self.notifications: Counter[str] = Counter()
        self.updated: dict[str, asyncio.Event] = {}

    def error(self, method: str, err: MCPError) -> None:
        self.errors.append(ErrorSeen(method=method, code=err.code, message=(err.message or "")[:200]))

    def waiter(self, uri: str) -> asyncio.Event:
        return self.updated.setdefault(uri, asyncio.Event())

    def saw_update(self, uri: str) -> None:
        self.waiter(uri).set()

    async def on_message(self, message: object) -> None:
        if isinstance(message, Exception):
            self.notifications[f"transport-error:{type(message).__name__}"] += 1
            return
        method = getattr(message, "method", None)
        if isinstance(method, str):
            self.notifications[method] += 1
        if isinstance(message, types.ResourceUpdatedNotification):
            self.saw_update(str(message.params.uri))


def _client(cfg: ServerConfig, subject: str, mode: Literal["legacy", "auto"], recorder: _Recorder,
            timeout: float) -> Client:
    """A client exactly as the session host builds one (transport, credentials), no response cache."""
    server = server_transport(cfg, subject)
    return Client(server, mode=mode, cache=None, message_handler=recorder.on_message,  # type: ignore[arg-type]
                  read_timeout_seconds=timeout,
                  client_info=types.Implementation(name="mcpsync-probe", version=__version__))


@asynccontextmanager
async def _session(cfg: ServerConfig, subject: str, mode: Literal["legacy", "auto"], recorder: _Recorder,
                   timeout: float) -> AsyncIterator[Client]:
    client = _client(cfg, subject, mode, recorder, timeout)
    try:
        async with asyncio.timeout(max(timeout, 5.0)):
            await client.__aenter__()
    except Exception as exc:
        with suppress(Exception):
            async with asyncio.timeout(5):
                await client.__aexit__(None, None, None)
        raise ProbeError(f"cannot open MCP server {cfg.name!r} ({cfg.transport} {cfg.target}): "
                         f"{_describe(exc)}") from None
    try:
        yield client
    finally:
        with suppress(Exception):
            async with asyncio.timeout(5):
                await client.__aexit__(None, None, None)


def _describe(exc: BaseException) -> str:
    inner = exc
    while isinstance(inner, BaseExceptionGroup) and inner.exceptions:
        inner = inner.exceptions[0]
    if isinstance(inner, TimeoutError):
        return "no initialize response in time"
    if isinstance(inner, FileNotFoundError):
        return f"command not found: {inner.filename or inner}"
    return f"{type(inner).__name__}: {str(inner)[:200]}"


def _ms(since: float) -> float:
    return round((time.monotonic() - since) * 1000, 1)


def _short_digest(value: str) -> str:
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]


def _capabilities(caps: types.ServerCapabilities) -> ProbeCapabilities:
    res = caps.resources
    experimental = sorted((caps.experimental or {}).keys())
    extensions = sorted((caps.extensions or {}).keys())
    snapshot = next((k for k in [*experimental, *extensions] if "snapshot" in k.lower()), None)
    return ProbeCapabilities(
        resources=res is not None,
        subscribe=bool(res and res.subscribe),
        list_changed=bool(res and res.list_changed),
        experimental=experimental,
        extensions=extensions,
        snapshot_extension=snapshot,
        raw=caps.model_dump(mode="json", by_alias=True, exclude_none=True),
    )


async def _scan(client: Client, modern: bool, rec: _Recorder, timeout: float
                ) -> tuple[ScanProbe, list[types.Resource], list[str]]:
    started = time.monotonic()
    resources: list[types.Resource] = []
    sizes: list[int] = []
    cursors: list[str] = []
    seen: set[str] = set()
    cursor: str | None = None
    problem: str | None = None
    complete = False
    while True:
        try:
            async with asyncio.timeout(timeout):
                page = await client.list_resources(cursor=cursor)
        except MCPError as err:
            rec.error("resources/list", err)
            problem = f"error {err.code}: {(err.message or '')[:120]}"
            break
        except TimeoutError:
            problem = f"no resources/list answer within {timeout} s"
            break
        resources.extend(page.resources)
        sizes.append(len(page.resources))
        nxt = page.next_cursor
        # An empty cursor is a valid cursor on 2026-07-28; earlier servers send it to mean "done".
        if nxt is None or (nxt == "" and not modern):
            complete = True
            break
        cursors.append(nxt)
        if nxt in seen:
            problem = "cursor_loop"
            break
        if len(sizes) >= MAX_PAGES:
            problem = "page_limit"
            break
        seen.add(nxt)
        cursor = nxt
    listing = _short_digest("\n".join(r.uri for r in resources))
    scan = ScanProbe(pages=len(sizes), resources=len(resources), page_sizes=sizes,
                     cursor_digests=[_short_digest(c) for c in cursors], listing_digest=listing,
                     complete=complete, problem=problem, elapsed_ms=_ms(started))
    return scan, resources, cursors


def _digest_read(result: types.ReadResourceResult) -> tuple[str, str | None, int, int]:
    """(digest, mime type, parts, size) exactly as mcpsync.activities.mcp_session digests a read."""
    parts = content_parts(result)
    if not parts:
        raise ValueError("read returned no contents")
    return content_digest(parts), parts[0].mime_type, len(parts), sum(len(p.data) for p in parts)


async def _read(client: Client, uri: str, rec: _Recorder, timeout: float) -> ReadProbe:
    try:
        async with asyncio.timeout(timeout):
            result = await client.read_resource(uri)
        digest, mime, parts, size = _digest_read(result)
    except MCPError as err:
        rec.error("resources/read", err)
        return ReadProbe(uri=uri, ok=False, error_code=err.code)
    except (ValueError, TimeoutError):
        return ReadProbe(uri=uri, ok=False)
    return ReadProbe(uri=uri, ok=True, digest=digest, mime_type=mime, parts=parts, size=size)


def _not_found_uri(resources: list[types.Resource]) -> str:
    scheme = "mcpsync-probe"
    if resources and "://" in resources[0].uri:
        scheme = resources[0].uri.split("://", 1)[0]
    return f"{scheme}://mcpsync-probe/does-not-exist/{uuid.uuid4().hex}"


async def _not_found(client: Client, uri: str, rec: _Recorder, timeout: float) -> NotFoundProbe:
    try:
        async with asyncio.timeout(timeout):
            await client.read_resource(uri)
    except MCPError as err:
        rec.error("resources/read", err)
        kind = classify_error(err)
        return NotFoundProbe(uri=uri, code=err.code, message=(err.message or "")[:200],
                             classified_as=kind.value if kind is not None else "transient")
    except TimeoutError:
        return NotFoundProbe(uri=uri, code=None, message=f"no answer within {timeout} s")
    return NotFoundProbe(uri=uri, code=None, message="the read succeeded", classified_as="content")


async def _subscribe(client: Client, uri: str | None, caps: ProbeCapabilities, nudge: Nudge | None,
                     bound: float, rec: _Recorder, timeout: float, nudge_note: str) -> SubscribeProbe:
    modern = client.protocol_version == MODERN
    method: Literal["resources/subscribe", "subscriptions/listen"] = (
        "subscriptions/listen" if modern else "resources/subscribe")
    base: dict[str, Any] = {"uri": uri, "method": method, "advertised": caps.subscribe,
                            "bound_seconds": bound}
    if uri is None:
        return SubscribeProbe(**base, verdict="no_resource", detail="the server listed no resource to "
                                                                    "subscribe to")
    async with AsyncExitStack() as stack:
        started = time.monotonic()
        honored: bool | None = None
        try:
            async with asyncio.timeout(timeout):
                if modern:
                    sub = await stack.enter_async_context(client.listen(resource_subscriptions=[uri]))
                    honored = uri in (sub.honored.resource_subscriptions or ())
                    stack.push_async_callback(_drain_cancel, asyncio.create_task(_pump(sub, rec)))
                else:
                    with warnings.catch_warnings():  # the 2025-11-25 call is what this edition needs
                        warnings.simplefilter("ignore", MCPDeprecationWarning)
                        await client.session.subscribe_resource(uri)
        except MCPError as err:
            rec.error(method, err)
            verdict: SubscribeVerdict = "not_advertised" if not caps.subscribe else "rejected"
            return SubscribeProbe(**base, acked=False, error_code=err.code, error=(err.message or "")[:200],
                                  verdict=verdict)
        except TimeoutError:
            return SubscribeProbe(**base, acked=False, error=f"no acknowledgment within {timeout} s",
                                  verdict="rejected" if caps.subscribe else "not_advertised")
        ack_ms = _ms(started)
        update: bool | None = None
        update_ms: float | None = None
        detail = ""
        if nudge is not None and honored is not False:
            waiter = rec.waiter(uri)
            waiter.clear()
            nudged = time.monotonic()
            try:
                async with asyncio.timeout(timeout):
                    await nudge.start(client, uri)
            except Exception as exc:
                detail = f"nudge failed: {type(exc).__name__}: {str(exc)[:160]}"
            else:
                try:
                    async with asyncio.timeout(bound):
                        await waiter.wait()
                    update, update_ms = True, _ms(nudged)
                except TimeoutError:
                    update = False
                finally:
                    with suppress(Exception):
                        async with asyncio.timeout(timeout):
                            await nudge.stop(client, uri)
        elif nudge is None:
            detail = nudge_note
        unsubscribed: bool | None = None
        if not modern:
            try:
                async with asyncio.timeout(timeout):
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", MCPDeprecationWarning)
                        await client.session.unsubscribe_resource(uri)
                unsubscribed = True
            except MCPError as err:
                rec.error("resources/unsubscribe", err)
                unsubscribed = False
            except TimeoutError:
                unsubscribed = False
    if modern:
        unsubscribed = True  # the listen stream closed with the context above
    if not caps.subscribe:
        verdict = "not_advertised"
        detail = detail or "not advertised, yet the server acknowledged it"
    elif honored is False:
        verdict = "rejected"
        detail = "the server dropped the URI from the honored listen filter"
    elif update is True:
        verdict = "verified"
    elif update is False:
        verdict = "no_update"
    else:
        verdict = "ack_only"
    return SubscribeProbe(**base, acked=True, ack_ms=ack_ms, honored=honored,
                          nudge=nudge.description if nudge is not None else None, update_within_bound=update,
                          update_ms=update_ms, unsubscribed=unsubscribed, verdict=verdict, detail=detail)


async def _pump(sub: Any, rec: _Recorder) -> None:
    with suppress(Exception):
        async for event in sub:
            uri = getattr(event, "uri", None)
            rec.notifications[f"listen:{type(event).__name__}"] += 1
            if isinstance(uri, str):
                rec.saw_update(uri)


async def _drain_cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _edition(cfg: ServerConfig, subject: str, mode: Literal["legacy", "auto"], timeout: float
                   ) -> EditionProbe:
    try:
        async with _session(cfg, subject, mode, _Recorder(), timeout) as client:
            return EditionProbe(mode=mode, negotiated=client.protocol_version)
    except ProbeError as exc:
        return EditionProbe(mode=mode, error=str(exc)[:300])


async def probe_server(server: ServerConfig, *, subject: str = "anonymous", uri: str | None = None,
                       not_found_uri: str | None = None, nudge: Nudge | Literal["auto"] | None = None,
                       update_bound_seconds: float = 10.0, timeout: float = 10.0,
                       edition: Literal["2025-11-25", "2026-07-28", "auto"] | None = None,
                       other_edition: bool = True) -> ProbeReport:
    """Probe ``server`` as ``subject``; see the module contract. Raises ``ProbeError`` if it cannot
    connect."""
    requested = edition or server.edition
    mode: Literal["legacy", "auto"] = "legacy" if requested == "2025-11-25" else "auto"
    started_at = datetime.now(UTC)
    started = time.monotonic()
    rec = _Recorder()
    async with _session(server, subject, mode, rec, timeout) as client:
        negotiated = client.protocol_version
        modern = negotiated == MODERN
        impl = client.server_info
        caps = _capabilities(client.server_capabilities)
        scan_a, resources, cursors_a = await _scan(client, modern, rec, timeout)
        scan_b, resources_b, cursors_b = await _scan(client, modern, rec, timeout)
        templates: int | None = None
        template_uris: list[str] = []
        try:
            async with asyncio.timeout(timeout):
                tpl = await client.list_resource_templates()
            templates = len(tpl.resource_templates)
            template_uris = [t.uri_template for t in tpl.resource_templates]
        except MCPError as err:
            rec.error("resources/templates/list", err)
        except TimeoutError:
            pass
        listing = ListingProbe(
            scans=[scan_a, scan_b],
            paginated=scan_a.pages > 1,
            page_size=scan_a.page_sizes[0] if scan_a.pages > 1 else None,
            cursors_stable=cursors_a == cursors_b,
            listing_stable=[r.uri for r in resources] == [r.uri for r in resources_b],
            resources=len(resources),
            with_last_modified=sum(1 for r in resources if r.annotations and r.annotations.last_modified),
            with_size=sum(1 for r in resources if r.size is not None),
            templates=templates,
            template_uris=template_uris,
        )
        target_uri = uri or (resources[0].uri if resources else None)
        read = await _read(client, target_uri, rec, timeout) if target_uri else None
        not_found = await _not_found(client, not_found_uri or _not_found_uri(resources), rec, timeout)
        chosen: Nudge | None
        note = "not nudged: proving updates needs --nudge, which changes server state"
        if nudge == "auto":
            chosen = KNOWN_NUDGES.get(impl.name if impl else "")
            if chosen is None:
                note = f"no known nudge for server {impl.name if impl else '?'!r}: ack checked only"
        else:
            chosen = nudge
        subscribe = await _subscribe(client, target_uri, caps, chosen, update_bound_seconds, rec, timeout,
                                     note)
    editions = [EditionProbe(mode=mode, negotiated=negotiated)]
    if other_edition:
        editions.append(await _edition(server, subject, "auto" if mode == "legacy" else "legacy", timeout))
    return ProbeReport(
        server=server.name, subject=subject, transport=server.transport, target=server.target,
        requested_edition=requested, edition=negotiated, server_name=impl.name if impl else "",
        server_version=impl.version if impl else "", editions=editions, capabilities=caps, listing=listing,
        read=read, not_found=not_found, subscribe=subscribe,
        error_codes=sorted({e.code for e in rec.errors}), errors=rec.errors,
        notifications=dict(rec.notifications), started_at=started_at, duration_ms=_ms(started),
    )
