"""The deadline keeper: the timer that wakes a subscription run when its periodic read is due, or
its watchdog when the ledger schedules the run's safety reads.

Contract:
- One coroutine per run (``SubscriptionProgram`` spawns ``DeadlineKeeper.run``). It arms a timer
  for the fence's ``read_due_at`` when a deadline applies, re-arms it if it would fire after
  the newest read's promised bound or (runs that took ``PATCH_AFTER_0_2_0``) a read moved the
  deadline later by more than half a period, and counts its firings in ``ticks``: the main loop's
  idle wait wakes on a new tick, and the loop's ``poll_if_due`` requests the read. The keeper never
  requests a read itself and never upserts a search attribute.
- A *watched* run (``watched()``: it took ``PATCH_AFTER_0_2_0``, its row is on the ledger's
  verification schedule and no poll bound applies, ``SubscriptionProgram._watched``) has no
  deadline: the keeper arms one timer for ``FenceState.watch_due_at``, one ``horizon``
  (``SubscriptionOptions.watchdog_seconds``, default ``verification_rules.WATCHDOG_HORIZON``) after the
  previous look was asked for (after the run became watched, for the first). When it fires the keeper
  owes a look (``look_owed``), which the main loop takes (``Act.WATCH_VERIFICATIONS``, then its own
  read if one is overdue) and reports (``looked``); then the keeper arms the next. Like
  ``read_due_at`` it is an absolute time carried through continue-as-new, never moved later by a
  wake-up; reads, reported or the run's own, neither cancel nor move it: an idle watched run writes
  one timer and one look per horizon. A run that stops being watched (polling) cancels it and keeps
  deadlines again.
- Why six hours: the ingress's ledger sweep keeps the bound; the watchdog only detects a sweep that
  stopped. Four looks a day (a timer and a local activity each: eight billable actions) keep an idle
  subscription under ten actions a day and let its workflow leave the worker's cache between them;
  a breach is found, recorded and read within the horizon (docs/caching.md).
- Every wait goes through the run's ``Interpreter`` (a Temporal timer, or the simulator's clock).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from mcpsync.workflows.interpreter import Interpreter, WaitKind
from mcpsync.workflows.subscription_state import SubscriptionFence
from mcpsync.workflows.verification_rules import WATCHDOG_HORIZON

__all__ = ["DeadlineKeeper"]


def _never() -> bool:
    return False


class DeadlineKeeper:
    def __init__(self, fence: SubscriptionFence, rt: Interpreter, *, watched: Callable[[], bool] = _never,
                 horizon: timedelta = WATCHDOG_HORIZON) -> None:
        self.fence = fence
        self.rt = rt
        self.ticks = 0  # how often the timer fired
        # Per run (``PATCH_AFTER_0_2_0``): a read that moved the deadline later by more than half a
        # period (a resync read at the ingress) cancels the armed timer and arms one for the new
        # deadline, so the old timer does not fire (a fired timer costs a workflow task); runs that
        # started on 0.2.0 keep the armed timer unless it breaks the promise (their recorded commands).
        self.rearm = False
        self.watched = watched  # the run keeps the watchdog instead of deadlines (the module contract)
        self.horizon = horizon
        self.look_owed = False  # the watchdog fired; the main loop has not looked at the ledger yet

    def _acted_on(self, due: datetime | None) -> Callable[[], bool]:
        """After the keeper's timer fired for ``due``: the loop requested a read, or the deadline moved."""
        fence, rt = self.fence, self.rt
        return lambda: (fence.finished or fence.s.read_due_at != due or fence.until_read_due(rt.now()) is None
                        or self.watched())

    async def run(self) -> None:
        """The timer loop (the module's contract). When the run ends, the timer is simply left (no
        cancel event)."""
        fence, rt = self.fence, self.rt
        while not fence.finished:
            if self.watched():
                await self._watchdog()
                continue
            wait = fence.until_read_due(rt.now())
            if wait is None:  # not ACTIVE, a read requested or being allocated: wait for a deadline
                await self._wait(lambda: fence.finished or fence.until_read_due(rt.now()) is not None
                                 or self.watched(), None)
                continue
            due = fence.s.read_due_at
            fire_at = rt.now() + wait

            def outdated(fire_at: datetime = fire_at) -> bool:
                if self.watched():  # the ledger schedules the reads from now on: the watchdog instead
                    return True
                # A read granted meanwhile moves the deadline (usually later, by up to a period); the
                # armed timer still keeps the promise unless it fires after the newest read's bound.
                promised = fence.read_promised_by()
                if promised is not None and promised < fire_at:
                    return True
                # Moved later by more than half a period (``rearm``); frequent reads
                # move it a little each and keep the armed timer.
                armed_from, moved_to = fence.s.read_armed_from, fence.s.read_due_at
                return (self.rearm and promised is not None and armed_from is not None
                        and moved_to is not None and moved_to - fire_at > (promised - armed_from) / 2)

            if await self._wait(outdated, wait):
                continue
            self.ticks += 1
            # Until the main loop has acted on it (a read requested) or the deadline moved: no spinning.
            await self._wait(self._acted_on(due), None)

    async def _watchdog(self) -> None:
        """One horizon of a watched run: the timer, then the main loop's look. Leaves early (the timer
        cancelled) when the run finishes or stops being watched."""
        fence, rt = self.fence, self.rt
        wait = max(timedelta(0), self.watch_due() - rt.now())
        if await rt.wait(lambda: fence.finished or not self.watched(), wait, WaitKind.WATCHDOG):
            return
        self.look_owed = True
        await rt.wait(lambda: fence.finished or not self.look_owed, None, WaitKind.WATCHDOG)

    def watch_due(self) -> datetime:
        """When the watchdog looks next: one horizon from now if no look is due yet (the run just
        became watched)."""
        s = self.fence.s
        if s.watch_due_at is None:
            s.watch_due_at = self.rt.now() + self.horizon
        return s.watch_due_at

    def looked(self, asked_at: datetime) -> None:
        """The main loop's look, asked for at ``asked_at``, came back: the next is due one horizon
        after it was asked for (the ledger judged no earlier)."""
        self.look_owed = False
        self.fence.s.watch_due_at = asked_at + self.horizon

    async def _wait(self, condition: Callable[[], bool], timeout: timedelta | None) -> bool:
        """The deadline keeper blocks without upserting: it changes no search attribute itself, and
        the coroutines that do upsert when they block, so a workflow task (a start's first one: the
        keeper blocks right after the reload) writes one upsert, not two."""
        return await self.rt.wait(condition, timeout, WaitKind.DEADLINE)
