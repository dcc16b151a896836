"""Subjects, revocation and guardrails on the real stack.

Two subjects (alice, bob) reach one fixture server with their own bearer tokens; routing,
content and revocation stay per subject. Tokens come from the environment and never appear
in Temporal history.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.main.revocation import revoke
from mcpsync.workflows.names import QUERY_SUBSCRIPTION, SIGNAL_CATALOG_RECONCILED
from mcpsync.workflows.records.subscription import CatalogObservation, SubscriptionKey, SubscriptionState
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from tests.conftest import eventually, running_services, unique
from tests.e2e.conftest import audited, ingress_idle, notifications_seen, reads_settled
from tests.e2e.test_e2e_subscription import _wait_record

S = SubscriptionState
TOKENS = {"alice": f"tok-alice-{uuid.uuid4().hex}", "bob": f"tok-bob-{uuid.uuid4().hex}"}


@pytest.fixture
async def fx(tmp_path: Path) -> AsyncIterator[FixtureProcess]:
    proc = await FixtureProcess.start_http(tmp_path, seed="none", tokens=TOKENS, require_auth=True)
    try:
        yield proc
    finally:
        await proc.stop()


@pytest.fixture
def token_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    names = {subject: f"MCPSYNC_TEST_TOKEN_{subject.upper()}" for subject in TOKENS}
    for subject, var in names.items():
        monkeypatch.setenv(var, TOKENS[subject])
    return names


def _server(fx: FixtureProcess, token_env: dict[str, str], **kw: Any) -> ServerConfig:
    return ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=["alice", "bob"],
                        token_env=token_env, **kw)


async def _start(client: Client, server: ServerConfig, subject: str, uri: str, queue: str) -> tuple[
        SubscriptionKey, WorkflowHandle]:
    key = SubscriptionKey(subject=subject, server=server.name, uri=uri)
    return key, await start_subscription(client, key, task_queue=queue)


async def _outbox(ledger: Ledger, key: SubscriptionKey) -> list[dict[str, Any]]:
    return [r for r in await ledger.reports.outbox_after(0, 10_000) if r["workflow_id"] == key.workflow_id]


async def test_visibility_and_routing_stay_per_subject(temporal_client: Client, ledger: Ledger,
                                                       fx: FixtureProcess, token_env: dict[str, str]) -> None:
    server = _server(fx, token_env)
    shared, bobs = f"demo://shared/{uuid.uuid4().hex}", f"demo://bob/{uuid.uuid4().hex}"
    s1 = await fx.create(shared, text="for both")
    b1 = await fx.create(bobs, text="bob only", visible_to=["bob"])
    async with running_services(temporal_client, ledger, [server]) as cfg:
        q = cfg.temporal.task_queue
        a_shared, ha_shared = await _start(temporal_client, server, "alice", shared, q)
        a_bobs, ha_bobs = await _start(temporal_client, server, "alice", bobs, q)
        b_bobs, hb_bobs = await _start(temporal_client, server, "bob", bobs, q)
        await _wait_record(ha_shared, lambda r: r.last_accepted_digest == s1["committed"]["digest"], "alice")
        await _wait_record(hb_bobs, lambda r: r.last_accepted_digest == b1["committed"]["digest"], "bob")
        # A URI hidden from alice yields nothing for alice: not found, no version, no content.
        await _wait_record(ha_bobs, lambda r: r.state == S.TOMBSTONE_PENDING, "hidden from alice")
        assert await _outbox(ledger, a_bobs) == []
        assert await ledger.content.get_content("alice", b1["committed"]["digest"]) is None
        alice_reads = await ledger.reports.read_count(a_bobs)
        alice_seen = await notifications_seen(ledger, a_bobs)
        # An update of bob's resource reaches bob's session only and causes no read for alice.
        await fx.wait_subscribed(bobs)
        b2 = await fx.edit(bobs, text="bob only, v2")
        await _wait_record(hb_bobs, lambda r: r.last_accepted_digest == b2["committed"]["digest"], "bob v2")
        # Witness before the absence: every notification the server sent (to either subject's session)
        # reached the ingress and was settled, and no read of alice's subscription is in flight or owed.
        await eventually(lambda: ingress_idle(ledger, fx, server.name), what="every notification routed")
        await eventually(lambda: reads_settled(ledger, a_bobs), what="no read owed to alice")
        assert await ledger.reports.read_count(a_bobs) == alice_reads
        assert await notifications_seen(ledger, a_bobs) == alice_seen, "bob's update never named alice's row"
        history = (await ha_shared.fetch_history()).to_json() + (await hb_bobs.fetch_history()).to_json()
    for token in TOKENS.values():
        assert token not in history, "credentials never enter Temporal history"


async def _more_reads(ledger: Ledger, key: SubscriptionKey, before: int) -> bool:
    return await ledger.reports.read_count(key) > before


async def _revoked(ledger: Ledger, key: SubscriptionKey) -> dict[str, Any] | None:
    rows = [r for r in await _outbox(ledger, key) if r["event_type"] == "revoked"]
    return rows[-1] if rows else None


async def _revocation_latency(ledger: Ledger, key: SubscriptionKey) -> float:
    async with ledger.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT EXTRACT(EPOCH FROM (o.created_at - r.effective_at)) FROM revocations r"
            " JOIN outbox o ON o.outbox_id = r.outbox_id WHERE r.workflow_id=%s", (key.workflow_id,))
        row = await cur.fetchone()
    assert row is not None
    return float(row[0])


async def test_revocation_three_ways_purges_content_and_names_every_receipt(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess, token_env: dict[str, str]) -> None:
    server = _server(fx, token_env)
    uris = {way: f"demo://revoke/{way}/{uuid.uuid4().hex}" for way in ("denied", "catalog", "platform")}
    firsts = {way: await fx.create(uri, text=f"{way} v1") for way, uri in uris.items()}
    async with running_services(temporal_client, ledger, [server]) as cfg:
        subs = {way: await _start(temporal_client, server, "alice", uri, cfg.temporal.task_queue)
                for way, uri in uris.items()}
        for way, (_, h) in subs.items():
            await _wait_record(h, lambda r, d=firsts[way]["committed"]["digest"]: r.last_accepted_digest == d,
                               way)
            await fx.wait_subscribed(uris[way])
        # Two versions each, so the revoked event must name several receipts.
        for way, uri in uris.items():
            v2 = await fx.edit(uri, text=f"{way} v2")
            await _wait_record(subs[way][1],
                               lambda r, d=v2["committed"]["digest"]: r.last_accepted_digest == d,
                               f"{way} v2")
        digests = {way: (await ledger.load_fence(k)).last_accepted_digest for way, (k, _) in subs.items()}
        for k, _ in subs.values():
            assert await ledger.content.current_content(k) is not None

        revoking_since = time.monotonic()
        # 1. the server denies the next read
        await fx.faults(deny_reads={uris["denied"]: ["alice"]})
        await fx.notify(uris["denied"])
        # 2. a reconciled catalog no longer lists it for alice
        rec = await subs["catalog"][1].query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
        # An unproven catalog cannot revoke: it only earns a verification read (the URI is still readable).
        reads = await ledger.reports.read_count(subs["catalog"][0])
        await subs["catalog"][1].signal(SIGNAL_CATALOG_RECONCILED, CatalogObservation(
            uri=uris["catalog"], listed=False, scan_id="scan-u", snapshot_status="SNAPSHOT_UNPROVEN",
            session_generation=rec.session_generation))
        await eventually(lambda: _more_reads(ledger, subs["catalog"][0], reads), what="verification read")
        assert (await subs["catalog"][1].query(QUERY_SUBSCRIPTION,
                                               result_type=ResourceSubscriptionV1)).state \
            in (S.ACTIVE, S.READ_PENDING, S.UPDATE_SEEN)
        await subs["catalog"][1].signal(SIGNAL_CATALOG_RECONCILED, CatalogObservation(
            uri=uris["catalog"], listed=False, scan_id="scan-p", snapshot_status="SNAPSHOT_PROVEN",
            session_generation=rec.session_generation))
        # 3. the platform says so
        ids = await revoke(temporal_client, ledger, subject="alice", server=server.name, uri=uris["platform"],
                           reason="offboarded")
        assert ids == [subs["platform"][0].workflow_id]

        for way, (k, h) in subs.items():
            await _wait_record(h, lambda r: r.state == S.REVOKED, f"revoked via {way}")
            # effective_at (when access ended) -> its outbox row, as the revocation metric measures it:
            # after the revocation began and no longer than the test has waited for it since.
            latency, waited = await _revocation_latency(ledger, k), time.monotonic() - revoking_since
            assert 0 < latency <= waited, \
                f"{way}: revocation latency {latency:.3f} s, {waited:.3f} s since it began"
            event = await eventually(lambda k=k: _revoked(ledger, k), what=f"revoked outbox row ({way})")
            receipts = [r.receipt_id for r in await ledger.reports.receipts(k)]
            detail = event["detail"] if isinstance(event["detail"], dict) else json.loads(event["detail"])
            assert set(detail["receipt_ids"]) == set(receipts) and len(receipts) >= 2
            assert await ledger.content.current_content(k) is None, "nothing is served after revocation"
            assert await ledger.content.get_content("alice", digests[way] or "") is None, "cached body purged"
        # After revocation nothing new is accepted for it, whatever the server says.
        platform = subs["platform"][0]
        reads = await ledger.reports.read_count(platform)
        served = (await fx.stats())["reads"].get(uris["platform"], 0)
        seen = await notifications_seen(ledger, platform)
        await fx.edit(uris["platform"], text="after revocation")
        # Witness that an update after the revocation reached the reconciler and was dealt with: pushed
        # at alice's session whether or not it is still subscribed, recorded on the ledger row, and
        # every notification settled (the one for the ended run audited NOTIFICATION_NO_WORKFLOW).
        await fx.notify(uris["platform"], unsolicited=True)
        await eventually(lambda: ingress_idle(ledger, fx, server.name), what="every notification routed")
        assert await notifications_seen(ledger, platform) > seen
        assert await audited(ledger, "NOTIFICATION_NO_WORKFLOW", platform.workflow_id) >= 1
        assert await ledger.reports.read_count(platform) == reads
        assert (await fx.stats())["reads"].get(uris["platform"], 0) == served, \
            "no resources/read after revocation"


async def test_guardrails_reject_oversize_and_binary_declared_as_text(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess, token_env: dict[str, str]) -> None:
    server = _server(fx, token_env, release_max_bytes=2000)
    big, binary = f"demo://g/big/{uuid.uuid4().hex}", f"demo://g/bin/{uuid.uuid4().hex}"
    f_big = await fx.create(big, text="small and fine")
    f_bin = await fx.create(binary, text="plain text")
    async with running_services(temporal_client, ledger, [server]) as cfg:
        k_big, h_big = await _start(temporal_client, server, "alice", big, cfg.temporal.task_queue)
        k_bin, h_bin = await _start(temporal_client, server, "alice", binary, cfg.temporal.task_queue)
        await _wait_record(h_big, lambda r: r.last_accepted_digest == f_big["committed"]["digest"], "big v1")
        await _wait_record(h_bin, lambda r: r.last_accepted_digest == f_bin["committed"]["digest"], "bin v1")
        for uri in (big, binary):
            await fx.wait_subscribed(uri)
        huge = await fx.edit(big, text="x" * 5000)
        bad = await fx.edit(binary, blob=b"\xff\xfe\x00\x81binary", mime_type="text/plain")
        for k, h, rejected in ((k_big, h_big, huge), (k_bin, h_bin, bad)):
            rec = await _wait_record(h, lambda r: "guardrail" in r.detail, "guardrail rejection")
            statuses = {r.content_digest: r.status.value for r in await ledger.reports.receipts(k)}
            assert statuses[rejected["committed"]["digest"]] == "GUARDRAIL_REJECTED"
            assert [r["content_digest"] for r in await _outbox(ledger, k)] == [
                (f_big if k is k_big else f_bin)["committed"]["digest"]], "a rejection publishes nothing"
            assert rec.last_accepted_digest == (f_big if k is k_big else f_bin)["committed"]["digest"]
            assert await ledger.content.get_content("alice", rejected["committed"]["digest"]) is None
        reasons = " ".join(r["detail"]["reason"]
                           for r in await ledger.reports.audit_rows("GUARDRAIL_REJECTED", limit=50)
                           if r["workflow_id"] in (k_big.workflow_id, k_bin.workflow_id))
        assert "size_limit" in reasons and "text_decodes_as_declared" in reasons
        # A later good version is released again.
        good = await fx.edit(big, text="small again")
        await _wait_record(h_big, lambda r: r.last_accepted_digest == good["committed"]["digest"],
                           "recovered")


def test_tokens_are_read_from_the_environment_only(token_env: dict[str, str]) -> None:
    assert all(os.environ[v] == TOKENS[s] for s, v in token_env.items())
