"""Workflow updates sent from mcpsync's own clients: one place that sends them and retries the one
server answer that says the update was not applied.

Contract: ``execute_update`` (an update on a running workflow) and ``execute_update_with_start``
(Update-with-Start) send the update under one update id, generated once per call unless the caller
gives one, and resend it under that same id, at most ``UPDATE_ATTEMPTS`` sends in all with a short
doubling pause between them, only while the server answers ``WorkflowNotReady``
(``FAILED_PRECONDITION`` with a ``WorkflowNotReadyFailure`` detail). That answer comes in two forms,
both before the update was accepted:

- "Unable to perform workflow execution update due to unexpected workflow task failure.": the
  workflow task that carried the update to the worker failed on the server while the worker
  completed it (a command or message the server refused, e.g. a completion with new signals
  buffered meanwhile, an undefined search attribute). The server drops that completion (the
  update's acceptance with it), records a failed workflow task, retries the task without the
  update, and aborts the update without retrying it itself (it could be what failed the task).
- "... due to Workflow Task in failed state.": the run's workflow task has failed (or timed out)
  repeatedly, so the server refuses to admit the update at all.

In both the history holds no acceptance of the update, so the workflow never applied it. Resending
under the same id is idempotent: the server deduplicates update ids on a run, so a copy that was
accepted after all answers the outcome of that acceptance instead of running twice. Effects outside
history from the dropped task (its local activities: the ledger's fenced, idempotent steps) may
have happened and are performed again, as after any workflow task retry or reset.

The sends are bounded because an update that fails its task every time (a bug) fails the same way
each time: the last attempt's ``RPCError`` is raised. Every other error (the update's own failure
``WorkflowUpdateFailedError``, ``NOT_FOUND``, a cancelled or timed-out wait) is raised at once,
never retried here. The caller bounds the whole call (``asyncio.wait_for``) as before.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any, TypeVar

from temporalio.api.errordetails.v1 import MultiOperationExecutionFailure, WorkflowNotReadyFailure
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

__all__ = ["UPDATE_ATTEMPTS", "execute_update", "execute_update_with_start", "update_not_applied"]

T = TypeVar("T")

UPDATE_ATTEMPTS = 5  # sends of one update in all, while the server answers that it was not applied
FIRST_PAUSE_S = 0.25  # before the second send; doubled before each further one (0.25 + ... + 2 = 3.75 s)

log = logging.getLogger("mcpsync.updates")


def update_not_applied(err: BaseException) -> bool:
    """The server's ``WorkflowNotReady`` answer to an update (see the module docstring): the update
    was not accepted. Update-with-Start carries it inside a ``MultiOperationExecutionFailure``."""
    if not isinstance(err, RPCError) or err.status != RPCStatusCode.FAILED_PRECONDITION:
        return False
    details = list(err.grpc_status.details)
    multi = MultiOperationExecutionFailure()
    if details and details[0].Unpack(multi):
        details = [d for status in multi.statuses for d in status.details[:1]]
    return any(d.Is(WorkflowNotReadyFailure.DESCRIPTOR) for d in details)


async def _resend(send: Callable[[], Any], *, workflow_id: str, update: str, update_id: str,
                  attempts: int) -> Any:
    for attempt in range(1, attempts + 1):
        try:
            return await send()
        except RPCError as err:
            if attempt == attempts or not update_not_applied(err):
                raise
            pause = FIRST_PAUSE_S * 2 ** (attempt - 1)
            log.warning("update %s (id %s) on workflow %s not applied (%s): resending in %.2f s, "
                        "attempt %d of %d", update, update_id, workflow_id, err.message, pause,
                        attempt + 1, attempts)
            await asyncio.sleep(pause)
    raise AssertionError("unreachable")


async def execute_update(handle: WorkflowHandle[Any, Any], update: str, args: Sequence[Any] = (), *,
                         result_type: type[T], update_id: str | None = None,
                         attempts: int = UPDATE_ATTEMPTS) -> T:
    """``handle.execute_update(update, args=args)``, resent under the same update id while the server
    answers that it was not applied (module docstring); its result."""
    update_id = update_id or str(uuid.uuid4())

    async def send() -> T:
        result: T = await handle.execute_update(update, args=list(args), id=update_id,
                                                result_type=result_type)
        return result

    result: T = await _resend(send, workflow_id=handle.id, update=update, update_id=update_id,
                              attempts=attempts)
    return result


async def execute_update_with_start(
        client: Client, update: str, args: Sequence[Any] = (), *, workflow_id: str,
        start: Callable[[], WithStartWorkflowOperation[Any, Any]], result_type: type[T],
        update_id: str | None = None, attempts: int = UPDATE_ATTEMPTS,
) -> tuple[T, WithStartWorkflowOperation[Any, Any]]:
    """``client.execute_update_with_start_workflow`` likewise: ``start`` makes the start operation of
    ``workflow_id`` (one per send: the SDK uses an operation once; its conflict policy joins the run an
    earlier send started). The update's result and the operation of the send that answered it."""
    update_id = update_id or str(uuid.uuid4())
    operation: WithStartWorkflowOperation[Any, Any] | None = None

    async def send() -> T:
        nonlocal operation
        operation = start()
        try:
            result: T = await client.execute_update_with_start_workflow(
                update, args=list(args), start_workflow_operation=operation, id=update_id,
                result_type=result_type)
        except RPCError:
            # The SDK also sets the error on the operation's handle future: retrieved here, so that
            # asyncio does not report it as never retrieved once a resend replaced the operation.
            with suppress(Exception):
                await asyncio.wait_for(operation.workflow_handle(), 1.0)
            raise
        return result

    result: T = await _resend(send, workflow_id=workflow_id, update=update, update_id=update_id,
                              attempts=attempts)
    assert operation is not None
    return result, operation
