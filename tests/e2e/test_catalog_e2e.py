"""Catalog reconciliation on the real stack: Temporal dev server, PostgreSQL, the fixture MCP server.

Every scenario mutates the fixture through its control plane (between page requests where
it matters: ``mutate_after_page``) and then checks three things against the fixture's own
record of every catalog generation:
- every published catalog equals the subject's listing at ONE generation (no catalog
  combines pages from incompatible generations), and the newest equals the final listing;
- no catalog exists without two matching scans (``unreconciled_catalogs_accepted`` = 0);
- the completeness gate grants nothing but SNAPSHOT_PROVEN (``completeness_consumed_unproven`` = 0).
Barriers are the workflow's query/update and the fixture's stats, never sleeps.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.catalog import CatalogLedger
from mcpsync.activities.starters import start_catalog
from mcpsync.activities.workflow_updates import execute_update
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.api.completeness import CompletenessRefused, require_complete_catalog
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.catalog_rules import CatalogView, set_digest
from mcpsync.workflows.names import QUERY_CATALOG, QUERY_SCANS, UPDATE_RECONCILE
from mcpsync.workflows.records.catalog import (
    CatalogKey,
    CatalogPolicy,
    CatalogSnapshot,
    ResourceDiscoveryScanV1,
    ScanStatus,
    SnapshotStatus,
)
from tests import cli_process
from tests.conftest import eventually, running_services, unique

pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")

FAST = CatalogPolicy(rescan_seconds=60, rescan_seconds_with_list_changed=60, session_recheck_seconds=0.2,
                     immediate_restarts=3, restart_backoff_seconds=0.2, restart_backoff_max_seconds=1.0,
                     reconcile_allowance_seconds=1.0)
TOKENS = {"alice": "tok-alice", "bob": "tok-bob"}


@dataclass
class Stack:
    fx: FixtureProcess
    server: ServerConfig
    client: Client
    catalogs: CatalogLedger
    task_queue: str
    handles: dict[str, WorkflowHandle]

    def key(self, subject: str = "alice") -> CatalogKey:
        return CatalogKey(subject=subject, server=self.server.name)

    def handle(self, subject: str = "alice") -> WorkflowHandle:
        """The workflow by id only: follows continue-as-new."""
        return self.client.get_workflow_handle(self.key(subject).workflow_id)

    async def view(self, subject: str = "alice") -> CatalogView:
        return await self.handle(subject).query(QUERY_CATALOG,
                                                result_type=CatalogView)  # type: ignore[no-any-return]

    async def scans(self, subject: str = "alice") -> list[ResourceDiscoveryScanV1]:
        return await self.handle(subject).query(QUERY_SCANS,
                                                result_type=list[ResourceDiscoveryScanV1])  # type: ignore[no-any-return]

    async def reconcile(self, subject: str = "alice", timeout: float = 20.0) -> CatalogSnapshot:
        """Barrier: the first catalog published from a reconciliation started after this call."""
        out = await asyncio.wait_for(
            execute_update(self.handle(subject), UPDATE_RECONCILE, ["test"], result_type=CatalogSnapshot),
            timeout)
        assert out is not None
        return out  # type: ignore[no-any-return]

    async def published(self, n: int, subject: str = "alice", timeout: float = 20.0) -> CatalogView:
        """Barrier: at least ``n`` catalogs published (counting from the workflow's start)."""
        async def check() -> CatalogView | None:
            v = await self.view(subject)
            return v if v.catalogs_published >= n else None
        return await eventually(check, timeout=timeout, interval=0.05,
                                what=f"{n} catalogs of {subject}")  # type: ignore[no-any-return]

    async def listing(self, subject: str = "alice") -> list[str]:
        """The oracle: what the fixture lists for ``subject`` right now."""
        committed = (await self.fx.resources())["resources"]
        return sorted(r["uri"] for r in committed
                      if r["exists"] and (r["visible_to"] is None or subject in r["visible_to"]))

    async def check_invariants(self, subject: str = "alice") -> CatalogSnapshot:
        """Every published catalog is one real generation; the newest is the current listing; gates at 0."""
        history = {h["set_digest"] for h in await self.fx.catalog_history(subject)}
        catalogs = await self.catalogs.catalogs_for(subject, self.server.name)
        assert catalogs, "no catalog published"
        for c in catalogs:
            assert c.uri_set_digest in history, \
                f"catalog #{c.catalog_id} matches no generation of the fixture"
            assert c.scan_a != c.scan_b
        latest = catalogs[-1]
        current = await self.listing(subject)
        assert latest.uri_set_digest == set_digest(current)
        assert await self.catalogs.known_uris(subject, self.server.name) == current
        gates = await self.catalogs.release_gates()
        assert gates["unreconciled_catalogs_accepted"] == 0
        assert gates["completeness_consumed_unproven"] == 0
        return latest


@asynccontextmanager
async def catalog_stack(client: Client, ledger: Ledger, tmp_path: Path, *, edition: str = "2025-11-25",
                        subjects: tuple[str, ...] = ("alice",), policy: CatalogPolicy = FAST,
                        resources: int = 5, page_size: int = 2, start: bool = True,
                        **fixture_opts: Any) -> AsyncIterator[Stack]:
    fx = await FixtureProcess.start_http(tmp_path, seed="none", page_size=page_size, tokens=TOKENS,
                                         **fixture_opts)
    try:
        for i in range(resources):
            await fx.create(f"demo://cat/{i:02d}", text=f"doc {i}", mime_type="text/plain")
        token_env = {}
        for subject in subjects:
            var = f"MCPSYNC_TEST_TOKEN_{uuid.uuid4().hex[:8].upper()}"
            os.environ[var] = TOKENS[subject]
            token_env[subject] = var
        server = ServerConfig(name=unique("cat"), transport="http", url=fx.mcp_url,
                              edition=edition,  # type: ignore[arg-type]
                              subjects=list(subjects), token_env=token_env)
        async with running_services(client, ledger, [server]) as cfg:
            stack = Stack(fx, server, client, CatalogLedger(ledger.pool), cfg.temporal.task_queue, {})
            if start:
                for subject in subjects:
                    stack.handles[subject] = await start_catalog(client, stack.key(subject),
                                                                 task_queue=cfg.temporal.task_queue,
                                                                 policy=policy)
            try:
                yield stack
            finally:
                for subject in stack.handles:
                    await stack.handle(subject).terminate("test over")
    finally:
        await fx.stop()


async def test_additions_beyond_the_first_page_boundary(temporal_client: Client, ledger: Ledger,
                                                        tmp_path: Path) -> None:
    policy = FAST.model_copy(update={"auto_subscribe_prefixes": ("demo://cat/5",)})
    async with catalog_stack(temporal_client, ledger, tmp_path, policy=policy) as st:
        view = await st.published(1)
        first = view.last_catalog
        assert first is not None and first.status == SnapshotStatus.SNAPSHOT_UNPROVEN
        assert first.resource_count == 5 and first.initial and first.added == 5
        # Two URIs that sort after page 1: only a full scan finds them.
        await st.fx.create("demo://cat/50", text="new")
        await st.fx.create("demo://cat/51", text="new")
        await eventually(lambda: st.catalogs.known_uris("alice", st.server.name), what="catalog")

        async def grown() -> CatalogSnapshot | None:
            c = await st.catalogs.latest_catalog("alice", st.server.name)
            return c if c is not None and c.resource_count == 7 else None

        latest = await eventually(grown, timeout=20, what="7 URIs in the catalog")
        assert latest.added >= 1 and not latest.initial
        changes = await st.catalogs.changes("alice", st.server.name, change="added")
        assert {"demo://cat/50", "demo://cat/51"} <= {c["uri"] for c in changes}
        await st.check_invariants()
        view = await st.view()
        assert view.list_changed_signals >= 1  # the notifications triggered it, not a timer
        scans = await st.scans()
        assert all(s.record == "resourceDiscoveryScan.v1" for s in scans)
        assert scans[-1].page_count == 4 + 1  # 7 URIs in pages of 2, plus one template page
        db_scan = await st.catalogs.get_scan(scans[-1].scan_id)
        assert db_scan is not None and db_scan.page_cursor_digests == scans[-1].page_cursor_digests
        assert db_scan.status == ScanStatus.COMPLETE
        # New URIs under the policy's prefix were subscribed; the initial five were not.
        from mcpsync.workflows.records.subscription import SubscriptionKey

        async def auto() -> CatalogView | None:
            v = await st.view()
            return v if v.auto_subscribed == 2 else None

        await eventually(auto, timeout=10, what="two auto-subscriptions")
        for uri in ("demo://cat/50", "demo://cat/51"):
            sub = st.client.get_workflow_handle(SubscriptionKey(subject="alice", server=st.server.name,
                                                                uri=uri).workflow_id)
            assert (await sub.describe()).workflow_type == "ResourceSubscriptionWorkflow"
            await sub.terminate("test over")
        assert await ledger.fence.find_subscription("alice", st.server.name, "demo://cat/00") is None


async def _restarted_by(st: Stack, text: str, subject: str = "alice") -> list[str]:
    async def check() -> list[str] | None:
        reasons = (await st.view(subject)).restart_reasons
        return reasons if any(text in r for r in reasons) else None
    return await eventually(check, timeout=15, interval=0.05,
                            what=f"a restart because of {text!r}")  # type: ignore[no-any-return]


async def test_removal_of_the_cursor_boundary_item_mid_scan(temporal_client: Client, ledger: Ledger,
                                                          tmp_path: Path) -> None:
    async with catalog_stack(temporal_client, ledger, tmp_path) as st:
        await st.published(1)
        # Page 1 is [00, 01]; deleting 01 after it shifts 02 onto page 1 of the new listing, so
        # page 2 (offset 2) skips it. The notification is dropped: only A != B can tell.
        await st.fx.faults(drop_list_changed=1)
        await st.fx.mutate_after_page(1, "delete", "demo://cat/01")
        latest = await st.reconcile()
        assert await _restarted_by(st, "scan digests differ")
        assert latest.resource_count == 4 and latest.removed == 1
        torn = [s for s in await st.catalogs.scans_for("alice", st.server.name, 50)
                if s.status == ScanStatus.COMPLETE and s.resource_count == 4
                and s.uri_set_digest == set_digest(["demo://cat/00", "demo://cat/01", "demo://cat/03",
                                                    "demo://cat/04"])]
        assert torn, "the torn scan (01 still there, 02 missed) was recorded, never published"
        await st.check_invariants()


async def test_add_between_page_requests(temporal_client: Client, ledger: Ledger, tmp_path: Path) -> None:
    async with catalog_stack(temporal_client, ledger, tmp_path) as st:
        await st.published(1)
        # 00a sorts between 00 and 01: 01 is pushed onto page 2 and listed twice.
        await st.fx.faults(drop_list_changed=1)
        await st.fx.mutate_after_page(1, "put", "demo://cat/00a", text="inserted")
        latest = await st.reconcile()
        assert latest.resource_count == 6 and latest.added == 1
        assert await _restarted_by(st, "INCONSISTENT")
        bad = [s for s in await st.catalogs.scans_for("alice", st.server.name, 50)
               if s.status == ScanStatus.INCONSISTENT]
        assert bad and "duplicate: demo://cat/01" in bad[0].problems[0]
        await st.check_invariants()


async def test_visibility_change_mid_traversal_never_leaks(temporal_client: Client, ledger: Ledger,
                                                           tmp_path: Path) -> None:
    async with catalog_stack(temporal_client, ledger, tmp_path, subjects=("alice", "bob"), start=False) as st:
        await st.fx.create("demo://cat/02-bob-only", text="secret", visible_to=["bob"])
        for subject in ("alice", "bob"):
            st.handles[subject] = await start_catalog(temporal_client, st.key(subject),
                                                      task_queue=st.task_queue, policy=FAST)
        await st.published(1, "alice")
        await st.published(1, "bob")
        # While alice's scan is past page 1, 03 becomes bob's only.
        await st.fx.mutate_after_page(1, "visibility", "demo://cat/03", visible_to=["bob"], subject="alice")
        latest = await st.reconcile("alice")
        alice = await st.check_invariants("alice")
        assert alice.catalog_id == latest.catalog_id or alice.resource_count == 4
        assert "demo://cat/03" not in await st.catalogs.known_uris("alice", st.server.name)
        assert "demo://cat/03" in await st.catalogs.known_uris("bob", st.server.name)
        await st.check_invariants("bob")
        alice_ever = {c["uri"] for c in await st.catalogs.changes("alice", st.server.name)}
        assert "demo://cat/02-bob-only" not in alice_ever
        for scan in await st.catalogs.scans_for("alice", st.server.name, 50):
            assert scan.subject == "alice"
            assert "demo://cat/02-bob-only" not in await st.catalogs.scan_items(scan.scan_id)


@pytest.mark.parametrize("fault, status", [({"loop_cursor": True}, ScanStatus.CURSOR_LOOP),
                                           ({"endless_cursor": True}, ScanStatus.PAGE_CAP)])
async def test_looping_or_endless_cursors_never_publish(temporal_client: Client, ledger: Ledger,
                                                        tmp_path: Path,
                                                        fault: dict[str, bool], status: ScanStatus) -> None:
    async with catalog_stack(temporal_client, ledger, tmp_path, resources=7, start=False) as st:
        await st.fx.faults(**fault)
        st.handles["alice"] = await start_catalog(temporal_client, st.key(), task_queue=st.task_queue,
                                                  policy=FAST.model_copy(update={"page_cap": 12}))

        async def failed_scans() -> list[ResourceDiscoveryScanV1] | None:
            scans = [s for s in await st.catalogs.scans_for("alice", st.server.name, 50)
                     if s.status == status]
            return scans if len(scans) >= 3 else None

        await eventually(failed_scans, timeout=15, what=f"three {status.value} scans")
        assert await st.catalogs.catalogs_for("alice", st.server.name) == []
        view = await st.view()
        assert view.catalogs_published == 0 and view.last_catalog is None
        await st.fx.faults(reset=True)
        await st.published(1)
        await st.check_invariants()


async def test_invalid_cursor_restarts_the_scan(temporal_client: Client, ledger: Ledger,
                                                tmp_path: Path) -> None:
    async with catalog_stack(temporal_client, ledger, tmp_path) as st:
        await st.published(1)
        await st.fx.faults(invalidate_stale_cursors=True)
        await st.fx.mutate_after_page(1, "put", "demo://cat/09", text="late")
        await st.reconcile()
        assert await _restarted_by(st, "INVALID_CURSOR")
        invalid = [s for s in await st.catalogs.scans_for("alice", st.server.name, 50)
                   if s.status == ScanStatus.INVALID_CURSOR]
        assert invalid and invalid[0].uri_set_digest is None  # a partial scan has no set digest at all
        latest = await st.check_invariants()
        assert latest.resource_count == 6


@pytest.mark.parametrize("label, edition", [("A", "2025-11-25"), ("B", "2026-07-28")])
async def test_list_changed_during_a_scan_restarts_the_reconciliation(
        temporal_client: Client, ledger: Ledger, tmp_path: Path, label: str, edition: str) -> None:
    async with catalog_stack(temporal_client, ledger, tmp_path, edition=edition) as st:
        first = (await st.published(1)).last_catalog
        assert first is not None
        # A bare list_changed (nothing changed) after the first page of scan A, or of scan B
        # (5 URIs in pages of 2: 3 resources/list pages per scan). Slow pages let it land mid-scan.
        await st.fx.faults(list_delay_ms=40)
        await st.fx.mutate_after_page(1 if label == "A" else 4, "list_changed")
        before = (await st.view()).restarts_total
        latest = await st.reconcile()
        reasons = (await st.view()).restart_reasons
        assert (await st.view()).restarts_total > before
        assert f"list_changed during scan {label}" in reasons
        noisy = [s for s in await st.catalogs.scans_for("alice", st.server.name, 50)
                 if s.label == label and s.notifications_observed > 0]
        assert noisy, f"scan {label} recorded the notification it observed"
        published = await st.catalogs.catalogs_for("alice", st.server.name)
        assert noisy[0].reconciliation_id not in {c.reconciliation_id for c in published}
        for scan_id in (latest.scan_a, latest.scan_b):
            published_scan = await st.catalogs.get_scan(scan_id)
            assert published_scan is not None and published_scan.notifications_observed == 0
        assert latest.uri_set_digest == first.uri_set_digest
        await st.check_invariants()


async def test_lost_list_changed_is_caught_by_the_periodic_rescan(temporal_client: Client, ledger: Ledger,
                                                                  tmp_path: Path) -> None:
    policy = FAST.model_copy(update={"rescan_seconds_with_list_changed": 1.0,
                                     "reconcile_allowance_seconds": 5.0})
    async with catalog_stack(temporal_client, ledger, tmp_path, policy=policy) as st:
        first = (await st.published(1)).last_catalog
        assert first is not None and (await st.view()).list_changed_capable
        assert first.staleness_bound_seconds >= 5.0
        await st.fx.faults(drop_list_changed=1)
        await st.fx.create("demo://cat/07", text="unannounced")
        await st.fx.wait_stats(lambda s: s["list_changed_dropped"] == 1)
        view = await st.published(2, timeout=15)
        assert view.last_catalog is not None and view.last_catalog.resource_count == 6
        assert view.published_reason == "periodic" and view.list_changed_signals == 0
        # The lost change shows up within the bound the first catalog published.
        assert view.last_catalog.measured_at <= first.window_started_at + timedelta(
            seconds=first.staleness_bound_seconds)
        await st.check_invariants()


async def test_server_without_list_changed_rescans_periodically(temporal_client: Client, ledger: Ledger,
                                                                tmp_path: Path) -> None:
    policy = FAST.model_copy(update={"rescan_seconds": 1.0})
    async with catalog_stack(temporal_client, ledger, tmp_path, edition="2026-07-28", policy=policy,
                             list_changed=False) as st:
        first = (await st.published(1)).last_catalog
        assert first is not None and not (await st.view()).list_changed_capable
        # The review comes after at least (1 - jitter) x interval, and within the published bound.
        assert (first.next_review_at - first.measured_at).total_seconds() >= 0.8
        assert first.next_review_at <= first.window_started_at \
            + timedelta(seconds=first.staleness_bound_seconds)
        await st.fx.create("demo://cat/08", text="silent")
        view = await st.published(2, timeout=15)
        assert view.published_reason == "periodic" and view.list_changed_signals == 0
        await eventually(lambda: st.catalogs.latest_catalog("alice", st.server.name), what="catalog")
        latest = await st.check_invariants()
        assert latest.resource_count == 6
        assert (await st.fx.stats())["list_changed_sent"] == 0


async def test_snapshot_ids_prove_the_catalog_and_forged_ids_do_not(temporal_client: Client, ledger: Ledger,
                                                                    tmp_path: Path) -> None:
    async with catalog_stack(temporal_client, ledger, tmp_path, edition="2026-07-28",
                             snapshot_ids=True) as st:
        first = (await st.published(1)).last_catalog
        assert first is not None and first.status == SnapshotStatus.SNAPSHOT_PROVEN and first.snapshot_id
        grant = await require_complete_catalog(st.catalogs, "alice", st.server.name, task="cleanup")
        assert list(grant.uris) == await st.listing() and grant.catalog.catalog_id == first.catalog_id
        # Forged: the server keeps stamping the snapshot it served first, whatever the catalog becomes.
        await st.fx.faults(snapshot_meta="forged")
        again = await st.reconcile()
        assert again.status == SnapshotStatus.SNAPSHOT_PROVEN  # still true: nothing changed yet
        await st.fx.create("demo://cat/06", text="after the forgery")

        async def grown() -> CatalogSnapshot | None:
            c = await st.catalogs.latest_catalog("alice", st.server.name)
            return c if c is not None and c.resource_count == 6 else None

        forged = await eventually(grown, timeout=20, what="the catalog with 6 URIs")
        assert forged.status == SnapshotStatus.SNAPSHOT_UNPROVEN and "forged or torn" in forged.status_reason
        with pytest.raises(CompletenessRefused, match="SNAPSHOT_UNPROVEN"):
            await require_complete_catalog(st.catalogs, "alice", st.server.name, task="cleanup")
        await st.check_invariants()


async def test_missing_or_mismatched_snapshot_ids_leave_the_catalog_unproven(
        temporal_client: Client, ledger: Ledger, tmp_path: Path) -> None:
    async with catalog_stack(temporal_client, ledger, tmp_path, snapshot_ids=True) as st:
        assert (await st.published(1)).status == SnapshotStatus.SNAPSHOT_PROVEN.value
        for mode, reason in (("missing", "carry no snapshot id"), ("mismatched", "different snapshot ids")):
            await st.fx.faults(snapshot_meta=mode)
            latest = await st.reconcile()
            assert latest.status == SnapshotStatus.SNAPSHOT_UNPROVEN and reason in latest.status_reason
            scan = await st.catalogs.get_scan(latest.scan_b)
            assert scan is not None and scan.snapshot.negotiated and not scan.snapshot.bound
        await st.fx.faults(reset=True)
        assert (await st.reconcile()).status == SnapshotStatus.SNAPSHOT_PROVEN
        await st.check_invariants()


async def test_catalog_confirms_tombstones_only_when_the_rollout_lets_it(
        temporal_client: Client, ledger: Ledger, tmp_path: Path) -> None:
    from mcpsync.activities.starters import start_subscription
    from mcpsync.workflows.names import QUERY_SUBSCRIPTION
    from mcpsync.workflows.records.catalog import RolloutMode, RolloutPolicy
    from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState
    from mcpsync.workflows.records.versioned import ResourceSubscriptionV1

    async with catalog_stack(temporal_client, ledger, tmp_path, start=False) as st:
        await st.catalogs.set_rollout(RolloutPolicy(server=st.server.name, mode=RolloutMode.SHADOW))
        key = SubscriptionKey(subject="alice", server=st.server.name, uri="demo://cat/04")
        sub = await start_subscription(temporal_client, key, task_queue=st.task_queue)

        async def state(want: SubscriptionState) -> ResourceSubscriptionV1 | None:
            rec = await sub.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
            return rec if rec.state == want else None

        await eventually(lambda: state(SubscriptionState.ACTIVE), timeout=20, what="subscription ACTIVE")

        async def fence_exists() -> bool:
            return (await ledger.load_fence(key)).exists

        await eventually(fence_exists, what="fence")
        st.handles["alice"] = await start_catalog(temporal_client, st.key(), task_queue=st.task_queue,
                                                  policy=FAST)
        await st.published(1)
        await st.fx.delete("demo://cat/04")
        await eventually(lambda: state(SubscriptionState.TOMBSTONE_PENDING), timeout=20,
                         what="TOMBSTONE_PENDING")
        shadow = await st.reconcile()
        assert shadow.rollout_mode == RolloutMode.SHADOW and shadow.resource_count == 4
        view = await st.view()
        assert view.last_notify is not None and view.last_notify.signalled == 0
        assert view.last_notify.held_by_rollout == 1
        assert await state(SubscriptionState.TOMBSTONE_PENDING), "shadow mode confirmed nothing"
        # Mode switches (rollout, then rollback, then all) never touch the fence row.
        fence = await ledger.load_fence(key)
        for mode in (RolloutMode.PERCENT, RolloutMode.SHADOW, RolloutMode.ALL):
            await st.catalogs.set_rollout(RolloutPolicy(server=st.server.name, mode=mode, percent=0))
            assert await ledger.load_fence(key) == fence
        live = await st.reconcile()
        assert live.rollout_mode == RolloutMode.ALL
        view = await st.view()
        assert view.last_notify is not None and view.last_notify.signalled == 1 \
            and view.last_notify.unlisted == 1
        await eventually(lambda: state(SubscriptionState.TOMBSTONED), timeout=20, what="TOMBSTONED")
        after = await ledger.load_fence(key)
        assert after.watermark >= fence.watermark \
            and after.last_accepted_ordinal >= fence.last_accepted_ordinal
        await st.check_invariants()


async def test_cli_scan_shows_the_catalog_and_refuses_unproven_completeness(
        temporal_client: Client, ledger: Ledger, tmp_path: Path, database_url: str,
        temporal_server: Any) -> None:
    import json

    async with catalog_stack(temporal_client, ledger, tmp_path) as st:
        await st.published(1)
        # Python API: the gate refuses an unproven catalog and records the refusal.
        with pytest.raises(CompletenessRefused, match="SNAPSHOT_UNPROVEN.*only SNAPSHOT_PROVEN"):
            await require_complete_catalog(st.catalogs, "alice", st.server.name, task="revocation-sweep")
        refused = (await st.catalogs.release_gates())["completeness_refused"]
        assert refused >= 1
        cfg = tmp_path / "mcpsync.toml"
        cfg.write_text(f'[temporal]\naddress = "{temporal_server.address}"\ntask_queue = "{st.task_queue}"\n'
                       f'[database]\nurl = "{database_url}"\n'
                       f'[[servers]]\nname = "{st.server.name}"\ntransport = "http"\nurl ='
                       f' "{st.fx.mcp_url}"\n')

        async def cli(*args: str) -> tuple[int, str, str]:
            r = await cli_process.arun(["--config", str(cfg), *args], env=cli_process.without_database_url())
            return r.returncode, r.stdout, r.stderr

        code, out, err = await cli("scan", "--server", st.server.name, "--subject", "alice", "--now",
                                   "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["catalog"]["status"] == "SNAPSHOT_UNPROVEN" and not doc["complete"]
        assert doc["uris"] == await st.listing()
        assert doc["scans"][-1]["record"] == "resourceDiscoveryScan.v1"
        assert doc["release_gates"]["unreconciled_catalogs_accepted"] == 0
        code, text, err = await cli("scan", "--server", st.server.name, "--subject", "alice")
        assert code == 0 and "SNAPSHOT_UNPROVEN" in text, err
        assert [ln.strip() for ln in text.splitlines() if ln.strip() in doc["uris"]] == doc["uris"], text
        code, out, err = await cli("scan", "--server", st.server.name, "--subject", "alice",
                                   "--require-proven", "--json")
        assert code == 3 and out == ""  # ExitCode.REFUSED: the completeness gate said no
        assert err.startswith("mcpsync: error: completeness task 'cli' refused") \
            and "SNAPSHOT_UNPROVEN" in err
        gates = await st.catalogs.release_gates()
        assert gates["completeness_consumed_unproven"] == 0 and gates["completeness_refused"] == refused + 1


async def test_continue_as_new_carries_the_catalog_state(ledger: Ledger, tmp_path: Path,
                                                          own_state_dir: Path) -> None:
    from temporalio.contrib.pydantic import pydantic_data_converter

    from mcpsync.worker.stack.temporal import TemporalDevServer

    server = await TemporalDevServer.start(own_state_dir / "temporal-can", port=0, ui_port=0,
                                           dynamic_config={"limit.historyCount.suggestContinueAsNew": 40})
    try:
        client = await Client.connect(server.address, data_converter=pydantic_data_converter)
        async with catalog_stack(client, ledger, tmp_path) as st:
            first_run = (await st.handle().describe()).run_id
            for _ in range(6):
                await st.reconcile()
                if (await st.handle().describe()).run_id != first_run:
                    break
            else:
                raise AssertionError("no continue-as-new after 6 reconciliations")
            carried = await st.view()  # the new run answers from the carried state
            assert carried.catalogs_published >= 1 and carried.last_catalog is not None
            await st.fx.create("demo://cat/05", text="after continue-as-new")

            async def grown() -> CatalogView | None:
                v = await st.view()
                return v if v.last_catalog is not None and v.last_catalog.resource_count == 6 else None

            view = await eventually(grown, timeout=20, what="the catalog with 6 URIs after continue-as-new")
            assert view.catalogs_published == carried.catalogs_published + 1 and view.last_catalog is not None
            assert view.last_catalog.added == 1 and view.published_reason == "list_changed"
            await st.check_invariants()
    finally:
        await server.stop()
