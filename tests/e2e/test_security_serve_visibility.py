"""Hostile tests of ``mcpsync serve``'s visibility rule and per-subject quotas (docs/security.md, "The MCP
face"; docs/serve.md, "Quotas"): a real serve process over HTTP, real PostgreSQL, the ``mcp`` SDK
clients and raw HTTP. The ledger rows a test serves are written straight into the ledger (no upstream,
no Temporal): subscriptions in each finished state with an accepted version, a body and an outbox
event, then revoked by the ledger's own ``revoke_subject`` (what ``mcpsync revoke`` runs first)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest
import uvicorn
from mcp.shared.exceptions import MCPError

from benchmarks.ledger_seed import seed_version
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.released import ContentRefused, released_content
from mcpsync.activities.ledger.visibility import RULE_FUNCTION
from mcpsync.worker.serve.cursors import CursorSigner
from mcpsync.worker.serve.quota import Quota
from mcpsync.worker.serve.server import ServeConfig, ServeHub, build_server
from tests import cli_process
from tests.conftest import eventually, fresh_database, ledger_rows, unique
from tests.e2e.serve_helpers import (
    ServeProcess,
    events_poll,
    jsonrpc_result,
    raw_session,
    serve_client,
    serve_conf,
)

FINISHED = ("CLOSED", "TOMBSTONED", "UNSUBSCRIBE_UNKNOWN")


async def _seed(ledger: Ledger, subject: str, server: str, state: str, uri: str) -> int:
    """One subscription of ``subject`` in ``state`` with an accepted version, its body and its outbox
    event; the receipt id."""
    return await seed_version(ledger.pool, subject, server, state, uri, f"# {uri} body".encode())


@asynccontextmanager
async def _serve(tmp_path: Path, database_url: str, subjects: list[str], *extra: str
                 ) -> AsyncIterator[tuple[ServeProcess, dict[str, str]]]:
    tokens = {subject: unique("serve-test-token") for subject in subjects}
    serve = await ServeProcess.start(serve_conf(tmp_path, database_url), tokens, consumer=unique("serve"),
                                     extra=extra)
    try:
        yield serve, tokens
    finally:
        await serve.stop()


async def test_revoked_is_not_revoked_in_the_mcp_face(ledger: Ledger, database_url: str, tmp_path: Path
                                                      ) -> None:
    """After a whole-subject revoke (alice) and a per-URI revoke (carol), serve lists none of
    the revoked scope in any state, refuses read, subscribe and listen priming for it, replays none of
    its events, and a listing cursor taken before the revoke no longer pages it; bob is unaffected."""
    alice, carol, bob, server = unique("alice"), unique("carol"), unique("bob"), unique("srv")
    async with _serve(tmp_path, database_url, [alice, carol, bob], "--page-size", "2") as (serve, tokens):
        async with AsyncExitStack() as stack:
            client = {s: await stack.enter_async_context(serve_client(serve.url, tokens[s], "auto"))
                      for s in (alice, carol, bob)}
            legacy = await stack.enter_async_context(serve_client(serve.url, tokens[alice], "legacy"))
            start = {s: (await events_poll(client[s], None))["cursor"] for s in (alice, carol)}
            alice_uris = [f"demo://vis/{unique(state.lower())}" for state in ("ACTIVE", *FINISHED, "REVOKED")]
            for uri, state in zip(alice_uris, ("ACTIVE", *FINISHED, "REVOKED"), strict=True):
                await _seed(ledger, alice, server, state, uri)
            carol_gone, carol_kept = f"demo://vis/{unique('gone')}", f"demo://vis/{unique('kept')}"
            await _seed(ledger, carol, server, "CLOSED", carol_gone)
            await _seed(ledger, carol, server, "ACTIVE", carol_kept)
            bob_uri = f"demo://vis/{unique('bob')}"
            await _seed(ledger, bob, server, "CLOSED", bob_uri)

            first = await client[alice].list_resources()  # a snapshot of 4 (REVOKED is never listed)
            assert len(first.resources) == 2 and first.next_cursor
            now = datetime.now(UTC)
            await ledger.fence.revoke_subject(alice, server, None, reason="test", effective_at=now)
            await ledger.fence.revoke_subject(carol, server, carol_gone, reason="test", effective_at=now)

            assert (await client[alice].list_resources()).resources == []
            old_page = await client[alice].list_resources(cursor=first.next_cursor)
            assert old_page.resources == [], [str(r.uri) for r in old_page.resources]
            for uri in alice_uris:
                with pytest.raises(MCPError) as read:
                    await client[alice].read_resource(uri)
                assert read.value.code == -32602, uri
                with pytest.raises(MCPError) as subscribe, pytest.warns(Warning):
                    await legacy.subscribe_resource(uri)
                assert subscribe.value.code == -32002, uri
            polled = (await events_poll(client[alice], start[alice]))["events"]
            assert {e["data"]["event_type"] for e in polled} == {"revoked"}, polled
            assert [str(r.uri) for r in (await client[carol].list_resources()).resources] == [carol_kept]
            with pytest.raises(MCPError):
                await client[carol].read_resource(carol_gone)
            # Listen primes only what carol may see: the revoked URI, named first, is not announced.
            async with client[carol].listen(resource_subscriptions=[carol_gone, carol_kept]) as sub:
                announced = await asyncio.wait_for(sub.__anext__(), 30)
                assert str(getattr(announced, "uri", "")) == carol_kept
            carol_events = (await events_poll(client[carol], start[carol]))["events"]
            assert [e["data"]["uri"] for e in carol_events if e["data"]["event_type"] != "revoked"] == [
                carol_kept]
            # Bob is untouched: his CLOSED subscription is still listed and readable.
            assert [str(r.uri) for r in (await client[bob].list_resources()).resources] == [bob_uri]
            read = await client[bob].read_resource(bob_uri)
            assert getattr(read.contents[0], "text", None) == f"# {bob_uri} body"


async def test_the_visibility_rule_has_one_definition_read_by_content_get_and_serve(
    postgres_url: str, tmp_path: Path
) -> None:
    """One rule: redefining ``mcpsync_version_visible`` (on a database of its own) changes
    what ``released_content`` (``content get``) releases and what serve lists, reads and replays alike."""
    from mcpsync.worker.main.connect import open_ledger

    async with fresh_database(postgres_url) as url:
        own = await open_ledger(url, max_size=2)
        try:
            alice, server, uri = unique("alice"), unique("srv"), f"demo://rule/{unique('doc')}"
            async with _serve(tmp_path, url, [alice]) as (serve, tokens):
                async with serve_client(serve.url, tokens[alice], "auto") as client:
                    start = (await events_poll(client, None))["cursor"]
                    receipt = await _seed(own, alice, server, "ACTIVE", uri)
                    assert (await released_content(own.pool, receipt_id=receipt, subject=alice)).size > 0
                    assert [str(r.uri) for r in (await client.list_resources()).resources] == [uri]
                    async with own.pool.connection() as conn:
                        await conn.execute(
                            f"CREATE OR REPLACE FUNCTION {RULE_FUNCTION}(wf text, s text, srv text, u text,"
                            " at timestamptz) RETURNS boolean LANGUAGE sql STABLE"
                            " SET search_path = pg_catalog, public, pg_temp AS $$ SELECT u <> "
                            + "'" + uri + "'" + " $$")
                    with pytest.raises(ContentRefused):
                        await released_content(own.pool, receipt_id=receipt, subject=alice)
                    assert (await client.list_resources()).resources == []
                    with pytest.raises(MCPError):
                        await client.read_resource(uri)
                    assert (await events_poll(client, start))["events"] == []
        finally:
            await own.pool.close()


async def test_a_consumer_role_sees_no_receipt_the_rule_hides(ledger: Ledger, database_url: str) -> None:
    """The consumer role's policies: a member of mcpsync_consumer mapped to alice stops
    seeing her CLOSED subscription's receipt once her scope is revoked (the same function decides)."""
    alice, server, role = unique("alice"), unique("srv"), unique("reader").replace("-", "_")
    receipt = await _seed(ledger, alice, server, "CLOSED", f"demo://vis/{unique('doc')}")
    kept = await _seed(ledger, alice, unique("other"), "ACTIVE", f"demo://vis/{unique('doc')}")
    await ledger_rows(ledger, f'CREATE ROLE "{role}" NOLOGIN')
    try:
        await ledger_rows(ledger, f'GRANT mcpsync_consumer TO "{role}"')
        await ledger_rows(ledger, "INSERT INTO consumer_subjects (role_name, subject) VALUES (%s, %s)",
                          role, alice)
        await ledger.fence.revoke_subject(alice, server, None, reason="test", effective_at=datetime.now(UTC))
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(f'SET ROLE "{role}"')
            cur = await conn.execute("SELECT receipt_id FROM resource_versions WHERE subject = %s", (alice,))
            assert {int(r[0]) for r in await cur.fetchall()} == {kept}, f"{receipt} is revoked"
    finally:
        await ledger_rows(ledger, "DELETE FROM consumer_subjects WHERE role_name = %s", role)
        await ledger_rows(ledger, f'DROP OWNED BY "{role}"')
        await ledger_rows(ledger, f'DROP ROLE IF EXISTS "{role}"')


def _mcp_error(exc: BaseException) -> MCPError:
    """The MCPError inside ``exc`` (the SDK client wraps one raised at initialize in exception groups)."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    assert isinstance(exc, MCPError), repr(exc)
    return exc


def _rpc(id_: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


async def _open_stream(raw: httpx2.AsyncClient, url: str, headers: dict[str, str], cursor: str | None,
                       id_: int, frames: list[dict[str, Any]]) -> None:
    """One events/stream request read until cancelled; every SSE frame (or JSON reply) into ``frames``."""
    async with raw.stream("POST", url, json=_rpc(id_, "events/stream", {"name": "resource.changed",
                                                                       "cursor": cursor}),
                          headers=headers) as resp:
        if resp.headers.get("content-type", "").startswith("application/json"):
            frames.append(json.loads(await resp.aread()))
            return
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                frames.append(json.loads(line[5:]))


def _quota_error(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    return next((f["error"] for f in frames if "error" in f), None)


def _got_event(frames: list[dict[str, Any]]) -> bool:
    return any(f.get("method") == "notifications/events/event" for f in frames)


async def test_one_subject_cannot_deny_listen_or_event_streams_to_another(
    ledger: Ledger, database_url: str, tmp_path: Path
) -> None:
    """Listens, URIs per listen, event streams, listing snapshots and sessions are counted per
    subject: alice's quota+1 of each is refused (-32005 naming the quota; snapshots: her oldest cursor is
    refused) while bob opens his own; a stream that ends gives its slot back."""
    alice, bob, server = unique("alice"), unique("bob"), unique("srv")
    quotas = ("--max-listens", "2", "--max-listen-uris", "3", "--max-event-streams", "2",
              "--max-snapshots", "1", "--max-sessions", "2", "--page-size", "1")
    async with _serve(tmp_path, database_url, [alice, bob], *quotas) as (serve, tokens):
        uris = {s: [f"demo://quota/{unique('a')}", f"demo://quota/{unique('b')}"] for s in (alice, bob)}
        async with AsyncExitStack() as stack:
            client = {s: await stack.enter_async_context(serve_client(serve.url, tokens[s], "auto"))
                      for s in (alice, bob)}
            start = {s: (await events_poll(client[s], None))["cursor"] for s in (alice, bob)}
            for subject in (alice, bob):
                for uri in uris[subject]:
                    await _seed(ledger, subject, server, "ACTIVE", uri)

            # Listens: two of alice's are live (primed); a third, and one naming 4 URIs, are refused.
            for _ in range(2):
                listen = client[alice].listen(resource_subscriptions=uris[alice])
                sub = await stack.enter_async_context(listen)
                await asyncio.wait_for(sub.__anext__(), 30)
            with pytest.raises(MCPError) as third:
                async with client[alice].listen(resource_subscriptions=uris[alice]):
                    pass
            assert third.value.code == -32005 and third.value.data == {"quota": "listens", "limit": 2}
            with pytest.raises(MCPError) as wide:
                async with client[bob].listen(resource_subscriptions=[*uris[bob], "a://1", "a://2"]):
                    pass
            assert wide.value.code == -32005 and wide.value.data == {"quota": "listen_uris", "limit": 3}
            async with client[bob].listen(resource_subscriptions=uris[bob]) as bob_sub:
                assert str(getattr(await asyncio.wait_for(bob_sub.__anext__(), 30), "uri", "")) in uris[bob]

            # Listing snapshots: alice's second listing drops her first; bob's does not drop hers.
            first = await client[alice].list_resources()
            second = await client[alice].list_resources()
            assert first.next_cursor and second.next_cursor
            with pytest.raises(MCPError) as expired:
                await client[alice].list_resources(cursor=first.next_cursor)
            assert expired.value.code == -32602 and "snapshot" in expired.value.message
            assert (await client[bob].list_resources()).next_cursor
            assert len((await client[alice].list_resources(cursor=second.next_cursor)).resources) == 1

            # Sessions (2025-11-25): alice's third is refused, bob still opens his.
            for _ in range(2):
                await (await stack.enter_async_context(
                    serve_client(serve.url, tokens[alice], "legacy"))).list_resources()
            # Refused at initialize: the error comes out of the client's task groups.
            with pytest.raises(BaseExceptionGroup) as sessions:
                async with serve_client(serve.url, tokens[alice], "legacy") as third_session:
                    await third_session.list_resources()
            refused = _mcp_error(sessions.value)
            assert refused.code == -32005 and refused.data == {"quota": "sessions", "limit": 2}
            async with serve_client(serve.url, tokens[bob], "legacy") as bob_legacy:
                assert len((await bob_legacy.list_resources()).resources) == 1

        # Event streams: two of alice's deliver her events; a third is refused; bob's still delivers;
        # once one of alice's ends, its slot is free again.
        async with httpx2.AsyncClient(timeout=60) as raw:
            headers = {s: {"Authorization": f"Bearer {tokens[s]}",
                           "Accept": "application/json, text/event-stream"} for s in (alice, bob)}
            for s in (alice, bob):
                headers[s]["mcp-session-id"] = await raw_session(raw, serve.url, headers[s])
            frames: list[list[dict[str, Any]]] = [[] for _ in range(5)]
            streams = [asyncio.create_task(_open_stream(raw, serve.url, headers[alice], start[alice], 10 + i,
                                                        frames[i])) for i in range(2)]
            try:
                for i in range(2):
                    await eventually(lambda i=i: _got_event(frames[i]), what=f"alice's stream {i}")
                await _open_stream(raw, serve.url, headers[alice], start[alice], 12, frames[2])
                assert _quota_error(frames[2]) == {"code": -32005, "message":
                                                   "Quota exceeded: at most 2 event streams per subject",
                                                   "data": {"quota": "event_streams", "limit": 2}}
                streams.append(asyncio.create_task(
                    _open_stream(raw, serve.url, headers[bob], start[bob], 13, frames[3])))
                await eventually(lambda: _got_event(frames[3]), what="bob's stream")
                # Alice ends her first stream (notifications/cancelled, as an SDK client does): the
                # slot comes back, and a new stream of hers is served.
                await raw.post(serve.url, headers=headers[alice], json={
                    "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 10}})
                await asyncio.wait_for(streams[0], 30)
                for attempt in range(100):
                    frames[4].clear()
                    streams.append(asyncio.create_task(
                        _open_stream(raw, serve.url, headers[alice], start[alice], 14 + attempt, frames[4])))
                    await eventually(lambda: _got_event(frames[4]) or _quota_error(frames[4]),
                                     what="a stream or its refusal")
                    if _got_event(frames[4]):
                        break
                    await asyncio.sleep(0.05)  # the cancellation reaches the handler asynchronously
                assert _got_event(frames[4]) and _quota_error(frames[4]) is None
            finally:
                for task in streams:
                    task.cancel()
                await asyncio.gather(*streams, return_exceptions=True)
            polled = jsonrpc_result(await raw.post(serve.url, headers=headers[bob], json=_rpc(
                20, "events/poll", {"name": "resource.changed", "cursor": start[bob]})))
            assert len(polled["events"]) == 2



def test_a_quota_below_one_is_one_error_line(tmp_path: Path, database_url: str) -> None:
    tokens = json.dumps({"a": unique("serve-test-token")})
    env = {**cli_process.without_database_url(), "MCPSYNC_SERVE_TOKENS": tokens}
    conf = str(serve_conf(tmp_path, database_url))
    for flag, value in (("--max-listens", "0"), ("--max-event-streams", "-1"), ("--max-sessions", "nan")):
        r = cli_process.run(["--config", conf, "serve", flag, value], env=env)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith("mcpsync: error:"), \
            r.stderr


async def test_every_registration_of_a_stream_is_released_when_it_ends(ledger: Ledger) -> None:
    """Memory released: serve's hub in this process (real HTTP, uvicorn, SDK clients): while
    alice's listens, event streams and 2025-11-25 session are open they hold quota slots, listen
    handlers and listeners on her bus; once each has ended, nothing is held for her any more."""
    alice, token = unique("alice"), unique("serve-test-token")
    config = ServeConfig(tokens=((token, alice),))
    hub = ServeHub(config, ledger.pool, CursorSigner(os.urandom(32)))
    app = build_server(hub).streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    uv = uvicorn.Server(uvicorn.Config(app, lifespan="on", log_config=None, access_log=False,
                                       timeout_graceful_shutdown=1))
    serving = asyncio.create_task(uv.serve(sockets=[sock]))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    try:
        await eventually(lambda: uv.started, what="uvicorn")
        async with AsyncExitStack() as stack:
            modern = await stack.enter_async_context(serve_client(url, token, "auto"))
            legacy = await stack.enter_async_context(serve_client(url, token, "legacy"))
            await legacy.list_resources()
            for _ in range(2):
                await stack.enter_async_context(modern.listen(resource_subscriptions=["demo://none"]))
            headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
            raw = await stack.enter_async_context(httpx2.AsyncClient(timeout=60))
            headers["mcp-session-id"] = await raw_session(raw, url, headers)
            frames: list[dict[str, Any]] = []
            streams = [asyncio.create_task(_open_stream(raw, url, headers, None, 30 + i, frames))
                       for i in range(2)]
            await eventually(lambda: hub.quotas.live(Quota.EVENT_STREAMS, alice) == 2, what="two streams")
            assert hub.quotas.live(Quota.LISTENS, alice) == 2 and hub.quotas.live(Quota.SESSIONS, alice) == 2
            assert hub.live_registrations() > 6
            for i in range(2):
                await raw.post(url, headers=headers, json={
                    "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 30 + i}})
            await asyncio.wait_for(asyncio.gather(*streams), 30)
            # Each stream's last frame is its answer: cancelled, not refused (heartbeats come before it).
            assert [f["error"]["code"] for f in frames if "error" in f] == [-32800, -32800], frames
            await raw.delete(url, headers=headers)  # the session ends as a client ends it
        await eventually(lambda: hub.live_registrations() == 0, what="every registration released")
    finally:
        uv.should_exit = True
        await asyncio.wait_for(serving, 10)
