"""Full catalog scans over the live MCP session of (subject, server) (its ingress's task queue).

Contract:
- ``catalog_scan`` lists every page of ``resources/list`` and then of
  ``resources/templates/list`` on the session generation the workflow named, following
  every cursor (on 2026-07-28 an empty-string cursor is a cursor, not the end), and feeds
  the pages into ``mcpsync.workflows.catalog_rules.ScanAccumulator``, which detects cursor loops, the
  page cap, duplicate URIs and descriptors that change between pages.
- An invalid cursor (-32602 on a continuation request) ends the scan as INVALID_CURSOR:
  the workflow restarts the reconciliation with a fresh scan. A lost connection or a
  newer session generation ends it as SESSION_LOST. A request timeout is raised, so
  Temporal retries the whole scan (scans are idempotent: same scan id, row replaced).
- The session host's list_changed counter for the (subject, server) generation is read before the first
  request and after the last response; the difference is ``notifications_observed``.
- A scan stops as PAGE_CAP past ``MAX_SCAN_ITEMS`` descriptors or ``MAX_SCAN_BYTES`` of them (compact
  JSON), as past the page cap: an absurd listing proves nothing (docs/security.md).
- The resources/list pages' ``ttlMs`` / ``cacheScope`` (2026-07-28) are recorded: the shortest
  ttl, and private if any page was (metadata; rescans keep their own period).
- Cursors never leave this process: the record holds keyed digests (a random key per
  activity worker). The scan row and its descriptors go to PostgreSQL; the workflow gets
  the ``resourceDiscoveryScan.v1`` record (digests and counts, no descriptors, the first
  ``MAX_CURSOR_DIGESTS_IN_HISTORY`` page cursor digests; the row has them all).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from mcpsync.activities.ledger.catalog import CatalogLedger, ScanItem
from mcpsync.activities.mcp_session import CONNECTION_CLOSED, REQUEST_TIMEOUT, LiveSession, SessionLookup
from mcpsync.workflows.catalog_rules import (
    MAX_CURSOR_DIGESTS_IN_HISTORY,
    ListKind,
    ScanAccumulator,
    ScanRequest,
    descriptor_digest,
    snapshot_negotiated,
)
from mcpsync.workflows.names import CatalogAct
from mcpsync.workflows.records.catalog import CatalogKey, ResourceDiscoveryScanV1, ScanStatus
from mcpsync.workflows.records.subscription import CacheScope

__all__ = ["CatalogScanActivities", "MAX_SCAN_BYTES", "MAX_SCAN_ITEMS"]

# One scan keeps every descriptor it listed (its set digest, the scan items in PostgreSQL): bounded
# here, beside the page cap (a page itself is bounded by the transport, worker/ingress/transport_bounds.py).
MAX_SCAN_ITEMS = 100_000
MAX_SCAN_BYTES = 64 * 1024 * 1024  # descriptors as compact JSON


class CatalogScanActivities:
    """Scan activities bound to one ingress (every session it holds).

    ``current(subject, server)`` returns the live session held here (or None);
    ``list_changed_count(subject, server, generation)`` the number of list_changed
    notifications that generation has received so far."""

    def __init__(self, current: SessionLookup, list_changed_count: Callable[[str, str, int], int],
                 catalog: CatalogLedger) -> None:
        self.current = current
        self.list_changed_count = list_changed_count
        self.catalog = catalog
        self._cursor_key = secrets.token_bytes(32)

    def all(self) -> list[Callable[..., Any]]:
        return [self.scan]

    def _usable(self, key: CatalogKey, generation: int) -> LiveSession | None:
        live = self.current(key.subject, key.server)
        if live is None or live.generation != generation or live.lost.is_set():
            return None
        return live

    @activity.defn(name=CatalogAct.SCAN)
    async def scan(self, req: ScanRequest) -> ResourceDiscoveryScanV1:
        base: dict[str, Any] = {
            "scan_id": req.scan_id, "reconciliation_id": req.reconciliation_id, "label": req.label,
            "subject": req.key.subject, "server": req.key.server,
            "session_generation": req.session_generation,
        }
        live = self._usable(req.key, req.session_generation)
        if live is None:
            record = ResourceDiscoveryScanV1(status=ScanStatus.SESSION_LOST,
                                             problems=["session generation is gone"], **base)
            await self.catalog.record_scan(record, [])
            return record
        negotiated = snapshot_negotiated(live.client.server_capabilities.experimental)
        acc = ScanAccumulator(edition=live.edition, page_cap=req.page_cap, snapshot_negotiated=negotiated,
                              cursor_key=self._cursor_key)
        before = self.list_changed_count(live.subject, live.server, live.generation)
        first_request_at = datetime.now(UTC)
        kinds: tuple[ListKind, ...] = ("resources", "templates")
        ttls: list[int] = []
        scopes: set[str] = set()
        scanned_items = scanned_bytes = 0
        for kind in kinds:
            cursor: str | None = None
            while not acc.stopped:
                activity.heartbeat(acc.pages)
                if self._usable(req.key, req.session_generation) is None:
                    acc.fail(ScanStatus.SESSION_LOST, "session generation ended during the scan")
                    break
                try:
                    page: types.ListResourcesResult | types.ListResourceTemplatesResult
                    if kind == "resources":
                        page = await live.client.list_resources(cursor=cursor, cache_mode="bypass")
                        listed: list[Any] = list(page.resources)
                        ttls.append(page.ttl_ms)
                        scopes.add(page.cache_scope)
                    else:
                        page = await live.client.list_resource_templates(cursor=cursor, cache_mode="bypass")
                        listed = list(page.resource_templates)
                    items = [d.model_dump(mode="json", by_alias=True, exclude_none=True) for d in listed]
                    scanned_items += len(items)
                    scanned_bytes += sum(len(json.dumps(d, separators=(",", ":"))) for d in items)
                    if scanned_items > MAX_SCAN_ITEMS or scanned_bytes > MAX_SCAN_BYTES:
                        # An endless (or absurd) listing, like one
                        # past the page cap: this scan proves nothing.
                        acc.fail(ScanStatus.PAGE_CAP, f"{kind}: scan cap reached after page {acc.pages + 1}: "
                                                      f"{scanned_items} descriptors (cap {MAX_SCAN_ITEMS}), "
                                                      f"{scanned_bytes} bytes (cap {MAX_SCAN_BYTES})")
                        break
                except MCPError as err:
                    if err.code == REQUEST_TIMEOUT:
                        raise ApplicationError(f"list timed out: {err.message[:200]}",
                                               type="ListTimeout") from None
                    if err.code == types.METHOD_NOT_FOUND and kind == "templates" and cursor is None:
                        break  # no templates/list on this server: an empty template list
                    if err.code == CONNECTION_CLOSED:
                        live.lost.set()
                        acc.fail(ScanStatus.SESSION_LOST, "connection closed")
                    elif err.code == types.INVALID_PARAMS and cursor is not None:
                        acc.fail(ScanStatus.INVALID_CURSOR,
                                 f"{kind}: page {acc.pages + 1}: the server rejected "
                                                            f"its cursor ({err.message[:120]})")
                    else:
                        acc.fail(ScanStatus.FAILED, f"{kind}: {err.code}: {err.message[:200]}")
                    break
                except ValidationError as err:
                    acc.fail(ScanStatus.FAILED, f"{kind}: invalid result: {err.error_count()} errors")
                    break
                cursor = acc.page(kind, cursor, items, page.next_cursor, page.meta)
                if cursor is None:
                    break
        after = self.list_changed_count(live.subject, live.server, live.generation)
        if self._usable(req.key, req.session_generation) is None and not acc.stopped:
            acc.fail(ScanStatus.SESSION_LOST, "session generation ended during the scan")
        digests = acc.digests()
        resources = acc.descriptors["resources"]
        templates = acc.descriptors["templates"]
        record = ResourceDiscoveryScanV1(
            **base, edition=live.edition, status=acc.final_status(), first_request_at=first_request_at,
            completed_at=datetime.now(UTC), page_cursor_digests=list(acc.page_cursor_digests),
            page_count=acc.pages, resource_count=len(resources), template_count=len(templates),
            uri_set_digest=digests[0] if digests else None,
            descriptor_set_digest=digests[1] if digests else None,
            template_set_digest=digests[2] if digests else None, list_changed_before=before,
            list_changed_after=after, notifications_observed=max(0, after - before),
            snapshot=acc.snapshot_evidence(), problems=list(acc.problems),
            list_ttl_ms=min(ttls) if ttls else None,
            list_cache_scope=None if not scopes else CacheScope.PRIVATE if "private" in scopes
                else CacheScope.PUBLIC,
        )
        items_out = [ScanItem("resource", u, d, descriptor_digest(d)) for u, d in resources.items()]
        items_out += [ScanItem("template", t, d, descriptor_digest(d)) for t, d in templates.items()]
        await self.catalog.record_scan(record, items_out)
        # PostgreSQL keeps every page's cursor digest; workflow history gets the first few.
        return record.model_copy(
            update={"page_cursor_digests": record.page_cursor_digests[:MAX_CURSOR_DIGESTS_IN_HISTORY]})
