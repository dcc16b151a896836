"""The outbox's delivery latency: a durable outbox consumer in the benchmark process
(``mcpsync.activities.ledger.outbox.OutboxConsumer``) records when each event reached it; accept
transaction (``outbox.created_at``) -> received, per event (docs/outbox.md)."""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import suppress

from benchmarks.common import fetch_rows, until
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.outbox import OutboxConsumer

__all__ = ["OutboxFollower"]


class OutboxFollower:
    """A durable outbox consumer in the benchmark process: when each event reached it."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.received: dict[int, float] = {}  # outbox_id -> wall time received
        self.task: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, ledger: Ledger) -> OutboxFollower:
        self = cls(ledger)
        consumer = OutboxConsumer(ledger.pool, f"bench-{uuid.uuid4().hex[:8]}", register=True)
        while (batch := await consumer.poll(limit=1000)).events:  # what came before the churn
            await consumer.ack(batch.position)
        await consumer.ack(batch.position)
        self.task = asyncio.create_task(self._follow(consumer), name="bench-outbox-consumer")
        return self

    async def _follow(self, consumer: OutboxConsumer) -> None:
        async for batch in consumer.follow(limit=1000):
            now = time.time()
            for e in batch.events:
                if e.outbox_id is not None:
                    self.received.setdefault(e.outbox_id, now)
            await consumer.ack(batch.position)

    async def latencies(self, since: float, wait: float = 10.0) -> tuple[list[float], int]:
        """Commit -> received for every outbox row created since ``since``; and how many never arrived."""
        rows = await fetch_rows(self.ledger, "SELECT outbox_id, extract(epoch FROM created_at)::float8 "
                                             "FROM outbox WHERE created_at >= to_timestamp(%s)", (since,))

        async def all_received() -> bool:
            return all(oid in self.received for oid, _ in rows)

        await until(all_received, wait)
        lat = [self.received[oid] - float(t) for oid, t in rows if oid in self.received]
        return lat, sum(1 for oid, _ in rows if oid not in self.received)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self.task

