"""Helpers for the ``mcpsync serve`` tests: the serve process, SDK clients with a bearer token,
events/poll."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import TypeAdapter

from mcpsync.worker.stack import REPO_ROOT


class ServeProcess:
    def __init__(self, proc: asyncio.subprocess.Process, url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log  # stderr (logs at INFO: -v)

    @classmethod
    async def start(cls, conf: Path, tokens: dict[str, str], *, consumer: str, port: int = 0,
                    extra: tuple[str, ...] = ()) -> ServeProcess:
        env = {k: v for k, v in os.environ.items() if k != "MCPSYNC_DATABASE_URL"}
        env["MCPSYNC_SERVE_TOKENS"] = json.dumps(tokens)
        log = conf.parent / f"serve-{consumer}-{os.urandom(3).hex()}.log"
        with log.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "mcpsync.worker.cli", "-v", "--config", str(conf), "serve", "--port",
                str(port), "--consumer", consumer, *extra, cwd=REPO_ROOT, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        try:
            line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        except TimeoutError:
            proc.kill()
            raise
        if "listening on" not in line:
            raise RuntimeError(f"serve did not start: {line!r} {log.read_text()[-2000:]}")
        return cls(proc, line.rsplit(" ", 1)[-1].strip(), log)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/")[0])

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                await self.kill()


@asynccontextmanager
async def serve_client(url: str, token: str, mode: Literal["auto", "legacy"], inbox: list[Any] | None = None,
                       ) -> AsyncIterator[Client]:
    async def handler(message: Any) -> None:
        if inbox is not None:
            inbox.append(message)

    async with AsyncExitStack() as stack:
        hc = await stack.enter_async_context(create_mcp_http_client(headers={"Authorization": "Bearer "
                                                                                              f"{token}"}))
        client = await stack.enter_async_context(
            Client(streamable_http_client(url, http_client=hc), mode=mode, cache=None,  # type: ignore[arg-type]
                   message_handler=handler))
        yield client


class _EventsPoll(types.Request[dict[str, Any], Literal["events/poll"]]):
    method: Literal["events/poll"] = "events/poll"
    params: dict[str, Any]


async def events_poll(client: Client, cursor: str | None, max_events: int = 100) -> dict[str, Any]:
    request = _EventsPoll(params={"name": "resource.changed", "cursor": cursor, "maxEvents": max_events})
    result: dict[str, Any] = await client.session.send_request(request, TypeAdapter(dict[str, Any]))
    return result
