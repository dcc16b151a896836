"""The naive baseline and the floor, measured with the plain mcp SDK client.

- :class:`NaiveClient`: what an application without mcpsync does: subscribe, read on every
  ``notifications/resources/updated`` (one concurrent read per notification, no coalescing,
  no ordering), keep whatever read completed last. Every completion is recorded with its
  wall time so convergence is computed exactly as for the system.
- :func:`measure_floor`: one mutation → one notification → one read, sequentially on an
  otherwise idle client: the best any reconciler built on notifications can do.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPDeprecationWarning

from mcpsync.activities.mcp_session import read_digest
from mcpsync.workflows.digest import ContentPart, content_digest

__all__ = ["NaiveClient", "FloorSample", "measure_floor", "text_digest"]


def text_digest(text: str, mime_type: str = "text/plain") -> str:
    """The digest the fixture commits (and a read of it yields) for a text resource."""
    return content_digest([ContentPart("text", mime_type, text.encode("utf-8"))])


@dataclass
class NaiveClient:
    """A legacy (2025-11-25) SDK client that reads on every notification."""

    target: Any  # StdioServerParameters or a streamable-HTTP transport
    notifications: int = 0
    reads: int = 0
    read_errors: int = 0
    held: dict[str, str] = field(default_factory=dict)  # uri -> digest of the last completed read
    completions: list[tuple[str, str, float]] = field(default_factory=list)  # (uri, digest, wall time)
    arrivals: dict[str, float] = field(default_factory=dict)  # uri -> wall time of the last notification
    _client: Client | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _waiters: dict[tuple[str, str], asyncio.Future[float]] = field(default_factory=dict)

    async def start(self) -> None:
        self._client = Client(self.target, mode="legacy", cache=None, message_handler=self._on_message,
                              client_info=types.Implementation(name="naive-baseline", version="0"))
        await asyncio.wait_for(self._client.__aenter__(), 30)

    async def subscribe(self, uris: Sequence[str], concurrency: int = 16) -> None:
        assert self._client is not None
        client = self._client
        gate = asyncio.Semaphore(concurrency)

        async def one(uri: str) -> None:
            async with gate:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", MCPDeprecationWarning)
                    await client.subscribe_resource(uri)

        await asyncio.gather(*(one(u) for u in uris))

    async def read_all(self, uris: Sequence[str], concurrency: int = 16) -> None:
        """Initial state: one read per URI (not counted by the benchmark's churn figures)."""
        gate = asyncio.Semaphore(concurrency)

        async def one(uri: str) -> None:
            async with gate:
                await self._read(uri)

        await asyncio.gather(*(one(u) for u in uris))

    def expect(self, uri: str, digest: str) -> asyncio.Future[float]:
        """A future resolved with the wall time at which a read of ``uri`` returned ``digest``."""
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters[(uri, digest)] = fut
        return fut

    async def _on_message(self, message: object) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            uri = str(message.params.uri)
            self.notifications += 1
            self.arrivals[uri] = time.time()
            task = asyncio.create_task(self._read(uri))  # never block the receive loop
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _read(self, uri: str) -> None:
        assert self._client is not None
        self.reads += 1
        try:
            result = await self._client.read_resource(uri)
        except Exception:
            self.read_errors += 1
            return
        digest = read_digest(result)
        now = time.time()
        self.held[uri] = digest  # naive: the last read to complete wins, whatever its age
        self.completions.append((uri, digest, now))
        fut = self._waiters.pop((uri, digest), None)
        if fut is not None and not fut.done():
            fut.set_result(now)

    async def idle(self, timeout: float = 10.0) -> None:
        """Wait until no read is in flight."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    async def aclose(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            client, self._client = self._client, None
            try:
                await asyncio.wait_for(client.__aexit__(None, None, None), 10)
            except BaseException:  # noqa: BLE001 - a transport torn down mid-read must not fail the report
                pass


@dataclass(frozen=True)
class FloorSample:
    total: float  # mutation committed -> read of it completed (seconds)
    notify: float  # mutation committed -> notification arrived
    read: float  # notification arrived -> read completed


async def measure_floor(client: NaiveClient, control: Any, uri: str, samples: int) -> list[FloorSample]:
    """``samples`` sequential mutations of ``uri`` (which ``client`` subscribed to), each awaited."""
    from datetime import datetime

    out: list[FloorSample] = []
    for i in range(samples):
        text = f"{uri} floor sample {i} {time.time_ns()}"
        done = client.expect(uri, text_digest(text))
        m = await control.edit(uri, text=text)
        committed = datetime.fromisoformat(m["committed_at"]).timestamp()
        try:
            finished = await asyncio.wait_for(done, 10)
        except TimeoutError:
            continue  # a lost notification: not a floor sample
        arrived = client.arrivals.get(uri, finished)
        out.append(FloorSample(total=finished - committed, notify=arrived - committed,
                               read=finished - arrived))
    return out
