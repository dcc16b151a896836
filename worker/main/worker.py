"""The main worker: every workflow and the ledger activities, on the configured task queue.

Contract:
- ``main_worker`` is the worker for workflows and ledger activities, as ``[temporal]`` says.
- With ``[temporal] deployment_name``/``build_id`` the main worker runs under Worker
  Deployment Versioning (its workflows PINNED by default behaviour; docs/upgrades.md); without,
  exactly as before (no behaviour is declared anywhere: the server refuses one from an
  unversioned worker).
- ``MAIN_WORKFLOWS`` is every workflow it runs; ``workflow_runner`` is its runner for each
  ``[temporal] workflow_runner``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from temporalio.client import Client
from temporalio.common import (
    WorkerDeploymentVersion,
)
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkerDeploymentConfig, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.answers import AnswerLedger, AnswerLedgerActivities
from mcpsync.activities.ledger.catalog import CatalogLedger, CatalogLedgerActivities
from mcpsync.worker.main.config import TemporalConfig, WorkflowRunnerKind
from mcpsync.workflows.answer import AnswerWorkflow
from mcpsync.workflows.catalog import CatalogWorkflow
from mcpsync.workflows.subscription import ResourceSubscriptionWorkflow
from mcpsync.workflows.versioning import MAIN_WORKER_BEHAVIOR

__all__ = ["MAIN_WORKFLOWS", "deployment_version", "main_worker", "workflow_runner"]


MAIN_WORKFLOWS = (ResourceSubscriptionWorkflow, CatalogWorkflow, AnswerWorkflow)
"""Every workflow the main worker runs (on ``workflow_runner([temporal] workflow_runner)``); the replay
test (tests/unit/test_replay.py) replays recorded histories against exactly these, in the SDK's strict
sandbox and on each configurable runner."""

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
        activities=ledger.activities()
        + CatalogLedgerActivities(CatalogLedger(ledger.pool), ledger, client, temporal.task_queue).all()
        + AnswerLedgerActivities(AnswerLedger(ledger.pool)).all(),
        max_concurrent_activities=64,
        max_cached_workflows=temporal.max_cached_workflows,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=temporal.sticky_queue_timeout_seconds),
        workflow_runner=workflow_runner(temporal.workflow_runner),
    )
