"""The Prometheus endpoint on the real stack: Temporal dev server, PostgreSQL, the fixture server.

A subscription converges through a duplicated notification, another is revoked; a scrape over
HTTP then shows the in-process counters moved, the ledger gauges agree with the ledger, and the
Temporal SDK runtime's own meters are on the same endpoint.
"""

from __future__ import annotations

import asyncio
import urllib.request
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.ledger import Ledger
from tests.conftest import eventually, running_services, unique
from worker.config import MetricsConfig, ServerConfig, load_config
from worker.fixture import FixtureProcess
from worker.metrics import MetricsServer, MetricsUnavailable, serve_metrics
from worker.runtime import revoke, start_subscription
from worker.stack import TemporalDevServer
from workflows.records import SubscriptionKey, SubscriptionState

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        return str(resp.read().decode())


def _samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def _value(samples: Samples, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    found = [v for (n, lab), v in samples.items() if n == name and want <= lab]
    return sum(found) if found else None


@pytest.fixture
async def metrics_server() -> AsyncIterator[MetricsServer]:
    ms = serve_metrics(MetricsConfig(port=0, refresh_seconds=0.5), set_default_runtime=False)
    try:
        yield ms
    finally:
        await ms.aclose()


def test_metrics_config_is_optional(tmp_path: Path) -> None:
    path = tmp_path / "m.toml"
    path.write_text("[metrics]\nport = 9999\n")
    assert load_config(path).metrics == MetricsConfig(port=9999)
    path.write_text("")
    assert load_config(path).metrics is None
    off = serve_metrics(None)
    assert not off.enabled and off.url is None and off.runtime is None


async def test_port_in_use_is_a_clear_error(metrics_server: MetricsServer) -> None:
    with pytest.raises(MetricsUnavailable, match="cannot serve metrics"):
        serve_metrics(MetricsConfig(port=metrics_server.port or 0), set_default_runtime=False)


async def test_metrics_endpoint_on_real_stack(temporal_server: TemporalDevServer, ledger: Ledger, tmp_path: Path,
                                              metrics_server: MetricsServer) -> None:
    ms = metrics_server
    assert ms.url is not None and ms.runtime is not None
    # Workers report to the SDK runtime of the client they are built from.
    client = await Client.connect(temporal_server.address, data_converter=pydantic_data_converter,
                                  runtime=ms.runtime)
    fx = await FixtureProcess.start_http(tmp_path, seed="none", log_level="WARNING")
    server = ServerConfig(name=unique("metrics"), transport="http", url=fx.mcp_url, subjects=["alice"])
    live = SubscriptionKey(subject="alice", server=server.name, uri=f"demo://metrics/{uuid.uuid4().hex}")
    doomed = SubscriptionKey(subject="alice", server=server.name, uri=f"demo://metrics/{uuid.uuid4().hex}")
    try:
        first = await fx.create(live.uri, text="one", mime_type="text/plain")
        await fx.create(doomed.uri, text="to be revoked", mime_type="text/plain")
        await ms.refresh(ledger)  # revocations before this point are history, not this process's samples
        ms.watch_ledger(ledger)
        async with running_services(client, ledger, [server]) as cfg:
            for key in (live, doomed):
                await start_subscription(client, key, task_queue=cfg.temporal.task_queue)

            async def digest_is(key: SubscriptionKey, digest: str) -> bool:
                return (await ledger.load_fence(key)).last_accepted_digest == digest

            await eventually(lambda: digest_is(live, first["committed"]["digest"]), what="initial read accepted")
            await fx.wait_subscribed(live.uri)
            second = await fx.edit(live.uri, text="two")
            await fx.notify(live.uri, times=2)  # the change notified three times
            await eventually(lambda: digest_is(live, second["committed"]["digest"]), what="update accepted")

            await eventually(lambda: ledger.load_fence(doomed), what="second subscription exists")
            await revoke(client, ledger, subject="alice", server=server.name, uri=doomed.uri, reason="test")

            async def revoked() -> bool:
                return (await ledger.load_fence(doomed)).state == SubscriptionState.REVOKED

            await eventually(revoked, what="revocation applied")

            async def scraped() -> Samples | None:
                samples = _samples(await asyncio.to_thread(_scrape, ms.url or ""))
                ok = ((_value(samples, "mcpsync_convergence_seconds_count", server=server.name) or 0) >= 1
                      and (_value(samples, "mcpsync_revocation_latency_seconds_count") or 0) >= 1
                      and (_value(samples, "mcpsync_notifications_received_total", server=server.name) or 0) >= 3
                      and _value(samples, "mcpsync_read_amplification", server=server.name) is not None)
                return samples if ok else None

            s = await eventually(scraped, timeout=20, interval=0.3, what="metrics reflect the run")
    finally:
        await fx.stop()

    srv = {"server": server.name}
    # In-process meters.
    received = _value(s, "mcpsync_notifications_received_total", **srv) or 0
    coalesced = _value(s, "mcpsync_notifications_coalesced_total", **srv) or 0
    assert 3 <= received and 0 <= coalesced < received
    reads = _value(s, "mcpsync_reads_issued_total", **srv) or 0
    assert reads >= 3  # two initial reads and at least one for the change
    assert (_value(s, "mcpsync_read_latency_seconds_count", **srv) or 0) == reads
    assert 0 < (_value(s, "mcpsync_read_latency_seconds_sum", **srv) or 0) < 30 * reads
    assert (_value(s, "mcpsync_receipts_total", verdict="ACCEPTED", **srv) or 0) >= 3
    conv_count = _value(s, "mcpsync_convergence_seconds_count", **srv) or 0
    conv_sum = _value(s, "mcpsync_convergence_seconds_sum", **srv) or 0
    assert conv_count >= 1 and 0 < conv_sum / conv_count < 30
    # Ledger-derived gauges agree with the ledger.
    ledger_reads = sum([await ledger.read_count(k) for k in (live, doomed)])
    assert _value(s, "mcpsync_ledger_reads", **srv) == ledger_reads
    assert _value(s, "mcpsync_ledger_distinct_changes", **srv) == 3
    amplification = _value(s, "mcpsync_read_amplification", **srv) or 0
    assert amplification == pytest.approx(ledger_reads / 3)
    assert 1.0 <= amplification <= 3.0
    assert (_value(s, "mcpsync_unresolved_subscriptions", state="REVOKED") or 0) >= 1
    assert _value(s, "mcpsync_unresolved_subscriptions", state="ACTIVE") is None  # ACTIVE has its own gauge
    assert (_value(s, "mcpsync_active_subscriptions") or 0) >= 1
    assert _value(s, "mcpsync_stale_receipts", **srv) == 0
    assert _value(s, "mcpsync_stale_after_close", **srv) == 0
    rev_count = _value(s, "mcpsync_revocation_latency_seconds_count") or 0
    assert rev_count >= 1 and 0 <= (_value(s, "mcpsync_revocation_latency_seconds_sum") or 0) / rev_count < 30
    assert (_value(s, "mcpsync_revocation_latency_recent_seconds", quantile="0.99") or -1) >= 0
    assert (_value(s, "mcpsync_ledger_snapshot_age_seconds") or 99) < 10
    # The Temporal SDK runtime's meters ride on the same endpoint.
    assert any(name.startswith("temporal_") for name, _ in s), "no temporal_* series on the endpoint"
