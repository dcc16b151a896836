"""What a newcomer trips on (issue 26): bad input is one line and a documented exit code, never a
traceback; one meaning has one exit code. The real ``mcpsync`` as a subprocess, against the real
stack where one is needed (Temporal dev server, PostgreSQL, the fixture MCP server, the worker)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.stack.common import REPO_ROOT, free_port, process_alive
from mcpsync.worker.stack.temporal import TemporalDevServer
from tests import cli_process
from tests.conftest import PrivateDatabase, eventually, ledger_rows
from tests.e2e.test_cli import VENV_BIN, _one_error_line, _subscribed, _table, cli_stack, run_cli
from tests.e2e.test_e2e_faults import MCPSYNC

# --- no stack needed -------------------------------------------------------------------------


@pytest.mark.parametrize("args,flag", [
    (["history", "--server", "s", "--uri", "demo://x", "--limit", "-1"],
     "--limit: must be at least 1, not -1"),
    (["history", "--server", "s", "--uri", "demo://x", "--limit", "0"], "--limit: must be at least 1, not 0"),
    (["describe", "--server", "s", "--uri", "demo://x", "--limit", "-5"], "--limit: must be at least 1"),
    (["status", "--server", "s", "--uri", "demo://x", "--timeout", "-1"], "--timeout: must be more than 0 "
                                                                          "seconds"),
    (["subscribe", "--server", "s", "--uri", "demo://x", "--wait", "--timeout", "0"], "--timeout: must be "
                                                                                      "more"),
    (["list", "--watch", "--interval", "-2"], "--interval: must be more than 0 seconds, not -2"),
    (["outbox", "tail", "--limit", "-3"], "--limit: must be at least 1"),
    (["outbox", "tail", "--after", "-1"], "--after: must not be negative"),
    (["outbox", "poll", "--consumer", "c", "--limit", "0"], "--limit: must be at least 1"),
    (["outbox", "ack", "--consumer", "c", "--position", "-1"], "--position: must not be negative"),
    (["prune", "--keep-days", "-1"], "--keep-days: must not be negative"),
    (["scan", "--server", "s", "--now", "--timeout", "-1"], "--timeout: must be more than 0 seconds"),
    (["catalog", "start", "--server", "s", "--rescan-seconds", "0"], "--rescan-seconds: must be more than 0"),
    (["up", "--port", "70000"], "--port: must be a port between 0 and 65535"),
    (["up", "--churn", "-1"], "--churn: must not be negative"),
    (["simulate", "--schedules", "0"], "--schedules: must be at least 1"),
    (["content", "get", "--receipt", "x", "--subject", "a"], "--receipt: 'x' is not an integer"),
    (["answer", "check", "--answer-id", "a", "--max-unwatched-age", "nan"], "is not a finite number"),
])
async def test_bad_flag_values_are_refused_at_parse_time(args: list[str], flag: str) -> None:
    # No configuration and no stack: the value is refused before anything is looked for.
    r = await run_cli(*args)
    assert r.code == 2, r.err
    line = _one_error_line(r)
    assert f"mcpsync: error: mcpsync {' '.join(a for a in args[:2] if not a.startswith('-'))}" in line
    assert flag in line and line.endswith("--help')")
    assert r.out == ""


async def test_nothing_running_is_6_a_wrong_config_file_is_2(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for args in (["list"], ["status", "--server", "demo", "--uri", "demo://x"], ["outbox", "consumers"]):
        r = await run_cli(*args, env={"MCPSYNC_STATE_DIR": str(state)})
        assert r.code == 6, r.err
        assert _one_error_line(r) == (f"mcpsync: error: nothing is running here: no runtime file "
                                      f"{state / 'runtime.json'} (start the stack with 'mcpsync up', or pass "
                                      "--config FILE / set MCPSYNC_CONFIG)")
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("[[servers]]\nname = \n")
    r = await run_cli("list", env={"MCPSYNC_STATE_DIR": str(state), "MCPSYNC_CONFIG": str(wrong)})
    assert r.code == 2 and f"config file {wrong} is not valid TOML" in _one_error_line(r)
    r = await run_cli("--config", str(tmp_path / "missing.toml"), "list")
    assert r.code == 2 and "does not exist" in _one_error_line(r)
    # Through MCPSYNC_CONFIG, the Temporal connection error is whole: the OS's reason, not cut mid-word.
    config = tmp_path / "mcpsync.toml"
    config.write_text(f'[temporal]\naddress = "127.0.0.1:{free_port()}"\nconnect_timeout_seconds = 3\n'
                      '[[servers]]\nname = "docs"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n')
    r = await run_cli("status", "--server", "docs", "--uri", "demo://x",
                      env={"MCPSYNC_STATE_DIR": str(state), "MCPSYNC_CONFIG": str(config)})
    assert r.code == 6, r.err
    line = _one_error_line(r)
    assert "tcp connect error: Connection refused; address from config file" in line, line
    assert line.endswith(f"(MCPSYNC_CONFIG={config})")


# --- the real stack ------------------------------------------------------------------------------


async def test_unknown_names_are_4_unconfigured_subjects_2_and_nothing_is_created(
        temporal_client: Client, ledger: Ledger, temporal_server: TemporalDevServer, fx: FixtureProcess,
        database_url: str, tmp_path: Path) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        uri = f"demo://newcomer/{uuid.uuid4().hex[:8]}"
        await _subscribed(st, uri, "v1")
        # A subject the server does not list: 2 for every command naming one subscription, as for subscribe.
        for command in ("subscribe", "status", "get", "describe", "history", "close", "resume"):
            r = await st.cli(command, "--server", st.server.name, "--subject", "mallory", "--uri", uri)
            assert r.code == 2, (command, r.err)
            assert "subject 'mallory' is not configured for server" in _one_error_line(r)

        # outbox resync of an unknown name: exit 4, and no consumer was created.
        typo = f"indexr-{uuid.uuid4().hex[:6]}"
        r = await st.cli("outbox", "resync", "--consumer", typo)
        assert r.code == 4 and _one_error_line(r).startswith(f"mcpsync: error: no outbox consumer {typo!r}")
        for command in (["ack", "--position", "0"], ["drop"]):
            r = await st.cli("outbox", command[0], "--consumer", typo, *command[1:])
            assert r.code == 4 and f"no outbox consumer {typo!r}" in _one_error_line(r)
        assert await ledger_rows(ledger, "SELECT name FROM outbox_consumers WHERE name = %s", typo) == []
        # Creating one is explicit: --register (on resync or poll).
        r = await st.cli("outbox", "resync", "--consumer", typo, "--register", "--subject", "alice", "--json")
        assert r.code == 0, r.err
        assert r.json()["consumer"] == typo
        assert await ledger_rows(ledger, "SELECT subjects FROM outbox_consumers WHERE name = %s", typo) == [
            (["alice"],)]
        r = await st.cli("outbox", "drop", "--consumer", typo)
        assert r.code == 0, r.err

        # revoke: an unknown subject (or URI) is exit 4, nothing revoked; a real one names what it revoked.
        r = await st.cli("revoke", "--server", st.server.name, "--subject", "nobody")
        assert r.code == 4
        assert _one_error_line(r) == (f"mcpsync: error: no subscription of subject 'nobody' on server "
                                      f"'{st.server.name}': nothing revoked (see 'mcpsync list --server "
                                      f"{st.server.name}')")
        r = await st.cli("revoke", "--server", st.server.name, "--subject", "alice", "--uri", uri + "-typo")
        assert r.code == 4 and "nothing revoked" in _one_error_line(r)
        r = await st.cli("revoke", "--server", st.server.name, "--subject", "alice")
        assert r.code == 0, r.err
        assert r.out.splitlines()[0].startswith(
            f"revoked in the ledger: 1 subscription(s) of alice/{st.server.name}, every URI (--uri *) (1 "
            "live), ")
        assert r.out.splitlines()[1].startswith(f"  {uri} (workflow mcpsync-sub/")

        async def revoked() -> bool:
            s = await st.cli("list", "--server", st.server.name, "-o", "json")
            return [row["state"] for row in s.json()] == ["REVOKED"]

        await eventually(revoked, timeout=30, interval=0.3, what="REVOKED in the ledger")
        r = await st.cli("revoke", "--server", st.server.name, "--subject", "alice", "--json")
        assert r.code == 0, r.err
        again = r.json()
        assert again["revoked"] == [] and [(x["uri"], x["state_before"],
                                            x["live"]) for x in again["subscriptions"]] == [
            (uri, "REVOKED", False)]


async def test_closed_subscription_resume_is_2_and_subscribe_wait_restarts_it(
        temporal_client: Client, ledger: Ledger, temporal_server: TemporalDevServer, fx: FixtureProcess,
        database_url: str, tmp_path: Path) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        uri = f"demo://newcomer/{uuid.uuid4().hex[:8]}"
        await _subscribed(st, uri, "v1")
        for wait in (["--wait", "--timeout", "30"], []):
            r = await st.cli("close", *st.key_args(uri), "--json")
            assert r.code == 0 and r.json()["state"] == "CLOSED", r.err
            # Right after the close, as an operator would: a CLOSED key starts a new incarnation and
            # reads again, with --wait as without.
            r = await st.cli("subscribe", *st.key_args(uri), *wait)
            assert r.code == 0, r.err
            if wait:
                assert r.out.startswith(f"{uri}: ") and r.out.rstrip().endswith("state ACTIVE"), r.out

            async def active() -> bool:
                s = await st.cli("status", *st.key_args(uri), "--json")
                assert s.code == 0, s.err
                return bool(s.json()["state"] == "ACTIVE")

            await eventually(active, timeout=30, interval=0.3, what="the restarted subscription ACTIVE")
        r = await st.cli("close", *st.key_args(uri), "--json")
        assert r.code == 0 and r.json()["state"] == "CLOSED", r.err
        r = await st.cli("resume", *st.key_args(uri))
        assert r.code == 2
        assert _one_error_line(r) == ("mcpsync: error: resume refused: subscription "
                                      f"alice/{st.server.name} {uri} is "
                                      "CLOSED, not RECONCILIATION_REQUIRED (an ended subscription is not "
                                      "resumed: 'mcpsync subscribe' starts it again)")


async def test_subscribe_unlisted_uri_warns_and_a_wrong_answer_selection_is_one_line(
        temporal_client: Client, ledger: Ledger, temporal_server: TemporalDevServer, fx: FixtureProcess,
        database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        listed = f"demo://newcomer/{uuid.uuid4().hex[:8]}"
        record = await _subscribed(st, listed, "v1")
        r = await st.cli("catalog", "start", "--server", st.server.name, "--subject", "alice")
        assert r.code == 0, r.err
        r = await st.cli("scan", "--server", st.server.name, "--subject", "alice", "--now", "--timeout", "60",
                         "--json", timeout=90)
        assert r.code == 0 and listed in r.json()["uris"], r.err
        # A listed URI: no warning. An unlisted one: started (exit 0) with one warning line.
        r = await st.cli("subscribe", *st.key_args(listed))
        assert r.code == 0 and r.err == "", r.err
        unlisted = f"demo://newcomer/never-{uuid.uuid4().hex[:8]}"
        r = await st.cli("subscribe", *st.key_args(unlisted))
        assert r.code == 0 and r.out.startswith("subscribed: workflow "), r.err
        [warning] = r.err.splitlines()
        assert warning.startswith(f"mcpsync: warning: {unlisted} is not listed by {st.server.name} for alice "
                                  "(catalog #")
        assert "TOMBSTONE_PENDING" in warning

        # answer select with a receipt that is not the dependency's: one CLI line, one worker log line.
        answer = f"ans-{uuid.uuid4().hex[:6]}"
        r = await st.cli("answer", "bind", "--answer-id", answer, "--question", "q?", "--subject", "alice",
                         "--dep", st.server.name, listed, str(record["last_receipt_id"]))
        assert r.code == 0, r.err
        caplog.clear()
        caplog.set_level(logging.INFO)
        r = await st.cli("answer", "select", "--answer-id", answer, "--uri", listed, "--receipt", str(10**9))
        assert r.code == 2
        assert _one_error_line(r) == f"mcpsync: error: select_input refused: receipt {10**9} does not exist"
        rejected = [rec for rec in caplog.records if "rejected" in rec.getMessage()]
        assert [rec.getMessage() for rec in rejected] == [
            f"answer gate: InvalidSelection rejected: receipt {10**9} does not exist"]
        tracebacks = [rec for rec in caplog.records if rec.exc_info and rec.levelno >= logging.INFO]
        assert tracebacks == [], [rec.getMessage() for rec in tracebacks]
        for uri in (listed, unlisted):
            closed = await st.cli("close", *st.key_args(uri))
            assert closed.code == 0, closed.err


# --- the stack: 'up' for a bounded time or in the background, 'down', a SIGKILLed 'up' ------------


def _up(state: Path, database_url: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MCPSYNC_STATE_DIR": str(state), "MCPSYNC_DATABASE_URL": database_url}
    with log.open("wb") as out:
        return subprocess.Popen([*MCPSYNC, "up", "--port", "0", "--ui-port", "0", "--metrics-port", "0",
                                 "--churn", "0", *extra], cwd=REPO_ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


async def test_up_down_and_a_killed_up_leaves_no_demo_server(tmp_path: Path,
                                                             private_database: PrivateDatabase) -> None:
    # A database of its own: the SIGKILLed stack leaves its demo session open and its lease held there.
    database_url = private_database.url
    state = tmp_path / "state"
    env = {"MCPSYNC_STATE_DIR": str(state), "MCPSYNC_DATABASE_URL": database_url}
    # A taken metrics port names the flag 'up' has, not a config table it does not read.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = await run_cli("up", "--port", "0", "--ui-port", "0", "--metrics-port",
                          str(taken.getsockname()[1]), env=env)
    assert r.code == 2 and "(pass --metrics-port N, 0 for a free one, or --no-metrics)" in _one_error_line(r)
    r = await run_cli("down", env=env)
    assert r.code == 6 and "nothing is running here" in _one_error_line(r)

    first = _up(state, database_url, tmp_path / "up1.log", "--exit-after", "300")
    second: subprocess.Popen[bytes] | None = None
    demo_pid = 0
    try:
        log = await eventually(lambda: _ready(tmp_path / "up1.log"), timeout=90, what="first 'up' ready")
        assert "stops after 300s (--exit-after)" in log
        hint = log.split("Try: ", 1)[1].split(" status ", 1)[0]
        assert (REPO_ROOT / hint).is_file() or shutil.which(hint), f"the hint's command {hint!r} exists"
        demo_pid = json.loads((state / "demo-server" / "owner.json").read_text())["pid"]
        first.send_signal(signal.SIGKILL)  # no cleanup at all
        first.wait(timeout=10)
        assert process_alive(demo_pid), "the SIGKILLed up left its demo server running"
        second = _up(state, database_url, tmp_path / "up2.log")
        log = await eventually(lambda: _ready(tmp_path / "up2.log"), timeout=90, what="second 'up' ready")
        assert f"reclaimed the demo MCP server pid {demo_pid} left by mcpsync up pid {first.pid}" in log
        # The dead stack's demo session lease is dropped, not waited out (lease_seconds).
        assert f"released 1 session lease(s) of the stopped mcpsync up pid {first.pid}" in log
        assert not process_alive(demo_pid, expect_in_cmdline=("fixture",))
        assert "'mcpsync down' from another terminal" in log
        # --metrics-port 0 is a free port (printed once); /readyz turns 200 once the demo subscription
        # converged; 'up' prints its own lines, not its services' INFO logs.
        [metrics_url] = [line.split()[-1] for line in log.splitlines() if "metrics (Prometheus)" in line]
        readyz = metrics_url.replace("/metrics", "/readyz")

        def ready() -> bool:
            try:
                with urllib.request.urlopen(readyz, timeout=2) as resp:  # loopback, the stack's own
                    return bool(resp.status == 200)
            except OSError:
                return False

        await eventually(lambda: asyncio.to_thread(ready), timeout=60, interval=0.5,
                         what="/readyz 200 under up")
        log = (tmp_path / "up2.log").read_text()
        assert log.count(metrics_url) == 1 and "receipt=None" not in log
        assert [line for line in log.splitlines() if " INFO " in line] == []
        r = await run_cli("down", env=env, timeout=90)
        assert r.code == 0, r.err
        assert r.out.startswith(f"stopped mcpsync up pid {second.pid} (state dir {state}")
        assert second.wait(timeout=10) == 0 and not (state / "runtime.json").exists()
        assert not (state / "demo-server" / "owner.json").exists()
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        if demo_pid and process_alive(demo_pid, expect_in_cmdline=("fixture",)):
            os.kill(demo_pid, signal.SIGKILL)
        # The SIGKILLed first stack's dev server is reclaimed by the second 'up'; nothing else is left.


def _ready(log: Path) -> str | None:
    text = log.read_text()
    return text if "ready in" in text and "stops" in text else None


# --- outputs: list -o wide, status --json, poll --follow, examples, completion -------------------


def test_every_command_shows_examples_and_completion_offers_configured_names(tmp_path: Path) -> None:
    import argparse

    from mcpsync.worker.cli.root import build_parser

    def leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    sub = leaves(child)
                    found += sub or [child]
        return found

    missing = [p.prog for p in leaves(build_parser()) if "example" not in (p.epilog or "")]
    assert missing == []
    config = tmp_path / "c.toml"
    config.write_text('[[servers]]\nname = "docs"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n'
                      'subjects = ["alice", "bob"]\n[[servers]]\nname = "demo"\ntransport = "http"\n'
                      'url = "http://127.0.0.1:1/mcp"\n')
    answer = tmp_path / "completions"
    for line, expected in ((f"mcpsync --config {config} status --server ", ["docs", "demo"]),
                           (f"mcpsync --config {config} get --server docs --subject ", ["alice", "bob"]),
                           (f"mcpsync --config {config} list --subject ", ["alice", "anonymous", "bob"]),
                           ("mcpsync list --state RE", ["READ_PENDING", "RECONCILIATION_REQUIRED",
                                                        "REVOKED"])):
        subprocess.run([str(VENV_BIN / "mcpsync")], env={**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line,
                                                         "COMP_POINT": str(len(line)),
                                                         "_ARGCOMPLETE_IFS": "\n",
                                                         "_ARGCOMPLETE_STDOUT_FILENAME": str(answer),
                                                         "MCPSYNC_STATE_DIR": str(tmp_path / "none")},
                       capture_output=True, timeout=30, check=False)
        assert sorted(answer.read_text().split()) == sorted(expected), line


async def test_wide_list_json_bound_and_follow_say_what_is_true(
        temporal_client: Client, ledger: Ledger, temporal_server: TemporalDevServer, fx: FixtureProcess,
        database_url: str, tmp_path: Path) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        uri = f"demo://newcomer/{uuid.uuid4().hex[:8]}"
        await _subscribed(st, uri, "v1")
        r = await st.cli("list", "--server", st.server.name, "-o", "wide")
        assert r.code == 0, r.err
        [cells] = _table(r.out)
        assert cells["LAST_VERIFIED"].endswith(" ago") and cells["NEXT_READ_DUE"].startswith("in ")
        assert cells["STALENESS_BOUND"] == "300s" and cells["LAST_ACCEPTED"].endswith(" ago")
        r = await st.cli("status", *st.key_args(uri), "--json")
        assert r.code == 0, r.err
        assert (r.json()["staleness_bound_seconds"], r.json()["staleness_bound_source"]) == (300.0,
                                                                                             "safety_read")
        assert "staleness bound: 300 s" in (await st.cli("status", *st.key_args(uri))).out

        # poll --follow acknowledges by itself: it says so instead of printing an ack command.
        name = f"follow-{uuid.uuid4().hex[:6]}"
        first = await st.cli("outbox", "poll", "--consumer", name, "--register", "--subject", "alice",
                             "--json")
        assert first.code == 0, first.err
        if first.json()["gap"] is not None:  # earlier tests pruned: a new name starts with a relist
            relist = await st.cli("outbox", "resync", "--consumer", name, "--json")
            assert (await st.cli("outbox", "ack", "--consumer", name, "--position",
                                 str(relist.json()["position"]))).code == 0
        follow = await asyncio.create_subprocess_exec(
            *MCPSYNC, "--config", str(st.config), "outbox", "poll", "--consumer", name, "--follow",
            cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "MCPSYNC_STATE_DIR": "/nonexistent-state", "MCPSYNC_DATABASE_URL": ""})
        assert follow.stdout is not None
        try:
            await fx.edit(uri, text="v2 for the follower")
            while True:
                line = (await asyncio.wait_for(follow.stdout.readline(), 30)).decode()
                if line.startswith("position "):
                    break
            assert (line.rstrip().endswith("acked by --follow once printed)")
                    and "mcpsync outbox ack" not in line)
        finally:
            follow.send_signal(signal.SIGTERM)
            await asyncio.wait_for(follow.wait(), 30)
        await ledger_rows(ledger, "DELETE FROM outbox_consumers WHERE name = %s", name)
        assert (await st.cli("close", *st.key_args(uri))).code == 0


# --- waiting: a line on a terminal, nothing on a pipe ---------------------------------------------


def _stderr_on_a_terminal(args: list[str]) -> tuple[int, str]:
    """``mcpsync *args`` (a fresh interpreter: the fork server's children get pipes) with stderr on a
    pseudo-terminal; its exit code and what it wrote there."""
    primary, secondary = os.openpty()
    try:
        env = {**cli_process.without_database_url(), "MCPSYNC_STATE_DIR": "/nonexistent-state"}
        r = subprocess.run([*MCPSYNC, *args], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=secondary, stdin=subprocess.DEVNULL, timeout=60)
        os.close(secondary)
        secondary = -1
        out = b""
        while select.select([primary], [], [], 0)[0]:
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the terminal's other end is closed and nothing is left
                break
            if not chunk:
                break
            out += chunk
        return r.returncode, out.decode(errors="replace")
    finally:
        os.close(primary)
        if secondary >= 0:
            os.close(secondary)


async def test_subscribe_wait_and_close_say_what_they_wait_for_on_a_terminal_only(
        temporal_client: Client, ledger: Ledger, temporal_server: TemporalDevServer, fx: FixtureProcess,
        database_url: str, tmp_path: Path) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        uri = f"demo://waiting/{uuid.uuid4().hex[:8]}"
        await st.fx.create(uri, text="v1")
        args = ["--config", str(st.config), "subscribe", *st.key_args(uri), "--wait", "--timeout", "30"]
        code, terminal = await asyncio.to_thread(_stderr_on_a_terminal, args)
        assert code == 0, terminal
        assert "waiting up to 30 s for the first read of 1 URI(s)" in terminal
        code, terminal = await asyncio.to_thread(
            _stderr_on_a_terminal, ["--config", str(st.config), "close", *st.key_args(uri)])
        assert code == 0, terminal
        assert "waiting up to 60 s for the close receipt" in terminal
        # On a pipe: nothing but the command's own output.
        piped = await st.cli("subscribe", *st.key_args(uri), "--wait")
        assert piped.code == 0 and "waiting" not in piped.err, piped.err
        piped = await st.cli("close", *st.key_args(uri))
        assert piped.code == 0 and piped.err == "", piped.err
