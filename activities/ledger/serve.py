"""What ``mcpsync serve`` reads from the ledger: a subject's subscribed resources and their freshness.

Contract:
- Read-only. One query per listing (one snapshot: a REPEATABLE READ transaction), one per
  resource. Bodies come only through ``released_content`` (the content API's release check:
  own subject, guardrail released, not revoked, digest verified).
- A subject's resources are its subscriptions that have an accepted version visible to it by the
  one rule (``activities/ledger/visibility.py``): after a revocation none of the revoked scope is listed,
  whatever the subscription's state (REVOKED, CLOSED, TOMBSTONED, UNSUBSCRIBE_UNKNOWN); nor are its
  outbox events before the revocation polled or streamed (the ``revoked`` event itself is). With the
  same URI on several upstream servers the first server by name wins (``ServedResource.server`` says which).
- What is proven about a version comes from ``activities/ledger/proven.py`` (the level rule over the fence
  row, the accepted receipt, the newest verifying read), never from a rule of this module.
- ``freshness_meta`` is ``_meta["io.mcpsync/freshness"]``: state, the accepted version's receipt id,
  read ordinal and time (status ACCEPTED: an unchanged re-read never moves them), digest, verified
  at (the newest read that saw the current digest), the published staleness bound (``serve
  --max-age``; null: push-driven, no age limit) and when the next verification is due under it, the
  newest reconciled catalog's status (SNAPSHOT_PROVEN / SNAPSHOT_UNPROVEN; null without a catalog),
  whether an update is unread (dirty, ``coverage.dirty``), and ``Proven.fresh``.
  ``guardrailRejected``: the newest read was not released (its body is never served, and the older
  accepted version is not current: reads are refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from mcpsync.activities.ledger.proven import PROVEN_COLUMNS, PROVEN_JOIN, Proven, proven_from_row
from mcpsync.activities.ledger.visibility import visible_to_subject
from mcpsync.workflows.records.ledger import OutboxEventType

__all__ = [
    "ServedResource",
    "freshness_meta",
    "list_served",
    "newest_rejection",
    "outbox_top",
    "rejections_after",
    "rejection_reason",
    "served_resource",
    "served_uris",
    "still_visible",
    "subject_events",
]

_SELECT = f"""
SELECT DISTINCT ON (s.uri)
       s.workflow_id, s.subject, s.server, s.uri, s.last_receipt_id, s.last_accepted_ordinal,
       rv.accepted_at, rv.mime_type, rv.size, {PROVEN_COLUMNS},
       (SELECT rc.status FROM resource_catalogs rc WHERE rc.subject = s.subject AND rc.server = s.server
          ORDER BY rc.catalog_id DESC LIMIT 1) AS catalog_status,
       ck.descriptor->>'name' AS upstream_name, ck.descriptor->>'title' AS upstream_title,
       COALESCE(ck.descriptor->>'mimeType', ck.descriptor->>'mime_type') AS catalog_mime_type
FROM subscriptions s
JOIN resource_versions rv ON rv.receipt_id = s.last_receipt_id
{PROVEN_JOIN}
LEFT JOIN catalog_known ck ON ck.subject = s.subject AND ck.server = s.server AND ck.uri = s.uri
                          AND ck.gone_at IS NULL
WHERE s.subject = %(subject)s AND s.last_accepted_digest IS NOT NULL
  AND {visible_to_subject("rv", "rv.accepted_at")}
  AND (%(uri)s::text IS NULL OR s.uri = %(uri)s::text)
ORDER BY s.uri, s.server
"""

_SERVED_URIS = f"""
SELECT DISTINCT s.uri FROM subscriptions s JOIN resource_versions rv ON rv.receipt_id = s.last_receipt_id
WHERE s.subject = %s AND s.uri = ANY(%s) AND s.last_accepted_digest IS NOT NULL
  AND {visible_to_subject("rv", "rv.accepted_at")}
"""

_STILL_VISIBLE = f"""
SELECT rv.receipt_id FROM resource_versions rv
WHERE rv.subject = %s AND rv.receipt_id = ANY(%s) AND {visible_to_subject("rv", "rv.accepted_at")}
"""

# An outbox row is the subject's when the rule shows the version it announces (its time: the row's
# created_at); a revocation's own ``revoked`` row is always the subject's (it says access ended). An
# ``overdue`` row changes no resource: it is no ``resource.changed`` event.
_EVENT_VISIBLE = (
    f"o.event_type <> '{OutboxEventType.OVERDUE.value}'"
    f" AND (o.event_type = '{OutboxEventType.REVOKED.value}' OR {visible_to_subject('o', 'o.created_at')})"
)


@dataclass(frozen=True, slots=True)
class ServedResource:
    workflow_id: str
    subject: str
    server: str
    uri: str
    body_receipt_id: int  # the row's last receipt: where the current bytes are fetched from
    body_at: datetime  # that receipt's time
    ordinal: int
    mime_type: str | None
    size: int
    name: str
    title: str | None
    proven: Proven  # what is proven about the version (activities/ledger/proven.py)
    catalog_status: str | None = (
        None  # the newest reconciled catalog's status (None: no catalog for the server)
    )

    @property
    def state(self) -> str:
        return self.proven.state

    @property
    def digest(self) -> str:
        return self.proven.digest or ""

    @property
    def receipt_id(self) -> int:
        """The accepted version's receipt (status ACCEPTED)."""
        return self.proven.accepted_receipt_id or self.body_receipt_id

    @property
    def accepted_ordinal(self) -> int:
        """The accepted version's read ordinal (the row's fence ordinal also moves on re-reads)."""
        return self.proven.accepted_ordinal or self.ordinal

    @property
    def accepted_at(self) -> datetime:
        return self.proven.accepted_at or self.body_at

    @property
    def dirty(self) -> bool:
        return self.proven.dirty

    @property
    def guardrail_rejected(self) -> bool:
        return self.proven.guardrail_rejected


def _row(r: dict[str, Any]) -> ServedResource:
    return ServedResource(
        workflow_id=r["workflow_id"],
        subject=r["subject"],
        server=r["server"],
        uri=r["uri"],
        body_receipt_id=int(r["last_receipt_id"]),
        body_at=r["accepted_at"],
        ordinal=int(r["last_accepted_ordinal"]),
        mime_type=r["mime_type"] or r["catalog_mime_type"],
        size=int(r["size"] or 0),
        name=r["upstream_name"] or r["uri"].rsplit("/", 1)[-1] or r["uri"],
        title=r["upstream_title"],
        proven=proven_from_row(r),
        catalog_status=r["catalog_status"],
    )


async def list_served(pool: AsyncConnectionPool, subject: str) -> tuple[int, list[ServedResource]]:
    """One snapshot of the subject's resources, with the outbox position it was taken at."""
    async with pool.connection() as conn:
        await conn.set_autocommit(False)
        async with conn.transaction():
            await conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute("SELECT COALESCE(max(position), 0) AS top FROM outbox")
            top = await cur.fetchone()
            await cur.execute(_SELECT, {"subject": subject, "uri": None})
            rows = await cur.fetchall()
    return int(top["top"]) if top else 0, [_row(r) for r in rows]


async def served_resource(pool: AsyncConnectionPool, subject: str, uri: str) -> ServedResource | None:
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(_SELECT, {"subject": subject, "uri": uri})
        row = await cur.fetchone()
    return _row(row) if row else None


async def served_uris(pool: AsyncConnectionPool, subject: str, uris: list[str]) -> set[str]:
    """Which of ``uris`` the subject is served (subscribed, an accepted version visible to it)."""
    async with pool.connection() as conn:
        cur = await conn.execute(_SERVED_URIS, (subject, uris))
        return {row[0] for row in await cur.fetchall()}


async def rejection_reason(pool: AsyncConnectionPool, workflow_id: str) -> str | None:
    """The reason of the subscription's newest guardrail rejection (its audit row; None: none)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT detail->>'reason' FROM audit WHERE kind = 'GUARDRAIL_REJECTED' AND workflow_id = %s"
            " ORDER BY audit_id DESC LIMIT 1",
            (workflow_id,),
        )
        row = await cur.fetchone()
    return str(row[0]) if row and row[0] else None


async def newest_rejection(pool: AsyncConnectionPool) -> int:
    """The audit id of the newest guardrail rejection (0: none yet)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT COALESCE(max(audit_id), 0) FROM audit WHERE kind = 'GUARDRAIL_REJECTED'")
        row = await cur.fetchone()
    return int(row[0]) if row else 0


async def rejections_after(pool: AsyncConnectionPool, mark: int, *, limit: int) -> list[tuple[int, str, str]]:
    """(audit id, subject, URI) of the first ``limit`` guardrail rejections after audit id ``mark``, in
    order (the ``audit (kind, audit_id)`` index)."""
    async with pool.connection() as conn:
        cur = await conn.execute(
            "SELECT audit_id, subject, uri FROM audit WHERE kind = 'GUARDRAIL_REJECTED' AND audit_id > %s"
            " AND subject IS NOT NULL AND uri IS NOT NULL ORDER BY audit_id LIMIT %s",
            (mark, limit),
        )
        return [(int(a), str(subject), str(uri)) for a, subject, uri in await cur.fetchall()]


async def still_visible(pool: AsyncConnectionPool, subject: str, receipt_ids: list[int]) -> set[int]:
    """Which of the subject's ``receipt_ids`` it may still see (a listing snapshot's page, re-checked:
    a revocation after the snapshot hides what it covers)."""
    async with pool.connection() as conn:
        cur = await conn.execute(_STILL_VISIBLE, (subject, receipt_ids))
        return {int(row[0]) for row in await cur.fetchall()}


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def freshness_meta(r: ServedResource, max_age_seconds: float | None) -> dict[str, Any]:
    fresh, why = r.proven.fresh(max_age_seconds)
    due = r.proven.due_at(max_age_seconds)
    return {
        "state": r.state,
        "receiptId": r.receipt_id,
        "digest": r.digest,
        "ordinal": r.accepted_ordinal,
        "acceptedAt": _iso(r.accepted_at),
        "verifiedAt": _iso(r.proven.verified_at),
        "server": r.server,
        "stalenessBoundSeconds": max_age_seconds,
        "verificationDueAt": _iso(due),
        "dirty": r.dirty,
        "guardrailRejected": r.guardrail_rejected,
        "catalogStatus": r.catalog_status,
        "fresh": fresh,
        **({"notFreshBecause": why} if why else {}),
    }


async def outbox_top(pool: AsyncConnectionPool) -> tuple[int, int]:
    """(highest stamped position, pruned_through): the events extension's cursor range."""
    async with pool.connection() as conn, conn.transaction():
        cur = await conn.execute("SELECT outbox_stamp()")
        row = await cur.fetchone()
        cur = await conn.execute("SELECT pruned_through FROM outbox_state")
        pruned = await cur.fetchone()
    return int(row[0]) if row else 0, int(pruned[0]) if pruned else 0


async def subject_events(
    pool: AsyncConnectionPool, subject: str, after: int, limit: int, not_before: datetime | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """Stamped outbox rows of one subject after ``after``, oldest first, and whether rows after
    ``after`` were skipped for being created before ``not_before`` (the ``maxAgeMs`` floor)."""
    async with pool.connection() as conn, conn.transaction():
        await conn.execute("SELECT outbox_stamp()")
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            "SELECT o.* FROM outbox o WHERE o.position > %s AND o.subject = %s"
            " AND (%s::timestamptz IS NULL OR o.created_at >= %s::timestamptz)"
            f" AND {_EVENT_VISIBLE} ORDER BY o.position LIMIT %s",
            (after, subject, not_before, not_before, limit),
        )
        rows = list(await cur.fetchall())
        skipped = False
        if not_before is not None:
            older = await conn.execute(
                "SELECT EXISTS (SELECT 1 FROM outbox WHERE position > %s AND subject = %s"
                " AND created_at < %s)",
                (after, subject, not_before),
            )
            found = await older.fetchone()
            skipped = bool(found and found[0])
        return rows, skipped
