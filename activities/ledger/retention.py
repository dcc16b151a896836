"""Retention: what the ledger may forget, and when.

Contract:
- ``prune(pool, keep=..., dry_run=...)`` deletes rows older than ``keep`` that nothing current
  depends on, one transaction for everything, and returns how many rows of each kind it removed
  (or would remove, with ``dry_run``: counted in the same transaction, then rolled back).
- Kept whatever their age: the fence rows (``subscriptions``), every receipt
  (``resource_versions``: the proof of what was accepted; outbox and answer bindings point at
  them), revocations, reconciled catalogs and the two scans each was built from (the release
  gate re-verifies catalogs against them), completeness consumptions, the known set, sessions,
  leases, answer bindings and dispositions.
- Forgotten once older than ``keep``:
  - content bodies that are not the current version of an ACTIVE subscription of their subject (superseded
    versions, stale and rejected reads, bodies of closed or tombstoned subscriptions) and that no outbox event
    still held for a consumer names. ``current_content`` only ever serves the current version of an ACTIVE
    subscription, so nothing servable is removed; a host that wants an older body for longer copies it out.
  - bodies parked in ``content_pending`` for an accept that never came (``pending_bodies``);
  - audit rows;
  - outbox rows, but only those every registered outbox consumer has acknowledged (and never
    one a revocation points at, nor one not yet given a position). A consumer whose oldest
    unacknowledged row (counted from its registration at the earliest) is older than
    ``consumer_max_lag`` no longer holds rows back, however often it re-acks: rows it had
    not acknowledged may go, and its next poll reports the lost positions as a GAP and it
    resyncs (docs/outbox.md). Without live consumers, rows go by age alone (positioned or not),
    and anyone registering later starts with a gap;
  - judged read requests (``completed_at`` set). A retried allocation or accept for one of
    them after ``keep`` is treated as new, which is safe: ordinals come from the fence row;
  - discovery scans no catalog was built from (restarted, failed, unmatched), with their items.
- Run it from cron or a Temporal schedule: ``mcpsync prune --keep-days 7``.
"""

from __future__ import annotations

from datetime import timedelta

from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict

__all__ = ["DEFAULT_CONSUMER_MAX_LAG", "PruneReport", "prune"]

DEFAULT_CONSUMER_MAX_LAG = timedelta(days=30)  # [retention] consumer_max_lag_days


class PruneReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    keep_seconds: float
    dry_run: bool
    content_bodies: int
    content_bytes: int
    audit_rows: int
    outbox_rows: int
    read_requests: int
    discovery_scans: int
    pending_bodies: int = 0  # content_pending rows whose accept never came
    outbox_pruned_through: int = 0  # the highest outbox position ever deleted
    consumers_ignored: list[str] = []  # consumers beyond consumer_max_lag whose rows were not kept


# Each statement deletes rows older than %(cutoff)s (now() - keep) and RETURNS one row per delete.
_CONTENT = """
DELETE FROM content_store c
WHERE c.stored_at < %(cutoff)s
  AND NOT EXISTS (SELECT 1 FROM subscriptions s
                  WHERE s.subject = c.subject AND s.last_accepted_digest = c.content_digest
                      AND s.state = 'ACTIVE')
  AND (NOT %(held)s OR NOT EXISTS (SELECT 1 FROM outbox o
                  WHERE o.subject = c.subject AND o.content_digest = c.content_digest
                    AND (o.position IS NULL OR o.position > %(floor)s)))
RETURNING c.size
"""
_PENDING = "DELETE FROM content_pending WHERE staged_at < %(cutoff)s RETURNING 1"
_AUDIT = "DELETE FROM audit WHERE created_at < %(cutoff)s RETURNING 1"
# With live consumers (held): only positioned rows every one of them acknowledged. Without: by
# age alone. Revocations keep the row they point at.
_OUTBOX = """
DELETE FROM outbox o
WHERE o.created_at < %(cutoff)s AND (NOT %(held)s OR (o.position IS NOT NULL AND o.position <= %(floor)s))
  AND NOT EXISTS (SELECT 1 FROM revocations r WHERE r.outbox_id = o.outbox_id)
RETURNING o.position
"""
# Consumers that still hold rows back, and those past the bound. A consumer's lag is the age of the
# oldest row it holds back (the first positioned row above its acknowledged position, any subject:
# a filtered consumer's poll moves it past the rows of other subjects), counted from when the
# consumer was registered at the earliest. Not its last ack: acking a position that does not move
# (ack(0)) would otherwise keep a stuck consumer alive forever. Holding nothing back: live.
_CONSUMERS = """
SELECT c.name, c.position,
       (held.oldest IS NULL OR GREATEST(held.oldest, c.created_at) >= now() - %(max_lag)s::interval) AS live
FROM outbox_consumers c
LEFT JOIN LATERAL (SELECT o.created_at AS oldest FROM outbox o WHERE o.position > c.position
                   ORDER BY o.position LIMIT 1) held ON true
"""
_READS = "DELETE FROM read_requests WHERE completed_at IS NOT NULL AND completed_at < %(cutoff)s RETURNING 1"
_SCANS = """
DELETE FROM discovery_scans d
WHERE d.recorded_at < %(cutoff)s
  AND NOT EXISTS (SELECT 1 FROM resource_catalogs r WHERE r.scan_a = d.scan_id OR r.scan_b = d.scan_id)
RETURNING 1
"""


async def prune(pool: AsyncConnectionPool, *, keep: timedelta, dry_run: bool = False,
                consumer_max_lag: timedelta = DEFAULT_CONSUMER_MAX_LAG) -> PruneReport:
    if keep < timedelta(0) or consumer_max_lag < timedelta(0):
        raise ValueError("keep and consumer_max_lag must not be negative")
    counts: dict[str, int] = {}
    # A dry run deletes the same rows in the same transaction, then rolls it back.
    async with pool.connection() as conn, conn.transaction(force_rollback=dry_run):
        # Stamping takes the outbox_state lock: no consumer polls (and judges its gap) while
        # rows go, and every old finished row has a position to be judged by.
        cur = await conn.execute("SELECT outbox_stamp()")
        row = await cur.fetchone()
        assert row is not None
        top = int(row[0])
        cur = await conn.execute(_CONSUMERS, {"max_lag": consumer_max_lag})
        consumers = await cur.fetchall()
        live = [int(c[1]) for c in consumers if c[2]]
        ignored = sorted(str(c[0]) for c in consumers if not c[2])
        cur = await conn.execute("SELECT now() - %s::interval", (keep,))
        row = await cur.fetchone()
        assert row is not None
        args = {"cutoff": row[0], "floor": min([top, *live]), "held": bool(live)}
        cur = await conn.execute(_CONTENT, args)
        sizes = [int(r[0]) for r in await cur.fetchall()]
        counts["content_bodies"], counts["content_bytes"] = len(sizes), sum(sizes)
        cur = await conn.execute(_OUTBOX, args)
        positions = [int(r[0] or 0) for r in await cur.fetchall()]
        counts["outbox_rows"] = len(positions)
        cur = await conn.execute(
            "UPDATE outbox_state SET pruned_through = GREATEST(pruned_through, %s) RETURNING pruned_through",
            # Without live consumers, rows not yet positioned may go too: anyone registering (or
            # coming back) later below ``top`` gets a gap and resyncs.
            (max([*positions, top if positions and not live else 0]),))
        row = await cur.fetchone()
        assert row is not None
        pruned_through = int(row[0])
        for name, sql in (("audit_rows", _AUDIT), ("read_requests", _READS), ("discovery_scans", _SCANS),
                          ("pending_bodies", _PENDING)):
            cur = await conn.execute(sql, args)
            counts[name] = len(await cur.fetchall())
    return PruneReport(keep_seconds=keep.total_seconds(), dry_run=dry_run,
                       outbox_pruned_through=pruned_through, consumers_ignored=ignored, **counts)
