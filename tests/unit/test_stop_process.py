"""``stop_process`` (worker/stack/common.py): SIGTERM, SIGKILL after the grace, only a process whose
command line holds the marker, done once the process is reaped (here by a thread standing in for the
orphan's parent, init)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

from mcpsync.worker.stack.common import command_line, stop_process


def _child(marker: str, *, ignore_term: bool = False) -> subprocess.Popen[bytes]:
    code = ("import signal, sys, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + "sys.stdout.write('up\\n'); sys.stdout.flush(); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, marker], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # its handler is set
    return proc


def _reaped_by_a_parent(proc: subprocess.Popen[bytes]) -> threading.Thread:
    reaper = threading.Thread(target=proc.wait, daemon=True)
    reaper.start()
    return reaper


def test_a_process_that_exits_on_sigterm_is_gone_at_once() -> None:
    marker = f"stop-me-{uuid.uuid4()}"
    proc = _child(marker)
    reaper = _reaped_by_a_parent(proc)
    started = time.monotonic()
    assert stop_process(proc.pid, marker, grace=5.0)
    assert time.monotonic() - started < 4.0
    reaper.join(5)
    assert proc.returncode == -15  # SIGTERM


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    marker = f"stop-me-{uuid.uuid4()}"
    proc = _child(marker, ignore_term=True)
    reaper = _reaped_by_a_parent(proc)
    started = time.monotonic()
    assert stop_process(proc.pid, marker, grace=0.3)
    assert time.monotonic() - started >= 0.3
    reaper.join(5)
    assert proc.returncode == -9  # SIGKILL


def test_a_zombie_is_there_until_its_parent_reaps_it() -> None:
    marker = f"stop-me-{uuid.uuid4()}"
    proc = _child(marker)
    assert not stop_process(proc.pid, marker, grace=0.2)  # nobody reaps it: a zombie stays
    assert proc.wait(5) == -15


def test_a_process_without_the_marker_is_not_signalled() -> None:
    proc = _child(f"someone-else-{uuid.uuid4()}")
    try:
        assert stop_process(proc.pid, "stop-me-not-this-one", grace=0.1)
        assert proc.poll() is None and "someone-else" in command_line(proc.pid)
    finally:
        proc.kill()
        proc.wait(5)
