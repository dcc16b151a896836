"""``mcpsync serve`` pure parts: signed cursors, consistent listing snapshots, coalescing and the
slow-client cut-off, tokens from the environment (docs/serve.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from mcpsync.activities.outbox import OutboxEventType, OutboxEventV1
from mcpsync.worker import serve as serve_module
from mcpsync.worker.serve import ServeConfig, ServeHub, _Session
from mcpsync.worker.serve_cursors import BadCursor, CursorSigner
from mcpsync.worker.serve_ledger import ServedResource
from mcpsync.worker.serve_pending import PendingNotifications
from mcpsync.worker.serve_run import tokens_from_environment

NOW = datetime(2026, 12, 4, tzinfo=UTC)


def _res(uri: str, **kw: Any) -> ServedResource:
    base: dict[str, Any] = dict(workflow_id="w", subject="alice", server="s", uri=uri, state="ACTIVE",
                                receipt_id=1, digest="sha256:x", ordinal=1, accepted_at=NOW, verified_at=NOW,
                                mime_type="text/plain", size=1, name=uri, title=None, dirty=False)
    base.update(kw)
    return ServedResource(**base)


def test_cursors_verify_only_for_their_subject_and_kind() -> None:
    signer = CursorSigner(b"k" * 32)
    cursor = signer.sign("E", "42", "alice")
    assert signer.verify("E", cursor, "alice") == "42"
    for bad in (cursor.replace("42", "43"), cursor[:-2] + "AA", "E.42", "x" * 300, cursor + ".x"):
        with pytest.raises(BadCursor):
            signer.verify("E", bad, "alice")
    with pytest.raises(BadCursor):
        signer.verify("E", cursor, "bob")
    with pytest.raises(BadCursor):
        signer.verify("L", cursor, "alice")
    assert CursorSigner(b"other" * 8).sign("E", "42", "alice") != cursor


def test_fresh_rule() -> None:
    assert _res("a").fresh(None, NOW) == (True, "")
    assert not _res("a", state="RECONCILIATION_REQUIRED").fresh(None, NOW)[0]
    assert "UPDATE_SEEN" in _res("a", dirty=True).fresh(None, NOW)[1]
    old = _res("a", verified_at=NOW - timedelta(seconds=90))
    assert old.fresh(60, NOW)[0] is False and old.fresh(120, NOW)[0] is True


async def test_pages_come_from_one_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    listings = [[_res(f"u{i}") for i in range(5)], [_res("changed")]]

    async def fake_list(_pool: Any, subject: str) -> tuple[int, list[ServedResource]]:
        return 7, listings.pop(0)

    async def all_visible(_pool: Any, subject: str, receipt_ids: list[int]) -> set[int]:
        return set(receipt_ids)  # no revocation here (the re-check itself: test_security_serve_visibility)

    monkeypatch.setattr(serve_module, "list_served", fake_list)
    monkeypatch.setattr(serve_module, "still_visible", all_visible)
    hub = ServeHub(ServeConfig(page_size=2), pool=None, signer=CursorSigner(b"k" * 32))  # type: ignore[arg-type]
    uris, cursor = [], None
    first = True
    while first or cursor:
        first = False
        chunk, cursor = await hub.page("alice", cursor)
        uris += [r.uri for r in chunk]
    assert uris == [f"u{i}" for i in range(5)]  # the second listing never leaked into the pages
    _chunk, second = await hub.page("alice", None)
    assert second is None
    with pytest.raises(MCPError) as other:
        listings.append([_res(f"u{i}") for i in range(5)])
        _c, cur = await hub.page("alice", None)
        assert cur is not None
        await hub.page("bob", cur)
    assert other.value.code == -32602


def _event(uri: str, position: int) -> OutboxEventV1:
    return OutboxEventV1(event_type=OutboxEventType.VERSION_ACCEPTED, position=position, outbox_id=position,
                         subject="alice", server="s", uri=uri, workflow_id="w", receipt_id=1,
                         read_ordinal=1, content_digest="d", previous_digest="c", mime_type=None, size=None,
                         edition=None, server_name=None, server_version=None, accepted_at=None, trigger=None,
                         invalidates=None, reason=None, created_at=NOW)


async def test_a_burst_on_one_uri_is_coalesced_and_never_cuts_a_client_off() -> None:
    hub = ServeHub(ServeConfig(client_buffer=3), pool=None, signer=CursorSigner(b"k" * 32))  # type: ignore[arg-type]
    session = _Session(1, connection=None, subject="alice", pending=PendingNotifications(3))  # type: ignore[arg-type]
    session.subscriptions.add("demo://a")
    hub.sessions = {1: session}
    for position in range(1, 1001):
        await hub.announce(_event("demo://a", position))
    assert session.cut_off is None and session.subscriptions == {"demo://a"}
    assert session.pending.in_order() == [("updated", "demo://a")]
    assert hub.stats["coalesced"] == 999 and hub.stats["cut_off"] == 0


async def test_a_slow_legacy_client_is_cut_off_with_a_reason() -> None:
    hub = ServeHub(ServeConfig(client_buffer=3), pool=None, signer=CursorSigner(b"k" * 32))  # type: ignore[arg-type]
    uris = [f"demo://{name}" for name in "abcde"]
    session = _Session(1, connection=None, subject="alice", pending=PendingNotifications(3))  # type: ignore[arg-type]
    session.subscriptions.update(uris)
    fast = _Session(2, connection=None, subject="alice", pending=PendingNotifications(100))  # type: ignore[arg-type]
    fast.subscriptions.update(uris)
    hub.sessions = {1: session, 2: fast}
    for position, uri in enumerate(uris * 2, start=1):  # 5 distinct URIs, twice each
        await hub.announce(_event(uri, position))
    assert session.cut_off is not None and "cut off" in session.cut_off
    assert session.subscriptions == set()
    assert session.pending.in_order() == [("cut_off", session.cut_off)]  # all it gets, and the last
    assert [uri for _kind, uri in fast.pending.in_order()] == uris  # the others are not held up
    assert hub.stats["cut_off"] == 1


def test_tokens_from_environment() -> None:
    assert tokens_from_environment({}) == ()
    assert tokens_from_environment({"MCPSYNC_SERVE_TOKENS": '{"alice": "t1"}'}) == (("t1", "alice"),)
    for bad in ("nope", '["t"]', '{"alice": ""}', '{"alice": 3}'):
        with pytest.raises(ValueError):
            tokens_from_environment({"MCPSYNC_SERVE_TOKENS": bad})
