"""Ledger query plans on real PostgreSQL, on a table the planner knows nothing about.

Contract: the ingress and the read cycle look a subscription up by its key (subject, server, uri)
on every notification, allocation and accept, and the ingress asks for its normalized siblings on
every routed notification; the sweep looks at its due rows and the next one about once a second.
Each must read about one row of ``subscriptions`` whatever the
statistics say: here a never-analyzed table (autovacuum off, as on this project's CI machines)
with 3,000 subscriptions of one (subject, server), with custom and with generic plans (psycopg
prepares a statement after five executions). Before migration 012 the key lookup read all 3,000
rows through the normalized index's (subject, server) prefix.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from psycopg import sql

from mcpsync.activities.ledger.content import ReadBody
from mcpsync.activities.ledger.fence import NORMALIZED_SIBLINGS_SQL, TERMINAL_STATE_VALUES
from mcpsync.activities.ledger.outbox import CONSUMER_LAG_SQL, consumer_infos
from mcpsync.activities.ledger.plan_writes import Planned, plans_write
from mcpsync.activities.ledger.read_batches import INSERT_READS
from mcpsync.activities.ledger.store import BY_KEY, Write, fence_rows_sql, rows_write
from mcpsync.activities.ledger.verification import CLAIM_SQL, DUE_ROWS_SQL
from mcpsync.worker.main.connect import open_ledger
from mcpsync.workflows.ledger_rules import IssuedRead, judge_read
from mcpsync.workflows.records.ledger import FenceSnapshot
from mcpsync.workflows.records.mcp_calls import ReadOutcome, ReadOutcomeKind
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason
from mcpsync.workflows.write_plan import plan_accept
from tests.conftest import fresh_database

ROWS = 3000
OUTBOX_ROWS = 12000


def _accepted(n: int, digest: str) -> Planned:
    """The plan of an accept of read 1 of ``wf-<n>`` (row n of the table below, its version
    ``sha256:<n>``) that read ``digest``, with its body."""
    key = SubscriptionKey(subject="alice", server="docs", uri=f"demo://doc/{n}")
    row = FenceSnapshot(exists=True, state=SubscriptionState.ACTIVE, session_generation=1,
                        subscription_generation=1, last_issued_ordinal=1, last_accepted_digest=f"sha256:{n}")
    issued = IssuedRead(ordinal=1, request_id=f"rq-{n}", session_generation=1, subscription_generation=1)
    outcome = ReadOutcome(kind=ReadOutcomeKind.CONTENT, key=key, ordinal=1, request_id=f"rq-{n}",
                          session_generation=1, subscription_generation=1, trigger=TriggerReason.POLL,
                          content_digest=digest, mime_type="text/plain")
    plan = plan_accept(row, issued, outcome, judge_read(row, issued, outcome, row_uri=key.uri))
    return Planned(key, f"wf-{n}", row, plan, outcome,
                   body=ReadBody(digest=digest, mime_type="text/plain", kind="text", body=b"x"))


def _scans(node: dict[str, Any], table: str = "subscriptions") -> list[dict[str, Any]]:
    here = [node] if node.get("Relation Name") == table else []
    return here + [s for child in node.get("Plans", []) for s in _scans(child, table)]


async def _explain(conn: Any, statement: str | sql.Composable) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, FORMAT JSON)`` of ``statement``: its top object (``Plan``, ``JIT``, ...)."""
    row = await (await conn.execute(sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) {}").format(
        sql.SQL(statement) if isinstance(statement, str) else statement))).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return dict(plan[0])


def _numbered(sql: str) -> str:
    """psycopg's %s placeholders as PREPARE's $1, $2, ..."""
    counter = iter(range(1, 100))
    return re.sub(r"%s", lambda _: f"${next(counter)}", sql)


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
async def test_key_lookups_read_one_row_without_statistics(postgres_url: str, plan_mode: str) -> None:
    when = datetime(2026, 1, 1, tzinfo=UTC)
    allocation = rows_write([("wf-1234", {"last_issued_ordinal": 2, "allocated_sequence": 0,
                                          "verified_at": when, "verify_due_at": when})],
                            then=Write(INSERT_READS, (json.dumps([{
                                "workflow_id": "wf-1234", "ordinal": 2, "request_id": "rq-new",
                                "session_generation": 1, "subscription_generation": 1,
                                "trigger_reason": "poll", "notifications_seen": 0, "cycle_id": "cy-new"}]),)))
    # An accept batch's writes: an UNCHANGED read (its body refreshed) and a new version (stored).
    accepts, _ = plans_write([_accepted(1234, "sha256:1234"), _accepted(77, "sha256:new")])
    assert accepts is not None and "refreshed AS" in accepts.sql and "stored AS" in accepts.sql
    queries: dict[str, tuple[str, str, tuple[Any, ...]]] = {
        # fence_row, note_notification's UPDATE and every other key lookup share this predicate.
        "key lookup": (f"SELECT * FROM subscriptions WHERE {BY_KEY}", "text, text, text",
                       ("alice", "docs", "demo://doc/1234")),
        "normalized siblings": (NORMALIZED_SIBLINGS_SQL, "text, text, text, text, text[]",
                                ("alice", "docs", "demo://doc/1234", "demo://doc/1234",
                                 TERMINAL_STATE_VALUES)),
        # A batch's lock of its rows (allocations with the transaction's time, accepts with the
        # issued read): one probe of the key index per key, whatever the batch size.
        "batch lock": (fence_rows_sql(now=True, issued=False), "text[], text[], text[]",
                       (["alice", "alice"], ["docs", "docs"], ["demo://doc/1234", "demo://doc/77"])),
        "batch lock, issued": (fence_rows_sql(now=False, issued=True), "text[], text[], text[], bigint[]",
                               (["alice"], ["docs"], ["demo://doc/1234"], [3])),
        # A batch's allocations' write: the rows' updates and the reads' inserts (one probe of the
        # primary key per row).
        # An allocation batch's lock, with each request's earlier reads (by cycle and request id).
        "batch lock, prior reads": (fence_rows_sql(now=True, issued=False, prior=True),
                                    "text[], text[], text[], text[], text[]",
                                    (["alice", "alice"], ["docs", "docs"], ["demo://doc/1234", "demo://doc/77"],
                                     ["cy-1234", None], ["rq-1234", "rq-77"])),
        "batch allocation write": (allocation.sql, "", allocation.params),
        # The read_requests completions, receipts, rows' updates and bodies of two accepts.
        "batch accept write": (accepts.sql, "", accepts.params),
        # The sweep's look (every scheduled row of the pair is one of the 3,000, none due yet): its due
        # rows, then its claim of one and the next row it leaves, in verify_due_at order.
        "sweep's due rows": (DUE_ROWS_SQL, "text, text, float8, int", ("alice", "docs", 0.0, 500)),
        "sweep's claim and next due": (CLAIM_SQL, "text[], float8[], text, text, text[]",
                                       (["wf-1"], [15.0], "alice", "docs", ["wf-1"])),
    }
    # Rows each may read: the accepts' two keys; the claimed row, then it (skipped) and the next.
    keys_of = {"batch accept write": 2, "sweep's due rows": 1, "sweep's claim and next due": 3}
    async with fresh_database(postgres_url) as url:
        ledger = await open_ledger(url, max_size=1)
        try:
            async with ledger.pool.connection() as conn:
                await conn.execute("ALTER TABLE subscriptions SET (autovacuum_enabled = false)")
                await conn.execute(
                    "INSERT INTO subscriptions (workflow_id, subject, server, uri, uri_normalized, state,"
                    " last_issued_ordinal, safety_read_seconds, verify_due_at)"
                    " SELECT 'wf-' || i, 'alice', 'docs', 'demo://doc/' || i, 'demo://doc/' || i,"
                    " 'ACTIVE', 1, 300, now() + make_interval(secs => i)"
                    " FROM generate_series(1, %s) i", (ROWS,))
                await conn.execute("ALTER TABLE read_requests SET (autovacuum_enabled = false)")
                await conn.execute(
                    "INSERT INTO read_requests (workflow_id, ordinal, request_id, session_generation,"
                    " subscription_generation, trigger_reason, cycle_id)"
                    " SELECT 'wf-' || i, 1, 'rq-' || i, 1, 1, 'poll', 'cy-' || i"
                    " FROM generate_series(1, %s) i", (ROWS,))
                await conn.execute("ALTER TABLE content_store SET (autovacuum_enabled = false)")
                await conn.execute(
                    "INSERT INTO content_store (subject, content_digest, size, body)"
                    " SELECT 'alice', 'sha256:' || i, 1, 'x' FROM generate_series(1, %s) i", (ROWS,))
                stats = await (await conn.execute(
                    "SELECT count(*) FROM pg_stats WHERE tablename IN ('subscriptions', 'read_requests',"
                    " 'content_store')")).fetchone()
                assert stats == (0,), "the table must be without statistics for this test to mean anything"
                await conn.execute(f"SET plan_cache_mode = {plan_mode}")
                for name, (text, types, params) in queries.items():
                    typed = f"({types})" if types else ""  # none: each parameter's cast types it
                    await conn.execute(f"PREPARE q {typed} AS {_numbered(text)}")
                    # EXPLAIN takes no bind parameters: the values go in as literals.
                    args = sql.SQL(", ").join(sql.Literal(p) for p in params)
                    plan = await _explain(conn, sql.SQL("EXECUTE q({})").format(args))
                    await conn.execute("DEALLOCATE q")
                    scans = _scans(plan["Plan"])
                    assert scans, f"{name}: no scan of subscriptions in {plan}"
                    # A batch lock's earlier reads, an accept batch's completions and bodies.
                    reads = _scans(plan["Plan"], "read_requests") + _scans(plan["Plan"], "content_store")
                    assert all(s["Node Type"] != "Seq Scan" for s in reads), f"{name}: {reads}"
                    read = sum(s.get("Actual Rows", 0) + s.get("Rows Removed by Filter", 0) for s in scans)
                    assert all(s["Node Type"] != "Seq Scan" for s in scans), f"{name}: {scans}"
                    # The row itself (the siblings query filters it out by uri <> ...), nothing more; a
                    # batch's rows, one per key.
                    keys = keys_of.get(name, len(params[0]) if isinstance(params[0], list) else 1)
                    assert read <= keys, f"{name} read {read} of {ROWS} rows ({plan_mode}): {scans}"
        finally:
            await ledger.pool.close()


async def test_consumer_lag_reads_the_lag_not_the_outbox(postgres_url: str) -> None:
    """The metrics refresher's lag query (every 15 s, every process): a consumer 10 events behind
    on a 12,000-event outbox without statistics reads about those 10 events, is not JIT-compiled,
    and its lag is right."""
    async with fresh_database(postgres_url) as url:
        ledger = await open_ledger(url, max_size=1)
        try:
            async with ledger.pool.connection() as conn:
                # Inserted, then stamped (as outbox_stamp does): the shape of a real outbox.
                await conn.execute(
                    "INSERT INTO outbox (event_type, workflow_id, subject, server, uri)"
                    " SELECT 'accepted', 'wf-' || i, 'alice', 'docs', 'demo://doc/' || i"
                    " FROM generate_series(1, %s) i", (OUTBOX_ROWS,))
                await conn.execute("UPDATE outbox SET position = outbox_id")
                await conn.execute("INSERT INTO outbox_consumers (name, position, delivered_up_to)"
                                   " VALUES ('indexer', %s, %s)", (OUTBOX_ROWS - 10, OUTBOX_ROWS - 10))
                plan = await _explain(conn, CONSUMER_LAG_SQL)
            scans = _scans(plan["Plan"], "outbox")
            read = sum(s.get("Actual Rows", 0) * s.get("Actual Loops", 1) + s.get("Rows Removed by Filter", 0)
                       for s in scans)
            assert scans and all(s["Node Type"] != "Seq Scan" for s in scans), scans
            # Estimated high without statistics, so PostgreSQL would JIT-compile it (~0.3 s) where
            # the ledger's connections did not turn JIT off (mcpsync.activities.ledger.db).
            assert "JIT" not in plan, plan["JIT"]
            assert read <= 40, f"the lag query read {read} outbox rows for a lag of 10: {scans}"
            (info,) = await consumer_infos(ledger.pool)
            assert (info.name, info.lag_events) == ("indexer", 10)
        finally:
            await ledger.pool.close()
