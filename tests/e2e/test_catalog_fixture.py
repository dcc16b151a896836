"""The fixture's catalog extension over a real ``mcp.Client``: the io.mcpsync/snapshot extension
in both editions, listing faults, mutations between page requests, the generation history."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from mcpsync.fixture import FixtureProcess
from mcpsync.workflows.catalog_rules import SNAPSHOT_EXTENSION, set_digest, snapshot_negotiated

URIS = [f"demo://fx/{i}" for i in range(5)]


@pytest.fixture
async def fx(tmp_path: Path) -> AsyncIterator[FixtureProcess]:
    proc = await FixtureProcess.start_http(tmp_path, seed="none", page_size=2, snapshot_ids=True)
    try:
        for uri in URIS:
            await proc.create(uri, text="x")
        yield proc
    finally:
        await proc.stop()


async def pages(client: Client) -> list[tuple[list[str], dict | None, str | None]]:  # type: ignore[type-arg]
    out = []
    cursor: str | None = None
    for _ in range(10):
        page = await client.list_resources(cursor=cursor)
        out.append(([r.uri for r in page.resources], (page.meta or {}).get(SNAPSHOT_EXTENSION),
                    page.next_cursor))
        cursor = page.next_cursor
        if cursor is None:
            break
    return out


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_snapshot_extension_is_negotiated_and_stamps_every_page(fx: FixtureProcess, mode: str) -> None:
    async with Client(streamable_http_client(fx.mcp_url), mode=mode,
                      cache=None) as client:  # type: ignore[arg-type]
        assert snapshot_negotiated(client.server_capabilities.experimental)
        got = await pages(client)
        assert [u for p in got for u in p[0]] == URIS
        stamps = [p[1] for p in got]
        assert all(s is not None for s in stamps) \
            and len({s["id"] for s in stamps}) == 1  # type: ignore[index]
        assert all(s["setDigest"] == set_digest(URIS) and s["count"] == 5
                   for s in stamps)  # type: ignore[index]
        templates = await client.list_resource_templates()
        assert (templates.meta or {})[SNAPSHOT_EXTENSION]["id"] == stamps[0]["id"]  # type: ignore[index]


async def test_mutation_between_pages_changes_the_id_and_forged_ids_do_not(fx: FixtureProcess) -> None:
    async with Client(streamable_http_client(fx.mcp_url), mode="legacy",
                      cache=None) as client:  # type: ignore[arg-type]
        await fx.mutate_after_page(1, "delete", URIS[1])
        got = await pages(client)
        assert [u for p in got for u in p[0]] == [URIS[0], URIS[1], URIS[3], URIS[4]]  # torn: 2 skipped
        assert got[0][1]["id"] != got[1][1]["id"]  # type: ignore[index]
        stats = await fx.stats()
        assert stats["list_mutations_pending"] == 0 and stats["list_mutations_applied"][0]["op"] == "delete"
        history = await fx.catalog_history("anonymous")
        assert history[-1]["set_digest"] == set_digest([URIS[0]] + URIS[2:])

        await fx.faults(snapshot_meta="forged")
        frozen = (await pages(client))[0][1]
        await fx.create("demo://fx/9", text="new")
        after = await pages(client)
        assert all(p[1] == frozen for p in after)  # the same stamp, though the catalog changed
        assert set_digest([u for p in after for u in p[0]]) != frozen["setDigest"]  # type: ignore[index]


async def test_listing_faults(fx: FixtureProcess) -> None:
    async with Client(streamable_http_client(fx.mcp_url), mode="auto",
                      cache=None) as client:  # type: ignore[arg-type]
        await fx.faults(loop_cursor=True)
        first = await client.list_resources()
        second = await client.list_resources(cursor=first.next_cursor)
        assert second.next_cursor == first.next_cursor  # page 2 points back at itself
        await fx.faults(reset=True, endless_cursor=True)
        cursor = None
        for _ in range(6):
            cursor = (await client.list_resources(cursor=cursor)).next_cursor
        assert cursor is not None
        await fx.faults(reset=True, invalidate_stale_cursors=True, snapshot_meta="mismatched")
        page = await client.list_resources()
        await fx.create("demo://fx/8", text="bump")
        with pytest.raises(MCPError) as err:
            await client.list_resources(cursor=page.next_cursor)
        assert err.value.code == -32602
        with pytest.raises(RuntimeError, match="400"):
            await fx.faults(snapshot_meta="bogus")
