"""The ledger's content store: accepted bodies, keyed by (subject, digest).

Contract:
- Bodies live only in ``content_store``, per subject: a body read for one subject is never
  served to another. A read's body enters it only in its accept's transaction, and only when
  the verdict releases it (``plan_writes``, with the plan's other writes: ``STORE_ROWS_SQL``):
  a read in flight across a revocation stores nothing. An UNCHANGED read's body is the row's
  current version, stored already: its ``stored_at`` is refreshed without sending the body
  (``REFRESH_ROWS_SQL``), and stored again only if it is missing. Either way a body read again
  is young again (``retention``). ``stage`` parks the body of a standalone ``mcp_read`` (no accept in the same
  process) in ``content_pending`` until its accept takes it (``take_staged``); nothing there
  is ever released. Nothing here logs a body; ``get_content`` and ``current_content`` are the
  only ways out (``mcpsync.activities.ledger.released.released_content`` adds the release rules).
- ``current_content`` serves the current version only while the subscription is ACTIVE and its
  body is still stored: never after a revocation.
- ``purge_withdrawn`` runs inside a revocation's transaction: it deletes the subject's bodies
  the revoked subscription named, except those another live subscription of the subject uses.
- ``purge_subject`` runs inside a subject revocation's transaction (``revoke_subject``): it deletes
  every body the covered subscriptions' receipts name, whatever their state, except a body a
  receipt outside the revocation may still release.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mcpsync.activities.ledger.store import LedgerStore
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState

__all__ = ["PURGE_SUBJECT_SQL", "REFRESH_ROWS_SQL", "STORE_ROWS_SQL", "ContentLedger", "ReadBody",
           "body_rows"]

# Bodies stored (arrays: subjects, digests, MIME types, sizes, bodies, kinds; no two of one
# (subject, digest)). A body stored again is young again: retention never races its acceptance.
STORE_ROWS_SQL = """
INSERT INTO content_store (subject, content_digest, mime_type, size, body, kind)
SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::bigint[], %s::bytea[], %s::text[])
ON CONFLICT (subject, content_digest) DO UPDATE SET stored_at = now()
"""
# A stored body read again (an UNCHANGED verdict: the row's current version) is young again without
# being sent: ``jsonb`` arrays of subjects and of digests (``= ANY`` probes of the primary key; from
# ``jsonb``, so a custom plan does not size them and PostgreSQL keeps the generic plan) and the exact
# pairs (a filter, not a join: a generic plan would hash a join's rows). It answers the (subject,
# digest) of each body it found.
REFRESH_ROWS_SQL = """
UPDATE content_store c SET stored_at = now()
WHERE c.subject = ANY(ARRAY(SELECT jsonb_array_elements_text(%s::jsonb)))
  AND c.content_digest = ANY(ARRAY(SELECT jsonb_array_elements_text(%s::jsonb)))
  AND %s::jsonb @> jsonb_build_array(jsonb_build_array(c.subject, c.content_digest))
RETURNING c.subject, c.content_digest
"""


# A subject revocation's purge (``purge_subject``): parameters (subject, covered workflow ids,
# covered workflow ids, REVOKED, released verdicts). The candidates, the covered receipts' digests
# found by workflow id, are computed once (an array, so the bodies are found by their primary key,
# whatever the planner estimates), and each is checked through the (subject, content_digest) index
# (migration 018): the cost follows the covered receipts, not every body and receipt of the subject.
PURGE_SUBJECT_SQL = """
DELETE FROM content_store c
WHERE c.subject=%s AND c.content_digest = ANY(ARRAY(
    SELECT rv.content_digest FROM resource_versions rv
    WHERE rv.workflow_id = ANY(%s) AND rv.content_digest IS NOT NULL))
  AND NOT EXISTS (
    SELECT 1 FROM resource_versions rv JOIN subscriptions s ON s.workflow_id = rv.workflow_id
    WHERE rv.subject = c.subject AND rv.content_digest = c.content_digest
      AND NOT (rv.workflow_id = ANY(%s)) AND s.state <> %s AND rv.status = ANY(%s)
      AND NOT EXISTS (SELECT 1 FROM revocations r
                      WHERE r.workflow_id = rv.workflow_id AND r.recorded_at >= rv.accepted_at))
"""


def body_rows(bodies: Sequence[tuple[str, ReadBody, bool]]) -> tuple[list[Any] | None, list[Any] | None]:
    """The parameters of ``STORE_ROWS_SQL`` and of ``REFRESH_ROWS_SQL`` (None: no body of that kind) for
    (subject, body, known) triples: a ``known`` body (stored already) is refreshed, any other stored.
    One row per (subject, digest); one stored is not refreshed too."""
    store: dict[tuple[str, str], ReadBody] = {}
    refresh: set[tuple[str, str]] = set()
    for subject, body, known in bodies:
        if known:
            refresh.add((subject, body.digest))
        else:
            store.setdefault((subject, body.digest), body)
    refresh -= store.keys()
    stored = None if not store else [
        [s for s, _ in store], [d for _, d in store], [b.mime_type for b in store.values()],
        [len(b.body) for b in store.values()], [b.body for b in store.values()],
        [b.kind for b in store.values()]]
    pairs = sorted(refresh)
    refreshed = None if not pairs else [json.dumps([s for s, _ in pairs]), json.dumps([d for _, d in pairs]),
                                        json.dumps(pairs)]
    return stored, refreshed


@dataclass(frozen=True)
class ReadBody:
    """A read's body on its way to the accept (never logged: no repr of the bytes)."""

    digest: str
    mime_type: str | None
    kind: str | None  # text | blob | multipart
    body: bytes = field(repr=False)


class ContentLedger:
    def __init__(self, store: LedgerStore) -> None:
        self.store = store

    async def put_content(self, subject: str, digest: str, mime_type: str | None, body: bytes,
                          kind: str | None = None) -> None:
        """Store a body; ``kind`` is how it was read: ``text`` (UTF-8), ``blob`` or ``multipart``."""
        async with self.store.pool.connection() as conn:
            stored, _ = body_rows([(subject, ReadBody(digest, mime_type, kind, body), False)])
            await conn.execute(STORE_ROWS_SQL, stored)

    async def stage(self, key: SubscriptionKey, ordinal: int, body: ReadBody) -> None:
        """Park a standalone read's body until its accept (a retried read replaces it)."""
        async with self.store.pool.connection() as conn:
            await conn.execute(
                """
                INSERT INTO content_pending (subject, server, uri, read_ordinal, content_digest, mime_type,
                    kind, body)
                VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
                ON CONFLICT (subject, server, uri, read_ordinal) DO UPDATE
                    SET content_digest = EXCLUDED.content_digest,
                    mime_type = EXCLUDED.mime_type, kind = EXCLUDED.kind, body = EXCLUDED.body,
                    staged_at = now()
                """,
                (key.subject, key.server, key.uri, ordinal, body.digest, body.mime_type, body.kind,
                 body.body))

    @staticmethod
    async def take_staged(cur: Any, key: SubscriptionKey, ordinal: int) -> ReadBody | None:
        """Remove the body ``stage`` parked for read ``ordinal`` (in the accept's transaction); it."""
        await cur.execute(
            "DELETE FROM content_pending WHERE subject=%s AND server=%s AND uri=%s AND read_ordinal=%s"
            " RETURNING content_digest, mime_type, kind, body", (key.subject, key.server, key.uri, ordinal))
        row = await cur.fetchone()
        if row is None:
            return None
        return ReadBody(digest=row["content_digest"], mime_type=row["mime_type"], kind=row["kind"],
                        body=bytes(row["body"]))

    @staticmethod
    async def purge_staged(cur: Any, *, subject: str, server: str, uri: str | None) -> int:
        """Delete the parked bodies of the subject on ``server`` (``uri``, or all): a revocation's."""
        await cur.execute("DELETE FROM content_pending WHERE subject=%s AND server=%s"
                          " AND (%s::text IS NULL OR uri=%s)", (subject, server, uri, uri))
        return int(cur.rowcount)

    async def get_content(self, subject: str, digest: str) -> bytes | None:
        async with self.store.pool.connection() as conn:
            cur = await conn.execute(
                "SELECT body FROM content_store WHERE subject=%s AND content_digest=%s", (subject, digest)
            )
            row = await cur.fetchone()
        return None if row is None else bytes(row[0])

    async def current_content(self, key: SubscriptionKey) -> tuple[int, str, str | None, bytes] | None:
        """(receipt id, digest, MIME type, body) of the current version, only while it may be served:
        the subscription ACTIVE and the body still in the subject's store. Never after revocation."""
        async with self.store.pool.connection() as conn:
            cur = await conn.execute(
                """
                SELECT s.last_receipt_id, s.last_accepted_digest, c.mime_type, c.body
                FROM subscriptions s JOIN content_store c
                  ON c.subject = s.subject AND c.content_digest = s.last_accepted_digest
                WHERE s.subject=%s AND s.server=%s AND s.uri=%s AND s.state=%s
                """,  # by key: the row, whatever id its workflow runs under
                (key.subject, key.server, key.uri, SubscriptionState.ACTIVE.value),
            )
            row = await cur.fetchone()
        return None if row is None else (int(row[0]), str(row[1]), row[2], bytes(row[3]))

    @staticmethod
    async def purge_withdrawn(cur: Any, *, subject: str, workflow_id: str, digests: Sequence[str]) -> int:
        """Delete the subject's bodies among ``digests``, except those another live (not revoked)
        subscription of the subject still names; how many were deleted. In the caller's transaction."""
        await cur.execute(
            """
            DELETE FROM content_store c WHERE c.subject=%s AND c.content_digest = ANY(%s)
              AND NOT EXISTS (
                SELECT 1 FROM resource_versions rv JOIN subscriptions s ON s.workflow_id = rv.workflow_id
                WHERE rv.subject = c.subject AND rv.content_digest = c.content_digest
                  AND s.workflow_id <> %s AND s.state <> %s)
            """,
            (subject, list(digests), workflow_id, SubscriptionState.REVOKED.value),
        )
        return int(cur.rowcount)

    @staticmethod
    async def purge_subject(cur: Any, *, subject: str, workflow_ids: Sequence[str]) -> int:
        """Delete every body of ``subject`` that a receipt of ``workflow_ids`` names, finished
        subscriptions included, except one that a released receipt (ACCEPTED / UNCHANGED) of another,
        not revoked subscription of the subject still names; how many were deleted. In the caller's
        transaction, with the covered rows locked."""
        await cur.execute(PURGE_SUBJECT_SQL, (subject, list(workflow_ids), list(workflow_ids),
                                              SubscriptionState.REVOKED.value,
                                              [AcceptVerdict.ACCEPTED.value, AcceptVerdict.UNCHANGED.value]))
        return int(cur.rowcount)
