"""What is proven about a subscription's current version: the one reader of freshness over the fence row.

Contract:
- ``PROVEN_COLUMNS`` / ``PROVEN_JOIN`` are SQL fragments over ``subscriptions s`` that every reader
  of "is this version proven fresh?" puts in its query (serve's listing and read, the CLI's
  ``list``/``get``/``describe``); ``proven_from_row`` turns their columns into a ``Proven``. Read-only.
- ``dirty`` is the level rule of ``workflows/coverage.py`` (``coverage.dirty`` on the row's
  ``notifications_seen`` and ``covered``), never restated here.
- The accepted version is the newest receipt with status ACCEPTED carrying the row's current digest:
  ``accepted_receipt_id``, ``accepted_ordinal`` and ``accepted_at`` are its (an UNCHANGED re-read
  never moves them).
  ``verified_at`` is the newest ACCEPTED or UNCHANGED receipt with that digest (the newest read that
  saw the same bytes: the row's last receipt, which only ACCEPTED and UNCHANGED reads move, unless a
  not-found read moved it). ``newest_status`` is the newest judged receipt's verdict (STALE receipts
  left out); GUARDRAIL_REJECTED there means the accepted version is not current.
- ``fresh(bound)``: ACTIVE, not guardrail-rejected, not dirty, verified within ``bound`` seconds
  (None: no age limit). ``due_at(bound)``: when the next verification is due (None: no bound).
- ``proven_of`` is the same for one subscription by key (``mcpsync status``); the answer gate's
  observation puts the fragments in its own snapshot query.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from mcpsync.workflows.coverage import dirty
from mcpsync.workflows.records.ledger import AcceptVerdict, FenceSnapshot

__all__ = ["PROVEN_COLUMNS", "PROVEN_JOIN", "Proven", "proven_from_row", "proven_of"]

PROVEN_COLUMNS = """
       s.state AS proven_state, s.notifications_seen AS proven_notified, s.covered AS proven_covered,
       s.last_accepted_digest AS proven_digest,
       acc.receipt_id AS proven_accepted_receipt_id, acc.read_ordinal AS proven_accepted_ordinal,
       acc.accepted_at AS proven_accepted_at,
       COALESCE((SELECT v.accepted_at FROM resource_versions v WHERE v.receipt_id = s.last_receipt_id
                   AND v.status IN ('ACCEPTED', 'UNCHANGED') AND v.content_digest = s.last_accepted_digest),
                (SELECT max(v.accepted_at) FROM resource_versions v WHERE v.workflow_id = s.workflow_id
                   AND v.status IN ('ACCEPTED', 'UNCHANGED')
                   AND v.content_digest = s.last_accepted_digest)) AS proven_verified_at,
       (SELECT v.status FROM resource_versions v WHERE v.workflow_id = s.workflow_id
          AND v.status <> 'STALE' ORDER BY v.receipt_id DESC LIMIT 1) AS proven_newest_status
"""

PROVEN_JOIN = """
LEFT JOIN LATERAL (SELECT v.receipt_id, v.read_ordinal, v.accepted_at FROM resource_versions v
                   WHERE v.workflow_id = s.workflow_id AND v.status = 'ACCEPTED'
                     AND v.content_digest = s.last_accepted_digest
                   ORDER BY v.receipt_id DESC LIMIT 1) acc ON true
"""

_ONE = (f"SELECT {PROVEN_COLUMNS} FROM subscriptions s {PROVEN_JOIN}"
        " WHERE s.subject = %s AND s.server = %s AND s.uri = %s")


@dataclass(frozen=True, slots=True)
class Proven:
    state: str
    dirty: bool  # a recorded notification no observing read covers yet (coverage.dirty)
    digest: str | None
    accepted_receipt_id: int | None  # the accepted version's receipt (status ACCEPTED)
    accepted_ordinal: int | None  # its read ordinal
    accepted_at: datetime | None
    verified_at: datetime | None  # the newest read that saw the accepted digest
    newest_status: AcceptVerdict | None

    @property
    def guardrail_rejected(self) -> bool:
        """The newest read was not released by the guardrail: the accepted version is not current."""
        return self.newest_status == AcceptVerdict.GUARDRAIL_REJECTED

    def due_at(self, bound_seconds: float | None) -> datetime | None:
        """When the next verification is due under the staleness bound (None: no bound)."""
        verified = self.verified_at or self.accepted_at
        if bound_seconds is None or verified is None:
            return None
        return verified + timedelta(seconds=bound_seconds)

    def fresh(self, bound_seconds: float | None, now: datetime | None = None) -> tuple[bool, str]:
        """(fresh, why not) at read time."""
        if self.state != "ACTIVE":
            return False, f"subscription is {self.state}"
        if self.guardrail_rejected:
            return False, "the newest read was not released by the guardrail (GUARDRAIL_REJECTED)"
        if self.dirty:
            return False, "an update arrived that no read observing the resource covers yet (UPDATE_SEEN)"
        due = self.due_at(bound_seconds)
        if due is not None and bound_seconds is not None:
            now = now or datetime.now(UTC)
            if now > due:
                age = bound_seconds + (now - due).total_seconds()
                return False, (
                    f"last verified {age:.1f} s ago, beyond the staleness bound of {bound_seconds:g} s"
                )
        return True, ""


def proven_from_row(row: dict[str, Any]) -> Proven:
    """A ``Proven`` from a row selected with ``PROVEN_COLUMNS`` and ``PROVEN_JOIN``."""
    fence = FenceSnapshot(
        exists=True, notifications_seen=int(row["proven_notified"]), covered=int(row["proven_covered"])
    )
    newest = row["proven_newest_status"]
    return Proven(
        state=row["proven_state"],
        dirty=dirty(fence),
        digest=row["proven_digest"],
        accepted_receipt_id=row["proven_accepted_receipt_id"],
        accepted_ordinal=row["proven_accepted_ordinal"],
        accepted_at=row["proven_accepted_at"],
        verified_at=row["proven_verified_at"],
        newest_status=AcceptVerdict(newest) if newest is not None else None,
    )


async def proven_of(pool: AsyncConnectionPool, subject: str, server: str, uri: str) -> Proven | None:
    """What is proven about the version of the subscription (subject, server, uri); None: no fence row."""
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(_ONE, (subject, server, uri))
        row = await cur.fetchone()
    return proven_from_row(row) if row is not None else None
