"""The resync of safety reads at the ingress (workflows/resync_rules.py, worker/ingress/resync.py) and the
deadline keeper's re-arm after a read moved the deadline far (workflows/deadline_keeper.py).
Pure and deterministic: the keeper runs on a stepped runtime below, the resync on its own
IngressRouter; no stack needed."""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mcpsync.worker.ingress.resync import EARLY_REFRESH_SECONDS, REFRESH_SECONDS, ReadClock, Resync
from mcpsync.workflows.deadline_keeper import DeadlineKeeper
from mcpsync.workflows.ingress import IngressRouter, Note, Siblings, SignalUpdated, Stamp, Stamped
from mcpsync.workflows.program_runtime import WaitKind
from mcpsync.workflows.read_deadline import resynced_jitter
from mcpsync.workflows.records.ledger import NotedNotification
from mcpsync.workflows.records.subscription import ResourceUpdated, SubscriptionKey, SubscriptionState
from mcpsync.workflows.resync_rules import (
    SWEEP_MAX_SECONDS,
    SWEEP_MIN_SECONDS,
    resync_due_at,
    sweep_seconds,
)
from mcpsync.workflows.subscription_state import FenceState, SubscriptionFence

KEY = SubscriptionKey(subject="alice", server="fx", uri="demo://doc")
T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


# --- the due rule ---------------------------------------------------------------------------

@pytest.mark.parametrize("period", [3.0, 10.0, 20.0, 30.0, 300.0, 3600.0])
def test_the_resync_is_due_before_the_earliest_deadline_the_workflow_can_arm(period: float) -> None:
    # The workflow's own rule (dispatch margin taken, the earliest jitter draw) arms the deadline;
    # the resync must come before it with room for a sweep, or the timer fires first.
    fence = SubscriptionFence(FenceState(key=KEY, state=SubscriptionState.ACTIVE))
    fence.dispatch_margin = True
    fence.arm_read_deadline(requested_at=T0, period_seconds=period, jitter=resynced_jitter(0.0))
    assert fence.s.read_due_at is not None
    earliest = (fence.s.read_due_at - T0).total_seconds()
    due = resync_due_at(0.0, period)
    assert 0.75 * period < due < earliest
    assert earliest - due >= sweep_seconds([period])


def test_the_sweep_follows_the_shortest_period_within_its_bounds() -> None:
    assert sweep_seconds([]) == SWEEP_MAX_SECONDS
    assert sweep_seconds([30.0, 300.0]) == pytest.approx(0.6)
    assert sweep_seconds([1.0]) == SWEEP_MIN_SECONDS
    assert sweep_seconds([86_400.0]) == SWEEP_MAX_SECONDS


# --- the resync at the ingress ----------------------------------------------------------------

def _resync() -> tuple[Resync, IngressRouter, list[None]]:
    router = IngressRouter("alice", "fx", host_id="h", read_on_notification=True, max_pending=2)
    woken: list[None] = []
    return Resync(router, ReadClock(), subject="alice", server="fx",
                  ready=lambda: woken.append(None)), router, woken


def test_a_uri_is_fed_once_its_last_read_is_older_than_due_and_a_read_defers_it() -> None:
    resync, router, woken = _resync()
    resync.refresh({"demo://a": 30.0, "demo://b": 30.0}, now=0.0)
    due = resync_due_at(0.0, 30.0)
    assert resync.sweep(generation=1, now=due - 0.01) == 0
    # b was read (by any path: the clock hears every allocation) half-way: only a is due.
    resync.clock.observe(KEY.model_copy(update={"uri": "demo://b"}), 15.0)
    assert resync.sweep(generation=1, now=due) == 1
    assert router.work.dirty == {("demo://a", 1)} and len(woken) == 1
    assert resync.sweep(generation=1, now=due + 1) == 0  # fed: counts as read until its read
    assert resync.sweep(generation=1, now=resync_due_at(15.0, 30.0)) == 1  # now b
    assert resync.fed == 2 and router.received == 0  # the resync's notes are no notifications


def test_a_full_queue_is_not_overflowed_by_the_resync_and_forgotten_uris_are_dropped() -> None:
    resync, router, _ = _resync()
    for uri in ("demo://x", "demo://y"):
        router.offer(uri, 1)  # max_pending=2: the generation's ready keys are at the bound
    resync.refresh({"demo://a": 30.0}, now=0.0)
    assert resync.sweep(generation=1, now=100.0) == 0  # the timer reads it; no overflow raised
    assert ("demo://a", 1) not in router.work.dirty
    resync.refresh({}, now=100.0)
    assert resync.clock.last("alice", "fx") == {}


def test_a_notified_key_is_handed_out_before_the_resyncs_and_a_notification_moves_one_ahead() -> None:
    router = IngressRouter("alice", "fx", host_id="h", read_on_notification=True)
    for uri in ("demo://r1", "demo://r2", "demo://r3"):
        router.offer(uri, 1, background=True)  # a sweep's batch
    router.offer("demo://changed", 1)  # a change notified after the batch
    router.offer("demo://r3", 1)  # a notification for a key waiting in the background lane
    router.offer("demo://r3", 1, background=True)  # a later background add leaves it in front
    assert len(router.work.dirty) == 4 and router.work.background == {("demo://r1", 1), ("demo://r2", 1)}
    order = [router.work.get() for _ in range(5)]
    assert order == [("demo://changed", 1), ("demo://r3", 1), ("demo://r1", 1), ("demo://r2", 1), None]
    assert router.work.dirty == set() and router.work.background == set()


def test_a_background_add_while_processing_stays_behind_and_a_notification_does_not() -> None:
    router = IngressRouter("alice", "fx", host_id="h", read_on_notification=True)
    router.offer("demo://a", 1)
    assert router.work.get() == ("demo://a", 1)  # processing a
    router.offer("demo://a", 1, background=True)
    router.offer("demo://b", 1)
    assert router.work.done(("demo://a", 1))  # ready again, in the background lane
    assert [router.work.get(), router.work.get()] == [("demo://b", 1), ("demo://a", 1)]
    router.offer("demo://a", 1, background=True)  # processing a again: both adds arrive meanwhile
    router.offer("demo://a", 1)
    router.offer("demo://c", 1, background=True)
    assert router.work.done(("demo://a", 1))
    assert [router.work.get(), router.work.get()] == [("demo://a", 1), ("demo://c", 1)]


def _route_all(router: IngressRouter) -> None:
    """Route every ready key as an interpreter would: each note names a workflow and creates work,
    each wake-up is delivered, no URI has siblings."""
    noted = NotedNotification.model_construct(workflow_id="wf", work=True)
    while router.owes():
        program = router.process()
        answer: Any = None
        with suppress(StopIteration):
            while True:
                effect = program.send(answer)
                if isinstance(effect, Stamp):
                    answer = Stamped(ResourceUpdated(uri=effect.uri, session_generation=1), T0, "r", 1)
                else:
                    answer = {Note: noted, SignalUpdated: True, Siblings: []}[type(effect)]


def test_the_router_counts_notifications_and_routes_the_resyncs_notes_uncounted() -> None:
    router = IngressRouter("alice", "fx", host_id="h", read_on_notification=False)
    router.offer("demo://a", 1, background=True)  # a key only the resync made ...
    router.offer("demo://a", 1, background=True)  # ... and a note merged into it
    router.offer("demo://b", 1, background=True)
    router.offer("demo://b", 1)  # a notification for it: that key's counted work now, not merged
    router.offer("demo://c", 1)
    router.offer("demo://c", 1)  # merged into a key a notification made
    _route_all(router)
    assert (router.received, router.coalesced, router.routed) == (3, 1, 2)
    router.offer("demo://d", 1)
    key = router.work.get()
    assert key is not None
    router.offer("demo://d", 1, background=True)  # arrives while d is processed: the read takes it
    assert router._absorber(key)() == 1 and router.absorbed == 0


# --- the keeper's re-arm --------------------------------------------------------------------

class _Wait:
    def __init__(self, condition: Callable[[], bool], timeout: timedelta | None) -> None:
        self.condition, self.timeout = condition, timeout
        self.fire_at: datetime | None = None  # set by the driver when the wait arms a timer

    def __await__(self) -> Generator[_Wait, bool, bool]:
        woke: bool = yield self
        return woke


class SteppedRuntime:
    """Just the part of ``program_runtime.Runtime`` the keeper uses: a clock the test moves and
    waits the test answers, recording the timer commands a Temporal run would issue."""

    def __init__(self) -> None:
        self.clock = T0
        self.commands: list[str] = []

    def now(self) -> datetime:
        return self.clock

    async def wait(self, condition: Callable[[], bool], timeout: timedelta | None, kind: WaitKind) -> bool:
        return await _Wait(condition, timeout)


class Driver:
    def __init__(self, keeper: DeadlineKeeper, rt: SteppedRuntime) -> None:
        self.rt = rt
        self.coro = keeper.run()
        self.pending: _Wait = self._send(None)

    def _send(self, value: Any) -> _Wait:
        wait: _Wait = self.coro.send(value)
        if wait.timeout is not None:
            wait.fire_at = self.rt.clock + wait.timeout
            self.rt.commands.append(f"TimerStarted@{(wait.fire_at - T0).total_seconds():g}")
        return wait

    def advance(self, to_seconds: float) -> None:
        """Move the clock to T0 + ``to_seconds``: conditions that hold wake their waits (a timer
        they armed is cancelled), a timer due meanwhile fires."""
        while True:
            w = self.pending
            if w.condition():
                if w.timeout is not None:
                    self.rt.commands.append("TimerCanceled")
                self.pending = self._send(True)
                continue
            if w.fire_at is not None:
                if w.fire_at <= T0 + timedelta(seconds=to_seconds):
                    self.rt.clock = w.fire_at
                    self.rt.commands.append("TimerFired")
                    self.pending = self._send(False)
                    continue
            self.rt.clock = T0 + timedelta(seconds=to_seconds)
            if not w.condition():
                return


def _keeper(rearm: bool) -> tuple[SubscriptionFence, Driver, SteppedRuntime]:
    fence = SubscriptionFence(FenceState(key=KEY, state=SubscriptionState.ACTIVE))
    fence.dispatch_margin = True
    fence.arm_read_deadline(requested_at=T0, period_seconds=30.0, jitter=0.5)  # due at 25.2 s
    rt = SteppedRuntime()
    keeper = DeadlineKeeper(fence, rt)  # type: ignore[arg-type]
    keeper.rearm = rearm
    return fence, Driver(keeper, rt), rt


def _read_at(fence: SubscriptionFence, driver: Driver, seconds: float) -> None:
    driver.advance(seconds)
    fence.arm_read_deadline(requested_at=T0 + timedelta(seconds=seconds), period_seconds=30.0, jitter=0.5)


def test_a_read_that_moved_the_deadline_far_re_arms_the_timer_instead_of_letting_it_fire() -> None:
    fence, driver, rt = _keeper(rearm=True)
    _read_at(fence, driver, 20.0)  # a resync read: the deadline moves from 25.2 s to 45.2 s
    driver.advance(44.0)
    assert rt.commands == ["TimerStarted@25.2", "TimerCanceled", "TimerStarted@45.2"]


def test_without_the_patch_the_armed_timer_fires_for_a_deadline_that_moved() -> None:
    # Runs that started on 0.2.0: their recorded commands (the timer kept, fired, re-armed).
    fence, driver, rt = _keeper(rearm=False)
    _read_at(fence, driver, 20.0)
    driver.advance(44.0)
    assert rt.commands == ["TimerStarted@25.2", "TimerFired", "TimerStarted@45.2"]


def test_frequent_reads_move_the_deadline_a_little_and_keep_the_armed_timer() -> None:
    fence, driver, rt = _keeper(rearm=True)
    for at in (2.0, 4.0, 6.0):  # changes read every 2 s: each moves the deadline 2 s, not half a period
        _read_at(fence, driver, at)
    driver.advance(30.0)
    assert rt.commands[:3] == ["TimerStarted@25.2", "TimerFired", "TimerStarted@31.2"]


def test_a_uri_read_for_the_first_time_asks_the_ledger_early_unless_it_was_unlisted() -> None:
    resync, _, _ = _resync()
    resync.clock.observe(KEY.model_copy(update={"uri": "demo://polled"}), 0.0)
    resync.refresh({}, now=0.0)  # a polling row: read here, not resynced
    resync.clock.observe(KEY.model_copy(update={"uri": "demo://polled"}), 5.0)
    assert not resync.refresh_due(EARLY_REFRESH_SECONDS)
    resync.clock.observe(KEY, 6.0)  # a subscription's start: its initial read
    assert not resync.refresh_due(EARLY_REFRESH_SECONDS / 2)
    assert resync.refresh_due(EARLY_REFRESH_SECONDS)
    resync.refresh({KEY.uri: 30.0}, now=7.0)
    assert resync.clock.last("alice", "fx") == {KEY.uri: 6.0}  # its read time, not the refresh's
    assert not resync.refresh_due(EARLY_REFRESH_SECONDS) and resync.refresh_due(REFRESH_SECONDS)
