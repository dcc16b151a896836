"""Opaque cursors for ``mcpsync serve``: list pages and event positions, sealed to one subject.

Contract:
- A cursor is ``<key id>.<sealed>`` (URL-safe text). ``sealed`` is the payload padded to a multiple of
  32 bytes and encrypted (HMAC-SHA256 in counter mode over a random 96-bit nonce) and then
  authenticated (HMAC-SHA256, 128 bits) over kind, subject, key id, nonce and ciphertext. Nothing of
  the payload (an outbox position, a listing snapshot) is readable without the key, and equal
  payloads give different cursors.
- A cursor that does not verify (forged, edited, another subject's, another kind) is ``BadCursor``,
  the same answer for each; one of a key id this server does not hold is ``BadCursor`` too ("stale":
  the client lists or polls again from the start). The caller answers -32602 and nothing changes.
- Keys: ``MCPSYNC_SERVE_SECRET`` when set (``MCPSYNC_SERVE_SECRET_PREVIOUS``, when set, is still
  accepted, never issued: a rotation keeps outstanding cursors valid until it is unset); otherwise 32
  random bytes in ``<state dir>/serve-cursor.key`` (0600, created once, atomically: concurrent
  starts agree on one key). Neither is derived from anything else a client or a reader of the
  configuration knows.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path

__all__ = ["KEY_FILE", "BadCursor", "CursorSigner"]

KEY_FILE = "serve-cursor.key"
_NONCE = 12
_TAG = 16
_BLOCK = 32
MAX_CURSOR_CHARS = 256
_URLSAFE = re.compile(r"[A-Za-z0-9_-]+")  # base64's decoder would skip other characters silently


class BadCursor(ValueError):
    """The cursor does not verify for this subject (or its key is no longer held)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class _Key:
    def __init__(self, secret: bytes) -> None:
        self.kid = _b64(hashlib.sha256(b"mcpsync-serve-cursor-kid\x00" + secret).digest()[:6])
        self.enc = hmac.new(secret, b"mcpsync-serve-cursor-enc", hashlib.sha256).digest()
        self.mac = hmac.new(secret, b"mcpsync-serve-cursor-mac", hashlib.sha256).digest()

    def stream(self, nonce: bytes, length: int) -> bytes:
        blocks = (length + _BLOCK - 1) // _BLOCK
        return b"".join(hmac.new(self.enc, nonce + i.to_bytes(4, "big"), hashlib.sha256).digest()
                        for i in range(blocks))[:length]

    def tag(self, kind: str, subject: str, nonce: bytes, ciphertext: bytes) -> bytes:
        header = f"{kind}\x00{subject}\x00{self.kid}\x00".encode("utf-8", "surrogateescape")
        return hmac.new(self.mac, header + nonce + ciphertext, hashlib.sha256).digest()[:_TAG]


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


class CursorSigner:
    """Seals cursors with ``key``; opens those of ``key`` or of any of ``previous``."""

    def __init__(self, key: bytes, previous: tuple[bytes, ...] = ()) -> None:
        self._current = _Key(key)
        self._keys = {k.kid: k for k in (_Key(p) for p in previous)}
        self._keys[self._current.kid] = self._current

    @classmethod
    def for_serve(cls, state: Path, env: Mapping[str, str] | None = None) -> CursorSigner:
        """The serve process's signer: the environment's secrets, else the state dir's key file."""
        env = os.environ if env is None else env
        secret = env.get("MCPSYNC_SERVE_SECRET")
        if secret:
            previous = env.get("MCPSYNC_SERVE_SECRET_PREVIOUS")
            return cls(secret.encode(), (previous.encode(),) if previous else ())
        return cls(_state_key(state))

    def sign(self, kind: str, payload: str, subject: str) -> str:
        data = payload.encode()
        data += b"\x00" * (-len(data) % _BLOCK or (0 if data else _BLOCK))
        key, nonce = self._current, secrets.token_bytes(_NONCE)
        ciphertext = _xor(data, key.stream(nonce, len(data)))
        return f"{key.kid}.{_b64(nonce + ciphertext + key.tag(kind, subject, nonce, ciphertext))}"

    def event_id(self, subject: str, position: int) -> str:
        """An event's ``eventId``: stable for one subject and position under the current key (a client
        dedupes by it), and opaque: it reveals neither the outbox position nor anything of another
        subject's activity. A new key gives every event a new id."""
        message = f"event\x00{subject}\x00{position}".encode("utf-8", "surrogateescape")
        digest = hmac.new(self._current.mac, message, hashlib.sha256).digest()
        return f"ev_{_b64(digest[:16])}"

    def verify(self, kind: str, cursor: str, subject: str) -> str:
        """The payload of a valid cursor of ``kind`` for ``subject``; else ``BadCursor``."""
        if len(cursor) > MAX_CURSOR_CHARS:
            raise BadCursor("cursor too long")
        kid, _, sealed = cursor.partition(".")
        if not _URLSAFE.fullmatch(sealed):
            raise BadCursor("not a cursor this server issued")
        try:
            raw = _unb64(sealed)
        except (binascii.Error, ValueError):
            raise BadCursor("not a cursor this server issued") from None
        if len(raw) < _NONCE + _BLOCK + _TAG or (len(raw) - _NONCE - _TAG) % _BLOCK:
            raise BadCursor("not a cursor this server issued")
        key = self._keys.get(kid)
        if key is None:
            raise BadCursor("stale cursor: issued under a key this server no longer holds")
        nonce, ciphertext, tag = raw[:_NONCE], raw[_NONCE:-_TAG], raw[-_TAG:]
        if not hmac.compare_digest(tag, key.tag(kind, subject, nonce, ciphertext)):
            raise BadCursor("cursor does not verify (forged, or issued to another subject)")
        return _xor(ciphertext, key.stream(nonce, len(ciphertext))).rstrip(b"\x00").decode()


def _state_key(state: Path) -> bytes:
    """The key in ``state/serve-cursor.key``, made once (0600) if missing; hex in the file."""
    path = state / KEY_FILE
    if not path.exists():
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = state / f".{KEY_FILE}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            with suppress(FileExistsError):  # another serve made it first: both use that one
                os.link(tmp, path)
        finally:
            tmp.unlink()
    try:
        key = bytes.fromhex(path.read_text().strip())
    except ValueError:
        key = b""
    if len(key) < 32:
        raise ValueError(f"{path} does not hold a 32-byte hex key: remove it to make a new one")
    return key
