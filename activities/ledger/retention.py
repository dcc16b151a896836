"""Retention: what the ledger may forget, and when.

Contract:
- ``prune(pool, keep=..., dry_run=...)`` deletes rows older than ``keep`` that nothing current
  depends on, one transaction for everything but receipts (below), and returns how many rows of each
  kind it removed (or would remove, with ``dry_run``: counted in one transaction, then rolled back).
- Kept whatever their age: the fence rows (``subscriptions``), every receipt a reader needs (below),
  revocations, reconciled catalogs and the two scans each was built from (the release gate
  re-verifies catalogs against them), completeness consumptions, the known set, sessions, leases,
  answer bindings and dispositions.
- Receipts (``resource_versions``): an UNCHANGED receipt (a verification that saw the accepted bytes
  again; docs/decisions/0008-receipt-retention.md) is forgotten once older than ``keep`` when all hold:
  - the subscription's next ACCEPTED or UNCHANGED receipt (by read ordinal) carries the same digest
    and is no older: every question asked of "the newest read that saw these bytes" (``verified_at``,
    the answer gate's latest accepted receipt, the freshness metric, ``released_content`` of the
    current version) and every digest a withdrawal names stay as they were;
  - the fence row does not name it (``last_receipt_id``: serve's body, the resync's ``version_current``);
  - no outbox row names it (``receipt_id``) and no withdrawing outbox row (tombstoned, revoked, closed,
    whose ``invalidates`` lists every receipt) of its subscription is still held;
  - no answer selection names it (a bind writes one per dependency, so every bound and every
    disposition's receipt is one);
  - the visibility rule shows it (``visible_to_subject``): a receipt a revocation withdrew is kept with
    the revocation that lists it.
  Every other receipt stays: ACCEPTED (each introduced a version), STALE, GUARDRAIL_REJECTED,
  TOMBSTONE_PENDING and TOMBSTONED (each is the one record of what that read or catalog saw). So a
  subscription keeps its versions, the newest verification of each, and the verifications of the
  last ``keep``: bounded by ``keep``, not by its age. Readers that list receipts (``reports``' history,
  ``subscription_views``' recent events) show fewer UNCHANGED rows older than ``keep``, as they show
  fewer audit rows; a receipt id learned earlier and forgotten since is ``ContentNotFound``.
  The deletion runs after the main transaction, in batches of ``RECEIPT_BATCH`` (each its own
  transaction, taking row locks on old receipts nothing writes), so allocate and accept never wait
  on it (a batch a bind or an outbox row naming one of its receipts races is chosen again without it);
  a dry run counts it inside the rolled-back transaction, after the outbox rows it would forget.
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

import psycopg
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict

from mcpsync.activities.ledger.visibility import visible_to_subject

__all__ = ["DEFAULT_CONSUMER_MAX_LAG", "RECEIPT_BATCH", "PruneReport", "prune"]

DEFAULT_CONSUMER_MAX_LAG = timedelta(days=30)  # [retention] consumer_max_lag_days
RECEIPT_BATCH = 5000  # receipts deleted per transaction


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
    verification_receipts: int = 0  # superseded UNCHANGED receipts nothing points at


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
# Superseded verification receipts (the Contract's conditions, in its order). Candidates come from the
# resource_versions_unchanged_age index; the next verification from resource_versions_once (workflow_id,
# read_ordinal). Each reference is one index probe per candidate (subscriptions' primary key, and
# outbox_receipt, outbox_withdrawing, answer_selections_receipt of migration 024), written as a scalar
# lookup so that the planner keeps it one: as NOT EXISTS under the LIMIT it chose to rescan a whole
# small table per candidate (EXPLAIN at 1,000 subscriptions: 1.4 s a batch instead of 0.1 s). The ids
# go to the DELETE as an array, which it finds by the primary key (``IN (subquery)`` let it scan the table).
# ``%(batch)s`` NULL: no limit.
_RECEIPTS = f"""
DELETE FROM resource_versions d WHERE d.receipt_id = ANY(ARRAY(
    SELECT rv.receipt_id FROM resource_versions rv
    CROSS JOIN LATERAL (SELECT n.receipt_id, n.content_digest, n.accepted_at FROM resource_versions n
                        WHERE n.workflow_id = rv.workflow_id AND n.read_ordinal > rv.read_ordinal
                          AND n.status IN ('ACCEPTED', 'UNCHANGED')
                        ORDER BY n.read_ordinal LIMIT 1) nxt
    WHERE rv.status = 'UNCHANGED' AND rv.accepted_at < %(cutoff)s
      AND nxt.content_digest = rv.content_digest AND nxt.receipt_id > rv.receipt_id
      AND nxt.accepted_at >= rv.accepted_at
      AND rv.receipt_id IS DISTINCT FROM (SELECT s.last_receipt_id FROM subscriptions s
                                          WHERE s.workflow_id = rv.workflow_id)
      AND (SELECT 1 FROM outbox o WHERE o.receipt_id = rv.receipt_id LIMIT 1) IS NULL
      AND (SELECT 1 FROM outbox o WHERE o.workflow_id = rv.workflow_id
             AND o.event_type IN ('tombstoned', 'revoked', 'closed') LIMIT 1) IS NULL
      AND (SELECT 1 FROM answer_selections a WHERE a.receipt_id = rv.receipt_id LIMIT 1) IS NULL
      AND {visible_to_subject("rv", "rv.accepted_at")}
    LIMIT %(batch)s))
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
        if dry_run:
            cur = await conn.execute(_RECEIPTS, args | {"batch": None})
            counts["verification_receipts"] = len(await cur.fetchall())
    if not dry_run:
        counts["verification_receipts"] = await _prune_receipts(pool, args["cutoff"])
    return PruneReport(keep_seconds=keep.total_seconds(), dry_run=dry_run,
                       outbox_pruned_through=pruned_through, consumers_ignored=ignored, **counts)


async def _prune_receipts(pool: AsyncConnectionPool, cutoff: object) -> int:
    """Delete superseded verification receipts older than ``cutoff``, one batch per transaction. A batch
    that loses a race (a bind or an outbox row naming one of its receipts committed meanwhile: the
    foreign key refuses the delete) is chosen again, without that receipt."""
    total = 0
    races = 0
    while True:
        try:
            async with pool.connection() as conn, conn.transaction():
                cur = await conn.execute(_RECEIPTS, {"cutoff": cutoff, "batch": RECEIPT_BATCH})
                n = len(await cur.fetchall())
        except psycopg.errors.ForeignKeyViolation:
            races += 1
            if races > 3:
                raise
            continue
        total += n
        if n < RECEIPT_BATCH:
            return total
