"""Content access: the accepted body behind a receipt, for the subject it was read for.

Contract:
- ``released_content(pool, receipt_id=..., subject=...)`` returns the body exactly as read
  (text as its UTF-8 bytes, a blob as its decoded bytes, several contents as mcpsync's
  multipart JSON envelope) with its MIME type, only when all hold:
  the receipt belongs to ``subject``; its status is ACCEPTED or UNCHANGED (the guardrail
  released it: GUARDRAIL_REJECTED, STALE, TOMBSTONED receipts are never released); the
  subscription is not REVOKED and no revocation of it was recorded after the receipt.
  Otherwise ``ContentRefused`` (CLI exit 5). An unknown receipt, or a body retention has
  pruned or a revocation purged, is ``ContentNotFound`` (exit 4).
- The body is checked against the receipt's digest before it is returned.
- Bodies are never logged; ``ReleasedContent`` leaves the body out of its repr.
"""

from __future__ import annotations

from enum import StrEnum

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict, Field

from mcpsync.activities.ledger.visibility import visible_to_subject
from mcpsync.workflows.digest import ContentPart, content_digest
from mcpsync.workflows.records.ledger import AcceptVerdict

__all__ = ["ContentKind", "ContentNotFound", "ContentRefused", "ReleasedContent", "released_content"]

_RECEIPT = f"""
SELECT rv.*, {visible_to_subject("rv", "rv.accepted_at")} AS visible
FROM resource_versions rv JOIN subscriptions s ON s.workflow_id = rv.workflow_id
WHERE rv.receipt_id = %s
"""

RELEASED = (AcceptVerdict.ACCEPTED.value, AcceptVerdict.UNCHANGED.value)


class ContentNotFound(LookupError):
    """No such receipt, or its body is no longer stored."""


class ContentRefused(PermissionError):
    """The receipt exists but its body may not be released to this caller."""


class ContentKind(StrEnum):
    TEXT = "text"  # one text content: the body is its UTF-8 encoding
    BLOB = "blob"  # one blob content: the decoded bytes
    MULTIPART = "multipart"  # several contents: application/vnd.mcpsync.multipart+json envelope
    UNKNOWN = "unknown"  # stored before the ledger recorded how (treat as binary)


class ReleasedContent(BaseModel):
    model_config = ConfigDict(frozen=True)

    receipt_id: int
    subject: str
    server: str
    uri: str
    content_digest: str
    mime_type: str | None
    kind: ContentKind
    size: int
    body: bytes = Field(repr=False)

    @property
    def is_text(self) -> bool:
        return self.kind == ContentKind.TEXT


async def released_content(pool: AsyncConnectionPool, *, receipt_id: int, subject: str) -> ReleasedContent:
    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(_RECEIPT, (receipt_id,))
        rv = await cur.fetchone()
        if rv is None:
            raise ContentNotFound(f"no receipt {receipt_id}")
        if rv["subject"] != subject:
            # Says nothing about whose it is.
            raise ContentRefused(f"receipt {receipt_id} does not belong to subject {subject!r}")
        if rv["status"] not in RELEASED:
            why = "not released by the guardrail" if rv["status"] == AcceptVerdict.GUARDRAIL_REJECTED else \
                "not an accepted version"
            raise ContentRefused(f"receipt {receipt_id} is {rv['status']}: {why}")
        if not rv["visible"]:
            raise ContentRefused(f"receipt {receipt_id}: access of subject {subject!r} to"
                                 f" {rv['uri']} was revoked")
        await cur.execute("SELECT mime_type, kind, body FROM content_store WHERE subject = %s"
                          " AND content_digest = %s",
                          (subject, rv["content_digest"]))
        stored = await cur.fetchone()
    if stored is None:
        raise ContentNotFound(f"receipt {receipt_id}: the body is no longer stored (pruned by retention)")
    body = bytes(stored["body"])
    kind = ContentKind(stored["kind"]) if stored["kind"] else ContentKind.UNKNOWN
    mime = stored["mime_type"] if stored["mime_type"] is not None else rv["mime_type"]
    if kind in (ContentKind.TEXT, ContentKind.BLOB):
        part = ContentPart("text" if kind == ContentKind.TEXT else "blob", mime, body)
        if content_digest([part]) != rv["content_digest"]:
            raise ContentNotFound(f"receipt {receipt_id}: the stored body does not match"
                                  " the receipt's digest")
    return ReleasedContent(receipt_id=receipt_id, subject=subject, server=rv["server"], uri=rv["uri"],
                           content_digest=rv["content_digest"], mime_type=mime, kind=kind, size=len(body),
                           body=body)
