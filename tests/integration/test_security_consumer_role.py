"""The consumer role against its own tricks: a real LOGIN member of ``mcpsync_consumer``, mapped to
subject A and connected through a pool of its own, tries to widen what row-level security shows it
(a temp table or a schema of its own name shadowing ``consumer_subjects``, the visibility function
called with another role's name) and selects every table and view it may: nothing of subject B. A
ledger migrated by a role that does not own its database keeps the pinned check."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.db import migrate
from mcpsync.workflows.records.subscription import SubscriptionKey
from tests.conftest import fresh_database, ledger_rows, unique
from tests.integration.test_security_rls import _accepted

# Every table a consumer's rows live in, and what the policies of migration 016 cover.
SUBJECT_TABLES = ("subscriptions", "resource_versions", "outbox", "content_store", "revocations",
                  "subject_revocations", "content_pending", "audit")


@dataclass(frozen=True)
class Consumer:
    role: str
    pool: AsyncConnectionPool
    a: SubscriptionKey  # its subject's
    b: SubscriptionKey  # another subject's, revoked: rows in every table


@pytest.fixture
async def consumer(ledger: Ledger, database_url: str) -> AsyncIterator[Consumer]:
    """A LOGIN role in ``mcpsync_consumer`` mapped to A's subject, with a pool of its own, and B's
    subject with a receipt, a body and a revocation (so B has rows in every table)."""
    key_a, _, _ = await _accepted(ledger, "for subject A")
    key_b, _, _ = await _accepted(ledger, "for subject B, revoked")
    await ledger.fence.revoke_subject(key_b.subject, key_b.server, key_b.uri, reason="test",
                                      effective_at=datetime.now(UTC))
    await _accepted(ledger, "for subject B, still held", key_b.subject)
    await ledger_rows(ledger, "INSERT INTO audit (kind, subject, server, uri, detail) VALUES"
                      " ('TEST', %s, 'srv', 'demo://b', '{}')", key_b.subject)
    await ledger_rows(ledger, "INSERT INTO content_pending (subject, server, uri, read_ordinal,"
                      " content_digest, mime_type, kind, body)"
                      " VALUES (%s, 'srv', 'demo://b', 1, 'd', 'text/plain', 'text', 'x')", key_b.subject)
    role = unique("team_a").replace("-", "_")
    password = unique("pw")
    await ledger_rows(ledger, f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'")
    await ledger_rows(ledger, f'GRANT mcpsync_consumer TO "{role}"')
    await ledger_rows(ledger, "INSERT INTO consumer_subjects (role_name, subject) VALUES (%s, %s)", role,
                      key_a.subject)
    url = make_conninfo(database_url, user=role, password=password)
    pool = AsyncConnectionPool(url, min_size=1, max_size=1, open=False, kwargs={"autocommit": True})
    await pool.open(wait=True)
    try:
        yield Consumer(role=role, pool=pool, a=key_a, b=key_b)
    finally:
        await pool.close()
        await ledger_rows(ledger, "DELETE FROM consumer_subjects WHERE role_name = %s", role)
        await ledger_rows(ledger, f'DROP OWNED BY "{role}" CASCADE')
        await ledger_rows(ledger, f'REVOKE ALL ON DATABASE "{_dbname(database_url)}" FROM "{role}"')
        await ledger_rows(ledger, f'DROP ROLE IF EXISTS "{role}"')


def _dbname(url: str) -> str:
    return str(conninfo_to_dict(url)["dbname"])


async def _scalar(conn: psycopg.AsyncConnection, sql: str, *args: object) -> object:
    row = await (await conn.execute(sql, args)).fetchone()
    assert row is not None
    return row[0]


async def _b_rows_seen(c: Consumer) -> dict[str, int]:
    """Per table of ``SUBJECT_TABLES``: how many of B's rows the consumer's connection selects
    (a table it may not select at all counts 0)."""
    seen = {}
    async with c.pool.connection() as conn:
        for table in SUBJECT_TABLES:
            try:
                sql = f"SELECT count(*) FROM public.{table} WHERE subject = %s"
                got = await _scalar(conn, sql, c.b.subject)
                seen[table] = int(str(got))
            except psycopg.errors.InsufficientPrivilege:
                seen[table] = 0
    return seen


async def test_temp_table_cannot_widen_a_consumers_subjects(consumer: Consumer, ledger: Ledger,
                                                             database_url: str) -> None:
    # TEMPORARY granted to the role itself: the qualified names and the pinned search_path must hold
    # even where an operator could not revoke it.
    await ledger_rows(ledger, f'GRANT TEMPORARY ON DATABASE "{_dbname(database_url)}" TO "{consumer.role}"')
    async with consumer.pool.connection() as conn:
        await conn.execute("CREATE TEMP TABLE consumer_subjects (role_name text, subject text)")
        await conn.execute("INSERT INTO consumer_subjects VALUES (%s, %s)",
                           (consumer.role, consumer.b.subject))
        for table in SUBJECT_TABLES:
            # Unqualified, as a consumer's own queries are: the temp table sits first on its path.
            try:
                n = await _scalar(conn, f"SELECT count(*) FROM {table} WHERE subject = %s",
                                  consumer.b.subject)
            except psycopg.errors.InsufficientPrivilege:
                n = 0
            assert n == 0, f"{table}: B's rows through a temp consumer_subjects"
        assert await _scalar(conn, "SELECT count(*) FROM content_store WHERE subject = %s",
                             consumer.a.subject) == 1, "its own subject's body, as before"
        await conn.execute("DROP TABLE pg_temp.consumer_subjects")


async def test_consumer_role_cannot_create_temp_tables(consumer: Consumer) -> None:
    async with consumer.pool.connection() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            await conn.execute("CREATE TEMP TABLE consumer_subjects (role_name text, subject text)")


async def test_schema_named_after_the_role_cannot_widen_its_subjects(consumer: Consumer,
                                                                     ledger: Ledger) -> None:
    # "$user" comes first on the default search_path: a schema of the role's own name would shadow public.
    await ledger_rows(ledger, f'CREATE SCHEMA "{consumer.role}" AUTHORIZATION "{consumer.role}"')
    async with consumer.pool.connection() as conn:
        await conn.execute(f'CREATE TABLE "{consumer.role}".consumer_subjects (role_name text, subject text)')
        await conn.execute("INSERT INTO consumer_subjects VALUES (%s, %s)",
                           (consumer.role, consumer.b.subject))
        assert await _scalar(conn, "SELECT count(*) FROM consumer_subjects") == 1, \
            "its own table, first on its path"
    assert await _b_rows_seen(consumer) == dict.fromkeys(SUBJECT_TABLES, 0)


async def test_a_consumer_selects_nothing_of_another_subject_in_any_table_or_view(consumer: Consumer) -> None:
    assert await _b_rows_seen(consumer) == dict.fromkeys(SUBJECT_TABLES, 0)
    async with consumer.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT c.relname FROM pg_catalog.pg_class c"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'v', 'm', 'p', 'f')"
            " AND pg_catalog.has_table_privilege(c.oid, 'SELECT') ORDER BY 1")
        visible = [r[0] for r in await cur.fetchall()]
        for rel in visible:
            has_subject = await _scalar(conn, "SELECT count(*) FROM pg_catalog.pg_attribute WHERE attrelid ="
                                        " %s::regclass AND attname = 'subject'", f"public.{rel}")
            assert has_subject, f"{rel}: readable by a consumer but not scoped by subject"
            got = await _scalar(conn, f"SELECT count(*) FROM public.{rel} WHERE subject <> ALL(%s)",
                                [consumer.a.subject])
            assert got == 0, f"{rel}: rows of another subject"
    assert set(visible) == {"subscriptions", "resource_versions", "outbox", "content_store", "revocations",
                            "subject_revocations", "consumer_subjects"}


async def test_visibility_function_answers_only_for_the_calling_role(consumer: Consumer,
                                                                    ledger: Ledger) -> None:
    other = unique("team_b").replace("-", "_")
    await ledger_rows(ledger, f'CREATE ROLE "{other}" NOLOGIN IN ROLE mcpsync_consumer')
    await ledger_rows(ledger, "INSERT INTO consumer_subjects (role_name, subject) VALUES (%s, %s)", other,
                      consumer.b.subject)
    try:
        async with consumer.pool.connection() as conn:
            # Asked about another role, it says nothing (there is no such question to ask) ...
            with pytest.raises(psycopg.errors.UndefinedFunction):
                await conn.execute("SELECT public.mcpsync_subject_visible(%s, %s::name)",
                                   (consumer.b.subject, other))
            # ... and asked for itself, the truth about itself only.
            visible = "SELECT public.mcpsync_subject_visible(%s)"
            assert await _scalar(conn, visible, consumer.b.subject) is False
            assert await _scalar(conn, visible, consumer.a.subject) is True
            assert await _scalar(conn, "SELECT count(*) FROM consumer_subjects") == 1, "its own mapping only"
    finally:
        await ledger_rows(ledger, "DELETE FROM consumer_subjects WHERE role_name = %s", other)
        await ledger_rows(ledger, f'DROP ROLE "{other}"')


async def test_migration_by_a_role_that_does_not_own_the_database(postgres_url: str, ledger: Ledger) -> None:
    """mcpsync's role, not the database's owner, migrates a new ledger: it cannot revoke TEMPORARY
    from PUBLIC and says so in a NOTICE; the check is still pinned (invoker's rights, search_path
    with pg_temp last)."""
    role, password = unique("mcpsync_app").replace("-", "_"), unique("pw")
    await ledger_rows(ledger, f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'")
    notices: list[str] = []

    async def listen(conn: psycopg.AsyncConnection) -> None:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))

    try:
        async with fresh_database(postgres_url) as url:
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(f'GRANT CREATE ON SCHEMA public TO "{role}"')
            pool = AsyncConnectionPool(make_conninfo(url, user=role, password=password), min_size=1,
                                       max_size=1, open=False, kwargs={"autocommit": True}, configure=listen)
            await pool.open(wait=True)
            try:
                assert "020_consumer_rls_pinned.sql" in await migrate(pool)
                async with pool.connection() as conn:
                    assert await _scalar(conn, "SELECT pg_catalog.has_database_privilege('mcpsync_consumer',"
                                         " pg_catalog.current_database(), 'TEMPORARY')") is True
                    cur = await conn.execute("SELECT prosecdef, proconfig FROM pg_catalog.pg_proc"
                                             " WHERE proname = 'mcpsync_subject_visible'")
                    check = await cur.fetchall()
                    assert check == [(False, ["search_path=pg_catalog, public, pg_temp"])]
            finally:
                await pool.close()
                with psycopg.connect(url, autocommit=True) as admin:
                    admin.execute(f'DROP OWNED BY "{role}" CASCADE')
    finally:
        await ledger_rows(ledger, f'DROP ROLE IF EXISTS "{role}"')
    assert any("cannot revoke TEMPORARY" in n for n in notices), notices
