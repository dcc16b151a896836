"""Row-level security by subject: a member of ``mcpsync_consumer`` mapped to
subject A selects A's receipts, outbox rows and bodies, and none of B's; ``released_content``
through such a role refuses B's receipt as unknown; it reads its own mapping and writes nothing;
other roles are unaffected."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.content import ReadBody
from mcpsync.activities.ledger.released import ContentNotFound, released_content
from mcpsync.workflows.digest import ContentPart, content_digest
from mcpsync.workflows.records.subscription import SubscriptionKey
from tests.conftest import ledger_rows, unique
from tests.integration.test_ledger import _accept, _active, _issue


async def _accepted(ledger: Ledger, text: str,
                    subject: str | None = None) -> tuple[SubscriptionKey, int, str]:
    body = text.encode()
    digest = content_digest([ContentPart("text", "text/plain", body)])
    key = await _active(ledger, f"demo://sec/rls/{unique('u')}", subject)
    ordinal = await _issue(ledger, key)
    await ledger.content.stage(key, ordinal,
                               ReadBody(digest=digest, mime_type="text/plain", kind="text", body=body))
    assert await _accept(ledger, key, ordinal, digest) == "ACCEPTED"
    return key, (await ledger.reports.receipts(key))[-1].receipt_id, digest


@pytest.fixture
async def roles(ledger: Ledger) -> AsyncIterator[list[str]]:
    made: list[str] = []
    yield made
    for role in made:
        await ledger_rows(ledger, "DELETE FROM consumer_subjects WHERE role_name = %s", role)
        await ledger_rows(ledger, f'DROP OWNED BY "{role}"')
        await ledger_rows(ledger, f'DROP ROLE IF EXISTS "{role}"')


async def _count(conn: psycopg.AsyncConnection, sql: str, *args: object) -> int:
    row = await (await conn.execute(sql, args)).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_consumer_of_a_sees_nothing_of_b(ledger: Ledger, database_url: str, roles: list[str]) -> None:
    key_a, receipt_a, digest_a = await _accepted(ledger, "for subject A")
    key_b, receipt_b, digest_b = await _accepted(ledger, "for subject B")
    reader, app = unique("reader_a").replace("-", "_"), unique("app").replace("-", "_")
    roles.extend([reader, app])
    await ledger_rows(ledger, f'CREATE ROLE "{reader}" NOLOGIN')
    await ledger_rows(ledger, f'GRANT mcpsync_consumer TO "{reader}"')
    await ledger_rows(ledger, "INSERT INTO consumer_subjects (role_name, subject) VALUES (%s, %s)", reader,
                      key_a.subject)
    # A role that is not a consumer (a worker role that does not own the tables): unaffected.
    await ledger_rows(ledger, f'CREATE ROLE "{app}" NOLOGIN')
    await ledger_rows(ledger, f'GRANT SELECT ON outbox, content_store, resource_versions TO "{app}"')

    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(f'SET ROLE "{reader}"')
        for table in ("outbox", "content_store", "resource_versions", "subscriptions"):
            assert await _count(conn, f"SELECT count(*) FROM {table} WHERE subject = %s",
                                key_a.subject) >= 1, table
            assert await _count(conn, f"SELECT count(*) FROM {table} WHERE subject = %s",
                                key_b.subject) == 0, table
        assert await _count(conn, "SELECT count(*) FROM content_store WHERE content_digest = %s",
                            digest_b) == 0
        assert await _count(conn, "SELECT count(DISTINCT subject) FROM resource_versions") == 1, \
            "only A, whatever asked"
        assert await _count(conn, "SELECT count(*) FROM consumer_subjects WHERE role_name <> %s",
                            reader) == 0, "its own mapping only"
        for forbidden in ("INSERT INTO consumer_subjects VALUES ('x', 'y')",
                          "UPDATE content_store SET body = 'x' WHERE subject = '-'"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                await conn.execute(forbidden)
        await conn.execute("RESET ROLE")
        await conn.execute(f'SET ROLE "{app}"')
        assert await _count(conn, "SELECT count(*) FROM content_store WHERE subject = ANY(%s)",
                            [key_a.subject, key_b.subject]) == 2

    # The content API through the consumer's role: A's body released, B's receipt does not exist for it.
    pool = AsyncConnectionPool(database_url, min_size=1, max_size=1, open=False,
                               kwargs={"autocommit": True, "options": f"-c role={reader}"})
    await pool.open(wait=True)
    try:
        got = await released_content(pool, receipt_id=receipt_a, subject=key_a.subject)
        assert got.body == b"for subject A"
        with pytest.raises(ContentNotFound):
            await released_content(pool, receipt_id=receipt_b, subject=key_b.subject)
    finally:
        await pool.close()
