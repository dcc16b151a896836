"""One ingress process: one Temporal worker on one task queue for every MCP session it holds.

Contract:
- An ``Ingress`` has one identity (``node:pid:random``): the lease holder name of every
  (subject, server) it owns, and the source of its one task queue (``ingress_task_queue``).
  Each of its ``SessionHost``s records that queue in the ledger's session row when it opens a
  session under its lease, so the row maps (subject, server) to the owner's queue; workflows
  schedule MCP activities on ``SessionInfo.task_queue`` and never see the difference.
- Its one worker runs the MCP session and catalog scan activities of all its sessions. Every
  request names (subject, server) and the session generation it was made for; it runs over the
  live session of that (subject, server) held by THIS ingress, and only at that generation.
  A (subject, server) not held here (never, lease lost, session lost or replaced) answers as an
  older generation always did: SESSION_LOST / "session generation is gone", nothing sent.
- Hosting costs per process, not per subject: one worker, its activity pollers (the SDK's
  default) and its slots, whatever the number of sessions. The queue is polled for the life of
  the ingress; nothing is scheduled on it unless one of its sessions was recorded with it.
- A takeover moves the queue with the session: the new owner opens a new generation recorded
  with its own queue. Activities still scheduled on the previous owner's queue are answered
  SESSION_LOST by a living previous owner; once that owner holds no live lease (it died, or holds
  nothing) the new owner polls that queue too, for a while, and answers them the same
  (``adopt``, ``mcpsync.worker.ingress.orphan_queues``). The workflow rebinds either way. An activity a
  dead owner had already started stops heartbeating (``mcpsync.worker.ingress.heartbeats``): it times out
  after its heartbeat timeout and its retry is answered there the same.
- A (subject, server) has at most one host per ingress (``attach`` refuses a second).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from contextlib import suppress
from typing import Protocol

from temporalio.client import Client as TemporalClient
from temporalio.worker import Worker

from mcpsync.activities.catalog_scan import CatalogScanActivities
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.catalog import CatalogLedger
from mcpsync.activities.mcp_session import LiveSession, McpSessionActivities
from mcpsync.worker.ingress.heartbeats import Heartbeats
from mcpsync.worker.ingress.orphan_queues import OrphanQueues
from mcpsync.worker.ingress.resync import Resync, ResyncHost
from mcpsync.worker.observe import metrics

__all__ = ["Ingress", "ingress_task_queue"]

# Slots are shared by every session of the process now (one worker per session had 64 each):
# reads are I/O waits bounded by each server's read timeout, so a few hundred cost little.
MAX_CONCURRENT_ACTIVITIES = 256


def ingress_task_queue(identity: str) -> str:
    """The task queue of the ingress named ``identity`` (its MCP session activities)."""
    return f"mcpsync-ingress/{identity}"


class _Hosted(Protocol):
    """What the ingress asks of a session host (``mcpsync.worker.ingress.session_host.SessionHost``)."""

    live: LiveSession | None

    def list_changed_count(self, generation: int) -> int: ...


class Ingress:
    def __init__(self, temporal: TemporalClient, ledger: Ledger, *, identity: str | None = None) -> None:
        self.temporal = temporal
        self.ledger = ledger
        self.identity = identity or f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.task_queue = ingress_task_queue(self.identity)
        self._hosts: dict[tuple[str, str], _Hosted] = {}
        self._worker: Worker | None = None  # run()'s, for ``polling``
        # What the worker runs (tests call them directly to see the dispatch by key).
        self.mcp = McpSessionActivities(self.live, ledger, metrics.PROMETHEUS)
        self.scans = CatalogScanActivities(self.live, self.list_changed_count, CatalogLedger(ledger.pool))
        # The queues of previous holders of its sessions, polled by ``run`` while they hold no lease.
        self.orphans = OrphanQueues(temporal, ledger.sessions, lambda: self.mcp.all() + self.scans.all())

    def attach(self, subject: str, server: str, host: _Hosted) -> None:
        if self._hosts.setdefault((subject, server), host) is not host:
            raise ValueError(f"ingress {self.identity} already hosts ({subject!r}, {server!r})")

    def detach(self, subject: str, server: str, host: _Hosted) -> None:
        if self._hosts.get((subject, server)) is host:
            del self._hosts[(subject, server)]

    def resync(self, host: ResyncHost, ready: Callable[[], None]) -> Resync:
        """The sweep of ``host``'s due verifications (``mcpsync.worker.ingress.resync``); ``ready`` wakes
        one of its routers."""
        return Resync(host.router, subject=host.subject, server=host.server.name, ready=ready, host=host)

    def live(self, subject: str, server: str) -> LiveSession | None:
        """The live session of (subject, server) this ingress holds, or None."""
        host = self._hosts.get((subject, server))
        return host.live if host is not None else None

    def list_changed_count(self, subject: str, server: str, generation: int) -> int:
        host = self._hosts.get((subject, server))
        return host.list_changed_count(generation) if host is not None else 0

    def adopt(self, task_queue: str, holder: str) -> None:
        """A session of this ingress replaced one recorded with ``task_queue`` by ``holder``: poll
        that queue too for a while when it is another ingress's (``OrphanQueues.adopt``)."""
        if task_queue != self.task_queue:
            self.orphans.adopt(task_queue, holder)

    async def run(self) -> None:
        """Poll the ingress queue, and the queues it adopted, until cancelled."""
        self._worker = Worker(self.temporal, task_queue=self.task_queue,
                              activities=self.mcp.all() + self.scans.all(),
                              max_concurrent_activities=MAX_CONCURRENT_ACTIVITIES,
                              interceptors=[Heartbeats()])
        orphans = asyncio.create_task(self.orphans.run(), name=f"orphan-queues:{self.identity}")
        try:
            await self._worker.run()
        finally:
            orphans.cancel()
            with suppress(asyncio.CancelledError):
                await orphans

    @property
    def polling(self) -> bool:
        """True once ``run``'s worker polls (past the SDK's namespace check) and until it stops."""
        return self._worker is not None and self._worker.is_running
