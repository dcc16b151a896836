"""The fixture MCP server over real transports (streamable HTTP and stdio, both editions).

Every assertion compares what a real ``mcp.Client`` (cache off) observes with what the
control plane says it committed. Barriers come from ``/stats`` (subscribe acknowledged,
GET stream open, notifications delivered), never from sleeps.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from mcpsync.activities.mcp_session import read_digest
from mcpsync.fixture import FixtureControl, FixtureProcess, stdio_command, wait_ready_file

pytestmark = pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")

TOKENS = {"alice": "tok-alice", "bob": "tok-bob"}
MODES = ("legacy", "auto")
EDITION = {"legacy": "2025-11-25", "auto": "2026-07-28"}
NOT_FOUND = {"legacy": -32002, "auto": -32602}


# -- helpers ---------------------------------------------------------------------------
class Inbox:
    """Collects server notifications delivered to a legacy client's message handler."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._changed = asyncio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ServerNotification | types.ResourceUpdatedNotification):
            self.items.append(message)
            self._changed.set()

    def updated(self, uri: str) -> list[Any]:
        return [
            m
            for m in self.items
            if getattr(m, "method", "") == "notifications/resources/updated" and m.params.uri == uri
        ]

    def list_changed(self) -> list[Any]:
        return [m for m in self.items if getattr(m, "method", "") == "notifications/resources/list_changed"]

    async def wait(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()


@asynccontextmanager
async def http_client(
    fx: FixtureProcess, mode: str, token: str | None = None, inbox: Inbox | None = None
) -> AsyncIterator[Client]:
    async with AsyncExitStack() as stack:
        if token is None:
            target: Any = fx.mcp_url
        else:
            hc = await stack.enter_async_context(
                create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
            )
            target = streamable_http_client(fx.mcp_url, http_client=hc)
        client = await stack.enter_async_context(Client(target, mode=mode, cache=None, message_handler=inbox))
        assert client.protocol_version == EDITION[mode]
        yield client


@asynccontextmanager
async def stdio_client(
    tmp_path: Path, mode: str, inbox: Inbox | None = None, subject: str | None = None, **opts: Any
) -> AsyncIterator[tuple[Client, FixtureControl]]:
    ready = tmp_path / f"stdio-{mode}-{subject}.ready.json"
    ready.unlink(missing_ok=True)
    command, env = stdio_command(ready_file=ready, subject=subject, **opts)
    params = StdioServerParameters(command=command[0], args=command[1:], env=env)
    async with Client(params, mode=mode, cache=None, message_handler=inbox) as client:
        info = await wait_ready_file(ready)
        assert info["mcp_url"] is None
        async with FixtureControl(info["control_url"]) as control:
            yield client, control


async def list_all(client: Client) -> tuple[list[types.Resource], list[str]]:
    resources: list[types.Resource] = []
    cursors: list[str] = []
    cursor: str | None = None
    while True:
        page = await client.list_resources(cursor=cursor)
        resources.extend(page.resources)
        if not page.next_cursor:
            return resources, cursors
        cursor = page.next_cursor
        cursors.append(cursor)
        assert len(cursors) < 100, "cursor loop"


# -- fixtures ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
async def fx(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FixtureProcess]:
    proc = await FixtureProcess.start_http(tmp_path_factory.mktemp("fixture"), tokens=TOKENS)
    try:
        yield proc
    finally:
        await proc.stop()


@pytest.fixture
async def clean_faults(fx: FixtureProcess) -> AsyncIterator[None]:
    await fx.faults(reset=True)
    yield
    await fx.faults(reset=True)


# -- capabilities ------------------------------------------------------------------------
async def test_capabilities_exact_on_http_all_combos(tmp_path: Path) -> None:
    combos = [(s, lc) for s in (True, False) for lc in (True, False)]
    procs = await asyncio.gather(
        *(
            FixtureProcess.start_http(tmp_path / f"c{i}", subscribe=s, list_changed=lc)
            for i, (s, lc) in enumerate(combos)
        )
    )
    try:
        for (subscribe, list_changed), proc in zip(combos, procs, strict=True):
            await proc.create("cap://r", text="x")
            for mode in MODES:
                async with http_client(proc, mode) as client:
                    caps = client.server_capabilities.resources
                    assert caps is not None
                    assert (caps.subscribe, caps.list_changed) == (subscribe, list_changed), (mode, caps)
                    if mode == "legacy" and not subscribe:
                        with pytest.raises(MCPError) as err:
                            await client.subscribe_resource("cap://r")
                        assert err.value.code == -32601
                    if mode == "auto" and not (subscribe or list_changed):
                        with pytest.raises(MCPError) as err:
                            async with client.listen(resource_subscriptions=["cap://r"]):
                                pass
                        assert err.value.code == -32601
                    elif mode == "auto":
                        async with client.listen(
                            resource_subscriptions=["cap://r"], resources_list_changed=True
                        ) as sub:
                            assert bool(sub.honored.resource_subscriptions) == subscribe
                            assert bool(sub.honored.resources_list_changed) == list_changed
    finally:
        await asyncio.gather(*(p.stop() for p in procs))


async def test_reject_subscribe_fault_lies_about_capability(fx: FixtureProcess, clean_faults: None) -> None:
    await fx.faults(reject_subscribe=True)
    async with http_client(fx, "legacy") as client:
        assert client.server_capabilities.resources and client.server_capabilities.resources.subscribe
        with pytest.raises(MCPError) as err:
            await client.subscribe_resource("lie://r")
        assert err.value.code == -32603
    async with http_client(fx, "auto") as client:
        with pytest.raises(MCPError):
            async with client.listen(resource_subscriptions=["lie://r"]):
                pass
    assert (await fx.stats())["subscribe_calls"]["lie://r"] == 1


# -- catalog and content -------------------------------------------------------------------
async def test_pagination_opaque_cursors(tmp_path: Path) -> None:
    proc = await FixtureProcess.start_http(tmp_path, page_size=2)
    try:
        uris = [f"page://item/{i}" for i in range(5)]
        for uri in uris:
            await proc.create(uri, text=uri)
        for mode in MODES:
            async with http_client(proc, mode) as client:
                resources, cursors = await list_all(client)
                assert [r.uri for r in resources] == uris
                assert len(cursors) == 2
                for cursor in cursors:
                    assert not cursor.isdigit()
                    assert json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))["o"] > 0
                with pytest.raises(MCPError) as err:
                    await client.list_resources(cursor="not-a-cursor")
                assert err.value.code == -32602
    finally:
        await proc.stop()


async def test_read_digest_matches_control_plane(fx: FixtureProcess) -> None:
    text = await fx.create("digest://text", text="héllo wörld\n", mime_type="text/markdown")
    blob = await fx.create("digest://blob", blob=bytes(range(256)), mime_type="application/octet-stream")
    assert text["committed"]["exists"] and blob["committed"]["kind"] == "blob"
    for mode in MODES:
        async with http_client(fx, mode) as client:
            for committed in (text["committed"], blob["committed"]):
                result = await client.read_resource(committed["uri"])
                assert result.contents[0].uri == committed["uri"]
                assert result.contents[0].mime_type == committed["mime_type"]
                assert read_digest(result) == committed["digest"]
    assert (await fx.resource("digest://blob"))["digest"] == blob["committed"]["digest"]


async def test_uri_kept_exact(fx: FixtureProcess) -> None:
    await fx.create("Exact://Host/Path/", text="a")
    await fx.create("exact://host/path", text="b")
    async with http_client(fx, "legacy") as client:
        listed = {r.uri for r in (await list_all(client))[0]}
        assert {"Exact://Host/Path/", "exact://host/path"} <= listed
        assert (await client.read_resource("Exact://Host/Path/")).contents[0].text == "a"  # type: ignore[union-attr]


async def test_not_found_and_delete_restore_both_editions(fx: FixtureProcess) -> None:
    created = await fx.create("gone://r", text="soon gone")
    deleted = await fx.delete("gone://r")
    assert deleted["mutation_id"] > created["mutation_id"]
    assert deleted["committed"] == {**deleted["committed"], "exists": False, "digest": None}
    for mode in MODES:
        async with http_client(fx, mode) as client:
            for uri in ("gone://r", "never://existed"):
                with pytest.raises(MCPError) as err:
                    await client.read_resource(uri)
                assert err.value.code == NOT_FOUND[mode]
                assert err.value.data == {"uri": uri}
    restored = await fx.restore("gone://r")
    assert restored["committed"]["digest"] == created["committed"]["digest"]
    async with http_client(fx, "auto") as client:
        assert read_digest(await client.read_resource("gone://r")) == created["committed"]["digest"]


async def test_templates_list(fx: FixtureProcess) -> None:
    async with http_client(fx, "auto") as client:
        result = await client.list_resource_templates()
        assert result.resource_templates[0].uri_template == "demo://docs/{name}"


# -- notifications -----------------------------------------------------------------------
async def test_legacy_subscribe_update_read_http(fx: FixtureProcess) -> None:
    uri = "sub://legacy"
    await fx.create(uri, text="v1")
    inbox = Inbox()
    async with http_client(fx, "legacy", inbox=inbox) as client:
        await client.subscribe_resource(uri)
        stats = await fx.wait_subscribed(uri)
        session = next(s for s in stats["sessions"] if uri in s["subscriptions"])
        assert session["edition"] == "2025-11-25" and session["subject"] == "anonymous"
        edit = await fx.edit(uri, text="v2")
        await inbox.wait(lambda: len(inbox.updated(uri)) >= 1)
        assert read_digest(await client.read_resource(uri)) == edit["committed"]["digest"]
        await client.unsubscribe_resource(uri)
        await fx.wait_stats(lambda s: uri not in s["subscriptions"])


async def test_listen_resource_updated_2026_http(fx: FixtureProcess) -> None:
    uri = "sub://modern"
    await fx.create(uri, text="v1")
    async with http_client(fx, "auto") as client, client.listen(resource_subscriptions=[uri]) as sub:
        assert sub.honored.resource_subscriptions == [uri]
        stats = await fx.stats()
        assert stats["listen_subscriptions"][uri] == 1
        edit = await fx.edit(uri, text="v2")
        event = await asyncio.wait_for(sub.__anext__(), 5)
        assert event.uri == uri  # type: ignore[union-attr]
        assert read_digest(await client.read_resource(uri)) == edit["committed"]["digest"]


async def test_list_changed_on_create_both_editions(fx: FixtureProcess) -> None:
    inbox = Inbox()
    async with http_client(fx, "legacy", inbox=inbox) as legacy, http_client(fx, "auto") as modern:
        await fx.wait_stats(lambda s: any(x["standalone_stream"] for x in s["sessions"]))
        async with modern.listen(resources_list_changed=True) as sub:
            await fx.create("catalog://new", text="new")
            await inbox.wait(lambda: len(inbox.list_changed()) >= 1)
            event = await asyncio.wait_for(sub.__anext__(), 5)
            assert type(event).__name__ == "ResourcesListChanged"
        assert "catalog://new" in {r.uri for r in (await list_all(legacy))[0]}
        # A content-only edit is not a catalog change.
        before = len(inbox.list_changed())
        await fx.edit("catalog://new", text="new content")
        await fx.wait_notified()
        assert len(inbox.list_changed()) == before


async def test_stdio_both_editions(tmp_path: Path) -> None:
    uri = "stdio://r"
    inbox = Inbox()
    async with stdio_client(tmp_path, "legacy", inbox=inbox, subject="alice") as (client, ctl):
        caps = client.server_capabilities.resources
        assert caps is not None and caps.subscribe and caps.list_changed
        created = await ctl.create(uri, text="v1", visible_to=["alice"])
        assert read_digest(await client.read_resource(uri)) == created["committed"]["digest"]
        with pytest.raises(MCPError) as err:
            await client.read_resource("stdio://missing")
        assert (err.value.code, err.value.data) == (-32002, {"uri": "stdio://missing"})
        await client.subscribe_resource(uri)
        stats = await ctl.wait_subscribed(uri)
        assert stats["sessions"][0]["subject"] == "alice" and stats["sessions"][0]["transport"] == "stdio"
        edit = await ctl.edit(uri, text="v2")
        await inbox.wait(lambda: len(inbox.updated(uri)) >= 1)
        assert read_digest(await client.read_resource(uri)) == edit["committed"]["digest"]
    async with stdio_client(tmp_path, "auto", subscribe=False) as (client, ctl):
        caps = client.server_capabilities.resources
        assert caps is not None and caps.subscribe is False and caps.list_changed is True
        await ctl.create(uri, text="v1", visible_to=["alice"])
        with pytest.raises(MCPError) as err:
            await client.read_resource(uri)  # stdio subject is anonymous here
        assert (err.value.code, err.value.data) == (-32602, {"uri": uri})
        async with client.listen(resources_list_changed=True, resource_subscriptions=[uri]) as sub:
            assert not sub.honored.resource_subscriptions
            await ctl.create("stdio://other", text="x")
            event = await asyncio.wait_for(sub.__anext__(), 5)
            assert type(event).__name__ == "ResourcesListChanged"


# -- subjects ------------------------------------------------------------------------------
async def test_subject_visibility_over_http(fx: FixtureProcess) -> None:
    uri = "secret://alice-only"
    created = await fx.create(uri, text="for alice", visible_to=["alice"])
    alice_inbox, bob_inbox = Inbox(), Inbox()
    async with (
        http_client(fx, "legacy", token=TOKENS["alice"], inbox=alice_inbox) as alice,
        http_client(fx, "legacy", token=TOKENS["bob"], inbox=bob_inbox) as bob,
    ):
        assert uri in {r.uri for r in (await list_all(alice))[0]}
        assert uri not in {r.uri for r in (await list_all(bob))[0]}
        assert read_digest(await alice.read_resource(uri)) == created["committed"]["digest"]
        with pytest.raises(MCPError) as err:
            await bob.read_resource(uri)
        assert err.value.code == -32002
        await alice.subscribe_resource(uri)
        await bob.subscribe_resource(uri)
        stats = await fx.wait_subscribed(uri, count=2)
        assert {s["subject"] for s in stats["sessions"] if uri in s["subscriptions"]} == {"alice", "bob"}
        await fx.edit(uri, text="for alice v2")
        await alice_inbox.wait(lambda: len(alice_inbox.updated(uri)) >= 1)
        await fx.wait_notified()
        assert bob_inbox.updated(uri) == [] and bob_inbox.list_changed() == []
        # Granting bob changes bob's catalog only.
        await fx.set_visibility(uri, ["alice", "bob"])
        await bob_inbox.wait(lambda: len(bob_inbox.list_changed()) >= 1)
        assert (await bob.read_resource(uri)).contents
        await fx.wait_notified()
        assert alice_inbox.list_changed() == []
    async with http_client(fx, "auto", token=TOKENS["bob"]) as bob_modern:
        assert read_digest(await bob_modern.read_resource(uri)) == (await fx.resource(uri))["digest"]


async def test_require_auth_rejects_unknown_tokens(tmp_path: Path) -> None:
    proc = await FixtureProcess.start_http(tmp_path, tokens=TOKENS, require_auth=True)
    try:
        async with httpx2.AsyncClient() as raw:
            body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            assert (await raw.post(proc.mcp_url, json=body)).status_code == 401
            bad = {"Authorization": "Bearer nope"}
            assert (await raw.post(proc.mcp_url, json=body, headers=bad)).status_code == 401
        async with http_client(proc, "auto", token=TOKENS["bob"]) as client:
            assert (await client.list_resources()).resources == []
    finally:
        await proc.stop()


# -- faults and stats ----------------------------------------------------------------------
async def test_faults_drop_and_duplicate(fx: FixtureProcess, clean_faults: None) -> None:
    uri = "fault://r"
    await fx.create(uri, text="v0")
    inbox = Inbox()
    async with http_client(fx, "legacy", inbox=inbox) as client:
        await client.subscribe_resource(uri)
        await fx.wait_subscribed(uri)
        await fx.faults(drop_notifications=1)
        await fx.edit(uri, text="v1")
        stats = await fx.wait_notified()
        assert stats["notifications_dropped"][uri] == 1 and inbox.updated(uri) == []
        await fx.faults(duplicate_notifications=3)
        await fx.edit(uri, text="v2")
        await inbox.wait(lambda: len(inbox.updated(uri)) == 3)
        await fx.faults(duplicate_notifications=1)
        await fx.notify(uri, times=2)  # duplicates without any change
        await inbox.wait(lambda: len(inbox.updated(uri)) == 5)
        assert (await fx.stats())["notifications_sent"][uri] == 5


async def test_read_faults(fx: FixtureProcess, clean_faults: None) -> None:
    uri = "fault://read"
    first = await fx.create(uri, text="old")
    await fx.faults(fail_reads={uri: -32603}, not_found_code=-32099)
    async with http_client(fx, "auto") as client:
        with pytest.raises(MCPError) as err:
            await client.read_resource(uri)
        assert err.value.code == -32603
        with pytest.raises(MCPError) as err:
            await client.read_resource("fault://missing")
        assert err.value.code == -32099
        await fx.faults(fail_reads={}, read_delay_ms={uri: 300})
        late = asyncio.create_task(client.read_resource(uri))
        await fx.wait_stats(lambda s: s["reads"].get(uri, 0) >= 2)
        await fx.edit(uri, text="new")
        assert read_digest(await late) == first["committed"]["digest"]  # snapshot taken before the delay


async def test_stats_counts(fx: FixtureProcess) -> None:
    before = await fx.stats()
    async with http_client(fx, "legacy", token=TOKENS["alice"]) as client:
        await client.list_resources()
        stats = await fx.wait_stats(lambda s: any(x["subject"] == "alice" for x in s["sessions"]))
        assert stats["list_calls"] == before["list_calls"] + 1
        assert any(x["edition"] == "2025-11-25" and x["transport"] == "http" for x in stats["sessions"])
    health = await fx.healthz()
    assert health["ok"] and health["pid"] == fx.pid


# -- process lifetime --------------------------------------------------------------------
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} fixture\[(\d+)\] [A-Z]+ [\w.]+: .+")


async def test_a_stop_exits_zero_with_every_line_written(tmp_path: Path) -> None:
    """After a clean shutdown the fixture ends with ``os._exit`` (no interpreter teardown): SIGTERM
    still gives exit code 0, and every line it wrote is in its stderr file, whole and in order, up
    to the one it writes after the shutdown, just before it exits."""
    fx = await FixtureProcess.start_http(tmp_path, seed="none")
    uris = [f"demo://stop/{i}" for i in range(20)]
    for uri in uris:
        await fx.create(uri, text=uri)
    assert await fx.stop() == 0
    text = fx.stderr_path.read_text()
    assert text.endswith("\n"), f"a partial last line: {text[-200:]!r}"
    lines = text.splitlines()
    malformed = [line for line in lines if not (m := LOG_LINE.fullmatch(line)) or int(m[1]) != fx.pid]
    assert not malformed, malformed
    assert [line.split(" put ", 1)[1].split(" ", 1)[0] for line in lines if " put " in line] == uris
    assert lines[-2].endswith("mcpsync.fixture: fixture shutting down")
    assert lines[-1].endswith("mcpsync.fixture: fixture stopped")
