"""Scale-out on one machine: two main workers and two ingress processes against one dev server.

Exactly one ingress owns the (subject, server) session through the PostgreSQL lease. Killing the
owner with SIGKILL hands the session to the other within a bounded time; the new session
generation is higher and the subscription resubscribes and re-reads.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.worker.fixture import FixtureProcess
from mcpsync.worker.runtime import start_subscription
from mcpsync.worker.stack import REPO_ROOT, TemporalDevServer
from mcpsync.workflows.records import SubscriptionKey
from tests.conftest import eventually, unique
from tests.e2e.test_e2e_subscription import _wait_record

LEASE_SECONDS = 2.0


def _spawn(config: Path, role: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "MCPSYNC_DATABASE_URL"}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "mcpsync.worker.cli", "--config", str(config), "worker", "--role", role],
                                cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)


async def test_two_ingress_one_owner_and_handoff_on_kill(temporal_client: Client, temporal_server: TemporalDevServer,
                                                         ledger: Ledger, database_url: str, tmp_path: Path) -> None:
    fx = await FixtureProcess.start_http(tmp_path / "fx", seed="none")
    server, queue = unique("fx"), unique("scaleq")
    config = tmp_path / "mcpsync.toml"
    config.write_text(
        f'[temporal]\naddress = "{temporal_server.address}"\ntask_queue = "{queue}"\n\n'
        f'[database]\nurl = "{database_url}"\n\n'
        f'[[servers]]\nname = "{server}"\ntransport = "http"\nurl = "{fx.mcp_url}"\nsubjects = ["alice"]\n'
        f'lease_seconds = {LEASE_SECONDS}\nping_interval_seconds = 0.5\nping_timeout_seconds = 2\n'
    )
    uri = f"demo://scale/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="alice", server=server, uri=uri)
    first = await fx.create(uri, text="v1")
    procs = {name: _spawn(config, role, tmp_path / f"{name}.log")
             for name, role in (("main1", "main"), ("main2", "main"), ("in1", "ingress"), ("in2", "ingress"))}
    try:
        handle = await start_subscription(temporal_client, key, task_queue=queue)
        await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"], "initial",
                           timeout=60)
        holder = await eventually(lambda: ledger.lease_holder("alice", server), what="a lease holder")
        owner_pid = int(holder[0].split(":")[1])
        ingress = {p.pid: name for name, p in procs.items() if name.startswith("in")}
        assert owner_pid in ingress, f"the lease holder {holder} is one of our ingress processes"
        # Only the owner opened a session: one session generation so far.
        assert (await ledger.current_session("alice", server)).generation == 1  # type: ignore[union-attr]
        before = await handle.query("subscription")

        procs[ingress[owner_pid]].send_signal(signal.SIGKILL)
        procs[ingress[owner_pid]].wait(timeout=10)
        procs["main1"].send_signal(signal.SIGKILL)  # and one of the two main workers
        procs["main1"].wait(timeout=10)
        killed_at = time.monotonic()
        new_holder = await eventually(
            lambda: _other_holder(ledger, server, owner_pid), timeout=LEASE_SECONDS * 5, what="handoff")
        handoff = time.monotonic() - killed_at
        assert int(new_holder[0].split(":")[1]) != owner_pid and new_holder[1] > holder[1]
        session = await eventually(lambda: _session_after(ledger, server, 1), what="new session generation")
        change = await fx.edit(uri, text="after handoff")
        rec = await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                                 "converged after handoff", timeout=60)
        assert rec.session_generation == session.generation > before["session_generation"]
        assert rec.subscription_generation > before["subscription_generation"]
        assert handoff < LEASE_SECONDS * 5
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        await fx.stop()


async def _other_holder(ledger: Ledger, server: str, old_pid: int) -> tuple[str, int] | None:
    holder = await ledger.lease_holder("alice", server)
    return holder if holder is not None and int(holder[0].split(":")[1]) != old_pid else None


async def _session_after(ledger: Ledger, server: str, generation: int):  # type: ignore[no-untyped-def]
    await asyncio.sleep(0)
    s = await ledger.current_session("alice", server)
    return s if s is not None and s.generation > generation else None
