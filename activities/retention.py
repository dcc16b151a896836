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
  - content bodies that are not the current version of an ACTIVE subscription of their subject
    (superseded versions, stale and rejected reads, bodies of closed or tombstoned
    subscriptions). ``current_content`` only ever serves the current version of an ACTIVE
    subscription, so nothing servable is removed; a host that wants an older body for longer
    copies it out.
  - audit rows;
  - outbox rows (a consumer more than ``keep`` behind loses events: size ``keep`` above the
    longest consumer outage);
  - judged read requests (``completed_at`` set). A retried allocation or accept for one of
    them after ``keep`` is treated as new, which is safe: ordinals come from the fence row;
  - discovery scans no catalog was built from (restarted, failed, unmatched), with their items.
- Run it from cron or a Temporal schedule: ``mcpsync prune --keep-days 7``.
"""

from __future__ import annotations

from datetime import timedelta

from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict

__all__ = ["PruneReport", "prune"]


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


# Each statement deletes rows older than %(cutoff)s (now() - keep) and RETURNS one row per delete.
_CONTENT = """
DELETE FROM content_store c
WHERE c.stored_at < %(cutoff)s
  AND NOT EXISTS (SELECT 1 FROM subscriptions s
                  WHERE s.subject = c.subject AND s.last_accepted_digest = c.content_digest AND s.state = 'ACTIVE')
RETURNING c.size
"""
_AUDIT = "DELETE FROM audit WHERE created_at < %(cutoff)s RETURNING 1"
_OUTBOX = "DELETE FROM outbox WHERE created_at < %(cutoff)s RETURNING 1"
_READS = "DELETE FROM read_requests WHERE completed_at IS NOT NULL AND completed_at < %(cutoff)s RETURNING 1"
_SCANS = """
DELETE FROM discovery_scans d
WHERE d.recorded_at < %(cutoff)s
  AND NOT EXISTS (SELECT 1 FROM resource_catalogs r WHERE r.scan_a = d.scan_id OR r.scan_b = d.scan_id)
RETURNING 1
"""


async def prune(pool: AsyncConnectionPool, *, keep: timedelta, dry_run: bool = False) -> PruneReport:
    if keep < timedelta(0):
        raise ValueError("keep must not be negative")
    counts: dict[str, int] = {}
    # A dry run deletes the same rows in the same transaction, then rolls it back.
    async with pool.connection() as conn, conn.transaction(force_rollback=dry_run):
        cur = await conn.execute("SELECT now() - %s::interval", (keep,))
        row = await cur.fetchone()
        assert row is not None
        args = {"cutoff": row[0]}
        cur = await conn.execute(_CONTENT, args)
        sizes = [int(r[0]) for r in await cur.fetchall()]
        counts["content_bodies"], counts["content_bytes"] = len(sizes), sum(sizes)
        for name, sql in (("audit_rows", _AUDIT), ("outbox_rows", _OUTBOX), ("read_requests", _READS),
                          ("discovery_scans", _SCANS)):
            cur = await conn.execute(sql, args)
            counts[name] = len(await cur.fetchall())
    return PruneReport(keep_seconds=keep.total_seconds(), dry_run=dry_run, **counts)
