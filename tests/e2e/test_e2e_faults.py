"""Walking-skeleton fault cases on the real stack: duplicates, unknown URIs, history hygiene,
a worker killed mid-stream, and bad input that must fail clearly."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import uuid
from contextlib import suppress
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.ingress.session_host import SessionHost, SessionOpenError
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.stack.common import REPO_ROOT, free_port
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.names import QUERY_SUBSCRIPTION
from mcpsync.workflows.records.subscription import SubscriptionKey
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from tests import cli_process
from tests.conftest import eventually, running_services, unique
from tests.e2e.conftest import ingress_idle, reads_settled
from tests.e2e.test_e2e_subscription import _wait_record

MCPSYNC = [sys.executable, "-m", "mcpsync.worker.cli"]



def _server(fx: FixtureProcess, subject: str = "alice") -> ServerConfig:
    return ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=[subject])


async def test_twenty_duplicate_notifications_cost_at_most_two_reads(temporal_client: Client, ledger: Ledger,
                                                                     fx: FixtureProcess) -> None:
    server = _server(fx)
    uri = f"demo://dup/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    first = await fx.create(uri, text="v1")
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
        await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                           "initial")
        await fx.wait_subscribed(uri)
        reads_before = await ledger.reports.read_count(key)
        await fx.faults(duplicate_notifications=20)
        change = await fx.edit(uri, text="v2")
        rec = await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                                 "change accepted")
        await fx.wait_notified()
        # Count only once no read can follow: every duplicate the server sent reached the ingress and
        # left its queue, no read is in flight or owed on the ledger row, and the workflow is ACTIVE.
        await eventually(lambda: _idle(handle, ledger, key, fx, server.name),
                         what="no read in flight or owed")
        reads = await ledger.reports.read_count(key) - reads_before
        assert 1 <= reads <= 2, f"20 duplicates caused {reads} reads"
        assert rec.last_notification_seq >= 1


async def _idle(handle: WorkflowHandle, ledger: Ledger, key: SubscriptionKey, fx: FixtureProcess,
                server: str) -> bool:
    if not await ingress_idle(ledger, fx, server) or not await reads_settled(ledger, key):
        return False
    rec = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
    return rec.state.value == "ACTIVE"


async def test_notification_for_unsubscribed_uri_is_audited_never_routed(temporal_client: Client,
                                                                         ledger: Ledger,
                                                                         fx: FixtureProcess) -> None:
    server = _server(fx)
    watched, stranger = f"demo://w/{uuid.uuid4().hex}", f"demo://s/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="alice", server=server.name, uri=watched)
    first = await fx.create(watched, text="w")
    await fx.create(stranger, text="s")
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
        await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                           "initial")
        # The host is subscribed to `watched` only; push an update for `stranger` at its session anyway.
        await fx.notify(stranger, times=1, unsolicited=True)
        await fx.notify(watched.upper(), times=1, unsolicited=True)  # differs from the subscribed URI
        rows = await eventually(
            lambda: _audited(ledger, "UNKNOWN_URI", {stranger, watched.upper()}), what="audit rows"
        )
        assert {r["uri"] for r in rows} >= {stranger, watched.upper()}
        rec = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
        assert rec.reads_issued == 1, "a notification for another URI must not cause a read"


async def _audited(ledger: Ledger, kind: str, uris: set[str]) -> list[dict[str, object]]:
    rows = [r for r in await ledger.reports.audit_rows(kind, limit=1000) if r["uri"] in uris]
    return rows if {r["uri"] for r in rows} >= uris else []


async def test_history_holds_digests_never_bodies(temporal_client: Client, ledger: Ledger,
                                                  fx: FixtureProcess) -> None:
    server = _server(fx)
    uri = f"demo://secret/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    body = f"TOP-SECRET-BODY-{uuid.uuid4().hex}"
    blob = os.urandom(64) + body.encode()
    change = await fx.create(uri, text=body)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
        await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"], "text")
        blob_change = await fx.edit(uri, blob=blob, mime_type="application/octet-stream")
        await _wait_record(handle, lambda r: r.last_accepted_digest == blob_change["committed"]["digest"],
                           "blob")
        history = (await handle.fetch_history()).to_json()
    corpus = history + "\n".join(_decoded_payloads(json.loads(history)))
    for needle in (body, base64.b64encode(body.encode()).decode(), base64.b64encode(blob).decode()[:40]):
        assert needle not in corpus
    assert change["committed"]["digest"] in corpus  # digests are what history carries
    assert await ledger.content.get_content("alice", change["committed"]["digest"]) == body.encode()
    # content is per subject
    assert await ledger.content.get_content("bob", change["committed"]["digest"]) is None


def _decoded_payloads(node: object) -> list[str]:
    """Every payload ``data`` field of a history JSON, base64-decoded."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "data" and isinstance(v, str):
                with suppress(ValueError):
                    out.append(base64.b64decode(v).decode("utf-8", errors="replace"))
            else:
                out.extend(_decoded_payloads(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(_decoded_payloads(v))
    return out


def _write_config(path: Path, temporal: TemporalDevServer, db_url: str, server: ServerConfig,
                  queue: str) -> None:
    path.write_text(
        f'[temporal]\naddress = "{temporal.address}"\ntask_queue = "{queue}"\n'
        f'sticky_queue_timeout_seconds = 1\n\n'  # the killed worker's runs go back to the queue at once
        f'[database]\nurl = "{db_url}"\n\n'
        f'[[servers]]\nname = "{server.name}"\ntransport = "http"\nurl = "{server.url}"\n'
        f'subjects = {server.subjects!r}\n'
        f'lease_seconds = 3\n'.replace("'", '"')  # the restarted worker takes the dead one's lease within 3 s
    )


async def test_worker_killed_mid_stream_loses_nothing(temporal_client: Client,
                                                      temporal_server: TemporalDevServer, ledger: Ledger,
                                                      database_url: str, fx: FixtureProcess,
                                                      tmp_path: Path) -> None:
    server = _server(fx)
    queue = unique("killq")
    config = tmp_path / "mcpsync.toml"
    _write_config(config, temporal_server, database_url, server, queue)
    uri = f"demo://kill/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    await fx.create(uri, text="r0")
    log = (tmp_path / "worker.log").open("wb")

    env = cli_process.without_database_url()  # the config file's URL

    def spawn() -> subprocess.Popen[bytes]:
        return subprocess.Popen([*MCPSYNC, "--config", str(config), "worker"], cwd=REPO_ROOT, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)

    proc = spawn()
    try:
        handle = await start_subscription(temporal_client, key, task_queue=queue)
        await _wait_record(handle, lambda r: r.watermark >= 1, "initial read by the worker process",
                           timeout=60)
        await fx.faults(read_delay_ms={uri: 300})  # reads slow enough that the kill lands mid-read
        last = None
        for i in range(1, 13):
            last = await fx.edit(uri, text=f"r{i}")
            await asyncio.sleep(0.2)
            if i == 5:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
            if i == 8:
                proc = spawn()
        assert last is not None
        rec = await _wait_record(handle, lambda r: r.last_accepted_digest == last["committed"]["digest"],
                                 "convergence after the worker restart", timeout=60)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    async with ledger.pool.connection() as conn:
        cur = await conn.execute("SELECT ordinal, request_id FROM read_requests WHERE workflow_id=%s"
                                 " ORDER BY ordinal",
                                 (key.workflow_id,))
        issued = await cur.fetchall()
        # In accept order: receipt ids are drawn under the subscription's row lock. Without ORDER BY the
        # rows came back in heap order, which follows each backend's insert page, not the accepts.
        cur = await conn.execute("SELECT read_ordinal, status FROM resource_versions WHERE workflow_id=%s"
                                 " ORDER BY receipt_id", (key.workflow_id,))
        receipts = await cur.fetchall()
    ordinals = [r[0] for r in issued]
    assert ordinals == sorted(set(ordinals)), "an ordinal was reused"
    assert len({r[1] for r in issued}) == len(issued)
    assert rec.watermark == (await ledger.load_fence(key)).watermark
    accepted = [r[0] for r in receipts if r[1] in ("ACCEPTED", "UNCHANGED")]
    assert accepted == sorted(accepted) and max(accepted) == rec.last_accepted_ordinal
    assert rec.reads_issued >= 3, "the kill should have interrupted a stream of reads"


async def test_server_that_exits_at_once_and_refusing_url_fail_clearly(ledger: Ledger,
                                                                       temporal_client: Client) -> None:
    dead = ServerConfig(name="dead", transport="stdio", command=[sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(SessionOpenError, match="cannot open MCP server 'dead'"):
        await SessionHost(dead, "anonymous", ledger, temporal_client).check()
    refused = ServerConfig(name="refused", transport="http", url=f"http://127.0.0.1:{free_port()}/mcp")
    with pytest.raises(SessionOpenError, match="cannot open MCP server 'refused'"):
        await SessionHost(refused, "anonymous", ledger, temporal_client).check()
    missing = ServerConfig(name="missing", transport="stdio", command=["/nonexistent/mcp-server"])
    with pytest.raises(SessionOpenError, match="missing"):
        await SessionHost(missing, "anonymous", ledger, temporal_client).check()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as a subprocess (forked from the fork server: tests.cli_process)."""
    return cli_process.run(args, env={**os.environ, "MCPSYNC_STATE_DIR": "/nonexistent-state", **(env or {})})


def test_cli_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[temporal\naddress=")
    r = _cli("--config", str(bad), "status", "--server", "x", "--uri", "demo://x")
    assert r.returncode == 2 and "not valid TOML" in r.stderr and "Traceback" not in r.stderr
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[[servers]]\nname = "a"\ntransport = "http"\n')
    r = _cli("--config", str(wrong), "status", "--server", "a", "--uri", "demo://x")
    assert r.returncode == 2 and "needs 'url'" in r.stderr and "Traceback" not in r.stderr
    good = tmp_path / "good.toml"
    good.write_text(f'[temporal]\naddress = "127.0.0.1:{free_port()}"\nconnect_timeout_seconds = 1.5\n'
                    '[[servers]]\nname = "a"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n')
    r = _cli("--config", str(good), "subscribe", "--server", "nope", "--uri", "demo://x")
    assert r.returncode == 2 and "unknown server 'nope'" in r.stderr
    r = _cli("--config", str(good), "subscribe", "--server", "a", "--uri", "demo://x")
    assert r.returncode == 6 and "Temporal unreachable" in r.stderr and "Traceback" not in r.stderr
    r = _cli("--config", str(good), "outbox", "tail",
             env={"MCPSYNC_DATABASE_URL": f"postgresql://u@127.0.0.1:{free_port()}/x"})
    assert r.returncode == 6 and "PostgreSQL unreachable" in r.stderr and "Traceback" not in r.stderr
    r = _cli("status", "--server", "a", "--uri", "demo://x")
    assert r.returncode == 6 and "nothing is running here" in r.stderr  # no stack, no config: unavailable
