"""Readable subscription workflow ids and the compatibility rule for legacy ones.

Unit: ``uri_slug`` and ``SubscriptionKey.workflow_id`` give a valid, bounded, deterministic id
for any URI the key accepts (unicode, huge, percent-encoded, dot segments, empty path).
Real stack (Temporal dev server, PostgreSQL, the fixture MCP server, the worker, the real CLI):
a subscription started under the legacy id keeps receiving ingress notifications and is found by
``mcpsync subscribe`` / ``status`` / ``close``; a new one runs under the readable id, recorded
once in its ledger row."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import SubscriptionKey, TriggerReason
from tests.conftest import eventually, ledger_rows
from tests.e2e.test_cli import CliStack, cli_stack

SAFE = re.compile(r"^[a-z0-9](?:[a-z0-9-]|\.(?!\.))*[a-z0-9]$|^[a-z0-9]$")


def _key(uri: str, *, subject: str = "alice", server: str = "demo") -> SubscriptionKey:
    return SubscriptionKey(subject=subject, server=server, uri=uri)


# --- unit -------------------------------------------------------------------------------------


async def _describe_status(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    try:
        return (await client.get_workflow_handle(workflow_id).describe()).status
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def test_a_legacy_id_subscription_keeps_its_routes(temporal_client: Client, ledger: Ledger,
                                                         temporal_server: TemporalDevServer,
                                                         fx: FixtureProcess,
                                                         database_url: str, tmp_path: Path) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        uri = f"demo://ids/legacy-{uuid.uuid4().hex[:8]}"
        key = SubscriptionKey(subject="alice", server=st.server.name, uri=uri)
        first = await fx.create(uri, text="v1")
        # A subscription as a worker before readable ids started it: under the legacy id, explicitly.
        handle = await start_subscription(temporal_client, key, task_queue=st.task_queue,
                                          workflow_id=key.legacy_workflow_id)
        assert handle.id == key.legacy_workflow_id != key.workflow_id

        async def accepted(digest: str) -> bool:
            return (await ledger.load_fence(key)).last_accepted_digest == digest

        await eventually(lambda: accepted(first["committed"]["digest"]), timeout=30,
                         what="first version accepted")
        # The ledger recorded the id the workflow really runs under, once.
        assert await ledger_rows(ledger,
                                 "SELECT workflow_id FROM subscriptions WHERE subject=%s AND server=%s"
                                 " AND uri=%s", "alice", st.server.name, uri) == [(key.legacy_workflow_id,)]
        assert await ledger.fence.workflow_id_of(key) == key.legacy_workflow_id

        # Ingress: the server's notification reaches the legacy workflow, which reads the new version.
        second = await fx.edit(uri, text="v2")
        await eventually(lambda: accepted(second["committed"]["digest"]), timeout=30, what="notified version")
        receipts = await ledger.reports.receipts(key)
        assert [r.trigger for r in receipts
                if r.status == AcceptVerdict.ACCEPTED][-1] == TriggerReason.UPDATED
        assert not await ledger_rows(ledger, "SELECT 1 FROM audit WHERE kind IN ('NOTIFICATION_NO_WORKFLOW',"
                                     " 'WORKFLOW_ID_MISMATCH') AND uri=%s", uri)

        # The CLI: subscribe joins the legacy workflow (no second one), status and close find it.
        joined = await st.cli("subscribe", *st.key_args(uri), "--json")
        assert joined.code == 0, joined.err
        assert joined.json()["workflow_id"] == key.legacy_workflow_id
        assert await _describe_status(temporal_client, key.workflow_id) is None, \
            "no workflow under the new id"
        status = await st.cli("status", *st.key_args(uri), "--json")
        assert status.code == 0 and status.json()["last_accepted_digest"] == second["committed"]["digest"]
        described = await st.cli("describe", *st.key_args(uri))
        assert described.code == 0 and f"workflow: {key.legacy_workflow_id}" in described.out
        closed = await st.cli("close", *st.key_args(uri), "--json")
        assert closed.code == 0, closed.err
        assert closed.json()["state"] == "CLOSED"
        assert await _describe_status(temporal_client,
                                      key.legacy_workflow_id) == WorkflowExecutionStatus.COMPLETED


async def test_a_new_subscription_gets_the_readable_id(temporal_client: Client, ledger: Ledger,
                                                       temporal_server: TemporalDevServer, fx: FixtureProcess,
                                                       database_url: str, tmp_path: Path) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        name = f"Café Menu {uuid.uuid4().hex[:6]}.TXT"
        uri = f"demo://ids/{name.replace(' ', '%20')}"
        key = SubscriptionKey(subject="alice", server=st.server.name, uri=uri)
        first = await fx.create(uri, text="v1")
        r = await st.cli("subscribe", *st.key_args(uri))
        assert r.code == 0, r.err
        assert key.workflow_id.startswith(f"mcpsync-sub/{st.server.name}/alice/demo-ids-caf-menu-")
        assert r.out.strip() == f"subscribed: workflow {key.workflow_id}"

        async def accepted() -> bool:
            return (await ledger.load_fence(key)).last_accepted_digest == first["committed"]["digest"]

        await eventually(accepted, timeout=30, what="first version accepted")
        assert await ledger.fence.workflow_id_of(key) == key.workflow_id
        second = await fx.edit(uri, text="v2")
        await eventually(lambda: _status_digest(st, uri, second["committed"]["digest"]), timeout=30,
                         interval=0.5, what="notified version, seen by 'mcpsync status'")
        closed = await st.cli("close", *st.key_args(uri))
        assert closed.code == 0 and closed.out.startswith("CLOSED: close epoch"), closed.out + closed.err
        assert await _describe_status(temporal_client, key.workflow_id) == WorkflowExecutionStatus.COMPLETED


async def _status_digest(st: CliStack, uri: str, digest: str) -> bool:
    s = await st.cli("status", *st.key_args(uri), "--json")
    assert s.code == 0, s.err
    return bool(s.json()["last_accepted_digest"] == digest)
