"""The deadline keeper: the timer that wakes a subscription run when its periodic read is due.

Contract:
- One coroutine per run (``SubscriptionProgram`` spawns ``DeadlineKeeper.run``). It arms a timer
  for the fence's ``read_due_at`` when a deadline applies, re-arms it if it would fire after
  the newest read's promised bound or (runs that took ``PATCH_AFTER_0_2_0``) a read moved the
  deadline later by more than half a period, and counts its firings in ``ticks``: the main loop's
  idle wait wakes on a new tick, and the loop's ``poll_if_due`` requests the read. The keeper never
  requests a read itself and never upserts a search attribute.
- Every wait goes through the run's ``Runtime`` (a Temporal timer, or the simulator's clock).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from mcpsync.workflows.program_runtime import Runtime, WaitKind
from mcpsync.workflows.subscription_state import SubscriptionFence

__all__ = ["DeadlineKeeper"]



class DeadlineKeeper:
    def __init__(self, fence: SubscriptionFence, rt: Runtime) -> None:
        self.fence = fence
        self.rt = rt
        self.ticks = 0  # how often the timer fired
        # Per run (``PATCH_AFTER_0_2_0``): a read that moved the deadline later by more than half a
        # period (a resync read at the ingress) cancels the armed timer and arms one for the new
        # deadline, so the old timer does not fire (a fired timer costs a workflow task); runs that
        # started on 0.2.0 keep the armed timer unless it breaks the promise (their recorded commands).
        self.rearm = False

    def _acted_on(self, due: datetime | None) -> Callable[[], bool]:
        """After the keeper's timer fired for ``due``: the loop requested a read, or the deadline moved."""
        fence, rt = self.fence, self.rt
        return lambda: fence.finished or fence.s.read_due_at != due or fence.until_read_due(rt.now()) is None

    async def run(self) -> None:
        """The timer loop (the module's contract). When the run ends, the timer is simply left (no
        cancel event)."""
        fence, rt = self.fence, self.rt
        while not fence.finished:
            wait = fence.until_read_due(rt.now())
            if wait is None:  # not ACTIVE, a read requested or being allocated: wait for a deadline
                await self._wait(lambda: fence.finished or fence.until_read_due(rt.now()) is not None, None)
                continue
            due = fence.s.read_due_at
            fire_at = rt.now() + wait

            def outdated(fire_at: datetime = fire_at) -> bool:
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

    async def _wait(self, condition: Callable[[], bool], timeout: timedelta | None) -> bool:
        """The deadline keeper blocks without upserting: it changes no search attribute itself, and
        the coroutines that do upsert when they block, so a workflow task (a start's first one: the
        keeper blocks right after the reload) writes one upsert, not two."""
        return await self.rt.wait(condition, timeout, WaitKind.DEADLINE)
