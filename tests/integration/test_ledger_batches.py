"""The read path's group commit on real PostgreSQL (``activities/ledger/read_batches.py``): concurrent
allocations and accepts share one transaction, and each caller gets what it would have got alone."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import psycopg
import pytest

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.content import ReadBody
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


# --- accept batches of several kinds --------------------------------------------------------------

BODIES = {f"sha256:v{i}": f"version {i}\n".encode() for i in range(2)}


async def _read(ledger: Ledger, key: SubscriptionKey, name: str) -> ReadTicket:
    ticket = await ledger.fence.allocate_read(_req(key, f"{key.subject}/{name}"))
    assert ticket.granted
    return ticket


def _accept(ledger: Ledger, key: SubscriptionKey, ticket: ReadTicket, digest: str,
            guardrail: str | None = None) -> Awaitable[tuple[AcceptResult, str | None]]:
    """``accept_judged`` of ``ticket``'s read, which read ``digest`` (and its body)."""
    req = _outcome(key, ticket, digest)
    req = req.model_copy(update={"outcome": req.outcome.model_copy(update={
        "guardrail_rejection": guardrail, "size": len(BODIES[digest]), "server_version": "v1"})})
    return ledger.fence.accept_judged(req, ReadBody(digest=digest, mime_type="text/plain", kind="text",
                                                    body=BODIES[digest]))


async def _kinds(ledger: Ledger, *, together: bool) -> list[tuple[Any, ...]]:
    """Six subscriptions, each of its own subject, each holding version v0, whose next accepts are of
    every kind: UNCHANGED, ACCEPTED (a new digest), STALE, a replay, a guardrail rejection, and an
    UNCHANGED read whose stored body was lost; made in turn or all at once. Each subscription's
    answer and rows, ids relative to it."""
    keys = [await _active(ledger, uri=f"demo://kinds/{i}") for i in range(6)]
    later: dict[int, ReadTicket] = {}
    for i, key in enumerate(keys):
        first = await _read(ledger, key, "r1")
        if i == 2:  # r2 is accepted before r1: r1 is stale
            later[i] = await _read(ledger, key, "r2")
            await _accept(ledger, key, later[i], "sha256:v0")
            later[i] = first
        else:
            await _accept(ledger, key, first, "sha256:v0")
            later[i] = first if i == 3 else await _read(ledger, key, "r2")  # 3: the same accept again
    await ledger_rows(ledger, "DELETE FROM content_store WHERE subject = %s", keys[5].subject)
    calls = [_accept(ledger, keys[0], later[0], "sha256:v0"), _accept(ledger, keys[1], later[1], "sha256:v1"),
             _accept(ledger, keys[2], later[2], "sha256:v1"), _accept(ledger, keys[3], later[3], "sha256:v0"),
             _accept(ledger, keys[4], later[4], "sha256:v1", guardrail="too large"),
             _accept(ledger, keys[5], later[5], "sha256:v0")]
    judged = await asyncio.gather(*calls) if together else [await c for c in calls]
    return [await _rows_of(ledger, key, answer) for key, answer in zip(keys, judged, strict=True)]


async def _rows_of(ledger: Ledger, key: SubscriptionKey,
                   answer: tuple[AcceptResult, str | None]) -> tuple[Any, ...]:
    wf, subject = key.workflow_id, key.subject
    result, digest = answer
    receipts = await ledger_rows(ledger, """
        SELECT rv.read_ordinal, rv.status, rv.content_digest, rv.mime_type, rv.size, rv.request_id,
            rv.trigger_reason, rv.server_version, rv.accepted_at = r.completed_at
        FROM resource_versions rv JOIN read_requests r ON r.workflow_id = rv.workflow_id
            AND r.ordinal = rv.read_ordinal
        WHERE rv.workflow_id = %s ORDER BY rv.receipt_id""", wf)
    reads = await ledger_rows(ledger, "SELECT ordinal, request_id, outcome, completed_at IS NOT NULL"
                              " FROM read_requests WHERE workflow_id = %s ORDER BY ordinal", wf)
    row = await ledger_rows(ledger, """
        SELECT state, last_issued_ordinal, last_accepted_ordinal, watermark, last_accepted_digest, covered,
            notifications_seen,
            (SELECT read_ordinal FROM resource_versions WHERE receipt_id = s.last_receipt_id)
        FROM subscriptions s WHERE workflow_id = %s""", wf)
    bodies = await ledger_rows(ledger, "SELECT content_digest, mime_type, size, kind, body FROM content_store"
                               " WHERE subject = %s ORDER BY content_digest", subject)
    outbox = await ledger_rows(ledger, """
        SELECT o.event_type, o.read_ordinal, o.content_digest, rv.read_ordinal, o.detail - 'accepted_at',
            (o.detail->>'accepted_at')::timestamptz = rv.accepted_at
        FROM outbox o LEFT JOIN resource_versions rv ON rv.receipt_id = o.receipt_id
        WHERE o.workflow_id = %s ORDER BY o.outbox_id""", wf)
    audit = await ledger_rows(ledger, "SELECT kind, detail - 'request_id' FROM audit WHERE workflow_id = %s"
                              " ORDER BY audit_id", wf)
    answered = (result.verdict, result.reason, result.watermark, result.last_accepted_ordinal,
                result.outbox_id is not None, result.covered, result.notified, digest)
    return (answered, [(*r[:5], r[5].removeprefix(subject), *r[6:]) for r in receipts],
            [(r[0], r[1].removeprefix(subject), *r[2:]) for r in reads], row, bodies, outbox, audit)


async def test_an_accept_batch_of_every_kind_writes_what_accepts_in_turn_write(ledger: Ledger) -> None:
    alone = await _kinds(ledger, together=False)
    retried = ledger.fence._accepts.retried
    together = await _kinds(ledger, together=True)
    assert ledger.fence._accepts.largest >= 5 and ledger.fence._accepts.retried == retried
    assert together == alone
    V = AcceptVerdict
    assert [a[0][0] for a in alone] == [V.UNCHANGED, V.ACCEPTED, V.STALE, V.ACCEPTED, V.GUARDRAIL_REJECTED,
                                        V.UNCHANGED]
    # Every receipt's accepted_at is its transaction's start (as the read's completion).
    assert all(r[-1] for a in alone for r in a[1])
    # The new version's body stored, the lost one stored again; an outbox row for the new version.
    assert [b[0] for b in alone[1][4]] == ["sha256:v0", "sha256:v1"]
    assert alone[5][4] == [("sha256:v0", "text/plain", len(BODIES["sha256:v0"]), "text", BODIES["sha256:v0"])]
    assert [(o[0], o[1], o[5]) for o in alone[1][5]] == [("version_accepted", 1, True),
                                                         ("version_accepted", 2, True)]
    assert [a[0] for a in alone[4][6]] == ["GUARDRAIL_REJECTED"]


@pytest.fixture
async def statement_log(ledger: Ledger) -> AsyncIterator[None]:
    """``test_statements``: a row per statement that inserts into or updates the read path's tables,
    and one per body proposed for insertion into ``content_store`` (sent to PostgreSQL)."""
    await ledger_rows(ledger, "CREATE TABLE IF NOT EXISTS test_statements (tbl text, op text, subject text)")
    await ledger_rows(ledger, """
        CREATE OR REPLACE FUNCTION test_log_statement() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO test_statements VALUES (TG_TABLE_NAME, TG_OP, NULL); RETURN NULL; END $$""")
    await ledger_rows(ledger, """
        CREATE OR REPLACE FUNCTION test_log_body() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO test_statements VALUES (TG_TABLE_NAME, TG_OP, NEW.subject); RETURN NEW; END $$""")
    tables = ("resource_versions", "read_requests", "subscriptions", "content_store")
    for t in tables:
        await ledger_rows(ledger, f"CREATE OR REPLACE TRIGGER test_log_{t} AFTER INSERT OR UPDATE ON {t}"
                                  " FOR EACH STATEMENT EXECUTE FUNCTION test_log_statement()")
    await ledger_rows(ledger, "CREATE OR REPLACE TRIGGER test_log_body BEFORE INSERT ON content_store"
                              " FOR EACH ROW EXECUTE FUNCTION test_log_body()")
    yield None
    for t in tables:
        await ledger_rows(ledger, f"DROP TRIGGER test_log_{t} ON {t}")
    await ledger_rows(ledger, "DROP TRIGGER test_log_body ON content_store")
    await ledger_rows(ledger, "DROP FUNCTION test_log_statement(), test_log_body()")
    await ledger_rows(ledger, "DROP TABLE test_statements")


async def test_unchanged_accepts_are_set_based_and_resend_no_stored_body(
        ledger: Ledger, statement_log: None) -> None:
    keys = [await _active(ledger, uri=f"demo://set/{i}") for i in range(4)]
    tickets = []
    for key in keys:
        await _accept(ledger, key, await _read(ledger, key, "r1"), "sha256:v0")
        tickets.append(await _read(ledger, key, "r2"))
    await ledger_rows(ledger, "UPDATE content_store SET stored_at = now() - interval '2 days'"
                              " WHERE subject = ANY(%s)", [k.subject for k in keys])
    await ledger_rows(ledger, "DELETE FROM content_store WHERE subject = %s", keys[3].subject)  # lost
    await ledger_rows(ledger, "DELETE FROM test_statements")
    first = asyncio.ensure_future(_accept(ledger, keys[0], tickets[0], "sha256:v0"))
    await asyncio.sleep(0)  # in flight alone: the other three are the next batch
    judged = await asyncio.gather(*(_accept(ledger, k, t, "sha256:v0")
                                    for k, t in zip(keys[1:], tickets[1:], strict=True)))
    assert [j[0].verdict for j in [await first, *judged]] == [AcceptVerdict.UNCHANGED] * 4
    logged = await ledger_rows(ledger, "SELECT tbl, op, subject, count(*) FROM test_statements"
                                      " GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
    # Two batches (the first call alone, then three): per batch one statement per table, and only
    # the lost body sent, by one more statement (an upsert: its UPDATE trigger fires too).
    assert logged == [("content_store", "INSERT", keys[3].subject, 1), ("content_store", "INSERT", None, 1),
                      ("content_store", "UPDATE", None, 3), ("read_requests", "UPDATE", None, 2),
                      ("resource_versions", "INSERT", None, 2), ("subscriptions", "UPDATE", None, 2)]
    # A body read again is young again: stored_at is the accept's transaction time.
    fresh = await ledger_rows(ledger, """
        SELECT c.stored_at = rv.accepted_at FROM content_store c JOIN subscriptions s
            ON s.subject = c.subject AND s.last_accepted_digest = c.content_digest
        JOIN resource_versions rv ON rv.receipt_id = s.last_receipt_id
        WHERE s.workflow_id = ANY(%s) ORDER BY s.workflow_id""", [k.workflow_id for k in keys])
    assert fresh == [(True,)] * 4
