"""The watchdog of a run whose safety reads the ledger schedules (workflows/deadline_keeper.py,
``SubscriptionProgram._look``), on the production program: the simulator's deterministic runtime and
in-memory ledger (``sim.engine.Simulation``) drive it step by step, no stack needed.

A subscribed run marked with a safety-read period keeps no deadline: one watchdog timer per horizon,
neither moved nor cancelled by reads; when it fires the run asks the ledger (``ledger_watch_verifications``)
and reads through its own read cycle only when a verification is overdue. Its due time is carried
through continue-as-new like a deadline. A polling run keeps its deadline. The reference outbox
consumer keeps its entry on the ``overdue`` event the ledger writes for a breach.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from typing import cast

from psycopg_pool import AsyncConnectionPool

from examples.indexer import indexer
from mcpsync.activities.ledger.outbox import OutboxEventV1
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import OutboxEventType
from mcpsync.workflows.records.subscription import SubscriptionStart, SubscriptionState, TriggerReason
from mcpsync.workflows.verification_rules import WATCHDOG_HORIZON
from sim.engine import Simulation
from sim.interpreter import ProgramRun
from sim.model import INGRESS_READ, Event, Op, Profile, SimConfig

S = SubscriptionState
SUBSCRIBED = Profile(capability="subscribe", safety_read_seconds=300.0)


def _sim(profile: Profile = SUBSCRIBED) -> Simulation:
    sim = Simulation("watchdog", profile, SimConfig())
    assert sim._flush()  # start, subscribe, the initial read: every activity done
    assert sim.ledger.row.state == S.ACTIVE and sim.wf.fence.s.state == S.ACTIVE
    return sim


def _scheduled(sim: Simulation, name: str) -> list[object]:
    return [a.arg for a in sim.activities if a.name == name]


def _read_triggers(sim: Simulation) -> list[TriggerReason]:
    return [r["trigger_reason"] for _, r in sorted(sim.ledger.read_requests.items())]


def test_a_watched_run_arms_one_watchdog_and_no_deadline_and_reads_do_not_move_it() -> None:
    sim = _sim()
    wf = sim.wf
    subscribed_at = wf.fence.s.watch_due_at - WATCHDOG_HORIZON if wf.fence.s.watch_due_at else None
    assert wf.pending_timer == "watchdog" and wf.timer_at == wf.fence.s.watch_due_at
    assert subscribed_at is not None and subscribed_at <= sim.now
    assert wf.fence.s.read_due_at is None and wf.program.record().next_read_due_at is None
    due = wf.timer_at
    # A change read and reported at the ingress: the run mirrors it, its watchdog stays where it was.
    assert sim.apply(Event(Op.MUTATE, n=1))
    assert sim._flush()
    assert _read_triggers(sim) == [TriggerReason.INITIAL, TriggerReason.UPDATED]
    assert wf.fence.s.last_accepted_digest == sim.oracle.digest
    assert wf.pending_timer == "watchdog" and wf.timer_at == due and wf.fence.s.read_due_at is None


def test_the_watchdog_reads_through_the_run_when_a_verification_is_overdue() -> None:
    sim = _sim()
    wf = sim.wf
    assert sim.apply(Event(Op.TIMER))  # six hours later: nobody swept
    fired_at = sim.now
    assert _scheduled(sim, Act.WATCH_VERIFICATIONS) and not _scheduled(sim, Act.MCP_READ_CYCLE)
    assert sim._flush()
    # The ledger recorded the breach; the run read itself (trigger poll) and looks again a horizon on.
    assert [e.event_type for e in sim.ledger.outbox][-1] == OutboxEventType.OVERDUE
    assert sim.ledger.audit[-1] == "VERIFICATION_OVERDUE"
    assert _read_triggers(sim)[-1] == TriggerReason.POLL
    assert wf.fence.s.detail == ""  # the read that saw content cleared the breach's detail line
    assert wf.pending_timer == "watchdog" and wf.timer_at == fired_at + WATCHDOG_HORIZON


def test_a_closed_breach_is_reported_by_its_closing_read_and_only_an_open_one_is_read() -> None:
    sim = _sim()
    wf = sim.wf
    assert sim.apply(Event(Op.TIMER))
    assert sim.activities[-1].name == Act.WATCH_VERIFICATIONS
    assert sim.apply(Event(Op.MUTATE, n=1))  # a change read at the ingress just before the ledger judges
    while reading := [a for a in sim.activities if a.name == INGRESS_READ]:
        assert sim.apply(sim.picking(Op.EXEC, reading[0]))
    assert sim._flush()
    # The six hours before that read were a breach, reported by the read that closed it; the look
    # finds nothing overdue now: no read of the run's own, nothing reported twice.
    assert _read_triggers(sim) == [TriggerReason.INITIAL, TriggerReason.UPDATED]
    assert [e.event_type for e in sim.ledger.outbox].count(OutboxEventType.OVERDUE) == 1
    assert not wf.fence.s.detail.startswith("verification overdue")


class _ShortWatchdog(Simulation):
    """Subscriptions started with a watchdog shorter than the safety-read period (200 s < 300 s)."""

    def _program_run(self, start: SubscriptionStart, incarnation: str) -> ProgramRun:
        options = start.options.model_copy(update={"watchdog_seconds": 200.0})
        return super()._program_run(start.model_copy(update={"options": options}), incarnation)


def test_a_look_that_finds_every_verification_in_time_changes_nothing() -> None:
    sim = _ShortWatchdog("watchdog", SUBSCRIBED, SimConfig())
    assert sim._flush()
    wf = sim.wf
    audit, outbox = list(sim.ledger.audit), list(sim.ledger.outbox)
    assert sim.apply(Event(Op.TIMER))  # 200 s after the initial read: within the bound
    fired_at = sim.now
    assert sim._flush()
    assert _read_triggers(sim) == [TriggerReason.INITIAL]
    assert sim.ledger.audit == audit and sim.ledger.outbox == outbox and wf.fence.s.detail == ""
    assert wf.pending_timer == "watchdog" and wf.timer_at == fired_at + timedelta(seconds=200)


def test_a_row_the_ledger_no_longer_schedules_is_read_to_find_out_why() -> None:
    sim = _sim()
    # A reset run's begin landed behind this run's back: the row is SUBSCRIBING, the run holds ACTIVE.
    sim.ledger.row = sim.ledger.row.model_copy(update={"state": S.SUBSCRIBING})
    assert sim.apply(Event(Op.TIMER))
    assert sim._flush()
    # The look answered "not scheduled": the run read, was refused, reloaded the row and resubscribed.
    assert sim.ledger.row.state == S.ACTIVE and sim.wf.fence.s.state == S.ACTIVE
    assert sim.ledger.row.subscription_generation == 2
    # The row kept its version, so the resubscribe kept its chain: that generation's first read
    # closed the six hours nobody verified it (no sweep here) and reported them, once.
    assert [e.event_type for e in sim.ledger.outbox].count(OutboxEventType.OVERDUE) == 1
    assert sim.ledger.audit.count("VERIFICATION_OVERDUE") == 1


def test_continue_as_new_carries_the_watchdogs_due_time() -> None:
    sim = _sim()
    due = sim.wf.timer_at
    assert sim.apply(Event(Op.MUTATE, n=1))  # a little later, something wakes the run and it continues
    assert sim.apply(Event(Op.CAN))
    assert sim._flush()
    assert sim.coverage.get("continue_as_new") == 1
    assert sim.wf.pending_timer == "watchdog" and sim.wf.timer_at == due


def test_a_polling_run_keeps_its_deadline_and_no_watchdog() -> None:
    sim = _sim(Profile(capability="none", safety_read_seconds=300.0))
    s = sim.wf.fence.s
    assert sim.wf.pending_timer == "poll" and s.read_due_at is not None and s.watch_due_at is None
    assert not s.ledger_scheduled and sim.ledger.safety_read_seconds is None
    assert sim.wf.timer_at is not None and sim.wf.timer_at - sim.now < timedelta(seconds=30)


async def test_the_reference_indexer_keeps_its_entry_on_an_overdue_event() -> None:
    db = sqlite3.connect(":memory:")
    db.executescript(indexer.SCHEMA)
    db.execute("INSERT INTO entries VALUES ('alice', 'fx', 'demo://doc', 2, 7, 'sha256:a', 'text/plain',"
               " x'61')")
    now = datetime.now(UTC)
    overdue = OutboxEventV1(
        event_type=OutboxEventType.OVERDUE, position=9, outbox_id=9, subject="alice", server="fx",
        uri="demo://doc", workflow_id="wf", receipt_id=8, read_ordinal=5, content_digest="sha256:a",
        previous_digest=None, mime_type=None, size=None, edition=None, server_name=None, server_version=None,
        accepted_at=None, trigger=None, invalidates=None, reason="verifications up to 900 s apart",
        created_at=now)
    # No body is fetched (the pool is never touched) and nothing is written or dropped.
    assert await indexer.apply(cast(AsyncConnectionPool, None), db, [overdue]) == (0, 0)
    assert db.execute("SELECT read_ordinal, receipt_id FROM entries").fetchall() == [(2, 7)]
