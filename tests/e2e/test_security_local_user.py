"""Another local user against ``mcpsync up``: one real stack (dev server, embedded PostgreSQL, demo
MCP server, serve) started as the README says, with a serve token already configured. Nothing under
its state dir is readable by anyone but its owner, its output never shows a token it did not make,
and a state dir whose PostgreSQL socket path would not fit is refused before anything exists."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mcpsync.worker.stack.common import REPO_ROOT
from mcpsync.worker.stack.postgres import SOCKET_PATH_MAX
from tests.conftest import eventually, private_state_dir, unique
from tests.e2e.test_cli import _one_error_line, _up_log, run_cli
from tests.e2e.test_e2e_faults import MCPSYNC


@dataclass(frozen=True)
class UpStack:
    state: Path
    log: Path
    configured_token: str
    modes: list[tuple[str, int, bool]]  # (path under the state dir, permission bits, is a directory)


def _modes(root: Path) -> list[tuple[str, int, bool]]:
    """Every file and directory under ``root`` (itself included) but sockets: path, mode bits, is a dir."""
    found = []
    for where, dirs, files in os.walk(root):
        for name in [".", *dirs, *files]:
            path = Path(where) / name
            st = path.lstat()
            if stat.S_ISSOCK(st.st_mode):
                continue  # PostgreSQL's socket: reachable only through its 0700 data dir
            found.append((str(path.relative_to(root)), stat.S_IMODE(st.st_mode), stat.S_ISDIR(st.st_mode)))
    return found


@pytest.fixture(scope="module")
async def up_stack() -> AsyncIterator[UpStack]:
    """``mcpsync up`` on the embedded default with MCPSYNC_SERVE_TOKENS holding the demo subject's
    token; the state dir's modes taken while everything runs, then a clean stop."""
    where = private_state_dir("l")
    state, log_path = where / "st", where / "up.log"
    token = unique("configured-token")
    env = {**os.environ, "MCPSYNC_STATE_DIR": str(state),
           "MCPSYNC_SERVE_TOKENS": f'{{"anonymous": "{token}"}}'}
    env.pop("MCPSYNC_DATABASE_URL", None)
    # What an older version left: a world-readable Temporal dir and log.
    (state / "temporal").mkdir(parents=True)
    (state / "temporal" / "temporal.log").write_text("an older run's log\n")
    os.chmod(state, 0o755)
    os.chmod(state / "temporal", 0o755)
    os.chmod(state / "temporal" / "temporal.log", 0o644)
    with log_path.open("wb") as log:
        up = await asyncio.create_subprocess_exec(
            *MCPSYNC, "up", "--port", "0", "--ui-port", "0", "--metrics-port", "0", "--serve-port", "0",
            "--churn", "0", "--exit-after", "120", cwd=REPO_ROOT, env=env, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        await eventually(lambda: "ready in" in log_path.read_text(), timeout=60, what="'up' ready")
        assert up.returncode is None, _up_log(log_path)
        yield UpStack(state=state, log=log_path, configured_token=token, modes=_modes(state))
    finally:
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(up.wait(), 30)
        finally:
            import shutil

            shutil.rmtree(where, ignore_errors=True)


async def test_up_prints_only_a_token_it_generated(up_stack: UpStack) -> None:
    out = up_stack.log.read_text()
    printed = up_stack.configured_token in out  # a bool: the token never enters the report
    assert not printed, "a token from MCPSYNC_SERVE_TOKENS printed"
    line = next(ln for ln in out.splitlines() if "mcpsync serve " in ln)
    assert re.search(r"\(subject anonymous; bearer token from MCPSYNC_SERVE_TOKENS\)$", line), line


async def test_state_dir_is_private_to_its_owner(up_stack: UpStack) -> None:
    """Files 0600 and new directories 0700, including what the Temporal dev server, the demo MCP
    server and PostgreSQL create; a directory an older version left (and the state dir itself, as
    root, for PostgreSQL's user) may keep a traverse bit, never a listing."""
    modes = {path: (mode, is_dir) for path, mode, is_dir in up_stack.modes}
    expected = {"temporal", "temporal/temporal.sqlite", "temporal/temporal.log", "demo-server", "pgdata",
                "runtime.json"}
    assert expected <= set(modes), modes
    wrong = {path: oct(mode) for path, (mode, is_dir) in modes.items()
             if mode & (0o066 if path in (".", "temporal") else 0o077)}
    assert not wrong, f"readable, writable or traversable by others: {wrong}"
    assert modes["demo-server"] == (0o700, True) and modes["temporal/temporal.log"] == (0o600, False)


async def test_up_refuses_a_long_socket_path_before_starting_anything(tmp_path: Path) -> None:
    state = tmp_path / ("s" * max(1, SOCKET_PATH_MAX - len(str(tmp_path))))
    r = await run_cli("up", "--port", "0", "--ui-port", "0", "--metrics-port", "0",
                      env={"MCPSYNC_STATE_DIR": str(state)})
    assert r.code == 6
    assert "socket path" in _one_error_line(r) and "MCPSYNC_STATE_DIR" in r.err
    assert not state.exists(), "nothing created, nothing started (the dev server makes <state>/temporal)"
