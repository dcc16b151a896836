"""Edition 2026-07-28 caching and stream loss, end to end on real components (docs/caching.md).

Real Temporal dev server, PostgreSQL and the fixture MCP server over streamable HTTP:
- a lost listen stream (backlog overflow on purpose, or dropped without the graceful close) is
  a gap: every subscription of that session gets a read on the next session generation, and a
  change made during the gap is accepted;
- ttlMs / cacheScope land in receipts, the outboxEvent.v1 envelope and the subscription record;
  a server without subscribe is polled no faster than its ttlMs, and the record says so;
- a body is released only to the subject it was read for, whatever its cacheScope.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import mcp_types as types
import psycopg
import pytest
from mcp import Client
from temporalio.client import Client as TemporalClient

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.outbox import latest_events
from mcpsync.activities.ledger.released import ContentRefused, released_content
from mcpsync.activities.mcp_session import BacklogOverflow, LiveSession, StreamLoss
from mcpsync.activities.starters import start_catalog, start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.ingress.session_host import SessionHost, server_transport
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.read_deadline import dispatch_margin
from mcpsync.workflows.records.subscription import (
    CacheScope,
    StalenessBoundSource,
    SubscriptionKey,
    SubscriptionOptions,
)
from tests import cli_process
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.test_catalog_e2e import FAST, catalog_stack
from tests.e2e.test_e2e_subscription import _wait_record

_cli = cli_process.run_config  # mcpsync --config FILE ..., against the file's database, in bytes

TOKENS = {"alice": f"tok-alice-{uuid.uuid4().hex}", "bob": f"tok-bob-{uuid.uuid4().hex}"}


async def _initial_reads_after(ledger: Ledger, key: SubscriptionKey,
                               generation: int) -> list[tuple[Any, ...]]:
    return await ledger_rows(
        ledger, "SELECT ordinal, session_generation FROM read_requests WHERE workflow_id=%s"
                " AND trigger_reason='initial' AND session_generation > %s", key.workflow_id, generation)


@pytest.mark.parametrize("fault", ["overflow", "dropped", "ended", "list_changed"])
async def test_lost_listen_stream_rereads_every_subscription_of_the_session(
        temporal_client: TemporalClient, ledger: Ledger, fx: FixtureProcess, database_url: str,
        fault: str) -> None:
    # overflow: a session host backlog of 4 unrouted notifications (the real knob, default 4096) and
    # two routers, flooded with far more distinct sub-resource events while the routers are held.
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, edition="2026-07-28",
                          subjects=["alice"], max_pending_notifications=4 if fault == "overflow" else 4096,
                          route_concurrency=2 if fault == "overflow" else 8)
    uris = [f"demo://loss/{uuid.uuid4().hex}/{i}" for i in range(4)]
    created = [await fx.create(uri, text=f"v1 of {i}", mime_type="text/plain") for i, uri in enumerate(uris)]
    keys = [SubscriptionKey(subject="alice", server=server.name, uri=uri) for uri in uris]
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handles = [await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
                   for key in keys]
        for handle, made in zip(handles, created, strict=True):
            rec = await _wait_record(handle,
                                     lambda r, d=made["committed"]["digest"]: r.last_accepted_digest == d,
                                     "initial read accepted")
            assert rec.edition == "2026-07-28"
        generation = rec.session_generation
        await fx.wait_subscribed(uris[0])

        # overflow: more distinct events than the backlog holds; dropped: an error ends the stream (no
        # graceful close); ended: the server closes it gracefully; list_changed: the session's
        # list_changed stream drops (it may have swallowed updates too).
        lost_sql = ("SELECT uri, session_generation, detail FROM audit WHERE kind='LISTEN_STREAM_LOST'"
                    " AND server=%s")
        if fault == "overflow":
            # The routers wait on the ledger while the flood arrives (this lock holds their first
            # write, as a slow PostgreSQL would), so the 2 keys they hold and the 4 queued fill the
            # backlog whatever the box's speed: free routers keep up with a slow enough flood, and then
            # nothing overflows. Plain reads and the audit insert pass the lock; the wait for the audit
            # row goes through this connection, not the ledger's pool (the held routers hold two).
            async with await psycopg.AsyncConnection.connect(database_url) as hold, hold.transaction():
                await hold.execute("LOCK TABLE subscriptions IN EXCLUSIVE MODE")
                assert (await fx.flood_listen(uris[0], count=300))["streams"] == 1

                async def audited_meanwhile() -> bool:
                    return bool(await (await hold.execute(lost_sql, (server.name,))).fetchall())

                await eventually(audited_meanwhile, timeout=30, what="LISTEN_STREAM_LOST, routers held")
        elif fault == "list_changed":
            assert (await fx.drop_listen(list_changed=True))["streams"] == 1
        else:
            assert (await fx.drop_listen(uris[0], graceful=fault == "ended"))["streams"] == 1
        # A change during the gap: no listen stream of the old session may carry it.
        changed = await fx.edit(uris[1], text="changed during the gap")

        lost = await eventually(lambda: ledger_rows(ledger, lost_sql, server.name), timeout=30,
                                what="LISTEN_STREAM_LOST audited")
        assert lost[0][1] == generation
        if fault == "list_changed":
            assert lost[0][0] is None and lost[0][2]["stream"] == "list_changed"
            assert lost[0][2]["reason"] == "dropped", lost[0][2]
        else:
            assert lost[0][0] == uris[0] and lost[0][2]["stream"] == "resource"
            assert lost[0][2]["reason"] == fault, lost[0][2]
        if fault == "overflow":
            assert "session host backlog exceeded 4" in lost[0][2]["error"], lost[0][2]
        for key in keys:
            rows = await eventually(lambda k=key: _initial_reads_after(ledger, k, generation), timeout=60,
                                    what=f"a re-read of {key.uri} on the next session")
            assert all(g > generation for _o, g in rows)
        rec = await _wait_record(handles[1],
                                 lambda r: r.last_accepted_digest == changed["committed"]["digest"],
                                 "the change made during the gap accepted")
        assert rec.session_generation > generation
        # Every subscription is listening again on the new session.
        for uri in uris:
            await fx.wait_subscribed(uri, timeout=30)


async def test_listen_backlog_overflow_loses_the_session(fx: FixtureProcess) -> None:
    """A consumer that falls more than 1024 distinct events behind (here: stalled on purpose while
    the fixture floods sub-resource events) loses the stream to the SDK's backlog cap; LiveSession
    reports OVERFLOW and marks the session lost. The session host's own consumer never waits (it
    queues and routes elsewhere), so on the full stack its bounded queue overflows first (the
    ``overflow`` case above covers the re-read path end to end); this is the SDK's cap."""
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, edition="2026-07-28",
                          subjects=["alice"])
    uri = f"demo://flood/{uuid.uuid4().hex}"
    await fx.create(uri, text="flooded", mime_type="text/plain")
    stalled = asyncio.Event()
    release = asyncio.Event()
    losses: list[tuple[str, StreamLoss, str]] = []

    async def slow_consumer(_uri: str, _generation: int) -> None:
        stalled.set()
        await release.wait()

    async def lost(lost_uri: str, why: StreamLoss, detail: str) -> None:
        losses.append((lost_uri, why, detail))

    arrived = 0
    backlog_full = asyncio.Event()

    async def tee(message: object) -> None:
        # The SDK tees every listen event to the message handler after queueing it on the stream:
        # once more than the cap arrived while the consumer is stalled, the backlog has overflowed.
        nonlocal arrived
        if isinstance(message, types.ResourceUpdatedNotification) and "/flood/" in str(message.params.uri):
            arrived += 1
            if arrived > 1100:
                backlog_full.set()

    async with Client(server_transport(server, "alice"), mode="auto", cache=None,  # type: ignore[arg-type]
                      message_handler=tee) as client:
        assert client.protocol_version == "2026-07-28"
        live = LiveSession(subject="alice", server=server.name, generation=1, client=client,
                           edition=client.protocol_version, server_name="fx", server_version="0",
                           max_content_bytes=1 << 20, on_uri_updated=slow_consumer, on_stream_lost=lost)
        await live.listen(uri)
        flood = await fx.flood_listen(uri, count=1500)
        assert flood["streams"] == 1
        await asyncio.wait_for(stalled.wait(), 10)
        await asyncio.wait_for(backlog_full.wait(), 30)
        release.set()
        await asyncio.wait_for(live.lost.wait(), 30)
        await live.close_listens()
    assert [(u, why) for u, why, _ in losses] == [(uri, StreamLoss.OVERFLOW)]
    assert "backlog exceeded" in losses[0][2]


async def test_the_session_host_backlog_is_bounded_per_generation(temporal_client: TemporalClient,
                                                                  ledger: Ledger) -> None:
    """``max_pending_notifications`` distinct unrouted notifications per session generation; one
    more raises BacklogOverflow (LiveSession loses the stream that carried it: OVERFLOW). Repeats
    coalesce and do not count, another generation has its own bound, and on 2025-11-25 (no stream
    to lose) the session itself is lost. The router is not running: nothing drains the queue."""
    server = ServerConfig(name=unique("fx"), transport="http", url="http://127.0.0.1:9/mcp",
                          subjects=["alice"], max_pending_notifications=2)
    host = SessionHost(server, "alice", ledger, temporal_client)
    await host._enqueue("demo://a", 1)
    await host._enqueue("demo://b", 1)
    await host._enqueue("demo://a", 1)  # coalesced into the queued one
    with pytest.raises(BacklogOverflow, match="exceeded 2"):
        await host._enqueue("demo://c", 1)
    await host._enqueue("demo://c", 2)  # the next generation is not held back by the lost one
    assert host.router.coalesced == 1 and host._queue.qsize() == 3

    async def never(_uri: str, _generation: int) -> None:
        raise AssertionError("not a listen stream")

    legacy = LiveSession(subject="alice", server=server.name, generation=1, client=cast(Client, None),
                         edition="2025-11-25", server_name="fx", server_version="0", max_content_bytes=1,
                         on_uri_updated=never)
    host.live = legacy
    await host._on_message(types.ResourceUpdatedNotification(
        params=types.ResourceUpdatedNotificationParams(uri="demo://d")))
    assert legacy.lost.is_set()


async def test_ttl_sets_the_poll_period_and_directives_are_recorded(
        temporal_client: TemporalClient, ledger: Ledger, tmp_path: Path) -> None:
    proc = await FixtureProcess.start_http(tmp_path, seed="none", subscribe=False)
    try:
        server = ServerConfig(name=unique("fx"), transport="http", url=proc.mcp_url, edition="2026-07-28",
                              subjects=["alice"])
        uri = f"demo://ttl/{uuid.uuid4().hex}"
        await proc.faults(ttl_ms=2000, cache_scope="public")
        made = await proc.create(uri, text="polled", mime_type="text/plain")
        key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
        async with running_services(temporal_client, ledger, [server]) as cfg:
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue,
                                              options=SubscriptionOptions(poll_interval_seconds=0.3))
            rec = await _wait_record(handle, lambda r: r.last_accepted_digest == made["committed"]["digest"]
                                     and r.staleness_bound_source == StalenessBoundSource.TTL, "ttl bound")
            assert rec.staleness_bound_seconds == 2.0
            assert rec.last_read_ttl_ms == 2000 and rec.last_read_cache_scope == CacheScope.PUBLIC
            # Poll reads come no faster than 0.8 x (ttl less the dispatch margin; jitter only makes them
            # earlier), not every 0.3 s; a gap between allocations is shorter than the deadline by the
            # previous read's dispatch (the deadline runs from its request). A 2 s ttl is the shortest that
            # keeps this clear of the ~1.05 s gaps a deadline armed from the 0.3 s interval leaves here.
            await eventually(lambda: ledger_rows(
                ledger, "SELECT 1 FROM read_requests WHERE workflow_id=%s AND trigger_reason='poll'"
                        " OFFSET 1", key.workflow_id), timeout=30, what="two poll reads")
            times: list[tuple[datetime]] = await ledger_rows(  # type: ignore[assignment]
                ledger, "SELECT issued_at FROM read_requests WHERE workflow_id=%s ORDER BY ordinal",
                key.workflow_id)
            gaps = [(b[0] - a[0]).total_seconds() for a, b in zip(times, times[1:], strict=False)]
            assert gaps and min(gaps) >= 0.8 * (2.0 - dispatch_margin(2.0)) - 0.2, gaps

            receipts = await ledger.reports.receipts(key)
            assert receipts[0].ttl_ms == 2000 and receipts[0].cache_scope == CacheScope.PUBLIC
            event = next(e for e in await latest_events(ledger.pool, 50) if e.workflow_id == key.workflow_id)
            assert event.ttl_ms == 2000 and event.cache_scope == "public"

            # Failing reads back off: the bound doubles and says so.
            await proc.faults(fail_reads={uri: -32603}, ttl_ms=0)
            rec = await _wait_record(handle,
                                     lambda r: r.staleness_bound_source == StalenessBoundSource.BACKOFF,
                                     "backoff after a failed read", timeout=30)
            assert rec.staleness_bound_seconds == 0.3 * 8  # the cap: 8 x the interval, above the 2 s ttl
    finally:
        await proc.stop()


@pytest.fixture
async def fx_auth(tmp_path: Path) -> AsyncIterator[FixtureProcess]:
    proc = await FixtureProcess.start_http(tmp_path, seed="none", tokens=TOKENS, require_auth=True)
    try:
        yield proc
    finally:
        await proc.stop()


@pytest.mark.parametrize("scope", ["private", "public"])
async def test_a_body_is_released_only_to_its_subject_whatever_the_cache_scope(
        temporal_client: TemporalClient, ledger: Ledger, fx_auth: FixtureProcess, tmp_path: Path,
        database_url: str, monkeypatch: pytest.MonkeyPatch, scope: str) -> None:
    names = {subject: f"MCPSYNC_TEST_TOKEN_{subject.upper()}" for subject in TOKENS}
    for subject, var in names.items():
        monkeypatch.setenv(var, TOKENS[subject])
    server = ServerConfig(name=unique("fx"), transport="http", url=fx_auth.mcp_url, edition="2026-07-28",
                          subjects=["alice", "bob"], token_env=names)
    uri = f"demo://shared/{uuid.uuid4().hex}"
    await fx_auth.faults(cache_scope=scope)
    made = await fx_auth.create(uri, text="one body, two readers", mime_type="text/plain")
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    alice = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        handle = await start_subscription(temporal_client, alice, task_queue=cfg.temporal.task_queue)
        await _wait_record(handle, lambda r: r.last_accepted_digest == made["committed"]["digest"],
                           "alice read")
    receipt = (await ledger.reports.receipts(alice))[0]
    assert receipt.cache_scope == CacheScope(scope) and receipt.subject == "alice"
    body = await released_content(ledger.pool, receipt_id=receipt.receipt_id, subject="alice")
    assert body.body == b"one body, two readers"
    with pytest.raises(ContentRefused):
        await released_content(ledger.pool, receipt_id=receipt.receipt_id, subject="bob")
    refused = _cli(conf, "content", "get", "--receipt", str(receipt.receipt_id), "--subject", "bob")
    assert refused.returncode == 5 and refused.stderr.startswith(b"mcpsync: error:"), refused.stderr
    assert b"one body" not in refused.stdout + refused.stderr


async def test_catalog_scans_record_the_list_cache_directives(temporal_client: TemporalClient, ledger: Ledger,
                                                              tmp_path: Path) -> None:
    async with catalog_stack(temporal_client, ledger, tmp_path, edition="2026-07-28", start=False) as st:
        await st.fx.faults(ttl_ms=60_000, cache_scope="public")
        st.handles["alice"] = await start_catalog(temporal_client, st.key("alice"), task_queue=st.task_queue,
                                                  policy=FAST)
        await st.published(1)
        scans = await st.scans()
        assert scans \
            and all(s.list_ttl_ms == 60_000 and s.list_cache_scope == CacheScope.PUBLIC for s in scans)
        stored = await st.catalogs.get_scan(scans[-1].scan_id)
        assert stored is not None and stored.list_ttl_ms == 60_000
        assert stored.list_cache_scope == CacheScope.PUBLIC
