"""The invalidation outbox for consumers: gap-free positions, named durable consumers, resync.

Contract (docs/outbox.md):
- Every outbox row gets a dense ``position`` once the transaction that inserted it has
  finished (``outbox_stamp()`` in migration 006, run by whoever polls). A stamped position is
  final and nothing can ever appear below it, whatever wrote the row (mcpsync or plain SQL).
- A consumer is a name with an acknowledged position. ``poll`` hands out the events after
  it, oldest first, with the batch's position; ``ack`` moves the position (never backwards).
  Nothing moves without an ack: delivery is at least once. Two pollers under one name both
  get the same batch; the higher ack wins.
- A consumer made with ``register=True`` registers its unknown name (with the given subject
  filter) at position 0 on its first ``poll`` or ``resync``; ``ack`` never does, and without it
  an unknown name is ``ConsumerNotFound``.
- When retention deleted events the consumer had not acknowledged (only possible once it
  lagged more than ``[retention] consumer_max_lag_days``), ``poll`` answers a ``Gap`` instead
  of events, until ``resync`` hands over the current version of every ACTIVE subscription of
  its subjects and a ``closed`` item for every one no longer tracked (a relist) and the consumer
  acks the resync position.
- Events are ``outboxEvent.v1`` (``OutboxEventV1``), built from the row alone.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict, Field

from mcpsync.workflows.records.ledger import OutboxEventType  # exported here too

__all__ = [
    "ConsumerError",
    "ConsumerInfo",
    "ConsumerNotFound",
    "WITHDRAWING",
    "Gap",
    "Invalidation",
    "NOTIFY_CHANNEL",
    "OutboxBatch",
    "OutboxConsumer",
    "OutboxEventType",
    "OutboxEventV1",
    "ResyncBatch",
    "consumer_infos",
    "follow_unregistered",
    "drop_consumer",
    "event_from_row",
    "events_after",
    "latest_events",
    "listen",
    "stamp",
    "wait_for_events",
]

NOTIFY_CHANNEL = "mcpsync_outbox"
_RETRY_FIRST, _RETRY_MAX = 0.01, 0.1  # seconds between polls while committed rows wait for a position
_NAME = re.compile(r"^[A-Za-z0-9_.:@/-]{1,128}$")
# Registered consumers at most: each holds outbox rows back and is a label of the lag gauges. A new
# name beyond it is refused (drop one first: ``drop_consumer`` / ``mcpsync outbox drop``).
MAX_CONSUMERS = 256
_REGISTRATION_LOCK = 0x6D63726B  # serializes registrations, so the cap holds under concurrency


class ConsumerNotFound(LookupError):
    """No consumer of that name is registered."""


class ConsumerError(ValueError):
    """A request the consumer's state refuses (ack beyond delivery, another subject filter)."""


WITHDRAWING = frozenset({OutboxEventType.TOMBSTONED, OutboxEventType.REVOKED, OutboxEventType.CLOSED})
"""Events that withdraw (``invalidates``): deleted, access lost, no longer tracked."""


class Invalidation(BaseModel):
    """What a ``tombstoned``, ``revoked`` or ``closed`` event withdraws: these receipts and these digests."""

    model_config = ConfigDict(frozen=True)

    receipt_ids: list[int]
    digests: list[str]


class OutboxEventV1(BaseModel):
    """``outboxEvent.v1``: one event as consumers see it."""

    model_config = ConfigDict(frozen=True)

    record: Literal["outboxEvent.v1"] = "outboxEvent.v1"
    event_type: OutboxEventType
    position: int = Field(description="delivery order; a resync item carries the resync position")
    outbox_id: int | None = Field(description="row id (None for resync items); not an order")
    subject: str
    server: str
    uri: str
    workflow_id: str
    receipt_id: int | None = Field(description="resourceVersion.v1 receipt; content get --receipt")
    read_ordinal: int | None = Field(description="per-URI order: keep the highest")
    content_digest: str | None
    previous_digest: str | None = Field(description="the digest this event replaces (None: first or unknown)")
    mime_type: str | None
    size: int | None
    edition: str | None = Field(description="MCP protocol edition of the session that read it")
    server_name: str | None = Field(description="server implementation name (serverInfo)")
    server_version: str | None
    accepted_at: datetime | None
    trigger: str | None = Field(description="why the read happened: initial, updated, follow_up, poll, "
                                            "resubscribe, catalog")
    ttl_ms: int | None = Field(default=None,
                               description="the read result's ttlMs (MCP 2026-07-28; 0 on older "
                                                          "editions): a freshness hint, not a poll interval")
    cache_scope: Literal["public", "private"] | None = Field(
        default=None,
        description="the read result's cacheScope; bodies are released only to the event's subject "
                                  "either way (docs/caching.md)")
    invalidates: Invalidation | None = Field(description="tombstoned / revoked / closed:"
                                                         " exactly what is withdrawn (closed: no longer"
                                                         " tracked, so no longer known fresh)")
    reason: str | None
    created_at: datetime


class Gap(BaseModel):
    """Positions ``first``..``last`` were deleted by retention before this consumer acknowledged them."""

    model_config = ConfigDict(frozen=True)

    first: int
    last: int


class OutboxBatch(BaseModel):
    """One poll: ack ``position`` once every event is applied. ``gap`` set: resync first."""

    model_config = ConfigDict(frozen=True)

    consumer: str
    acked: int
    position: int
    events: list[OutboxEventV1]
    gap: Gap | None = None


class ResyncBatch(BaseModel):
    """A relist: the current version of every ACTIVE subscription of the consumer's subjects
    (``version_current``), then a ``closed`` item for every subscription that stopped being
    tracked (closing, CLOSED, UNSUBSCRIBE_UNKNOWN) naming its last receipt and digest. Anything not
    listed as current is not current any more. Ack ``position`` once applied."""

    model_config = ConfigDict(frozen=True)

    consumer: str
    position: int
    events: list[OutboxEventV1]


class ConsumerInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    subjects: list[str] | None
    position: int
    delivered_up_to: int
    lag_events: int
    lag_seconds: float
    created_at: datetime
    last_poll_at: datetime | None
    last_ack_at: datetime | None
    last_resync_at: datetime | None


def event_from_row(row: dict[str, Any]) -> OutboxEventV1:
    detail = row.get("detail") or {}
    invalidates = None
    if row["event_type"] in WITHDRAWING:
        invalidates = Invalidation(receipt_ids=list(detail.get("receipt_ids", [])),
                                   digests=list(detail.get("digests", [])))
    return OutboxEventV1(
        event_type=OutboxEventType(row["event_type"]),
        position=row["position"],
        outbox_id=row["outbox_id"],
        subject=row["subject"],
        server=row["server"],
        uri=row["uri"],
        workflow_id=row["workflow_id"],
        receipt_id=row["receipt_id"],
        read_ordinal=row["read_ordinal"],
        content_digest=row["content_digest"],
        previous_digest=detail.get("previous_digest"),
        mime_type=detail.get("mime_type"),
        size=detail.get("size"),
        edition=detail.get("edition"),
        server_name=detail.get("server_name"),
        server_version=detail.get("server_version"),
        accepted_at=detail.get("accepted_at"),
        trigger=detail.get("trigger"),
        ttl_ms=detail.get("ttl_ms"),
        cache_scope=detail.get("cache_scope"),
        invalidates=invalidates,
        reason=detail.get("reason"),
        created_at=row["created_at"],
    )


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ConsumerError(f"invalid consumer name {name!r}: 1-128 characters of letters, digits and _.:@/-")


async def _stamp(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT outbox_stamp()")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def stamp(pool: AsyncConnectionPool) -> int:
    """Stamp every finished row; the last stamped position."""
    async with pool.connection() as conn, conn.transaction():
        return await _stamp(conn)


_SELECT = "SELECT * FROM outbox WHERE position > %s AND position <= %s"


async def events_after(pool: AsyncConnectionPool, position: int, limit: int) -> list[OutboxEventV1]:
    """Events after ``position``, oldest first (``outbox tail --after``; no consumer state)."""
    async with pool.connection() as conn, conn.transaction():
        top = await _stamp(conn)
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(_SELECT + " ORDER BY position LIMIT %s", (position, top, limit))
        return [event_from_row(r) for r in await cur.fetchall()]


async def latest_events(pool: AsyncConnectionPool, limit: int) -> list[OutboxEventV1]:
    """The newest ``limit`` stamped events, oldest first (``outbox tail``)."""
    async with pool.connection() as conn, conn.transaction():
        top = await _stamp(conn)
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(_SELECT + " ORDER BY position DESC LIMIT %s", (0, top, limit))
        return [event_from_row(r) for r in reversed(await cur.fetchall())]


async def wait_for_events(listener: psycopg.AsyncConnection[Any], timeout: float) -> None:
    """Return at the next outbox NOTIFY on ``listener`` (which ran LISTEN) or after ``timeout``."""
    async for _ in listener.notifies(timeout=timeout, stop_after=1):
        pass


async def listen(pool: AsyncConnectionPool) -> psycopg.AsyncConnection[Any]:
    """A dedicated connection listening on the outbox channel (close it when done)."""
    conninfo = pool.conninfo
    if not isinstance(conninfo, str):  # mcpsync.activities.ledger.db.open_pool always passes the URL
        raise TypeError("the pool's conninfo must be a string to open a listening connection")
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
    return conn


async def _unstamped_visible(pool: AsyncConnectionPool) -> bool:
    async with pool.connection() as conn:
        cur = await conn.execute("SELECT EXISTS (SELECT 1 FROM outbox WHERE position IS NULL)")
        row = await cur.fetchone()
    return bool(row and row[0])


# The consumer's unacknowledged events: those stamped after its position and those not stamped
# yet. The cost must be the consumer's lag, not the outbox's size (the metrics refresher runs this
# every 15 s in every process). A bare ``min(created_at) WHERE position > ...`` was planned as a walk
# of the created_at index from the oldest row, filtering out every acknowledged event (the whole
# outbox, 0.5 s at 10,000 rows); ``OFFSET 0`` keeps the rows chosen by the position ranges first.
CONSUMER_LAG_SQL = """
SELECT c.*, coalesce(lag.events, 0) AS lag_events,
  COALESCE(EXTRACT(EPOCH FROM now() - lag.oldest), 0)::float8 AS lag_seconds
FROM outbox_consumers c
CROSS JOIN LATERAL (
  SELECT count(*) AS events, min(u.created_at) AS oldest FROM (
    SELECT o.created_at FROM outbox o WHERE o.position > c.position
      AND (c.subjects IS NULL OR o.subject = ANY (c.subjects))
    UNION ALL
    SELECT o.created_at FROM outbox o WHERE o.position IS NULL
      AND (c.subjects IS NULL OR o.subject = ANY (c.subjects))
    OFFSET 0) u
) lag
"""


def _info(row: dict[str, Any]) -> ConsumerInfo:
    return ConsumerInfo(
        name=row["name"], subjects=row["subjects"], position=row["position"],
        delivered_up_to=row["delivered_up_to"], lag_events=int(row["lag_events"]),
        lag_seconds=max(0.0, float(row["lag_seconds"])), created_at=row["created_at"],
        last_poll_at=row["last_poll_at"], last_ack_at=row["last_ack_at"],
        last_resync_at=row["last_resync_at"],
    )


async def consumer_infos(pool: AsyncConnectionPool, name: str | None = None) -> list[ConsumerInfo]:
    """Every registered consumer (or one) with its lag: unacknowledged events and the age of the oldest."""
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        if name is None:
            await cur.execute(CONSUMER_LAG_SQL + " ORDER BY c.name")
        else:
            await cur.execute(CONSUMER_LAG_SQL + " WHERE c.name = %s", (name,))
        return [_info(r) for r in await cur.fetchall()]


async def drop_consumer(pool: AsyncConnectionPool, name: str) -> None:
    """Forget a consumer: retention stops keeping rows for it."""
    async with pool.connection() as conn:
        cur = await conn.execute("DELETE FROM outbox_consumers WHERE name = %s", (name,))
        if cur.rowcount == 0:
            raise ConsumerNotFound(f"no outbox consumer {name!r}")


_CURRENT = """
SELECT s.workflow_id, s.subject, s.server, s.uri, rv.receipt_id, rv.read_ordinal, rv.content_digest,
       rv.mime_type, rv.size, rv.edition, rv.server_name, rv.server_version, rv.accepted_at,
       rv.trigger_reason, rv.ttl_ms, rv.cache_scope
FROM subscriptions s JOIN resource_versions rv ON rv.receipt_id = s.last_receipt_id
WHERE s.state = 'ACTIVE' AND s.last_accepted_digest IS NOT NULL AND rv.content_digest IS NOT NULL
  AND (%(subjects)s::text[] IS NULL OR s.subject = ANY (%(subjects)s::text[]))
ORDER BY s.subject, s.server, s.uri
"""

_CLOSED = """
SELECT s.workflow_id, s.subject, s.server, s.uri, s.last_receipt_id, s.last_accepted_ordinal,
       s.last_accepted_digest, s.state
FROM subscriptions s
WHERE s.state = ANY (%(states)s::text[]) AND s.last_receipt_id IS NOT NULL
  AND (%(subjects)s::text[] IS NULL OR s.subject = ANY (%(subjects)s::text[]))
ORDER BY s.subject, s.server, s.uri
"""
_UNTRACKED = ["UNSUBSCRIBING", "CLOSED", "UNSUBSCRIBE_UNKNOWN"]


class OutboxConsumer:
    """A named durable consumer over the ledger pool. ``subjects`` None: every subject.

    Registration is explicit: ``register=True`` lets the first poll or resync register a new
    name (at most ``max_consumers`` names in all, else ``ConsumerError``); without it an unknown
    name is ``ConsumerNotFound``, so a typo or a stray client cannot grow the consumer table (each
    name holds rows back and is a metric label). The filter is fixed at registration; asking with
    another filter later is a ``ConsumerError``."""

    def __init__(self, pool: AsyncConnectionPool, name: str, subjects: Sequence[str] | None = None, *,
                 register: bool = False, max_consumers: int = MAX_CONSUMERS) -> None:
        _check_name(name)
        self.pool = pool
        self.name = name
        self.subjects = sorted(set(subjects)) if subjects else None
        self.register = register
        self.max_consumers = max_consumers

    async def _row(self, cur: Any, *, create: bool) -> dict[str, Any]:
        await cur.execute("SELECT * FROM outbox_consumers WHERE name = %s FOR UPDATE", (self.name,))
        row = await cur.fetchone()
        if row is None and create and self.register:
            await cur.execute("SELECT pg_advisory_xact_lock(%s)", (_REGISTRATION_LOCK,))
            await cur.execute("SELECT count(*) AS n FROM outbox_consumers")
            counted = await cur.fetchone()
            if counted is not None and int(counted["n"]) >= self.max_consumers:
                raise ConsumerError(f"cannot register consumer {self.name!r}: {counted['n']}"
                                    f" consumers are registered, the most allowed is {self.max_consumers}"
                                    " (drop one: mcpsync outbox drop)")
            await cur.execute(
                "INSERT INTO outbox_consumers (name, subjects) VALUES (%s, %s) ON CONFLICT (name) DO NOTHING",
                (self.name, self.subjects))
            await cur.execute("SELECT * FROM outbox_consumers WHERE name = %s FOR UPDATE", (self.name,))
            row = await cur.fetchone()
        if row is None:
            hint = ": register it first (mcpsync outbox poll --register)" if create else ""
            raise ConsumerNotFound(f"no outbox consumer {self.name!r}{hint}")
        registered = sorted(row["subjects"]) if row["subjects"] is not None else None
        if self.subjects is not None and registered != self.subjects:
            raise ConsumerError(f"consumer {self.name!r} is registered for subjects {registered or 'all'}, "
                                f"not {self.subjects}")
        self.subjects = registered
        return dict(row)

    async def poll(self, limit: int = 100) -> OutboxBatch:
        """The next events after the acknowledged position (registers the name if new and ``register``)."""
        if limit < 1:
            raise ConsumerError("limit must be at least 1")
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            consumer = await self._row(cur, create=True)
            acked = int(consumer["position"])
            top = await _stamp(conn)  # holds the outbox_state lock: prune cannot run meanwhile
            await cur.execute("SELECT pruned_through FROM outbox_state")
            state = await cur.fetchone()
            assert state is not None
            if acked < state["pruned_through"]:
                await cur.execute("UPDATE outbox_consumers SET last_poll_at = now() WHERE name = %s",
                                  (self.name,))
                return OutboxBatch(consumer=self.name, acked=acked, position=acked, events=[],
                                   gap=Gap(first=acked + 1, last=int(state["pruned_through"])))
            await cur.execute(
                _SELECT + " AND (%s::text[] IS NULL OR subject = ANY (%s::text[]))"
                " ORDER BY position LIMIT %s",
                (acked, top, self.subjects, self.subjects, limit))
            events = [event_from_row(r) for r in await cur.fetchall()]
            # A short batch saw every row up to ``top``: the filter skipped the rest.
            position = events[-1].position if len(events) == limit else top
            await cur.execute(
                "UPDATE outbox_consumers"
                " SET delivered_up_to = GREATEST(delivered_up_to, %s), last_poll_at = now() WHERE name = %s",
                (position, self.name))
        return OutboxBatch(consumer=self.name, acked=acked, position=position, events=events)

    async def ack(self, position: int) -> int:
        """Acknowledge everything up to ``position``; returns the
        acknowledged position (max of old and new)."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            consumer = await self._row(cur, create=False)
            if position < 0:
                raise ConsumerError("position must not be negative")
            if position > consumer["delivered_up_to"]:
                raise ConsumerError(f"position {position} is beyond what consumer"
                                    f" {self.name!r} was delivered ({consumer['delivered_up_to']})")
            await cur.execute(
                "UPDATE outbox_consumers SET position = GREATEST(position, %s), last_ack_at = now()"
                " WHERE name = %s RETURNING position", (position, self.name))
            row = await cur.fetchone()
            assert row is not None
            return int(row["position"])

    async def resync(self) -> ResyncBatch:
        """Relist: the current version of every ACTIVE subscription of the consumer's subjects,
        at a position the consumer then acks; poll continues from there. An unknown name is
        ``ConsumerNotFound`` unless the consumer was made with ``register=True`` (a typo must not
        become a consumer that holds retention back)."""
        async with self.pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await self._row(cur, create=True)
            # Stamp first: every event at or below ``top`` committed before the relist statement
            # starts, so its effect is in the relist; later events come after ``top``.
            top = await _stamp(conn)
            await cur.execute(_CURRENT, {"subjects": self.subjects})
            rows = await cur.fetchall()
            await cur.execute(_CLOSED, {"subjects": self.subjects, "states": _UNTRACKED})
            closed = await cur.fetchall()
            await cur.execute(
                "UPDATE outbox_consumers SET delivered_up_to = GREATEST(delivered_up_to, %s),"
                " last_resync_at = now() WHERE name = %s", (top, self.name))
        now = datetime.now().astimezone()
        events = [OutboxEventV1(
            event_type=OutboxEventType.VERSION_CURRENT, position=top, outbox_id=None, subject=r["subject"],
            server=r["server"], uri=r["uri"], workflow_id=r["workflow_id"], receipt_id=r["receipt_id"],
            read_ordinal=r["read_ordinal"], content_digest=r["content_digest"], previous_digest=None,
            mime_type=r["mime_type"], size=r["size"], edition=r["edition"] or None,
            server_name=r["server_name"] or None, server_version=r["server_version"] or None,
            accepted_at=r["accepted_at"], trigger=r["trigger_reason"], ttl_ms=r["ttl_ms"],
            cache_scope=r["cache_scope"], invalidates=None, reason=None,
            created_at=now) for r in rows]
        events += [OutboxEventV1(
            event_type=OutboxEventType.CLOSED, position=top, outbox_id=None, subject=r["subject"],
            server=r["server"], uri=r["uri"], workflow_id=r["workflow_id"], receipt_id=r["last_receipt_id"],
            read_ordinal=r["last_accepted_ordinal"], content_digest=None,
            previous_digest=r["last_accepted_digest"], mime_type=None, size=None, edition=None,
            server_name=None, server_version=None, accepted_at=None, trigger=None,
            invalidates=Invalidation(receipt_ids=[r["last_receipt_id"]],
                                                   digests=[r["last_accepted_digest"]]
                                         if r["last_accepted_digest"]
                                                   else []),
            reason=f"{r['state']}: no longer tracked", created_at=now) for r in closed]
        return ResyncBatch(consumer=self.name, position=top, events=events)

    async def follow(self, limit: int = 100, *, idle_timeout: float = 30.0) -> AsyncIterator[OutboxBatch]:
        """Poll forever, waking on the outbox NOTIFY. Yields batches with events, a gap, or a
        position to ack (a filtered consumer skipping other subjects); the caller acks."""
        listener = await listen(self.pool)
        try:
            retry = _RETRY_FIRST
            while True:
                batch = await self.poll(limit)
                if batch.events or batch.gap or batch.position > batch.acked:
                    retry = _RETRY_FIRST
                    yield batch
                    continue
                retry = await _wait_for_more(self.pool, listener, retry, idle_timeout)
        finally:
            await listener.close()


async def _wait_for_more(pool: AsyncConnectionPool, listener: psycopg.AsyncConnection[Any], retry: float,
                         idle_timeout: float) -> float:
    """Wait for the next events after an empty poll; the next ``retry``. Committed rows not yet
    stamped wait for an older transaction to finish (usually another accept, a read allocation or
    a lease renewal: milliseconds), which need not notify: look again soon. Otherwise sleep until
    the next insert commits."""
    if await _unstamped_visible(pool):
        await wait_for_events(listener, retry)
        return min(retry * 2, _RETRY_MAX)
    await wait_for_events(listener, idle_timeout)
    return _RETRY_FIRST


async def follow_unregistered(
        pool: AsyncConnectionPool, limit: int = 100, *, idle_timeout: float = 30.0,
) -> AsyncIterator[tuple[list[OutboxEventV1], Gap | None]]:
    """Follow the outbox from its current end without a durable consumer: nothing is registered,
    nothing is held back from retention, and the position lives in this process only. Yields each
    batch of events, oldest first, with a ``Gap`` when retention deleted positions before this
    follower read them (then the batch's events come after the gap)."""
    position = await stamp(pool)
    listener = await listen(pool)
    try:
        retry = _RETRY_FIRST
        while True:
            events = await events_after(pool, position, limit)
            if events:
                first = events[0].position
                gap = Gap(first=position + 1, last=first - 1) if first > position + 1 else None
                position = events[-1].position
                retry = _RETRY_FIRST
                yield events, gap
                continue
            retry = await _wait_for_more(pool, listener, retry, idle_timeout)
    finally:
        await listener.close()

