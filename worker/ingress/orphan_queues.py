"""The task queues of ingress processes that are gone, polled for a while by the ingress that took over.

Contract:
- An ingress that opens a session of a (subject, server) whose ledger row named another ingress's
  queue ``adopt``s that queue, with that ingress's identity (its lease holder name), until
  ``ADOPT_SECONDS`` after that open. Until then runs may still have MCP activities there: those
  scheduled while the row named it (a run bound to the old session) and their retries, all within
  the MCP activities' schedule-to-close (``MCP_SCHEDULE_TO_CLOSE``); ``ADOPT_MARGIN`` covers a run
  that scheduled one just after the open, before the new generation's ``session_changed`` signal
  reached it. Catalog scans end there sooner (a 30 s schedule-to-start, which Temporal does not retry).
- Level-based: ``run`` polls an adopted queue while it is adopted and its ingress holds no live
  lease on any pair (``SessionLedger.holder_lease_remaining``), and stops polling it when either no
  longer holds. It looks again at each adoption, when that ingress's last lease would run out, and
  at least every ``RECHECK_SECONDS``. An ingress that holds a live lease is alive, or died less than
  its ``lease_seconds`` ago: it polls its queue itself, and a task for a session it holds must reach
  it, not be answered here. One whose leases have all lapsed holds no session, so every task left on
  its queue is for a session that is gone, whoever answers it.
- Polled by a worker with the ingress's own MCP session and catalog scan activities, which dispatch
  by (subject, server) and session generation: a task for an older generation, or for a (subject,
  server) this ingress does not hold, is answered at once as it is on any queue (SESSION_LOST /
  "session generation is gone", nothing sent to any server), and the run rebinds to the session the
  ledger names now. No session of this ingress is recorded with an adopted queue, so nothing else
  is ever answered there.
- A queue adopted again (another of its pairs taken over) is kept until the later bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from temporalio.client import Client as TemporalClient
from temporalio.worker import Worker

from mcpsync.workflows.subscription import MCP_SCHEDULE_TO_CLOSE

__all__ = ["ADOPT_SECONDS", "MCP_SCHEDULE_TO_CLOSE", "OrphanQueues"]

log = logging.getLogger("mcpsync.ingress")

ADOPT_MARGIN = timedelta(seconds=15)
ADOPT_SECONDS = (MCP_SCHEDULE_TO_CLOSE + ADOPT_MARGIN).total_seconds()
RECHECK_SECONDS = 1.0  # how late a previous holder that came back (took a lease again) is left alone
LEASE_WAKE_SLACK_SECONDS = 0.02  # past the previous holder's last lease, as a standby wakes
# Only tasks for sessions that are gone come here, each answered without a request to any server.
MAX_CONCURRENT_ACTIVITIES = 32


class _Leases(Protocol):
    async def holder_lease_remaining(self, holder: str) -> float | None: ...


@dataclass
class _Adopted:
    holder: str  # the lease holder name of the ingress whose queue it is
    until: float  # event loop time the adoption ends
    polling: asyncio.Task[None] | None = None  # the worker's run, while it polls


class OrphanQueues:
    def __init__(self, temporal: TemporalClient, leases: _Leases,
                 activities: Callable[[], Sequence[Callable[..., Any]]]) -> None:
        self.temporal = temporal
        self.leases = leases
        self.activities = activities
        self._adopted: dict[str, _Adopted] = {}
        self._changed = asyncio.Event()

    def adopt(self, task_queue: str, holder: str) -> None:
        """Poll ``task_queue`` of the ingress ``holder`` from now until ``ADOPT_SECONDS`` from now,
        whenever ``holder`` holds no live lease (``run``)."""
        until = asyncio.get_running_loop().time() + ADOPT_SECONDS
        adopted = self._adopted.get(task_queue)
        if adopted is None:
            self._adopted[task_queue] = _Adopted(holder, until)
            log.info("adopted the task queue %s of %s for %.0fs", task_queue, holder, ADOPT_SECONDS)
        else:
            adopted.until = max(adopted.until, until)
        self._changed.set()

    @property
    def polled(self) -> frozenset[str]:
        """The adopted queues a worker of this ingress polls now."""
        return frozenset(q for q, a in self._adopted.items()
                         if a.polling is not None and not a.polling.done())

    async def run(self) -> None:
        """Poll the adopted queues as the contract says, until cancelled."""
        try:
            while True:
                self._changed.clear()
                wait = await self._reconcile()
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), wait)
        finally:
            for task_queue in list(self._adopted):
                await self._stop(task_queue)
            self._adopted.clear()

    async def _reconcile(self) -> float:
        """Poll or stop polling each adopted queue as its state is now; seconds until the next look."""
        now = asyncio.get_running_loop().time()
        wait = RECHECK_SECONDS
        for task_queue, adopted in list(self._adopted.items()):
            if now >= adopted.until:
                await self._stop(task_queue)
                del self._adopted[task_queue]
                continue
            wait = min(wait, adopted.until - now)
            try:
                remaining = await self.leases.holder_lease_remaining(adopted.holder)
            except Exception as exc:  # PostgreSQL away: leave it as it is and look again
                log.warning("adopted task queue %s: its holder's leases unknown (%s)", task_queue,
                            type(exc).__name__)
                continue
            if remaining is None:
                try:
                    self._start(task_queue, adopted)
                except Exception:  # a worker it cannot make: look again at the next recheck
                    log.exception("adopted task queue %s: no worker", task_queue)
            else:
                await self._stop(task_queue)
                wait = min(wait, remaining + LEASE_WAKE_SLACK_SECONDS)
        return max(wait, 0.0)

    def _start(self, task_queue: str, adopted: _Adopted) -> None:
        if adopted.polling is not None and not adopted.polling.done():
            return
        worker = Worker(self.temporal, task_queue=task_queue, activities=list(self.activities()),
                        max_concurrent_activities=MAX_CONCURRENT_ACTIVITIES)
        adopted.polling = asyncio.create_task(worker.run(), name=f"adopted:{task_queue}")
        adopted.polling.add_done_callback(lambda t: self._ended(task_queue, t))
        log.info("polling the adopted task queue %s (%s holds no lease)", task_queue, adopted.holder)

    def _ended(self, task_queue: str, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.warning("the worker of the adopted task queue %s failed: %s", task_queue,
                        type(task.exception()).__name__)
            self._changed.set()  # start it again if it is still wanted

    async def _stop(self, task_queue: str) -> None:
        adopted = self._adopted.get(task_queue)
        if adopted is None or adopted.polling is None:
            return
        polling, adopted.polling = adopted.polling, None
        if not polling.done():
            log.info("stopped polling the adopted task queue %s", task_queue)
        polling.cancel()
        await asyncio.wait([polling])  # its end, whatever it was (``_ended`` said a failure)
