"""Worker Deployment Versioning on the real stack: upgrade and rollback at continue-as-new.

A v1 main worker runs subscriptions (PINNED to build v1); a v2 main worker with a changed
subscription workflow is deployed and made current with the documented CLI command
(``temporal worker deployment set-current-version``); each running subscription moves to v2
at its next wake-up (a notification), through continue-as-new, with its fence and watermark
intact; then v1 is made current again (rollback) and they move back the same way.
Real Temporal dev server, PostgreSQL, the fixture MCP server over streamable HTTP.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest
from temporalio.api.enums.v1 import ContinueAsNewVersioningBehavior as ProtoCanBehavior
from temporalio.api.enums.v1 import EventType, TaskQueueKind, TaskQueueType
from temporalio.api.enums.v1 import VersioningBehavior as ProtoBehavior
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest, DescribeWorkerDeploymentRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_catalog, start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.cli.upgrades import open_runs, runs_without
from mcpsync.worker.main.config import ConfigError, TemporalConfig, load_config
from mcpsync.worker.main.worker import MAIN_WORKFLOWS, deployment_version, main_worker
from mcpsync.worker.stack.temporal import TemporalDevServer, temporal_cli_path
from mcpsync.workflows.catalog_rules import CatalogView
from mcpsync.workflows.interpreter import PATCH_AFTER_0_2_0
from mcpsync.workflows.names import CATALOG_WORKFLOW_TYPE, QUERY_CATALOG, SIGNAL_RECONCILE, WORKFLOW_TYPE
from mcpsync.workflows.records.catalog import CatalogKey
from mcpsync.workflows.records.subscription import SubscriptionKey
from mcpsync.workflows.subscription_state import should_continue_as_new
from tests.changed_build import V2_PATCH, V2_WORKFLOWS
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.test_e2e_fence import _receipts, _record, _server
from tests.e2e.test_e2e_subscription import _wait_record

RELEASED_PATCHES = (PATCH_AFTER_0_2_0,)
"""The patches every subscription run of this code asks before its first command."""

# --- pure parts: the trigger and the configuration -------------------------------------------------

def test_a_target_change_triggers_continue_as_new_only_between_reads() -> None:
    base: dict[str, Any] = {"suggested": False, "history_length": 10, "handlers_finished": True}
    assert not should_continue_as_new(reads_in_flight=0, **base)
    assert should_continue_as_new(reads_in_flight=0, target_version_changed=True, **base)
    assert not should_continue_as_new(reads_in_flight=1, target_version_changed=True, **base)
    assert not should_continue_as_new(reads_in_flight=0, target_version_changed=True,
                                      **{**base, "handlers_finished": False})


def test_versioning_is_off_unless_both_fields_are_configured(tmp_path: Any,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert deployment_version(TemporalConfig()) is None and not TemporalConfig().versioned
    cfg = TemporalConfig(deployment_name="mcpsync", build_id="1.4.2+abc")
    assert deployment_version(cfg) == WorkerDeploymentVersion(deployment_name="mcpsync", build_id="1.4.2+abc")
    path = tmp_path / "mcpsync.toml"
    path.write_text('[temporal]\ndeployment_name = "mcpsync"\n')
    with pytest.raises(ConfigError, match="both 'deployment_name' and 'build_id'"):
        load_config(path)
    monkeypatch.setenv("MCPSYNC_BUILD_ID", "v7")
    assert load_config(path).temporal.build_id == "v7" and load_config(path).temporal.versioned
    path.write_text('[temporal]\ndeployment_name = "has space"\nbuild_id = "v1"\n')
    with pytest.raises(ConfigError, match="deployment_name"):
        load_config(path)


# --- the real stack --------------------------------------------------------------------------------

def _set_current(server: TemporalDevServer, deployment: str, build_id: str) -> None:
    """The rollout / rollback step of docs/upgrades.md, verbatim."""
    proc = subprocess.run(
        [str(temporal_cli_path()), "worker", "deployment", "set-current-version", "--address", server.address,
         "--deployment-name", deployment, "--build-id", build_id, "--yes"],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-500:]


async def _make_current(server: TemporalDevServer, deployment: str, build_id: str) -> None:
    # A version exists once its worker has polled: retry until the server knows it.
    async def attempt() -> bool:
        try:
            await asyncio.to_thread(_set_current, server, deployment, build_id)
        except AssertionError:
            return False
        return True

    await eventually(attempt, timeout=30, interval=0.5, what=f"set-current-version {build_id}")


async def _routing_propagated(client: Client, deployment: str, queue: str, build_id: str) -> bool:
    """The server reports ``build_id`` current for ``deployment``, and the matching of ``queue``'s
    workflow tasks routes to it (its versioning info): from then on a workflow task on ``queue`` sees the
    change (docs/upgrades.md: one that starts before may not)."""
    try:
        resp = await client.workflow_service.describe_worker_deployment(DescribeWorkerDeploymentRequest(
            namespace=client.namespace, deployment_name=deployment))
        if resp.worker_deployment_info.routing_config.current_deployment_version.build_id != build_id:
            return False
        tq = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
    except RPCError:  # a describe the dev server cancels under load ("operation was canceled"): ask again
        return False
    return tq.versioning_info.current_deployment_version.build_id == build_id


@asynccontextmanager
async def _main_worker(client: Client, ledger: Ledger, queue: str, deployment: str, build_id: str,
                       workflows: Sequence[type] = MAIN_WORKFLOWS) -> AsyncIterator[None]:
    temporal = TemporalConfig(task_queue=queue, max_cached_workflows=100, deployment_name=deployment,
                              build_id=build_id)
    worker = main_worker(client, ledger, temporal, workflows=workflows)
    task = asyncio.create_task(worker.run())
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task


async def _build_of(handle: WorkflowHandle) -> tuple[str, str, int]:
    """(run id, build id, versioning behaviour) of the workflow's newest run."""
    desc = await handle.describe()
    info = desc.raw_description.workflow_execution_info.versioning_info
    return desc.run_id, info.deployment_version.build_id, info.behavior


async def _moved(handle: WorkflowHandle, old_run: str, build_id: str) -> tuple[str, str, int] | None:
    run_id, build, behavior = await _build_of(handle)
    return (run_id, build, behavior) if run_id != old_run and build == build_id else None


async def _markers(client: Client, workflow_id: str, run_id: str) -> list[str]:
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    return [str(e.marker_recorded_event_attributes.details) for e in history.events
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]


async def _upgraded_from(client: Client, workflow_id: str, run_id: str) -> tuple[str, int]:
    """(build it came from, initial versioning behaviour) of the continue-as-new that started ``run_id``."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id, "not started by continue-as-new"
    info = started.inherited_auto_upgrade_info
    return info.source_deployment_version.build_id, info.continue_as_new_initial_versioning_behavior


async def _fence_intact(ledger: Ledger, handle: WorkflowHandle, key: SubscriptionKey, before: Any,
                        digest: str) -> None:
    """Ordinals never reused, watermark never lower, last accepted digest the latest content; the
    workflow's record agrees with the ledger."""
    fence = await ledger.load_fence(key)
    assert fence.watermark >= before.watermark and fence.last_issued_ordinal > before.last_issued_ordinal
    assert fence.last_accepted_digest == digest
    rec = await _record(handle)
    assert (rec.watermark, rec.last_accepted_ordinal, rec.last_accepted_digest) == (
        fence.watermark, fence.last_accepted_ordinal, digest)
    assert rec.subscription_generation == fence.subscription_generation
    ordinals = [r[0]
                for r in await ledger_rows(ledger, "SELECT ordinal FROM read_requests WHERE workflow_id=%s",
                                                key.workflow_id)]
    assert len(set(ordinals)) == len(ordinals), "an ordinal was reused across builds"
    accepted = [o for o, s, _ in await _receipts(ledger, key) if s in ("ACCEPTED", "UNCHANGED")]
    assert accepted == sorted(accepted), "watermark regressed across builds"


async def _move_all(client: Client, ledger: Ledger, fx: FixtureProcess, subs: list[tuple[SubscriptionKey,
                    WorkflowHandle]], build_id: str, label: str) -> dict[str, str]:
    """Nudge every subscription (an edit: notification, wake-up, read) and wait until its newest
    run is on ``build_id`` with the fence intact; returns workflow id -> new run id."""
    before = {key.workflow_id: (await _build_of(handle))[0] for key, handle in subs}
    fences = {key.workflow_id: await ledger.load_fence(key) for key, _ in subs}
    edits = {key.workflow_id: await fx.edit(key.uri, text=f"{label} nudge {key.uri}") for key, _ in subs}
    runs: dict[str, str] = {}
    for key, handle in subs:
        run_id, build, behavior = await eventually(
            lambda h=handle, r=before[key.workflow_id]: _moved(h, r, build_id), timeout=40, interval=0.2,
            what=f"{key.uri} on {build_id}")
        assert behavior == ProtoBehavior.VERSIONING_BEHAVIOR_PINNED
        source, started_as = await _upgraded_from(client, key.workflow_id, run_id)
        assert source != build_id \
            and started_as == ProtoCanBehavior.CONTINUE_AS_NEW_VERSIONING_BEHAVIOR_AUTO_UPGRADE
        digest = edits[key.workflow_id]["committed"]["digest"]
        await _wait_record(handle, lambda r, d=digest: r.last_accepted_digest == d, f"{label} nudge accepted")
        await _fence_intact(ledger, handle, key, fences[key.workflow_id], digest)
        runs[key.workflow_id] = run_id
    # A further edit is accepted on the new build, in the same run.
    for key, handle in subs:
        fence = await ledger.load_fence(key)
        change = await fx.edit(key.uri, text=f"{label} after the move {key.uri}")
        await _wait_record(handle, lambda r, d=change["committed"]["digest"]: r.last_accepted_digest == d,
                           f"{label}: edit accepted after the move")
        await _fence_intact(ledger, handle, key, fence, change["committed"]["digest"])
        assert (await _build_of(handle))[:2] == (runs[key.workflow_id], build_id)
        assert (await ledger.load_fence(key)).watermark > fence.watermark
    return runs


async def _catalog_view(handle: WorkflowHandle) -> CatalogView:
    return await handle.query(QUERY_CATALOG, result_type=CatalogView)


async def _move_catalog(handle: WorkflowHandle, build_id: str) -> str:
    """Nudge the catalog (a reconcile signal) and wait until its newest run is on ``build_id``,
    carried its count of published catalogs and published the requested reconciliation there."""
    run_before = (await _build_of(handle))[0]
    before = await _catalog_view(handle)
    await handle.signal(SIGNAL_RECONCILE, f"nudge to {build_id}")
    run_id, _, behavior = await eventually(lambda: _moved(handle, run_before, build_id), timeout=40,
                                           interval=0.2, what=f"catalog on {build_id}")
    assert behavior == ProtoBehavior.VERSIONING_BEHAVIOR_PINNED

    async def published() -> CatalogView | None:
        view = await _catalog_view(handle)
        return view if view.catalogs_published > before.catalogs_published else None

    view = await eventually(published, timeout=40, what=f"a catalog published on {build_id}")
    assert view.catalogs_published == before.catalogs_published + 1, "the carried catalog state was lost"
    assert (await _build_of(handle))[:2] == (run_id, build_id)
    return run_id


async def _running_on(client: Client, deployment: str, build_id: str, queue: str) -> int:
    """The drain check of docs/upgrades.md: running workflows still pinned to a version."""
    query = (f"TemporalWorkerDeploymentVersion = '{deployment}:{build_id}' AND ExecutionStatus = 'Running' "
             f"AND TaskQueue = '{queue}'")
    return (await client.count_workflows(query)).count


async def _counts(client: Client, deployment: str, queue: str, want: dict[str, int]) -> bool:
    return all([await _running_on(client, deployment, b, queue) == n for b, n in want.items()])


async def _upgrades_show(client: Client, queue: str,
                         want: set[tuple[str, str, tuple[str, ...], int]]) -> bool:
    runs = await open_runs(client, task_queue=queue)
    return {(r.workflow_type, r.build, r.patches, r.count) for r in runs} == want


async def _published_once(handle: WorkflowHandle) -> bool:
    return (await _catalog_view(handle)).catalogs_published >= 1


async def test_upgrade_and_rollback_move_subscriptions_and_catalog_at_continue_as_new(
        temporal_server: TemporalDevServer, temporal_client: Client, ledger: Ledger,
        fx: FixtureProcess) -> None:
    client = temporal_client
    deployment = f"mcpsync-test-{uuid.uuid4().hex[:12]}"
    queue = unique("mcpsync-test")
    server = _server(fx.mcp_url)
    subs: list[tuple[SubscriptionKey, WorkflowHandle]] = []
    async with running_services(client, ledger, [server], task_queue=queue, with_main_worker=False), \
            _main_worker(client, ledger, queue, deployment, "v1"):
        await _make_current(temporal_server, deployment, "v1")
        for i in range(3):
            key = SubscriptionKey(subject=server.subjects[0], server=server.name,
                                  uri=f"demo://upgrade/{i}/{uuid.uuid4().hex}")
            first = await fx.create(key.uri, text=f"v1 content {i}")
            handle = await start_subscription(client, key, task_queue=queue)
            await _wait_record(handle, lambda r, d=first["committed"]["digest"]: r.last_accepted_digest == d,
                               "initial read on v1")
            await fx.wait_subscribed(key.uri)
            subs.append((key, handle))
        for key, handle in subs:
            for n in range(2):
                change = await fx.edit(key.uri, text=f"v1 edit {n} {key.uri}")
                await _wait_record(handle,
                                   lambda r, d=change["committed"]["digest"]: r.last_accepted_digest == d,
                                   "edit on v1")
            assert (await ledger.load_fence(key)).watermark > 1
            _, build, behavior = await _build_of(handle)
            assert (build, behavior) == ("v1", ProtoBehavior.VERSIONING_BEHAVIOR_PINNED)
        catalog = await start_catalog(client, CatalogKey(subject=server.subjects[0], server=server.name),
                                      task_queue=queue)
        await eventually(lambda: _published_once(catalog), timeout=40, what="first catalog on v1")
        first_runs = {key.workflow_id: (await _build_of(handle))[0] for key, handle in subs}
        first_runs[catalog.id] = (await _build_of(catalog))[0]

        async with _main_worker(client, ledger, queue, deployment, "v2", workflows=V2_WORKFLOWS):
            await _make_current(temporal_server, deployment, "v2")
            # Pinned: a new current build alone moves nothing (no wake-up, no continue-as-new yet). Checked
            # once the queue's matching routes to v2 (a task from then on would see it).
            await eventually(lambda: _routing_propagated(client, deployment, queue, "v2"), timeout=30,
                             what="v2's routing propagated")
            for handle in [h for _, h in subs] + [catalog]:
                assert (await _build_of(handle))[:2] == (first_runs[handle.id], "v1")

            v2_runs = await _move_all(client, ledger, fx, subs, "v2", "upgrade")
            for key, handle in subs:
                markers = await _markers(client, key.workflow_id, v2_runs[key.workflow_id])
                assert any(V2_PATCH in m for m in markers), "the v2 run did not run the changed workflow"
                assert await (await handle.describe()).memo_value("build", type_hint=str) == "v2"
                assert not any(V2_PATCH in m for m in await _markers(client, key.workflow_id,
                                                                       first_runs[key.workflow_id]))
            # Subscriptions first: a catalog's reconciliation may signal them (a wake-up of its own).
            await _move_catalog(catalog, "v2")
            await eventually(lambda: _counts(client, deployment, queue, {"v1": 0, "v2": len(subs) + 1}),
                             timeout=15, what="visibility: no run pinned to v1 (drained), every run on v2")
            # `mcpsync upgrades`: every open subscription run is on v2 and carries the v2 marker, so
            # V2_PATCH could be deprecated; the catalog's runs never ask for it.
            await eventually(lambda: _upgrades_show(client, queue, {
                (WORKFLOW_TYPE, f"{deployment}:v2", tuple(sorted((*RELEASED_PATCHES, V2_PATCH))), len(subs)),
                (CATALOG_WORKFLOW_TYPE, f"{deployment}:v2", (), 1)}), timeout=15, what="mcpsync upgrades "
                                                                                       "on v2")
            assert runs_without(await open_runs(client, task_queue=queue), V2_PATCH, WORKFLOW_TYPE) == 0

            # Rollback: v1 is current again (its workers never stopped); runs move back the same way.
            await _make_current(temporal_server, deployment, "v1")
            # The routing change reaches the server's matching asynchronously: a workflow task that
            # starts before it does not see the target change. A change read at the ingress costs one
            # workflow task, so a nudge sent at once can land in that window and move nothing (the
            # next wake-up would); nudge once the queue's matching routes to v1, as above.
            await eventually(lambda: _routing_propagated(client, deployment, queue, "v1"), timeout=30,
                             what="v1's routing propagated")
            v1_runs = await _move_all(client, ledger, fx, subs, "v1", "rollback")
            for key, _ in subs:
                assert not any(V2_PATCH in m
                               for m in await _markers(client, key.workflow_id, v1_runs[key.workflow_id]))
            await _move_catalog(catalog, "v1")
            await eventually(lambda: _counts(client, deployment, queue, {"v1": len(subs) + 1, "v2": 0}),
                             timeout=15, what="visibility: every run back on v1, none on v2")
            # Back on v1: continue-as-new does not carry the marker (each run records the patches its
            # own code asked for), so every open run is older than V2_PATCH again (every subscription
            # run, on either build, takes RELEASED_PATCHES).
            await eventually(lambda: _upgrades_show(client, queue, {
                (WORKFLOW_TYPE, f"{deployment}:v1", tuple(sorted(RELEASED_PATCHES)), len(subs)),
                (CATALOG_WORKFLOW_TYPE, f"{deployment}:v1", (), 1)}), timeout=15, what="mcpsync upgrades "
                                                                                       "on v1")
            assert runs_without(await open_runs(client, task_queue=queue), V2_PATCH,
                                WORKFLOW_TYPE) == len(subs)
