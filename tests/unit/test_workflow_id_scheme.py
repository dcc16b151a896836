"""Workflow ids: the pinned scheme, readable slugs, bounded ids, distinct ids for URIs that slug alike.
The real-stack routes are in tests/e2e/test_workflow_ids.py."""

from __future__ import annotations

import re

import pytest

from mcpsync.workflows.records.subscription import SubscriptionKey
from mcpsync.workflows.uris import MAX_URI_LENGTH, SLUG_MAX_LENGTH, uri_slug

SAFE = re.compile(r"^[a-z0-9](?:[a-z0-9-]|\.(?!\.))*[a-z0-9]$|^[a-z0-9]$")


def _key(uri: str, *, subject: str = "alice", server: str = "demo") -> SubscriptionKey:
    return SubscriptionKey(subject=subject, server=server, uri=uri)


# --- unit -------------------------------------------------------------------------------------


def test_the_scheme_is_pinned_and_keeps_the_legacy_hash() -> None:
    key = _key("demo://policy/escalation")
    # The legacy (pre-readable) id of this key: a pinned hash, so old runs keep their ids.
    assert key.legacy_workflow_id == "mcpsync-sub/demo/alice/9019e8982d17d7549faa58c4"
    assert key.workflow_id == "mcpsync-sub/demo/alice/demo-policy-escalation-9019e8982d17d7549faa58c4"
    assert _key("demo://policy/escalation").workflow_id == key.workflow_id  # pure: same key, same id


@pytest.mark.parametrize(("uri", "slug"), [
    ("demo://docs/Read%20Me.md", "demo-docs-read-me.md"),  # %-escapes decoded, lowercased, '.' kept
    ("demo://x/%2e%2e/%2F%00%ff", "demo-x"),  # encoded '..', '/', NUL and a non-UTF-8 byte: separators
    ("file:///srv/../etc/./passwd", "file-srv-etc-passwd"),  # '..' and '.' segments never survive
    ("demo://café/日本語/🙂", "demo-caf"),  # non-ASCII dropped, never folded (version-stable)
    ("demo:", "demo"),  # empty path
    ("demo://", "demo"),
    ("urn:isbn:0451450523", "urn-isbn-0451450523"),
    ("HTTPS://Example.COM/A_B?q=1#frag", "https-example.com-a-b-q-1-frag"),
])
def test_slug(uri: str, slug: str) -> None:
    assert uri_slug(uri) == slug
    assert SAFE.match(slug), slug


def test_a_huge_uri_gives_a_bounded_slug_that_keeps_its_end() -> None:
    uri = "file:///" + "/".join(f"dir{i}" for i in range(1000)) + "/Final-Report.PDF"
    assert len(uri) <= MAX_URI_LENGTH
    slug = uri_slug(uri)
    assert len(slug) <= SLUG_MAX_LENGTH and slug.endswith("-final-report.pdf") and SAFE.match(slug)
    assert slug.startswith("dir"), "cut at a word boundary, not inside one"
    one_word = uri_slug("demo:" + "x" * (MAX_URI_LENGTH - 5))
    assert one_word == "x" * SLUG_MAX_LENGTH


@pytest.mark.parametrize("uri", [
    "demo://docs/Read%20Me.md", "demo://café/日本語", "file:///" + "a/" * 4000, "demo:..", "demo:%",
    "demo:%zz%",
    "x:" + "é" * 8000, "demo://a/%2e%2e%2f%2e%2e%2fetc", "z:?#",
])
def test_every_valid_uri_gives_a_valid_bounded_id(uri: str) -> None:
    key = _key(uri)
    prefix = "mcpsync-sub/demo/alice/"
    assert key.workflow_id.startswith(prefix)
    tail = key.workflow_id[len(prefix):]
    slug, _, digest = tail.rpartition("-")
    assert SAFE.match(slug) and len(slug) <= SLUG_MAX_LENGTH, tail
    assert re.fullmatch(r"[0-9a-f]{24}", digest) and key.legacy_workflow_id == prefix + digest
    assert len(key.workflow_id) <= len(prefix) + SLUG_MAX_LENGTH + 1 + 24


def test_uris_that_slug_alike_get_distinct_ids() -> None:
    a, b = _key("demo://docs/a b"), _key("demo://docs/a%20b")
    assert uri_slug(a.uri) == uri_slug(b.uri) == "demo-docs-a-b"
    assert a.workflow_id != b.workflow_id


# --- real stack ---------------------------------------------------------------------------------
