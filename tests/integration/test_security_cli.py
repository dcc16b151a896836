"""The CLI and config boundary (BOUNDARIES.md "CLI and config"): what a newcomer or a script with a
typo sends the ``mcpsync`` command line gets one ``mcpsync: error:`` line and the exit code
docs/cli.md documents, never a traceback; the environment overrides the stack it finds as it
overrides a config file.
The real ``mcpsync`` as a subprocess (forked by tests.cli_process, or a fresh interpreter where the
first moments of the process are the point), no Temporal and no stack: every case here fails before
anything is contacted, or against the session's PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from mcpsync.activities.ledger import Ledger
from mcpsync.worker.cli.root import build_parser
from mcpsync.worker.stack.common import REPO_ROOT, free_port
from tests import cli_process

BIG = "99999999999999999999"  # beyond int64: PostgreSQL's bigint refuses it


def _cli(*args: str, env: dict[str, str] | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``mcpsync *args`` with no stack (a state dir that does not exist) and no database URL."""
    base = {**cli_process.without_database_url(), "MCPSYNC_STATE_DIR": "/nonexistent-state"}
    return cli_process.run(args, env={**base, **(env or {})}, timeout=timeout)


def _error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcpsync: error: "), r.stderr
    assert not lines[0].startswith("mcpsync: error: mcpsync: "), lines[0]
    return lines[0]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "mcpsync.toml"
    path.write_text('[temporal]\naddress = "127.0.0.1:1"\nconnect_timeout_seconds = 1.5\n'
                    f'[database]\nurl = "postgresql://u@127.0.0.1:{free_port()}/x"\n'
                    '[[servers]]\nname = "docs"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n'
                    'subjects = ["alice"]\n')
    return path


@pytest.mark.parametrize("args,says", [
    (["history", "--server", "s", "--uri", "demo://x", "--limit", BIG], "--limit: must be at most"),
    (["describe", "--server", "s", "--uri", "demo://x", "--limit", BIG], "--limit: must be at most"),
    (["outbox", "tail", "--limit", BIG], "--limit: must be at most"),
    (["outbox", "poll", "--consumer", "c", "--limit", BIG], "--limit: must be at most"),
    (["outbox", "tail", "--after", BIG], "--after: must be at most"),
    (["outbox", "ack", "--consumer", "c", "--position", BIG], "--position: must be at most"),
    (["serve", "--port", "-5"], "--port: must be a port between 0 and 65535, not -5"),
    (["serve", "--port", "99999"], "--port: must be a port between 0 and 65535, not 99999"),
    (["serve", "--port", "nan"], "--port: 'nan' is not an integer"),
    (["serve", "--max-age", "-1"], "--max-age: must be more than 0 seconds"),
    (["serve", "--max-age", "0"], "--max-age: must be more than 0 seconds"),
    (["serve", "--max-age", "nan"], "--max-age: 'nan' is not a finite number"),
    (["serve", "--max-age", "inf"], "--max-age: 'inf' is not a finite number"),
    (["serve", "--page-size", "0"], "--page-size: must be at least 1"),
    (["serve", "--client-buffer", BIG], "--client-buffer: must be at most"),
    (["up", "--serve-port", "-5"], "--serve-port: must be a port between 0 and 65535, not -5"),
    (["up", "--serve-port", "99999"], "--serve-port: must be a port between 0 and 65535"),
    (["up", "--metrics-port", "inf"], "--metrics-port: 'inf' is not an integer"),
    (["down", "--timeout", "inf"], "--timeout: 'inf' is not a finite number"),
])
def test_numeric_flags_beyond_their_range_are_one_line_and_exit_2(args: list[str], says: str) -> None:
    r = _cli(*args)
    assert r.returncode == 2, r.stderr
    line = _error_line(r)
    command = " ".join(a for a in args[:2] if not a.startswith("-"))
    assert line.startswith(f"mcpsync: error: mcpsync {command}: argument ") and says in line, line
    assert line.endswith(f"(see 'mcpsync {command} --help')")


def test_an_unknown_flag_names_its_command_once() -> None:
    r = _cli("history", "--server", "s", "--uri", "demo://x", "--bogus")
    assert r.returncode == 2
    assert _error_line(r) == ("mcpsync: error: mcpsync history: unrecognized arguments: --bogus "
                              "(see 'mcpsync history --help')")
    r = _cli("outbox", "tail", "--bogus")
    assert r.returncode == 2
    assert _error_line(r) == ("mcpsync: error: mcpsync outbox tail: unrecognized arguments: --bogus "
                              "(see 'mcpsync outbox tail --help')")
    r = _cli("--bogus")  # the root's own error does not repeat 'mcpsync'
    assert r.returncode == 2
    assert _error_line(r) == ("mcpsync: error: the following arguments are required: COMMAND "
                              "(see 'mcpsync --help')")


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def test_a_busy_or_unbindable_serve_address_is_refused_before_anything_starts(
        config: Path, database_url: str, taken_port: int, tmp_path: Path) -> None:
    env = {"MCPSYNC_SERVE_TOKENS": '{"alice": "s3cret-token"}', "MCPSYNC_DATABASE_URL": database_url}
    r = _cli("--config", str(config), "serve", "--port", str(taken_port), env=env)
    assert r.returncode == 2, r.stderr
    assert _error_line(r).startswith(f"mcpsync: error: cannot listen on 127.0.0.1:{taken_port} (--host, "
                                     "--port): ")
    # An address of no interface here (TEST-NET-1): refused at bind time, nothing is sent anywhere.
    r = _cli("--config", str(config), "serve", "--host", "192.0.2.1", "--port", "0", env=env)
    assert r.returncode == 2, r.stderr
    assert _error_line(r).startswith("mcpsync: error: cannot listen on 192.0.2.1:0 (--host, --port): ")
    # 'up' refuses its serve port before it starts a single service.
    state = tmp_path / "state"
    r = _cli("up", "--port", "0", "--ui-port", "0", "--no-metrics", "--serve-port", str(taken_port),
             env={"MCPSYNC_STATE_DIR": str(state), "MCPSYNC_DATABASE_URL": database_url})
    assert r.returncode == 2, r.stderr
    assert _error_line(r).startswith(f"mcpsync: error: cannot listen on 127.0.0.1:{taken_port} "
                                     "(--serve-port): ")
    assert r.stdout == "" and not (state / "temporal").exists()


def _loading(pid: int, library: str, timeout: float = 30.0) -> bool:
    """Wait until process ``pid`` has mapped a shared library whose path names ``library``; False if
    it ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if library in Path(f"/proc/{pid}/maps").read_text():
                return True
        except OSError:
            return False
        time.sleep(0.002)
    return False


def test_ctrl_c_while_the_cli_starts_is_quiet_and_exit_130() -> None:
    # A fresh interpreter: the first second of the process is its imports (the fork server has them).
    # Ctrl-C comes while they load (the first and a later of the CLI's native libraries mapped): how
    # long the interpreter takes to reach the CLI's entry point depends on how busy the box is.
    for library in ("temporal_sdk_bridge", "_pydantic_core"):
        proc = subprocess.Popen([sys.executable, "-m", "mcpsync.worker.cli", "list"], cwd=REPO_ROOT,
                                env={**os.environ, "MCPSYNC_STATE_DIR": "/nonexistent-state"},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert _loading(proc.pid, library), f"the CLI ended before it loaded {library}"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err.decode()
        assert proc.returncode == 130, (library, proc.returncode, err.decode())
        assert out == b""


def _runtime_file(state: Path, pid: int, config: Path) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "runtime.json").write_text(json.dumps({
        "temporal_address": "127.0.0.1:1", "namespace": "default",
        "database_url": "postgresql://u@127.0.0.1:1/x", "ui_url": "http://127.0.0.1:1",
        "config_path": str(config), "pid": pid}))


@pytest.fixture
def live_stack_pid() -> Iterator[int]:
    """A live process whose command line names mcpsync: what a running 'mcpsync up' looks like."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "mcpsync"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_the_environment_overrides_the_running_stacks_temporal_as_its_database(
        tmp_path: Path, config: Path, live_stack_pid: int) -> None:
    state = tmp_path / "state"
    _runtime_file(state, live_stack_pid, config)
    env_addr = f"127.0.0.1:{free_port()}"
    r = _cli("status", "--server", "docs", "--subject", "alice", "--uri", "demo://x",
             env={"MCPSYNC_STATE_DIR": str(state), "MCPSYNC_TEMPORAL_ADDRESS": env_addr})
    assert r.returncode == 6, r.stderr
    line = _error_line(r)
    assert env_addr in line and line.endswith("address from environment variable MCPSYNC_TEMPORAL_ADDRESS")
    db_port = free_port()
    r = _cli("list", env={"MCPSYNC_STATE_DIR": str(state),
                          "MCPSYNC_DATABASE_URL": f"postgresql://u@127.0.0.1:{db_port}/x"})
    assert r.returncode == 6 and f"127.0.0.1:{db_port}" in _error_line(r)
    assert _error_line(r).endswith("address from environment variable MCPSYNC_DATABASE_URL")


def test_down_with_a_stale_runtime_file_is_6_and_removes_it(tmp_path: Path, config: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    state = tmp_path / "state"
    _runtime_file(state, dead.pid, config)
    r = _cli("down", env={"MCPSYNC_STATE_DIR": str(state)})
    assert r.returncode == 6, (r.stdout, r.stderr)
    assert _error_line(r) == (f"mcpsync: error: no stack running on {state} (mcpsync up pid {dead.pid} is "
                              "gone); removed the stale runtime file (the next 'mcpsync up' reclaims the "
                              "dev server and PostgreSQL it left)")
    assert not (state / "runtime.json").exists()


def test_an_unparseable_database_url_is_a_configuration_error(config: Path) -> None:
    for args in (["list"], ["outbox", "tail"], ["migrate"]):
        r = _cli("--config", str(config), *args, env={"MCPSYNC_DATABASE_URL": "host=x password=hunter2 ==="})
        assert r.returncode == 2, r.stderr
        line = _error_line(r)
        assert "MCPSYNC_DATABASE_URL is not a PostgreSQL connection string" in line and "hunter2" not in line


@pytest.mark.parametrize("value", ["uvlooop", "\x1b[31masyncio", "trio" * 3000])
def test_an_unknown_event_loop_is_2_in_one_line_before_anything_runs(config: Path, value: str) -> None:
    for args in (["list"], ["worker", "--role", "ingress"]):
        r = _cli("--config", str(config), *args, env={"MCPSYNC_EVENT_LOOP": value})
        assert r.returncode == 2, r.stderr
        line = _error_line(r)
        assert "MCPSYNC_EVENT_LOOP=" in line and "(uvloop or asyncio)" in line and "\x1b" not in line


def test_list_of_an_unknown_server_is_2_not_an_empty_result(config: Path, database_url: str) -> None:
    for args in (["list", "--server", "nope"], ["list", "--watch", "--server", "nope"]):
        r = _cli("--config", str(config), *args, env={"MCPSYNC_DATABASE_URL": database_url})
        assert r.returncode == 2, r.stderr
        assert "unknown server 'nope'" in _error_line(r)


def test_an_unreachable_mcp_server_is_6_and_named_by_its_url(tmp_path: Path) -> None:
    port = free_port()
    path = tmp_path / "probe.toml"
    path.write_text(f'[[servers]]\nname = "docs"\ntransport = "http"\n'
                    f'url = "http://bot:hunter2@127.0.0.1:{port}/mcp?token=t0psecret&x=1"\n')
    r = _cli("--config", str(path), "probe", "--server", "docs", "--timeout", "5")
    assert r.returncode == 6, r.stderr
    line = _error_line(r)
    assert f"(http http://bot:***@127.0.0.1:{port}/mcp?token=***&x=***)" in line, line
    assert "hunter2" not in line and "t0psecret" not in line


def _leaves(parser: object) -> Iterator[object]:
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    children = [child for action in parser._actions if isinstance(action, argparse._SubParsersAction)
                for child in action.choices.values()]
    if not children:
        yield parser
    for child in children:
        yield from _leaves(child)


def test_help_says_what_is_true_once() -> None:
    r = _cli("outbox", "tail", "--help")
    assert r.returncode == 0
    after = " ".join(r.stdout.split("\n  --after POSITION", 1)[1].split("\n  --limit", 1)[0].split())
    assert after.startswith("start after this outbox id (0: from the oldest event; default: the newest "
                            "--limit events)"), after
    r = _cli("outbox", "poll", "--help")
    examples = r.stdout.split("examples:", 1)[1]
    assert "--register" in examples.split("registers a new name")[0].splitlines()[-1]
    import argparse

    problems = []
    for leaf in _leaves(build_parser()):
        assert isinstance(leaf, argparse.ArgumentParser)
        if not leaf.description:
            problems.append(f"{leaf.prog}: no description")
        formatter = leaf._get_formatter()
        for action in leaf._actions:
            text = formatter._expand_help(action) if action.help else ""
            if text.lower().count("default") > 1:
                problems.append(f"{leaf.prog} {action.option_strings}: {text}")
    assert problems == []


def test_the_example_indexer_stops_on_ctrl_c_at_any_moment_with_exit_0(database_url: str, ledger: Ledger,
                                                                        tmp_path: Path) -> None:
    # ``ledger``: the session's database, migrated.
    def indexer(name: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-m", "examples.indexer", "--database-url", database_url,
                                 "--consumer", name, "--index", str(tmp_path / f"{name}.sqlite")],
                                cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)

    early = indexer(f"early-{os.getpid()}")
    time.sleep(0.2)  # its imports
    early.send_signal(signal.SIGINT)
    out, err = early.communicate(timeout=30)
    assert (early.returncode, err) == (0, b""), err.decode()
    name = f"idx-{os.getpid()}-{time.monotonic_ns()}"
    proc = indexer(name)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        assert first.startswith(f"indexer {name}: following the outbox"), first
        time.sleep(0.5)  # its first (empty) batch
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert (proc.returncode, err) == (0, b""), err.decode()
        # The session's database may hold other tests' outbox rows: the line names what the indexer acked.
        with psycopg.connect(database_url) as conn:
            row = conn.execute("SELECT position FROM outbox_consumers WHERE name = %s", (name,)).fetchone()
        assert row is not None
        said = "nothing acknowledged in this run" if row[0] == 0 else f"last acknowledged position {row[0]}"
        assert out.decode().splitlines()[-1] == f"indexer {name}: stopped; {said}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
