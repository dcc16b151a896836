"""Signed cursors for ``mcpsync serve``: list pages and event positions, bound to one subject.

Contract:
- A cursor is ``<kind>.<payload>.<mac>`` (URL-safe text); the MAC (HMAC-SHA256, truncated to
  128 bits) covers kind, payload and the subject. A cursor that does not verify (forged, edited,
  another subject's, another kind) is ``BadCursor``; the caller answers -32602 and nothing else
  changes.
- The key is ``MCPSYNC_SERVE_SECRET`` when set; otherwise derived from the ledger URL (stable across
  restarts of one deployment, so event cursors survive a restart; set a secret in production).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

__all__ = ["BadCursor", "CursorSigner"]


class BadCursor(ValueError):
    """The cursor does not verify for this subject."""


class CursorSigner:
    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def from_environment(cls, fallback: str) -> CursorSigner:
        secret = os.environ.get("MCPSYNC_SERVE_SECRET")
        material = secret.encode() if secret else b"mcpsync-serve-cursor:" + fallback.encode()
        return cls(hashlib.sha256(material).digest())

    def _mac(self, kind: str, payload: str, subject: str) -> str:
        digest = hmac.new(self._key, f"{kind}\x00{payload}\x00{subject}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:16]).decode().rstrip("=")

    def sign(self, kind: str, payload: str, subject: str) -> str:
        return f"{kind}.{payload}.{self._mac(kind, payload, subject)}"

    def verify(self, kind: str, cursor: str, subject: str) -> str:
        """The payload of a valid cursor of ``kind`` for ``subject``; else ``BadCursor``."""
        if len(cursor) > 256:
            raise BadCursor("cursor too long")
        parts = cursor.split(".")
        if len(parts) != 3 or parts[0] != kind:
            raise BadCursor("not a cursor this server issued")
        if not hmac.compare_digest(parts[2], self._mac(kind, parts[1], subject)):
            raise BadCursor("cursor does not verify (forged, or issued to another subject)")
        return parts[1]
