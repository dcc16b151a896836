"""The read path's group commit on real PostgreSQL (``activities/ledger/read_batches.py``): concurrent
allocations and accepts share one transaction, and each caller gets what it would have got alone."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from mcpsync.activities.ledger import Ledger
from mcpsync.workflows.records.ledger import (
    AcceptRequest,
    AcceptResult,
    AcceptVerdict,
    AllocateRequest,
    ReadTicket,
)
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason
from tests.conftest import ledger_rows
from tests.integration.test_ledger import _active

# A request id the trigger below refuses (as a unique violation or any error would fail a batch).
REFUSED = "refused-by-trigger"


def _req(key: SubscriptionKey, request_id: str | None = None, cycle_id: str | None = None,
         subscription_generation: int = 1) -> AllocateRequest:
    return AllocateRequest(key=key, session_generation=1, subscription_generation=subscription_generation,
                           min_ordinal=1, request_id=request_id or str(uuid.uuid4()),
                           trigger=TriggerReason.POLL, cycle_id=cycle_id)


def _outcome(key: SubscriptionKey, ticket: ReadTicket, digest: str) -> AcceptRequest:
    return AcceptRequest(outcome=ReadOutcome(
        kind=ReadOutcomeKind.CONTENT, key=key, ordinal=ticket.ordinal, request_id=ticket.request_id,
        session_generation=1, subscription_generation=1, trigger=TriggerReason.POLL, content_digest=digest,
        mime_type="text/plain"), expected_state=SubscriptionState.ACTIVE, close_epoch=0)


def _shape(t: ReadTicket) -> tuple[bool, int, int, str | None]:
    return t.granted, t.ordinal, t.notifications_seen, t.reason


async def _scenario(ledger: Ledger, *, together: bool) -> list[tuple[object, ...]]:
    """Six subscriptions in different states of their reads; each allocates once (a fresh read, a
    retry of an earlier cycle, a refused generation, a re-derived id, a noted update) and accepts;
    calls in turn or all at once."""
    keys = [await _active(ledger, uri=f"demo://batch/{i}") for i in range(6)]
    first = [await ledger.fence.allocate_read(_req(k, f"{k.subject}/r1", cycle_id=f"{k.subject}/c1"))
             for k in keys]
    await ledger.fence.accept(_outcome(keys[3], first[3], "sha256:a"))  # completes r1: asking it re-derives
    await ledger.fence.note_notification(keys[4].subject, keys[4].server, keys[4].uri, 1)
    reqs = [_req(keys[0], f"{keys[0].subject}/r2"),
            _req(keys[1], f"{keys[1].subject}/other", cycle_id=f"{keys[1].subject}/c1"),  # a retried cycle
            _req(keys[2], f"{keys[2].subject}/r2", subscription_generation=7),  # refused
            _req(keys[3], f"{keys[3].subject}/r1"),  # completed: ``<id>/<ordinal>``
            _req(keys[4], f"{keys[4].subject}/r2"),
            _req(keys[5], f"{keys[5].subject}/r1")]  # not completed: the same ticket
    if together:
        tickets = await asyncio.gather(*(ledger.fence.allocate_read(r) for r in reqs))
    else:
        tickets = [await ledger.fence.allocate_read(r) for r in reqs]
    accepts = [(k, t) for k, t in zip(keys, tickets, strict=True) if t.granted]
    calls = [ledger.fence.accept_judged(_outcome(k, t, "sha256:a")) for k, t in accepts]
    judged = await asyncio.gather(*calls) if together else [await c for c in calls]
    rows = [await ledger_rows(ledger, "SELECT last_issued_ordinal, last_accepted_ordinal, watermark, covered,"
                              " verify_due_at IS NOT NULL FROM subscriptions WHERE workflow_id = %s",
                              k.workflow_id) for k in keys]
    receipts = [await ledger_rows(ledger, "SELECT read_ordinal, status, request_id, trigger_reason"
                                  " FROM resource_versions WHERE workflow_id = %s ORDER BY receipt_id",
                                  k.workflow_id) for k in keys]
    # Ids differ by subject between the runs: compare them relative to it.
    return [(_shape(t), t.request_id.removeprefix(k.subject) if t.request_id else None,
             j[0].verdict if j else None, row, [(*r[:2], r[2].removeprefix(k.subject), r[3]) for r in rec])
            for k, t, j, row, rec in zip(
                keys, tickets, _align(tickets, judged), rows, receipts, strict=True)]


def _align(tickets: list[ReadTicket], judged: list[tuple[AcceptResult, str | None]]
           ) -> list[tuple[AcceptResult, str | None] | None]:
    answers = iter(judged)
    return [next(answers) if t.granted else None for t in tickets]


async def test_a_batch_answers_what_calls_in_turn_answer(ledger: Ledger) -> None:
    alone = await _scenario(ledger, together=False)
    batches_before = ledger.fence._allocations.batches
    together = await _scenario(ledger, together=True)
    assert together == alone
    assert [a[2] for a in alone] == [AcceptVerdict.ACCEPTED, AcceptVerdict.ACCEPTED, None,
                                     AcceptVerdict.UNCHANGED, AcceptVerdict.ACCEPTED, AcceptVerdict.ACCEPTED]
    # The concurrent calls shared transactions (one allocation batch for the five that queued
    # behind the first), and none failed over to running alone.
    assert ledger.fence._allocations.largest >= 5 and ledger.fence._accepts.largest >= 4
    assert ledger.fence._allocations.batches - batches_before < 6 + 6 + 2
    assert ledger.fence._allocations.retried == 0


@pytest.fixture
async def refusing_trigger(ledger: Ledger) -> object:
    """read_requests refuses the request id ``REFUSED`` (a statement of a batch that fails)."""
    await ledger_rows(ledger, f"""
        CREATE OR REPLACE FUNCTION test_refuse_read() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN IF NEW.request_id = '{REFUSED}' THEN RAISE EXCEPTION 'refused by the test'; END IF;
        RETURN NEW; END $$""")
    await ledger_rows(ledger, "CREATE OR REPLACE TRIGGER test_refuse_read BEFORE INSERT ON read_requests"
                              " FOR EACH ROW EXECUTE FUNCTION test_refuse_read()")
    yield None
    await ledger_rows(ledger, "DROP TRIGGER test_refuse_read ON read_requests")
    await ledger_rows(ledger, "DROP FUNCTION test_refuse_read()")


async def test_a_failing_request_gets_its_error_and_the_rest_of_its_batch_their_tickets(
        ledger: Ledger, refusing_trigger: object) -> None:
    keys = [await _active(ledger, uri=f"demo://fail/{i}") for i in range(4)]
    retried = ledger.fence._allocations.retried
    reqs = [_req(k, REFUSED if i == 2 else None) for i, k in enumerate(keys)]
    got = await asyncio.gather(*(ledger.fence.allocate_read(r) for r in reqs), return_exceptions=True)
    assert isinstance(got[2], psycopg.errors.RaiseException)
    assert [(t.granted, t.ordinal) for i, t in enumerate(got) if i != 2] == [(True, 1)] * 3  # type: ignore[union-attr]
    assert ledger.fence._allocations.retried - retried == 4  # one batch of the four, then each alone
    issued = [(await ledger_rows(ledger, "SELECT last_issued_ordinal FROM subscriptions"
                                 " WHERE workflow_id = %s", k.workflow_id))[0][0] for k in keys]
    assert issued == [1, 1, 0, 1]


async def test_two_calls_for_one_subscription_in_a_burst_are_serialized(ledger: Ledger) -> None:
    key, other = await _active(ledger, uri="demo://burst/a"), await _active(ledger, uri="demo://burst/b")
    retried = ledger.fence._allocations.retried
    first = asyncio.ensure_future(ledger.fence.allocate_read(_req(other)))
    await asyncio.sleep(0)  # in flight: the burst below queues behind it
    burst = await asyncio.gather(*(ledger.fence.allocate_read(_req(k)) for k in (key, other, key, key)))
    assert (await first).ordinal == 1
    assert [t.ordinal for t in burst] == [1, 2, 2, 3]  # each sees the one before it committed
    assert ledger.fence._allocations.retried == retried  # never in one batch (a failed one would retry)


async def test_a_cancelled_caller_does_not_break_its_batch(ledger: Ledger) -> None:
    keys = [await _active(ledger, uri=f"demo://cancel/{i}") for i in range(4)]
    first = asyncio.ensure_future(ledger.fence.allocate_read(_req(keys[0])))
    await asyncio.sleep(0)
    reqs = [_req(k, cycle_id=str(uuid.uuid4())) for k in keys[1:]]
    calls = [asyncio.ensure_future(ledger.fence.allocate_read(r)) for r in reqs]
    await first  # the three are the next batch, in flight now
    await asyncio.sleep(0.001)
    calls[0].cancel()
    # (A coalescer that answered the cancelled caller would fail its batch's drain: the others' wait
    # would never end.)
    done = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 10)
    assert isinstance(done[0], asyncio.CancelledError)
    assert [(t.granted, t.ordinal) for t in done[1:]] == [(True, 1), (True, 1)]  # type: ignore[union-attr]
    # The cancelled caller's retry (its cycle) finds what its batch committed, or allocates anew.
    retry = await ledger.fence.allocate_read(reqs[0])
    assert (retry.granted, retry.ordinal) == (True, 1)
    assert (await ledger.fence.allocate_read(_req(keys[1]))).ordinal == 2
