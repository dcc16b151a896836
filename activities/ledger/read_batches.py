"""The read path's two transactions, for a batch of reads: allocation and acceptance (group commit).

Contract:
- ``allocate_batch`` and ``accept_batch`` are ``FenceLedger.allocate_read`` and
  ``FenceLedger.accept_judged`` for every request of a batch (``coalescer.Coalescer`` gathers them;
  a single call is a batch of one), in ONE transaction, each request answered what it would have
  been answered alone: the same pure rules per request (``allocation.prior_allocation``,
  ``coverage.plan_allocate``, ``verification.record_allocation``; ``ledger_rules.judge_read``,
  ``write_plan.plan_accept`` and ``FenceLedger._apply_all``, which ``_apply`` is for one plan) on
  its own row. A batch holds no two
  requests of one subscription (the coalescer's key), so no request's rule reads another's write.
- Set-based where the statements are alike: one statement locks every row (``store.fence_rows``:
  ``workflow_id`` order, so batches never deadlock each other) and brings each allocation's earlier
  reads (by ``cycle_id`` and ``request_id``, what ``prior_allocation`` asks first), and the
  allocations' writes are one statement (``store.write_rows``: the rows' updates per column set and
  the ``read_requests`` inserts, from ``jsonb``: an object by workflow id, an array; each granted
  row's ``reads_granted`` counts its insert, for the gauges of ``metrics``). An unchanged
  allocation batch is three statements and a commit, however many requests. An accept batch locks
  its rows by one statement, judges and plans each request, then writes every plan with
  ``FenceLedger._apply_all``: the ``read_requests`` completions, receipts, rows' updates and bodies
  as one statement (``plan_writes``), then per plan what only some plans have (audit, outbox,
  revocation). An unchanged accept batch is three statements and a commit, as an allocation batch,
  and its bodies, stored already, are not sent again (their ``stored_at`` is refreshed).
- Every statement's text is independent of the batch size (arrays and ``jsonb`` values, not
  placeholders per request), so psycopg prepares it once.
- A request the rules refuse is answered in the batch; an error (a unique violation of an id two
  requests of the batch both took, a deadlock with another process) rolls the batch back, and the
  coalescer runs each request again alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from psycopg.rows import dict_row

from mcpsync.activities.ledger.content import ReadBody
from mcpsync.activities.ledger.plan_writes import Planned
from mcpsync.activities.ledger.store import PRIOR, Write, fence_rows, snapshot, write_rows
from mcpsync.activities.ledger.verification import record_allocation
from mcpsync.workflows.allocation import Find, prior_allocation
from mcpsync.workflows.coverage import plan_allocate
from mcpsync.workflows.ledger_flow import issued_read
from mcpsync.workflows.ledger_rules import judge_read
from mcpsync.workflows.records.ledger import (
    AcceptRequest,
    AcceptResult,
    AcceptVerdict,
    AllocateRequest,
    ReadTicket,
)
from mcpsync.workflows.records.mcp_calls import ReadOutcomeKind
from mcpsync.workflows.write_plan import accept_result, plan_accept

if TYPE_CHECKING:
    from mcpsync.activities.ledger.fence import FenceLedger

__all__ = ["INSERT_READS", "Accept", "accept_batch", "allocate_batch"]

# The verdicts whose receipt ``content.released_content`` releases: only their body is stored.
KEEPS_BODY = frozenset({AcceptVerdict.ACCEPTED, AcceptVerdict.UNCHANGED})
# The allocations' ``read_requests`` rows, from one ``jsonb`` array of them (one parameter: psycopg
# dumps a list per column at a cost per list; ``issued_at`` takes its default).
READ_COLUMNS = ("workflow_id", "ordinal", "request_id", "session_generation", "subscription_generation",
                "trigger_reason", "notifications_seen", "cycle_id")
INSERT_READS = (f"INSERT INTO read_requests ({', '.join(READ_COLUMNS)}) SELECT {', '.join(READ_COLUMNS)}"
                " FROM jsonb_populate_recordset(NULL::read_requests, %s::jsonb)")

Accept = tuple[AcceptRequest, ReadBody | None]
"""An ``accept_judged`` call: the request, and the read's body in hand (None: take the staged one)."""


async def allocate_batch(fence: FenceLedger, reqs: list[AllocateRequest]) -> list[ReadTicket]:
    """CAS each request's next ordinal (``coverage.plan_allocate`` on its locked row), one transaction."""
    async with fence.store.pool.connection() as conn, conn.transaction():
        cur = conn.cursor(row_factory=dict_row)
        # Every row locked, each with the earlier allocations ``prior_allocation`` asks for first.
        rows = await fence_rows(cur, [r.key for r in reqs], now=True,
                                prior=[(r.cycle_id, r.request_id) for r in reqs])
        tickets: list[ReadTicket] = []
        updates: list[tuple[str, dict[str, Any]]] = []
        reads: list[dict[str, Any]] = []
        for req, row in zip(reqs, rows, strict=True):
            # Idempotence first (``allocation.prior_allocation``): a retry gets the ticket it holds.
            decided = await prior_allocation(req, _finder(cur, req, row))
            if isinstance(decided, ReadTicket):
                tickets.append(decided)
                continue
            plan = plan_allocate(snapshot(row), session_generation=req.session_generation,
                                 subscription_generation=req.subscription_generation,
                                 min_ordinal=req.min_ordinal)
            if plan is None:
                tickets.append(ReadTicket(granted=False,
                                          reason="fence refused: not ACTIVE or generation mismatch"))
                continue
            assert row is not None  # plan_allocate grants nothing without a row
            wf = row["workflow_id"]
            # ``reads_granted``: the gauge's count of granted reads, a level on the locked row.
            updates.append((wf, {**plan.columns(), **await record_allocation(cur, row),
                                 "reads_granted": row["reads_granted"] + 1}))
            reads.append(dict(zip(READ_COLUMNS, (
                wf, plan.ordinal, decided, req.session_generation, req.subscription_generation,
                req.trigger.value, plan.notified, req.cycle_id), strict=True)))
            tickets.append(ReadTicket(granted=True, ordinal=plan.ordinal, request_id=decided,
                                      notifications_seen=plan.notified))
        if updates:
            # The rows' updates and the requests' inserts, one statement (a write with no result).
            await write_rows(cur, updates, then=Write(INSERT_READS, (json.dumps(reads),)))
    return tickets


def _finder(cur: Any, req: AllocateRequest, row: dict[str, Any] | None) -> Find:
    """``prior_allocation``'s ``find`` for ``req``: the rows its lock statement brought (the row's
    ``prior_cycle_id`` / ``prior_request_id``); any other (a re-derived ``<id>/<ordinal>``, or a key
    with no row), by one query."""
    held = {} if row is None else {("cycle_id", req.cycle_id): row.pop("prior_cycle_id"),
                                   ("request_id", req.request_id): row.pop("prior_request_id")}

    async def find(column: str, value: str) -> Mapping[str, Any] | None:
        if (column, value) in held:
            return held[(column, value)]
        await cur.execute(f"SELECT {PRIOR} FROM read_requests WHERE {column}=%s", (value,))
        found: dict[str, Any] | None = await cur.fetchone()
        return found

    return find


async def accept_batch(fence: FenceLedger, calls: list[Accept]) -> list[tuple[AcceptResult, str | None]]:
    """``FenceLedger.accept_judged`` of each call, one transaction: every row locked by one statement,
    each call's judgement and plan, then every plan written (``FenceLedger._apply_all``: their
    common writes one statement)."""
    async with fence.store.pool.connection() as conn, conn.transaction():
        cur = conn.cursor(row_factory=dict_row)
        outcomes = [req.outcome for req, _ in calls]
        rows = await fence_rows(cur, [o.key for o in outcomes], issued=[o.ordinal for o in outcomes])
        judged = [await _judge(fence, cur, req, body, row)
                  for (req, body), row in zip(calls, rows, strict=True)]
        planned = [item for _, item, _ in judged if item is not None]
        applied = iter(await fence._apply_all(cur, planned))
        answers: list[tuple[AcceptResult, str | None]] = []
        for replayed, item, digest in judged:
            if item is None:
                assert replayed is not None
                answers.append((replayed, digest))
                continue
            got = next(applied)
            answers.append((accept_result(item.plan, item.fence, receipt_id=got.receipt_id,
                                          outbox_id=got.outbox_id), digest))
        return answers


async def _judge(fence: FenceLedger, cur: Any, req: AcceptRequest, body: ReadBody | None,
                 row: dict[str, Any] | None) -> tuple[AcceptResult | None, Planned | None, str | None]:
    """One accept on its locked ``row`` (as ``fence_row(lock=True, issued=ordinal)`` reads it): a
    replay's answer, or the plan to write (with the body the verdict releases); and the digest of the
    read it judged."""
    o = req.outcome
    fence_now = snapshot(row)
    # The row's recorded id keys its reads and receipts; no row: nothing issued, nothing accepted.
    wf = row["workflow_id"] if row is not None else None
    issued = issued_read(row["issued_request"] if row is not None else None)
    judgement = judge_read(fence_now, issued, o, row_uri=row["uri"] if row else None)
    plan = plan_accept(fence_now, issued, o, judgement, absorbed=req.absorbed if row is not None else 0)
    kept = None
    if o.kind == ReadOutcomeKind.CONTENT:
        # A staged body leaves ``content_pending`` whatever the verdict.
        staged = await fence.content.take_staged(cur, o.key, o.ordinal) if body is None else None
        kept = body or staged
    if plan.replay:
        # An activity retry after a committed accept: the same verdict, nothing written twice.
        await cur.execute("SELECT receipt_id, content_digest FROM resource_versions"
                          " WHERE workflow_id=%s AND read_ordinal=%s", (wf, o.ordinal))
        prior = await cur.fetchone()
        return (accept_result(plan, fence_now, receipt_id=prior["receipt_id"] if prior else None,
                              outbox_id=None, ordinal=o.ordinal),
                None, prior["content_digest"] if prior else None)
    assert plan.judgement is not None
    # The body enters the store with the plan's writes, only when the verdict releases it.
    released = kept if (kept is not None and kept.digest == o.content_digest and o.guardrail_rejection is None
                        and plan.judgement.verdict in KEEPS_BODY) else None
    return None, Planned(o.key, wf, fence_now, plan, o, o.completed_at or datetime.now(UTC), released), \
        o.content_digest
