"""The PostgreSQL ledger: durable fences, version receipts, outbox, audit, content store.

Contract:
- The fence row in ``subscriptions`` is the durable copy of each workflow's
  ordinals, generations and close epoch. Every allocation and every acceptance
  is a compare-and-set against it, so a workflow whose history was reset or
  rolled back can ask, but never move the fence backwards.
- ``accept`` is the only code that makes a version current. In one transaction it
  locks the fence row, re-checks state, generations, the issued request and
  ``readOrdinal > lastAcceptedOrdinal``, writes the ``resourceVersion.v1``
  receipt, advances the watermark and (when the digest changed) the outbox row.
- Generations and ordinals only grow: the ledger answers ``GREATEST(ledger+1, asked)``.
- Bodies are stored only in ``content_store`` keyed by (subject, digest); nothing
  here logs or returns them except ``get_content``.
- A subscription's row is found by its key (subject, server, exact URI), never by a workflow
  id computed from the key: the row records, once, the id its workflow actually runs under
  (``ensure_subscription``: the calling workflow's id), and ``workflow_id_of`` /
  ``note_notification`` hand that id to everything that routes to the workflow. Subscriptions
  started under an older id scheme (``SubscriptionKey.legacy_workflow_id``) keep theirs for good.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict

from workflows.catalog import RolloutMode, RolloutPolicy, refresh_enabled
from workflows.fence import IssuedRead, allocate_ordinal, close_rule, judge_read, revoke_rule, tombstone_rule
from workflows.records import (
    TERMINAL_STATES,
    AcceptRequest,
    AcceptResult,
    AcceptVerdict,
    AllocateRequest,
    CacheScope,
    CloseReceipt,
    FenceSnapshot,
    ReadOutcomeKind,
    ReadTicket,
    ResourceVersionV1,
    SessionInfo,
    SubscriptionKey,
    SubscriptionState,
    TriggerReason,
)
from workflows.uris import normalize_uri

__all__ = ["Ledger", "NotedNotification", "OutboxRow", "AuditRow"]

ACTIVE = SubscriptionState.ACTIVE.value
# The one way to find a subscription's row (UNIQUE (subject, server, uri) indexes it).
BY_KEY = "subject=%s AND server=%s AND uri=%s"
CLOSING_STATES = (
    SubscriptionState.UNSUBSCRIBING.value,
    SubscriptionState.CLOSED.value,
    SubscriptionState.UNSUBSCRIBE_UNKNOWN.value,
)
# ``records.TERMINAL_STATES`` as SQL parameters (sorted: one statement text, one plan).
TERMINAL_STATE_VALUES = sorted(state.value for state in TERMINAL_STATES)
# States from which (re)subscribing is allowed. CLOSED and UNSUBSCRIBE_UNKNOWN never reopen.
_VERDICTS = {v.value for v in AcceptVerdict}
SUBSCRIBABLE_STATES = (
    SubscriptionState.DISCOVERED.value,
    SubscriptionState.SUBSCRIBING.value,
    SubscriptionState.ACTIVE.value,
    SubscriptionState.TOMBSTONE_PENDING.value,
    SubscriptionState.RECONCILIATION_REQUIRED.value,
)


def _snapshot(row: dict[str, Any] | None) -> FenceSnapshot:
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
    )


def _key(key: SubscriptionKey) -> tuple[str, str, str]:
    """``BY_KEY``'s parameters."""
    return key.subject, key.server, key.uri


class NotedNotification(BaseModel):
    """``note_notification``'s answer: where to signal, and the row's update counter after it."""

    model_config = ConfigDict(frozen=True)

    workflow_id: str  # the id the subscription's workflow runs under (the ledger's record)
    fence: FenceSnapshot


class OutboxRow(dict[str, Any]):
    """One invalidation outbox row (plain dict for JSON output)."""


class AuditRow(dict[str, Any]):
    """One audit row (plain dict for JSON output)."""


class Ledger:
    def __init__(self, pool: AsyncConnectionPool) -> None:
        self.pool = pool

    # --- sessions ---------------------------------------------------------------

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
    ) -> SessionInfo:
        """Record a newly initialized session; its generation is one above any before it."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                """
                INSERT INTO mcp_sessions AS s (subject, server, generation, edition, subscribe, list_changed,
                    server_name, server_version, task_queue, host_id)
                VALUES (%(subject)s, %(server)s, 1, %(edition)s, %(subscribe)s, %(list_changed)s,
                    %(server_name)s, %(server_version)s, %(task_queue)s, %(host_id)s)
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
            assert row is not None
            await cur.execute(
                """
                INSERT INTO mcp_session_history (subject, server, generation, edition, capabilities,
                    server_name, server_version, host_id)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
                """,
                (subject, server, row["generation"], edition, json.dumps(capabilities), server_name,
                 server_version, host_id),
            )
        return self._session(row)

    async def close_session(self, subject: str, server: str, generation: int) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(
                "UPDATE mcp_sessions SET closed_at = now() WHERE subject=%s AND server=%s AND generation=%s",
                (subject, server, generation),
            )

    async def acquire_lease(self, subject: str, server: str, holder: str, ttl_seconds: float) -> bool:
        """Take or renew the (subject, server) session lease; True while ``holder`` owns it."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                """
                INSERT INTO session_leases AS l (subject, server, holder, lease_until)
                VALUES (%(subject)s, %(server)s, %(holder)s, clock_timestamp() + make_interval(secs => %(ttl)s))
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
        async with self.pool.connection() as conn:
            await conn.execute(
                "DELETE FROM session_leases WHERE subject=%s AND server=%s AND holder=%s", (subject, server, holder)
            )

    async def lease_holder(self, subject: str, server: str) -> tuple[str, int] | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT holder, epoch FROM session_leases WHERE subject=%s AND server=%s"
                " AND lease_until >= clock_timestamp()", (subject, server))
            row = await cur.fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    async def current_session(self, subject: str, server: str) -> SessionInfo | None:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT * FROM mcp_sessions WHERE subject=%s AND server=%s AND closed_at IS NULL",
                (subject, server),
            )
            row = await cur.fetchone()
        return None if row is None else self._session(row)

    @staticmethod
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

    # --- fence ------------------------------------------------------------------

    async def ensure_subscription(self, key: SubscriptionKey, incarnation: str,
                                  workflow_id: str | None = None) -> FenceSnapshot:
        """Create the fence row in DISCOVERED if absent; return it as stored.

        ``workflow_id`` is the id of the workflow asking (the activity passes its caller's; default
        ``key.workflow_id``). The row records it when it is created and never changes it: a row
        that already names another id keeps it (audited as ``WORKFLOW_ID_MISMATCH``: a second
        workflow for one key, started by something that did not ask ``workflow_id_of``).
        A closed row is reopened to DISCOVERED (ordinals and epochs kept) only for a new
        incarnation: the chain that closed it, reset or not, finds it closed.
        """
        running_as = workflow_id or key.workflow_id
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                """
                INSERT INTO subscriptions AS s (workflow_id, subject, server, uri, uri_normalized, state, incarnation)
                VALUES (%s, %s, %s, %s, %s, %s, %s)
                ON CONFLICT (subject, server, uri) DO UPDATE SET uri_normalized = EXCLUDED.uri_normalized
                    WHERE s.uri_normalized IS NULL
                """,  # a row from before migration 008 that the backfill has not reached yet
                (running_as, key.subject, key.server, key.uri, normalize_uri(key.uri),
                 SubscriptionState.DISCOVERED.value, incarnation),
            )
            await cur.execute(
                f"""
                UPDATE subscriptions SET state=%s, incarnation=%s, close_ordinal=NULL, updated_at=now()
                WHERE {BY_KEY} AND incarnation <> %s AND state = ANY(%s)
                """,
                (SubscriptionState.DISCOVERED.value, incarnation, *_key(key), incarnation, TERMINAL_STATE_VALUES),
            )
            await cur.execute(
                f"UPDATE subscriptions SET incarnation=%s WHERE {BY_KEY} AND NOT (state = ANY(%s))",
                (incarnation, *_key(key), list(CLOSING_STATES)),
            )
            await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY}", _key(key))
            row = await cur.fetchone()
            if row is not None and row["workflow_id"] != running_as:
                await cur.execute(
                    "INSERT INTO audit (kind, subject, server, uri, workflow_id, detail)"
                    " VALUES ('WORKFLOW_ID_MISMATCH', %s, %s, %s, %s, %s)",
                    (*_key(key), row["workflow_id"], json.dumps({"running_as": running_as})),
                )
            return _snapshot(row)

    async def workflow_id_of(self, key: SubscriptionKey) -> str:
        """The id the subscription of ``key`` runs under: the one its row recorded, whatever scheme
        made it; ``key.workflow_id`` (the readable scheme) only for a key with no row yet."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(f"SELECT workflow_id FROM subscriptions WHERE {BY_KEY}", _key(key))
            row = await cur.fetchone()
        return key.workflow_id if row is None else str(row[0])

    async def load_fence(self, key: SubscriptionKey) -> FenceSnapshot:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY}", _key(key))
            return _snapshot(await cur.fetchone())

    async def find_subscription(self, subject: str, server: str, uri: str) -> FenceSnapshot | None:
        """The fence row for the exact (subject, server, uri), or None."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT * FROM subscriptions WHERE subject=%s AND server=%s AND uri=%s", (subject, server, uri)
            )
            row = await cur.fetchone()
        return None if row is None else _snapshot(row)

    async def subscriptions_for(self, subject: str, server: str) -> list[tuple[str, str, str]]:
        """(workflow_id, uri, state) of every subscription of one (subject, server)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT workflow_id, uri, state FROM subscriptions WHERE subject=%s AND server=%s",
                (subject, server),
            )
            return [(r[0], r[1], r[2]) for r in await cur.fetchall()]

    async def normalized_siblings(self, subject: str, server: str, uri: str) -> list[tuple[str, str]]:
        """(workflow_id, uri) of the non-terminal subscriptions of (subject, server) whose URI differs
        from ``uri`` but normalizes alike (``workflows.uris.normalize_uri``): one indexed query.
        Never a route: a caller may only invalidate or flag them."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                """
                SELECT workflow_id, uri FROM subscriptions
                WHERE subject=%s AND server=%s AND uri_normalized=%s AND uri <> %s AND NOT (state = ANY(%s))
                ORDER BY uri
                """,
                (subject, server, normalize_uri(uri), uri, TERMINAL_STATE_VALUES),
            )
            return [(r[0], r[1]) for r in await cur.fetchall()]

    async def begin_subscription(self, key: SubscriptionKey, session_generation: int) -> FenceSnapshot:
        """SUBSCRIBING with subscription generation + 1 bound to ``session_generation``.

        Refused (the stored snapshot is returned unchanged) when the row is closing or closed,
        or when the session generation would go backwards.
        """
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                f"""
                UPDATE subscriptions SET state=%s, subscription_generation = subscription_generation + 1,
                    session_generation=%s, updated_at=now()
                WHERE {BY_KEY} AND state = ANY(%s) AND session_generation <= %s
                RETURNING *
                """,
                (SubscriptionState.SUBSCRIBING.value, session_generation, *_key(key),
                 list(SUBSCRIBABLE_STATES), session_generation),
            )
            row = await cur.fetchone()
            if row is None:
                await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY}", _key(key))
                row = await cur.fetchone()
        return _snapshot(row)

    async def mark_active(self, key: SubscriptionKey, session_generation: int, subscription_generation: int) -> FenceSnapshot:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                f"""
                UPDATE subscriptions SET state=%s, updated_at=now()
                WHERE {BY_KEY} AND state=%s AND session_generation=%s AND subscription_generation=%s
                RETURNING *
                """,
                (ACTIVE, *_key(key), SubscriptionState.SUBSCRIBING.value, session_generation,
                 subscription_generation),
            )
            row = await cur.fetchone()
            if row is None:
                await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY}", _key(key))
                row = await cur.fetchone()
        return _snapshot(row)

    async def set_state(self, key: SubscriptionKey, state: SubscriptionState, *, allowed_from: Sequence[str]) -> FenceSnapshot:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                f"UPDATE subscriptions SET state=%s, updated_at=now() WHERE {BY_KEY} AND state = ANY(%s)",
                (state.value, *_key(key), list(allowed_from)),
            )
            await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY}", _key(key))
            return _snapshot(await cur.fetchone())

    async def allocate_read(self, req: AllocateRequest) -> ReadTicket:
        """CAS the next ordinal (``workflows.fence.allocate_ordinal`` on the locked row)."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY} FOR UPDATE", _key(req.key))
            row = await cur.fetchone()
            request_id = req.request_id
            while True:
                await cur.execute("SELECT ordinal, completed_at, notifications_seen FROM read_requests"
                                  " WHERE request_id=%s", (request_id,))
                prior = await cur.fetchone()
                if prior is None:
                    break
                if prior["completed_at"] is None:
                    # The same allocation asked again (a retry after a lost response): the same ticket,
                    # with the update counter that allocation saw (not today's: F11).
                    return ReadTicket(granted=True, ordinal=prior["ordinal"], request_id=request_id,
                                      notifications_seen=prior["notifications_seen"])
                # A reset run re-derived a request id that was already used and finished: this is
                # a new read, with a request id of its own (derived again after a second reset).
                request_id = f"{request_id}/{prior['ordinal']}"
            ordinal = allocate_ordinal(_snapshot(row), session_generation=req.session_generation,
                                       subscription_generation=req.subscription_generation,
                                       min_ordinal=req.min_ordinal)
            if ordinal is None:
                return ReadTicket(granted=False, reason="fence refused: not ACTIVE or generation mismatch")
            assert row is not None  # allocate_ordinal grants nothing without a row
            wf = row["workflow_id"]
            await cur.execute(
                "UPDATE subscriptions SET last_issued_ordinal=%s, updated_at=now() WHERE workflow_id=%s",
                (ordinal, wf),
            )
            await cur.execute(
                """
                INSERT INTO read_requests (workflow_id, ordinal, request_id, session_generation,
                    subscription_generation, trigger_reason, notifications_seen)
                VALUES (%s, %s, %s, %s, %s, %s, %s)
                """,
                (wf, ordinal, request_id, req.session_generation, req.subscription_generation,
                 req.trigger.value, row["notifications_seen"]),
            )
        return ReadTicket(granted=True, ordinal=ordinal, request_id=request_id,
                          notifications_seen=row["notifications_seen"])

    async def accept(self, req: AcceptRequest) -> AcceptResult:
        """The sole acceptance point: ``workflows.fence.judge_read`` on the locked row, then its writes."""
        o = req.outcome
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY} FOR UPDATE", _key(o.key))
            row = await cur.fetchone()
            fence = _snapshot(row)
            wf = row["workflow_id"] if row is not None else None  # no row: nothing issued, nothing accepted
            issued_row = None
            if wf is not None:
                await cur.execute("SELECT * FROM read_requests WHERE workflow_id=%s AND ordinal=%s", (wf, o.ordinal))
                issued_row = await cur.fetchone()
            issued = None if issued_row is None else IssuedRead(
                ordinal=issued_row["ordinal"], request_id=issued_row["request_id"],
                session_generation=issued_row["session_generation"],
                subscription_generation=issued_row["subscription_generation"],
                completed_verdict=AcceptVerdict(issued_row["outcome"]) if issued_row["outcome"] in _VERDICTS else None,
            )
            j = judge_read(fence, issued, o, row_uri=row["uri"] if row else None)
            base = {"watermark": fence.watermark, "last_accepted_ordinal": fence.last_accepted_ordinal}
            if j.reason == "replayed":
                # An activity retry after a committed accept: the same verdict, nothing written twice.
                await cur.execute(
                    "SELECT receipt_id FROM resource_versions WHERE workflow_id=%s AND read_ordinal=%s", (wf, o.ordinal)
                )
                prior = await cur.fetchone()
                return AcceptResult(verdict=j.verdict, receipt_id=prior["receipt_id"] if prior else None,
                                    reason=j.reason, **base)
            if j.audit_kind is not None:
                await cur.execute(
                    "INSERT INTO audit (kind, subject, server, uri, workflow_id, session_generation, detail)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    (j.audit_kind, o.key.subject, o.key.server, o.key.uri, wf, o.session_generation,
                     json.dumps({"reason": j.reason, "ordinal": o.ordinal, "request_id": o.request_id,
                                 "outcome": o.kind.value, "digest": o.content_digest,
                                 "error_code": o.error_code})),
                )
            if issued is not None and j.audit_kind != "UNKNOWN_IDENTITY":
                await cur.execute(
                    "UPDATE read_requests SET completed_at=now(), outcome=%s WHERE workflow_id=%s AND ordinal=%s",
                    # Every final verdict is stored so a retried accept replays it; a failed read keeps
                    # its outcome kind (denied, malformed, ...) for the answer gate and the audit.
                    (o.kind.value if j.verdict == AcceptVerdict.REJECTED else j.verdict.value, wf, o.ordinal),
                )
            if j.verdict == AcceptVerdict.REVOKED:
                assert row is not None
                await self._revoke_locked(cur, row, reason=j.reason, source="read_denied",
                                          effective_at=o.completed_at or datetime.now(UTC))
                return AcceptResult(verdict=j.verdict, reason=j.reason, **base)
            if not j.write_receipt:
                return AcceptResult(verdict=j.verdict, reason=j.reason, **base)
            await cur.execute(
                """
                INSERT INTO resource_versions (workflow_id, subject, server, uri, mime_type, content_digest, size,
                    read_ordinal, server_name, server_version, edition, session_generation,
                    subscription_generation, request_id, trigger_reason, status, ttl_ms, cache_scope)
                VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) RETURNING receipt_id, accepted_at
                """,
                (wf, o.key.subject, o.key.server, o.key.uri, o.mime_type, o.content_digest, o.size, o.ordinal,
                 o.server_name, o.server_version, o.edition, o.session_generation, o.subscription_generation,
                 o.request_id, o.trigger.value, j.verdict.value, o.ttl_ms,
                 o.cache_scope.value if o.cache_scope is not None else None),
            )
            receipt = await cur.fetchone()
            assert receipt is not None
            receipt_id = int(receipt["receipt_id"])
            if j.advance_ordinal_only:
                await cur.execute(
                    "UPDATE subscriptions SET last_accepted_ordinal=%s, updated_at=now() WHERE workflow_id=%s",
                    (o.ordinal, wf),
                )
                return AcceptResult(verdict=j.verdict, receipt_id=receipt_id, reason=j.reason,
                                    watermark=fence.watermark, last_accepted_ordinal=o.ordinal)
            if not j.advance:
                return AcceptResult(verdict=j.verdict, receipt_id=receipt_id, reason=j.reason, **base)
            outbox_id = None
            if j.outbox and not await self._rollout_allows(cur, o.key):
                # Shadow / not yet in the rollout percentage: fences and receipts as usual, nothing published.
                await cur.execute(
                    "INSERT INTO audit (kind, subject, server, uri, workflow_id, session_generation, detail)"
                    " VALUES ('OUTBOX_HELD_BY_ROLLOUT', %s, %s, %s, %s, %s, %s)",
                    (o.key.subject, o.key.server, o.key.uri, wf, o.session_generation,
                     json.dumps({"receipt_id": receipt_id, "digest": o.content_digest})),
                )
            elif j.outbox:
                await cur.execute(
                    """
                    INSERT INTO outbox (event_type, workflow_id, subject, server, uri, receipt_id, content_digest,
                        read_ordinal, detail)
                    VALUES ('version_accepted', %s, %s, %s, %s, %s, %s, %s, %s) RETURNING outbox_id
                    """,
                    (wf, o.key.subject, o.key.server, o.key.uri, receipt_id, o.content_digest, o.ordinal,
                     json.dumps({  # the outboxEvent.v1 fields (activities/outbox.py) not in columns
                         "previous_digest": fence.last_accepted_digest, "mime_type": o.mime_type, "size": o.size,
                         "edition": o.edition, "server_name": o.server_name, "server_version": o.server_version,
                         "accepted_at": receipt["accepted_at"].isoformat(), "trigger": o.trigger.value,
                         "ttl_ms": o.ttl_ms,
                         "cache_scope": o.cache_scope.value if o.cache_scope is not None else None})),
                )
                ob = await cur.fetchone()
                outbox_id = int(ob["outbox_id"]) if ob else None
            is_content = o.kind == ReadOutcomeKind.CONTENT
            await cur.execute(
                """
                UPDATE subscriptions SET last_accepted_ordinal=%s, watermark=%s, state=%s,
                    last_accepted_digest = CASE WHEN %s THEN %s ELSE last_accepted_digest END,
                    last_receipt_id=%s, updated_at=now()
                WHERE workflow_id=%s
                """,
                (o.ordinal, o.ordinal, (j.new_state or SubscriptionState.ACTIVE).value, is_content,
                 o.content_digest, receipt_id, wf),
            )
            return AcceptResult(verdict=j.verdict, receipt_id=receipt_id, outbox_id=outbox_id,
                                watermark=o.ordinal, last_accepted_ordinal=o.ordinal, reason=j.reason)

    async def begin_unsubscribe(self, key: SubscriptionKey) -> CloseReceipt:
        """beginUnsubscribe (``workflows.fence.close_rule``): freezes closeOrdinal and a new close epoch.

        Idempotent: a row already closing answers its frozen receipt.
        """
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY} FOR UPDATE", _key(key))
            row = await cur.fetchone()
            if row is None:
                raise LookupError(f"no subscription {key.subject}/{key.server} {key.uri}")
            rule = close_rule(_snapshot(row))
            if rule is not None:
                state, epoch, ordinal = rule
                await cur.execute(
                    "UPDATE subscriptions SET state=%s, close_epoch=%s, close_ordinal=%s, updated_at=now()"
                    " WHERE workflow_id=%s RETURNING *",
                    (state.value, epoch, ordinal, row["workflow_id"]),
                )
                row = await cur.fetchone()
                assert row is not None
        return CloseReceipt(
            state=SubscriptionState(row["state"]),
            close_epoch=row["close_epoch"],
            close_ordinal=row["close_ordinal"] if row["close_ordinal"] is not None else row["last_issued_ordinal"],
            last_accepted_ordinal=row["last_accepted_ordinal"],
        )

    @staticmethod
    async def _rollout_allows(cur: Any, key: SubscriptionKey) -> bool:
        """The staged rollout (``workflows.catalog.refresh_enabled``); no policy row means ALL."""
        await cur.execute("SELECT mode, percent FROM rollout_policies WHERE server=%s", (key.server,))
        row = await cur.fetchone()
        if row is None:
            return True
        policy = RolloutPolicy(server=key.server, mode=RolloutMode(row["mode"]), percent=row["percent"])
        return refresh_enabled(policy, key.subject, key.server, key.uri)

    async def confirm_tombstone(self, key: SubscriptionKey, *, listed: bool, scan_id: str,
                                proven: bool = False) -> FenceSnapshot:
        """``workflows.fence.tombstone_rule`` on the locked row; TOMBSTONED writes receipt + outbox row."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY} FOR UPDATE", _key(key))
            row = await cur.fetchone()
            fence = _snapshot(row)
            target = tombstone_rule(fence, listed=listed, proven=proven)
            if target is None or row is None:
                return fence
            wf = row["workflow_id"]
            if target == SubscriptionState.REVOKED:
                await self._revoke_locked(cur, row, reason=f"not listed for this subject in catalog {scan_id}",
                                          source="catalog", effective_at=datetime.now(UTC))
            elif target == SubscriptionState.TOMBSTONED:
                await cur.execute(
                    """
                    INSERT INTO resource_versions (workflow_id, subject, server, uri, read_ordinal, session_generation,
                        subscription_generation, request_id, trigger_reason, status)
                    VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) RETURNING receipt_id, accepted_at
                    """,
                    (wf, key.subject, key.server, key.uri, fence.last_accepted_ordinal, fence.session_generation,
                     fence.subscription_generation, f"catalog:{scan_id}", "catalog", AcceptVerdict.TOMBSTONED.value),
                )
                receipt = await cur.fetchone()
                assert receipt is not None
                if await self._rollout_allows(cur, key):
                    receipt_ids, digests = await self._derived(cur, wf)
                    await cur.execute(
                        """
                        INSERT INTO outbox (event_type, workflow_id, subject, server, uri, receipt_id, read_ordinal,
                            detail)
                        VALUES ('tombstoned', %s, %s, %s, %s, %s, %s, %s)
                        """,
                        (wf, key.subject, key.server, key.uri, receipt["receipt_id"], fence.last_accepted_ordinal,
                         json.dumps({"previous_digest": fence.last_accepted_digest, "receipt_ids": receipt_ids,
                                     "digests": digests, "trigger": "catalog",
                                     "accepted_at": receipt["accepted_at"].isoformat(),
                                     "reason": f"deleted: not listed in reconciled catalog {scan_id}"})),
                    )
                await cur.execute(
                    "UPDATE subscriptions SET state=%s, last_receipt_id=%s, updated_at=now() WHERE workflow_id=%s",
                    (target.value, receipt["receipt_id"], wf),
                )
            else:
                await cur.execute("UPDATE subscriptions SET state=%s, updated_at=now() WHERE workflow_id=%s",
                                  (target.value, wf))
            await cur.execute("SELECT * FROM subscriptions WHERE workflow_id=%s", (wf,))
            return _snapshot(await cur.fetchone())

    async def revoke(self, key: SubscriptionKey, *, reason: str, source: str, effective_at: datetime) -> FenceSnapshot:
        """Revoke one subscription (idempotent): state REVOKED, the subject's cached bodies purged,
        one outbox ``revoked`` row naming every receipt derived from it, latency recorded."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY} FOR UPDATE", _key(key))
            row = await cur.fetchone()
            if row is not None and revoke_rule(_snapshot(row)):
                await self._revoke_locked(cur, row, reason=reason, source=source, effective_at=effective_at)
            await cur.execute(f"SELECT * FROM subscriptions WHERE {BY_KEY}", _key(key))
            return _snapshot(await cur.fetchone())

    @staticmethod
    async def _revoke_locked(cur: Any, row: dict[str, Any], *, reason: str, source: str,
                             effective_at: datetime) -> None:
        wf, subject = row["workflow_id"], row["subject"]
        await cur.execute("UPDATE subscriptions SET state=%s, updated_at=now() WHERE workflow_id=%s",
                          (SubscriptionState.REVOKED.value, wf))
        receipt_ids, digests = await Ledger._derived(cur, wf)
        # Purge the subject's bodies, except those another live subscription of the subject still uses.
        await cur.execute(
            """
            DELETE FROM content_store c WHERE c.subject=%s AND c.content_digest = ANY(%s)
              AND NOT EXISTS (
                SELECT 1 FROM resource_versions rv JOIN subscriptions s ON s.workflow_id = rv.workflow_id
                WHERE rv.content_digest = c.content_digest AND s.subject = c.subject
                  AND s.workflow_id <> %s AND s.state <> %s)
            """,
            (subject, digests, wf, SubscriptionState.REVOKED.value),
        )
        purged = cur.rowcount
        await cur.execute(
            """
            INSERT INTO outbox (event_type, workflow_id, subject, server, uri, receipt_id, read_ordinal, detail,
                created_at)
            VALUES ('revoked', %s, %s, %s, %s, %s, %s, %s, clock_timestamp()) RETURNING outbox_id
            """,
            (wf, subject, row["server"], row["uri"], row["last_receipt_id"], row["last_accepted_ordinal"],
             json.dumps({"receipt_ids": receipt_ids, "digests": digests, "source": source, "reason": reason[:300],
                         "previous_digest": row["last_accepted_digest"]})),
        )
        outbox = await cur.fetchone()
        await cur.execute(
            """
            INSERT INTO revocations (workflow_id, subject, server, uri, source, reason, effective_at, outbox_id,
                purged_bodies)
            VALUES (%s, %s, %s, %s, %s, %s, LEAST(%s, clock_timestamp()), %s, %s)
            """,
            (wf, subject, row["server"], row["uri"], source, reason[:300], effective_at, outbox["outbox_id"], purged),
        )

    @staticmethod
    async def _derived(cur: Any, workflow_id: str) -> tuple[list[int], list[str]]:
        """Every receipt of a subscription and the digests they name: what a tombstone or a
        revocation withdraws (``outboxEvent.v1`` ``invalidates``)."""
        await cur.execute(
            "SELECT receipt_id, content_digest FROM resource_versions WHERE workflow_id=%s ORDER BY receipt_id",
            (workflow_id,))
        receipts = await cur.fetchall()
        return [r["receipt_id"] for r in receipts], sorted({r["content_digest"] for r in receipts
                                                             if r["content_digest"]})

    async def current_content(self, key: SubscriptionKey) -> tuple[int, str, str | None, bytes] | None:
        """(receipt id, digest, MIME type, body) of the current version, only while it may be served:
        the subscription ACTIVE and the body still in the subject's store. Never after revocation."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                """
                SELECT s.last_receipt_id, s.last_accepted_digest, c.mime_type, c.body
                FROM subscriptions s JOIN content_store c
                  ON c.subject = s.subject AND c.content_digest = s.last_accepted_digest
                WHERE s.subject=%s AND s.server=%s AND s.uri=%s AND s.state=%s
                """,
                (*_key(key), SubscriptionState.ACTIVE.value),
            )
            row = await cur.fetchone()
        return None if row is None else (int(row[0]), str(row[1]), row[2], bytes(row[3]))

    async def note_notification(self, subject: str, server: str, uri: str,
                                generation: int) -> NotedNotification | None:
        """Record that an update naming (subject, server, uri) arrived; None if nobody subscribed to it.
        The answer names the workflow id the row recorded: the ingress signals that, never a computed one."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                """
                UPDATE subscriptions SET notifications_seen = notifications_seen + 1, last_notification_at = now(),
                    last_notification_generation = %s
                WHERE subject=%s AND server=%s AND uri=%s RETURNING *
                """,
                (generation, subject, server, uri),
            )
            row = await cur.fetchone()
        return None if row is None else NotedNotification(workflow_id=row["workflow_id"], fence=_snapshot(row))

    async def finish_unsubscribe(self, key: SubscriptionKey, acked: bool) -> FenceSnapshot:
        """UNSUBSCRIBING → CLOSED (ack) or UNSUBSCRIBE_UNKNOWN (lost/failed ack). Never reopens."""
        target = SubscriptionState.CLOSED if acked else SubscriptionState.UNSUBSCRIBE_UNKNOWN
        return await self.set_state(key, target, allowed_from=[SubscriptionState.UNSUBSCRIBING.value])

    # --- content store, audit, outbox ----------------------------------------------

    async def put_content(self, subject: str, digest: str, mime_type: str | None, body: bytes,
                          kind: str | None = None) -> None:
        """Store a body; ``kind`` is how it was read: ``text`` (UTF-8), ``blob`` or ``multipart``."""
        async with self.pool.connection() as conn:
            await conn.execute(
                """
                INSERT INTO content_store (subject, content_digest, mime_type, size, body, kind)
                VALUES (%s, %s, %s, %s, %s, %s)
                ON CONFLICT (subject, content_digest) DO UPDATE SET stored_at = now()
                """,  # a body read again is young again: retention never races its acceptance
                (subject, digest, mime_type, len(body), body, kind),
            )

    async def get_content(self, subject: str, digest: str) -> bytes | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT body FROM content_store WHERE subject=%s AND content_digest=%s", (subject, digest)
            )
            row = await cur.fetchone()
        return None if row is None else bytes(row[0])

    async def audit(
        self,
        kind: str,
        *,
        subject: str | None = None,
        server: str | None = None,
        uri: str | None = None,
        workflow_id: str | None = None,
        session_generation: int | None = None,
        detail: dict[str, Any] | None = None,
    ) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                """
                INSERT INTO audit (kind, subject, server, uri, workflow_id, session_generation, detail)
                VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING audit_id
                """,
                (kind, subject, server, uri, workflow_id, session_generation, json.dumps(detail or {})),
            )
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def outbox_after(self, after_id: int = 0, limit: int = 100) -> list[OutboxRow]:
        """Rows by id, for tests and diagnostics only: id order is not commit order, so paging by id
        can skip a row for good. Consumers use ``activities.outbox`` (positions; docs/outbox.md)."""
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                "SELECT * FROM outbox WHERE outbox_id > %s ORDER BY outbox_id LIMIT %s", (after_id, limit)
            )
            return [OutboxRow(_jsonable(r)) for r in await cur.fetchall()]

    async def audit_rows(self, kind: str | None = None, limit: int = 100) -> list[AuditRow]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            if kind is None:
                await cur.execute("SELECT * FROM audit ORDER BY audit_id DESC LIMIT %s", (limit,))
            else:
                await cur.execute(
                    "SELECT * FROM audit WHERE kind=%s ORDER BY audit_id DESC LIMIT %s", (kind, limit)
                )
            return [AuditRow(_jsonable(r)) for r in await cur.fetchall()]

    async def receipts(self, key: SubscriptionKey) -> list[ResourceVersionV1]:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                f"SELECT * FROM resource_versions WHERE workflow_id = (SELECT workflow_id FROM subscriptions"
                f" WHERE {BY_KEY}) ORDER BY receipt_id", _key(key),
            )
            rows = await cur.fetchall()
        return [
            ResourceVersionV1(
                receipt_id=r["receipt_id"], uri=r["uri"], mime_type=r["mime_type"],
                content_digest=r["content_digest"], read_ordinal=r["read_ordinal"], subject=r["subject"],
                server=r["server"], server_name=r["server_name"], server_version=r["server_version"],
                edition=r["edition"], session_generation=r["session_generation"],
                subscription_generation=r["subscription_generation"], request_id=r["request_id"],
                trigger=TriggerReason(r["trigger_reason"]), status=AcceptVerdict(r["status"]),
                accepted_at=r["accepted_at"], ttl_ms=r["ttl_ms"],
                cache_scope=CacheScope(r["cache_scope"]) if r["cache_scope"] else None,
            )
            for r in rows
        ]

    async def read_count(self, key: SubscriptionKey) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT count(*) FROM read_requests WHERE workflow_id ="
                                     f" (SELECT workflow_id FROM subscriptions WHERE {BY_KEY})", _key(key))
            row = await cur.fetchone()
        return int(row[0]) if row else 0


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}
