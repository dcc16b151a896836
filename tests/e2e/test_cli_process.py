"""The CLI fork server (tests.cli_process) is a faithful stand-in for a fresh interpreter: the
same stdout, stderr and exit code as ``python -m mcpsync.worker.cli`` for a success, a documented
one-line failure, a usage error and ``--help``; a run whose environment the pre-imported state
cannot honour runs in a fresh interpreter."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from mcpsync.worker.cli.common import ExitCode
from mcpsync.worker.stack.common import REPO_ROOT, command_line, process_alive
from tests import cli_process
from tests.conftest import eventually

ENV = {**cli_process.without_database_url(), "MCPSYNC_STATE_DIR": "/nonexistent-state"}


def _fresh(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cli_process.FRESH, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def _same(args: list[str], env: dict[str, str] = ENV) -> subprocess.CompletedProcess[str]:
    """Runs ``args`` forked and fresh; asserts the two alike and that the first was forked."""
    forked_before = cli_process.forked_runs
    forked = cli_process.run(args, env=env)
    assert cli_process.forked_runs == forked_before + 1, "the run fell back to a fresh interpreter"
    fresh = _fresh(args, env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    return forked


@pytest.mark.parametrize("args", [["--help"], ["list", "--help"], ["--version"]])
def test_help_and_version_are_the_fresh_interpreters(args: list[str]) -> None:
    r = _same(args)
    assert r.returncode == 0 and r.stdout.strip() and not r.stderr


def test_a_success_through_main_is_the_fresh_interpreters(tmp_path: Path, database_url: str) -> None:
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    first = cli_process.run(["--config", str(conf), "migrate"], env=ENV)
    assert first.returncode == 0 and first.stdout.startswith("migrations applied: "), first.stderr
    again = _same(["--config", str(conf), "migrate"])
    assert again.returncode == 0 and again.stdout == "migrations applied: none (up to date)\n"
    listed = _same(["--config", str(conf), "list", "-o", "json"])
    assert listed.returncode == 0 and listed.stdout.startswith("[") and not listed.stderr


def test_a_documented_failure_is_the_fresh_interpreters() -> None:
    nothing = _same(["list"])  # no --config and no runtime file: nothing runs here
    assert nothing.returncode == ExitCode.UNAVAILABLE and nothing.stdout == ""
    assert nothing.stderr.startswith("mcpsync: error: nothing is running here")
    assert nothing.stderr.count("\n") == 1
    usage = _same(["list", "--no-such-flag"])
    assert usage.returncode == ExitCode.USAGE and "--no-such-flag" in usage.stderr


async def test_the_async_run_is_the_sync_one() -> None:
    forked = await cli_process.arun(["list"], env=ENV)
    assert (forked.returncode, forked.stderr) == (ExitCode.UNAVAILABLE, _fresh(["list"], ENV).stderr)


def test_a_different_environment_runs_in_a_fresh_interpreter(tmp_path: Path) -> None:
    # Only an interpreter that starts runs sitecustomize from PYTHONPATH: the marker proves a fresh one.
    marker = tmp_path / "started"
    (tmp_path / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('fresh')\n")
    env = {**ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    forked_before = cli_process.forked_runs
    r = cli_process.run(["list"], env=env)
    assert cli_process.forked_runs == forked_before and marker.read_text() == "fresh"
    assert r.returncode == ExitCode.UNAVAILABLE and r.stderr.startswith("mcpsync: error: nothing is running")
    # A difference in MCPSYNC_* variables alone is forked, and the child sees it.
    other = cli_process.run(["list"], env={**ENV, "MCPSYNC_STATE_DIR": str(tmp_path / "elsewhere")})
    assert cli_process.forked_runs == forked_before + 1 and str(tmp_path / "elsewhere") in other.stderr


def test_a_long_running_command_runs_until_the_timeout_kills_it(tmp_path: Path, database_url: str) -> None:
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    with pytest.raises(subprocess.TimeoutExpired):
        cli_process.run(["--config", str(conf), "list", "--watch", "--interval", "0.2"], env=ENV, timeout=2)
    server = cli_process.server_pid()
    time.sleep(0.5)  # the killed child's exit code goes to a caller that has gone: the server lives on
    assert server is not None and cli_process.server_pid() == server
    assert cli_process.run(["--version"], env=ENV).returncode == 0 and cli_process.server_pid() == server


def test_a_spawned_command_runs_until_a_signal_stops_it(tmp_path: Path, database_url: str) -> None:
    """``spawn``: a command that runs until stopped (``list --watch``), forked from the server, writes
    to the caller's stdout pipe and its stderr file while it runs, and reports the signal that stopped
    it as its exit code; an environment that needs a fresh interpreter is refused."""
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    forked_before = cli_process.forked_runs
    with (tmp_path / "stderr").open("wb") as err:
        child = cli_process.spawn(["--config", str(conf), "list", "--watch", "--interval", "0.2"], env=ENV,
                                  stderr=err.fileno())
    try:
        assert cli_process.forked_runs == forked_before + 1
        server = cli_process.server_pid()
        assert str(child.pid) in Path(f"/proc/{server}/task/{server}/children").read_text().split()
        with os.fdopen(child.stdout, "rb") as out:
            assert out.readline().strip(), "the first table of the watch"
            assert child.poll() is None
            child.send_signal(signal.SIGKILL)
            assert child.wait(10) == -signal.SIGKILL and child.poll() == -signal.SIGKILL
            out.read()  # the pipe ends with the child
    finally:
        child.send_signal(signal.SIGKILL)
    with pytest.raises(ValueError):
        cli_process.spawn(["--version"], env={**ENV, "PYTHONHASHSEED": "1"}, stderr=2)


async def test_a_forked_child_passes_for_an_mcpsync_process(tmp_path: Path, database_url: str) -> None:
    # mcpsync tells its own processes from a recycled pid by the command line (runtime.json's pid,
    # 'mcpsync down'): a forked child's names the CLI as a fresh interpreter's does.
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    args = ["--config", str(conf), "list", "--watch", "--interval", "0.2"]
    watch = asyncio.create_task(cli_process.arun(args, env=ENV, timeout=3))

    def children() -> list[int]:
        server = cli_process.server_pid()
        path = Path(f"/proc/{server}/task/{server}/children")
        return [int(pid) for pid in path.read_text().split()] if server and path.exists() else []

    pids = await eventually(children, timeout=10, what="the forked 'list --watch'")
    assert all(process_alive(pid, expect_in_cmdline=("mcpsync", "mcpsync.worker.cli")) for pid in pids)
    assert all("mcpsync.worker.cli" in command_line(pid) for pid in pids), [command_line(p) for p in pids]
    with pytest.raises(subprocess.TimeoutExpired):
        await watch
