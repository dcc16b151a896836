"""The dev server's mutable-state cache bound is on its command line (temporal/dynamic_config.toml)."""

from __future__ import annotations

from pathlib import Path

from mcpsync.worker.stack.temporal import TemporalDevServer


def _flags(server: TemporalDevServer) -> dict[str, str]:
    cmd = server.command()
    values = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--dynamic-config-value"]
    return dict(v.split("=", 1) for v in values)


def test_the_mutable_state_cache_is_bounded_below_the_dev_servers_8096(tmp_path: Path) -> None:
    server = TemporalDevServer._prepare(tmp_path, 7233, 8233, "default", None, None)
    assert int(_flags(server)["history.hostLevelCacheMaxSize"]) == 1024

