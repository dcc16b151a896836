"""The ingress's resync: a subscribed URI is read at the ingress before its safety read is due.

Contract:
- ``ReadClock`` (one per ingress process) is told of every granted read allocation its read cycles
  make (``McpSessionActivities.read_observer``): reads on a notification at the ingress and the
  workflows' read-cycle activities alike, since both run in this process. It keeps, per (subject,
  server, URI), the monotonic time the newest allocation was asked for.
- ``Resync`` (one per ``SessionHost``) sweeps while the host holds a live session: a URI of an
  ACTIVE row that said its safety-read period (``FenceLedger.resync_periods``, refreshed every
  ``REFRESH_SECONDS`` and soon after a URI not asked about was read) whose last read is older
  than ``resync_rules.resync_due_at`` is fed to the host's router exactly as a notification is
  (``IngressRouter.offer``), in the queue's background lane (after every notified key), never
  counted as one (``fed`` counts them). The router then reads it at the ingress and reports it
  (``resource_read``): one signal and one workflow task instead of the deadline timer's firing, a
  cross-queue read-cycle activity and two workflow tasks. A URI first seen counts as read then (an
  ingress that just started waits a whole resync period: at worst the workflow's timer fires once).
- Correctness is unchanged by construction: to the coverage rule a synthetic note is a spurious
  notification; the staleness bound is still kept by the workflow's own deadline timer, which
  fires whenever the resync did not read in time (ingress stopped, a read refused or failed).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.mcp_session import LiveSession
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.ingress import IngressRouter, Offer
from mcpsync.workflows.records.subscription import SubscriptionKey
from mcpsync.workflows.resync_rules import resync_due_at, sweep_seconds

__all__ = ["EARLY_REFRESH_SECONDS", "REFRESH_SECONDS", "ReadClock", "Resync", "ResyncHost"]

log = logging.getLogger("mcpsync.ingress")

REFRESH_SECONDS = 15.0
EARLY_REFRESH_SECONDS = 1.0
"""How often a host asks the ledger which of its URIs to resync and at which period (one indexed
query per (subject, server)); sooner, but not more often than ``EARLY_REFRESH_SECONDS``, when a
URI it has not asked about was read (a subscription's start: its initial read)."""


class ReadClock:
    """When each (subject, server, URI) was last read by this ingress process (monotonic seconds)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], dict[str, float]] = {}
        self._new: dict[tuple[str, str], set[str]] = {}  # URIs first read since ``take_new``

    def observe(self, key: SubscriptionKey, asked_at: float) -> None:
        """A read of ``key`` was allocated; its allocation was asked for at ``asked_at``."""
        reads = self._last.setdefault((key.subject, key.server), {})
        if key.uri not in reads:
            self._new.setdefault((key.subject, key.server), set()).add(key.uri)
        if asked_at > reads.get(key.uri, float("-inf")):
            reads[key.uri] = asked_at

    def take_new(self, subject: str, server: str) -> set[str]:
        """The URIs of (subject, server) read for the first time since the last call."""
        return self._new.pop((subject, server), set())

    def last(self, subject: str, server: str) -> dict[str, float]:
        """The URIs of (subject, server) and their last reads (the clock's own map: the caller may
        prune it, ``Resync.refresh`` does)."""
        return self._last.setdefault((subject, server), {})


class ResyncHost(Protocol):
    """What the resync asks of its session host (``mcpsync.worker.ingress.session_host.SessionHost``)."""

    router: IngressRouter
    subject: str
    server: ServerConfig
    ledger: Ledger
    live: LiveSession | None


class Resync:
    """The resync of one (subject, server) (``SessionHost.resync``, made by ``Ingress.resync``);
    ``host`` is the session host ``run`` serves (the rule's methods need none)."""

    def __init__(self, router: IngressRouter, clock: ReadClock, *, subject: str, server: str,
                 ready: Callable[[], None], host: ResyncHost | None = None) -> None:
        self.host = host
        self.router = router
        self.clock = clock
        self.subject = subject
        self.server = server
        self._ready = ready  # wake a router: a key became ready
        self.periods: dict[str, float] = {}  # URI -> safety-read period (``FenceLedger.resync_periods``)
        self.fed = 0  # synthetic notes offered to the router
        self._unlisted: set[str] = set()  # read here, but not resynced at the last refresh (polling rows)
        self._unknown: set[str] = set()  # read here since the last refresh, not asked about yet

    def refresh(self, periods: dict[str, float], now: float) -> None:
        """The ledger's answer: resync these URIs at these periods. A URI new to the clock counts as
        read ``now``; a URI no longer listed is forgotten."""
        last = self.clock.last(self.subject, self.server)
        for uri in periods.keys() - last.keys():
            last[uri] = now
        self._unlisted = last.keys() - periods.keys()
        for uri in self._unlisted:
            del last[uri]
        self._unknown.clear()
        self.periods = periods

    def refresh_due(self, since_refresh: float) -> bool:
        """Whether to ask the ledger again, ``since_refresh`` seconds after the last answer: every
        ``REFRESH_SECONDS``, or after ``EARLY_REFRESH_SECONDS`` once a URI it was not asked about
        was read."""
        self._unknown |= {u for u in self.clock.take_new(self.subject, self.server)
                          if u not in self.periods and u not in self._unlisted}
        return since_refresh >= REFRESH_SECONDS \
            or (bool(self._unknown) and since_refresh >= EARLY_REFRESH_SECONDS)

    def sweep(self, generation: int, now: float) -> int:
        """Feed every URI whose resync is due to the router, on session ``generation``; returns how
        many were fed. A fed URI counts as read ``now`` until its read is allocated (a key that
        is refused or overflows is tried again a resync period later; the timer covers it)."""
        last = self.clock.last(self.subject, self.server)
        fed = 0
        for uri, period in self.periods.items():
            if now < resync_due_at(last.get(uri, now), period):
                continue
            last[uri] = now
            offer = self.router.offer(uri, generation, background=True)
            if offer == Offer.OVERFLOW:
                continue  # the queue is full of real notifications: the workflow's timer reads
            fed += 1
            if offer == Offer.READY:
                self._ready()
        self.fed += fed
        return fed

    async def run(self) -> None:
        """Sweep until cancelled: refresh the periods (``FenceLedger.resync_periods``), feed due URIs on
        the host's live session while it is not lost. Nothing when the host reads no notification
        itself (``read_on_notification`` off: a synthetic note would only wake the workflow)."""
        host = self.host
        if host is None or not host.server.read_on_notification:
            return
        refreshed = float("-inf")
        while True:
            now = time.monotonic()
            if self.refresh_due(now - refreshed):
                try:
                    periods = await host.ledger.fence.resync_periods(self.subject, self.server)
                    self.refresh(periods, time.monotonic())
                    refreshed = now
                except Exception as exc:  # noqa: BLE001 - PostgreSQL away: keep the last answer
                    log.warning("resync %s/%s: refresh failed: %s", self.server, self.subject,
                                type(exc).__name__)
            session = host.live
            if session is not None and not session.lost.is_set():
                self.sweep(session.generation, time.monotonic())
            await asyncio.sleep(sweep_seconds(self.periods.values()))
