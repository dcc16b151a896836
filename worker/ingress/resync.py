"""The ingress's sweep: the ledger's due verifications of one (subject, server), read at the ingress.

Contract:
- The schedule is the ledger's (``mcpsync.workflows.verification_rules``): every granted read
  allocation of a scheduled row (ACTIVE with a safety-read period) sets when its next verification is
  due, whoever read. ``Resync`` (one per ``SessionHost``) holds no clock of its own: while its host
  holds a live session (and so the (subject, server) lease) it asks the ledger for the due rows
  (``VerificationLedger.due``: one indexed query, each row claimed) and feeds their URIs to the
  host's router exactly as a notification is offered (``IngressRouter.offer``), in the queue's
  background lane (after every notified key), never counted as a notification (``fed`` counts them).
- Level-based: a look finds every row whose due time passed, however it got there (a new lease
  holder, a session that came back, a read refused or failed: a claimed row is due again
  ``claim_delay`` later unless a granted allocation re-armed it), and the rows due within
  ``verification_rules.sweep_ahead`` (a hundredth of the shortest period claimed so far, at most a
  second). It looks again that much before the next row is due, but no sooner than that
  (``sweep_wait``: at most ``SWEEP_IDLE_SECONDS`` later, which is how soon it sees a new row), at
  once when its session is lost and another opens: about one look a second however many rows.
- The router then reads the URI here (``read_on_notification``, a row whose run mirrors reports): a
  read that finds nothing new and leaves the row clean stays in the ledger and wakes no workflow
  (``IngressRouter._deliver``); otherwise, as for any notification, the workflow is signalled. On a
  server that reads nothing at the ingress the router signals ``resource_updated`` and the workflow
  reads: the schedule holds for every server.
- A look never fills the router's queue: it claims at most ``DUE_BATCH`` rows, and no more than
  keep the session generation's ready keys under ``BACKGROUND_SHARE`` of
  ``max_pending_notifications``, so a notification never overflows behind a sweep. Rows it leaves
  stay due and are found by a later look.
- A synthetic note is no notification: the router takes the row as the look claimed it
  (``Due.looks``: no statement of its own) or looks it up, without counting it, and reads no
  ambiguous sibling for it (``workflows/ingress.py``, the sweep's keys), so the coverage rule
  (``mcpsync.workflows.coverage``) sees the read as the workflow's own safety read: the sweep
  decides when a row is read, never whether a read is correct.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from typing import Protocol

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.mcp_session import LiveSession
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.ingress import IngressRouter, Offer
from mcpsync.workflows.records.ledger import NotedNotification
from mcpsync.workflows.verification_rules import SWEEP_IDLE_SECONDS, sweep_ahead, sweep_wait

__all__ = ["BACKGROUND_SHARE", "BUSY_SECONDS", "DUE_BATCH", "SESSION_WAIT_SECONDS", "Resync", "ResyncHost"]

log = logging.getLogger("mcpsync.ingress")

DUE_BATCH = 500
"""Rows one look claims at most: a new lease holder with many overdue rows feeds them in batches."""

BACKGROUND_SHARE = 0.5
"""A look stops feeding once the session generation's ready keys reach this share of
``max_pending_notifications``: the rest of the queue is the notifications'."""

BUSY_SECONDS = 0.5
"""How long a look that found no room waits before the next: the routers drain the queue meanwhile."""

SESSION_WAIT_SECONDS = 0.25
"""How often a host without a live session checks for one: a session that opens is swept this soon."""


class ResyncHost(Protocol):
    """What the sweep asks of its session host (``mcpsync.worker.ingress.session_host.SessionHost``)."""

    router: IngressRouter
    subject: str
    server: ServerConfig
    ledger: Ledger
    live: LiveSession | None


class Resync:
    """The sweep of one (subject, server) (``SessionHost.resync``, made by ``Ingress.resync``);
    ``host`` is the session host ``run`` serves (``feed`` and ``room`` need none)."""

    def __init__(self, router: IngressRouter, *, subject: str, server: str, ready: Callable[[], None],
                 host: ResyncHost | None = None) -> None:
        self.host = host
        self.router = router
        self.subject = subject
        self.server = server
        self._ready = ready  # wake a router: a key became ready
        self.fed = 0  # due URIs offered to the router (the background lane)
        self.looks = 0  # questions asked of the ledger (``VerificationLedger.due``)
        self.shortest_period: float | None = None  # the shortest period among the rows claimed so far

    def room(self, generation: int) -> int:
        """How many due rows the next look may claim on session ``generation`` (module contract)."""
        if self.router.max_pending is None:
            return DUE_BATCH
        free = int(self.router.max_pending * BACKGROUND_SHARE) - self.router.pending[generation]
        return max(0, min(DUE_BATCH, free))

    def feed(self, uris: Iterable[str], generation: int, looks: Sequence[NotedNotification] = ()) -> int:
        """Offer each due URI to the router on session ``generation``, in the background lane, with its
        row as the look found it (``looks``, per URI, when the ledger answered them); returns how many
        were taken. One the queue cannot take (``OVERFLOW``) stays claimed in the ledger and is due
        again ``claim_delay`` later."""
        fed = 0
        for i, uri in enumerate(uris):
            offer = self.router.offer(uri, generation, background=True, looked=looks[i] if looks else None)
            if offer == Offer.OVERFLOW:
                continue
            fed += 1
            if offer == Offer.READY:
                self._ready()
        self.fed += fed
        return fed

    async def look(self, generation: int) -> float:
        """One look at the ledger on session ``generation``: claim and feed the due rows; returns the
        seconds until the next look (``sweep_wait``)."""
        assert self.host is not None
        room = self.room(generation)
        if room == 0:
            return BUSY_SECONDS  # the queue is the notifications' now: the rows stay due
        self.looks += 1
        ahead = sweep_ahead(self.shortest_period)
        due = await self.host.ledger.verification.due(self.subject, self.server, limit=room, ahead=ahead,
                                                      generation=generation)
        self.feed(due.uris, generation, due.looks)
        if due.shortest_period is not None:
            self.shortest_period = due.shortest_period if self.shortest_period is None \
                else min(self.shortest_period, due.shortest_period)
        # The next look claims ``sweep_ahead`` of the (maybe shorter) period; this one claimed ``ahead``.
        return sweep_wait(due.next_in, min(ahead, sweep_ahead(self.shortest_period)))

    async def run(self) -> None:
        """Sweep until cancelled, while the host holds a live session (module contract)."""
        host = self.host
        if host is None:
            return
        while True:
            session = host.live
            if session is None or session.lost.is_set():
                await asyncio.sleep(SESSION_WAIT_SECONDS)
                continue
            try:
                wait = await self.look(session.generation)
            except Exception as exc:  # noqa: BLE001 - PostgreSQL away: the rows stay due, look later
                log.warning("sweep %s/%s: the ledger's due rows: %s", self.server, self.subject,
                            type(exc).__name__)
                wait = SWEEP_IDLE_SECONDS
            with suppress(TimeoutError):
                await asyncio.wait_for(session.lost.wait(), wait)
