"""The store every ledger concern is built from: the PostgreSQL pool, and the fence row's shape.

Contract:
- ``LedgerStore`` holds the one connection pool (autocommit; a method that writes more than one
  statement opens its own transaction). The concerns (``sessions``, ``fence``, ``content``,
  ``journal``, ``reports``) each take a store (the fence also the journal, content store and
  sessions its ``Ledger`` built), so one process has one pool however many concerns it builds.
- ``snapshot`` turns a ``subscriptions`` row into the ``FenceSnapshot`` the fence rules take;
  ``fence_row`` reads it, optionally ``FOR UPDATE`` (every fenced write locks the row first);
  ``fence_rows`` locks a batch's rows in one statement (``workflow_id`` order); ``update_row``
  writes one (and answers the row after), ``write_rows`` many, set-based
  (``row_updates``: the ``WITH`` items, also for ``plan_writes``' statement).
- A write whose result nothing reads is a ``Write``: alone, or ahead of the next statement as a
  data-modifying ``WITH`` (each statement costs both processes). The read path's two transactions
  are group-committed (``read_batches``): an unchanged verification's allocation batch is four
  statements, its transaction's included, for all its reads; its accept batch four (BEGIN, lock,
  one write of every plan, COMMIT). No pipeline mode: on uvloop its waits cost the client more CPU
  than the round trips it saves (docs/benchmarks.md, "Idle cost at the production period").
- A subscription's row is found by its key (subject, server, exact URI: ``BY_KEY``,
  ``key_params``), never by a workflow id computed from the key: the row records, once, the id its
  workflow actually runs under (``FenceLedger.ensure_subscription``: the calling workflow's id),
  and the rows keyed by workflow id (reads, receipts, outbox, audit, revocations) take that
  recorded id from the row. Subscriptions started under an older id scheme
  (``SubscriptionKey.legacy_workflow_id``) keep theirs for good.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from mcpsync.workflows.coverage import plan_note
from mcpsync.workflows.records.ledger import AcceptVerdict, FenceSnapshot, NotedNotification
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState

__all__ = ["LedgerStore", "BY_KEY", "PRIOR", "RECEIPT_COUNTED", "SAW_CONTENT", "Write", "key_params",
           "snapshot", "fence_row", "fence_rows",
           "fence_rows_sql", "recorded_workflow_id", "jsonable", "looked_note", "update_row",
           "write_rows", "rows_write", "row_updates"]

# The one way to find a subscription's row (UNIQUE (subject, server, uri) indexes it).
BY_KEY = "subject=%s AND server=%s AND uri=%s"
# Receipts of reads that saw content: the freshness gauge's (``metrics``).
SAW_CONTENT = (AcceptVerdict.ACCEPTED.value, AcceptVerdict.UNCHANGED.value)
# A row counts the receipt a ``WITH`` item ``{linked}`` of its statement inserted for it (workflow_id,
# accepted_at, status, read_ordinal; none: the row keeps its values): ``receipt_counts`` (status ->
# receipts) one up, and ``content_read_at`` (the allocation of the newest read whose receipt saw
# content; the receipt's own time for a receipt of no read) for a receipt that saw content. The
# gauges read them (``metrics``, migration 025), never the history tables, which retention prunes.
RECEIPT_COUNTED = (
    "(receipt_counts, content_read_at) = (SELECT"
    " CASE WHEN l.status IS NULL THEN s.receipt_counts ELSE s.receipt_counts"
    " || jsonb_build_object(l.status, coalesce((s.receipt_counts ->> l.status)::bigint, 0) + 1) END,"
    f" CASE WHEN l.status IN ({', '.join(repr(v) for v in SAW_CONTENT)})"
    " THEN coalesce(r.issued_at, l.accepted_at) ELSE s.content_read_at END"
    " FROM (SELECT) one LEFT JOIN {linked} l ON l.workflow_id = s.workflow_id"
    " LEFT JOIN read_requests r ON r.workflow_id = l.workflow_id AND r.ordinal = l.read_ordinal)")
# What ``allocation.prior_allocation`` reads of an earlier allocation (a ``read_requests`` row).
PRIOR = "ordinal, request_id, completed_at, notifications_seen, cycle_id"


class LedgerStore:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool


@dataclass(frozen=True, slots=True)
class Write:
    """A statement and its parameters, executed on a cursor (whose result the caller fetches, if any).
    Writes whose results nobody reads go ahead of another as data-modifying ``WITH`` items
    (``rows_write``: one statement, one parse, one execution; PostgreSQL runs each exactly once, and
    none sees another's change)."""

    sql: str
    params: tuple[Any, ...]

    async def execute(self, cur: Any) -> None:
        await cur.execute(self.sql, self.params)


def snapshot(row: dict[str, Any] | None) -> FenceSnapshot:
    """The fence rules' view of a ``subscriptions`` row (``exists=False`` for no row)."""
    if row is None:
        return FenceSnapshot(exists=False)
    return FenceSnapshot(
        exists=True,
        state=SubscriptionState(row["state"]),
        session_generation=row["session_generation"],
        subscription_generation=row["subscription_generation"],
        last_issued_ordinal=row["last_issued_ordinal"],
        last_accepted_ordinal=row["last_accepted_ordinal"],
        watermark=row["watermark"],
        close_epoch=row["close_epoch"],
        close_ordinal=row["close_ordinal"],
        last_accepted_digest=row["last_accepted_digest"],
        last_receipt_id=row["last_receipt_id"],
        notifications_seen=row["notifications_seen"],
        covered=row.get("covered", 0),
        allocated_sequence=row.get("allocated_sequence", 0),
        read_reports=row.get("read_reports", False),
    )


def looked_note(row: dict[str, Any], generation: int) -> NotedNotification:
    """The sweep's note on ``row`` (a look, nothing written): the id the row recorded, the row, and
    ``coverage.plan_note``'s work on session ``generation``."""
    fence = snapshot(row)
    return NotedNotification(workflow_id=row["workflow_id"], fence=fence,
                             work=plan_note(fence, generation=generation).work)


def key_params(key: SubscriptionKey) -> tuple[str, str, str]:
    """``BY_KEY``'s parameters."""
    return key.subject, key.server, key.uri


async def fence_row(cur: Any, key: SubscriptionKey, *, lock: bool = False, now: bool = False,
                    issued: int | None = None) -> dict[str, Any] | None:
    """The ``subscriptions`` row of ``key`` on a ``dict_row`` cursor (its ``workflow_id`` column is
    the id the subscription runs under); ``lock``: held until the transaction ends; ``now``: with the
    transaction's time (``now()``) as ``db_now``; ``issued``: with the row's ``read_requests`` row of
    that ordinal as ``issued_request`` (a dict by column name, None when the fence never issued it)."""
    columns = "*, now() AS db_now" if now else "*"
    params: tuple[Any, ...] = key_params(key)
    if issued is not None:
        columns += (", (SELECT to_jsonb(r) FROM read_requests r"
                    " WHERE r.workflow_id = subscriptions.workflow_id AND r.ordinal = %s) AS issued_request")
        params = (issued, *params)
    await cur.execute(f"SELECT {columns} FROM subscriptions WHERE {BY_KEY}" + (" FOR UPDATE" if lock else ""),
                      params)
    row: dict[str, Any] | None = await cur.fetchone()
    return row


def fence_rows_sql(*, now: bool, issued: bool, prior: bool = False) -> str:
    """``fence_rows``' statement: arrays of subjects, servers and URIs (and of issued ordinals, of
    cycle and request ids), joined to the rows by key (the unique (subject, server, uri) index, one
    probe per key)."""
    arrays = ["subject", "server", "uri"] + (["issued"] if issued else []) + (
        ["cycle_id", "request_id"] if prior else [])
    types = {"issued": "bigint[]"}
    columns = "s.*, k.i AS batch_index" + (", now() AS db_now" if now else "")
    if issued:
        columns += (", (SELECT to_jsonb(r) FROM read_requests r"
                    " WHERE r.workflow_id = s.workflow_id AND r.ordinal = k.issued) AS issued_request")
    if prior:
        columns += "".join(
            f", (SELECT to_jsonb(p) FROM (SELECT {PRIOR} FROM read_requests WHERE {c} = k.{c}) p)"
            f" AS prior_{c}" for c in ("cycle_id", "request_id"))
    unnest = ", ".join(f"%s::{types.get(a, 'text[]')}" for a in arrays)
    return (f"SELECT {columns} FROM unnest({unnest}) WITH ORDINALITY AS k({', '.join(arrays)}, i)"
            " JOIN subscriptions s ON s.subject = k.subject AND s.server = k.server AND s.uri = k.uri"
            " ORDER BY s.workflow_id FOR UPDATE OF s")


async def fence_rows(cur: Any, keys: Sequence[SubscriptionKey], *, now: bool = False,
                     issued: Sequence[int] | None = None,
                     prior: Sequence[tuple[str | None, str]] | None = None) -> list[dict[str, Any] | None]:
    """``fence_row(lock=True)`` of every key at once (a batch's): one statement, the rows locked in
    ``workflow_id`` order (every multi-row lock of the ledger takes that order, so two never
    deadlock); answered in the order of ``keys`` (None: no row). ``issued``: per key, the ordinal
    whose ``read_requests`` row comes as ``issued_request``; ``prior``: per key, a (cycle id,
    request id) whose ``read_requests`` rows (``PRIOR``'s columns, None for none) come as
    ``prior_cycle_id`` and ``prior_request_id``. One statement text for any batch size."""
    params: list[Any] = [[k.subject for k in keys], [k.server for k in keys], [k.uri for k in keys]]
    if issued is not None:
        params.append(list(issued))
    if prior is not None:
        params += [[c for c, _ in prior], [r for _, r in prior]]
    await cur.execute(fence_rows_sql(now=now, issued=issued is not None, prior=prior is not None), params)
    found: list[dict[str, Any] | None] = [None] * len(keys)
    for row in await cur.fetchall():
        found[int(row.pop("batch_index")) - 1] = row
    return found


async def recorded_workflow_id(cur: Any, key: SubscriptionKey) -> str:
    """The id the subscription of ``key`` runs under (on a ``dict_row`` cursor): the one its row
    recorded, whatever scheme made it; ``key.workflow_id`` (the readable scheme) only for a key
    with no row yet."""
    await cur.execute(f"SELECT workflow_id FROM subscriptions WHERE {BY_KEY}", key_params(key))
    row = await cur.fetchone()
    return key.workflow_id if row is None else str(row["workflow_id"])


def jsonable(row: dict[str, Any]) -> dict[str, Any]:
    """A row with its timestamps as ISO strings (JSON output of diagnostics)."""
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}


async def update_row(cur: Any, wf: str, columns: Mapping[str, Any], *, touch: bool = True) -> dict[str, Any]:
    """Set ``columns`` (and ``updated_at``, when ``touch``) on the row ``wf`` recorded; the row after."""
    touched = ", updated_at=now()" if touch else ""
    await cur.execute("UPDATE subscriptions SET " + ", ".join(f"{c}=%s" for c in columns) + touched
                      + " WHERE workflow_id=%s RETURNING *",
                      (*(v.value if isinstance(v, SubscriptionState) else v for v in columns.values()), wf))
    row: dict[str, Any] = await cur.fetchone()
    return row


async def write_rows(cur: Any, rows: Sequence[tuple[str, Mapping[str, Any]]], *, then: Write) -> None:
    """Many rows' updates (wf, columns) and ``then``, one statement (``rows_write``)."""
    await rows_write(rows, then=then).execute(cur)


def rows_write(rows: Sequence[tuple[str, Mapping[str, Any]]], *, then: Write) -> Write:
    """``write_rows``' statement: ``row_updates``, each a data-modifying ``WITH`` ahead of ``then``."""
    updates, params = row_updates(rows)
    assert updates and not then.sql.lstrip().upper().startswith("WITH")
    return Write("WITH " + ", ".join(updates) + " " + then.sql, (*params, *then.params))


def row_updates(rows: Sequence[tuple[str, Mapping[str, Any]]], *,
                linked: str | None = None) -> tuple[list[str], list[Any]]:
    """The ``WITH`` items (``u0``, ``u1``, ...) and their parameters that update many rows (wf, columns):
    one set-based ``UPDATE`` per column set (the values as a ``jsonb`` object by workflow id, each
    read as a ``subscriptions`` record, so each column keeps its type). Their text depends on the
    column sets only, never on how many rows. ``linked``: the name of a ``WITH`` item of the same
    statement answering the receipts it inserts (``RECEIPT_COUNTED``'s columns, at most one a row):
    a row's ``last_receipt_id`` takes its receipt's id (the value given is ignored), and every row
    counts its receipt (``RECEIPT_COUNTED``). A row with no column given (only with ``linked``) is
    only counted: its ``updated_at`` stays."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for wf, columns in rows:
        groups.setdefault(tuple(columns), []).append(
            {"workflow_id": wf, **{c: _json_value(v) for c, v in columns.items()}})
    updates: list[str] = []
    params: list[Any] = []
    for n, (names, values) in enumerate(sorted(groups.items())):
        link = linked is not None and "last_receipt_id" in names
        given = [c for c in names if not (link and c == "last_receipt_id")]
        # Each row's values looked up by its id in a ``jsonb`` object (workflow id -> columns), the
        # rows found by ``= ANY`` probes of the primary key: no join (a generic plan takes a function
        # for 100 rows and hashes them, or scans every row), no placeholder per row.
        assert given or not names, "a fence update writes more than the receipt it links"
        assert given or linked is not None, "an update with nothing to write"
        sets: list[str] = []
        if given:
            sets.append(f"({', '.join(given)}) = (SELECT {', '.join(f'v.{c}' for c in given)}"
                        " FROM jsonb_populate_record(NULL::subscriptions, %s::jsonb -> s.workflow_id) v)")
            params.append(json.dumps({v["workflow_id"]: v for v in values}))
        if link:
            sets.append(f"last_receipt_id = (SELECT l.receipt_id FROM {linked} l"
                        " WHERE l.workflow_id = s.workflow_id)")
        if linked is not None:
            sets.append(RECEIPT_COUNTED.format(linked=linked))
        if given:
            sets.append("updated_at=now()")
        updates.append(f"u{n} AS (UPDATE subscriptions s SET {', '.join(sets)}"
                       " WHERE s.workflow_id = ANY(%s::text[]))")
        params.append([v["workflow_id"] for v in values])
    return updates, params


def _json_value(value: Any) -> Any:
    if isinstance(value, SubscriptionState):
        return value.value
    return value.isoformat() if isinstance(value, datetime) else value
