"""ResourceSubscriptionWorkflow: one long-lived workflow per (subject, server, URI).

Contract:
- Temporal's interpreter of ``mcpsync.workflows.subscription_program.SubscriptionProgram``, where
  every decision is made (every safety rule in ``mcpsync.workflows.subscription_state`` and
  ``ledger_rules``); this module declares the wire surface (signals, updates, query, run) and
  turns the program's interpreter calls into activities, timers and search attributes. The
  simulator runs the same program (``sim/``).
- Every allocation and acceptance is a CAS in the ledger, so a reset or rolled-back run can never
  reuse an ordinal. Notifications only invalidate; every read goes through ``resources/read`` on
  the live session (the ingress process's queue). No resource body ever enters this history.
- Ledger calls are local activities (the main worker hosts the ledger activities) and retry until
  they succeed; MCP activities have bounded retries, and their final failure reaches the program as
  ``ActivityFailed`` (the cause's type name, never its message: it may quote content).
- Upgrades (docs/upgrades.md): a versioned main worker runs it PINNED to its build and it
  continues-as-new onto a new current build at its next wake-up; unversioned workers never do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from mcpsync.workflows.interpreter import ActivityFailed, Publication, WaitKind
    from mcpsync.workflows.names import (
        QUERY_SUBSCRIPTION,
        SA_SESSION_GENERATION,
        SA_STATE,
        SA_SUBSCRIPTION_GENERATION,
        SA_WATERMARK,
        SIGNAL_CATALOG_RECONCILED,
        SIGNAL_CLOSE,
        SIGNAL_IDENTITY_CONFLICT,
        SIGNAL_RESOURCE_READ,
        SIGNAL_RESOURCE_UPDATED,
        SIGNAL_REVOKE,
        SIGNAL_SESSION_CHANGED,
        UPDATE_CLOSE,
        UPDATE_FIRST_READ,
        UPDATE_RESUME,
        WORKFLOW_TYPE,
        Act,
    )
    from mcpsync.workflows.records.read_cycle import ReadReport
    from mcpsync.workflows.records.subscription import (
        CatalogObservation,
        CloseReceipt,
        CloseRequest,
        IdentityConflict,
        ResourceUpdated,
        ResumeRequest,
        RevokeRequest,
        SessionChanged,
        SubscriptionKey,
        SubscriptionStart,
    )
    from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
    from mcpsync.workflows.retries import LEDGER_RETRY
    from mcpsync.workflows.subscription_program import SubscriptionProgram
    from mcpsync.workflows.subscription_state import UpdateDisposition
    from mcpsync.workflows.versioning import target_version_changed, upgrade_behavior

__all__ = ["MCP_HEARTBEAT_TIMEOUT", "MCP_SCHEDULE_TO_CLOSE", "ResourceSubscriptionWorkflow"]

T = TypeVar("T")

_LEDGER_TIMEOUT = timedelta(seconds=30)
_MCP_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=500), maximum_interval=timedelta(seconds=10),
                         maximum_attempts=5,
                         non_retryable_error_types=["SessionGenerationMismatch", "MalformedContent"])
# How long an MCP activity may wait on a session's queue, retries included; an ingress that adopts a
# dead ingress's queue polls it at least this long (``mcpsync.worker.ingress.orphan_queues``).
MCP_SCHEDULE_TO_CLOSE = timedelta(seconds=60)
# An attempt whose ingress sends no heartbeat this long (the ingress died: ``worker/ingress/heartbeats.py``)
# times out and is retried on the same queue, answered there by the ingress that took the session over.
MCP_HEARTBEAT_TIMEOUT = timedelta(seconds=10)

KEY_STATE = SearchAttributeKey.for_keyword(SA_STATE)
KEY_SESSION_GEN = SearchAttributeKey.for_int(SA_SESSION_GENERATION)
KEY_SUB_GEN = SearchAttributeKey.for_int(SA_SUBSCRIPTION_GENERATION)
KEY_WATERMARK = SearchAttributeKey.for_int(SA_WATERMARK)


class TemporalInterpreter:
    """``subscription_program.Interpreter`` on Temporal's workflow APIs (deterministic by construction)."""

    def __init__(self, key: SubscriptionKey) -> None:
        self.key = key

    def now(self) -> datetime:
        return workflow.now()

    def uuid4(self) -> str:
        return str(workflow.uuid4())

    def random(self) -> float:
        return workflow.random().random()

    def patched(self, patch_id: str) -> bool:
        return workflow.patched(patch_id)

    def start_time(self) -> datetime | None:
        return workflow.info().start_time

    def first_execution_run_id(self) -> str:
        return workflow.info().first_execution_run_id

    def _summary(self, name: str, arg: object) -> str:
        """The Web UI's activity summary: "read demo://x ordinal 12" (metadata only, never content)."""
        what = name.removeprefix("ledger_").removeprefix("mcp_").replace("_", " ")
        if name == Act.MCP_SUBSCRIBE_CYCLE:
            return f"subscribe {self.key.uri[:160]} (subscribe, mark active, initial read)"
        allocate = getattr(arg, "allocate", None)
        if allocate is not None:  # the read cycle: its ordinal is allocated inside it
            return f"read {self.key.uri[:160]} ({allocate.trigger.value}: allocate, read, accept)"
        outcome = getattr(arg, "outcome", None)
        ordinal = getattr(arg, "ordinal", None) if outcome is None else outcome.ordinal
        return f"{what} {self.key.uri[:160]}" + (f" ordinal {ordinal}" if ordinal is not None else "")

    async def ledger(self, name: str, arg: Any, result_type: type[T]) -> T | None:
        # A local activity: the main worker hosts both the workflow and the ledger activities, so the
        # call skips a task queue round trip and leaves one marker in history.
        result: T | None = await workflow.execute_local_activity(
            name, arg, result_type=result_type, retry_policy=LEDGER_RETRY,
            start_to_close_timeout=_LEDGER_TIMEOUT, summary=self._summary(name, arg))
        return result

    async def mcp(self, task_queue: str, name: str, arg: Any, result_type: type[T]) -> T:
        try:
            result: T = await workflow.execute_activity(
                name, arg, result_type=result_type, task_queue=task_queue, retry_policy=_MCP_RETRY,
                schedule_to_close_timeout=MCP_SCHEDULE_TO_CLOSE, heartbeat_timeout=MCP_HEARTBEAT_TIMEOUT,
                summary=self._summary(name, arg))
        except ActivityError as err:
            raise ActivityFailed(type(err.cause).__name__) from None
        return result

    async def wait(self, condition: Callable[[], bool], timeout: timedelta | None, kind: WaitKind) -> bool:
        try:
            # The timer carries the wait's kind as its summary: the Web UI names each timer (watchdog,
            # deadline, session back-off) and tests count them by kind. Metadata only: replay ignores it.
            await workflow.wait_condition(condition, timeout=timeout,
                                          timeout_summary=kind.value if timeout is not None else None)
        except TimeoutError:
            return False
        return True

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.create_task(coro)

    def all_handlers_finished(self) -> bool:
        return workflow.all_handlers_finished()

    def continue_as_new_suggested(self) -> bool:
        return workflow.info().is_continue_as_new_suggested()

    def history_length(self) -> int:
        return workflow.info().get_current_history_length()

    def target_version_changed(self) -> bool:
        return target_version_changed()

    def continue_as_new(self, start: SubscriptionStart) -> NoReturn:
        workflow.continue_as_new(start, initial_versioning_behavior=upgrade_behavior())

    def publish(self, publication: Publication) -> None:
        if publication.upsert:
            workflow.upsert_search_attributes([
                KEY_STATE.value_set(publication.state.value),
                KEY_SESSION_GEN.value_set(publication.session_generation),
                KEY_SUB_GEN.value_set(publication.subscription_generation),
                KEY_WATERMARK.value_set(publication.watermark),
            ])
        if publication.details is not None:
            workflow.set_current_details(publication.details())

    def update_noted(self, notification_id: str | None, disposition: UpdateDisposition) -> None:
        workflow.logger.debug("resource_updated %s: %s", notification_id or "-", disposition.value)

    def loop_iteration(self) -> None:
        pass  # Temporal's deadlock detector bounds a workflow task that never yields


@workflow.defn(name=WORKFLOW_TYPE)
class ResourceSubscriptionWorkflow:
    @workflow.init
    def __init__(self, start: SubscriptionStart) -> None:
        self.program = SubscriptionProgram(start, TemporalInterpreter(start.key))

    # A notification that arrives as the run ends only has an audit row left to write: abandon it.
    @workflow.signal(name=SIGNAL_RESOURCE_UPDATED, unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON,
                     description="An invalidation from the ingress (never content): coalesced into at most "
                                 "one follow-up read; from an older session: audited, ignored.")
    async def resource_updated(self, sig: ResourceUpdated) -> None:
        await self.program.on_resource_updated(sig)

    @workflow.signal(name=SIGNAL_RESOURCE_READ, unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON,
                     description="The ingress read a notified change itself (digest and verdict, never "
                                 "content): mirrored into the fence; the update is then noted, covered by "
                                 "that read.")
    async def resource_read(self, report: ReadReport) -> None:
        await self.program.on_read_reported(report)

    @workflow.signal(name=SIGNAL_SESSION_CHANGED,
                     description="The session host opened a new session generation: resubscribe and re-read.")
    def session_changed(self, sig: SessionChanged) -> None:
        self.program.on_session_changed(sig)

    @workflow.signal(name=SIGNAL_CATALOG_RECONCILED,
                     description="A reconciled catalog's word on this URI: confirms a tombstone, or earns a "
                                 "verification read; never moves the read deadline.")
    def catalog_reconciled(self, obs: CatalogObservation) -> None:
        self.program.on_catalog_reconciled(obs)

    @workflow.signal(name=SIGNAL_REVOKE,
                     description="Platform revocation: REVOKED, cached bodies purged, outbox 'revoked'.")
    def revoke(self, req: RevokeRequest) -> None:
        self.program.on_revoke(req)

    @workflow.signal(name=SIGNAL_IDENTITY_CONFLICT,
                     description="A URI that matches only after normalization: RECONCILIATION_REQUIRED.")
    def identity_conflict(self, conflict: IdentityConflict) -> None:
        self.program.on_identity_conflict(conflict)

    @workflow.update(name=UPDATE_RESUME,
                     description="Leave RECONCILIATION_REQUIRED: back to ACTIVE with a fresh read; returns "
                                 "the record.")
    async def resume(self, req: ResumeRequest) -> ResourceSubscriptionV1:
        return await self.program.on_resume(req)

    @resume.validator
    def _validate_resume(self, req: ResumeRequest) -> None:
        self.program.validate_resume(req)

    @workflow.update(name=UPDATE_FIRST_READ,
                     description="The record once the first read was judged (its receipt), or once no read "
                                 "will come (TOMBSTONE_PENDING, RECONCILIATION_REQUIRED, closing, ended).")
    async def first_read(self) -> ResourceSubscriptionV1:
        return await self.program.on_first_read()

    @workflow.signal(name=SIGNAL_CLOSE, description="Fire-and-forget close (see the close update).")
    def close_signal(self, req: CloseRequest) -> None:
        self.program.on_close_signal(req)

    @workflow.update(name=UPDATE_CLOSE,
                     description="ACTIVE -> UNSUBSCRIBING (close ordinal frozen) -> CLOSED | "
                                 "UNSUBSCRIBE_UNKNOWN; returns the close receipt.")
    async def close(self, req: CloseRequest) -> CloseReceipt:
        return await self.program.on_close(req)

    @close.validator
    def _validate_close(self, req: CloseRequest) -> None:
        self.program.validate_close(req)

    @workflow.query(name=QUERY_SUBSCRIPTION,
                    description="This subscription's resourceSubscription.v1 record.")
    def subscription(self) -> ResourceSubscriptionV1:
        return self.program.record()

    @workflow.run
    async def run(self, start: SubscriptionStart) -> ResourceSubscriptionV1:
        return await self.program.run()
