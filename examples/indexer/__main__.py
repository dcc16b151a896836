"""Reference outbox consumer: a local index of the current body per (subject, server, URI).

Uses only the public consumer API (docs/outbox.md): ``OutboxConsumer`` (follow / ack /
resync) and ``released_content``. At least once: the index is written in one SQLite
transaction per batch, then the batch is acknowledged; a crash in between replays the batch,
which is harmless because an entry is replaced only by a higher read ordinal.

    python -m examples.indexer --database-url URL --consumer NAME --index index.sqlite [--subject S ...]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3

from psycopg_pool import AsyncConnectionPool

from mcpsync.activities.content import ContentNotFound, ContentRefused, released_content
from mcpsync.activities.db import open_pool
from mcpsync.activities.outbox import OutboxConsumer, OutboxEventType, OutboxEventV1

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (subject TEXT, server TEXT, uri TEXT, read_ordinal INTEGER, receipt_id INTEGER,
    digest TEXT, mime_type TEXT, body BLOB, PRIMARY KEY (subject, server, uri));
CREATE TABLE IF NOT EXISTS deliveries (position INTEGER, outbox_id INTEGER);  -- what arrived, for audits
"""


async def _body(pool: AsyncConnectionPool, e: OutboxEventV1) -> tuple[str | None, bytes] | None:
    """The released body, or None when it may no longer be served (a later event says why)."""
    if e.receipt_id is None:
        return None
    try:
        content = await released_content(pool, receipt_id=e.receipt_id, subject=e.subject)
    except (ContentRefused, ContentNotFound):
        return None
    return content.mime_type, content.body


async def apply(pool: AsyncConnectionPool, db: sqlite3.Connection, events: list[OutboxEventV1]) -> None:
    for e in events:
        key = (e.subject, e.server, e.uri)
        db.execute("INSERT INTO deliveries VALUES (?, ?)", (e.position, e.outbox_id))
        if e.event_type in (OutboxEventType.TOMBSTONED, OutboxEventType.REVOKED):
            db.execute("DELETE FROM entries WHERE subject=? AND server=? AND uri=?", key)
            continue
        held = db.execute("SELECT read_ordinal FROM entries WHERE subject=? AND server=? AND uri=?", key).fetchone()
        if held is not None and held[0] >= (e.read_ordinal or 0):
            continue  # per-URI order is the read ordinal, not the position
        body = await _body(pool, e)
        if body is not None:
            db.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (*key, e.read_ordinal, e.receipt_id, e.content_digest, body[0], body[1]))


async def run(args: argparse.Namespace) -> None:
    pool = await open_pool(args.database_url, max_size=2)
    db = sqlite3.connect(args.index)
    db.executescript(SCHEMA)
    consumer = OutboxConsumer(pool, args.consumer, args.subject, register=True)  # the indexer owns its name
    try:
        async for batch in consumer.follow(limit=args.batch):
            if batch.gap is not None:
                relist = await consumer.resync()  # informer-style relist: replace the whole view
                db.execute("DELETE FROM entries")
                await apply(pool, db, relist.events)
                db.commit()
                await consumer.ack(relist.position)
                continue
            await apply(pool, db, batch.events)
            db.commit()
            await consumer.ack(batch.position)
    finally:
        db.close()
        await pool.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m examples.indexer")
    p.add_argument("--database-url", required=True)
    p.add_argument("--consumer", required=True)
    p.add_argument("--index", required=True, help="SQLite file")
    p.add_argument("--subject", action="append", help="only these subjects (repeatable)")
    p.add_argument("--batch", type=int, default=50)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
