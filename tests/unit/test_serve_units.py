"""``mcpsync serve`` pure parts: signed cursors, consistent listing snapshots, the slow-client cut-off,
tokens from the environment (docs/serve.md)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from mcpsync.activities.outbox import OutboxEventType, OutboxEventV1
from mcpsync.worker import serve as serve_module
from mcpsync.worker.serve import ServeConfig, ServeHub, _Session
from mcpsync.worker.serve_cursors import BadCursor, CursorSigner
from mcpsync.worker.serve_ledger import ServedResource
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

    monkeypatch.setattr(serve_module, "list_served", fake_list)
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


async def test_a_slow_legacy_client_is_cut_off_with_a_reason() -> None:
    hub = ServeHub(ServeConfig(client_buffer=3), pool=None, signer=CursorSigner(b"k" * 32))  # type: ignore[arg-type]
    session = _Session(1, connection=None, subject="alice", queue=asyncio.Queue(maxsize=3))  # type: ignore[arg-type]
    session.subscriptions.add("demo://a")
    fast = _Session(2, connection=None, subject="alice", queue=asyncio.Queue(maxsize=100))  # type: ignore[arg-type]
    fast.subscriptions.add("demo://a")
    hub.sessions = {1: session, 2: fast}
    event = OutboxEventV1(event_type=OutboxEventType.VERSION_ACCEPTED, position=1, outbox_id=1,
                          subject="alice", server="s", uri="demo://a", workflow_id="w", receipt_id=1,
                          read_ordinal=1, content_digest="d", previous_digest="c", mime_type=None, size=None,
                          edition=None, server_name=None, server_version=None, accepted_at=None, trigger=None,
                          invalidates=None, reason=None, created_at=NOW)
    for _ in range(5):
        await hub.announce(event)
    assert session.cut_off is not None and "cut off" in session.cut_off
    assert session.subscriptions == set()
    kind, reason = session.queue.get_nowait()
    assert kind == "cut_off" and reason == session.cut_off and session.queue.empty()
    assert fast.cut_off is None and fast.queue.qsize() == 5  # the others are not held up
    assert hub.stats["cut_off"] == 1


def test_tokens_from_environment() -> None:
    assert tokens_from_environment({}) == ()
    assert tokens_from_environment({"MCPSYNC_SERVE_TOKENS": '{"alice": "t1"}'}) == (("t1", "alice"),)
    for bad in ("nope", '["t"]', '{"alice": ""}', '{"alice": 3}'):
        with pytest.raises(ValueError):
            tokens_from_environment({"MCPSYNC_SERVE_TOKENS": bad})
