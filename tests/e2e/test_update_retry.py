"""``workflow_updates`` against a real Temporal dev server: an update whose workflow task fails on the
server is resent under its id and applied once.

The probe workflow's update handler, while its workflow id has faults left, upserts a search
attribute the namespace does not define: the server refuses that workflow task completion
(BAD_SEARCH_ATTRIBUTES), drops the update's acceptance with it and aborts the update with
"Unable to perform workflow execution update due to unexpected workflow task failure." (the error
of the crosscheck failure under CPU starvation, where the task failed for another reason). The fault
counter lives in this process (the probe runs unsandboxed on a worker of this test), so a fault
happens once per count, not again on replay.

- The SDK alone surfaces the abort, and nothing was applied: the fault is real.
- ``execute_update``: one resend under the same id, the handler's effect once, one acceptance in
  history under that id; the same id sent again answers that outcome without applying it again.
- ``execute_update_with_start``: the first task of a new run fails; the resend joins that run.
- A fault on every send gives up after the bounded attempts with the server's error; an update the
  validator rejects is not resent.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributeKey, WorkflowIDConflictPolicy
from temporalio.service import RPCError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from mcpsync.activities.workflow_updates import execute_update, execute_update_with_start, update_not_applied
from tests.conftest import unique

FAULTS: dict[str, int] = {}  # workflow id -> update tasks still to fail
UNDEFINED = SearchAttributeKey.for_keyword("McpsyncTestUndefinedAttribute")
ABORTED = "Unable to perform workflow execution update due to unexpected workflow task failure."
BAD_SEARCH_ATTRIBUTES = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_BAD_SEARCH_ATTRIBUTES


@workflow.defn(name="McpsyncUpdateRetryProbe")
class UpdateProbe:
    def __init__(self) -> None:
        self.applied: list[str] = []
        self.done = False

    @workflow.run
    async def run(self) -> list[str]:
        await workflow.wait_condition(lambda: self.done)
        return self.applied

    @workflow.update(name="apply")
    def apply(self, token: str) -> int:
        wid = workflow.info().workflow_id
        if FAULTS.get(wid, 0) > 0:
            FAULTS[wid] -= 1
            workflow.upsert_search_attributes([UNDEFINED.value_set("x")])  # the server fails this task
        self.applied.append(token)
        return len(self.applied)

    @apply.validator
    def _validate_apply(self, token: str) -> None:
        if not token:
            raise ValueError("empty token")

    @workflow.query(name="applied")
    def applied_tokens(self) -> list[str]:
        return self.applied

    @workflow.signal(name="finish")
    def finish(self) -> None:
        self.done = True


@pytest.fixture
async def queue(temporal_client: Client) -> AsyncIterator[str]:
    task_queue = unique("updretry")
    async with Worker(temporal_client, task_queue=task_queue, workflows=[UpdateProbe],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        yield task_queue


async def _start(client: Client, queue: str, faults: int) -> WorkflowHandle[UpdateProbe, list[str]]:
    wid = unique("updretry")
    FAULTS[wid] = faults
    return await client.start_workflow(UpdateProbe.run, id=wid, task_queue=queue)


async def _history(handle: WorkflowHandle) -> tuple[list[str], list[int]]:
    """The update ids accepted in the run's history, and the causes of its failed workflow tasks."""
    accepted, failed = [], []
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            accepted.append(ev.workflow_execution_update_accepted_event_attributes.accepted_request.meta.update_id)
        elif ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failed.append(ev.workflow_task_failed_event_attributes.cause)
    return accepted, failed


def _resends(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "mcpsync.updates" and r.levelno == logging.WARNING]


async def test_the_sdk_alone_surfaces_the_abort_and_nothing_is_applied(temporal_client: Client,
                                                                       queue: str) -> None:
    handle = await _start(temporal_client, queue, faults=1)
    try:
        with pytest.raises(RPCError) as raised:
            await handle.execute_update(UpdateProbe.apply, "a")
        assert str(raised.value) == ABORTED and update_not_applied(raised.value)
        assert await handle.query(UpdateProbe.applied_tokens) == []
        accepted, failed = await _history(handle)
        assert accepted == [] and failed == [BAD_SEARCH_ATTRIBUTES]
    finally:
        await handle.terminate()


async def test_the_helper_resends_under_the_same_id_and_the_update_is_applied_once(
        temporal_client: Client, queue: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mcpsync.updates")
    handle = await _start(temporal_client, queue, faults=1)
    update_id = unique("apply")
    assert await execute_update(handle, "apply", ["a"], result_type=int, update_id=update_id) == 1
    assert FAULTS[handle.id] == 0  # the first send met the fault
    [resent] = _resends(caplog)
    assert update_id in resent and ABORTED in resent and "attempt 2 of 5" in resent
    assert await handle.query(UpdateProbe.applied_tokens) == ["a"]
    accepted, failed = await _history(handle)
    assert accepted == [update_id] and failed == [BAD_SEARCH_ATTRIBUTES]

    # The same id again: the server answers the accepted update's outcome; the handler does not run.
    assert await execute_update(handle, "apply", ["a"], result_type=int, update_id=update_id) == 1
    await handle.signal(UpdateProbe.finish)
    assert await handle.result() == ["a"]
    assert (await _history(handle))[0] == [update_id]


async def test_update_with_start_resends_and_joins_the_run_the_first_send_started(
        temporal_client: Client, queue: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mcpsync.updates")
    wid = unique("updretry-uws")
    FAULTS[wid] = 1
    starts: list[WithStartWorkflowOperation] = []

    def start() -> WithStartWorkflowOperation:
        starts.append(WithStartWorkflowOperation(UpdateProbe.run, id=wid, task_queue=queue,
                                                 id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING))
        return starts[-1]

    result, operation = await execute_update_with_start(temporal_client, "apply", ["w"], workflow_id=wid,
                                                        start=start, result_type=int)
    handle = await operation.workflow_handle()
    try:
        assert result == 1 and len(starts) == 2 and operation is starts[1] and len(_resends(caplog)) == 1
        # One run: the resend joined the run whose first workflow task failed with the first send.
        assert (await handle.describe()).run_id == handle.result_run_id
        assert await handle.query(UpdateProbe.applied_tokens) == ["w"]
        accepted, failed = await _history(handle)
        assert len(accepted) == 1 and failed == [BAD_SEARCH_ATTRIBUTES]
    finally:
        await handle.terminate()


async def test_a_fault_on_every_send_gives_up_after_the_bounded_attempts(
        temporal_client: Client, queue: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mcpsync.updates")
    handle = await _start(temporal_client, queue, faults=100)
    try:
        with pytest.raises(RPCError) as raised:
            await execute_update(handle, "apply", ["a"], result_type=int, attempts=2)
        assert update_not_applied(raised.value)
        assert len(_resends(caplog)) == 1
        accepted, failed = await _history(handle)
        assert accepted == [] and len(failed) >= 1
    finally:
        await handle.terminate()


async def test_an_update_the_validator_rejects_is_not_resent(temporal_client: Client, queue: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="mcpsync.updates")
    handle = await _start(temporal_client, queue, faults=0)
    try:
        with pytest.raises(WorkflowUpdateFailedError):
            await execute_update(handle, "apply", [""], result_type=int)
        assert _resends(caplog) == []
        assert not update_not_applied(WorkflowUpdateFailedError(RuntimeError("x")))
    finally:
        await handle.terminate()
