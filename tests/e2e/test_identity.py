"""URI identity on the ingress and catalog side: real PostgreSQL, Temporal and fixture server.

- Ledger: ``subscriptions.uri_normalized`` is written where rows are created and backfilled by
  ``migrate``; ``normalized_siblings`` finds the live subscriptions that normalize alike.
- A listed ambiguous pair (both spellings subscribed): an update named with either spelling makes
  both read at once (not at the next safety read); the catalog flags the pair once.
- A variant notification: an identity conflict for the subscription and a reconciliation request
  to the catalog (or an audit row when none runs); the catalog's observation carries ``variants``.
- A revoked subscription gets no signal after a reconnect (one definition of terminal states).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.catalog import CatalogLedger
from mcpsync.activities.ledger.db import backfill_uri_normalized, migrate, open_pool
from mcpsync.activities.starters import start_catalog, start_subscription
from mcpsync.activities.workflow_updates import execute_update
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.main.revocation import revoke
from mcpsync.workflows.catalog_rules import CatalogView
from mcpsync.workflows.names import (
    QUERY_CATALOG,
    QUERY_SUBSCRIPTION,
    SIGNAL_CATALOG_RECONCILED,
    SIGNAL_IDENTITY_CONFLICT,
    SIGNAL_RESOURCE_READ,
    SIGNAL_RESOURCE_UPDATED,
    UPDATE_RECONCILE,
)
from mcpsync.workflows.records.catalog import CatalogKey, CatalogSnapshot
from mcpsync.workflows.records.read_cycle import ReadReport
from mcpsync.workflows.records.subscription import (
    CatalogObservation,
    IdentityConflict,
    ResourceUpdated,
    SubscriptionKey,
    SubscriptionOptions,
    SubscriptionState,
)
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from mcpsync.workflows.uris import normalize_uri
from tests.conftest import eventually, fresh_database, ledger_rows, running_services, unique
from tests.e2e.test_catalog_e2e import FAST
from tests.e2e.test_e2e_subscription import _wait_record

pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")

S = SubscriptionState
# Long enough that any read seen in these tests came from a notification, not a safety read.
NO_SAFETY_READ = SubscriptionOptions(safety_read_seconds=300)


def _server(url: str, subject: str = "alice") -> ServerConfig:
    return ServerConfig(name=unique("id"), transport="http", url=url, subjects=[subject],
                        ping_interval_seconds=0.5, ping_timeout_seconds=2)


async def _audit(ledger: Ledger, kind: str, **match: str) -> list[dict[str, Any]]:
    where = " AND ".join(f"{col}=%s" for col in match)
    rows = await ledger_rows(ledger, f"SELECT workflow_id, uri, detail, server FROM audit WHERE kind=%s"
                                     f"{' AND ' + where if where else ''} ORDER BY audit_id", kind,
                             *match.values())
    return [{"workflow_id": r[0], "uri": r[1], "detail": r[2], "server": r[3]} for r in rows]


async def _updated_reads(ledger: Ledger, key: SubscriptionKey) -> int:
    """The key's judged 'updated' reads (an allocated read is judged in a later transaction)."""
    rows = await ledger_rows(ledger,
                             "SELECT count(*) FROM read_requests WHERE workflow_id=%s AND trigger_reason=%s"
                             " AND completed_at IS NOT NULL", key.workflow_id, "updated")
    return int(rows[0][0])


async def _signals(client: Client, handle: WorkflowHandle, name: str, result_type: type) -> list[Any]:
    """Payloads of every ``name`` signal in the workflow's history, oldest first."""
    out = []
    async for event in handle.fetch_history_events():
        if event.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            continue
        attrs = event.workflow_execution_signaled_event_attributes
        if attrs.signal_name == name:
            out.extend(await client.data_converter.decode(attrs.input.payloads, [result_type]))
    return out


async def _record(handle: WorkflowHandle) -> ResourceSubscriptionV1:
    return await handle.query(QUERY_SUBSCRIPTION,
                              result_type=ResourceSubscriptionV1)  # type: ignore[no-any-return]


async def _started(client: Client, fx: FixtureProcess, server: ServerConfig, queue: str,
                   uri: str, text: str) -> tuple[SubscriptionKey, WorkflowHandle]:
    key = SubscriptionKey(subject=server.subjects[0], server=server.name, uri=uri)
    first = await fx.create(uri, text=text)
    handle = await start_subscription(client, key, task_queue=queue, options=NO_SAFETY_READ)
    await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                       f"initial {uri}")
    await fx.wait_subscribed(uri)
    return key, handle


# --- ledger -----------------------------------------------------------------------------------


async def test_normalized_siblings_are_live_same_view_and_never_the_exact_uri(ledger: Ledger) -> None:
    server, tag = unique("sib"), uuid.uuid4().hex[:8]
    tilde, encoded, shouting = (f"demo://x/{tag}/~t", f"demo://x/{tag}/%7Et", f"DEMO://x/{tag}/%7et")
    keys = {uri: SubscriptionKey(subject="alice", server=server, uri=uri)
            for uri in (tilde, encoded, shouting)}
    for key in keys.values():
        await ledger.ensure_subscription(key, "inc-1")
    other_subject = SubscriptionKey(subject="bob", server=server, uri=encoded)
    await ledger.ensure_subscription(other_subject, "inc-1")
    await ledger.ensure_subscription(SubscriptionKey(subject="alice", server=server, uri=f"demo://x/{tag}/u"),
                                     "i")

    siblings = await ledger.fence.normalized_siblings("alice", server, tilde)
    assert siblings == sorted([(keys[encoded].workflow_id, encoded), (keys[shouting].workflow_id, shouting)],
                              key=lambda s: s[1])
    # An unsubscribed spelling finds every subscribed one; a URI with no sibling finds none.
    siblings = await ledger.fence.normalized_siblings("alice", server, f"demo://X/{tag}/%7ET")
    assert {u for _, u in siblings} == set()
    assert {u for _, u in await ledger.fence.normalized_siblings("alice", server, f"demo://x/{tag}/%7e%74")} \
        == {tilde, encoded, shouting}
    assert await ledger.fence.normalized_siblings("alice", server, f"demo://x/{tag}/u") == []
    # Terminal states (REVOKED among them) are never siblings.
    await ledger.revoke(keys[shouting], reason="test", source="platform", effective_at=datetime.now(UTC))
    assert (await ledger.load_fence(keys[shouting])).state == S.REVOKED
    assert await ledger.fence.normalized_siblings("alice", server, tilde) == [
        (keys[encoded].workflow_id, encoded)]
    assert await ledger.fence.normalized_siblings("bob", server, tilde) == [
        (other_subject.workflow_id, encoded)]


async def test_backfill_fills_missing_normalized_uris_in_batches_and_is_idempotent(ledger: Ledger) -> None:
    server, tag = unique("bf"), uuid.uuid4().hex[:8]
    uris = [f"HTTP://Example.COM/{tag}/a/./b/../%7e{i}" for i in range(7)]
    for uri in uris:
        await ledger.ensure_subscription(SubscriptionKey(subject="alice", server=server, uri=uri), "inc")
    stored = await ledger_rows(ledger, "SELECT uri, uri_normalized FROM subscriptions WHERE server=%s",
                               server)
    assert {u: n for u, n in stored} == {u: normalize_uri(u) for u in uris}, "written where rows are created"

    # Rows from before migration 008 have no normalized URI.
    await ledger_rows(ledger, "UPDATE subscriptions SET uri_normalized = NULL WHERE server=%s", server)
    async with ledger.pool.connection() as conn:
        assert await backfill_uri_normalized(conn, batch=3) == 7
        assert await backfill_uri_normalized(conn, batch=3) == 0
    stored = await ledger_rows(ledger, "SELECT uri, uri_normalized FROM subscriptions WHERE server=%s",
                               server)
    assert {u: n for u, n in stored} == {u: normalize_uri(u) for u in uris}
    assert normalize_uri(uris[0]) == f"http://example.com/{tag}/a/~0"

    # migrate() runs the backfill on every call (it also repairs rows an older binary wrote).
    await ledger_rows(ledger, "UPDATE subscriptions SET uri_normalized = NULL WHERE server=%s", server)
    assert await migrate(ledger.pool) == []
    assert await ledger_rows(ledger,
                             "SELECT count(*) FROM subscriptions WHERE server=%s AND uri_normalized IS NULL",
                             server) == [(0,)]
    assert len(await ledger.fence.normalized_siblings("alice", server, f"http://example.com/{tag}/a/~3")) == 1

    # A row the backfill has not reached yet is filled when its workflow ensures it.
    key = SubscriptionKey(subject="alice", server=server, uri=uris[1])
    await ledger_rows(ledger, "UPDATE subscriptions SET uri_normalized = NULL WHERE workflow_id=%s",
                      key.workflow_id)
    await ledger.ensure_subscription(key, "inc")
    assert await ledger_rows(ledger, "SELECT uri_normalized FROM subscriptions WHERE workflow_id=%s",
                             key.workflow_id) == [(normalize_uri(uris[1]),)]


async def test_upgrade_to_008_backfills_rows_written_before_it(postgres_url: str) -> None:
    async with fresh_database(postgres_url) as url:
        pool = await open_pool(url, max_size=2)
        try:
            await migrate(pool)
            async with pool.connection() as conn:  # back to version 7, with rows from that time
                await conn.execute("DROP TABLE ambiguous_uri_pairs")
                await conn.execute("ALTER TABLE subscriptions DROP COLUMN uri_normalized")
                await conn.execute("DELETE FROM schema_migrations WHERE version = 8")
                for i, uri in enumerate(("demo://v7/~a", "demo://v7/%7Ea", "demo://v7/b")):
                    await conn.execute("INSERT INTO subscriptions (workflow_id, subject, server, uri, state)"
                                       " VALUES (%s, 'alice', 'v7', %s, 'ACTIVE')", (f"wf-{i}", uri))
            assert await migrate(pool) == ["008_uri_identity.sql"]
            led = Ledger(pool)
            assert await led.fence.normalized_siblings("alice", "v7",
                                                 "demo://v7/~a") == [("wf-1", "demo://v7/%7Ea")]
            assert await led.fence.normalized_siblings("alice", "v7", "demo://v7/b") == []
        finally:
            await pool.close()


# --- a listed ambiguous pair ----------------------------------------------------------------------


async def test_listed_ambiguous_pair_both_read_on_either_spelling_and_flagged_once(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    tag = uuid.uuid4().hex[:8]
    tilde, encoded = f"demo://x/{tag}/~tilde", f"demo://x/{tag}/%7Etilde"
    async with running_services(temporal_client, ledger, [server]) as cfg:
        queue = cfg.temporal.task_queue
        k_tilde, h_tilde = await _started(temporal_client, fx, server, queue, tilde, "tilde v1")
        k_enc, h_enc = await _started(temporal_client, fx, server, queue, encoded, "encoded v1")

        for edited, h_named, (k_sib, h_sib) in ((tilde, h_tilde, (k_enc, h_enc)),
                                                (encoded, h_enc, (k_tilde, h_tilde))):
            sibling_reads = await _updated_reads(ledger, k_sib)
            sibling_seen = (await ledger.load_fence(k_sib)).notifications_seen
            change = await fx.edit(edited, text=f"{edited} v2")
            # The server names only the edited spelling; the sibling is read too, at once.
            await _wait_record(h_named,
                               lambda r, d=change["committed"]["digest"]: r.last_accepted_digest == d,
                               f"{edited} v2")
            await eventually(lambda k=k_sib, n=sibling_reads: _more(_updated_reads(ledger, k), n), timeout=15,
                             what=f"an 'updated' read of the sibling of {edited}")
            assert (await ledger.load_fence(k_sib)).notifications_seen > sibling_seen
            rows = await _audit(ledger, "AMBIGUOUS_SIBLING_INVALIDATED", workflow_id=k_sib.workflow_id)
            assert {"observed_uri": edited, "sibling_uri": k_sib.uri} in [r["detail"] for r in rows]
            # The sibling was read under its OWN exact URI, never the observed spelling: its content
            # did not change, so that read stays in the ledger (UNCHANGED, no signal). Any signal a
            # workflow got names its own URI; a read at the ingress reported the sibling's URI too.
            newest = await ledger_rows(ledger, "SELECT outcome FROM read_requests WHERE workflow_id=%s"
                                               " AND trigger_reason=%s ORDER BY ordinal DESC LIMIT 1",
                                       k_sib.workflow_id, "updated")
            assert newest == [("UNCHANGED",)], newest
            updates = await _signals(temporal_client, h_sib, SIGNAL_RESOURCE_UPDATED, ResourceUpdated)
            reports = await _signals(temporal_client, h_sib, SIGNAL_RESOURCE_READ, ReadReport)
            assert {u.uri for u in updates} | {r.update.uri for r in reports} <= {k_sib.uri}
            assert all(r.cycle.outcome is None or r.cycle.outcome.key.uri == k_sib.uri for r in reports)
        assert (await _record(h_tilde)).state in (S.ACTIVE, S.READ_PENDING, S.UPDATE_SEEN)

        # The catalog flags the listed pair once, however many catalogs list it.
        catalogs = CatalogLedger(ledger.pool)
        catalog = await start_catalog(temporal_client, CatalogKey(subject="alice", server=server.name),
                                      task_queue=queue, policy=FAST)
        try:
            first = await _reconcile(catalog)
            await _reconcile(catalog)
            flagged = await _audit(ledger, "AMBIGUOUS_URI_LISTED", server=server.name)
            assert len(flagged) == 1
            detail = flagged[0]["detail"]
            assert (detail["uri_a"], detail["uri_b"]) == tuple(sorted((tilde, encoded)))
            assert detail["catalog_id"] == first.catalog_id and detail["scan_id"] == first.scan_b
            assert await catalogs.ambiguous_pairs("alice", server.name) == [tuple(sorted((tilde, encoded)))]
            # Each subscription's catalog observation names the other listed spelling as its variant.
            for k, h in ((k_tilde, h_tilde), (k_enc, h_enc)):
                obs = await eventually(lambda h=h: _signals(temporal_client, h, SIGNAL_CATALOG_RECONCILED,
                                                            CatalogObservation), what="catalog observation")
                other = encoded if k.uri == tilde else tilde
                assert all(o.listed and o.variants == [other] for o in obs)
        finally:
            await catalog.terminate("test over")


async def _more(count: Any, than: int) -> bool:
    return bool(await count > than)


async def _reconcile(handle: WorkflowHandle) -> CatalogSnapshot:
    out = await execute_update(handle, UPDATE_RECONCILE, ["test"], result_type=CatalogSnapshot)
    assert out is not None
    return out  # type: ignore[no-any-return]


# --- a variant notification -----------------------------------------------------------------------


async def test_variant_notification_without_catalog_is_audited_for_the_time_bound(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    tag = uuid.uuid4().hex[:8]
    exact, variant = f"demo://id/{tag}/a%2Fb", f"demo://id/{tag}/a%2fb"
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle = await _started(temporal_client, fx, server, cfg.temporal.task_queue, exact, "exact")
        reads = await ledger.reports.read_count(key)
        await fx.notify(variant, unsolicited=True)
        match = await eventually(lambda: _audit(ledger, "NORMALIZED_URI_MATCH", workflow_id=key.workflow_id),
                                 what="NORMALIZED_URI_MATCH")
        assert match[0]["uri"] == variant and match[0]["detail"] == {"subscribed_uri": exact}
        no_catalog = await eventually(lambda: _audit(ledger, "IDENTITY_NO_CATALOG", server=server.name),
                                      what="IDENTITY_NO_CATALOG")
        assert no_catalog[0]["workflow_id"] == CatalogKey(subject="alice", server=server.name).workflow_id
        assert no_catalog[0]["detail"]["reason"] == f"identity conflict: {variant}"
        conflicts = await _signals(temporal_client, handle, SIGNAL_IDENTITY_CONFLICT, IdentityConflict)
        assert [c.observed_uri for c in conflicts] == [variant]
        assert await ledger.reports.read_count(key) == reads, "a variant never causes a read of the exact URI"
        assert not await _audit(ledger, "AMBIGUOUS_SIBLING_INVALIDATED", workflow_id=key.workflow_id)


async def test_variant_notification_asks_the_catalog_whose_observation_carries_variants(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    tag = uuid.uuid4().hex[:8]
    exact, variant = f"demo://id/{tag}/a%2Fb", f"demo://id/{tag}/a%2fb"
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle = await _started(temporal_client, fx, server, cfg.temporal.task_queue, exact, "exact")
        catalog = await start_catalog(temporal_client, CatalogKey(subject="alice", server=server.name),
                                      task_queue=cfg.temporal.task_queue, policy=FAST)
        try:
            await _reconcile(catalog)  # the initial catalog: idle afterwards, so the next one is ours
            before = await _signals(temporal_client, handle, SIGNAL_CATALOG_RECONCILED, CatalogObservation)
            await fx.notify(variant, unsolicited=True)
            await eventually(lambda: _audit(ledger, "NORMALIZED_URI_MATCH", workflow_id=key.workflow_id),
                             what="NORMALIZED_URI_MATCH")

            async def conflict_catalog() -> CatalogView | None:
                v: CatalogView = await catalog.query(QUERY_CATALOG, result_type=CatalogView)
                return v if v.published_reason == f"identity conflict: {variant}" and v.last_notify else None

            view = await eventually(conflict_catalog, timeout=30,
                                    what="a catalog reconciled for the conflict")
            assert view.last_notify is not None and view.last_notify.signalled >= 1
            assert not await _audit(ledger, "IDENTITY_NO_CATALOG", server=server.name)
            conflicts = await _signals(temporal_client, handle, SIGNAL_IDENTITY_CONFLICT, IdentityConflict)
            assert [c.observed_uri for c in conflicts] == [variant]
            after = await eventually(
                lambda: _newer(_signals(temporal_client, handle, SIGNAL_CATALOG_RECONCILED,
                                        CatalogObservation),
                               len(before)), what="a catalog observation after the conflict")
            assert after[-1].uri == exact and after[-1].listed and after[-1].variants == []
            assert after[-1].scan_id == view.last_catalog.scan_b  # type: ignore[union-attr]
            # Once the variant is listed too, the observation names it.
            await fx.create(variant, text="variant")
            second = await _reconcile(catalog)
            latest = await _signals(temporal_client, handle, SIGNAL_CATALOG_RECONCILED, CatalogObservation)
            assert latest[-1].variants == [variant]
            # The catalog's evidence (measured after the conflict, the exact URI listed) freed the
            # subscription by itself: no resume, audited with the scan. The conflict catalog usually
            # does it; if it was measured before the conflict began, the second one does.
            reconciled = await eventually(lambda: _audit(ledger, "IDENTITY_RECONCILED",
                                                         workflow_id=key.workflow_id),
                                          timeout=30, what="IDENTITY_RECONCILED by the catalog")
            assert reconciled[0]["detail"]["scan_id"] in {view.last_catalog.scan_b,
                                                          second.scan_b}  # type: ignore[union-attr]
            change = await fx.edit(exact, text="exact v2")
            await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                               "a change read after the catalog reconciled the identity")
        finally:
            await catalog.terminate("test over")


async def _newer(items: Any, than: int) -> list[Any] | None:
    got = await items
    return got if len(got) > than else None


# --- one definition of terminal states --------------------------------------------------------------


async def test_revoked_subscription_gets_no_signal_after_reconnect(temporal_client: Client, ledger: Ledger,
                                                                   tmp_path: Path) -> None:
    from mcpsync.worker.stack.common import free_port

    port = free_port()
    fx = await FixtureProcess.start_http(tmp_path / "a", seed="none", port=port)
    server = _server(fx.mcp_url)
    tag = uuid.uuid4().hex[:8]
    try:
        async with running_services(temporal_client, ledger, [server]) as cfg:
            queue = cfg.temporal.task_queue
            k_gone, h_gone = await _started(temporal_client, fx, server, queue, f"demo://rv/{tag}/gone", "g")
            k_live, h_live = await _started(temporal_client, fx, server, queue, f"demo://rv/{tag}/live", "l")
            catalog = await start_catalog(temporal_client, CatalogKey(subject="alice", server=server.name),
                                          task_queue=queue, policy=FAST)
            try:
                await _reconcile(catalog)
                assert await revoke(temporal_client, ledger, subject="alice", server=server.name,
                                    uri=k_gone.uri, reason="offboarded") == [k_gone.workflow_id]
                await h_gone.result()
                assert (await ledger.load_fence(k_gone)).state == S.REVOKED
                events_at_revocation = len([e async for e in h_gone.fetch_history_events()])
                audit_at_revocation = await ledger_rows(ledger, "SELECT max(audit_id) FROM audit")
                live_generation = (await _record(h_live)).session_generation

                # Reconnect: the server restarts; every live subscription resubscribes on the new session.
                await fx.stop()
                fx = await FixtureProcess.start_http(tmp_path / "b", seed="none", port=port)
                fresh = await fx.create(k_live.uri, text="after restart")
                await fx.create(k_gone.uri, text="still served")
                await _wait_record(h_live, lambda r: r.session_generation > live_generation
                                   and r.last_accepted_digest == fresh["committed"]["digest"], "live re-read",
                                   timeout=30)
                # ... and a catalog measured on the new session signals the view's subscriptions.
                snapshot = await _reconcile(catalog)
                assert snapshot.session_generation > live_generation
                view: CatalogView = await catalog.query(QUERY_CATALOG, result_type=CatalogView)
                assert view.last_notify is not None
                assert view.last_notify.no_workflow == 0 and view.last_notify.signalled == 1
            finally:
                await catalog.terminate("test over")
        rows = await ledger_rows(ledger, "SELECT kind FROM audit WHERE workflow_id=%s AND audit_id > %s",
                                 k_gone.workflow_id, audit_at_revocation[0][0])
        assert rows == [], f"audit rows for the revoked subscription after its revocation: {rows}"
        assert len([e async for e in h_gone.fetch_history_events()]) == events_at_revocation
    finally:
        await fx.stop()

