"""Bearer tokens of ``mcpsync serve``: parsed once at start, matched in constant time.

Contract:
- ``MCPSYNC_SERVE_TOKENS`` is a JSON object ``{subject: token}``. ``parse_tokens`` refuses (ValueError
  naming the subject, never the token) a subject listed twice, a token shared by two subjects, and a
  token shorter than ``MIN_TOKEN_CHARS`` characters: a token identifies exactly one subject and is not
  guessable by trying a handful of short strings.
- ``subject_for_authorization`` compares the presented token with every configured token
  (``hmac.compare_digest``, no early exit, no lookup keyed by the token), so the answer's timing does
  not depend on how much of a token an attacker guessed.
- ``unlisted_subjects(tokens, listed)``: the subjects (sorted, each once) holding a token that no
  configured server lists. Such a subject authenticates and sees no resources; ``serve`` warns once
  at start, naming the subject, never the token.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Iterable, Mapping

__all__ = [
    "MIN_TOKEN_CHARS", "parse_tokens", "subject_for_authorization", "tokens_from_environment",
    "unlisted_subjects",
]

MIN_TOKEN_CHARS = 16


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"MCPSYNC_SERVE_TOKENS lists subject {key!r} twice")
        seen[key] = value
    return seen


def parse_tokens(raw: str) -> tuple[tuple[str, str], ...]:
    """``{subject: token}`` JSON as (token, subject) pairs; ValueError (no token in it) if unusable."""
    if not raw.strip():
        return ()
    try:
        data = json.loads(raw, object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError:
        raise ValueError("MCPSYNC_SERVE_TOKENS must be a JSON object {subject: token}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                             for k, v in data.items()):
        raise ValueError("MCPSYNC_SERVE_TOKENS must be a JSON object {subject: token} of non-empty strings")
    owners: dict[str, str] = {}
    for subject, token in data.items():
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(f"MCPSYNC_SERVE_TOKENS: the token of subject {subject!r} is shorter than "
                             f"{MIN_TOKEN_CHARS} characters")
        if token in owners:
            raise ValueError(f"MCPSYNC_SERVE_TOKENS: subjects {owners[token]!r} and {subject!r} have the "
                             "same token (a token must name one subject)")
        owners[token] = subject
    return tuple((token, subject) for subject, token in data.items())


def tokens_from_environment(env: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """``parse_tokens`` of ``MCPSYNC_SERVE_TOKENS`` in ``env`` (default: the process's environment)."""
    return parse_tokens((os.environ if env is None else env).get("MCPSYNC_SERVE_TOKENS", ""))


def subject_for_authorization(tokens: tuple[tuple[str, str], ...], authorization: str | None) -> str | None:
    """The subject of an ``Authorization: Bearer <token>`` header value, or None."""
    if authorization is None:
        return None
    scheme, _, presented = authorization.partition(" ")
    presented = presented.strip()
    if scheme.lower() != "bearer" or not presented:
        return None
    given = presented.encode("utf-8", "surrogateescape")
    found: str | None = None
    for token, subject in tokens:
        if hmac.compare_digest(given, token.encode("utf-8")):
            found = subject
    return found


def unlisted_subjects(tokens: Iterable[tuple[str, str]], listed: Iterable[str]) -> list[str]:
    """Subjects of ``tokens`` ((token, subject) pairs) not in ``listed`` (every configured server's
    subjects)."""
    return sorted({subject for _, subject in tokens} - set(listed))
