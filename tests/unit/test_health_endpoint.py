"""``/healthz`` and ``/readyz`` on the metrics port (the Kubernetes probes in deploy/kubernetes/).

Readiness follows the check ``ready_when`` installed (in ``mcpsync worker``: every Temporal worker
of the process polls; tests/e2e/test_e2e_scaleout.py sees real workers turn ready); liveness
follows the event loop's heartbeat. Nothing but a loopback HTTP server runs here.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest

from mcpsync.worker.main.config import MetricsConfig
from mcpsync.worker.observe.metrics import LIVENESS_STALE_SECONDS, MetricsServer, serve_metrics


def _get(ms: MetricsServer, path: str) -> tuple[int, str]:
    url = f"http://127.0.0.1:{ms.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
async def ms() -> AsyncIterator[MetricsServer]:
    server = serve_metrics(MetricsConfig(port=0), set_default_runtime=False)
    try:
        yield server
    finally:
        await server.aclose()


async def test_readyz_follows_the_polling_check(ms: MetricsServer) -> None:
    assert await asyncio.to_thread(_get, ms, "/readyz") == (503, "not polling\n")  # no check yet
    polling = [False]
    ms.ready_when(lambda: polling[0])
    assert (await asyncio.to_thread(_get, ms, "/readyz"))[0] == 503
    polling[0] = True
    assert await asyncio.to_thread(_get, ms, "/readyz") == (200, "ok\n")

    def broken() -> bool:
        raise RuntimeError("boom")

    ms.ready_when(broken)  # a check that raises is not ready, and the endpoint still answers
    assert (await asyncio.to_thread(_get, ms, "/readyz"))[0] == 503
    status, body = await asyncio.to_thread(_get, ms, "/metrics")  # the scrape is unchanged
    assert status == 200 and "mcpsync_" in body


async def test_healthz_follows_the_event_loop_heartbeat(ms: MetricsServer) -> None:
    assert await asyncio.to_thread(_get, ms, "/healthz") == (200, "ok\n")  # serving, no heartbeat yet
    ms.watch_loop()
    assert await asyncio.to_thread(_get, ms, "/healthz") == (200, "ok\n")
    ms._heartbeat.cancel()  # type: ignore[union-attr]  # the loop stops ticking...
    ms._tick = time.monotonic() - LIVENESS_STALE_SECONDS - 1  # ...long enough ago
    assert await asyncio.to_thread(_get, ms, "/healthz") == (503, "event loop stalled\n")
    assert (await asyncio.to_thread(_get, ms, "/nope"))[0] == 404


async def test_not_ready_once_closing() -> None:
    server = serve_metrics(MetricsConfig(port=0), set_default_runtime=False)
    server.ready_when(lambda: True)
    assert server.is_ready()
    await server.aclose()
    assert not server.is_ready()
