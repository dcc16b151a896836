"""The router's settle rule (workflows/ingress.py, Settle): a key notified after its read was sent is
read again, once, ``SETTLE_SECONDS`` after that notification; a key added before the send, or while
no read was made, is ready again at once. Pure: the router is driven here as an interpreter would,
on a clock the test moves."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from mcpsync.workflows.ingress import (
    SETTLE_SECONDS,
    Effect,
    IngressRouter,
    Note,
    Offer,
    ReadCycle,
    ReportRead,
    Siblings,
    SignalUpdated,
    Stamped,
    Turn,
)
from mcpsync.workflows.records.ledger import (
    AcceptResult,
    AcceptVerdict,
    FenceSnapshot,
    NotedNotification,
    ReadTicket,
)
from mcpsync.workflows.records.read_cycle import ReadCycleResult
from mcpsync.workflows.records.subscription import ResourceUpdated, SubscriptionState
from tests.unit.router_harness import run_turn

URI = "demo://doc"
T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
ROW = FenceSnapshot(exists=True, state=SubscriptionState.ACTIVE, session_generation=1,
                    subscription_generation=1, read_reports=True)
# A judged read: the ledger granted and accepted it (a new version: the router reports it)
JUDGED = ReadCycleResult.model_construct(ticket=ReadTicket(granted=True, ordinal=1), outcome=object(),
                                         accept=AcceptResult(verdict=AcceptVerdict.ACCEPTED))


def _process(router: IngressRouter, during_read: Callable[[ReadCycle], None] = lambda _: None,
             ) -> tuple[Turn, list[type]]:
    """One ``process`` turn: every note names a workflow and creates work, the live session is on
    generation 1, a read is judged, each signal is delivered. ``during_read`` runs in the read
    cycle (it calls ``absorb`` where ``run_cycle`` would: just before the send). Answers the turn
    and the effects' types."""
    def read(effect: Effect) -> None:
        if isinstance(effect, ReadCycle):
            during_read(effect)

    turn, effects = run_turn(router, {Note: NotedNotification(workflow_id="wf", fence=ROW), ReadCycle: JUDGED,
                                      ReportRead: True, SignalUpdated: True, Siblings: []}, read)
    return turn, [type(effect) for effect in effects]


def test_copies_notified_after_the_read_was_sent_settle_into_one_follow_up_read() -> None:
    router = IngressRouter("alice", "fx", host_id="h", read_on_notification=True)
    assert router.offer(URI, 1, now=0.0) == Offer.READY

    def copies(cycle: ReadCycle) -> None:
        router.offer(URI, 1, now=0.002)  # before the send: this read takes it
        assert cycle.absorb is not None and cycle.absorb() == 1
        router.offer(URI, 1, now=0.010)  # after the send: this read cannot cover it
        router.offer(URI, 1, now=0.015)

    turn, effects = _process(router, copies)
    assert effects.count(ReadCycle) == 1
    # Not ready again at once: it settles from the first copy after the send, counted as pending.
    assert turn == Turn.SETTLING and router.work.get() is None and router.pending[1] == 1
    due = 0.010 + SETTLE_SECONDS
    assert router.work.next_due() == due
    assert router.release(due - 0.001) == 0
    assert router.offer(URI, 1, now=0.2) == Offer.MERGED  # a change notified meanwhile joins the follow-up
    assert router.release(due) == 1 and router.work.next_due() is None
    turn, effects = _process(router)
    assert turn == Turn.IDLE and effects.count(Note) == 1 and effects.count(ReadCycle) == 1
    assert not router.owes() and router.pending[1] == 0
    # Every notification accounted for: two reads, one taken by the first, two merged.
    assert (router.received, router.read, router.absorbed, router.merged) == (5, 2, 1, 2)


def test_a_key_added_before_the_send_or_without_a_read_is_ready_again_at_once() -> None:
    # Without reads at the ingress nothing is sent: a key added while it is processed is looked
    # at again at once, as before (its note creates no work when the row is already dirty).
    router = IngressRouter("alice", "fx", host_id="h", read_on_notification=False)
    router.offer(URI, 1, now=0.0)
    program = router.process()
    assert isinstance(next(program), Note)
    router.offer(URI, 1, now=0.01)
    program.send(NotedNotification(workflow_id="wf", fence=ROW))
    program.send(Stamped(ResourceUpdated(uri=URI, session_generation=1), T0, "r", 1))
    assert isinstance(program.send(True), Siblings)  # SignalUpdated delivered
    with pytest.raises(StopIteration) as stop:
        program.send([])
    assert stop.value.value == Turn.READY and router.work.get() == (URI, 1)


def test_the_resyncs_adds_after_the_send_start_no_settle() -> None:
    # A background add (the resync's, untimed) after the send: ready again at once, in its lane.
    router = IngressRouter("alice", "fx", host_id="h", read_on_notification=True)
    router.offer(URI, 1, now=0.0)

    def resync(cycle: ReadCycle) -> None:
        assert cycle.absorb is not None and cycle.absorb() == 0
        router.offer(URI, 1, background=True)

    turn, _ = _process(router, resync)
    assert turn == Turn.READY and router.work.get() == (URI, 1)


def test_a_read_that_ends_after_the_settle_is_due_is_followed_at_once() -> None:
    router = IngressRouter("alice", "fx", host_id="h", read_on_notification=True)
    router.offer(URI, 1, now=0.0)

    def slow(cycle: ReadCycle) -> None:
        assert cycle.absorb is not None
        cycle.absorb()
        router.offer(URI, 1, now=0.01)

    assert _process(router, slow)[0] == Turn.SETTLING
    # The read ended 2 s later: the follow-up is due already (0.01 + SETTLE_SECONDS).
    assert router.release(2.0) == 1 and router.work.get() == (URI, 1)
