"""The ingress's sweep (worker/ingress/resync.py) over its router, the router's decision whether a read
at the ingress is reported (workflows/ingress.py, ``ingress_rules.stays_in_ledger``), and the deadline
keeper's re-arm after a read moved the deadline far (workflows/deadline_keeper.py). Pure and
deterministic: the keeper runs on a stepped runtime below, the sweep and the router on their own
IngressRouter; no stack needed (tests/integration/test_verification_schedule.py sweeps a real ledger)."""

from __future__ import annotations

from collections.abc import Callable, Generator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mcpsync.worker.ingress.resync import BACKGROUND_SHARE, DUE_BATCH, Resync
from mcpsync.workflows.deadline_keeper import DeadlineKeeper
from mcpsync.workflows.ingress import (
    IngressRouter,
    Note,
    Offer,
    ReadCycle,
    ReportRead,
    Siblings,
    SignalUpdated,
    Stamp,
)
from mcpsync.workflows.interpreter import WaitKind
from mcpsync.workflows.records.ledger import (
    AcceptResult,
    AcceptVerdict,
    FenceSnapshot,
    NotedNotification,
    ReadTicket,
)
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.read_cycle import ReadCycleResult
from mcpsync.workflows.records.subscription import (
    SubscriptionKey,
    SubscriptionState,
    TriggerReason,
)
from mcpsync.workflows.subscription_state import FenceState, SubscriptionFence
from tests.unit.router_harness import run_turn

KEY = SubscriptionKey(subject="alice", server="fx", uri="demo://doc")
T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


# --- the sweep at the ingress ----------------------------------------------------------------

def _sweep(max_pending: int | None = 4) -> tuple[Resync, IngressRouter, list[None]]:
    router = IngressRouter("alice", "fx", host_id="h", read_on_notification=True, max_pending=max_pending)
    woken: list[None] = []
    return Resync(router, subject="alice", server="fx", ready=lambda: woken.append(None)), router, woken


def test_due_uris_go_to_the_background_lane_uncounted_and_a_waiting_key_is_not_woken_twice() -> None:
    sweep, router, woken = _sweep(max_pending=None)
    router.offer("demo://notified", 1)  # a notification waiting already
    assert sweep.feed(["demo://a", "demo://b", "demo://notified"], generation=1) == 3
    assert router.work.background == {("demo://a", 1), ("demo://b", 1)}  # behind the notification
    assert len(woken) == 2 and sweep.fed == 3
    assert router.received == 1  # the sweep's notes are no notifications


def test_a_look_claims_no_more_than_leaves_the_notifications_their_share_of_the_queue() -> None:
    sweep, router, _ = _sweep(max_pending=8)
    assert sweep.room(1) == int(8 * BACKGROUND_SHARE) == 4
    assert sweep.feed([f"demo://{n}" for n in range(3)], generation=1) == 3
    assert sweep.room(1) == 1 and sweep.room(2) == 4  # ready keys are counted per session generation
    assert sweep.feed(["demo://3"], generation=1) == 1 and sweep.room(1) == 0
    # The notifications' half is whole: the next four notifications are queued, none overflows.
    assert [router.offer(f"demo://n{n}", 1) for n in range(4)] == [Offer.READY] * 4
    assert _sweep(max_pending=None)[0].room(1) == DUE_BATCH == _sweep(max_pending=10_000)[0].room(1)


def test_a_full_queue_is_not_overflowed_by_the_sweep() -> None:
    sweep, router, woken = _sweep(max_pending=2)
    for uri in ("demo://x", "demo://y"):
        router.offer(uri, 1)  # max_pending=2: the generation's ready keys are at the bound
    assert sweep.room(1) == 0
    assert sweep.feed(["demo://a"], generation=1) == 0  # claimed in the ledger: due again later
    assert ("demo://a", 1) not in router.work.dirty and woken == [] and sweep.fed == 0


# --- whether a read at the ingress is reported ------------------------------------------------

ROW = FenceSnapshot(exists=True, state=SubscriptionState.ACTIVE, session_generation=1,
                    subscription_generation=1, last_issued_ordinal=4, last_accepted_ordinal=4, watermark=4,
                    notifications_seen=7, covered=6, read_reports=True, last_accepted_digest="sha256:a")


def _cycle(verdict: AcceptVerdict | None, *, ordinal: int = 5, read_notified: int = 7, notified: int = 7,
           covered: int = 7) -> ReadCycleResult:
    ticket = ReadTicket(granted=True, ordinal=ordinal, request_id="r", notifications_seen=read_notified)
    if verdict is None:  # the session was lost: nothing judged
        return ReadCycleResult(ticket=ticket)
    outcome = ReadOutcome(kind=ReadOutcomeKind.CONTENT, key=KEY, ordinal=ordinal, request_id="r",
                          session_generation=1, subscription_generation=1, trigger=TriggerReason.UPDATED,
                          content_digest="sha256:a", mime_type="text/plain")
    return ReadCycleResult(ticket=ticket, outcome=outcome,
                           accept=AcceptResult(verdict=verdict, notified=notified, covered=covered))


def _deliver(cycle: ReadCycleResult, *, row: FenceSnapshot = ROW,
             background: bool = False) -> tuple[list[type], IngressRouter]:
    """Route one key whose note answers ``row`` and whose read at the ingress answers ``cycle``; the
    effects the program yielded, by type."""
    router = IngressRouter("alice", "fx", host_id="h", read_on_notification=True)
    router.offer(KEY.uri, 1, background=background)
    noted = NotedNotification(workflow_id="wf", fence=row, work=True)
    _, effects = run_turn(router, {Note: noted, ReadCycle: cycle, ReportRead: True, SignalUpdated: True,
                                   Siblings: []})
    return [type(effect) for effect in effects], router


def test_an_unchanged_read_that_leaves_nothing_owed_stays_in_the_ledger() -> None:
    seen, router = _deliver(_cycle(AcceptVerdict.UNCHANGED))
    assert ReportRead not in seen and SignalUpdated not in seen, seen
    assert (router.verified, router.read, router.routed) == (1, 0, 0)
    seen, router = _deliver(_cycle(AcceptVerdict.UNCHANGED), background=True)  # the sweep's due read
    assert ReportRead not in seen and SignalUpdated not in seen and router.verified == 0  # uncounted


@pytest.mark.parametrize("verdict", [AcceptVerdict.ACCEPTED, AcceptVerdict.TOMBSTONE_PENDING,
                                     AcceptVerdict.GUARDRAIL_REJECTED, AcceptVerdict.REJECTED,
                                     AcceptVerdict.STALE, AcceptVerdict.REVOKED])
def test_every_other_verdict_is_reported(verdict: AcceptVerdict) -> None:
    seen, router = _deliver(_cycle(verdict))
    assert ReportRead in seen and (router.read, router.verified) == (1, 0), seen


@pytest.mark.parametrize(("why", "cycle", "row"), [
    # A notification recorded after the allocation is not covered: the workflow owes a read.
    ("row left dirty", _cycle(AcceptVerdict.UNCHANGED, notified=8, covered=7), ROW),
    # The newest read before this one failed (its receipt is not the watermark's): the run's record
    # names that failure until a report clears it.
    ("after a failed read", _cycle(AcceptVerdict.UNCHANGED, ordinal=6),
     ROW.model_copy(update={"last_issued_ordinal": 5})),
    # Another read (the workflow's own) was issued between the note and this allocation.
    ("a read in between", _cycle(AcceptVerdict.UNCHANGED, ordinal=6), ROW),
])
def test_an_unchanged_read_the_workflow_must_hear_of_is_reported(why: str, cycle: ReadCycleResult,
                                                                  row: FenceSnapshot) -> None:
    seen, router = _deliver(cycle, row=row)
    assert ReportRead in seen and router.verified == 0, why


def test_a_read_not_judged_wakes_the_workflow() -> None:
    seen, router = _deliver(_cycle(None))
    assert ReportRead not in seen and SignalUpdated in seen and router.routed == 1


def test_the_sweeps_key_is_looked_up_uncounted_and_asks_for_no_sibling() -> None:
    """A key only the sweep made is no notification: its note writes nothing (``Note.count``) and no
    ambiguous sibling is read for it; a key a notification made (or joined) is counted and asks."""
    notes: list[Note] = []

    def route(*offers: bool) -> list[type]:
        router = IngressRouter("alice", "fx", host_id="h", read_on_notification=True)
        for background in offers:
            router.offer(KEY.uri, 1, background=background)
        _, effects = run_turn(router, {Note: NotedNotification(workflow_id="wf", fence=ROW, work=True),
                                       ReadCycle: _cycle(AcceptVerdict.UNCHANGED), Siblings: []})
        notes.extend(effect for effect in effects if isinstance(effect, Note))
        return [type(effect) for effect in effects]

    assert Siblings not in route(True, True) and [n.count for n in notes] == [False]
    assert Siblings in route(True, False) and notes[-1].count  # a notification joined the sweep's key
    assert Siblings in route(False) and notes[-1].count


def test_the_sweeps_look_stands_for_its_keys_note_until_a_notification_joins_it() -> None:
    """A key the sweep fed with its row as claimed (``offer(looked=)``) is routed on that look: no Note
    effect (no statement); a notification for the key drops the look (it notes and counts itself); a
    look older than the row's newest read makes the read be reported, never kept in the ledger."""
    looked = NotedNotification(workflow_id="wf", fence=ROW, work=True)

    def route(*offers: bool, cycle: ReadCycleResult = _cycle(AcceptVerdict.UNCHANGED)) -> list[type]:
        router = IngressRouter("alice", "fx", host_id="h", read_on_notification=True)
        for background in offers:
            router.offer(KEY.uri, 1, background=background, looked=looked if background else None)
        _, effects = run_turn(router, {Note: looked, ReadCycle: cycle, ReportRead: True, Siblings: []})
        assert not router.looked  # nothing left behind
        return [type(effect) for effect in effects]

    assert route(True) == [Stamp, ReadCycle]  # the look stood for the note; kept in the ledger
    assert Note in route(True, False) and Siblings in route(True, False)  # a notification joined it
    assert Note in route(False, True)  # a background add to a notified key brings no look
    # A read issued after the look (the workflow's own): the ordinals differ, so it is reported.
    assert ReportRead in route(True, cycle=_cycle(AcceptVerdict.UNCHANGED, ordinal=6))


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
        run_turn(router, {Note: noted, SignalUpdated: True, Siblings: []})


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
    """Just the part of ``interpreter.Interpreter`` the keeper uses: a clock the test moves and
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
