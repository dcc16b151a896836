"""PostgreSQL connection and schema migrations.

Contract: ``open_pool(url)`` returns an open psycopg 3 async pool or raises ``DatabaseUnavailable`` with
a message an operator can act on (never a password: ``redact_url`` / ``redact_text`` parse the string as
libpq does). ``migrate(pool)`` applies every ``migrations/NNN_*.sql`` not yet recorded in
``schema_migrations``, each in its own transaction, under an advisory lock so concurrent processes do not
race. Then it runs the data steps SQL cannot do by itself (``backfill_uri_normalized``: the Python URI
normalizer), each idempotent, so every ``migrate`` call also repairs rows written by an older binary.
"""

from __future__ import annotations

import re
from contextlib import suppress
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from mcpsync.workflows.uris import normalize_uri

__all__ = ["DatabaseUnavailable", "backfill_uri_normalized", "create_database", "migrate", "open_pool",
           "redact_text", "redact_url"]

_MIGRATION_LOCK = 0x6D637073  # "mcps"


class DatabaseUnavailable(RuntimeError):
    """PostgreSQL could not be reached or refused the connection."""


REDACTED = "***"
_URI_SCHEMES = ("postgresql://", "postgres://")


def _passwords(url: str) -> list[str]:
    """Every password ``url`` carries (keyword ``password=``, a URI's ``user:pw@`` and ``?password=``)."""
    found = []
    with suppress(Exception):
        found.append(str(conninfo_to_dict(url).get("password") or ""))
    if url.startswith(_URI_SCHEMES):
        with suppress(ValueError):
            found.append(unquote(urlsplit(url).password or ""))
            # as written (percent-encoded), as an error may echo it
            found.append(urlsplit(url).password or "")
        found += [v for k, v in parse_qsl(urlsplit(url).query, keep_blank_values=True) if k == "password"]
    return sorted({p for p in found if p}, key=len, reverse=True)


def redact_url(url: str) -> str:
    """The connection string with every password replaced, safe for logs, errors and files others
    read. Parsed by psycopg's conninfo parser (libpq's rules): keyword conninfo (``host=… password=…``)
    and URIs (``user:pw@`` and ``?password=``) alike. A string the parser refuses is not shown at all:
    nothing says where its password would be."""
    try:
        params = conninfo_to_dict(url)
    except Exception:
        return "(unparseable connection string, not shown)"
    if not _passwords(url):
        return url
    if not url.startswith(_URI_SCHEMES):
        return make_conninfo(**{k: REDACTED if k == "password" else str(v) for k, v in params.items()
                                if v is not None})
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password is not None:
        userinfo, _, hostport = netloc.rpartition("@")
        netloc = f"{userinfo.split(':', 1)[0]}:{REDACTED}@{hostport}"
    query = urlencode([(k, REDACTED if k == "password" else v)
                       for k, v in parse_qsl(parts.query, keep_blank_values=True)], safe="/*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def redact_text(text: str, url: str) -> str:
    """``text`` (a driver error, a log line) with every password of ``url`` replaced."""
    for password in _passwords(url):
        text = text.replace(password, REDACTED)
    return text


def _unavailable(url: str, exc: BaseException) -> DatabaseUnavailable:
    try:
        conninfo_to_dict(url)
    except Exception:  # libpq echoes fragments of a string it cannot parse: say nothing of it
        return DatabaseUnavailable("PostgreSQL connection string is invalid (not shown: it"
                                   " may hold a password)")
    detail = redact_text(str(exc).strip()[:300], url)
    return DatabaseUnavailable(f"PostgreSQL unreachable at {redact_url(url)}: {detail}")


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    """Every ledger connection: no JIT. The ledger's statements are short lookups and a few
    aggregates over small tables; PostgreSQL's JIT compiles any plan whose *estimated* cost passes
    ``jit_above_cost``, and a table without statistics (autovacuum off, or grown faster than
    autoanalyze) estimates high: the metrics refresher's consumer-lag query spent 320 ms compiling
    for 0.4 ms of work (tests/integration/test_ledger_plans.py)."""
    await conn.execute("SET jit = off")


async def open_pool(url: str, *, min_size: int = 1, max_size: int = 8,
                    timeout: float = 10.0) -> AsyncConnectionPool:
    try:
        # One direct attempt first: a refused or misaddressed server fails now, not after the pool's timeout.
        probe = await psycopg.AsyncConnection.connect(url, connect_timeout=max(1, int(timeout)))
        await probe.close()
    except Exception as exc:
        raise _unavailable(url, exc) from None
    pool = AsyncConnectionPool(url, min_size=min_size, max_size=max_size, open=False,
                               kwargs={"autocommit": True}, configure=_configure)
    try:
        await pool.open(wait=True, timeout=timeout)
    except Exception as exc:  # psycopg_pool.PoolTimeout, OperationalError, bad URL
        await pool.close()
        raise _unavailable(url, exc) from None
    return pool


def _migration_files() -> list[tuple[int, str, str]]:
    found = []
    for entry in resources.files("mcpsync.activities.ledger.migrations").iterdir():
        m = re.fullmatch(r"(\d+)_.*\.sql", entry.name)
        if m:
            found.append((int(m.group(1)), entry.name, entry.read_text()))
    return sorted(found)


async def migrate(pool: AsyncConnectionPool) -> list[str]:
    """Apply pending migrations; returns the names applied by this call."""
    applied: list[str] = []
    async with pool.connection() as conn:
        await conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version int PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            cur = await conn.execute("SELECT version FROM schema_migrations")
            done = {row[0] for row in await cur.fetchall()}
            for version, name, sql in _migration_files():
                if version in done:
                    continue
                async with conn.transaction():
                    await conn.execute(sql.encode())
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)", (version, name)
                    )
                applied.append(name)
            if 8 in done or any(name.startswith("008_") for name in applied):
                await backfill_uri_normalized(conn)
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
    return applied


async def backfill_uri_normalized(conn: psycopg.AsyncConnection[Any], *, batch: int = 1000) -> int:
    """Fill ``subscriptions.uri_normalized`` (migration 008) where it is NULL, ``batch`` rows per
    transaction; returns how many rows it filled. Idempotent, and cheap when nothing is left
    (a partial index finds the NULL rows)."""
    filled = 0
    while True:
        async with conn.transaction():
            cur = await conn.execute(
                "SELECT workflow_id, uri FROM subscriptions WHERE uri_normalized IS NULL"
                " ORDER BY workflow_id LIMIT %s FOR UPDATE SKIP LOCKED", (batch,))
            rows = await cur.fetchall()
            if rows:
                await conn.execute(
                    """
                    UPDATE subscriptions s SET uri_normalized = v.normalized
                    FROM unnest(%s::text[], %s::text[]) AS v(workflow_id, normalized)
                    WHERE s.workflow_id = v.workflow_id AND s.uri_normalized IS NULL
                    """,
                    ([r[0] for r in rows], [normalize_uri(r[1]) for r in rows]),
                )
        filled += len(rows)
        if len(rows) < batch:
            return filled


# psycopg is re-exported for callers that catch its errors without importing it.
Error = psycopg.Error


def create_database(admin_url: str, database: str) -> None:
    """Create ``database`` on the server of ``admin_url`` unless it exists (the embedded stack's own
    database; a concurrent creator's win is no error)."""
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone():
            return
        with suppress(psycopg.errors.DuplicateDatabase):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
