"""The fixture MCP servers of a benchmark run (``mcpsync.fixture``): over HTTP a process the run starts,
over stdio the process the session host spawns, with its control plane once its ready file exists."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import SUBJECT
from mcpsync.fixture import FixtureControl, FixtureProcess, stdio_command, wait_ready_file
from mcpsync.worker.main.config import ServerConfig

__all__ = ["BenchFixture"]


@dataclass
class BenchFixture:
    """One fixture MCP server of a run and its ``ServerConfig``: over HTTP a process this run starts, over
    stdio the one the session host spawns (its control plane is known once it wrote its ready file)."""

    config: ServerConfig
    process: FixtureProcess | None
    ready_file: Path | None

    @classmethod
    async def start(cls, stack: AsyncExitStack, transport: str, work: Path, name: str, *,
                    subscribe: bool = True, catalog: bool = True) -> BenchFixture:
        opts: dict[str, Any] = {"seed": "none", "log_level": "WARNING", "subscribe": subscribe}
        if transport == "http":
            fx = await FixtureProcess.start_http(work, **opts)
            stack.push_async_callback(fx.stop)
            return cls(ServerConfig(name=name, transport="http", url=fx.mcp_url, subjects=[SUBJECT],
                                    catalog=catalog),
                       fx, None)
        ready = work / f"ready-{name}.json"
        command, env = stdio_command(ready_file=ready, **opts)
        return cls(ServerConfig(name=name, transport="stdio", command=command, env=env, subjects=[SUBJECT],
                                catalog=catalog), None, ready)

    async def control(self, stack: AsyncExitStack) -> FixtureControl:
        """The control plane; over stdio it waits for the process the session host started."""
        if self.process is not None:
            return self.process
        assert self.ready_file is not None
        info = await wait_ready_file(self.ready_file, timeout=30)
        ctl = FixtureControl(info["control_url"])
        stack.push_async_callback(ctl.aclose)
        return ctl

