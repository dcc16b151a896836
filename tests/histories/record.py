"""Record the replay corpus from real runs: Temporal dev server, PostgreSQL, the fixture MCP server.

Contract:
- ``python -m tests.histories.record [--only NAME ...] [--replace]`` (``scripts/record-histories``)
  starts its own Temporal dev server(s), a fresh database (``MCPSYNC_DATABASE_URL``, else embedded
  PostgreSQL) and fixture servers, drives each scenario below with the CURRENT workflow code and
  writes one ``tests/histories/<version>/<name>.json`` per recorded run (``mcpsync.__version__``),
  then that directory's ``SHA256SUMS``. Every run is finished (closed, revoked,
  tombstoned, idle or terminated) before its history is fetched, so a rerun records the same
  paths (ids and timestamps differ).
- Each file is checked before it is written: it replays with ``corpus.replayer()``, is smaller
  than ``MAX_HISTORY_BYTES`` and contains no resource body (``BODY_MARKER``) and no token.

When to run it (and when not), docs/upgrades.md:
- Once per release, for the version about to be released: its corpus is then frozen. A directory
  that already has ``SHA256SUMS`` is refused unless ``--replace`` is given, which is only for a
  version that has not been released (e.g. adding a scenario before the release).
- NEVER to make a failing ``tests/unit/test_replay.py`` pass: a replay failure means the change would
  break running subscriptions; guard it with ``workflow.patched(...)`` instead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.api.answer_gate import AnswerGate
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.main.connect import open_ledger
from mcpsync.worker.main.revocation import revoke
from mcpsync.worker.stack.common import free_port, state_dir
from mcpsync.worker.stack.temporal import TemporalDevServer, temporal_cli_path
from mcpsync.workflows.names import (
    QUERY_SUBSCRIPTION,
    SIGNAL_CATALOG_RECONCILED,
    UPDATE_CLOSE,
    UPDATE_RESUME,
    answer_workflow_id,
)
from mcpsync.workflows.records.subscription import (
    CatalogObservation,
    CloseReceipt,
    CloseRequest,
    ResumeRequest,
    SubscriptionKey,
    SubscriptionOptions,
    SubscriptionState,
)
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from tests.conftest import eventually, fresh_database, postgres_server, running_services
from tests.e2e.test_answer_gate import _latest_id, _notifications, _wait_latest, _wait_notified
from tests.e2e.test_catalog_e2e import catalog_stack
from tests.e2e.test_e2e_subscription import _wait_record
from tests.histories.corpus import (
    BODY_MARKER,
    MAX_HISTORY_BYTES,
    SUMS,
    current_dir,
    history_files,
    leaks,
    replayer,
    sha256sums,
    traits,
)

S = SubscriptionState
SUBJECT = "alice"


def body(label: str) -> str:
    return f"{BODY_MARKER}{label}"


def _server(name: str, url: str) -> ServerConfig:
    # Fast pings so a restarted fixture is noticed at once (as in tests/e2e/test_e2e_fence.py).
    return ServerConfig(name=name, transport="http", url=url, subjects=[SUBJECT],
                        ping_interval_seconds=0.5, ping_timeout_seconds=2)


class Recorder:
    def __init__(self, client: Client, ledger: Ledger, temporal: TemporalDevServer, work: Path,
                 out: Path) -> None:
        self.client, self.ledger, self.temporal, self.work, self.out = client, ledger, temporal, work, out
        self.written: list[Path] = []

    async def save(self, name: str, workflow_id: str, run_id: str, client: Client | None = None) -> None:
        history = await (client or self.client).get_workflow_handle(workflow_id,
                                                                    run_id=run_id).fetch_history()
        text = history.to_json()
        found = leaks(text)
        if found:
            raise RuntimeError(f"{name}: history contains {found}: a body or a credential reached history")
        if len(text.encode()) > MAX_HISTORY_BYTES:
            raise RuntimeError(f"{name}: history is {len(text.encode())} bytes (limit {MAX_HISTORY_BYTES})")
        await replayer().replay_workflow(history)  # raises on nondeterminism: never commit such a file
        path = self.out / f"{name}.json"
        path.write_text(text)
        self.written.append(path)
        t = traits(history)
        print(f"  {path.name}: {t.workflow_type}, {t.events} events, {len(text) // 1024} KiB"
              f"{', continued-as-new' if t.continued_as_new else ''}"
              f"{', from continue-as-new' if t.continued_from_run else ''}"
              f"{', reset' if t.reset else ''}", flush=True)

    # --- helpers -------------------------------------------------------------------------------

    async def subscribe(self, fx: FixtureProcess, server: ServerConfig, queue: str, path: str,
                        **options: Any) -> tuple[SubscriptionKey, WorkflowHandle]:
        key = SubscriptionKey(subject=SUBJECT, server=server.name, uri=f"demo://replay/{path}")
        first = await fx.create(key.uri, text=body(f"{path} v1"))
        handle = await start_subscription(self.client, key, task_queue=queue,
                                          options=SubscriptionOptions(**options))
        await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                           f"{path}: initial read")
        return key, handle

    async def edit(self, fx: FixtureProcess, handle: WorkflowHandle, key: SubscriptionKey, label: str,
                   timeout: float = 30.0) -> ResourceSubscriptionV1:
        change = await fx.edit(key.uri, text=body(label))
        return await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                                  f"{label} accepted", timeout=timeout)

    async def close(self, handle: WorkflowHandle) -> str:
        """Close by update, wait for the run to end; the id of the run that ended."""
        receipt = await handle.execute_update(UPDATE_CLOSE, CloseRequest(reason="recorded"),
                                              result_type=CloseReceipt)
        assert receipt.state == S.CLOSED, receipt
        return await self.finished(handle)

    async def finished(self, handle: WorkflowHandle) -> str:
        current = self.client.get_workflow_handle(handle.id)
        await current.result()
        return (await current.describe()).run_id

    # --- scenarios on a subscribe-capable fixture ---------------------------------------------------

    async def updates_and_close(self, fx: FixtureProcess, server: ServerConfig, queue: str) -> None:
        key, handle = await self.subscribe(fx, server, queue, "updates")
        await fx.wait_subscribed(key.uri)
        # Churn: slow reads, duplicated notifications and three quick edits coalesce into fewer reads.
        await fx.faults(read_delay_ms={key.uri: 400}, duplicate_notifications=3)
        for i in range(2, 5):
            change = await fx.edit(key.uri, text=body(f"updates v{i}"))
        await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                           "churn settled")
        await fx.faults(reset=True)
        before = (await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)).reads_issued
        await fx.notify(key.uri)  # no change: an UNCHANGED receipt
        await _wait_record(handle, lambda r: r.reads_issued > before and r.state == S.ACTIVE, "unchanged "
                                                                                              "re-read")
        # The catalog agrees (listed): a no-op word.
        rec = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
        await handle.signal(SIGNAL_CATALOG_RECONCILED, CatalogObservation(
            uri=key.uri, listed=True, scan_id="scan-recorded", snapshot_status="SNAPSHOT_UNPROVEN",
            session_generation=rec.session_generation))
        await self.save("subscription-updates-churn-and-close", handle.id, await self.close(handle))

    async def revoked(self, fx: FixtureProcess, server: ServerConfig, queue: str) -> None:
        key, handle = await self.subscribe(fx, server, queue, "revoked")
        await fx.wait_subscribed(key.uri)
        assert await revoke(self.client, self.ledger, subject=SUBJECT, server=server.name, uri=key.uri,
                            reason="recorded revocation") == [handle.id]
        run_id = await self.finished(handle)
        assert (await self.ledger.load_fence(key)).state == S.REVOKED
        await self.save("subscription-revoked", handle.id, run_id)

    async def tombstoned_by_catalog(self, fx: FixtureProcess, server: ServerConfig, queue: str) -> None:
        key, handle = await self.subscribe(fx, server, queue, "tombstoned")
        await fx.wait_subscribed(key.uri)
        await fx.delete(key.uri)
        rec = await _wait_record(handle, lambda r: r.state == S.TOMBSTONE_PENDING, "tombstone pending")
        await handle.signal(SIGNAL_CATALOG_RECONCILED, CatalogObservation(
            uri=key.uri, listed=False, scan_id="scan-recorded", snapshot_status="SNAPSHOT_UNPROVEN",
            session_generation=rec.session_generation))
        run_id = await self.finished(handle)
        assert (await self.ledger.load_fence(key)).state == S.TOMBSTONED
        await self.save("subscription-catalog-reconciled-tombstoned", handle.id, run_id)

    async def identity_conflict(self, fx: FixtureProcess, server: ServerConfig, queue: str) -> None:
        key, handle = await self.subscribe(fx, server, queue, "Caf%c3%a9")
        variant = key.uri.replace("demo://", "DEMO://").replace("%c3%a9", "%C3%A9")
        await fx.create(variant, text=body("variant"))
        await fx.notify(variant, unsolicited=True)
        await _wait_record(handle, lambda r: r.state == S.RECONCILIATION_REQUIRED, "identity conflict")
        await handle.execute_update(UPDATE_RESUME, ResumeRequest(reason="recorded"),
                                    result_type=ResourceSubscriptionV1)
        await self.edit(fx, handle, key, "conflict resumed")
        await self.save("subscription-identity-conflict-resume", handle.id, await self.close(handle))

    async def continue_as_new(self, fx: FixtureProcess, server: ServerConfig, queue: str) -> None:
        key, handle = await self.subscribe(fx, server, queue, "continue-as-new", max_history_events=100)
        await fx.wait_subscribed(key.uri)
        first_run = (await handle.describe()).run_id
        for i in range(2, 40):
            await self.edit(fx, self.client.get_workflow_handle(key.workflow_id), key, f"can v{i}")
            if (await self.client.get_workflow_handle(key.workflow_id).describe()).run_id != first_run:
                break
        else:
            raise RuntimeError("no continue-as-new after 38 edits")
        current = self.client.get_workflow_handle(key.workflow_id)
        await self.edit(fx, current, key, "after continue-as-new")
        last_run = await self.close(current)
        await self.save("subscription-continue-as-new", key.workflow_id, first_run)
        await self.save("subscription-continued-run-close", key.workflow_id, last_run)

    async def reset(self, fx: FixtureProcess, server: ServerConfig, queue: str) -> None:
        key, handle = await self.subscribe(fx, server, queue, "reset")
        await fx.wait_subscribed(key.uri)
        for i in range(2, 4):
            await self.edit(fx, handle, key, f"reset v{i}")
        # As tests/e2e/test_e2e_fence.py: back to the first workflow task, later signals not reapplied.
        proc = await asyncio.to_thread(subprocess.run, [
            str(temporal_cli_path()), "workflow", "reset", "--address", self.temporal.address,
            "--workflow-id", key.workflow_id, "--type", "FirstWorkflowTask", "--reason", "recorded reset",
            "--reapply-exclude", "Signal", "--yes"], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"temporal workflow reset failed: {proc.stderr[-500:]}")
        current = self.client.get_workflow_handle(key.workflow_id)
        await self.edit(fx, current, key, "after reset", timeout=40)
        await self.save("subscription-reset", key.workflow_id, await self.close(current))

    async def answer(self, fx: FixtureProcess, server: ServerConfig, queue: str) -> None:
        key, handle = await self.subscribe(fx, server, queue, "answer-dependency")
        await fx.wait_subscribed(key.uri)
        gate = AnswerGate(self.client, queue, idle_seconds=2.0)
        answer_id = "recorded-answer"
        old_id = await _latest_id(self.ledger, key)
        await gate.bind(answer_id, "Which version is current?", [(key.subject, key.server, key.uri, old_id)])
        await gate.check(answer_id)  # ACCEPT
        await fx.faults(read_delay_ms={key.uri: 1000})
        seen = await _notifications(self.ledger, key)
        change = await fx.edit(key.uri, text=body("answer v2"))
        await _wait_notified(self.ledger, key, seen)
        await gate.check(answer_id)  # HOLD: an update is seen, its read is slow
        await fx.faults(reset=True)
        new = await _wait_latest(self.ledger, key,
                                 lambda r: r.content_digest == change["committed"]["digest"],
                                 "new version accepted")
        await gate.select_input(answer_id, key.uri, new.receipt_id)
        await gate.check(answer_id)  # ACCEPT
        answer = self.client.get_workflow_handle(answer_workflow_id(answer_id))
        await answer.result()  # idle for idle_seconds: the run ends, its state is in PostgreSQL
        await self.save("answer-bind-check-select-idle", answer.id, (await answer.describe()).run_id)
        await self.close(handle)

    # --- scenarios with their own fixture -------------------------------------------------------------

    async def polling(self) -> None:
        async with await FixtureProcess.start_http(self.work / "poll", seed="none", subscribe=False) as fx:
            server = _server("replay-poll", fx.mcp_url)
            async with running_services(self.client, self.ledger, [server],
                                        task_queue=f"replay-{server.name}") as cfg:
                queue = cfg.temporal.task_queue
                key, handle = await self.subscribe(fx, server, queue, "polled", poll_interval_seconds=1.0)
                rec = await self.edit(fx, handle, key, "polled v2", timeout=10)
                # Let the poll timer fire at least twice more with nothing changed (UNCHANGED reads).
                await _wait_record(handle, lambda r: r.reads_issued >= rec.reads_issued + 2, "idle polls",
                                   timeout=10)
                await self.save("subscription-polling-no-subscribe", handle.id, await self.close(handle))

    async def polling_ttl(self) -> None:
        """Polling where the period moves (docs/caching.md): the server's ttlMs is longer than the
        interval, then reads fail (backoff), then content again (reset)."""
        async with await FixtureProcess.start_http(self.work / "poll-ttl", seed="none",
                                                   subscribe=False) as fx:
            server = _server("replay-poll-ttl", fx.mcp_url)
            async with running_services(self.client, self.ledger, [server],
                                        task_queue=f"replay-{server.name}") as cfg:
                await fx.faults(ttl_ms=2000)
                key, handle = await self.subscribe(fx, server, cfg.temporal.task_queue, "polled-ttl",
                                                   poll_interval_seconds=0.5)
                rec = await self.edit(fx, handle, key, "polled-ttl v2", timeout=10)
                await fx.faults(fail_reads={key.uri: -32603})
                await _wait_record(handle, lambda r: r.staleness_bound_source == "backoff", "backoff",
                                   timeout=20)
                await fx.faults(reset=True)
                await _wait_record(handle, lambda r: r.reads_issued >= rec.reads_issued + 5
                                   and r.staleness_bound_source == "config", "reset after content",
                                   timeout=20)
                await self.save("subscription-polling-ttl-backoff", handle.id, await self.close(handle))

    async def session_change(self) -> None:
        port = free_port()
        fx = await FixtureProcess.start_http(self.work / "restart-a", seed="none", port=port)
        server = _server("replay-restart", fx.mcp_url)
        try:
            async with running_services(self.client, self.ledger, [server],
                                        task_queue=f"replay-{server.name}") as cfg:
                key, handle = await self.subscribe(fx, server, cfg.temporal.task_queue, "session-change")
                before = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
                await fx.stop()  # the session dies; the host reconnects to the new process: a new generation
                fx = await FixtureProcess.start_http(self.work / "restart-b", seed="none", port=port)
                fresh = await fx.create(key.uri, text=body("session-change after restart"))
                rec = await _wait_record(handle,
                                         lambda r: r.last_accepted_digest == fresh["committed"]["digest"],
                                         "re-read on the new session")
                assert rec.session_generation > before.session_generation
                await fx.wait_subscribed(key.uri)
                await self.edit(fx, handle, key, "session-change notified")
                await self.save("subscription-session-change", handle.id, await self.close(handle))
        finally:
            await fx.stop()

    async def catalog(self) -> None:
        async with catalog_stack(self.client, self.ledger, self.work / "catalog") as st:
            await st.published(1)
            await st.reconcile()
            await st.fx.create("demo://cat/05", text=body("catalog addition"))
            await st.published(3)  # list_changed: a new reconciliation publishes the grown catalog
            workflow_id = st.key().workflow_id
            run_id = (await st.handle().describe()).run_id
        # catalog_stack terminated it: a catalog workflow never ends on its own.
        await self.save("catalog-reconcile-list-changed", workflow_id, run_id)

    async def catalog_continue_as_new(self) -> None:
        server = await TemporalDevServer.start(self.work / "temporal-can", port=0, ui_port=0,
                                               dynamic_config={"limit.historyCount.suggestContinueAsNew": 40})
        try:
            client = await Client.connect(server.address, data_converter=pydantic_data_converter)
            async with catalog_stack(client, self.ledger, self.work / "catalog-can") as st:
                first_run = (await st.handle().describe()).run_id
                for _ in range(8):
                    await st.reconcile()
                    if (await st.handle().describe()).run_id != first_run:
                        break
                else:
                    raise RuntimeError("no catalog continue-as-new after 8 reconciliations")
                workflow_id = st.key().workflow_id
            await self.save("catalog-continue-as-new", workflow_id, first_run, client)
        finally:
            await server.stop()

    async def version_upgrade(self) -> None:
        """Worker Deployment Versioning: a run pinned to build v1 sees v2 made current and
        continues-as-new onto v2 (AUTO_UPGRADE) at its next notification; the v2 run reads, closes."""
        from tests.e2e.test_e2e_versioning import _main_worker, _make_current, _moved

        deployment = f"mcpsync-replay-{uuid.uuid4().hex[:8]}"
        async with await FixtureProcess.start_http(self.work / "fx-versioning", seed="none") as fx:
            server = _server("replay-versioning", fx.mcp_url)
            queue = f"replay-{server.name}"
            async with running_services(self.client, self.ledger, [server], task_queue=queue,
                                        with_main_worker=False), \
                    _main_worker(self.client, self.ledger, queue, deployment, "v1"):
                await _make_current(self.temporal, deployment, "v1")
                key, handle = await self.subscribe(fx, server, queue, "version-upgrade")
                await fx.wait_subscribed(key.uri)
                await self.edit(fx, handle, key, "on v1")
                current = self.client.get_workflow_handle(key.workflow_id)
                first_run = (await current.describe()).run_id
                async with _main_worker(self.client, self.ledger, queue, deployment, "v2"):
                    await _make_current(self.temporal, deployment, "v2")
                    # The new current build reaches the server's matching asynchronously: a workflow task
                    # started within about a second of the change may not see it (docs/upgrades.md). The
                    # recorder (not a test) waits that second of the server's real propagation time.
                    await asyncio.sleep(1.0)
                    await self.edit(fx, current, key, "nudge to v2")
                    await eventually(lambda: _moved(current, first_run, "v2"), timeout=40, what="run on v2")
                    await self.edit(fx, current, key, "on v2")
                    last_run = await self.close(current)
        await self.save("subscription-version-upgrade", key.workflow_id, first_run)
        await self.save("subscription-version-upgraded-run-close", key.workflow_id, last_run)


async def record(only: set[str] | None, out: Path) -> list[Path]:
    # Under the project's state dir: embedded PostgreSQL opens up every parent of its data dir.
    state_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="record-histories-", dir=state_dir()) as tmp:
        work = Path(tmp)
        temporal = await TemporalDevServer.start(work / "temporal", port=0, ui_port=0)
        try:
            async with postgres_server(work / "pg") as server_url, fresh_database(server_url) as url:
                ledger = await open_ledger(url)
                try:
                    client = await Client.connect(temporal.address, data_converter=pydantic_data_converter)
                    rec = Recorder(client, ledger, temporal, work, out)
                    await _run_all(rec, only)
                    return rec.written
                finally:
                    await ledger.pool.close()
        finally:
            await temporal.stop()


async def _run_all(rec: Recorder, only: set[str] | None) -> None:
    shared: list[Callable[[FixtureProcess, ServerConfig, str], Awaitable[None]]] = [
        rec.updates_and_close, rec.revoked, rec.tombstoned_by_catalog, rec.identity_conflict,
        rec.continue_as_new, rec.reset, rec.answer,
    ]
    own: list[Callable[[], Awaitable[None]]] = [rec.polling, rec.polling_ttl, rec.session_change, rec.catalog,
                                                rec.catalog_continue_as_new, rec.version_upgrade]

    def wanted(fn: Callable[..., Awaitable[None]]) -> bool:
        return only is None or fn.__name__ in only

    async with await FixtureProcess.start_http(rec.work / "fx", seed="none") as fx:
        server = _server("replay-fx", fx.mcp_url)
        async with running_services(rec.client, rec.ledger, [server],
                                    task_queue=f"replay-{server.name}") as cfg:
            for scenario in filter(wanted, shared):
                await _timed(scenario.__name__, scenario(fx, server, cfg.temporal.task_queue))
    for solo in filter(wanted, own):
        await _timed(solo.__name__, solo())


async def _timed(name: str, scenario: Awaitable[None]) -> None:
    t0 = time.monotonic()
    print(f"{name} ...", flush=True)
    await scenario
    print(f"{name}: {time.monotonic() - t0:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/record-histories", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", metavar="SCENARIO",
                        help="record only this scenario (a Recorder method name); repeatable")
    parser.add_argument("--replace", action="store_true",
                        help="record into a corpus that already has SHA256SUMS: only for a version not "
                             "released yet")
    args = parser.parse_args(argv)
    out = current_dir()
    if (out / SUMS).exists() and not args.replace:
        print(f"{out} is recorded (a released corpus is frozen): bump mcpsync.__version__ for the next "
              "release, or pass --replace if this version has not been released", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    written = asyncio.run(record(set(args.only) if args.only else None, out))
    (out / SUMS).write_text(sha256sums(history_files(out)))
    print(f"wrote {len(written)} histories to {out} in {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a process that ran a Worker can abort at interpreter exit (FACTS.md, sdk-python#300)
