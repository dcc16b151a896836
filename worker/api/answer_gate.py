"""Python API of the answer freshness gate, for host applications.

Contract:
- ``AnswerGate(client, task_queue)`` talks to one ``AnswerWorkflow`` per answer id through
  Temporal updates: ``bind``, ``select_input``, ``check`` (update-with-start, so a call never
  depends on whether the answer's workflow is running: a new run reloads the answer from
  PostgreSQL), resent under its update id while the server answers that it was not applied
  (``workflow_updates``). ``answer`` queries the ``answerBinding.v1`` record.
- A refused request (unknown receipt, a receipt of another resource, a URI that is not a
  dependency, an answer never bound) raises ``AnswerGateError`` with the reason; nothing
  else is swallowed.
- ``latest_receipts(ledger, subject, server, uris)`` is a direct ledger read (no workflow):
  per URI the subscription state and the latest accepted receipt, i.e. what a host should
  select before checking.
- Only receipt ids, digests and the question cross this API: never a resource body.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.answers import AnswerLedger
from mcpsync.activities.workflow_updates import execute_update_with_start
from mcpsync.workflows.answer_rules import (
    AnswerBindingV1,
    AnswerDependency,
    AnswerStart,
    BindRequest,
    CheckRequest,
    Disposition,
    FreshnessPolicy,
    LatestReceipt,
    SelectInputRequest,
)
from mcpsync.workflows.names import (
    ANSWER_WORKFLOW_TYPE,
    QUERY_ANSWER,
    UPDATE_BIND,
    UPDATE_CHECK,
    UPDATE_SELECT_INPUT,
    answer_workflow_id,
)

__all__ = ["AnswerGate", "AnswerGateError", "DependencyLike", "latest_receipts"]

DependencyLike = AnswerDependency | tuple[str, str, str, int] | dict[str, Any]
"""A dependency as ``AnswerDependency``, ``(subject, server, uri, receipt_id)`` or a dict of those fields."""


class AnswerGateError(RuntimeError):
    """The gate refused the request (the message says why) or the answer does not exist."""


def _dependency(dep: DependencyLike) -> AnswerDependency:
    if isinstance(dep, AnswerDependency):
        return dep
    if isinstance(dep, tuple):
        subject, server, uri, receipt_id = dep
        return AnswerDependency(subject=subject, server=server, uri=uri, receipt_id=receipt_id)
    return AnswerDependency.model_validate(dep)


class AnswerGate:
    def __init__(self, client: Client, task_queue: str, *, idle_seconds: float = 86_400.0) -> None:
        self.client = client
        self.task_queue = task_queue
        self.idle_seconds = idle_seconds

    async def bind(self, answer_id: str, question: str,
                   dependencies: Iterable[DependencyLike]) -> AnswerBindingV1:
        """Bind (or rebind: a new revision) the answer draft to the observations it used."""
        req = BindRequest(answer_id=answer_id, question=question,
                          dependencies=[_dependency(d) for d in dependencies])
        result: AnswerBindingV1 = await self._update(answer_id, UPDATE_BIND, req, AnswerBindingV1)
        return result

    async def select_input(self, answer_id: str, uri: str, receipt_id: int) -> AnswerBindingV1:
        """Record that the next answering step uses receipt ``receipt_id`` for dependency ``uri``."""
        req = SelectInputRequest(answer_id=answer_id, uri=uri, receipt_id=receipt_id)
        result: AnswerBindingV1 = await self._update(answer_id, UPDATE_SELECT_INPUT, req, AnswerBindingV1)
        return result

    async def check(self, answer_id: str, *, policy: FreshnessPolicy | None = None) -> Disposition:
        """HOLD or ACCEPT, with the reason; every disposition is persisted."""
        req = CheckRequest(answer_id=answer_id, policy=policy or FreshnessPolicy())
        result: Disposition = await self._update(answer_id, UPDATE_CHECK, req, Disposition)
        return result

    async def answer(self, answer_id: str) -> AnswerBindingV1:
        """The ``answerBinding.v1`` record of a running answer workflow."""
        try:
            result: AnswerBindingV1 = await self.client.get_workflow_handle(
                answer_workflow_id(answer_id)).query(QUERY_ANSWER, result_type=AnswerBindingV1)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise AnswerGateError(f"no answer {answer_id!r}") from None
            raise
        return result

    async def _update(self, answer_id: str, name: str, arg: object, result_type: type) -> Any:
        workflow_id = answer_workflow_id(answer_id)

        def start() -> WithStartWorkflowOperation[Any, Any]:
            return WithStartWorkflowOperation(
                ANSWER_WORKFLOW_TYPE,
                AnswerStart(answer_id=answer_id, idle_seconds=self.idle_seconds),
                id=workflow_id,
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                memo={"answer_id": answer_id},
                static_summary=f"answer {answer_id[:180]}",
            )

        try:
            answered: tuple[Any, Any] = await execute_update_with_start(
                self.client, name, [arg], workflow_id=workflow_id, start=start, result_type=result_type)
            return answered[0]
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            message = cause.message if isinstance(cause, ApplicationError) else str(cause)
            raise AnswerGateError(f"{name} refused: {message}") from None


async def latest_receipts(ledger: Ledger, subject: str, server: str,
                          uris: Sequence[str]) -> dict[str, LatestReceipt]:
    """Per URI: subscription state and latest accepted receipt, read straight from the ledger."""
    return await AnswerLedger(ledger.pool).latest_receipts(subject, server, uris)
