"""``mcpsync probe`` against real servers: the fixture (both editions, with and without
subscribe, page size 2) and server-everything (stdio), through the API and the CLI."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.observe.probe import CallableNudge, ProbeError, ProbeReport, probe_server
from tests import cli_process
from tests.conftest import unique
from tests.e2e.test_interop_everything import everything_entry


@pytest.fixture(scope="module")
async def paged_fixture(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FixtureProcess]:
    fx = await FixtureProcess.start_http(tmp_path_factory.mktemp("probe"), seed="demo", page_size=2,
                                         log_level="WARNING")
    try:
        yield fx
    finally:
        await fx.stop()


def _fixture_nudge(fx: FixtureProcess) -> CallableNudge:
    async def notify(uri: str) -> None:
        await fx.wait_subscribed(uri)  # legacy HTTP: the client's GET stream must be open first
        await fx.notify(uri)

    return CallableNudge(notify, "fixture control plane POST /notify")


async def _direct_last_modified(url: str) -> int:
    async with Client(url, mode="legacy", cache=None) as c:
        resources, cursor = [], None
        while True:
            page = await c.list_resources(cursor=cursor)
            resources += page.resources
            if not page.next_cursor:
                break
            cursor = page.next_cursor
    return sum(1 for r in resources if r.annotations and r.annotations.last_modified)


@pytest.mark.parametrize("edition", ["2025-11-25", "2026-07-28"])
async def test_probe_fixture_paged_with_nudge(paged_fixture: FixtureProcess, edition: str) -> None:
    server = ServerConfig(name="fx", transport="http", url=paged_fixture.mcp_url, edition=edition)
    before = await paged_fixture.stats()
    report = await probe_server(server, subject="alice", nudge=_fixture_nudge(paged_fixture),
                                update_bound_seconds=5)
    assert isinstance(report, ProbeReport) and report.record == "serverProbe.v1"
    assert report.edition == edition and report.server_name == "mcpsync-fixture"
    assert {e.mode: e.negotiated for e in report.editions} == {"legacy": "2025-11-25", "auto": "2026-07-28"}
    caps = report.capabilities
    assert caps.resources and caps.subscribe and caps.list_changed
    assert caps.snapshot == any("snapshot" in k.lower() for k in caps.experimental + caps.extensions)

    ls = report.listing
    assert ls.resources == 3 and ls.paginated and ls.page_size == 2
    assert [s.page_sizes for s in ls.scans] == [[2, 1], [2, 1]]
    assert all(s.complete and s.problem is None for s in ls.scans)
    assert ls.cursors_stable and ls.listing_stable
    assert ls.scans[0].cursor_digests == ls.scans[1].cursor_digests and len(ls.scans[0].cursor_digests) == 1
    assert ls.with_last_modified == await _direct_last_modified(paged_fixture.mcp_url)
    assert ls.templates is not None and ls.templates >= 1

    assert report.read is not None and report.read.ok and report.read.digest
    # The probe digests exactly as the control plane (the oracle) does.
    assert report.read.digest == (await paged_fixture.resource(report.read.uri))["digest"]

    not_found_code = -32002 if edition == "2025-11-25" else -32602
    assert report.not_found.code == not_found_code and report.not_found.classified_as == "not_found"
    assert report.error_codes == [not_found_code]

    sub = report.subscribe
    assert sub.method == ("resources/subscribe" if edition == "2025-11-25" else "subscriptions/listen")
    assert sub.verdict == "verified", sub
    assert sub.acked and sub.update_within_bound and sub.update_ms is not None and sub.update_ms < 5000
    assert sub.unsubscribed
    if edition == "2026-07-28":
        assert sub.honored

    # Nothing changed on the server: no mutation, and no subscription or listen stream left behind.
    async def settled() -> dict[str, object]:
        return await paged_fixture.wait_stats(
            lambda s: not any(s["subscriptions"].values()) and s["listen_streams_open"] == 0, timeout=5)

    after = await settled()
    assert after["last_mutation_id"] == before["last_mutation_id"]


async def test_probe_fixture_without_subscribe(tmp_path: Path) -> None:
    async with await FixtureProcess.start_http(tmp_path, seed="demo", subscribe=False, list_changed=False,
                                               log_level="WARNING") as fx:
        server = ServerConfig(name="fx-nosub", transport="http", url=fx.mcp_url)
        report = await probe_server(server, nudge=_fixture_nudge(fx), update_bound_seconds=1)
        stats = await fx.stats()
    caps = report.capabilities
    assert caps.resources and not caps.subscribe and not caps.list_changed
    sub = report.subscribe
    assert sub.verdict == "not_advertised" and sub.advertised is False
    assert sub.acked is False and sub.error_code == -32601  # no handler registered: method not found
    assert report.listing.resources == 3 and not report.listing.paginated and report.listing.page_size is None
    assert report.error_codes == [-32601, -32002]
    assert stats["subscribe_calls"] == {}


async def test_probe_server_everything_stdio() -> None:
    server = ServerConfig(name="everything", transport="stdio",
                          command=["node", str(everything_entry()), "stdio"])
    nudged, plain = await asyncio.gather(
        probe_server(server, nudge="auto", update_bound_seconds=8, other_edition=False),
        probe_server(server),
    )
    for report in (nudged, plain):
        assert report.edition == "2025-11-25" and report.server_name == "mcp-servers/everything"
        caps = report.capabilities
        assert caps.resources and caps.subscribe and caps.list_changed and not caps.snapshot
        assert report.listing.resources == 7 and not report.listing.paginated
        assert report.listing.cursors_stable and report.listing.listing_stable
        assert report.listing.with_last_modified == 0
        assert report.listing.template_uris == ["demo://resource/dynamic/text/{resourceId}",
                                                "demo://resource/dynamic/blob/{resourceId}"]
        nf = report.not_found
        assert nf.code == -32602 and nf.classified_as == "not_found"
        assert nf.message is not None and nf.message.startswith("MCP error -32602: Resource ")
        assert report.error_codes == [-32602]
    assert {e.mode: e.negotiated for e in plain.editions} == {"legacy": "2025-11-25", "auto": "2025-11-25"}

    sub = nudged.subscribe
    assert sub.verdict == "verified" and sub.nudge is not None and "toggle-subscriber-updates" in sub.nudge
    assert sub.update_within_bound and sub.unsubscribed
    assert nudged.notifications.get("notifications/resources/updated", 0) >= 1
    assert plain.subscribe.verdict == "ack_only" and plain.subscribe.update_within_bound is None
    assert plain.notifications.get("notifications/resources/updated", 0) == 0


async def test_probe_cli_json_and_clear_errors(paged_fixture: FixtureProcess, tmp_path: Path) -> None:
    config = tmp_path / "mcpsync.toml"
    config.write_text(
        f'[[servers]]\nname = "fx"\ntransport = "http"\nurl = "{paged_fixture.mcp_url}"\n\n'
        f'[[servers]]\nname = "gone"\ntransport = "stdio"\ncommand = ["{unique("/nonexistent/mcp")}"]\n'
    )

    async def cli(*args: str) -> tuple[int, str, str]:
        r = await cli_process.arun(["--config", str(config), "probe", *args], timeout=60)
        return r.returncode, r.stdout, r.stderr

    (code, out, err), (text_code, text, _), (gone_code, _, gone_err), (unknown_code, _, unknown_err) = \
        await asyncio.gather(cli("--server", "fx", "--json"), cli("--server", "fx"), cli("--server", "gone"),
                             cli("--server", "nope"))
    assert code == 0, err
    assert text_code == 0 and "\nimplementation " in text and "\nsubscribe     ack_only" in text, text
    doc = json.loads(out)
    assert doc["record"] == "serverProbe.v1" and doc["listing"]["page_size"] == 2
    assert doc["subscribe"]["verdict"] == "ack_only" and doc["not_found"]["code"] == -32002
    assert doc["capabilities"]["raw"]["resources"] == {"subscribe": True, "listChanged": True}
    assert gone_code == 6 and gone_err.startswith("mcpsync: error: cannot open MCP server 'gone'"), gone_err
    assert "Traceback" not in gone_err
    assert unknown_code == 2 and "unknown server 'nope'" in unknown_err


async def test_probe_error_names_the_server() -> None:
    with pytest.raises(ProbeError, match="cannot open MCP server 'down'.*http"):
        await probe_server(ServerConfig(name="down", transport="http", url="http://127.0.0.1:9/mcp"),
                           timeout=3)
