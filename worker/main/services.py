"""Process plumbing shared by the CLI, the worker entrypoint and the tests.

Contract:
- ``connect_temporal`` returns a client using the pydantic data converter (``worker/converter.py``), or
  raises ``TemporalUnavailable`` with the address in the message.
- ``open_ledger`` opens PostgreSQL (configured URL, else the embedded server
  under the state dir), applies migrations and returns a ``Ledger``.
- ``main_worker`` is the worker for workflows and ledger activities;
  ``run_services`` runs it beside one ``Ingress`` (one worker, one task queue for the MCP
  activities of every session of the process) and its ``SessionHost`` per (server, subject).
- With ``[temporal] deployment_name``/``build_id`` the main worker runs under Worker
  Deployment Versioning (its workflows PINNED by default behaviour; docs/upgrades.md); without,
  exactly as before (no behaviour is declared anywhere: the server refuses one from an
  unversioned worker). The ingress worker is never versioned: it runs activities only (no workflow
  code to pin), and each (server, subject) has one lease-holding host whose live MCP session every
  build's reads must reach, so their activity contract stays compatible across builds.
- ``start_subscription`` is the idempotent way to start a subscription: the same
  key never yields a second running workflow.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from temporalio.client import Client, TLSConfig
from temporalio.common import (
    WorkerDeploymentVersion,
)
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkerDeploymentConfig, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from mcpsync.activities.answer_ledger import AnswerLedger, AnswerLedgerActivities
from mcpsync.activities.catalog_ledger import CatalogLedger, CatalogLedgerActivities
from mcpsync.activities.db import migrate, open_pool
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger_fence import SubjectRevocation
from mcpsync.activities.starters import start_catalog, start_subscription, start_subscription_first_read
from mcpsync.worker import metrics
from mcpsync.worker.bulk import settle_all
from mcpsync.worker.config import Config, RetentionConfig, TemporalConfig, WorkflowRunnerKind
from mcpsync.worker.converter import DATA_CONVERTER
from mcpsync.worker.stack import write_private
from mcpsync.worker.stack_temporal import ensure_search_attributes
from mcpsync.workflows.answer import AnswerWorkflow
from mcpsync.workflows.catalog import CatalogWorkflow
from mcpsync.workflows.names import (
    QUERY_SUBSCRIPTION,
    SIGNAL_REVOKE,
)
from mcpsync.workflows.records.catalog import CatalogKey
from mcpsync.workflows.records.subscription import RevokeRequest, SubscriptionState
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from mcpsync.workflows.subscription import ResourceSubscriptionWorkflow
from mcpsync.workflows.versioning import MAIN_WORKER_BEHAVIOR

if TYPE_CHECKING:
    from mcpsync.worker.ingress import Ingress

__all__ = [
    "MAIN_WORKFLOWS",
    "RuntimeInfo",
    "TemporalUnavailable",
    "connect_temporal",
    "deployment_version",
    "main_worker",
    "workflow_runner",
    "open_ledger",
    "Revocation",
    "revoke",
    "revoke_subject",
    "start_catalogs",
    "run_services",
    "start_subscription",
    "start_subscription_first_read",
    "start_catalog",
]

log = logging.getLogger("mcpsync.runtime")

MAIN_WORKFLOWS = (ResourceSubscriptionWorkflow, CatalogWorkflow, AnswerWorkflow)
"""Every workflow the main worker runs (on ``workflow_runner([temporal] workflow_runner)``); the replay
test (tests/unit/test_replay.py) replays recorded histories against exactly these, in the SDK's strict
sandbox and on each configurable runner."""


class TemporalUnavailable(RuntimeError):
    """The Temporal frontend could not be reached."""


@dataclass
class RuntimeInfo:
    """What ``mcpsync up`` started, written to ``<state>/runtime.json`` for the other commands."""

    temporal_address: str
    namespace: str
    database_url: str
    ui_url: str
    config_path: str
    pid: int | None = None  # the ``mcpsync up`` process; the file is stale once it is gone
    ingress_identity: str | None = None  # its ingress: the lease holder name of its MCP sessions

    def save(self, path: Path) -> None:
        """0600: ``database_url`` may carry a password."""
        write_private(path, json.dumps(self.__dict__, indent=2))

    @classmethod
    def load(cls, path: Path) -> RuntimeInfo | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def stack_alive(self) -> bool:
        """Whether the ``mcpsync up`` that wrote this file still runs (a file without a pid: assumed)."""
        if self.pid is None:
            return True
        from mcpsync.worker.stack import process_alive

        return process_alive(self.pid, expect_in_cmdline=("mcpsync", "mcpsync.worker.cli"))


async def connect_temporal(cfg: TemporalConfig) -> Client:
    tls: TLSConfig | bool = False
    if cfg.tls_cert and cfg.tls_key:
        cert, key = await asyncio.to_thread(lambda: (Path(cfg.tls_cert or "").read_bytes(),
                                                     Path(cfg.tls_key or "").read_bytes()))
        tls = TLSConfig(client_cert=cert, client_private_key=key)
    api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
    if api_key and tls is False:
        tls = True
    try:
        return await asyncio.wait_for(
            Client.connect(cfg.address, namespace=cfg.namespace, tls=tls, api_key=api_key,
                           data_converter=DATA_CONVERTER),
            cfg.connect_timeout_seconds,
        )
    except Exception as exc:
        raise TemporalUnavailable(
            f"Temporal unreachable at {cfg.address} (namespace {cfg.namespace}): "
            f"{connect_error_reason(exc, cfg.connect_timeout_seconds)}"
        ) from None


def connect_error_reason(exc: BaseException, timeout: float) -> str:
    """Why a connection failed, whole: the OS's words when the driver nests them (``tcp connect
    error: Connection refused``), else the message on one line, shortened at a word boundary."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s"
    text = " ".join(str(exc).split())
    os_message = re.search(r'message: "([^"]+)"', text)
    if os_message:
        what = re.search(r'ConnectError\("([^"]+)"', text)
        return f"{what.group(1) + ': ' if what else ''}{os_message.group(1)}"
    if len(text) > 300:
        text = text[:300].rsplit(" ", 1)[0] + " …"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def open_ledger(url: str, *, max_size: int = 16) -> Ledger:
    pool = await open_pool(url, max_size=max_size)
    await migrate(pool)
    return Ledger(pool)


def deployment_version(cfg: TemporalConfig) -> WorkerDeploymentVersion | None:
    """The Worker Deployment Version the main worker polls as; None: versioning off."""
    if cfg.deployment_name is None or cfg.build_id is None:
        return None
    return WorkerDeploymentVersion(deployment_name=cfg.deployment_name, build_id=cfg.build_id)


def workflow_runner(kind: WorkflowRunnerKind) -> WorkflowRunner:
    """The main worker's runner for ``[temporal] workflow_runner``.

    Sandboxed: the sandbox checks every workflow call (no I/O, no wall clock, no threads), with imports
    shared with the worker instead of re-imported for every new run (``workflows/`` holds deterministic
    code only, with no module state a run could change); re-importing cost a new subscription's first
    workflow task tens of milliseconds. Unsandboxed: no run-time checks and no per-run sandbox; the
    replay test runs the recorded histories in the SDK's default (strict) sandbox and
    ``tests/unit/test_layers.py`` keeps I/O imports out of ``workflows/`` (docs/decisions/0004)."""
    if kind is WorkflowRunnerKind.UNSANDBOXED:
        return UnsandboxedWorkflowRunner()
    return SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_all_modules())


def main_worker(client: Client, ledger: Ledger, temporal: TemporalConfig, *,
                workflows: Sequence[type] = MAIN_WORKFLOWS) -> Worker:
    """The workflows and ledger activities, as ``temporal`` says: its task queue, cache size, sticky
    queue timeout and runner; with ``deployment_name`` and ``build_id``, polling as that Worker
    Deployment Version, every workflow PINNED (``mcpsync.workflows.versioning``). ``workflows`` stays
    ``MAIN_WORKFLOWS`` outside tests of a changed build."""
    deployment = deployment_version(temporal)
    return Worker(
        client,
        task_queue=temporal.task_queue,
        workflows=list(workflows),
        deployment_config=(WorkerDeploymentConfig(version=deployment, use_worker_versioning=True,
                                                  default_versioning_behavior=MAIN_WORKER_BEHAVIOR)
                           if deployment is not None else None),
        activities=ledger.activities(metrics.PROMETHEUS)
        + CatalogLedgerActivities(CatalogLedger(ledger.pool), ledger, client, temporal.task_queue).all()
        + AnswerLedgerActivities(AnswerLedger(ledger.pool)).all(),
        max_concurrent_activities=64,
        max_cached_workflows=temporal.max_cached_workflows,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=temporal.sticky_queue_timeout_seconds),
        workflow_runner=workflow_runner(temporal.workflow_runner),
    )


async def _register_search_attributes(client: Client, namespace: str) -> None:
    """An upgrade may bring new search attributes (e.g. McpCatalogState): register them before the
    workflows upsert them, where the cluster allows it. Temporal Cloud does not: then say which."""
    try:
        added = await ensure_search_attributes(client, namespace)
    except Exception as exc:  # permission denied (Cloud), wrong type, unreachable operator API
        log.warning("could not register search attributes on %r (%s: %s); register those of "
                    "temporal/search_attributes.toml by hand (Cloud: tcld or the UI)", namespace,
                    type(exc).__name__, str(exc)[:200])
        return
    if added:
        log.info("registered search attributes on %r: %s", namespace, ", ".join(added))


async def run_services(config: Config, client: Client, ledger: Ledger, *,
                       servers: Sequence[str] | None = None, with_main_worker: bool = True,
                       ready: asyncio.Event | None = None,
                       polling: list[Callable[[], bool]] | None = None,
                       ingress: Ingress | None = None) -> None:
    """Run the main worker and the session hosts until cancelled.

    ``polling``: gets one check per Temporal worker this process runs (main, ingress), each true
    once that worker polls (``MetricsServer.ready_when``: ``/readyz``). ``ingress``: the one its
    session hosts belong to (default: a new one), for a caller that asks it which sessions this
    process holds (``Ingress.live``)."""
    # Imported here: the MCP client library is most of the CLI's start-up time, and only the
    # processes that host sessions need it.
    from mcpsync.worker.ingress import Ingress
    from mcpsync.worker.session_host import SessionHost

    ingress = ingress if ingress is not None else Ingress(client, ledger)
    hosts = [
        SessionHost(server, subject, ledger, client, ingress=ingress)
        for server in config.servers
        if servers is None or server.name in servers
        for subject in server.subjects
    ]
    if with_main_worker:
        await _register_search_attributes(client, config.temporal.namespace)
    tasks = [asyncio.create_task(h.run(), name=f"host:{h.server.name}/{h.subject}") for h in hosts]
    if hosts:  # a main-only process polls no ingress queue
        tasks.append(asyncio.create_task(ingress.run(), name="ingress-worker"))
    worker = main_worker(client, ledger, config.temporal) if with_main_worker else None
    if polling is not None:
        if hosts:
            polling.append(lambda: ingress.polling)
        if worker is not None:
            main = worker
            polling.append(lambda: main.is_running)
    try:
        if worker is not None:
            tasks.append(asyncio.create_task(worker.run(), name="main-worker"))
            if config.retention is not None:
                tasks.append(asyncio.create_task(_prune_periodically(ledger, config.retention),
                                                 name="retention"))
        if ready is not None:
            ready.set()
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            t.result()
    finally:
        for h in hosts:
            h.stop()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with suppress(asyncio.CancelledError, Exception):
                await t


async def _prune_periodically(ledger: Ledger, cfg: RetentionConfig) -> None:
    """``[retention]``: prune every interval; a failed run is logged and retried next interval."""
    from mcpsync.activities.retention import prune

    while True:
        await asyncio.sleep(cfg.interval_seconds)
        try:
            report = await prune(ledger.pool, keep=timedelta(days=cfg.keep_days),
                                 consumer_max_lag=timedelta(days=cfg.consumer_max_lag_days))
        except Exception as exc:  # a database outage must not take the worker down
            log.warning("retention run failed: %s: %s", type(exc).__name__, str(exc)[:200])
            continue
        log.info("retention: %s", report.model_dump_json(exclude={"dry_run"}))


REVOKE_SIGNALS_IN_FLIGHT = 32


@dataclass(frozen=True)
class Revocation:
    """What ``revoke_subject`` did: the ledger's record, and which workflows mirrored it."""

    ledger: SubjectRevocation
    signalled: list[str]  # live workflows told (the ledger had already revoked them)
    mirrored: list[str] | None = None  # with ``wait``: the signalled workflows whose record says REVOKED
    pending: list[str] | None = None  # with ``wait``: those that had not when the wait ran out


async def revoke_subject(client: Client, ledger: Ledger, *, subject: str, server: str, uri: str | None,
                         reason: str = "revoked by platform", effective_at: datetime | None = None,
                         wait: float | None = None) -> Revocation:
    """revoke(subject, server, uri|*): the ledger first, then the workflows.

    One ledger transaction (``FenceLedger.revoke_subject``) covers every subscription of the
    subject on that server, finished ones included: from its commit on no body of them is released
    or stored, whether or not a worker runs. Then each subscription it moved to REVOKED is signalled
    so its workflow mirrors the state (a workflow that is gone needs nothing). ``wait``: seconds to
    wait for every signalled workflow's record to say REVOKED (``mirrored`` / ``pending``)."""
    effective = effective_at or datetime.now(UTC)
    record = await ledger.fence.revoke_subject(subject, server, uri, reason=reason, effective_at=effective)
    # The ledger has revoked them all; the signals only let the workflows mirror it, so they go out
    # REVOKE_SIGNALS_IN_FLIGHT at a time (a whole subject may hold thousands of subscriptions).
    async def tell(workflow_id: str) -> bool:
        try:
            await client.get_workflow_handle(workflow_id).signal(
                SIGNAL_REVOKE, RevokeRequest(reason=reason, effective_at=effective))
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            return False  # no workflow: the ledger's word is all there is
        return True

    told = await settle_all(record.revoked, tell, limit=REVOKE_SIGNALS_IN_FLIGHT)
    signalled = [w for w, ok in zip(record.revoked, told, strict=True) if ok]
    if wait is None:
        return Revocation(ledger=record, signalled=signalled)
    mirrored, pending = await _wait_mirrored(client, signalled, timeout=wait)
    return Revocation(ledger=record, signalled=signalled, mirrored=mirrored, pending=pending)


async def _wait_mirrored(client: Client, workflow_ids: Sequence[str], *, timeout: float) -> tuple[list[str],
                                                                                                  list[str]]:
    """(mirrored, not yet) among ``workflow_ids`` after at most ``timeout`` seconds: a workflow has
    mirrored the revocation once its record (query ``subscription``) says REVOKED. A workflow that
    cannot answer (no worker) is asked again until the time runs out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    async def one(workflow_id: str) -> bool:
        handle = client.get_workflow_handle(workflow_id)
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return False
            with suppress(Exception):  # no worker polling, or a query that timed out: ask again
                record = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1,
                                            rpc_timeout=timedelta(seconds=max(0.5, min(5.0, left))))
                if record.state == SubscriptionState.REVOKED:
                    return True
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))

    results = await asyncio.gather(*(one(w) for w in workflow_ids))
    mirrored = [w for w, ok in zip(workflow_ids, results, strict=True) if ok]
    return mirrored, [w for w in workflow_ids if w not in mirrored]


async def revoke(client: Client, ledger: Ledger, *, subject: str, server: str, uri: str | None,
                 reason: str = "revoked by platform", effective_at: datetime | None = None) -> list[str]:
    """``revoke_subject`` without waiting; the ids of the workflows it signalled."""
    return (await revoke_subject(client, ledger, subject=subject, server=server, uri=uri, reason=reason,
                                 effective_at=effective_at)).signalled


async def start_catalogs(client: Client, config: Config) -> list[str]:
    """Start (or join) the CatalogWorkflow of every (server, subject) whose server has ``catalog = true``."""
    started = []
    for server in config.servers:
        if not server.catalog:
            continue
        for subject in server.subjects:
            handle = await start_catalog(client, CatalogKey(subject=subject, server=server.name),
                                         task_queue=config.temporal.task_queue)
            started.append(handle.id)
    return started
