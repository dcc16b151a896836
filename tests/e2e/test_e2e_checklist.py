"""Seed 003's release checklist on the real stack: the four capability combinations, bursts and
cross-URI writes, reconnects at four points, and a half-open connection.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.stack.common import free_port
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionOptions, SubscriptionState
from tests.conftest import eventually, running_services, unique
from tests.e2e.conftest import SpareFixtures
from tests.e2e.test_e2e_subscription import _wait_record


def _server(url: str) -> ServerConfig:
    return ServerConfig(name=unique("fx"), transport="http", url=url, ping_interval_seconds=0.5,
                        ping_timeout_seconds=1.5)


@pytest.mark.parametrize("subscribe,list_changed",
                         [(True, True), (True, False), (False, True), (False, False)])
async def test_four_capability_combinations(temporal_client: Client, ledger: Ledger, tmp_path: Path,
                                            subscribe: bool, list_changed: bool) -> None:
    async with await FixtureProcess.start_http(tmp_path, seed="none", subscribe=subscribe,
                                               list_changed=list_changed) as fx:
        server = _server(fx.mcp_url)
        uri = f"demo://caps/{uuid.uuid4().hex}"
        first = await fx.create(uri, text="v1")
        key = SubscriptionKey(subject="anonymous", server=server.name, uri=uri)
        async with running_services(temporal_client, ledger, [server]) as cfg:
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue,
                                              options=SubscriptionOptions(poll_interval_seconds=1.0))
            rec = await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                                     "v1")
            assert rec.capabilities == {"subscribe": subscribe, "listChanged": list_changed}
            assert (rec.staleness_bound_seconds is None) == subscribe, "polling publishes its bound"
            change = await fx.edit(uri, text="v2")
            await _wait_record(handle, lambda r: r.last_accepted_digest == change["committed"]["digest"],
                               "v2", timeout=15)
            stats = await fx.stats()
            if not subscribe:
                assert sum(stats.get("subscribe_calls", {}).values()) == 0, \
                    "no subscribe without the capability"


async def test_burst_and_cross_uri_writes_converge_without_cross_refresh(
        temporal_client: Client, ledger: Ledger, spare_fixtures: SpareFixtures) -> None:
    async with await spare_fixtures.take() as fx:
        server = _server(fx.mcp_url)
        uris = [f"demo://burst/{i}/{uuid.uuid4().hex}" for i in range(3)]
        quiet = f"demo://quiet/{uuid.uuid4().hex}"
        for u in [*uris, quiet]:
            await fx.create(u, text="v0")
        async with running_services(temporal_client, ledger, [server]) as cfg:
            keys = {u: SubscriptionKey(subject="anonymous", server=server.name, uri=u)
                    for u in [*uris, quiet]}
            handles = {u: await start_subscription(temporal_client, k, task_queue=cfg.temporal.task_queue)
                       for u, k in keys.items()}
            for u in keys:
                await _wait_record(handles[u], lambda r: r.watermark >= 1, f"initial {u}")
                await fx.wait_subscribed(u)
            quiet_reads = await ledger.reports.read_count(keys[quiet])
            last: dict[str, Any] = {}
            for round_ in range(10):  # a burst: 10 rapid writes to each of 3 URIs, interleaved
                for u in uris:
                    last[u] = await fx.edit(u, text=f"burst {round_}")
            for u in uris:
                await _wait_record(handles[u],
                                   lambda r, d=last[u]["committed"]["digest"]: r.last_accepted_digest == d,
                                   f"latest of {u}")
                reads = await ledger.reports.read_count(keys[u]) - 1
                assert reads <= 10 + 1, f"{reads} reads for 10 writes: coalescing must bound refreshes"
            assert await ledger.reports.read_count(keys[quiet]) == quiet_reads, \
                "no refresh of an unrelated URI"


async def _restart_fixture(fx: FixtureProcess, tmp: Path, port: int, uri: str, text: str) -> tuple[
        FixtureProcess, dict[str, Any]]:
    await fx.stop()
    fresh = await FixtureProcess.start_http(tmp, seed="none", port=port)
    return fresh, await fresh.create(uri, text=text)


@pytest.mark.parametrize("point", ["before_subscribe_ack", "after_ack", "during_mutation",
                                   "after_event_before_refresh"])
async def test_reconnect_at_four_points_converges(temporal_client: Client, ledger: Ledger, tmp_path: Path,
                                                  point: str) -> None:
    port = free_port()
    fx = await FixtureProcess.start_http(tmp_path / "0", seed="none", port=port)
    server = _server(fx.mcp_url)
    uri = f"demo://reconnect/{point}/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="anonymous", server=server.name, uri=uri)
    try:
        first = await fx.create(uri, text="v1")
        async with running_services(temporal_client, ledger, [server]) as cfg:
            if point == "before_subscribe_ack":
                await fx.faults(subscribe_delay_ms=3000)
                handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
                await eventually(lambda: _subscribe_seen(fx, uri), what="subscribe in flight")
                fx, final = await _restart_fixture(fx, tmp_path / "1", port, uri, "after drop before ack")
            else:
                handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
                await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"],
                                   "v1")
                await fx.wait_subscribed(uri)
                if point == "after_ack":
                    fx, final = await _restart_fixture(fx, tmp_path / "1", port, uri, "after drop after ack")
                elif point == "during_mutation":
                    # the mutation's notification dies with the connection
                    await fx.faults(drop_notifications=1)
                    await fx.edit(uri, text="mutated as the connection dropped")
                    fx, final = await _restart_fixture(fx, tmp_path / "1", port, uri,
                                                       "mutated as the connection dropped")
                else:
                    await fx.faults(read_delay_ms={uri: 3000})
                    await fx.edit(uri, text="event received, refresh pending")
                    await eventually(lambda: _read_seen(fx, uri, 2), what="refresh in flight")
                    fx, final = await _restart_fixture(fx, tmp_path / "1", port, uri,
                                                       "after drop before refresh")
            rec = await _wait_record(handle, lambda r: r.last_accepted_digest == final["committed"]["digest"],
                                     f"converged after a drop {point}", timeout=45)
            assert rec.session_generation >= 2
            await fx.wait_subscribed(uri, timeout=15)
            after = await fx.edit(uri, text="notified on the new session")
            await _wait_record(handle, lambda r: r.last_accepted_digest == after["committed"]["digest"],
                               "after")
    finally:
        await fx.stop()


async def _subscribe_seen(fx: FixtureProcess, uri: str) -> bool:
    return int((await fx.stats()).get("subscribe_calls", {}).get(uri, 0)) >= 1


async def _read_seen(fx: FixtureProcess, uri: str, n: int) -> bool:
    return int((await fx.stats()).get("reads", {}).get(uri, 0)) >= n


async def test_half_open_connection_is_detected_by_ping_and_recovered(temporal_client: Client, ledger: Ledger,
                                                                      spare_fixtures: SpareFixtures) -> None:
    fx = await spare_fixtures.take()
    server = _server(fx.mcp_url)
    uri = f"demo://halfopen/{uuid.uuid4().hex}"
    key = SubscriptionKey(subject="anonymous", server=server.name, uri=uri)
    try:
        first = await fx.create(uri, text="v1")
        async with running_services(temporal_client, ledger, [server]) as cfg:
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue)
            await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"], "v1")
            os.kill(fx.pid, signal.SIGSTOP)  # the socket stays open, nothing answers: half-open
            try:
                await eventually(lambda: _session_closed(ledger, server.name), timeout=15,
                                 what="ping timeout noticed")
            finally:
                os.kill(fx.pid, signal.SIGCONT)
            # Witness of the recovery before the change: a new session is recorded, the subscription is
            # ACTIVE on it, and the fixture, answering again, holds the URI's subscription.
            session = await eventually(lambda: ledger.current_session("anonymous", server.name), timeout=45,
                                       what="a new session after the half-open one")
            assert session.generation >= 2
            await _wait_record(handle, lambda r: r.state == SubscriptionState.ACTIVE
                                   and r.session_generation >= session.generation,
                               "subscribed again on the new session", timeout=45)
            await fx.wait_subscribed(uri, timeout=45)
            change = await fx.edit(uri, text="after half-open")
            rec = await _wait_record(handle,
                                     lambda r: r.last_accepted_digest == change["committed"]["digest"],
                                     "recovered", timeout=45)
            assert rec.session_generation >= 2
    finally:
        await fx.stop()


async def _session_closed(ledger: Ledger, server: str) -> bool:
    return await ledger.current_session("anonymous", server) is None
