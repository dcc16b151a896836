"""A revocation's purge on real PostgreSQL, on tables the planner knows nothing about.

Contract: revoking one URI of a subject with thousands of subscriptions deletes that URI's bodies
after checking only the receipts that name those bodies: ``PURGE_SUBJECT_SQL`` reads about as many
receipt and body rows as the revoked subscription has, with custom and with generic plans
(psycopg prepares a statement after five executions), on never-analyzed tables (autovacuum off,
as on this project's CI machines). Without migration 018's index the check read every receipt of
the subject once per body of the subject (12 million row comparisons at 5,000 subscriptions).
"""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import sql

from mcpsync.activities.ledger.content import PURGE_SUBJECT_SQL
from mcpsync.worker.main.connect import open_ledger
from tests.conftest import fresh_database
from tests.integration.test_ledger_plans import _explain, _numbered, _scans

SUBSCRIPTIONS = 3000
RECEIPTS = 4  # per subscription: the first read ACCEPTED, then safety reads UNCHANGED


def _rows_read(plan: dict[str, Any], table: str) -> int:
    return sum(s.get("Actual Rows", 0) * s.get("Actual Loops", 1) + s.get("Rows Removed by Filter", 0)
               + s.get("Rows Removed by Index Recheck", 0) for s in _scans(plan["Plan"], table))


@pytest.mark.parametrize("plan_mode", ["force_custom_plan", "force_generic_plan"])
async def test_purge_of_one_subscription_reads_its_receipts_not_the_subjects(postgres_url: str,
                                                                            plan_mode: str) -> None:
    async with fresh_database(postgres_url) as url:
        ledger = await open_ledger(url, max_size=1)
        try:
            async with ledger.pool.connection() as conn:
                for table in ("subscriptions", "resource_versions", "content_store", "revocations"):
                    await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
                await conn.execute(
                    "INSERT INTO subscriptions (workflow_id, subject, server, uri, uri_normalized, state)"
                    " SELECT 'wf-' || i, 'alice', 'docs', 'demo://doc/' || i, 'demo://doc/' || i, 'ACTIVE'"
                    " FROM generate_series(1, %s) i", (SUBSCRIPTIONS,))
                await conn.execute(
                    "INSERT INTO resource_versions (workflow_id, subject, server, uri, content_digest,"
                    " read_ordinal, session_generation, subscription_generation, request_id, trigger_reason,"
                    " status)"
                    " SELECT 'wf-' || i, 'alice', 'docs', 'demo://doc/' || i, 'd' || i, k, 1, 1,"
                    " 'r' || i || '-' || k, 'poll', CASE WHEN k = 1 THEN 'ACCEPTED' ELSE 'UNCHANGED' END"
                    " FROM generate_series(1, %s) i, generate_series(1, %s) k", (SUBSCRIPTIONS, RECEIPTS))
                # wf-1 and wf-2 share a body: revoking wf-1 must keep it for wf-2.
                await conn.execute(
                    "UPDATE resource_versions SET content_digest = 'd1' WHERE workflow_id = 'wf-2'")
                await conn.execute(
                    "INSERT INTO content_store (subject, content_digest, size, body)"
                    " SELECT 'alice', 'd' || i, 3, 'abc' FROM generate_series(1, %s) i", (SUBSCRIPTIONS,))
                await conn.execute(  # a revocation row of another subscription: the index is used
                    "INSERT INTO revocations (workflow_id, subject, server, uri, source, reason,"
                    " effective_at)"
                    " VALUES ('wf-9', 'alice', 'docs', 'demo://doc/9', 'platform', 'earlier', now())")
                stats = await (await conn.execute(
                    "SELECT count(*) FROM pg_stats WHERE tablename = 'resource_versions'")).fetchone()
                assert stats == (0,), "the tables must be without statistics for this test to mean anything"
                await conn.execute(f"SET plan_cache_mode = {plan_mode}")
                await conn.execute(
                    f"PREPARE purge (text, text[], text[], text, text[]) AS {_numbered(PURGE_SUBJECT_SQL)}")
                deleted: dict[str, int] = {}
                for workflow_id in ("wf-1", "wf-1234"):
                    async with conn.transaction(force_rollback=True):
                        plan = await _explain(conn, sql.SQL(
                            "EXECUTE purge('alice', ARRAY[{wf}], ARRAY[{wf}], 'REVOKED',"
                            " ARRAY['ACCEPTED', 'UNCHANGED'])").format(wf=sql.Literal(workflow_id)))
                        left = await (await conn.execute("SELECT count(*) FROM content_store")).fetchone()
                    assert left is not None
                    deleted[workflow_id] = SUBSCRIPTIONS - int(left[0])
                    receipts = _rows_read(plan, "resource_versions")
                    bodies = _rows_read(plan, "content_store")
                    # Its own receipts, and the receipts naming its body (of wf-2 for wf-1): a handful.
                    assert receipts <= 4 * RECEIPTS, f"{workflow_id}: {receipts} ({plan_mode}) {plan}"
                    assert bodies <= 2, f"{workflow_id} read {bodies} bodies ({plan_mode}): {plan}"
                await conn.execute("DEALLOCATE purge")
            # The rule itself: wf-2 still releases the shared body; wf-1234's own body goes.
            assert deleted == {"wf-1": 0, "wf-1234": 1}
        finally:
            await ledger.pool.close()
