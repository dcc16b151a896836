"""URI identity: exact strings route; normalized forms only detect ambiguity.

Contract: mcpsync keys every subscription by the URI string exactly as the server listed it.
``normalize_uri`` (RFC 3986 §6.2.2 syntax-based normalization: scheme and host lower-cased,
percent-encoding hex upper-cased, percent-encoded unreserved characters decoded, dot segments
removed) only *detects* two strings that may name the same resource, so that such a pair is audited
and sent to RECONCILIATION_REQUIRED instead of being routed to each other.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

__all__ = ["MAX_URI_LENGTH", "SLUG_MAX_LENGTH", "normalize_uri", "ambiguous_pairs", "uri_problem", "uri_slug",
           "unparsed_uri_problem"]

_PCT = re.compile(r"%([0-9A-Fa-f]{2})")
_UNRESERVED = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_URI = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*):(?P<rest>.*)$", re.S)
MAX_URI_LENGTH = 8192
SLUG_MAX_LENGTH = 48
_SLUG_SEPARATORS = re.compile(r"([^a-z0-9]+)")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # C0 control characters and DEL


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
    if (problem := unparsed_uri_problem(uri)) is not None:
        return problem
    if _URI.match(uri) is None:
        return "URI has no scheme"
    return None


def unparsed_uri_problem(uri: str) -> str | None:
    """The ``uri_problem`` rules that need no parsing (length, control characters), or None. The
    ingress checks a notified URI by them before it is queued, counted in metrics or written anywhere."""
    if len(uri) > MAX_URI_LENGTH:
        return f"URI longer than {MAX_URI_LENGTH} characters"
    if _CONTROL.search(uri) is not None:
        return "URI contains control characters"
    return None


def uri_slug(uri: str) -> str:
    """The readable part of a subscription's workflow id (docs/upgrades.md, "Workflow ids"); the hash beside
    it keeps ids unique. ``demo://docs/Read%20Me.md`` -> ``demo-docs-read-me.md``: lowercase ASCII letters,
    digits, ``-`` and single ``.`` between them, at most ``SLUG_MAX_LENGTH`` characters, never empty for a
    URI ``uri_problem`` accepts (its scheme starts with a letter).

    Percent-escapes are decoded first (they read better as the characters they stand for); every
    non-ASCII character, and every run of other characters (``/``, ``:``, ``..``, ``?``, ...) is one
    ``-``. A longer slug keeps its end, where a URI usually names the resource, starting at a word
    boundary. Deliberately no Unicode folding (NFKD, case mapping of non-ASCII): those tables change
    with the Python version, and a key's computed id must not."""
    text = unquote(uri).encode("ascii", "replace").decode("ascii").lower()
    parts = _SLUG_SEPARATORS.split(text)  # words at even indexes, separator runs at odd ones
    slug = "".join(p if i % 2 == 0 or p == "." else "-" for i, p in enumerate(parts)).strip("-.")
    if len(slug) > SLUG_MAX_LENGTH:
        tail = slug[-SLUG_MAX_LENGTH:]
        # Cut at a separator when one is near, rather than inside a word.
        cut = next((i for i, c in enumerate(tail[: SLUG_MAX_LENGTH // 3]) if c in "-."), -1)
        slug = tail[cut + 1:].strip("-.")
    return slug
