"""The benchmark's PostgreSQL: a fresh database per run on ``MCPSYNC_DATABASE_URL``'s server, else on
an embedded server under the state dir (``mcpsync.worker.stack.postgres.EmbeddedPostgres``)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from pathlib import Path

import psycopg

from mcpsync.activities.ledger import Ledger
from mcpsync.worker.main.connect import open_ledger
from mcpsync.worker.stack.common import state_dir
from mcpsync.worker.stack.postgres import EmbeddedPostgres

__all__ = ["Postgres", "scratch_ledger", "server_url"]


class Postgres:
    """A fresh database per run on ``MCPSYNC_DATABASE_URL``'s server, else on an embedded server."""

    def __init__(self) -> None:
        self.admin_url = ""
        self.embedded: EmbeddedPostgres | None = None

    async def start(self) -> str:
        base = os.environ.get("MCPSYNC_DATABASE_URL")
        if base:
            self.admin_url = base
            return "MCPSYNC_DATABASE_URL"
        self.embedded = await EmbeddedPostgres.start(state_dir() / "bench")
        self.admin_url = self.embedded.admin_url
        return "embedded"

    def _url(self, name: str) -> str:
        prefix, sep, query = self.admin_url.partition("?")
        return f"{prefix.rsplit('/', 1)[0]}/{name}{sep}{query}"

    async def create(self, name: str) -> str:
        def work() -> None:
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')

        await asyncio.to_thread(work)
        return self._url(name)

    async def drop(self, name: str) -> None:
        def work() -> None:
            with suppress(Exception), psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        await asyncio.to_thread(work)

    async def stop(self) -> None:
        if self.embedded is not None:
            await self.embedded.stop()



@asynccontextmanager
async def scratch_ledger(prefix: str) -> AsyncIterator[Ledger]:
    """A ledger on a fresh database ``<prefix>_<random>`` (``Postgres``), migrated; its pool closed and
    the database dropped (the embedded server stopped) on the way out, whatever happened."""
    pg = Postgres()
    await pg.start()
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        ledger = await open_ledger(await pg.create(name))
        try:
            yield ledger
        finally:
            await ledger.pool.close()
    finally:
        await pg.drop(name)
        await pg.stop()


async def server_url(stack: AsyncExitStack, work: Path) -> str:
    """``MCPSYNC_DATABASE_URL`` when set, else an embedded server under ``work`` that ``stack`` stops."""
    url = os.environ.get("MCPSYNC_DATABASE_URL")
    if url:
        return url
    pg = await EmbeddedPostgres.start(work / "pg")
    stack.push_async_callback(pg.stop)
    return pg.url
