"""The session's sweep of the state dirs killed sessions left under /dev/shm/mcpsync-tests (or
.state/t; tests/conftest.py, ``pytest_sessionstart``): a dir whose maker is dead goes, a live
maker's stays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import pytest

from mcpsync.worker.stack.common import command_line
from tests import conftest


def test_session_start_removes_the_dirs_of_dead_makers_only(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "SHARED_MEMORY", tmp_path)
    monkeypatch.setattr(conftest, "ON_DISK_ROOT", tmp_path / "disk")
    root = conftest.memory_backed_root()
    assert root == tmp_path / "mcpsync-tests"
    dead = subprocess.Popen(["true"])
    dead.wait()  # reaped: its pid names no process
    sibling = subprocess.Popen(["sleep", "30"])  # a live process other than this one (an xdist worker's)
    try:
        stale = root / f"s{dead.pid}-k1ll3d00"
        (stale / "pgdata").mkdir(parents=True)
        (stale / "pgdata" / "base").write_bytes(b"x" * 1024)
        mine = conftest.private_state_dir("s")
        theirs = root / f"t{sibling.pid}-w0rk3r00"
        theirs.mkdir()
        other = root / "not-a-state-dir"
        other.mkdir()
        on_disk = tmp_path / "disk" / f"o{dead.pid}-k1ll3d00"  # where dirs go without /dev/shm
        on_disk.mkdir(parents=True)
        conftest.pytest_sessionstart()
        assert not on_disk.exists()
        assert mine.name.startswith(f"s{os.getpid()}-")
        assert sorted(p.name for p in root.iterdir()) == sorted([mine.name, theirs.name, other.name])
    finally:
        sibling.kill()
        sibling.wait()


def _orphan(*args: str) -> int:
    """A process that outlives its parent (as a killed session's servers do): its pid."""
    out = subprocess.run(["sh", "-c", 'nohup "$@" >/dev/null 2>&1 & echo $!', "sh", *args],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def test_the_servers_a_killed_session_left_on_its_dir_are_stopped(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(conftest, "SHARED_MEMORY", tmp_path)
    root = conftest.memory_backed_root()
    assert root is not None
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = root / f"s{dead.pid}-k1ll3d00"
    (stale / "temporal").mkdir(parents=True)
    sleeper = (sys.executable, "-c", "import time; time.sleep(60)")  # the arguments after it are argv
    server = _orphan(*sleeper, "--db-filename", f"{stale}/temporal/temporal.sqlite")
    bystander = _orphan(*sleeper, "--db-filename", f"{tmp_path}/elsewhere/temporal.sqlite")
    assert str(stale) in command_line(server) and "elsewhere" in command_line(bystander)
    try:
        conftest.pytest_sessionstart()
        assert not stale.exists()
        assert command_line(server) == ""  # exited (a zombie has no command line)
        assert "elsewhere" in command_line(bystander)
    finally:
        for pid in (server, bystander):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
