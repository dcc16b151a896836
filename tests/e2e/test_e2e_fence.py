"""The fence on the real stack: races, close, tombstones, identity, polling, reset, continue-as-new.

Each test drives the fixture server's fault switches and asserts on the PostgreSQL ledger.
Common assertion: no accepted version, tombstone or outbox row from a non-ACTIVE subscription.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.activities.workflow_updates import execute_update
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.stack.temporal import TemporalDevServer, temporal_cli_path
from mcpsync.workflows.names import (
    QUERY_SUBSCRIPTION,
    SIGNAL_CATALOG_RECONCILED,
    SIGNAL_RESOURCE_UPDATED,
    UPDATE_CLOSE,
    UPDATE_RESUME,
)
from mcpsync.workflows.records.subscription import (
    CatalogObservation,
    CloseReceipt,
    CloseRequest,
    ResourceUpdated,
    ResumeRequest,
    SubscriptionKey,
    SubscriptionOptions,
    SubscriptionState,
)
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.conftest import audited, ingress_idle, notifications_seen
from tests.e2e.test_e2e_subscription import _wait_record

S = SubscriptionState



def _server(url: str, subject: str = "alice") -> ServerConfig:
    return ServerConfig(name=unique("fx"), transport="http", url=url, subjects=[subject],
                        ping_interval_seconds=0.5, ping_timeout_seconds=2)


async def _receipts(ledger: Ledger, key: SubscriptionKey) -> list[tuple[int, str, str | None]]:
    return [(r[0], r[1], r[2]) for r in await ledger_rows(
        ledger, "SELECT read_ordinal, status, content_digest FROM resource_versions WHERE workflow_id=%s"
                " ORDER BY receipt_id", key.workflow_id)]


async def _outbox(ledger: Ledger, key: SubscriptionKey) -> list[tuple[str, str | None]]:
    return [(r[0], r[1]) for r in await ledger_rows(
        ledger, "SELECT event_type, content_digest FROM outbox WHERE workflow_id=%s ORDER BY outbox_id",
        key.workflow_id)]


async def _record(handle: WorkflowHandle) -> ResourceSubscriptionV1:
    return await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)


async def _started(client: Client, ledger: Ledger, fx: FixtureProcess, server: ServerConfig, queue: str,
                   text: str = "v1",
                   **options: Any) -> tuple[SubscriptionKey, WorkflowHandle, dict[str, Any]]:
    uri = f"demo://fence/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject=server.subjects[0], server=server.name, uri=uri)
    first = await fx.create(uri, text=text)
    handle = await start_subscription(client, key, task_queue=queue, options=SubscriptionOptions(**options))
    await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                       "initial read")
    return key, handle, first


async def test_read_a_slower_than_b_leaves_only_a_stale_receipt(temporal_client: Client, ledger: Ledger,
                                                                fx: FixtureProcess) -> None:
    # Two of the workflow's own reads in flight at once: the ingress must not read (it reads one
    # change of a URI at a time, so B's read would wait for A's instead of overtaking it).
    server = _server(fx.mcp_url).model_copy(update={"read_on_notification": False})
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue,
                                        max_concurrent_reads=2)
        await fx.wait_subscribed(key.uri)
        await fx.faults(read_delay_ms={key.uri: 1500})
        a = await fx.edit(key.uri, text="A")  # read A is served slowly: it returns A, late
        await eventually(lambda: _reading(fx, key.uri), what="read A at the server")
        await fx.faults(read_delay_ms={})
        b = await fx.edit(key.uri, text="B")  # read B overtakes A
        await _wait_record(handle, lambda r: r.last_accepted_digest == b["committed"]["digest"], "B accepted")
        receipts = await eventually(lambda: _has_stale(ledger, key), what="late A judged stale")
    statuses = {digest: status for _, status, digest in receipts}
    assert statuses[a["committed"]["digest"]] == "STALE"
    assert (await ledger.load_fence(key)).last_accepted_digest == b["committed"]["digest"]
    assert a["committed"]["digest"] not in [d for _, d in await _outbox(ledger, key)]


async def _reading(fx: FixtureProcess, uri: str) -> bool:
    stats = await fx.stats()
    return int(stats.get("reads", {}).get(uri, 0)) >= 2


async def _has_stale(ledger: Ledger, key: SubscriptionKey) -> list[tuple[int, str, str | None]]:
    receipts = await _receipts(ledger, key)
    return receipts if any(s == "STALE" for _, s, _ in receipts) else []


async def test_close_racing_a_read_late_content_and_late_404_only_audit(temporal_client: Client,
                                                                        ledger: Ledger,
                                                                        fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle, first = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue)
        key2, handle2, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue)
        for k in (key, key2):
            await fx.wait_subscribed(k.uri)
        await fx.faults(read_delay_ms={key.uri: 1200, key2.uri: 1200})
        await fx.edit(key.uri, text="late content")
        await fx.delete(key2.uri)  # its read will answer not found, after the close
        await eventually(lambda: _reading(fx, key.uri), what="read in flight")
        await eventually(lambda: _reading(fx, key2.uri), what="read in flight")
        receipts_before = {k.workflow_id: await _receipts(ledger, k) for k in (key, key2)}
        outbox_before = {k.workflow_id: await _outbox(ledger, k) for k in (key, key2)}
        for h in (handle, handle2):
            receipt = await execute_update(h, UPDATE_CLOSE, [CloseRequest()], result_type=CloseReceipt)
            assert receipt.state == S.CLOSED
        for h in (handle, handle2):
            await h.result()

        async def stale_after_close() -> list[dict[str, Any]]:
            rows = [r for r in await ledger.reports.audit_rows("STALE_AFTER_CLOSE", limit=500)
                    if r["workflow_id"] in (key.workflow_id, key2.workflow_id)]
            return rows if {r["workflow_id"] for r in rows} == {key.workflow_id, key2.workflow_id} else []

        # The reads in flight are the ingress's (reads at the ingress): the run closes without waiting
        # for them, and they are judged after it, against the closed row.
        stale = await eventually(stale_after_close, timeout=15, what="both late reads judged after the close")
    for k in (key, key2):
        assert await _receipts(ledger, k) == receipts_before[k.workflow_id], "no receipt after close"
        # The close itself tells consumers (one ``closed`` row, written with the fence change);
        # nothing the late reads found is published after it.
        assert await _outbox(ledger, k) == [*outbox_before[k.workflow_id], ("closed", None)], \
            "no outbox row after the close's own"
        fence = await ledger.load_fence(k)
        assert fence.state == S.CLOSED and fence.last_accepted_digest is not None
    assert {r["detail"]["outcome"] for r in stale} == {"content", "not_found"}
    assert first["committed"]["digest"] == (await ledger.load_fence(key)).last_accepted_digest


async def test_lost_unsubscribe_ack_is_unsubscribe_unknown_and_never_reopens(temporal_client: Client,
                                                                             ledger: Ledger,
                                                                             fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue)
        await fx.faults(reject_unsubscribe=True)
        receipt = await execute_update(handle, UPDATE_CLOSE, [CloseRequest()], result_type=CloseReceipt)
        assert receipt.state == S.UNSUBSCRIBE_UNKNOWN
        reads, served = await ledger.reports.read_count(key), (await fx.stats())["reads"].get(key.uri, 0)
        seen = await notifications_seen(ledger, key)
        await fx.edit(key.uri, text="after close")
        await fx.notify(key.uri, times=3)
        # Witness before the absence: the unsubscribe was never acknowledged, so the server still
        # notifies; every notification reached the ingress, was recorded on the row and settled (the
        # ended run's audited NOTIFICATION_NO_WORKFLOW).
        await eventually(lambda: ingress_idle(ledger, fx, server.name), what="every notification routed")
        assert await notifications_seen(ledger, key) > seen
        assert await audited(ledger, "NOTIFICATION_NO_WORKFLOW", key.workflow_id) >= 1
        assert await ledger.reports.read_count(key) == reads
        assert (await fx.stats())["reads"].get(key.uri, 0) == served, "no resources/read after the close"
        assert (await ledger.load_fence(key)).state == S.UNSUBSCRIBE_UNKNOWN
        closed = await ledger.load_fence(key)
        # An explicit new start is a new incarnation: it subscribes afresh, ordinals continue above.
        again = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
        rec = await _wait_record(again,
                                 lambda r: r.state == S.ACTIVE and r.watermark > closed.last_issued_ordinal,
                                 "new incarnation active")
        assert rec.close_epoch == closed.close_epoch


async def test_old_session_notification_is_audited_and_ignored(temporal_client: Client, ledger: Ledger,
                                                               fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue)
        rec = await _record(handle)
        reads = rec.reads_issued
        await handle.signal(SIGNAL_RESOURCE_UPDATED,
                            ResourceUpdated(uri=key.uri, session_generation=rec.session_generation - 1))
        rows = await eventually(lambda: _audit_for(ledger, "NOTIFICATION_OLD_SESSION", key), what="audit")
        assert rows
        assert (await _record(handle)).reads_issued == reads


async def _audit_for(ledger: Ledger, kind: str, key: SubscriptionKey) -> list[dict[str, Any]]:
    return [r for r in await ledger.reports.audit_rows(kind, limit=1000)
            if r["workflow_id"] == key.workflow_id]


async def test_uri_encoding_variant_is_a_conflict_never_a_route(temporal_client: Client, ledger: Ledger,
                                                                fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    tag = uuid.uuid4().hex
    exact, variant = f"file:///srv/{tag}/Caf%c3%a9.txt", f"FILE:///srv/{tag}/Caf%C3%A9.txt"
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key = SubscriptionKey(subject="alice", server=server.name, uri=exact)
        first = await fx.create(exact, text="exact")
        await fx.create(variant, text="variant")
        handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
        await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                           "initial")
        reads = await ledger.reports.read_count(key)
        await fx.notify(variant, unsolicited=True)
        await _wait_record(handle, lambda r: r.state == S.RECONCILIATION_REQUIRED, "conflict")
        assert await ledger.reports.read_count(key) == reads, "the variant URI must not cause a read"
        assert await _audit_for(ledger, "NORMALIZED_URI_MATCH", key)
        assert (await ledger.load_fence(key)).state == S.RECONCILIATION_REQUIRED
        change = await fx.edit(exact, text="exact v2")
        resumed = await execute_update(handle, UPDATE_RESUME, [ResumeRequest(reason="operator checked")],
                                       result_type=ResourceSubscriptionV1)
        assert resumed.state in (S.ACTIVE, S.UPDATE_SEEN, S.READ_PENDING)
        await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                           "resumed")
    variant_digest = (await fx.resource(variant))["digest"]
    assert variant_digest not in [d for _, d in await _outbox(ledger, key)]


async def test_deleted_then_tombstoned_or_recreated_by_catalog_word(temporal_client: Client, ledger: Ledger,
                                                                    fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        gone, h_gone, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue)
        back, h_back, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue)
        for k in (gone, back):
            await fx.wait_subscribed(k.uri)
            await fx.delete(k.uri)
        for h in (h_gone, h_back):
            await _wait_record(h, lambda r: r.state == S.TOMBSTONE_PENDING, "tombstone pending")
        assert [e for e, _ in await _outbox(ledger, gone)] == ["version_accepted"], \
            "pending is not a tombstone"
        recreated = await fx.create(back.uri, text="recreated")
        rec = await _record(h_gone)
        for k, h, listed in ((gone, h_gone, False), (back, h_back, True)):
            await h.signal(SIGNAL_CATALOG_RECONCILED, CatalogObservation(
                uri=k.uri, listed=listed, scan_id="scan-test", snapshot_status="SNAPSHOT_UNPROVEN",
                session_generation=rec.session_generation))
        await _wait_record(h_gone, lambda r: r.state == S.TOMBSTONED, "tombstoned")
        await _wait_record(h_back, lambda r: r.last_accepted_digest == recreated["committed"]["digest"],
                           "recreated version accepted")
        await h_gone.result()
    assert [e for e, _ in await _outbox(ledger, gone)] == ["version_accepted", "tombstoned"]
    assert [e for e, _ in await _outbox(ledger, back)] == ["version_accepted", "version_accepted"]


async def test_server_without_subscribe_polls_and_publishes_staleness(temporal_client: Client, ledger: Ledger,
                                                                      tmp_path: Path) -> None:
    async with await FixtureProcess.start_http(tmp_path, seed="none", subscribe=False) as fx:
        server = _server(fx.mcp_url)
        async with running_services(temporal_client, ledger, [server]) as cfg:
            key, handle, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue,
                                            poll_interval_seconds=1.0)
            rec = await _record(handle)
            assert rec.staleness_bound_seconds == 1.0
            change = await fx.edit(key.uri, text="polled")
            await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                               "polled change", timeout=10)
            stats = await fx.stats()
            assert sum(stats.get("subscribe_calls", {}).values()) == 0, \
                "never subscribe without the capability"


async def test_advertised_but_rejected_subscribe_falls_back_to_polling(temporal_client: Client,
                                                                       ledger: Ledger,
                                                                       fx: FixtureProcess) -> None:
    await fx.faults(reject_subscribe=True)
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue,
                                        poll_interval_seconds=1.0)
        rec = await _record(handle)
        assert rec.staleness_bound_seconds == 1.0 and "polling" in rec.detail
        assert await _audit_for(ledger, "SUBSCRIBE_REJECTED", key)
        change = await fx.edit(key.uri, text="polled")
        await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"], "poll",
                           timeout=10)


async def test_server_restart_gives_new_session_generation_resubscribe_and_reread(
        temporal_client: Client, ledger: Ledger, tmp_path: Path) -> None:
    from mcpsync.worker.stack.common import free_port

    port = free_port()
    fx = await FixtureProcess.start_http(tmp_path / "a", seed="none", port=port)
    server = _server(fx.mcp_url)
    try:
        async with running_services(temporal_client, ledger, [server]) as cfg:
            key, handle, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue)
            before = await _record(handle)
            await fx.stop()
            fx = await FixtureProcess.start_http(tmp_path / "b", seed="none", port=port)
            fresh = await fx.create(key.uri, text="after restart")  # changed while we were away
            rec = await _wait_record(handle, lambda r: r.last_accepted_digest == fresh["committed"]["digest"],
                                     "re-read on the new session", timeout=30)
            assert rec.session_generation > before.session_generation
            assert rec.subscription_generation > before.subscription_generation
            await fx.wait_subscribed(key.uri)
            change = await fx.edit(key.uri, text="notified on the new session")
            await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                               "new")
    finally:
        await fx.stop()


async def test_reset_to_first_task_after_five_versions_never_regresses(temporal_client: Client,
                                                                       ledger: Ledger,
                                                                      temporal_server: TemporalDevServer,
                                                                      fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue)
        await fx.wait_subscribed(key.uri)
        for i in range(2, 6):
            change = await fx.edit(key.uri, text=f"v{i}")
            await _wait_record(handle, lambda r, d=change["committed"]["digest"]: r.last_accepted_digest == d,
                               f"v{i}")
        fence_before = await ledger.load_fence(key)
        assert fence_before.watermark >= 5
        proc = subprocess.run(
            [str(temporal_cli_path()), "workflow", "reset", "--address", temporal_server.address,
             "--workflow-id", key.workflow_id, "--type", "FirstWorkflowTask", "--reason", "test rollback",
             "--reapply-exclude", "Signal", "--yes"],
            capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        new = temporal_client.get_workflow_handle(key.workflow_id)
        change = await fx.edit(key.uri, text="after reset")
        rec = await _wait_record(new, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                                 "converged after reset", timeout=40)
        fence_after = await ledger.load_fence(key)
        assert fence_after.watermark > fence_before.watermark
        assert fence_after.last_issued_ordinal > fence_before.last_issued_ordinal
        assert rec.watermark <= fence_after.watermark

        # The run's view catches up with the ledger: the reset run's initial read and the read of the
        # edit can both be judged, the second landing in the ledger just before the run mirrors it.
        async def view_matches_ledger() -> bool:
            return (await _record(new)).watermark == (await ledger.load_fence(key)).watermark

        await eventually(view_matches_ledger, timeout=20, what="the run's watermark equals the ledger's")
    ordinals = [r[0]
                for r in await ledger_rows(ledger, "SELECT ordinal FROM read_requests WHERE workflow_id=%s"
                                                  " ORDER BY issued_at, ordinal", key.workflow_id)]
    assert ordinals == sorted(ordinals) and len(set(ordinals)) == len(ordinals), "ordinal reused after reset"
    accepted = [o for o, s, _ in await _receipts(ledger, key) if s in ("ACCEPTED", "UNCHANGED")]
    assert accepted == sorted(accepted), "watermark regressed"


async def test_continue_as_new_keeps_state(temporal_client: Client, ledger: Ledger,
                                           fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue,
                                        max_history_events=100)
        await fx.wait_subscribed(key.uri)
        first_run = (await handle.describe()).run_id
        last = None
        for i in range(24):  # about 5 history events per change read at the ingress
            last = await fx.edit(key.uri, text=f"can {i}")
            await _wait_record(handle, lambda r, d=last["committed"]["digest"]: r.last_accepted_digest == d,
                               f"edit {i}")
        desc = await temporal_client.get_workflow_handle(key.workflow_id).describe()
        assert desc.run_id != first_run, "continue-as-new should have happened"
        rec = await _record(temporal_client.get_workflow_handle(key.workflow_id))
        fence = await ledger.load_fence(key)
        assert rec.watermark == fence.watermark and rec.last_accepted_ordinal == fence.last_accepted_ordinal
        assert rec.subscription_generation == fence.subscription_generation
        assert last is not None and rec.last_accepted_digest == last["committed"]["digest"]
        start = (await temporal_client.get_workflow_handle(key.workflow_id).fetch_history()).events[0]
        assert start.workflow_execution_started_event_attributes.continued_execution_run_id
        assert "max_history_events" in str(start)  # options travel with the state


async def test_lost_notification_is_repaired_by_the_safety_read(temporal_client: Client, ledger: Ledger,
                                                                fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle, _ = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue,
                                        safety_read_seconds=1.5)
        await fx.wait_subscribed(key.uri)
        rec = await _record(handle)
        assert rec.safety_read_seconds == 1.5 and rec.staleness_bound_seconds is None
        await fx.faults(drop_notifications=1)
        change = await fx.edit(key.uri, text="its notification is lost")
        await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                           "repaired by the safety read", timeout=10)
        stats = await fx.stats()
        assert int(stats.get("notifications_dropped", {}).get(key.uri, 0)) == 1


async def test_shadow_rollout_fences_and_records_but_publishes_nothing(temporal_client: Client,
                                                                       ledger: Ledger,
                                                                       fx: FixtureProcess) -> None:
    from mcpsync.activities.ledger.catalog import CatalogLedger
    from mcpsync.workflows.records.catalog import RolloutMode, RolloutPolicy

    server = _server(fx.mcp_url)
    rollout = CatalogLedger(ledger.pool)
    await rollout.set_rollout(RolloutPolicy(server=server.name, mode=RolloutMode.SHADOW))
    async with running_services(temporal_client, ledger, [server]) as cfg:
        key, handle, first = await _started(temporal_client, ledger, fx, server, cfg.temporal.task_queue)
        await fx.wait_subscribed(key.uri)
        shadowed = await fx.edit(key.uri, text="computed in shadow")
        await _wait_record(handle, lambda r: r.last_accepted_digest == shadowed["committed"]["digest"],
                           "shadow")
        assert await _outbox(ledger, key) == [], "shadow mode publishes nothing"
        assert len(await _audit_for(ledger, "OUTBOX_HELD_BY_ROLLOUT", key)) == 2
        watermark = (await ledger.load_fence(key)).watermark
        await rollout.set_rollout(RolloutPolicy(server=server.name, mode=RolloutMode.ALL))
        live = await fx.edit(key.uri, text="published")
        await _wait_record(handle, lambda r: r.last_accepted_digest == live["committed"]["digest"], "live")
        assert await _outbox(ledger, key) == [("version_accepted", live["committed"]["digest"])]
        assert (await ledger.load_fence(key)).watermark > watermark, "switching modes keeps the fence"
    assert first["committed"]["digest"] != live["committed"]["digest"]
