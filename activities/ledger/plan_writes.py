"""The write plans of one transaction, set-based: the writes every plan makes, in one statement.

Contract:
- ``FenceLedger._apply_all`` writes a list of plans (``Planned``: an accept batch's, or one plan of
  close, tombstone, revoke) in the caller's transaction, every row locked, no two plans of one
  subscription. ``set_based`` is the one function that decides, from a plan's content, which of its
  writes go out set-based: its ``read_requests`` completion, its receipt, its fence row's update
  (``last_receipt_id`` linked to that receipt; the receipt counted on the row, ``receipt_counts`` and
  ``content_read_at``, even by a plan that updates no column: ``store.RECEIPT_COUNTED``) and the
  accepted read's body. ``plans_write`` makes
  them ONE statement for all the plans (each kind of write from one ``jsonb`` array or a few arrays;
  the text depends on which kinds are present and on the fence updates' column sets, never on how
  many plans). What only some plans have (audit, outbox with its rollout gate and withdrawn lists,
  revocation) the fence then writes per plan, after it: each of those reads the receipt it needs.
- Receipts take their ids and ``accepted_at`` (the column's default, ``now()``: the transaction's
  start) from the insert, as one row each; the statement answers them by workflow id.
- The accepted body (``content``): a new version's (ACCEPTED) is stored (``STORE_ROWS_SQL``);
  an UNCHANGED read's is the current version of the locked row, already stored under (subject,
  digest): only its ``stored_at`` is refreshed (a body read again is young again, for retention), and
  the body is not sent. A refresh that finds no row (the body purged or lost) stores the body after
  the statement (``write_plans``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from mcpsync.activities.ledger.content import REFRESH_ROWS_SQL, STORE_ROWS_SQL, ReadBody, body_rows
from mcpsync.activities.ledger.store import Write, row_updates
from mcpsync.workflows.records.ledger import AcceptVerdict, FenceSnapshot
from mcpsync.workflows.records.mcp_calls import ReadOutcome
from mcpsync.workflows.records.subscription import SubscriptionKey
from mcpsync.workflows.write_plan import WritePlan

__all__ = ["RECEIPT_COLUMNS", "Planned", "SetWrites", "Written", "plans_write", "set_based", "write_plans"]

# A receipt's columns the applier writes (``receipt_id`` and ``accepted_at`` take their defaults).
RECEIPT_COLUMNS = ("workflow_id", "subject", "server", "uri", "mime_type", "content_digest", "size",
                   "read_ordinal", "server_name", "server_version", "edition", "session_generation",
                   "subscription_generation", "request_id", "trigger_reason", "status", "ttl_ms",
                   "cache_scope")
# The completions by workflow id (a ``jsonb`` object: workflow id -> {ordinal, outcome}), the reads
# found by ``= ANY`` probes of the primary key, each checked against its own ordinal. No join: a
# generic plan of one to a function's rows hashes them, which costs more than the update itself. The
# probes' arrays come out of ``jsonb`` arrays (``ANY_OF``): a custom plan sizes a constant array,
# estimates one row, and PostgreSQL would then plan every execution again instead of keeping the
# generic plan.
ANY_OF = "ANY(ARRAY(SELECT jsonb_array_elements_text(%s::jsonb)))"
ANY_OF_BIGINT = "ANY(ARRAY(SELECT jsonb_array_elements_text(%s::jsonb)::bigint))"
JUDGED_SQL = ("judged AS (UPDATE read_requests r SET completed_at = now(),"
              " outcome = %s::jsonb -> r.workflow_id ->> 'outcome'"
              f" WHERE r.workflow_id = {ANY_OF} AND r.ordinal = {ANY_OF_BIGINT}"
              " AND r.ordinal = (%s::jsonb -> r.workflow_id ->> 'ordinal')::bigint)")
RECEIPTS_SQL = (f"receipts AS (INSERT INTO resource_versions ({', '.join(RECEIPT_COLUMNS)})"
                f" SELECT {', '.join(RECEIPT_COLUMNS)}"
                " FROM jsonb_populate_recordset(NULL::resource_versions, %s::jsonb)"
                " RETURNING workflow_id, receipt_id, accepted_at, status, read_ordinal)")
ANSWER_RECEIPTS = ("SELECT workflow_id, receipt_id, accepted_at, NULL::text AS subject,"
                   " NULL::text AS content_digest FROM receipts")
ANSWER_REFRESHED = ("SELECT NULL::text AS workflow_id, NULL::bigint AS receipt_id, NULL::timestamptz AS"
                    " accepted_at, subject, content_digest FROM refreshed")
ANSWER_NOTHING = ("SELECT NULL::text AS workflow_id, NULL::bigint AS receipt_id, NULL::timestamptz AS"
                  " accepted_at, NULL::text AS subject, NULL::text AS content_digest WHERE false")


@dataclass(frozen=True, slots=True)
class Planned:
    """One plan to write: on the row of ``key`` (locked; ``wf`` the id it recorded, None for no row,
    where a plan can only audit), as ``FenceLedger._apply`` takes it. ``body``: the read's body when
    the verdict releases it (the accept's)."""

    key: SubscriptionKey
    wf: str | None
    fence: FenceSnapshot
    plan: WritePlan
    outcome: ReadOutcome | None = None
    effective_at: datetime | None = None
    body: ReadBody | None = None


class SetWrites(NamedTuple):
    """A plan's set-based writes (None: none of that kind)."""

    judged: dict[str, Any] | None  # the read_requests completion
    receipt: dict[str, Any] | None  # the resource_versions row (RECEIPT_COLUMNS)
    fence: dict[str, Any] | None  # the fence row's columns; ``last_receipt_id``: the receipt's id
    body: ReadBody | None  # the body for the subject's store
    known: bool  # the body is the row's current version, already stored: refresh it, do not send it


class Written(NamedTuple):
    """What the set-based statement answered for one plan."""

    receipt_id: int | None
    accepted_at: datetime | None


def set_based(item: Planned) -> SetWrites:
    """The writes of ``item``'s plan that go out set-based (the rest the fence writes per plan)."""
    plan, wf, o = item.plan, item.wf, item.outcome
    if wf is None:
        # No row: the rules grant and accept nothing without one, so nothing but the audit is planned.
        assert (plan.receipt is None and plan.outbox is None and plan.fence is None
                and plan.revocation is None)
        return SetWrites(None, None, None, None, False)
    judged = None
    if plan.read_request_outcome is not None and o is not None:
        judged = {"workflow_id": wf, "ordinal": o.ordinal, "outcome": plan.read_request_outcome}
    receipt = None
    if (r := plan.receipt) is not None:
        k = item.key
        ro = o if r.of_read else None  # a read's receipt also copies the read's own columns
        receipt = dict(zip(RECEIPT_COLUMNS, (
            wf, k.subject, k.server, k.uri, ro.mime_type if ro else None, r.content_digest,
            ro.size if ro else 0, r.ordinal, ro.server_name if ro else "", ro.server_version if ro else "",
            ro.edition if ro else "", r.session_generation, r.subscription_generation, r.request_id,
            r.trigger.value, r.status.value, ro.ttl_ms if ro else None,
            ro.cache_scope.value if ro is not None and ro.cache_scope is not None else None), strict=True))
    fence = None if plan.fence is None else plan.fence.columns(None)
    known = plan.judgement is not None and plan.judgement.verdict == AcceptVerdict.UNCHANGED
    return SetWrites(judged, receipt, fence, item.body, known)


def plans_write(items: Sequence[Planned]) -> tuple[Write | None, list[SetWrites]]:
    """The set-based statement of ``items`` (None: they have no set-based write), and each one's
    ``set_based`` writes. Its result rows: (workflow_id, receipt_id, accepted_at) per receipt, and
    (subject, content_digest) per body it refreshed."""
    writes = [set_based(item) for item in items]
    judged = [w.judged for w in writes if w.judged is not None]
    receipts = [w.receipt for w in writes if w.receipt is not None]
    # Every row a receipt is written for is updated, if only to count it (``store.RECEIPT_COUNTED``).
    fences = [(str(item.wf), w.fence if w.fence is not None else {})
              for item, w in zip(items, writes, strict=True) if w.fence is not None or w.receipt is not None]
    assert len({wf for wf, _ in fences}) == len(fences) and len({r["workflow_id"] for r in receipts}) == len(
        receipts), "two plans of one subscription in one statement"
    stored, refreshed = body_rows([(item.key.subject, w.body, w.known)
                                   for item, w in zip(items, writes, strict=True) if w.body is not None])
    ctes: list[str] = []
    params: list[Any] = []
    if judged:
        ctes.append(JUDGED_SQL)
        by_wf = json.dumps({j["workflow_id"]: {"ordinal": j["ordinal"], "outcome": j["outcome"]}
                            for j in judged})
        params += [by_wf, json.dumps([j["workflow_id"] for j in judged]),
                   json.dumps([j["ordinal"] for j in judged]), by_wf]
    if receipts:
        ctes.append(RECEIPTS_SQL)
        params.append(json.dumps(receipts))
    if fences:
        updates, update_params = row_updates(fences, linked="receipts" if receipts else None)
        ctes += updates
        params += update_params
    if stored is not None:
        ctes.append(f"stored AS ({STORE_ROWS_SQL})")
        params += stored
    if refreshed is not None:
        ctes.append(f"refreshed AS ({REFRESH_ROWS_SQL})")
        params += refreshed
    if not ctes:
        return None, writes
    answers = [a for a, present in ((ANSWER_RECEIPTS, receipts), (ANSWER_REFRESHED, refreshed is not None))
               if present] or [ANSWER_NOTHING]
    return Write("WITH " + ", ".join(ctes) + " " + " UNION ALL ".join(answers), tuple(params)), writes


async def write_plans(cur: Any, items: Sequence[Planned]) -> list[Written]:
    """``plans_write``'s statement on ``cur``, then the bodies a refresh found missing stored
    (``STORE_ROWS_SQL``); per item, its receipt's id and ``accepted_at``."""
    write, writes = plans_write(items)
    if write is None:
        return [Written(None, None)] * len(items)
    await write.execute(cur)
    receipts: dict[str, tuple[int, datetime]] = {}
    refreshed: set[tuple[str, str]] = set()
    for row in await cur.fetchall():
        if row["workflow_id"] is not None:
            receipts[row["workflow_id"]] = (int(row["receipt_id"]), row["accepted_at"])
        else:
            refreshed.add((row["subject"], row["content_digest"]))
    # (An UNCHANGED body another plan of the statement stores as new is there.)
    refreshed |= {(item.key.subject, w.body.digest) for item, w in zip(items, writes, strict=True)
                  if w.body is not None and not w.known}
    missing, _ = body_rows([(item.key.subject, w.body, False) for item, w in zip(items, writes, strict=True)
                            if w.body is not None and w.known
                            and (item.key.subject, w.body.digest) not in refreshed])
    if missing is not None:  # a lost body, healed: stored again as a new one would be
        await cur.execute(STORE_ROWS_SQL, missing)
    return [Written(*receipts[str(item.wf)]) if w.receipt is not None else Written(None, None)
            for item, w in zip(items, writes, strict=True)]
