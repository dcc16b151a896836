"""Reference outbox consumer: a local index of the current body per (subject, server, URI).

Uses only the public consumer API (docs/outbox.md): ``OutboxConsumer`` (follow / ack /
resync) and ``released_content``. At least once: the index is written in one SQLite
transaction per batch, then the batch is acknowledged; a crash in between replays the batch,
which is harmless because an entry is replaced only by a higher read ordinal.

Events: ``version_accepted`` / ``version_current`` replace an entry (higher read ordinal only);
``tombstoned``, ``revoked`` and ``closed`` (the subscription is no longer tracked, so its body is
no longer known fresh) drop it. A later ``subscribe`` of a closed key brings it back with higher
read ordinals. ``overdue`` (a verification came later than the bound; nothing changed) is skipped:
this index keeps versions, not freshness.

    python -m examples.indexer --consumer NAME --index index.sqlite [--subject S ...] [--database-url URL]

The database URL: ``--database-url``, else ``$MCPSYNC_DATABASE_URL``, else the stack's
configuration as ``mcpsync`` finds it (``--config``, ``$MCPSYNC_CONFIG``, or the runtime file of
the running ``mcpsync up``). One progress line per batch on stdout; a failure is one
``indexer: error:`` line on stderr (exit 6 unreachable database, 2 bad configuration); Ctrl-C or
SIGTERM stops it cleanly at any moment (exit 0, as every ``mcpsync`` follower), printing the last
acknowledged position (or that this run acknowledged nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import sys
from contextlib import suppress

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from mcpsync.activities.ledger.db import DatabaseUnavailable, open_pool
from mcpsync.activities.ledger.outbox import (
    WITHDRAWING,
    ConsumerError,
    OutboxConsumer,
    OutboxEventType,
    OutboxEventV1,
)
from mcpsync.activities.ledger.released import ContentNotFound, ContentRefused, released_content

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (subject TEXT, server TEXT, uri TEXT, read_ordinal INTEGER,
    receipt_id INTEGER,
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


async def apply(pool: AsyncConnectionPool, db: sqlite3.Connection,
                events: list[OutboxEventV1]) -> tuple[int, int]:
    """Apply ``events`` to the index (not committed); (entries written, entries dropped)."""
    written = dropped = 0
    for e in events:
        key = (e.subject, e.server, e.uri)
        db.execute("INSERT INTO deliveries VALUES (?, ?)", (e.position, e.outbox_id))
        if e.event_type == OutboxEventType.OVERDUE:
            continue  # a late verification of the current version: no version, nothing withdrawn
        held = db.execute("SELECT read_ordinal FROM entries WHERE subject=? AND server=? AND uri=?",
                          key).fetchone()
        # tombstoned, revoked, closed: not current (or not known fresh) any more
        if e.event_type in WITHDRAWING:
            # It withdraws what was current up to its read ordinal; a higher one is a later incarnation's.
            if held is not None and (e.read_ordinal is None or held[0] <= e.read_ordinal):
                db.execute("DELETE FROM entries WHERE subject=? AND server=? AND uri=?", key)
                dropped += 1
            continue
        if held is not None and held[0] >= (e.read_ordinal or 0):
            continue  # per-URI order is the read ordinal, not the position
        body = await _body(pool, e)
        if body is not None:
            db.execute("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (*key, e.read_ordinal, e.receipt_id, e.content_digest, body[0], body[1]))
            written += 1
    return written, dropped


def _progress(name: str, db: sqlite3.Connection, what: str, position: int, events: int,
              counts: tuple[int, int]) -> None:
    (entries,) = db.execute("SELECT count(*) FROM entries").fetchone()
    print(f"indexer {name}: {what} position {position}: {events} events, {counts[0]} written,"
          f" {counts[1]} dropped; {entries} entries", flush=True)


async def run(args: argparse.Namespace, url: str) -> None:
    pool = await open_pool(url, max_size=2)
    db = sqlite3.connect(args.index)
    db.executescript(SCHEMA)
    consumer = OutboxConsumer(pool, args.consumer, args.subject, register=True)  # the indexer owns its name
    print(f"indexer {args.consumer}: following the outbox into {args.index}", flush=True)
    try:
        async for batch in consumer.follow(limit=args.batch):
            if args.acked is None:
                args.acked = batch.acked
            if batch.gap is not None:
                relist = await consumer.resync()  # informer-style relist: replace the whole view
                db.execute("DELETE FROM entries")
                counts = await apply(pool, db, relist.events)
                db.commit()
                await consumer.ack(relist.position)
                args.acked = relist.position
                _progress(args.consumer, db, f"gap {batch.gap.first}..{batch.gap.last}, resynced at",
                          relist.position, len(relist.events), counts)
                continue
            counts = await apply(pool, db, batch.events)
            db.commit()
            await consumer.ack(batch.position)
            args.acked = batch.position
            if batch.events:
                _progress(args.consumer, db, "acked", batch.position, len(batch.events), counts)
    finally:
        db.close()
        await pool.close()


def database_url(args: argparse.Namespace) -> str:
    """``--database-url``, ``$MCPSYNC_DATABASE_URL``, else the stack's
    configuration (as ``mcpsync`` finds it)."""
    if args.database_url:
        return str(args.database_url)
    if os.environ.get("MCPSYNC_DATABASE_URL"):
        return os.environ["MCPSYNC_DATABASE_URL"]
    from mcpsync.worker.cli.common import database_url as configured_url
    from mcpsync.worker.cli.common import resolve_config

    config, _ = resolve_config(argparse.Namespace(config=args.config))
    return configured_url(config)


def main() -> None:
    from mcpsync.worker.cli.common import CliError, ExitCode, count
    from mcpsync.worker.main.config import ConfigError

    p = argparse.ArgumentParser(prog="python -m examples.indexer", description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url",
                   help="the ledger (default: $MCPSYNC_DATABASE_URL, else the stack's config)")
    p.add_argument("--config",
                   help="mcpsync config file for the database URL (default: $MCPSYNC_CONFIG, else the "
                                    "running 'mcpsync up' stack's)")
    p.add_argument("--consumer", required=True, help="the durable consumer name")
    p.add_argument("--index", required=True, help="SQLite file")
    p.add_argument("--subject", action="append", help="only these subjects (repeatable)")
    p.add_argument("--batch", type=count, default=50, help="events per batch at most")
    args = p.parse_args()
    args.acked = None  # the last acknowledged position, once the first batch said it
    code = 0
    try:
        task_run = run(args, database_url(args))
        with asyncio.Runner() as runner:
            task = runner.get_loop().create_task(task_run)
            runner.get_loop().add_signal_handler(signal.SIGINT, task.cancel)
            runner.get_loop().add_signal_handler(signal.SIGTERM, task.cancel)
            with suppress(asyncio.CancelledError):
                runner.run(_wait(task))
            if task.cancelled():
                at = ("nothing acknowledged in this run" if args.acked is None
                      else f"last acknowledged position {args.acked}")
                print(f"indexer {args.consumer}: stopped; {at}", flush=True)
    except DatabaseUnavailable as exc:
        print(f"indexer: error: {' '.join(str(exc).split())}", file=sys.stderr)
        code = ExitCode.UNAVAILABLE
    except (psycopg.OperationalError, PoolTimeout) as exc:  # the database went away while following
        print(f"indexer: error: PostgreSQL connection lost: {' '.join(str(exc).split())[:300]}",
              file=sys.stderr)
        code = ExitCode.UNAVAILABLE
    except CliError as exc:
        print(f"indexer: error: {' '.join(str(exc).split())}", file=sys.stderr)
        code = exc.code
    except (ConfigError, ConsumerError) as exc:
        print(f"indexer: error: {' '.join(str(exc).split())}", file=sys.stderr)
        code = ExitCode.USAGE
    sys.exit(code)


async def _wait(task: asyncio.Task[None]) -> None:
    await task
