"""The catalog side of the PostgreSQL ledger, and its Temporal activities (main task queue).

Contract:
- ``record_scan`` stores one ``resourceDiscoveryScan.v1`` row and the descriptors it
  listed (retries replace both). No cursor is ever stored; the row holds keyed digests.
- ``publish`` is the only way a catalog comes into being. In one transaction it loads the
  two scans, re-judges them with ``mcpsync.workflows.catalog_rules.judge_pair`` (so a caller cannot talk
  it into an unreconciled catalog), refuses one older than the latest catalog of the view,
  writes the ``resourceCatalog.v1`` row, diffs scan B against the known set of
  (subject, server) and records every added / removed / changed URI. A refusal counts in
  ``catalog_counters`` and writes nothing else. A retried publish answers the same row.
- Everything is keyed by (subject, server): one subject's scans, catalogs, known set and
  changes are never read for another.
- ``consume_for_completeness`` is the completeness gate's database half: it grants only
  a SNAPSHOT_PROVEN catalog still inside its staleness bound and records every request,
  granted or refused. ``release_gates`` recomputes the two release counters from the truth.
- Staged rollout lives in ``rollout_policies`` (absent = ALL); changing it never touches the
  subscription fences, watermarks or close receipts.
- URI identity (docs/identity.md): ``publish`` flags each listed pair of URIs that normalize
  alike (``mcpsync.workflows.uris.ambiguous_pairs``) once per (subject, server): a row in
  ``ambiguous_uri_pairs`` and one AMBIGUOUS_URI_LISTED audit row, in the publish transaction.
  Every ``catalog_reconciled`` observation carries ``variants``: the listed URIs that normalize
  like the subscribed one but differ from it (the evidence identity reconciliation needs).
- Activities: ``catalog_rollout``, ``catalog_publish``, ``catalog_notify_subscriptions``
  (``catalog_reconciled`` to every non-terminal subscription of the view that the rollout
  lets act and that existed before the catalog's measurement window began) and
  ``catalog_auto_subscribe`` (new URIs matching the policy's prefixes).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.workflows.catalog_rules import (
    AutoSubscribeRequest,
    NotifyRequest,
    NotifyResult,
    PublishOutcome,
    PublishRequest,
    judge_pair,
    refresh_enabled,
)
from mcpsync.workflows.names import SIGNAL_CATALOG_RECONCILED, CatalogAct
from mcpsync.workflows.records.catalog import (
    CatalogKey,
    CatalogSnapshot,
    ResourceDiscoveryScanV1,
    RolloutMode,
    RolloutPolicy,
    ScanStatus,
    SnapshotEvidence,
    SnapshotStatus,
)
from mcpsync.workflows.records.subscription import (
    TERMINAL_STATES,
    CacheScope,
    CatalogObservation,
    SubscriptionKey,
)
from mcpsync.workflows.uris import ambiguous_pairs, normalize_uri

__all__ = ["CatalogLedger", "CatalogLedgerActivities", "CompletenessDecision", "ScanItem", "RELEASE_GATES"]

RELEASE_GATES = ("unreconciled_catalogs_accepted", "completeness_consumed_unproven")


@dataclass(frozen=True, slots=True)
class ScanItem:
    """One listed descriptor: ``kind`` is 'resource' or 'template', ``ident`` its exact URI (template)."""

    kind: str
    ident: str
    descriptor: Mapping[str, Any]
    descriptor_digest: str


@dataclass(frozen=True, slots=True)
class CompletenessDecision:
    granted: bool
    reason: str
    catalog: CatalogSnapshot | None
    uris: tuple[str, ...] = ()
    consumption_id: int | None = None


def _view_lock(key: CatalogKey) -> int:
    """Advisory lock id of one view (signed 64-bit, as PostgreSQL wants it)."""
    raw = hashlib.sha256(f"catalog\0{key.subject}\0{key.server}".encode()).digest()[:8]
    return int.from_bytes(raw, "big", signed=True)


def _scan(row: Mapping[str, Any]) -> ResourceDiscoveryScanV1:
    return ResourceDiscoveryScanV1(
        scan_id=row["scan_id"], reconciliation_id=row["reconciliation_id"], label=row["label"],
        subject=row["subject"], server=row["server"], session_generation=row["session_generation"],
        edition=row["edition"], status=ScanStatus(row["status"]), first_request_at=row["first_request_at"],
        completed_at=row["completed_at"], page_cursor_digests=list(row["page_cursor_digests"]),
        page_count=row["page_count"], resource_count=row["resource_count"],
        template_count=row["template_count"], uri_set_digest=row["uri_set_digest"],
        descriptor_set_digest=row["descriptor_set_digest"], template_set_digest=row["template_set_digest"],
        list_changed_before=row["list_changed_before"], list_changed_after=row["list_changed_after"],
        notifications_observed=row["notifications_observed"],
        snapshot=SnapshotEvidence.model_validate(row["snapshot"]), problems=list(row["problems"]),
        list_ttl_ms=row.get("list_ttl_ms"),
        list_cache_scope=CacheScope(row["list_cache_scope"]) if row.get("list_cache_scope") else None,
    )


def _catalog(row: Mapping[str, Any]) -> CatalogSnapshot:
    return CatalogSnapshot(
        catalog_id=row["catalog_id"], subject=row["subject"], server=row["server"],
        reconciliation_id=row["reconciliation_id"], scan_a=row["scan_a"], scan_b=row["scan_b"],
        status=SnapshotStatus(row["status"]), status_reason=row["status_reason"],
        session_generation=row["session_generation"], snapshot_id=row["snapshot_id"],
        window_started_at=row["window_started_at"], measured_at=row["measured_at"],
        staleness_bound_seconds=row["staleness_bound_seconds"], next_review_at=row["next_review_at"],
        uri_set_digest=row["uri_set_digest"], descriptor_set_digest=row["descriptor_set_digest"],
        template_set_digest=row["template_set_digest"], resource_count=row["resource_count"],
        template_count=row["template_count"], added=row["added"], removed=row["removed"],
        changed=row["changed"], initial=row["initial"], rollout_mode=RolloutMode(row["rollout_mode"]),
        published_at=row["published_at"],
    )


class CatalogLedger:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    # --- scans --------------------------------------------------------------------

    async def record_scan(self, scan: ResourceDiscoveryScanV1, items: Iterable[ScanItem]) -> None:
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute("DELETE FROM discovery_scans WHERE scan_id=%s", (scan.scan_id,))  # a retry
            await conn.execute(
                """
                INSERT INTO discovery_scans (scan_id, reconciliation_id, label, subject, server,
                    session_generation, edition, status, first_request_at, completed_at, page_count,
                    resource_count, template_count, page_cursor_digests, uri_set_digest,
                    descriptor_set_digest, template_set_digest, list_changed_before, list_changed_after,
                    notifications_observed, snapshot, problems, list_ttl_ms, list_cache_scope)
                VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)
                """,
                (scan.scan_id, scan.reconciliation_id, scan.label, scan.subject, scan.server,
                 scan.session_generation, scan.edition, scan.status.value, scan.first_request_at,
                 scan.completed_at, scan.page_count, scan.resource_count, scan.template_count,
                 json.dumps(scan.page_cursor_digests), scan.uri_set_digest, scan.descriptor_set_digest,
                 scan.template_set_digest, scan.list_changed_before, scan.list_changed_after,
                 scan.notifications_observed, scan.snapshot.model_dump_json(), json.dumps(scan.problems),
                 scan.list_ttl_ms,
                 scan.list_cache_scope.value if scan.list_cache_scope is not None else None),
            )
            cur = conn.cursor()
            async with cur.copy("COPY discovery_scan_items (scan_id, kind, ident,"
                                " descriptor, descriptor_digest) FROM STDIN") as copy:
                for item in items:
                    await copy.write_row((scan.scan_id, item.kind, item.ident, json.dumps(item.descriptor),
                                          item.descriptor_digest))

    async def get_scan(self, scan_id: str) -> ResourceDiscoveryScanV1 | None:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT * FROM discovery_scans WHERE scan_id=%s", (scan_id,))
            row = await cur.fetchone()
        return None if row is None else _scan(row)

    async def scans_for(self, subject: str, server: str, limit: int = 20) -> list[ResourceDiscoveryScanV1]:
        """The newest scans of one view, oldest first."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT * FROM discovery_scans WHERE subject=%s AND server=%s"
                " ORDER BY recorded_at DESC LIMIT %s",
                (subject, server, limit),
            )
            rows = await cur.fetchall()
        return [_scan(r) for r in reversed(rows)]

    async def scan_items(self, scan_id: str, kind: str = "resource") -> list[str]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT ident FROM discovery_scan_items WHERE scan_id=%s AND kind=%s ORDER BY ident",
                (scan_id, kind)
            )
            return [r[0] for r in await cur.fetchall()]

    # --- catalogs -----------------------------------------------------------------

    async def publish(self, req: PublishRequest) -> PublishOutcome:
        k = req.key
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            # One publisher per view at a time, whatever the workflow history says.
            await cur.execute("SELECT pg_advisory_xact_lock(%s)", (_view_lock(k),))
            await cur.execute("SELECT * FROM resource_catalogs WHERE reconciliation_id=%s",
                              (req.reconciliation_id,))
            row = await cur.fetchone()
            if row is not None:
                return PublishOutcome(published=True, catalog=_catalog(row), reason="already published")

            async def refuse(reason: str) -> PublishOutcome:
                await cur.execute("UPDATE catalog_counters SET value = value + 1"
                                  " WHERE name='catalog_publish_refused'")
                return PublishOutcome(published=False, reason=reason)

            await cur.execute("SELECT * FROM discovery_scans WHERE scan_id = ANY(%s)",
                              ([req.scan_a, req.scan_b],))
            scans = {r["scan_id"]: _scan(r) for r in await cur.fetchall()}
            a, b = scans.get(req.scan_a), scans.get(req.scan_b)
            if a is None or b is None:
                return await refuse("scan row missing")
            if (a.subject, a.server, a.reconciliation_id) != (k.subject, k.server, req.reconciliation_id):
                return await refuse("scans belong to another view or reconciliation")
            verdict = judge_pair(a, b)
            if not verdict.match or verdict.status is None:
                return await refuse(verdict.reason)
            assert a.first_request_at and b.completed_at and a.uri_set_digest and a.descriptor_set_digest \
                and a.template_set_digest
            await cur.execute(
                "SELECT max(measured_at) AS newest, count(*) AS n FROM resource_catalogs WHERE subject=%s"
                " AND server=%s",
                (k.subject, k.server),
            )
            newest = await cur.fetchone()
            assert newest is not None
            if newest["newest"] is not None and newest["newest"] > b.completed_at:
                return await refuse("a newer catalog of this view exists")
            initial = newest["n"] == 0
            await cur.execute(
                """
                INSERT INTO resource_catalogs (subject, server, reconciliation_id, scan_a, scan_b, status,
                    status_reason, session_generation, snapshot_id, window_started_at, measured_at,
                    staleness_bound_seconds, next_review_at, uri_set_digest, descriptor_set_digest,
                    template_set_digest, resource_count, template_count, initial, rollout_mode)
                VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)
                RETURNING catalog_id
                """,
                (k.subject, k.server, req.reconciliation_id, a.scan_id, b.scan_id, verdict.status.value,
                 verdict.reason, b.session_generation, verdict.snapshot_id, a.first_request_at,
                 b.completed_at, req.staleness_bound_seconds, req.next_review_at, b.uri_set_digest,
                 b.descriptor_set_digest, b.template_set_digest, b.resource_count, b.template_count, initial,
                 req.rollout_mode.value),
            )
            created = await cur.fetchone()
            assert created is not None
            cid = created["catalog_id"]
            view = {"cid": cid, "subject": k.subject, "server": k.server, "scan": b.scan_id}
            await cur.execute(
                """
                WITH cur AS (SELECT ident AS uri, descriptor_digest FROM discovery_scan_items
                             WHERE scan_id=%(scan)s AND kind='resource'),
                     known AS (SELECT uri, descriptor_digest FROM catalog_known
                               WHERE subject=%(subject)s AND server=%(server)s AND gone_at IS NULL)
                INSERT INTO catalog_changes (catalog_id, subject, server, uri, change, descriptor_digest)
                SELECT %(cid)s, %(subject)s, %(server)s, cur.uri, 'added', cur.descriptor_digest
                  FROM cur LEFT JOIN known USING (uri) WHERE known.uri IS NULL
                UNION ALL
                SELECT %(cid)s, %(subject)s, %(server)s, known.uri, 'removed', known.descriptor_digest
                  FROM known LEFT JOIN cur USING (uri) WHERE cur.uri IS NULL
                UNION ALL
                SELECT %(cid)s, %(subject)s, %(server)s, cur.uri, 'changed', cur.descriptor_digest
                  FROM cur JOIN known USING (uri) WHERE cur.descriptor_digest <> known.descriptor_digest
                """,
                view,
            )
            await cur.execute(
                """
                UPDATE catalog_known k SET gone_at = now(), gone_catalog_id = %(cid)s
                WHERE k.subject=%(subject)s AND k.server=%(server)s AND k.gone_at IS NULL
                  AND NOT EXISTS (SELECT 1 FROM discovery_scan_items i WHERE i.scan_id=%(scan)s
                                  AND i.kind='resource' AND i.ident = k.uri)
                """,
                view,
            )
            await cur.execute(
                """
                INSERT INTO catalog_known AS k (subject, server, uri, descriptor, descriptor_digest,
                    first_catalog_id, last_catalog_id)
                SELECT %(subject)s, %(server)s, ident, descriptor, descriptor_digest, %(cid)s, %(cid)s
                  FROM discovery_scan_items WHERE scan_id=%(scan)s AND kind='resource'
                ON CONFLICT (subject, server, uri) DO UPDATE SET descriptor = EXCLUDED.descriptor,
                    descriptor_digest = EXCLUDED.descriptor_digest,
                    last_catalog_id = EXCLUDED.last_catalog_id,
                    gone_at = NULL, gone_catalog_id = NULL
                """,
                view,
            )
            await cur.execute(
                """
                UPDATE resource_catalogs SET
                    added = (SELECT count(*) FROM catalog_changes WHERE catalog_id=%(cid)s
                        AND change='added'),
                    removed = (SELECT count(*) FROM catalog_changes WHERE catalog_id=%(cid)s
                        AND change='removed'),
                    changed = (SELECT count(*) FROM catalog_changes WHERE catalog_id=%(cid)s
                        AND change='changed')
                WHERE catalog_id=%(cid)s RETURNING *
                """,
                view,
            )
            final = await cur.fetchone()
            assert final is not None
            await self._flag_ambiguous_pairs(cur, k, cid, b.scan_id)
            # Descriptors of older scans are no longer needed: the known set holds the catalog.
            await cur.execute(
                """
                DELETE FROM discovery_scan_items WHERE scan_id IN (
                    SELECT scan_id FROM discovery_scans WHERE subject=%(subject)s AND server=%(server)s
                      AND scan_id NOT IN (%(a)s, %(scan)s))
                """,
                {**view, "a": a.scan_id},
            )
            return PublishOutcome(published=True, catalog=_catalog(final), reason=verdict.reason)

    @staticmethod
    async def _flag_ambiguous_pairs(cur: Any, k: CatalogKey, catalog_id: int, scan_id: str) -> None:
        """Listed pairs that normalize alike, each flagged once per view (inside ``publish``'s
        transaction): a row in ``ambiguous_uri_pairs`` and, only when new, one audit row."""
        await cur.execute("SELECT ident FROM discovery_scan_items WHERE scan_id=%s AND kind='resource'"
                          " ORDER BY ident",
                          (scan_id,))
        pairs = sorted({tuple(sorted(p))
                        for p in ambiguous_pairs([r["ident"] for r in await cur.fetchall()])})
        for uri_a, uri_b in pairs:
            await cur.execute(
                """
                INSERT INTO ambiguous_uri_pairs (subject, server, uri_a, uri_b, uri_normalized,
                    first_catalog_id, first_scan_id)
                VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING uri_a
                """,
                (k.subject, k.server, uri_a, uri_b, normalize_uri(uri_a), catalog_id, scan_id),
            )
            if await cur.fetchone() is None:
                continue  # flagged by an earlier catalog of this view
            await cur.execute(
                "INSERT INTO audit (kind, subject, server, uri, detail)"
                " VALUES ('AMBIGUOUS_URI_LISTED', %s, %s, %s, %s)",
                (k.subject, k.server, uri_a, json.dumps({"uri_a": uri_a, "uri_b": uri_b, "scan_id": scan_id,
                                                         "catalog_id": catalog_id})),
            )

    async def ambiguous_pairs(self, subject: str, server: str) -> list[tuple[str, str]]:
        """The listed ambiguous pairs flagged for the view, (uri_a, uri_b) with uri_a < uri_b."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT uri_a, uri_b FROM ambiguous_uri_pairs WHERE subject=%s AND server=%s"
                " ORDER BY uri_a, uri_b",
                (subject, server),
            )
            return [(r[0], r[1]) for r in await cur.fetchall()]

    async def latest_catalog(self, subject: str, server: str) -> CatalogSnapshot | None:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT * FROM resource_catalogs WHERE subject=%s AND server=%s"
                " ORDER BY catalog_id DESC LIMIT 1",
                (subject, server),
            )
            row = await cur.fetchone()
        return None if row is None else _catalog(row)

    async def catalogs_for(self, subject: str, server: str) -> list[CatalogSnapshot]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT * FROM resource_catalogs WHERE subject=%s AND server=%s"
                              " ORDER BY catalog_id",
                              (subject, server))
            return [_catalog(r) for r in await cur.fetchall()]

    async def known_uris(self, subject: str, server: str) -> list[str]:
        """The URIs the latest catalog of the view lists, exact strings, sorted."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT uri FROM catalog_known WHERE subject=%s AND server=%s AND gone_at IS NULL"
                " ORDER BY uri",
                (subject, server),
            )
            return [r[0] for r in await cur.fetchall()]

    async def subscribed_since(self, subject: str, server: str, since: datetime) -> set[str]:
        """Workflow ids of the view's subscriptions whose fence row was created after ``since``."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT workflow_id FROM subscriptions WHERE subject=%s AND server=%s AND created_at > %s",
                (subject, server, since),
            )
            return {r[0] for r in await cur.fetchall()}

    async def changes(self, subject: str, server: str, *, catalog_id: int | None = None,
                      change: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                """
                SELECT change_id, catalog_id, uri, change, descriptor_digest, created_at FROM catalog_changes
                WHERE subject=%s AND server=%s AND (%s::bigint IS NULL OR catalog_id=%s)
                  AND (%s::text IS NULL OR change=%s)
                ORDER BY change_id LIMIT %s
                """,
                (subject, server, catalog_id, catalog_id, change, change, limit),
            )
            return list(await cur.fetchall())

    # --- completeness gate ------------------------------------------------------------

    async def consume_for_completeness(self, subject: str, server: str, task: str, *,
                                       now: datetime | None = None) -> CompletenessDecision:
        """Grant the latest catalog to a completeness task only if it is SNAPSHOT_PROVEN and fresh."""
        now = now or datetime.now(UTC)
        async with self.pool.connection() as conn, conn.transaction():
            # One snapshot of catalog + known set even while a publish commits beside us.
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT * FROM resource_catalogs WHERE subject=%s AND server=%s"
                " ORDER BY catalog_id DESC LIMIT 1",
                (subject, server),
            )
            row = await cur.fetchone()
            catalog = None if row is None else _catalog(row)
            reason = ""
            if catalog is None:
                reason = "no reconciled catalog yet"
            elif catalog.status != SnapshotStatus.SNAPSHOT_PROVEN:
                reason = f"catalog #{catalog.catalog_id} is {catalog.status.value}: {catalog.status_reason}"
            elif now > catalog.window_started_at + timedelta(seconds=catalog.staleness_bound_seconds):
                reason = (f"catalog #{catalog.catalog_id} is past its staleness bound of "
                          f"{catalog.staleness_bound_seconds:.0f} s (is the CatalogWorkflow running?)")
            granted = not reason
            await cur.execute(
                """
                INSERT INTO completeness_consumptions (task, subject, server, catalog_id, catalog_status,
                    granted, reason) VALUES (%s,%s,%s,%s,%s,%s,%s) RETURNING consumption_id
                """,
                (task[:200], subject, server, catalog.catalog_id if catalog else None,
                 catalog.status.value if catalog else None, granted, reason),
            )
            rid = await cur.fetchone()
            assert rid is not None
            if not granted:
                await cur.execute("UPDATE catalog_counters SET value = value + 1"
                                  " WHERE name='completeness_refused'")
                return CompletenessDecision(False, reason, catalog, consumption_id=rid["consumption_id"])
            await cur.execute(
                "SELECT uri FROM catalog_known WHERE subject=%s AND server=%s AND gone_at IS NULL"
                " ORDER BY uri",
                (subject, server),
            )
            uris = tuple(r["uri"] for r in await cur.fetchall())
            return CompletenessDecision(True, "SNAPSHOT_PROVEN", catalog, uris, rid["consumption_id"])

    async def release_gates(self) -> dict[str, int]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT * FROM catalog_release_gates")
            row = await cur.fetchone()
        assert row is not None
        return {k: int(v or 0) for k, v in row.items()}

    # --- staged rollout ------------------------------------------------------------------

    async def rollout(self, server: str) -> RolloutPolicy:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT * FROM rollout_policies WHERE server=%s", (server,))
            row = await cur.fetchone()
        if row is None:
            return RolloutPolicy(server=server)
        return RolloutPolicy(server=server, mode=RolloutMode(row["mode"]), percent=row["percent"])

    async def set_rollout(self, policy: RolloutPolicy) -> RolloutPolicy:
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(
                """
                INSERT INTO rollout_policies (server, mode, percent) VALUES (%s, %s, %s)
                ON CONFLICT (server) DO UPDATE
                    SET mode=EXCLUDED.mode, percent=EXCLUDED.percent, updated_at=now()
                """,
                (policy.server, policy.mode.value, policy.percent),
            )
            await conn.execute("INSERT INTO rollout_history (server, mode, percent) VALUES (%s, %s, %s)",
                               (policy.server, policy.mode.value, policy.percent))
        return policy


class CatalogLedgerActivities:
    """Main-queue catalog activities. ``temporal`` signals subscriptions and starts auto-subscriptions."""

    def __init__(self, catalog: CatalogLedger, ledger: Ledger, temporal: Client, task_queue: str) -> None:
        self.catalog = catalog
        self.ledger = ledger
        self.temporal = temporal
        self.task_queue = task_queue

    def all(self) -> list[Callable[..., Any]]:
        return [self.rollout, self.publish, self.notify_subscriptions, self.auto_subscribe]

    @activity.defn(name=CatalogAct.ROLLOUT)
    async def rollout(self, key: CatalogKey) -> RolloutPolicy:
        return await self.catalog.rollout(key.server)

    @activity.defn(name=CatalogAct.PUBLISH)
    async def publish(self, req: PublishRequest) -> PublishOutcome:
        return await self.catalog.publish(req)

    @activity.defn(name=CatalogAct.NOTIFY)
    async def notify_subscriptions(self, req: NotifyRequest) -> NotifyResult:
        c = req.catalog
        subs = [(wf, uri) for wf, uri, state in await self.ledger.fence.subscriptions_for(c.subject, c.server)
                if state not in TERMINAL_STATES]
        # A subscription younger than the measurement: the catalog's word on it is stale
        # (it may predate the resource itself). The next catalog speaks for it.
        young = await self.catalog.subscribed_since(c.subject, c.server, c.window_started_at)
        listed, variants_of = await self._listed_and_variants(c.subject, c.server, [uri for _, uri in subs])
        signalled = unlisted = held = missing = too_new = 0
        for workflow_id, uri in subs:
            if workflow_id in young:
                too_new += 1
                continue
            if not refresh_enabled(req.rollout, c.subject, c.server, uri):
                held += 1
                continue
            obs = CatalogObservation(uri=uri, listed=uri in listed, scan_id=c.scan_b,
                                     snapshot_status=c.status.value, session_generation=c.session_generation,
                                     measured_at=c.measured_at, variants=variants_of(uri))
            try:
                await self.temporal.get_workflow_handle(workflow_id).signal(SIGNAL_CATALOG_RECONCILED, obs)
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
                missing += 1
                continue
            signalled += 1
            unlisted += uri not in listed
        return NotifyResult(signalled=signalled, unlisted=unlisted, held_by_rollout=held, no_workflow=missing,
                            too_new=too_new)

    async def _listed_and_variants(self, subject: str, server: str,
                                   uris: list[str]) -> tuple[set[str], Callable[[str], list[str]]]:
        """Which of ``uris`` the view lists, and for each the listed URIs that normalize like it but
        differ. The listing is normalized once (linear; ~1 s per 10^5 URIs), and only when some
        subscription exists."""
        if not uris:
            return set(), lambda _uri: []
        listing = await self.catalog.known_uris(subject, server)
        wanted = {normalize_uri(uri) for uri in uris}
        by_normalized: dict[str, list[str]] = {}
        for listed_uri in listing:
            n = normalize_uri(listed_uri)
            if n in wanted:
                by_normalized.setdefault(n, []).append(listed_uri)

        def variants_of(uri: str) -> list[str]:
            return [v for v in by_normalized.get(normalize_uri(uri), ()) if v != uri]

        return set(listing) & set(uris), variants_of

    @activity.defn(name=CatalogAct.AUTO_SUBSCRIBE)
    async def auto_subscribe(self, req: AutoSubscribeRequest) -> int:

        c = req.catalog
        started = 0
        for change in await self.catalog.changes(c.subject, c.server, catalog_id=c.catalog_id, change="added",
                                                 limit=100_000):
            uri = change["uri"]
            if not any(uri.startswith(p) for p in req.prefixes):
                continue
            if not refresh_enabled(req.rollout, c.subject, c.server, uri):
                continue
            key = SubscriptionKey(subject=c.subject, server=c.server, uri=uri)
            await start_subscription(self.temporal, key, task_queue=self.task_queue,
                                     workflow_id=await self.ledger.fence.workflow_id_of(key))
            started += 1
        return started
