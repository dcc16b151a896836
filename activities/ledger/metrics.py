"""Read-only aggregate queries of the ledger that the Prometheus gauges show (docs/metrics.md).

Contract:
- Read-only and aggregate: counts, ages and flags per (server, state), (server, mode) or
  (server, subject); never a URI's row, never a resource body. ``read_snapshot`` runs the queries
  on one autocommit connection, so one that fails (an older schema) costs only its own values:
  its name is in ``LedgerSnapshot.failures`` and the others stand.
- Freshness: a subscription's freshness age is the time since the allocation of its newest read
  whose receipt saw content (ACCEPTED or UNCHANGED; since creation if none yet), over the
  subscriptions that claim to watch (``WATCHING``). Its published bound is the safety re-read
  period with a subscribing session, the poll interval without (``FreshnessMode``), as the
  ``SubscriptionOptions`` the caller starts subscriptions with define them.
- Cost: every query reads ``subscriptions`` and the small tables, never ``read_requests`` or
  ``resource_versions``: the read and receipt counts and the freshness time are the row's
  (``reads_granted``, ``receipt_counts``, ``content_read_at``: migration 025), kept by the
  transactions that write reads and receipts. They count since each subscription began; retention
  (``mcpsync prune``) never lowers them, so ``read_amplification`` stays cumulative.
- Unresolved subscriptions are every state but ACTIVE and the finished ones (``FINISHED``:
  CLOSED, REVOKED, TOMBSTONED). UNSUBSCRIBE_UNKNOWN is unresolved: the server may still send
  for it.
- Overdue verifications: the breaches recorded, by the verification that closed the gap or a
  watchdog that found it open (``VERIFICATION_OVERDUE`` audit rows,
  ``activities/ledger/verification.py``; retention prunes them with the audit log).
- Revocation latency: ``read_snapshot`` returns the revocations after a given id with the
  seconds from ``effective_at`` to their outbox row; ``last_revocation_id`` is where a new
  reader starts counting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import SubscriptionOptions, SubscriptionState

__all__ = [
    "FINISHED",
    "UNRESOLVED",
    "WATCHING",
    "Freshness",
    "FreshnessMode",
    "LedgerSnapshot",
    "freshness_bounds",
    "last_revocation_id",
    "read_snapshot",
    "snapshot_params",
]

FINISHED = frozenset({SubscriptionState.CLOSED, SubscriptionState.REVOKED, SubscriptionState.TOMBSTONED})
"""Outcomes that are final and known: not counted as unresolved."""
UNRESOLVED = tuple(s for s in SubscriptionState if s not in FINISHED and s != SubscriptionState.ACTIVE)
"""States ``mcpsync_unresolved_subscriptions`` counts (UNSUBSCRIBE_UNKNOWN included: an operator
should see it)."""
WATCHING = (SubscriptionState.ACTIVE, SubscriptionState.UPDATE_SEEN, SubscriptionState.READ_PENDING,
            SubscriptionState.VERSION_ACCEPTED)
"""States in which a subscription claims freshness: the ones its freshness age is measured over."""


class FreshnessMode(StrEnum):
    """Which published bound a subscription's freshness is held to (label ``mode``)."""

    SUBSCRIBE = "subscribe"  # the session subscribes: the safety re-read period bounds a lost notification
    POLL = "poll"  # no subscribe capability: the poll interval


def freshness_bounds(options: SubscriptionOptions | None = None) -> dict[FreshnessMode, float]:
    """The published staleness bound per mode for subscriptions started with ``options``.

    A safety period of 0 disables safety reads: subscribing subscriptions then publish no bound."""
    o = options or SubscriptionOptions()
    out = {FreshnessMode.POLL: o.poll_interval_seconds}
    if o.safety_read_seconds:
        out[FreshnessMode.SUBSCRIBE] = o.safety_read_seconds
    return out


@dataclass(frozen=True)
class Freshness:
    """Freshness of the watching subscriptions of one (server, mode)."""

    subscriptions: int
    max_age: float
    past_bound: int


@dataclass(frozen=True)
class LedgerSnapshot:
    """What one refresh read from PostgreSQL."""

    taken_at: float = 0.0
    reads: dict[str, int] = field(default_factory=dict)  # server -> read_requests rows
    receipts: dict[tuple[str, str], int] = field(default_factory=dict)  # (server, status) -> receipts
    states: dict[tuple[str, str], int] = field(default_factory=dict)  # (server, state) -> subscriptions
    # (server, state) -> seconds the longest-waiting subscription has been in it
    state_oldest: dict[tuple[str, str], float] = field(default_factory=dict)
    freshness: dict[tuple[str, str], Freshness] = field(default_factory=dict)  # (server, mode) -> freshness
    bounds: dict[FreshnessMode, float] = field(default_factory=dict)  # mode -> published bound (seconds)
    sessions: dict[tuple[str, str], bool] = field(default_factory=dict)  # (server, subject) -> up
    stale_after_close: dict[str, int] = field(default_factory=dict)  # server -> audit rows
    overdue: dict[str, int] = field(default_factory=dict)  # server -> VERIFICATION_OVERDUE audit rows
    revocations: int = 0
    failures: tuple[str, ...] = ()  # queries that failed (``name: error type``): their values are absent

    def amplification(self, server: str) -> float | None:
        changes = self.receipts.get((server, AcceptVerdict.ACCEPTED.value), 0)
        return self.reads.get(server, 0) / changes if changes else None


# None reads the history tables (module contract, "Cost"): a refresh is O(subscriptions).
SNAPSHOT_QUERIES = {
    "reads": "SELECT server, sum(reads_granted)::bigint FROM subscriptions GROUP BY server"
             " HAVING sum(reads_granted) > 0",
    "receipts": "SELECT s.server, c.key, sum(c.value::bigint)::bigint"
                " FROM subscriptions s, jsonb_each_text(s.receipt_counts) c GROUP BY s.server, c.key",
    "states": "SELECT server, state, count(*) FROM subscriptions GROUP BY server, state",
    # state_changed_at: migration 007 (a trigger sets it whenever state changes).
    "state_oldest": """
        SELECT server, state, extract(epoch FROM now() - min(state_changed_at))::float8
        FROM subscriptions WHERE state = ANY(%(unresolved)s) GROUP BY server, state""",
    # ``content_read_at``: the allocation of the newest read whose receipt saw content.
    "freshness": """
        WITH w AS (
            SELECT s.server,
                   CASE WHEN coalesce(m.subscribe, true) THEN %(subscribe)s ELSE %(poll)s END AS mode,
                   extract(epoch FROM now() - coalesce(s.content_read_at, s.created_at))::float8 AS age
            FROM subscriptions s
            LEFT JOIN mcp_sessions m ON m.subject = s.subject AND m.server = s.server
            WHERE s.state = ANY(%(watching)s))
        SELECT server, mode, count(*), max(age),
               count(*) FILTER (WHERE age > CASE WHEN mode = %(poll)s THEN %(poll_bound)s::float8
                                                  ELSE %(subscribe_bound)s::float8 END)
        FROM w GROUP BY server, mode""",
    # Every (server, subject) with an open session, a live lease or a subscription still in
    # progress; up = an open session whose ingress still holds the lease.
    "sessions": """
        WITH pairs AS (
            SELECT server, subject FROM mcp_sessions WHERE closed_at IS NULL
            UNION SELECT server, subject FROM session_leases WHERE lease_until >= clock_timestamp()
            UNION SELECT server, subject FROM subscriptions WHERE NOT (state = ANY(%(finished)s)))
        SELECT p.server, p.subject,
               EXISTS (SELECT 1 FROM mcp_sessions m
                       WHERE m.server = p.server AND m.subject = p.subject AND m.closed_at IS NULL)
               AND EXISTS (SELECT 1 FROM session_leases l
                           WHERE l.server = p.server AND l.subject = p.subject
                             AND l.lease_until >= clock_timestamp())
        FROM pairs p""",
    "stale_after_close": "SELECT server, count(*) FROM audit WHERE kind = 'STALE_AFTER_CLOSE'"
                         " GROUP BY server",
    "overdue": "SELECT server, count(*) FROM audit WHERE kind = 'VERIFICATION_OVERDUE' GROUP BY server",
    "revocations": "SELECT count(*) FROM revocations",
    "new_revocations": """
        SELECT r.revocation_id, extract(epoch FROM o.created_at - r.effective_at)::float8
        FROM revocations r JOIN outbox o ON o.outbox_id = r.outbox_id
        WHERE r.revocation_id > %(after)s ORDER BY r.revocation_id LIMIT 10000""",
}


def snapshot_params(after_revocation: int, bounds: dict[FreshnessMode, float]) -> dict[str, object]:
    """The parameters of ``SNAPSHOT_QUERIES`` (``bounds``: ``freshness_bounds``)."""
    return {
        "unresolved": [s.value for s in UNRESOLVED], "finished": [s.value for s in FINISHED],
        "watching": [s.value for s in WATCHING],
        "subscribe": FreshnessMode.SUBSCRIBE.value, "poll": FreshnessMode.POLL.value,
        "subscribe_bound": bounds.get(FreshnessMode.SUBSCRIBE), "poll_bound": bounds.get(FreshnessMode.POLL),
        "after": after_revocation,
    }


async def read_snapshot(pool: AsyncConnectionPool, after_revocation: int, *,
                        options: SubscriptionOptions | None = None,
                        ) -> tuple[LedgerSnapshot, list[tuple[int, float]]]:
    """One consistent-enough read of the ledger (a few aggregate queries, one connection), and the
    revocations after ``after_revocation`` as ``(revocation_id, seconds to its outbox row)``."""
    q = SNAPSHOT_QUERIES
    bounds = freshness_bounds(options)
    params = snapshot_params(after_revocation, bounds)
    failures: list[str] = []
    async with pool.connection() as conn:

        async def rows(name: str) -> list[Any]:
            # Autocommit: one failing query (an older schema) costs only its own values.
            try:
                cursor = await conn.execute(q[name], params if "%(" in q[name] else None)
                return list(await cursor.fetchall())
            except psycopg.Error as exc:
                failures.append(f"{name}: {type(exc).__name__}")
                return []

        reads = {r[0]: int(r[1]) for r in await rows("reads")}
        receipts = {(r[0], r[1]): int(r[2]) for r in await rows("receipts")}
        states = {(r[0], r[1]): int(r[2]) for r in await rows("states")}
        oldest = {(r[0], r[1]): float(r[2]) for r in await rows("state_oldest")}
        freshness = {(r[0], r[1]): Freshness(int(r[2]), float(r[3]), int(r[4]))
                     for r in await rows("freshness")}
        sessions = {(r[0], r[1]): bool(r[2]) for r in await rows("sessions")}
        sac = {r[0]: int(r[1]) for r in await rows("stale_after_close")}
        overdue = {r[0]: int(r[1]) for r in await rows("overdue")}
        total = await rows("revocations")
        new = [(int(r[0]), float(r[1])) for r in await rows("new_revocations")]
    snap = LedgerSnapshot(taken_at=time.time(), reads=reads, receipts=receipts, states=states,
                          state_oldest=oldest, freshness=freshness, bounds=bounds, sessions=sessions,
                          stale_after_close=sac, overdue=overdue,
                          revocations=int(total[0][0]) if total else 0,
                          failures=tuple(failures))
    return snap, new


async def last_revocation_id(pool: AsyncConnectionPool) -> int:
    """The newest revocation's id (0 when none, or when the table is not there)."""
    try:
        async with pool.connection() as conn:
            cursor = await conn.execute("SELECT coalesce(max(revocation_id), 0) FROM revocations")
            row = await cursor.fetchone()
    except psycopg.Error:
        return 0
    return int(row[0]) if row else 0
