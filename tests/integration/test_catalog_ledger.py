"""The catalog ledger on real PostgreSQL: publish refuses what does not reconcile, the known-set
diff, the completeness gate and the release-gate view (recomputed from the rows, not trusted)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.catalog import CatalogLedger, ScanItem
from mcpsync.worker.api.completeness import CompletenessRefused, require_complete_catalog
from mcpsync.workflows.catalog_rules import (
    SNAPSHOT_EXTENSION,
    PublishRequest,
    ScanAccumulator,
    descriptor_digest,
    set_digest,
)
from mcpsync.workflows.records.catalog import CatalogKey, ResourceDiscoveryScanV1, RolloutMode, SnapshotStatus

T0 = datetime.now(UTC) - timedelta(seconds=30)


@pytest.fixture
def catalogs(ledger: Ledger) -> CatalogLedger:
    return CatalogLedger(ledger.pool)


def view() -> CatalogKey:
    return CatalogKey(subject=f"s-{uuid.uuid4().hex[:6]}", server="ledger-fx")


async def scan(cl: CatalogLedger, key: CatalogKey, rid: str, label: str, uris: list[str], *, start: datetime,
               observed: int = 0, snapshot: str | None = None,
               descriptions: dict[str, str] | None = None) -> str:
    meta: dict[str, Any] | None = None
    if snapshot is not None:
        meta = {SNAPSHOT_EXTENSION: {"id": snapshot, "setDigest": set_digest(uris), "count": len(uris)}}
    acc = ScanAccumulator(edition="2025-11-25", page_cap=100, snapshot_negotiated=snapshot is not None,
                          cursor_key=b"k" * 32)
    items = [{"uri": u, "name": "n", **({"description": descriptions[u]} if descriptions and u in descriptions
                                         else {})} for u in uris]
    acc.page("resources", None, items, None, meta)
    tmeta = None if snapshot is None else {SNAPSHOT_EXTENSION: {"id": snapshot, "setDigest": set_digest([]),
                                                                "count": 0}}
    acc.page("templates", None, [], None, tmeta)
    digests = acc.digests()
    assert digests is not None
    record = ResourceDiscoveryScanV1(
        scan_id=f"{rid}-{label}-{uuid.uuid4().hex[:4]}", reconciliation_id=rid,
        label=label,  # type: ignore[arg-type]
        subject=key.subject, server=key.server, session_generation=1, status=acc.final_status(),
        first_request_at=start, completed_at=start + timedelta(milliseconds=100), page_count=acc.pages,
        resource_count=len(uris), uri_set_digest=digests[0], descriptor_set_digest=digests[1],
        template_set_digest=digests[2], list_changed_before=0, list_changed_after=observed,
        notifications_observed=observed, snapshot=acc.snapshot_evidence(),
    )
    await cl.record_scan(record, [ScanItem("resource", u, d, descriptor_digest(d))
                                  for u, d in acc.descriptors["resources"].items()])
    return record.scan_id


async def publish(cl: CatalogLedger, key: CatalogKey, uris: list[str], *, at: datetime,
                  b_uris: list[str] | None = None, observed: int = 0, snapshot: str | None = None,
                  same_scan: bool = False, descriptions: dict[str, str] | None = None) -> Any:
    rid = uuid.uuid4().hex
    a = await scan(cl, key, rid, "A", uris, start=at, snapshot=snapshot, descriptions=descriptions)
    b = a if same_scan else await scan(cl, key, rid, "B", b_uris if b_uris is not None else uris,
                                       start=at + timedelta(seconds=1), observed=observed, snapshot=snapshot,
                                       descriptions=descriptions)
    return await cl.publish(PublishRequest(key=key, reconciliation_id=rid, scan_a=a, scan_b=b,
                                           next_review_at=at + timedelta(seconds=60),
                                           staleness_bound_seconds=3600, rollout_mode=RolloutMode.ALL))


async def test_publish_refuses_anything_but_two_matching_scans(catalogs: CatalogLedger) -> None:
    key = view()
    before = await catalogs.release_gates()
    refused = [
        await publish(catalogs, key, ["a://1"], at=T0, same_scan=True),  # one scan is not a catalog
        await publish(catalogs, key, ["a://1"], at=T0, b_uris=["a://1", "a://2"]),  # digests differ
        await publish(catalogs, key, ["a://1"], at=T0, observed=1),  # list_changed during B
    ]
    assert [r.published for r in refused] == [False, False, False]
    assert "not an A/B pair" in refused[0].reason and "digests differ" in refused[1].reason
    assert await catalogs.catalogs_for(key.subject, key.server) == []
    gates = await catalogs.release_gates()
    assert gates["catalog_publish_refused"] == before["catalog_publish_refused"] + 3
    assert gates["unreconciled_catalogs_accepted"] == 0


async def test_known_set_diff_and_idempotent_publish(catalogs: CatalogLedger) -> None:
    key, other = view(), view()
    first = await publish(catalogs, key, ["a://1", "a://2", "a://3"], at=T0)
    assert first.published and first.catalog.initial and first.catalog.added == 3
    second = await publish(catalogs, key, ["a://2", "a://3", "a://4"], at=T0 + timedelta(seconds=5),
                           descriptions={"a://3": "renamed"})
    c = second.catalog
    assert (c.added, c.removed, c.changed, c.initial) == (1, 1, 1, False)
    assert await catalogs.known_uris(key.subject, key.server) == ["a://2", "a://3", "a://4"]
    changes = {(x["uri"], x["change"]) for x in await catalogs.changes(key.subject, key.server,
                                                                       catalog_id=c.catalog_id)}
    assert changes == {("a://4", "added"), ("a://1", "removed"), ("a://3", "changed")}
    # The same reconciliation published again (an activity retry) answers the same row.
    again = await catalogs.publish(PublishRequest(key=key, reconciliation_id=c.reconciliation_id,
                                                  scan_a=c.scan_a, scan_b=c.scan_b,
                                                  next_review_at=c.next_review_at, staleness_bound_seconds=1,
                                                  rollout_mode=RolloutMode.ALL))
    assert again.published and again.catalog == c
    # An older measurement never overwrites a newer catalog.
    stale = await publish(catalogs, key, ["a://1"], at=T0 - timedelta(seconds=10))
    assert not stale.published and "newer catalog" in stale.reason
    # Another subject's view is separate.
    assert await catalogs.known_uris(other.subject, other.server) == []


async def test_completeness_gate_grants_only_fresh_proven_catalogs(catalogs: CatalogLedger) -> None:
    key = view()
    uris = ["a://1", "a://2"]
    unproven = await publish(catalogs, key, uris, at=T0)
    assert unproven.catalog.status == SnapshotStatus.SNAPSHOT_UNPROVEN
    with pytest.raises(CompletenessRefused, match="SNAPSHOT_UNPROVEN"):
        await require_complete_catalog(catalogs, key.subject, key.server, task="t1")
    proven = await publish(catalogs, key, uris, at=T0 + timedelta(seconds=5), snapshot="snap-1")
    assert proven.catalog.status == SnapshotStatus.SNAPSHOT_PROVEN and proven.catalog.snapshot_id == "snap-1"
    grant = await require_complete_catalog(catalogs, key.subject, key.server, task="t2")
    assert grant.uris == tuple(uris)
    with pytest.raises(CompletenessRefused, match="staleness bound"):
        await require_complete_catalog(catalogs, key.subject, key.server, task="t3",
                                       now=T0 + timedelta(hours=3))
    assert (await catalogs.release_gates())["completeness_consumed_unproven"] == 0


async def test_release_gate_is_recomputed_from_the_scans(catalogs: CatalogLedger) -> None:
    key = view()
    out = await publish(catalogs, key, ["a://1"], at=T0)
    assert out.published
    async with catalogs.pool.connection() as conn:
        # Tamper inside a transaction that is rolled back: the view must notice.
        async with conn.transaction(force_rollback=True):
            await conn.execute("UPDATE discovery_scans SET notifications_observed = 1 WHERE scan_id = %s",
                               (out.catalog.scan_b,))
            cur = await conn.execute("SELECT unreconciled_catalogs_accepted FROM catalog_release_gates")
            row = await cur.fetchone()
            assert row is not None and row[0] >= 1
    assert (await catalogs.release_gates())["unreconciled_catalogs_accepted"] == 0
