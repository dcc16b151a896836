"""Heartbeats for the ingress's activities, so that one a dead ingress had started ends at its heartbeat
timeout instead of its schedule-to-close.

Contract:
- ``Heartbeats`` is a Temporal worker interceptor. An activity scheduled with a heartbeat timeout
  (the subscription workflow's MCP activities: ``MCP_HEARTBEAT_TIMEOUT``) heartbeats every
  ``BEAT_FRACTION`` of that timeout while it runs, from a task of its own, whatever it awaits (a
  slow server's read included). An activity without one runs as it would without the interceptor.
- Most MCP activities end in milliseconds, before their first beat: they send no heartbeat at all.
  The SDK throttles what a longer one sends (at most one per 0.8 of the timeout).
- What a heartbeat proves is that the ingress process runs: a SIGKILLed ingress sends none, so the
  server times the attempt out after the heartbeat timeout and retries it on the same queue, where the
  ingress that took the session over answers it at once (``mcpsync.worker.ingress.orphan_queues``). No
  heartbeat carries details.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

__all__ = ["BEAT_FRACTION", "Heartbeats"]

BEAT_FRACTION = 0.25  # four beats per heartbeat timeout: one lost or late beat is not a timeout


class Heartbeats(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Beating(next)


class _Beating(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        timeout = activity.info().heartbeat_timeout
        if not timeout:
            return await self.next.execute_activity(input)
        beats = asyncio.create_task(_beat(timeout.total_seconds() * BEAT_FRACTION))
        try:
            return await self.next.execute_activity(input)
        finally:
            beats.cancel()


async def _beat(every: float) -> None:
    while True:
        await asyncio.sleep(every)
        activity.heartbeat()
