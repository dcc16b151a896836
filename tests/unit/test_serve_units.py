"""``mcpsync serve`` pure parts: signed cursors, consistent listing snapshots, coalescing and the
slow-client cut-off, tokens from the environment (docs/serve.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

from mcpsync.activities.ledger.outbox import OutboxEventType, OutboxEventV1
from mcpsync.activities.ledger.proven import Proven
from mcpsync.activities.ledger.serve import ServedResource
from mcpsync.worker.serve import server as serve_module
from mcpsync.worker.serve.cursors import KEY_FILE, BadCursor, CursorSigner
from mcpsync.worker.serve.pending import PendingNotifications
from mcpsync.worker.serve.run import tokens_from_environment
from mcpsync.worker.serve.server import ServeConfig, ServeHub, _Session
from mcpsync.workflows.records.ledger import AcceptVerdict

NOW = datetime(2026, 12, 4, tzinfo=UTC)


def _res(uri: str, **kw: Any) -> ServedResource:
    proven = Proven(state=kw.pop("state", "ACTIVE"), dirty=kw.pop("dirty", False), digest="sha256:x",
                    accepted_receipt_id=1, accepted_ordinal=1, accepted_at=NOW,
                    verified_at=kw.pop("verified_at", NOW),
                    newest_status=AcceptVerdict.ACCEPTED)
    base: dict[str, Any] = dict(workflow_id="w", subject="alice", server="s", uri=uri, body_receipt_id=1,
                                body_at=NOW, ordinal=1, mime_type="text/plain", size=1, name=uri, title=None,
                                proven=proven)
    base.update(kw)
    return ServedResource(**base)


def test_cursors_verify_only_for_their_subject_and_kind() -> None:
    signer = CursorSigner(b"k" * 32)
    cursor = signer.sign("E", "42", "alice")
    assert signer.verify("E", cursor, "alice") == "42"
    edited = cursor[:20] + ("B" if cursor[20] != "B" else "C") + cursor[21:]
    for bad in (edited, cursor[:-2] + ("AA" if not cursor.endswith("AA") else "BB"), "E.42", "x" * 300,
                cursor + ".x", cursor.replace(".", ".=")):
        with pytest.raises(BadCursor):
            signer.verify("E", bad, "alice")
    with pytest.raises(BadCursor):
        signer.verify("E", cursor, "bob")
    with pytest.raises(BadCursor):
        signer.verify("L", cursor, "alice")
    assert CursorSigner(b"other" * 8).sign("E", "42", "alice") != cursor


def test_cursor_keys_rotate_through_previous_and_unknown_keys_are_stale(tmp_path: Path) -> None:
    old, new = b"old-secret-0123456789", b"new-secret-0123456789"
    issued = CursorSigner(old).sign("L", "7-3~50", "alice")
    rotated = CursorSigner.for_serve(tmp_path, {"MCPSYNC_SERVE_SECRET": new.decode(),
                                                "MCPSYNC_SERVE_SECRET_PREVIOUS": old.decode()})
    assert rotated.verify("L", issued, "alice") == "7-3~50"  # the previous key still opens it
    assert rotated.sign("L", "7-3~50", "alice").split(".")[0] != issued.split(".")[0]  # issued under new
    with pytest.raises(BadCursor, match="stale"):
        CursorSigner(new).verify("L", issued, "alice")  # previous key unset: a clean stale cursor
    first = CursorSigner.for_serve(tmp_path / "state", {})  # no secret: the state dir's key file
    assert CursorSigner.for_serve(tmp_path / "state", {}).verify("E", first.sign("E", "1", "a"), "a") == "1"
    assert oct((tmp_path / "state" / KEY_FILE).stat().st_mode & 0o777) == "0o600"
    (tmp_path / "state" / KEY_FILE).write_text("not hex\n")
    with pytest.raises(ValueError, match="remove it to make a new one"):
        CursorSigner.for_serve(tmp_path / "state", {})


def test_fresh_rule() -> None:
    assert _res("a").proven.fresh(None, NOW) == (True, "")
    assert not _res("a", state="RECONCILIATION_REQUIRED").proven.fresh(None, NOW)[0]
    assert "UPDATE_SEEN" in _res("a", dirty=True).proven.fresh(None, NOW)[1]
    old = _res("a", verified_at=NOW - timedelta(seconds=90)).proven
    assert old.fresh(60, NOW)[0] is False and old.fresh(120, NOW)[0] is True
    assert old.due_at(60) == NOW - timedelta(seconds=30) and old.due_at(None) is None


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
    token = "t1-sixteen-chars-or-more"
    assert tokens_from_environment({"MCPSYNC_SERVE_TOKENS": f'{{"alice": "{token}"}}'}) == ((token, "alice"),)
    for bad in ("nope", '["t"]', '{"alice": ""}', '{"alice": 3}', '{"alice": "short"}',
                f'{{"alice": "{token}", "bob": "{token}"}}', f'{{"alice": "{token}", "alice": "{token}-2"}}'):
        with pytest.raises(ValueError) as refused:
            tokens_from_environment({"MCPSYNC_SERVE_TOKENS": bad})
        assert token not in str(refused.value)


def test_token_matching_compares_every_token_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from mcpsync.worker.serve import tokens as serve_tokens

    tokens = serve_tokens.parse_tokens('{"alice": "alice-token-0123456789", "bob": "bob-token-01234567890"}')
    compared: list[bytes] = []
    real = serve_tokens.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append(b)
        return real(a, b)

    monkeypatch.setattr(serve_tokens.hmac, "compare_digest", counting)
    assert serve_tokens.subject_for_authorization(tokens, "Bearer alice-token-0123456789") == "alice"
    assert serve_tokens.subject_for_authorization(tokens, "Bearer nobody-token-0123456789") is None
    assert serve_tokens.subject_for_authorization(tokens, "Basic alice-token-0123456789") is None
    assert len(compared) == 4  # every configured token for each bearer, even after a match
