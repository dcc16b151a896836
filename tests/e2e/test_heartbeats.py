"""``mcpsync.worker.ingress.heartbeats`` on the real dev server: an activity scheduled with a heartbeat
timeout
that runs longer than it completes in its first attempt on a worker with the interceptor, and times
out without it (what a dead ingress's attempt does)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, TimeoutError, TimeoutType
from temporalio.worker import Worker

from mcpsync.worker.ingress.heartbeats import Heartbeats

HEARTBEAT_TIMEOUT = timedelta(seconds=1)
RUNS_FOR = 2.5  # seconds: longer than two heartbeat timeouts


@activity.defn(name="heartbeats_test_slow")
async def slow(seconds: float) -> int:
    await asyncio.sleep(seconds)  # no heartbeat of its own: the interceptor's or none
    return activity.info().attempt


@workflow.defn(name="HeartbeatsTest")
class SlowActivityWorkflow:
    @workflow.run
    async def run(self, seconds: float) -> int:
        attempt: int = await workflow.execute_activity(
            slow, seconds, heartbeat_timeout=HEARTBEAT_TIMEOUT,
            schedule_to_close_timeout=timedelta(seconds=30), retry_policy=RetryPolicy(maximum_attempts=1))
        return attempt


async def _run(client: Client, *, interceptors: list[Heartbeats]) -> int:
    queue = f"heartbeats-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=queue, workflows=[SlowActivityWorkflow], activities=[slow],
                      interceptors=interceptors):
        result: int = await client.execute_workflow(SlowActivityWorkflow.run, RUNS_FOR, id=queue,
                                                    task_queue=queue)
        return result


async def test_a_long_activity_heartbeats_through_the_interceptor(temporal_client: Client) -> None:
    assert await _run(temporal_client, interceptors=[Heartbeats()]) == 1


async def test_without_heartbeats_the_same_activity_times_out(temporal_client: Client) -> None:
    with pytest.raises(WorkflowFailureError) as failed:
        await _run(temporal_client, interceptors=[])
    cause = failed.value.cause
    assert isinstance(cause, ActivityError) and isinstance(cause.cause, TimeoutError)
    assert cause.cause.type == TimeoutType.HEARTBEAT
