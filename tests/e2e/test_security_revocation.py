"""Revocation reaches every copy (issue 29, items 1-3), on the real stack.

- A whole-subject revoke covers finished subscriptions too: a CLOSED subscription's receipts are
  refused, its bodies purged, and the outbox ``revoked`` rows name every receipt.
- ``revoke`` revokes in the ledger first: with no worker running, content is refused at once;
  the workflows mirror it when a worker comes back (``wait``).
- A read held in flight across a revoke leaves no body behind.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.released import ContentRefused, released_content
from mcpsync.activities.starters import start_subscription
from mcpsync.activities.workflow_updates import execute_update
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.main.revocation import revoke_subject
from mcpsync.workflows.names import UPDATE_CLOSE
from mcpsync.workflows.records.subscription import (
    CloseReceipt,
    CloseRequest,
    SubscriptionKey,
    SubscriptionState,
)
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.test_e2e_subscription import _wait_record

S = SubscriptionState


def _server(fx: FixtureProcess) -> ServerConfig:
    return ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=["alice", "bob"])


async def _bodies(ledger: Ledger, subject: str, digests: list[str]) -> int:
    rows = await ledger_rows(ledger, "SELECT count(*) FROM content_store WHERE subject=%s "
                                     "AND content_digest = ANY(%s)",
                             subject, digests)
    return int(rows[0][0])


async def _released_receipts(ledger: Ledger, key: SubscriptionKey) -> list[int]:
    return [r.receipt_id for r in await ledger.reports.receipts(key)
            if r.status.value in ("ACCEPTED", "UNCHANGED")]


async def _revoked_events(ledger: Ledger, workflow_id: str) -> list[dict[str, Any]]:
    rows = [r for r in await ledger.reports.outbox_after(0, 100_000)
            if r["workflow_id"] == workflow_id and r["event_type"] == "revoked"]
    for r in rows:
        if not isinstance(r["detail"], dict):
            r["detail"] = json.loads(r["detail"])
    return rows


async def _assert_refused(ledger: Ledger, subject: str, receipt_ids: list[int]) -> None:
    assert receipt_ids
    for receipt_id in receipt_ids:
        with pytest.raises(ContentRefused, match="revoked"):
            await released_content(ledger.pool, receipt_id=receipt_id, subject=subject)


async def test_whole_subject_revoke_covers_closed_subscriptions(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    server = _server(fx)
    closed_uri, live_uri = f"demo://sec/closed/{uuid.uuid4().hex}", f"demo://sec/live/{uuid.uuid4().hex}"
    c1 = await fx.create(closed_uri, text="closed v1")
    l1 = await fx.create(live_uri, text="live v1")
    keys = {u: SubscriptionKey(subject=s, server=server.name, uri=u)
            for s, u in (("alice", closed_uri), ("alice", live_uri))}
    bob = SubscriptionKey(subject="bob", server=server.name, uri=live_uri)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        q = cfg.temporal.task_queue
        handles = {u: await start_subscription(temporal_client, k, task_queue=q) for u, k in keys.items()}
        h_bob = await start_subscription(temporal_client, bob, task_queue=q)
        await _wait_record(handles[closed_uri], lambda r: r.last_accepted_digest == c1["committed"]["digest"],
                           "c1")
        await _wait_record(handles[live_uri], lambda r: r.last_accepted_digest == l1["committed"]["digest"],
                           "l1")
        await _wait_record(h_bob, lambda r: r.last_accepted_digest == l1["committed"]["digest"], "bob l1")
        await fx.wait_subscribed(closed_uri)
        c2 = await fx.edit(closed_uri, text="closed v2")
        await _wait_record(handles[closed_uri], lambda r: r.last_accepted_digest == c2["committed"]["digest"],
                           "c2")
        receipt = await execute_update(handles[closed_uri], UPDATE_CLOSE, [CloseRequest(reason="test")],
                                       result_type=CloseReceipt)
        assert receipt.state == S.CLOSED
        closed_receipts = await _released_receipts(ledger, keys[closed_uri])
        assert len(closed_receipts) == 2
        # Before: the closed subscription's body is still released (the hole of issue 29 item 1 is the
        # revocation, not the close).
        got = await released_content(ledger.pool, receipt_id=closed_receipts[-1], subject="alice")
        assert got.body == b"closed v2"

        done = await revoke_subject(temporal_client, ledger, subject="alice", server=server.name, uri=None,
                                    reason="offboarded", wait=30)
        wf_closed, wf_live = keys[closed_uri].workflow_id, keys[live_uri].workflow_id
        assert set(done.ledger.covered) == {wf_closed, wf_live}
        assert done.ledger.revoked == [wf_live] and done.signalled == [wf_live]
        assert done.mirrored == [wf_live] and done.pending == []
        # Content refused for every receipt of the subject, the closed subscription's included.
        live_receipts = await _released_receipts(ledger, keys[live_uri])
        await _assert_refused(ledger, "alice", closed_receipts + live_receipts)
        # Every body of the subject purged; bob's copy of the same resource untouched.
        alice_digests = [c1["committed"]["digest"], c2["committed"]["digest"], l1["committed"]["digest"]]
        assert await _bodies(ledger, "alice", alice_digests) == 0
        assert await _bodies(ledger, "bob", [l1["committed"]["digest"]]) == 1
        bob_receipts = await _released_receipts(ledger, bob)
        assert (await released_content(ledger.pool, receipt_id=bob_receipts[-1],
                                       subject="bob")).body == b"live v1"
        # The outbox names the receipts, the closed subscription's too; the state CLOSED stays.
        for key in keys.values():
            events = await _revoked_events(ledger, key.workflow_id)
            assert len(events) == 1, events
            detail = events[0]["detail"]
            assert set(detail["receipt_ids"]) == {r.receipt_id for r in await ledger.reports.receipts(key)}
            assert detail["subject_revocation_id"] == done.ledger.subject_revocation_id
        assert set(done.ledger.receipt_ids) >= set(closed_receipts + live_receipts)
        assert (await ledger.load_fence(keys[closed_uri])).state == S.CLOSED
        assert (await ledger.load_fence(keys[live_uri])).state == S.REVOKED
        # Idempotent: a second revoke covers the same rows and writes no second event.
        again = await revoke_subject(temporal_client, ledger, subject="alice", server=server.name, uri=None,
                                     reason="again")
        assert (again.ledger.revoked == [] and again.ledger.outbox_ids == []
                and again.ledger.purged_bodies == 0)
        for key in keys.values():
            assert len(await _revoked_events(ledger, key.workflow_id)) == 1


async def test_revoke_with_the_worker_stopped_refuses_at_once(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    server = _server(fx)
    uri = f"demo://sec/down/{uuid.uuid4().hex}"
    v1 = await fx.create(uri, text="while the worker is down")
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        q = cfg.temporal.task_queue
        handle = await start_subscription(temporal_client, key, task_queue=q)
        await _wait_record(handle, lambda r: r.last_accepted_digest == v1["committed"]["digest"], "v1")
    receipts = await _released_receipts(ledger, key)
    assert (await released_content(ledger.pool, receipt_id=receipts[0], subject="alice")).body == \
        b"while the worker is down"
    # No worker runs: the ledger revokes by itself, before any workflow hears of it.
    done = await revoke_subject(temporal_client, ledger, subject="alice", server=server.name, uri=uri,
                                reason="offboarded", wait=0.5)
    assert done.signalled == [key.workflow_id] and done.pending == [key.workflow_id]
    await _assert_refused(ledger, "alice", receipts)
    assert await _bodies(ledger, "alice", [v1["committed"]["digest"]]) == 0
    assert (await ledger.load_fence(key)).state == S.REVOKED
    assert len(await _revoked_events(ledger, key.workflow_id)) == 1
    # The worker comes back: the workflow mirrors the ledger's revocation and finishes REVOKED.
    async with running_services(temporal_client, ledger, [server], task_queue=q):
        await _wait_record(temporal_client.get_workflow_handle(key.workflow_id),
                           lambda r: r.state == S.REVOKED, "the workflow mirrors the ledger's revocation")
    assert len(await _revoked_events(ledger, key.workflow_id)) == 1, ("the workflow's own revoke writes "
                                                                      "nothing twice")
    await _assert_refused(ledger, "alice", receipts)


async def test_read_in_flight_across_a_revoke_leaves_no_body(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    server = _server(fx)
    uri = f"demo://sec/inflight/{uuid.uuid4().hex}"
    v1 = await fx.create(uri, text="before")
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
        await _wait_record(handle, lambda r: r.last_accepted_digest == v1["committed"]["digest"], "v1")
        await fx.wait_subscribed(uri)
        issued = (await ledger.load_fence(key)).last_issued_ordinal
        await fx.faults(read_delay_ms={uri: 3000})
        v2 = await fx.edit(uri, text="read in flight")

        async def in_flight() -> bool:
            rows = await ledger_rows(ledger, "SELECT count(*) FROM read_requests r JOIN subscriptions s"
                                     " ON s.workflow_id = r.workflow_id WHERE s.subject=%s AND s.server=%s "
                                     "AND s.uri=%s AND r.ordinal > %s AND r.completed_at IS NULL",
                                     key.subject, key.server, key.uri, issued)
            return int(rows[0][0]) > 0

        await eventually(in_flight, what="the read of v2 allocated and held by the server")
        done = await revoke_subject(temporal_client, ledger, subject="alice", server=server.name, uri=None,
                                    reason="offboarded")
        assert done.ledger.revoked == [key.workflow_id]

        async def judged() -> bool:
            return not await in_flight()

        await eventually(judged, timeout=30, what="the held read judged")
        final = await temporal_client.get_workflow_handle(key.workflow_id,
                                                          result_type=ResourceSubscriptionV1).result()
        assert final.state == S.REVOKED
    # The late read reached the ledger after the purge: no body of it, nor of v1, is stored.
    assert await _bodies(ledger, "alice", [v1["committed"]["digest"], v2["committed"]["digest"]]) == 0
    assert [r.content_digest for r in await ledger.reports.receipts(key)] == [v1["committed"]["digest"]]


async def test_a_staged_body_is_stored_only_by_a_releasing_accept(ledger: Ledger) -> None:
    """A read alone (``McpSessionActivities.read``): its body waits in ``content_pending``; the accept stores
    it when it releases the read, drops it otherwise; a revocation drops what is still waiting."""
    from mcpsync.activities.ledger.content import ReadBody
    from tests.integration.test_ledger import _accept, _active, _issue

    key = await _active(ledger, f"demo://sec/staged/{uuid.uuid4().hex}")
    ok = ReadBody(digest="sha256:staged-ok", mime_type="text/plain", kind="text", body=b"ok")
    first = await _issue(ledger, key)
    await ledger.content.stage(key, first, ok)
    assert await _bodies(ledger, key.subject, [ok.digest]) == 0, "nothing is stored before the accept"
    assert await _accept(ledger, key, first, ok.digest) == "ACCEPTED"
    assert await ledger.content.get_content(key.subject, ok.digest) == b"ok"
    # A read older than the current version: STALE, its staged body is dropped, not stored.
    late, newer = await _issue(ledger, key), await _issue(ledger, key)
    stale = ReadBody(digest="sha256:staged-stale", mime_type="text/plain", kind="text", body=b"stale")
    assert await _accept(ledger, key, newer, ok.digest) == "UNCHANGED"
    await ledger.content.stage(key, late, stale)
    assert await _accept(ledger, key, late, stale.digest) == "STALE"
    assert await _bodies(ledger, key.subject, [stale.digest]) == 0
    # A read in flight across a revocation: staged after the purge, judged after it; nothing stays.
    held = await _issue(ledger, key)
    await ledger.fence.revoke_subject(key.subject, key.server, None, reason="test",
                                      effective_at=datetime.now(UTC))
    late_body = ReadBody(digest="sha256:staged-late", mime_type="text/plain", kind="text", body=b"late")
    await ledger.content.stage(key, held, late_body)
    assert await _accept(ledger, key, held, late_body.digest) not in ("ACCEPTED", "UNCHANGED")
    assert await _bodies(ledger, key.subject, [ok.digest, late_body.digest]) == 0
    rows = await ledger_rows(ledger, "SELECT count(*) FROM content_pending WHERE subject=%s", key.subject)
    assert rows[0][0] == 0
    # And a body parked before a revocation is purged by it.
    await ledger.content.stage(key, held + 1, late_body)
    await ledger.fence.revoke_subject(key.subject, key.server, key.uri, reason="again",
                                      effective_at=datetime.now(UTC))
    rows = await ledger_rows(ledger, "SELECT count(*) FROM content_pending WHERE subject=%s", key.subject)
    assert rows[0][0] == 0
