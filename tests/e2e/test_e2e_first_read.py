"""Update-with-Start of ``first_read`` on real components (Temporal dev server, PostgreSQL, the
fixture MCP server): one call starts a subscription and answers its first receipt.

- A new subscription answers the record whose receipt is the ledger's and whose digest is the
  fixture's committed one; a second call joins the running workflow and answers from its state
  (same run, same receipt, no new read).
- A URI the server does not have answers TOMBSTONE_PENDING (no read will come until a catalog).
- A subscription recorded under the legacy workflow id is answered under that id.
- ``mcpsync subscribe --wait``: one line per URI with verdict, receipt and digest; no worker
  answering within ``--timeout`` is exit 6, one error line.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription, start_subscription_first_read
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState
from tests.conftest import eventually, running_services, unique
from tests.e2e.test_cli import _one_error_line, cli_stack, run_cli


async def test_update_with_start_answers_the_first_receipt(temporal_client: Client, ledger: Ledger,
                                                           fx: FixtureProcess) -> None:
    server = ServerConfig(name=unique("fr"), transport="http", url=fx.mcp_url, subjects=["alice"])
    uri = f"demo://first-read/{uuid.uuid4().hex[:8]}"
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    created = await fx.create(uri, text="first version", mime_type="text/plain")
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handle, record = await start_subscription_first_read(temporal_client, key,
                                                             task_queue=cfg.temporal.task_queue)
        assert handle.id == key.workflow_id
        assert record.state == SubscriptionState.ACTIVE and record.last_verdict == AcceptVerdict.ACCEPTED
        assert record.last_accepted_digest == created["committed"]["digest"]
        [receipt] = await ledger.reports.receipts(key)
        assert record.last_receipt_id == receipt.receipt_id \
            and receipt.content_digest == record.last_accepted_digest

        # Running already: joined (same run), answered from its state without another read.
        reads = await ledger.reports.read_count(key)
        again, second = await start_subscription_first_read(temporal_client, key,
                                                            task_queue=cfg.temporal.task_queue)
        assert again.result_run_id == handle.result_run_id
        assert second.last_receipt_id == record.last_receipt_id
        assert await ledger.reports.read_count(key) == reads

        # A URI the server does not have: the first read is judged not-found, and nothing more comes.
        gone = SubscriptionKey(subject="alice", server=server.name,
                               uri=f"demo://first-read/missing-{uuid.uuid4().hex[:8]}")
        _, missing = await start_subscription_first_read(temporal_client, gone,
                                                         task_queue=cfg.temporal.task_queue)
        assert missing.state == SubscriptionState.TOMBSTONE_PENDING
        assert missing.last_verdict == AcceptVerdict.TOMBSTONE_PENDING \
            and missing.last_accepted_digest is None
        for k in (key, gone):
            await temporal_client.get_workflow_handle(k.workflow_id).terminate("test done")


async def test_a_legacy_id_subscription_is_answered_under_its_id(temporal_client: Client, ledger: Ledger,
                                                                 fx: FixtureProcess) -> None:
    server = ServerConfig(name=unique("fr"), transport="http", url=fx.mcp_url, subjects=["alice"])
    uri = f"demo://first-read/legacy-{uuid.uuid4().hex[:8]}"
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    created = await fx.create(uri, text="v1")
    async with running_services(temporal_client, ledger, [server]) as cfg:
        legacy = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue,
                                          workflow_id=key.legacy_workflow_id)

        async def recorded() -> bool:
            return await ledger.fence.workflow_id_of(key) == key.legacy_workflow_id

        await eventually(recorded, timeout=30, what="the legacy id in the ledger row")
        handle, record = await start_subscription_first_read(
            temporal_client, key, task_queue=cfg.temporal.task_queue,
            workflow_id=await ledger.fence.workflow_id_of(key))
        assert handle.id == key.legacy_workflow_id and handle.result_run_id == legacy.result_run_id
        assert record.last_accepted_digest == created["committed"]["digest"]
        try:
            await temporal_client.get_workflow_handle(key.workflow_id).describe()
            raise AssertionError("a second workflow under the readable id")
        except RPCError as err:
            assert err.status == RPCStatusCode.NOT_FOUND
        await legacy.terminate("test done")


async def test_cli_subscribe_wait_prints_each_first_receipt(temporal_client: Client, ledger: Ledger,
                                                            temporal_server: TemporalDevServer,
                                                            fx: FixtureProcess,
                                                            database_url: str, tmp_path: Path) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        tag = uuid.uuid4().hex[:8]
        a, b, missing = f"demo://cli/wait-{tag}/a", f"demo://cli/wait-{tag}/b", f"demo://cli/wait-{tag}/none"
        digests = {u: (await fx.create(u, text=f"{u} v1"))["committed"]["digest"] for u in (a, b)}
        r = await st.cli("subscribe", "--server", st.server.name, "--subject", "alice", "--uri", a, b,
                         missing, "--wait", "--timeout", "45")
        assert r.code == 0 and r.err == "", r.err
        lines = r.out.splitlines()
        for line, uri in zip(lines[:2], (a, b), strict=True):
            assert line.startswith(f"{uri}: ACCEPTED receipt ") \
                and f" digest {digests[uri]} state ACTIVE" in line
        assert lines[2].startswith(f"{missing}: TOMBSTONE_PENDING receipt ") \
            and "state TOMBSTONE_PENDING" in lines[2]
        assert len(lines) == 3

        # One URI, JSON: the record, with the workflow id; a subscription running already answers at once.
        r = await st.cli("subscribe", *st.key_args(a), "--wait", "--json")
        assert r.code == 0, r.err
        doc = r.json()
        key = SubscriptionKey(subject="alice", server=st.server.name, uri=a)
        assert doc["workflow_id"] == key.workflow_id and doc["last_accepted_digest"] == digests[a]
        assert doc["last_verdict"] == "ACCEPTED" \
            and doc["last_receipt_id"] == (await ledger.reports.receipts(key))[-1].receipt_id
        for uri in (a, b, missing):
            closed = await st.cli("close", *st.key_args(uri))
            assert closed.code == 0, closed.err


async def test_cli_subscribe_wait_without_a_worker_is_exit_6(temporal_client: Client,
                                                              temporal_server: TemporalDevServer,
                                                              tmp_path: Path) -> None:
    config = tmp_path / "mcpsync.toml"
    config.write_text(f'[temporal]\naddress = "{temporal_server.address}"\ntask_queue ='
                      f' "{unique("no-worker")}"\n'
                      '[[servers]]\nname = "docs"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n')
    uri = f"demo://cli/{uuid.uuid4().hex[:8]}"
    workflow_id = SubscriptionKey(subject="anonymous", server="docs", uri=uri).workflow_id
    try:
        r = await run_cli("--config", str(config), "subscribe", "--server", "docs", "--uri", uri, "--wait",
                          "--timeout", "2")
        assert r.code == 6 and r.out == "", r.err
        assert f"no first read judged within 2 s in workflow {workflow_id}" in _one_error_line(r)
        # The subscription was started all the same (it keeps running; a worker would serve it).
        status = (await temporal_client.get_workflow_handle(workflow_id).describe()).status
        assert status == WorkflowExecutionStatus.RUNNING
    finally:
        await temporal_client.get_workflow_handle(workflow_id).terminate("test done")
