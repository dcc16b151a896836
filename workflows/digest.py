"""Content digests: the only form in which resource bodies leave the content store.

Contract: ``content_digest`` is a pure function of the ``resources/read`` contents
(kind, MIME type and bytes of each part, in order). The fixture server's control
plane and the read activity both call it, so an oracle's committed digest and an
accepted receipt's digest are equal exactly when the content is. No workflow calls it: it
lives here, the one layer activities, fixture, sim and worker all import (tests/unit/test_layers.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal, NamedTuple

__all__ = ["ContentPart", "content_digest"]


class ContentPart(NamedTuple):
    kind: Literal["text", "blob"]
    mime_type: str | None
    data: bytes  # text parts: UTF-8 bytes; blob parts: the base64-decoded bytes


def content_digest(parts: Sequence[ContentPart]) -> str:
    """``sha256:<hex>`` over a length-prefixed framing of every part."""
    h = hashlib.sha256()
    for part in parts:
        mime = (part.mime_type or "").encode()
        h.update(part.kind.encode() + b"\0" + str(len(mime)).encode() + b"\0" + mime)
        h.update(str(len(part.data)).encode() + b"\0" + part.data)
    return "sha256:" + h.hexdigest()
