"""``mcpsync serve`` on the real stack (Temporal, PostgreSQL, the fixture upstream), with the ``mcp``
Python SDK client on both editions: an upstream change reaches the downstream client as a
notification and the read returns the new bytes with the matching digest; subject B cannot list
or read A's resources; a revocation removes them; bad input gets one clear error each; the
Events extension resumes across a SIGKILL of serve (docs/serve.md)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp_types as types
import pytest
from mcp import Client as McpClient
from mcp import StdioServerParameters
from mcp.shared.exceptions import MCPError
from pydantic import TypeAdapter
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.revocation import revoke
from mcpsync.worker.serve.server import FRESHNESS_META as FRESH
from mcpsync.worker.stack.common import REPO_ROOT
from tests import cli_process
from tests.conftest import eventually, fresh_database, ledger_rows, unique
from tests.e2e.serve_helpers import (
    INSPECTOR,
    TS_CLIENT,
    Seed,
    ServeStack,
    accepted_digests,
    events_poll,
    jsonrpc_result,
    raw_session,
    run_inspector,
    run_node,
    serve_client,
    serve_conf,
    serve_stack_factory,
    ts_lines,
)
from tests.e2e.test_e2e_subscription import _wait_record


def _updated(inbox: list[Any], uri: str) -> int:
    return sum(
        1 for m in inbox if isinstance(m, types.ResourceUpdatedNotification) and str(m.params.uri) == uri
    )


def _list_changed(inbox: list[Any]) -> int:
    return sum(1 for m in inbox if isinstance(m, types.ResourceListChangedNotification))


@pytest.fixture
def serve_stack(
    temporal_client: Client, ledger: Ledger, fx: FixtureProcess, database_url: str, tmp_path: Path
) -> ServeStack:
    """The stack each test serves from: ``serve_stack_factory`` in serve_helpers.py says what it starts."""
    return serve_stack_factory(temporal_client, ledger, fx, database_url, tmp_path)


async def test_both_editions_notify_read_isolate_and_revoke(
    serve_stack: ServeStack, temporal_client: Client, ledger: Ledger, fx: FixtureProcess
) -> None:
    alice, bob = unique("alice"), unique("bob")
    uri_a, uri_b = f"demo://serve/{unique('a')}.md", f"demo://serve/{unique('b')}.md"
    seeds = Seed(alice, uri_a, "# alice one"), Seed(bob, uri_b, "# bob one")
    async with serve_stack(*seeds) as st:
        serve, tokens, server, v1 = st.serve, st.tokens, st.server, st.v1[uri_a]
        legacy_inbox: list[Any] = []
        # No token or an unknown one: 401, nothing listed.
        async with httpx2.AsyncClient() as raw:
            body = {"jsonrpc": "2.0", "id": 1, "method": "resources/list", "params": {}}
            assert (await raw.post(serve.url, json=body)).status_code == 401
            bad = await raw.post(serve.url, json=body, headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401 and b"alice" not in bad.content
        async with (
            serve_client(serve.url, tokens[alice], "legacy", legacy_inbox) as legacy,
            serve_client(serve.url, tokens[alice], "auto") as modern,
            serve_client(serve.url, tokens[bob], "auto") as bob_modern,
            serve_client(serve.url, tokens[bob], "legacy") as bob_legacy,
        ):
            assert legacy.protocol_version == "2025-11-25" and modern.protocol_version == "2026-07-28"
            listed = await modern.list_resources()
            assert [str(r.uri) for r in listed.resources] == [uri_a]
            fresh = (listed.resources[0].meta or {})[FRESH]
            assert fresh["digest"] == v1 and fresh["state"] == "ACTIVE"
            assert fresh["receiptId"] >= 1 and fresh["acceptedAt"] and fresh["verifiedAt"]
            assert "catalogStatus" in fresh and fresh["guardrailRejected"] is False and fresh["fresh"] is True
            assert listed.ttl_ms == 0 and listed.cache_scope == "private"
            first = await legacy.read_resource(uri_a)
            assert isinstance(first.contents[0], types.TextResourceContents)
            assert first.contents[0].text == "# alice one"

            # Subject B sees nothing of A's: not listed, not readable on either edition.
            assert [str(r.uri) for r in (await bob_modern.list_resources()).resources] == [uri_b]
            with pytest.raises(MCPError) as modern_nf:
                await bob_modern.read_resource(uri_a)
            assert modern_nf.value.code == -32602
            with pytest.raises(MCPError) as legacy_nf:
                await bob_legacy.read_resource(uri_a)
            assert legacy_nf.value.code == -32002

            # Bad input: forged cursor, A's cursor presented by B, unknown method.
            with pytest.raises(MCPError) as forged:
                await modern.list_resources(cursor="L.0-1~0.AAAAAAAAAAAAAAAAAAAAAA")
            assert forged.value.code == -32602 and "cursor" in forged.value.message
            start = await events_poll(modern, None)
            with pytest.raises(MCPError) as foreign:
                await events_poll(bob_modern, start["cursor"])
            assert foreign.value.code == -32602

            # An upstream change reaches both editions as a notification; the read has the new bytes.
            with pytest.warns(Warning):
                await legacy.subscribe_resource(uri_a)
            await eventually(lambda: _updated(legacy_inbox, uri_a) == 1, what="the subscribe announcement")
            async with modern.listen(resource_subscriptions=[uri_a]) as sub:
                announced = await asyncio.wait_for(sub.__anext__(), 30)  # the current version, on listen
                assert str(getattr(announced, "uri", "")) == uri_a
                v2 = await fx.edit(uri_a, text="# alice two", mime_type="text/markdown")
                event = await asyncio.wait_for(sub.__anext__(), 30)
                assert str(getattr(event, "uri", "")) == uri_a
                await eventually(lambda: _updated(legacy_inbox, uri_a) >= 2, what="legacy updated")
                for client in (modern, legacy):
                    read = await client.read_resource(uri_a, meta={"io.mcpsync/requireFresh": True})
                    part = read.contents[0]
                    assert isinstance(part, types.TextResourceContents) and part.text == "# alice two"
                    assert (read.meta or {})[FRESH]["digest"] == v2["committed"]["digest"]
                polled = await events_poll(modern, start["cursor"])
                digests = [e["data"]["content_digest"] for e in polled["events"]]
                assert v2["committed"]["digest"] in digests and polled["truncated"] is False
                assert all(e["data"]["subject"] == alice for e in polled["events"])

                # Revocation: listed no more, reads refused, a notification sent.
                before = _list_changed(legacy_inbox)
                await revoke(temporal_client, ledger, subject=alice, server=server.name, uri=None)
                assert (await modern.list_resources()).resources == []
                with pytest.raises(MCPError) as gone:
                    await modern.read_resource(uri_a)
                assert gone.value.code == -32602
                await eventually(lambda: _list_changed(legacy_inbox) > before, what="list_changed on revoke")
            # B is untouched by A's revocation.
            assert [str(r.uri) for r in (await bob_modern.list_resources()).resources] == [uri_b]
    # Logged at INFO (-v), yet no token and no body in the log (read once serve has stopped).
    logged = serve.log.read_text()
    for secret in (*tokens.values(), "# alice one", "# alice two", "# bob one"):
        assert secret not in logged


async def test_events_resume_across_sigkill_of_serve(
    serve_stack: ServeStack, temporal_client: Client, ledger: Ledger, fx: FixtureProcess
) -> None:
    alice = unique("alice")
    uri = f"demo://serve/{unique('k')}.png"
    blob = b"\x89PNG\r\n\x1a\n\x00binary"
    async with serve_stack(Seed(alice, uri, blob=blob, mime_type="image/png")) as st:
        serve, tokens, h, v1 = st.serve, st.tokens, st.handles[uri], st.v1[uri]
        async with serve_client(serve.url, tokens[alice], "auto") as client:
            read = await client.read_resource(uri)
            part = read.contents[0]
            assert isinstance(part, types.BlobResourceContents) and base64.b64decode(part.blob) == blob
            cursor = (await events_poll(client, None))["cursor"]
        expected: list[str] = []
        for i in range(6):
            edit = await fx.edit(uri, blob=blob + bytes([i]) * (i + 1), mime_type="image/png")
            expected.append(edit["committed"]["digest"])
            if i == 2:
                await serve.kill()  # SIGKILL while changes flow
            await asyncio.sleep(0.3)  # models an upstream that changes about three times a second
        await _wait_record(h, lambda r: r.last_accepted_digest == expected[-1], "last version", timeout=60)
        await st.restart_serve()
        serve = st.serve
        seen: list[str] = []
        async with serve_client(serve.url, tokens[alice], "auto") as client:
            while True:
                got = await events_poll(client, cursor, max_events=2)
                assert got["truncated"] is False
                seen += [e["data"]["content_digest"] for e in got["events"]]
                cursor = got["cursor"]
                if not got["hasMore"]:
                    break
            latest = await client.read_resource(uri)
            body = base64.b64decode(latest.contents[0].blob)  # type: ignore[union-attr]
            assert body == blob + bytes([5]) * 6
            assert (latest.meta or {})[FRESH]["digest"] == expected[-1]
        # Every accepted version is in the resumed stream (coalescing may skip an intermediate
        # upstream edit the reconciler never read; the last one is always there).
        accepted = set(await accepted_digests(ledger, alice, uri)) - {v1}
        assert accepted and accepted <= set(seen) and expected[-1] in seen
        assert len(accepted) >= 2, "changes flowed while serve was down"


@pytest.mark.skipif(not INSPECTOR.exists(), reason="scripts/install-npm-servers installs the npm clients")
async def test_typescript_sdk_and_inspector_cli(
    serve_stack: ServeStack, temporal_client: Client, ledger: Ledger, fx: FixtureProcess
) -> None:
    alice, bob = unique("alice"), unique("bob")
    uri = f"demo://serve/{unique('ts')}.md"
    async with serve_stack(Seed(alice, uri, "# ts one"), idle_subjects=(bob,)) as st:
        serve, tokens, server, v1 = st.serve, st.tokens, st.server, st.v1[uri]
        # The TypeScript SDK client (2025-11-25): list, read, subscribe, get the update, read the new
        # bytes.
        ts = await run_node(str(TS_CLIENT), serve.url, tokens[alice], uri)
        lines = await ts_lines(ts, "subscribed")
        assert [ln["step"] for ln in lines] == ["listed", "read", "subscribed"], lines
        assert [r["uri"] for r in lines[0]["resources"]] == [uri]
        assert lines[1]["text"] == "# ts one" and lines[1]["digest"] == v1
        v2 = await fx.edit(uri, text="# ts two", mime_type="text/markdown")
        lines = await ts_lines(ts, "reread")
        assert [ln["step"] for ln in lines] == ["updated", "reread"], lines
        assert lines[0]["notifications"] == 2  # the subscribe's announcement, then the change
        assert lines[1]["text"] == "# ts two" and lines[1]["digest"] == v2["committed"]["digest"]
        assert await ts.wait() == 0
        # Subject B through the TypeScript SDK: not listed, not readable.
        ts_b = await run_node(str(TS_CLIENT), serve.url, tokens[bob], uri)
        lines_b = await ts_lines(ts_b, "error")
        assert lines_b[0]["resources"] == [] and lines_b[1]["step"] == "error", lines_b
        assert "not found" in lines_b[1]["message"].lower()
        await ts_b.wait()

        # The Inspector CLI: list and read as A; B sees nothing of A's.
        rc, out = await run_inspector(serve.url, tokens[alice], "resources/list")
        assert rc == 0 and uri in out and v2["committed"]["digest"] in out, out
        rc, out = await run_inspector(serve.url, tokens[alice], "resources/read", "--uri", uri)
        assert rc == 0 and "# ts two" in out and v2["committed"]["digest"] in out, out
        rc, out = await run_inspector(serve.url, tokens[bob], "resources/list")
        assert rc == 0 and uri not in out, out
        rc, out = await run_inspector(serve.url, tokens[bob], "resources/read", "--uri", uri)
        assert rc != 0 and "# ts two" not in out, out

        # Revocation removes it for the Inspector too.
        await revoke(temporal_client, ledger, subject=alice, server=server.name, uri=None)
        rc, out = await run_inspector(serve.url, tokens[alice], "resources/list")
        assert rc == 0 and uri not in out, out
        rc, out = await run_inspector(serve.url, tokens[alice], "resources/read", "--uri", uri)
        assert rc != 0 and "# ts two" not in out, out


async def test_stdio_and_bad_input(
    serve_stack: ServeStack, temporal_client: Client, ledger: Ledger, fx: FixtureProcess
) -> None:
    alice, mallory = unique("alice"), unique("mallory")
    uri = f"demo://serve/{unique('bad')}.md"
    serve_args = ("--page-size", "1", "--max-age", "1")
    async with serve_stack(
        Seed(alice, uri, "# stdio one"), token_only=(mallory,), serve_args=serve_args
    ) as st:
        serve, tokens, conf = st.serve, st.tokens, st.conf
        # stdio: one configured subject, both editions.
        env = cli_process.without_database_url()
        params = StdioServerParameters(
            command=sys.executable,
            cwd=str(REPO_ROOT),
            env=env,
            args=[
                "-m",
                "mcpsync.worker.cli",
                "--config",
                str(conf),
                "serve",
                "--stdio",
                alice,
                "--consumer",
                unique("serve-stdio"),
            ],
        )
        for mode in ("legacy", "auto"):
            async with McpClient(params, mode=mode, cache=None) as stdio:  # type: ignore[arg-type]
                listed = await stdio.list_resources()
                assert [str(r.uri) for r in listed.resources] == [uri]
                read = await stdio.read_resource(uri)
                assert read.contents[0].text == "# stdio one"  # type: ignore[union-attr]
        auth = {
            "Authorization": f"Bearer {tokens[alice]}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
        }
        async with httpx2.AsyncClient(timeout=30) as raw:
            malformed = await raw.post(serve.url, content=b"{not json", headers=auth)
            assert malformed.status_code in (400, 200) and b"-32700" in malformed.content, malformed.content
            huge = await raw.post(serve.url, content=b"[" + b" " * 2_000_000 + b"]", headers=auth)
            assert huge.status_code == 413, huge.status_code
            # Another subject's token on this session's id: as if no such session, nothing of it leaks.
            session_id = await raw_session(raw, serve.url, auth)
            other = {**auth, "Authorization": f"Bearer {tokens[mallory]}", "mcp-session-id": session_id}
            hijack = await raw.post(
                serve.url, json={"jsonrpc": "2.0", "id": 2, "method": "resources/list"}, headers=other
            )
            assert hijack.status_code == 404 and uri.encode() not in hijack.content, hijack.content
        async with serve_client(serve.url, tokens[alice], "legacy") as client:
            with pytest.raises(MCPError) as unknown:
                await client.session.send_request(_Unknown(params={}), TypeAdapter(dict[str, Any]))
            assert unknown.value.code == -32601
            with pytest.warns(Warning):
                # subscribe/unsubscribe in a loop: nothing piles up
                # (MCPSYNC_SERVE_SUBSCRIBE_LOOP=10000 once)
                for _ in range(int(os.environ.get("MCPSYNC_SERVE_SUBSCRIBE_LOOP", "300"))):
                    await client.subscribe_resource(uri)
                    await client.unsubscribe_resource(uri)
            with pytest.raises(MCPError) as nf:
                with pytest.warns(Warning):
                    await client.subscribe_resource("demo://serve/not-mine")
            assert nf.value.code == -32002
            page = await client.list_resources()
            assert [str(r.uri) for r in page.resources] == [uri] and page.next_cursor is None
            # A client after all of it still reads.
            read = await client.read_resource(uri)
            assert read.contents[0].text == "# stdio one"  # type: ignore[union-attr]
            # Beyond the published staleness bound (--max-age 1): requireFresh is an error, not stale
            # bytes.
            # The bound is wall-clock age: the read is refused once real time passed it.
            async def refused() -> MCPError | None:
                try:
                    await client.read_resource(uri, meta={"io.mcpsync/requireFresh": True})
                except MCPError as exc:
                    return exc
                return None

            stale = await eventually(refused, timeout=30, what="requireFresh refused past the 1 s bound")
            assert stale.code == -32004 and "staleness bound" in stale.message
            assert (await client.read_resource(uri)).contents[0].text == "# stdio one"  # type: ignore[union-attr]


class _Unknown(types.Request[dict[str, Any], Literal["nothing/here"]]):
    method: Literal["nothing/here"] = "nothing/here"
    params: dict[str, Any]


async def test_guardrail_rejected_is_refused_never_the_body(
    serve_stack: ServeStack, temporal_client: Client, ledger: Ledger, fx: FixtureProcess
) -> None:
    alice = unique("alice")
    uri = f"demo://serve/{unique('g')}.md"
    guarded = {"release_max_bytes": 2000}
    async with serve_stack(Seed(alice, uri, "# small"), server_options=guarded) as st:
        serve, tokens, h = st.serve, st.tokens, st.handles[uri]
        async with serve_client(serve.url, tokens[alice], "auto") as client:
            ok = await client.read_resource(uri, meta={"io.mcpsync/requireFresh": True})
            assert ok.contents[0].text == "# small"  # type: ignore[union-attr]
            await fx.edit(uri, text="x" * 5000, mime_type="text/markdown")
            await _wait_record(h, lambda r: "guardrail" in r.detail, "guardrail rejection")

            async def flagged() -> bool:
                listed = await client.list_resources()
                return bool(listed.resources) and (listed.resources[0].meta or {})[FRESH]["guardrailRejected"]

            await eventually(flagged, what="guardrailRejected in the listing")
            with pytest.raises(MCPError) as refused:
                await client.read_resource(uri)
            assert refused.value.code == -32003 and "guardrail" in refused.value.message
            assert "x" * 100 not in str(refused.value.data)


async def test_events_push_stream_delivers_changes_with_cursors(
    serve_stack: ServeStack, temporal_client: Client, ledger: Ledger, fx: FixtureProcess
) -> None:
    alice = unique("alice")
    uri = f"demo://serve/{unique('push')}.md"
    async with serve_stack(Seed(alice, uri, "# push one")) as st:
        serve, tokens, v1 = st.serve, st.tokens, st.v1[uri]
        headers = {
            "Authorization": f"Bearer {tokens[alice]}",
            "Accept": "application/json, text/event-stream",
        }
        async with httpx2.AsyncClient(timeout=60) as raw:
            headers["mcp-session-id"] = await raw_session(raw, serve.url, headers)
            frames: list[dict[str, Any]] = []
            got_v2 = asyncio.Event()
            expect: dict[str, str] = {}
            # The stream resumes from a cursor taken before the edit, so the edit is delivered
            # whenever the stream's first page is read (no race with its start).
            polled = await raw.post(
                serve.url,
                headers=headers,
                json={
                    "jsonrpc": "2.0",
                    "id": 6,
                    "method": "events/poll",
                    "params": {"name": "resource.changed", "cursor": None},
                },
            )
            start_cursor = jsonrpc_result(polled)["cursor"]

            async def read_stream() -> None:
                body = {
                    "jsonrpc": "2.0",
                    "id": 7,
                    "method": "events/stream",
                    "params": {"name": "resource.changed", "cursor": start_cursor},
                }
                async with raw.stream("POST", serve.url, json=body, headers=headers) as resp:
                    assert resp.status_code == 200
                    async for line in resp.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        frame = json.loads(line[5:])
                        frames.append(frame)
                        params = frame.get("params") or {}
                        if frame.get("method") == "notifications/events/event" and params["data"][
                            "content_digest"
                        ] == expect.get("v2"):
                            got_v2.set()

            reader = asyncio.create_task(read_stream())
            v2 = await fx.edit(uri, text="# push two", mime_type="text/markdown")
            expect["v2"] = v2["committed"]["digest"]
            await asyncio.wait_for(got_v2.wait(), 30)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        events = [f["params"] for f in frames if f.get("method") == "notifications/events/event"]
        assert events and all(
            e["name"] == "resource.changed" and e["cursor"] and e["eventId"] for e in events
        )
        assert all(e["_meta"]["subscriptionId"] == 7 for e in events)
        assert v1 not in [e["data"]["content_digest"] for e in events]  # from now on
        # The pushed cursor resumes on poll: nothing after the last pushed event is lost.
        async with serve_client(serve.url, tokens[alice], "auto") as client:
            after = await events_poll(client, events[-1]["cursor"])
            assert after["truncated"] is False and all(
                e["data"]["content_digest"] != expect["v2"] for e in after["events"]
            )


async def test_a_version_accepted_while_nobody_was_connected_is_announced_on_subscribe(
    serve_stack: ServeStack, temporal_client: Client, ledger: Ledger, fx: FixtureProcess
) -> None:
    alice = unique("alice")
    uri = f"demo://serve/{unique('away')}.md"
    async with serve_stack(Seed(alice, uri, "# away one")) as st:
        serve, tokens, h, consumer = st.serve, st.tokens, st.handles[uri], st.consumer
        # v2 is accepted and serve's follower has acknowledged its outbox event while no client is
        # connected: nothing is queued anywhere for the clients below.
        v2 = await fx.edit(uri, text="# away two", mime_type="text/markdown")
        digest = v2["committed"]["digest"]
        await _wait_record(h, lambda r: r.last_accepted_digest == digest, "v2")

        async def acknowledged() -> bool:
            rows = await ledger_rows(
                ledger,
                "SELECT c.position >= o.position FROM outbox_consumers c, outbox o WHERE c.name = %s"
                " AND o.uri = %s AND o.content_digest = %s AND o.position IS NOT NULL",
                consumer,
                uri,
                digest,
            )
            return bool(rows) and bool(rows[0][0])

        await eventually(acknowledged, what="serve acknowledged v2's outbox event")
        inbox: list[Any] = []
        async with serve_client(serve.url, tokens[alice], "legacy", inbox) as legacy:
            with pytest.warns(Warning):
                await legacy.subscribe_resource(uri)
            await eventually(lambda: _updated(inbox, uri) == 1, what="updated on subscribe (2025-11-25)")
            read = await legacy.read_resource(uri)
            assert read.contents[0].text == "# away two"  # type: ignore[union-attr]
            assert (read.meta or {})[FRESH]["digest"] == digest
        async with serve_client(serve.url, tokens[alice], "auto") as modern:
            async with modern.listen(resource_subscriptions=[uri, "demo://serve/not-mine"]) as sub:
                event = await asyncio.wait_for(sub.__anext__(), 30)
                assert str(getattr(event, "uri", "")) == uri  # and nothing for the URI alice does not have
                read = await modern.read_resource(uri)
                assert read.contents[0].text == "# away two"  # type: ignore[union-attr]
                assert (read.meta or {})[FRESH]["digest"] == digest
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(sub.__anext__(), 1.0)  # one announcement, not one per URI asked


def test_serve_without_tokens_is_one_error_line(tmp_path: Path, database_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("MCPSYNC_DATABASE_URL", "MCPSYNC_SERVE_TOKENS")}
    conf = serve_conf(tmp_path, database_url)
    for tokens, expect in (
        (None, "no bearer tokens"),
        ("not json", "MCPSYNC_SERVE_TOKENS must be a JSON object"),
    ):
        run_env = env if tokens is None else {**env, "MCPSYNC_SERVE_TOKENS": tokens}
        r = cli_process.run(["--config", str(conf), "serve"], env=run_env)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and expect in r.stderr, r.stderr
        assert tokens is None or tokens not in r.stderr


async def test_the_benchmark_runs_small(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks.serve import run as bench

    # On a database of the session's server: the benchmark starts a PostgreSQL of its own only without one.
    async with fresh_database(postgres_url) as url:
        monkeypatch.setenv("MCPSYNC_DATABASE_URL", url)
        result = await bench(listeners=3, changes=2, interval=0.5)
    assert result["listeners_missing_notifications"] == 0 and result["listener_notifications"] >= 6
    assert result["serve_read_ms"]["n"] >= 1 and result["direct_read_ms"]["n"] >= 1


@pytest.fixture(autouse=True)
async def _serve_consumers_dropped(ledger: Ledger) -> AsyncIterator[None]:
    """Each serve process registers a durable consumer, which holds outbox retention back for the
    whole database: the test's serve consumers go when the test ends (serve names them serve-*)."""
    yield
    await ledger_rows(ledger, "DELETE FROM outbox_consumers WHERE name LIKE %s", "serve-%")
