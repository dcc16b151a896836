"""worker/stack/common.py against real processes: Temporal dev server, time-skipping server, PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from mcpsync.activities.ledger import Ledger
from mcpsync.worker.stack.common import REPO_ROOT, PortInUseError, StackError, free_port, state_dir
from mcpsync.worker.stack.postgres import EmbeddedPostgres
from mcpsync.worker.stack.temporal import (
    SEARCH_ATTRIBUTE_TYPES,
    TemporalDevServer,
    ensure_search_attributes,
    load_search_attributes,
    temporal_cli_path,
    temporal_test_server_path,
)
from tests.conftest import eventually, running_services, unique

EXPECTED_ATTRIBUTES = {
    "McpServer": "Keyword",
    "McpUri": "Keyword",
    "McpSubject": "Keyword",
    "McpState": "Keyword",
    "McpCatalogState": "Keyword",
    "McpAnswerState": "Keyword",
    "McpSessionGeneration": "Int",
    "McpWatermark": "Int",
    "McpSubscriptionGeneration": "Int",
}


def test_paths_and_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert temporal_cli_path().is_file() and os.access(temporal_cli_path(), os.X_OK)
    assert temporal_test_server_path().is_file()
    assert load_search_attributes() == EXPECTED_ATTRIBUTES
    monkeypatch.delenv("MCPSYNC_STATE_DIR", raising=False)
    assert state_dir() == REPO_ROOT / ".state"
    monkeypatch.setenv("MCPSYNC_STATE_DIR", str(tmp_path / "s"))
    assert state_dir() == tmp_path / "s"
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # really free


async def _ui_status(url: str) -> int:
    deadline = time.monotonic() + 5
    while True:
        try:
            with await asyncio.to_thread(urllib.request.urlopen, url, timeout=2) as resp:
                return int(resp.status)
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_dev_server_attributes_restart_and_kill_keep_workflow(tmp_path: Path) -> None:
    server = await TemporalDevServer.start(tmp_path, port=0, ui_port=0)
    try:
        assert server.running and server.port > 0 and server.ui_port > 0
        assert server.address == f"127.0.0.1:{server.port}"
        assert server.ui_url == f"http://127.0.0.1:{server.ui_port}"
        assert server.startup_seconds < 30
        assert await _ui_status(server.ui_url) == 200

        client = await Client.connect(server.address)
        listing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace="default")
        )
        custom = dict(listing.custom_attributes)
        for name, kind in EXPECTED_ATTRIBUTES.items():
            assert custom.get(name) == SEARCH_ATTRIBUTE_TYPES[kind], (name, custom)
        assert await ensure_search_attributes(client, "default") == []  # already there: no-op
        with pytest.raises(StackError, match="wrong type"):
            await ensure_search_attributes(client, "default", {"McpUri": "Int"})

        workflow_id = f"stack-{uuid.uuid4()}"
        await client.start_workflow(
            "NobodyImplementsThisWorkflow", id=workflow_id, task_queue="nobody-polls-this"
        )

        assert await server.stop() is not None
        assert not server.running
        assert not (tmp_path / "temporal.sqlite.pid").exists()
        await server.restart()
        client = await Client.connect(server.address)
        desc = await client.get_workflow_handle(workflow_id).describe()
        assert desc.status == WorkflowExecutionStatus.RUNNING

        await server.kill()  # crash: SIGKILL
        await server.restart()
        client = await Client.connect(server.address)
        desc = await client.get_workflow_handle(workflow_id).describe()
        assert desc.status == WorkflowExecutionStatus.RUNNING
        assert (tmp_path / "temporal.sqlite").is_file() and (tmp_path / "temporal.log").is_file()
    finally:
        await server.stop()


async def test_dev_server_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(PortInUseError, match=f"gRPC port {port}.*already in use"):
            await TemporalDevServer.start(tmp_path, port=port, ui_port=0)
        with pytest.raises(PortInUseError, match=f"UI port {port}.*already in use"):
            await TemporalDevServer.start(tmp_path, port=0, ui_port=port)


def _gone(pid: int) -> bool:
    """Exited: no such process, or a zombie not yet reaped by whoever adopted it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


async def test_orphaned_dev_server_is_replaced(tmp_path: Path) -> None:
    """An owner that dies by SIGKILL leaves the server running; the next start cleans it up."""
    script = textwrap.dedent(
        f"""
        import asyncio, sys, time
        from pathlib import Path
        from mcpsync.worker.stack.temporal import TemporalDevServer
        async def main():
            s = await TemporalDevServer.start(Path({str(tmp_path)!r}), port=0, ui_port=0)
            print(s.pid, flush=True)
            # Models a long-lived owner process: it keeps running until the test SIGKILLs it (the
            # test kills it within seconds; 120 s only bounds a leak if the test itself dies).
            await asyncio.sleep(120)
        asyncio.run(main())
        """
    )
    owner = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT
    )
    try:
        assert owner.stdout is not None
        orphan_pid = int(await asyncio.wait_for(owner.stdout.readline(), 30))
        record = json.loads((tmp_path / "temporal.sqlite.pid").read_text())
        assert record["pid"] == orphan_pid and record["owner_pid"] == owner.pid
        with pytest.raises(StackError, match="already running"):  # owner alive: refuse
            await TemporalDevServer.start(tmp_path, port=0, ui_port=0)
    finally:
        owner.kill()
        await owner.wait()
    assert not _gone(orphan_pid)  # still serving: orphaned
    server = await TemporalDevServer.start(tmp_path, port=0, ui_port=0)
    try:
        assert _gone(orphan_pid)
        assert server.pid != orphan_pid
    finally:
        await server.stop()


async def test_ensure_search_attributes_on_time_skipping_server() -> None:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(temporal_test_server_path())
    )
    try:
        added = await ensure_search_attributes(env.client, env.client.namespace)
        assert sorted(added) == sorted(EXPECTED_ATTRIBUTES)
        await ensure_search_attributes(env.client, env.client.namespace)  # idempotent
    finally:
        await env.shutdown()


async def test_embedded_postgres_start_query_restart(own_state_dir: Path) -> None:
    pg = await EmbeddedPostgres.start(own_state_dir)
    try:
        assert pg.pgdata.name == "pgdata" and pg.pgdata.parent.name == own_state_dir.name
        assert pg.url.startswith("postgresql://") and pg.database == "mcpsync"
        with psycopg.connect(pg.url) as conn:
            assert conn.execute("select 1, current_database()").fetchone() == (1, "mcpsync")
            conn.execute("create table kept (v int)")
            conn.execute("insert into kept values (42)")
    finally:
        await pg.stop()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(pg.url, connect_timeout=2).close()

    pg = await EmbeddedPostgres.start(own_state_dir)
    try:
        with psycopg.connect(pg.url) as conn:
            assert conn.execute("select v from kept").fetchone() == (42,)
        assert pg.admin_url.split("?")[0].endswith("/postgres")
    finally:
        await pg.stop()


def test_index_value_types_cover_cli_names() -> None:
    assert set(SEARCH_ATTRIBUTE_TYPES) == {
        "Text",
        "Keyword",
        "Int",
        "Double",
        "Bool",
        "Datetime",
        "KeywordList",
    }
    assert SEARCH_ATTRIBUTE_TYPES["Int"] == IndexedValueType.INDEXED_VALUE_TYPE_INT


async def test_the_main_worker_registers_new_search_attributes_on_its_namespace(
        temporal_server: TemporalDevServer, ledger: Ledger) -> None:
    # An upgrade that brings a search attribute (McpCatalogState, McpAnswerState) must not leave
    # workflows failing their upserts on a cluster that predates it: the main worker registers them.
    namespace = unique("ns")
    admin = await Client.connect(temporal_server.address)
    await admin.workflow_service.register_namespace(RegisterNamespaceRequest(
        namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400)))

    async def custom() -> set[str]:
        listing = await admin.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace))
        return set(listing.custom_attributes)

    assert "McpCatalogState" not in await custom()
    client = await Client.connect(temporal_server.address, namespace=namespace,
                                  data_converter=pydantic_data_converter)
    async with running_services(client, ledger, [], namespace=namespace):
        await eventually(lambda: _has(custom, {"McpCatalogState", "McpAnswerState", "McpState"}),
                         what="search attributes registered on the new namespace")


async def _has(listing, names: set[str]) -> bool:  # type: ignore[no-untyped-def]
    return names <= await listing()
