"""Guardrails: may an accepted read be released for model input?

Contract:
- A ``Guardrail`` looks at the parts of one ``resources/read`` result (kind, declared
  MIME type, bytes) and returns ``None`` (pass) or a short reason (reject). It never
  sees credentials and must not log bodies.
- ``GuardrailChain`` runs guardrails in order; the first rejection wins. The read
  activity calls it with the body in hand; a rejection travels as
  ``ReadOutcome.guardrail_rejection`` and the fence records a GUARDRAIL_REJECTED
  receipt: no outbox row, the previous version stays current, not convergence.
- This is the pluggable seam: pass your own chain to ``SessionHost`` (``guardrails=``); it
  travels with each ``LiveSession`` of that (subject, server), so one ingress worker applies
  each server's own chain (by default ``default_chain`` from the server's config).
"""

from __future__ import annotations

import codecs
import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from mcpsync.workflows.digest import ContentPart

__all__ = [
    "BinaryNotText",
    "Guardrail",
    "GuardrailChain",
    "MimeAllowList",
    "SizeLimit",
    "TextDecodesAsDeclared",
    "default_chain",
]


class Guardrail(Protocol):
    @property
    def name(self) -> str: ...

    def check(self, parts: Sequence[ContentPart]) -> str | None: ...


def _charset(mime: str | None) -> str | None:
    for param in (mime or "").split(";")[1:]:
        k, _, v = param.strip().partition("=")
        if k.lower() == "charset" and v:
            return v.strip('"').lower()
    return None


def _is_textual(mime: str | None) -> bool:
    base = (mime or "").split(";")[0].strip().lower()
    return base.startswith("text/") or base in {
        "application/json", "application/xml", "application/yaml", "application/javascript", "image/svg+xml",
    } or base.endswith(("+json", "+xml"))


@dataclass(frozen=True)
class SizeLimit:
    max_bytes: int = 1024 * 1024
    name: str = "size_limit"

    def check(self, parts: Sequence[ContentPart]) -> str | None:
        total = sum(len(p.data) for p in parts)
        if total > self.max_bytes:
            return f"content is {total} bytes, over the {self.max_bytes}-byte release limit"
        return None


@dataclass(frozen=True)
class MimeAllowList:
    patterns: tuple[str, ...] = ("text/*", "application/json", "application/*+json", "application/xml",
                                 "application/yaml", "application/octet-stream", "image/*", "application/pdf")
    name: str = "mime_allow_list"

    def check(self, parts: Sequence[ContentPart]) -> str | None:
        for p in parts:
            base = (p.mime_type or ("text/plain" if p.kind == "text" else "application/octet-stream"))
            base = base.split(";")[0].strip().lower()
            if not any(fnmatch.fnmatch(base, pat) for pat in self.patterns):
                return f"MIME type {base!r} is not allowed"
        return None


@dataclass(frozen=True)
class TextDecodesAsDeclared:
    """A blob declared textual must decode with its declared charset (UTF-8 by default)."""

    name: str = "text_decodes_as_declared"

    def check(self, parts: Sequence[ContentPart]) -> str | None:
        for p in parts:
            if p.kind == "blob" and _is_textual(p.mime_type):
                charset = _charset(p.mime_type) or "utf-8"
                try:
                    codecs.lookup(charset)
                    p.data.decode(charset)
                except LookupError:
                    return f"unknown charset {charset!r}"
                except UnicodeDecodeError:
                    return f"binary content declared as {p.mime_type!r}: does not decode as {charset}"
        return None


CONTROL_BYTES = bytes(b for b in range(32) if chr(b) not in "\t\n\r\f")
"""The bytes ``BinaryNotText`` counts as control characters."""


@dataclass(frozen=True)
class BinaryNotText:
    """Text parts must look like text: no NUL bytes, few control characters."""

    max_control_ratio: float = 0.1
    name: str = "binary_never_as_text"

    def check(self, parts: Sequence[ContentPart]) -> str | None:
        for p in parts:
            if p.kind != "text" or not p.data:
                continue
            if b"\x00" in p.data:
                return "text content contains NUL bytes: binary passed as text"
            raw = p.data[:65536]
            # A control character is one ASCII byte, never part of a multi-byte or a replaced
            # sequence: the sample's control characters are the raw bytes' control bytes.
            controls = len(raw) - len(raw.translate(None, CONTROL_BYTES))
            if controls / max(1, len(raw.decode("utf-8", errors="replace"))) > self.max_control_ratio:
                return "text content is mostly control characters: binary passed as text"
        return None


@dataclass(frozen=True)
class GuardrailChain:
    guardrails: tuple[Guardrail, ...] = field(default_factory=tuple)

    def check(self, parts: Sequence[ContentPart]) -> str | None:
        for g in self.guardrails:
            reason = g.check(parts)
            if reason is not None:
                return f"{g.name}: {reason}"
        return None


def default_chain(*, max_bytes: int = 1024 * 1024, mime_allow: Sequence[str] | None = None) -> GuardrailChain:
    allow = MimeAllowList(tuple(mime_allow)) if mime_allow is not None else MimeAllowList()
    return GuardrailChain((SizeLimit(max_bytes), allow, TextDecodesAsDeclared(), BinaryNotText()))
