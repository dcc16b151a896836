"""The ledger's sessions and leases: which MCP session is live for a (subject, server), and who hosts it.

Contract:
- ``open_session`` records a newly initialized session; its generation is one above any
  before it for that (subject, server), and a history row keeps every generation. Only the host
  holding the live (subject, server) lease opens one (None otherwise): a host whose lease lapsed
  while it connected never supersedes the holder's session.
- ``acquire_lease`` takes or renews the (subject, server) lease: one host at a time holds it
  until it lapses (the database clock decides); a new holder bumps the lease epoch.
  ``lease_remaining``: seconds until the live lease lapses (a standby's wake-up time).
  ``holder_lease_remaining``: seconds until the last live lease of one holder, any pair, lapses.
- ``session_holder``: the queue and host the (subject, server) session row names, open or closed.
- Activity ``ledger_current_session``: the open session of a (subject, server), or None.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from psycopg.rows import dict_row
from temporalio import activity

from mcpsync.activities.ledger.store import LedgerStore
from mcpsync.workflows.names import Act
from mcpsync.workflows.records.ledger import SessionQuery
from mcpsync.workflows.records.subscription import SessionInfo

__all__ = ["SessionLedger", "session_in"]


class SessionLedger:
    def __init__(self, store: LedgerStore) -> None:
        self.store = store

    def activities(self) -> list[Callable[..., Any]]:
        return [self.current_session]

    async def open_session(
        self,
        *,
        subject: str,
        server: str,
        edition: str,
        capabilities: dict[str, bool],
        server_name: str,
        server_version: str,
        task_queue: str,
        host_id: str,
    ) -> SessionInfo | None:
        """Record a newly initialized session of ``host_id``, the lease holder; its generation is one
        above any before it. None: ``host_id`` holds no live lease of (subject, server)."""
        async with self.store.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                """
                INSERT INTO mcp_sessions AS s (subject, server, generation, edition, subscribe, list_changed,
                    server_name, server_version, task_queue, host_id)
                SELECT %(subject)s, %(server)s, 1, %(edition)s, %(subscribe)s, %(list_changed)s,
                    %(server_name)s, %(server_version)s, %(task_queue)s, %(host_id)s
                WHERE EXISTS (SELECT 1 FROM session_leases WHERE subject = %(subject)s AND server = %(server)s
                              AND holder = %(host_id)s AND lease_until >= clock_timestamp())
                ON CONFLICT (subject, server) DO UPDATE SET
                    generation = s.generation + 1, edition = EXCLUDED.edition,
                    subscribe = EXCLUDED.subscribe, list_changed = EXCLUDED.list_changed,
                    server_name = EXCLUDED.server_name, server_version = EXCLUDED.server_version,
                    task_queue = EXCLUDED.task_queue, host_id = EXCLUDED.host_id,
                    opened_at = now(), closed_at = NULL
                RETURNING *
                """,
                {
                    "subject": subject,
                    "server": server,
                    "edition": edition,
                    "subscribe": bool(capabilities.get("subscribe")),
                    "list_changed": bool(capabilities.get("listChanged")),
                    "server_name": server_name,
                    "server_version": server_version,
                    "task_queue": task_queue,
                    "host_id": host_id,
                },
            )
            row = await cur.fetchone()
            if row is None:
                return None
            await cur.execute(
                """
                INSERT INTO mcp_session_history (subject, server, generation, edition, capabilities,
                    server_name, server_version, host_id)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
                """,
                (subject, server, row["generation"], edition, json.dumps(capabilities), server_name,
                 server_version, host_id),
            )
        return _session(row)

    async def close_session(self, subject: str, server: str, generation: int) -> None:
        async with self.store.pool.connection() as conn:
            await conn.execute(
                "UPDATE mcp_sessions SET closed_at = now() WHERE subject=%s AND server=%s AND generation=%s",
                (subject, server, generation),
            )

    async def acquire_lease(self, subject: str, server: str, holder: str, ttl_seconds: float) -> bool:
        """Take or renew the (subject, server) session lease; True while ``holder`` owns it."""
        async with self.store.pool.connection() as conn:
            cur = await conn.execute(
                """
                INSERT INTO session_leases AS l (subject, server, holder, lease_until)
                VALUES (%(subject)s, %(server)s, %(holder)s,
                    clock_timestamp() + make_interval(secs => %(ttl)s))
                ON CONFLICT (subject, server) DO UPDATE SET
                    holder = EXCLUDED.holder, lease_until = EXCLUDED.lease_until,
                    epoch = l.epoch + CASE WHEN l.holder = EXCLUDED.holder THEN 0 ELSE 1 END
                WHERE l.holder = EXCLUDED.holder OR l.lease_until < clock_timestamp()
                RETURNING holder
                """,
                {"subject": subject, "server": server, "holder": holder, "ttl": ttl_seconds},
            )
            row = await cur.fetchone()
        return row is not None

    async def release_lease(self, subject: str, server: str, holder: str) -> None:
        async with self.store.pool.connection() as conn:
            await conn.execute(
                "DELETE FROM session_leases WHERE subject=%s AND server=%s AND holder=%s",
                (subject, server, holder)
            )

    async def release_leases_of(self, holder: str) -> int:
        """Drop every lease ``holder`` has (one known to be dead: its standbys need not wait out the
        leases); how many there were."""
        async with self.store.pool.connection() as conn:
            cur = await conn.execute("DELETE FROM session_leases WHERE holder=%s", (holder,))
            return cur.rowcount

    async def lease_remaining(self, subject: str, server: str) -> float | None:
        """Seconds until the (subject, server) lease runs out by the database clock (None: no live lease)."""
        async with self.store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT EXTRACT(EPOCH FROM lease_until - clock_timestamp())::float8 FROM session_leases"
                " WHERE subject=%s AND server=%s AND lease_until >= clock_timestamp()", (subject, server))
            row = await cur.fetchone()
        return None if row is None else max(0.0, float(row[0]))

    async def holder_lease_remaining(self, holder: str) -> float | None:
        """Seconds until the last live lease ``holder`` holds (any pair) runs out by the database clock
        (None: it holds no live lease)."""
        async with self.store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT EXTRACT(EPOCH FROM max(lease_until) - clock_timestamp())::float8 FROM session_leases"
                " WHERE holder=%s AND lease_until >= clock_timestamp()", (holder,))
            row = await cur.fetchone()
        return None if row is None or row[0] is None else max(0.0, float(row[0]))

    async def session_holder(self, subject: str, server: str) -> tuple[str, str] | None:
        """(task queue, host id) of the (subject, server) session row, open or closed (None: no row)."""
        async with self.store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT task_queue, host_id FROM mcp_sessions WHERE subject=%s AND server=%s",
                (subject, server))
            row = await cur.fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    async def lease_holder(self, subject: str, server: str) -> tuple[str, int] | None:
        async with self.store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT holder, epoch FROM session_leases WHERE subject=%s AND server=%s"
                " AND lease_until >= clock_timestamp()", (subject, server))
            row = await cur.fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    @activity.defn(name=Act.CURRENT_SESSION)
    async def current_session(self, req: SessionQuery) -> SessionInfo | None:
        async with self.store.pool.connection() as conn:
            return await session_in(conn.cursor(row_factory=dict_row), req)


async def session_in(cur: Any, req: SessionQuery) -> SessionInfo | None:
    """``current_session`` on the caller's cursor (a ``dict_row`` one), e.g. in its transaction."""
    await cur.execute("SELECT * FROM mcp_sessions WHERE subject=%s AND server=%s AND closed_at IS NULL",
                      (req.subject, req.server))
    row = await cur.fetchone()
    return None if row is None else _session(row)


def _session(row: dict[str, Any]) -> SessionInfo:
    return SessionInfo(
        subject=row["subject"],
        server=row["server"],
        generation=row["generation"],
        edition=row["edition"],
        subscribe=row["subscribe"],
        list_changed=row["list_changed"],
        server_name=row["server_name"],
        server_version=row["server_version"],
        task_queue=row["task_queue"],
        opened_at=row["opened_at"],
    )
