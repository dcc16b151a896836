"""URI identity: exact strings route; normalized forms only detect ambiguity.

Contract: mcpsync keys every subscription by the URI string exactly as the server
listed it. ``normalize_uri`` (RFC 3986 §6.2.2 syntax-based normalization: scheme and
host lower-cased, percent-encoding hex upper-cased, percent-encoded unreserved
characters decoded, dot segments removed) is used only to *detect* two strings that
may name the same resource, so that such a pair is audited and sent to
RECONCILIATION_REQUIRED instead of being routed to each other.
"""

from __future__ import annotations

import re

__all__ = ["MAX_URI_LENGTH", "normalize_uri", "ambiguous_pairs", "uri_problem"]

_PCT = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_URI = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?P<rest>.*)$", re.S)
MAX_URI_LENGTH = 8192


def _pct(m: re.Match[str]) -> str:
    ch = chr(int(m.group(1), 16))
    return ch if ch in _UNRESERVED else "%" + m.group(1).upper()


def _remove_dot_segments(path: str) -> str:
    out: list[str] = []
    for seg in path.split("/"):
        if seg == "..":
            if len(out) > 1:
                out.pop()
        elif seg != ".":
            out.append(seg)
    result = "/".join(out)
    if path.endswith(("/.", "/..")):
        result += "/"
    return result


def normalize_uri(uri: str) -> str:
    m = _URI.match(uri)
    if m is None:
        return _PCT.sub(_pct, uri)
    scheme, rest = m.group("scheme").lower(), m.group("rest")
    rest = _PCT.sub(_pct, rest)
    if rest.startswith("//"):
        authority, sep, tail = rest[2:].partition("/")
        userinfo, at, host = authority.rpartition("@")
        authority = f"{userinfo}{at}{host.lower()}"
        path, qmark, query = (sep + tail).partition("?")
        rest = "//" + authority + _remove_dot_segments(path) + qmark + query
    return f"{scheme}:{rest}"


def ambiguous_pairs(uris: list[str]) -> list[tuple[str, str]]:
    """Pairs of distinct URI strings that normalize alike."""
    seen: dict[str, str] = {}
    pairs: list[tuple[str, str]] = []
    for uri in uris:
        n = normalize_uri(uri)
        if n in seen and seen[n] != uri:
            pairs.append((seen[n], uri))
        else:
            seen.setdefault(n, uri)
    return pairs


def uri_problem(uri: str) -> str | None:
    """Why a URI cannot be subscribed as given, or None."""
    if not uri:
        return "empty URI"
    if len(uri) > MAX_URI_LENGTH:
        return f"URI longer than {MAX_URI_LENGTH} characters"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in uri):
        return "URI contains control characters"
    if _URI.match(uri) is None:
        return "URI has no scheme"
    return None
