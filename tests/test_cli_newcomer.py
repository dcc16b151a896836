"""What a newcomer trips on (issue 26): bad input is one line and a documented exit code, never a
traceback; one meaning has one exit code. The real ``mcpsync`` as a subprocess, against the real
stack where one is needed (Temporal dev server, PostgreSQL, the fixture MCP server, the worker)."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.worker.fixture import FixtureProcess
from mcpsync.worker.stack import TemporalDevServer, free_port
from tests.conftest import eventually, ledger_rows
from tests.test_cli import _one_error_line, _subscribed, cli_stack, run_cli

# --- no stack needed -------------------------------------------------------------------------


@pytest.mark.parametrize("args,flag", [
    (["history", "--server", "s", "--uri", "demo://x", "--limit", "-1"], "--limit: must be at least 1, not -1"),
    (["history", "--server", "s", "--uri", "demo://x", "--limit", "0"], "--limit: must be at least 1, not 0"),
    (["describe", "--server", "s", "--uri", "demo://x", "--limit", "-5"], "--limit: must be at least 1"),
    (["status", "--server", "s", "--uri", "demo://x", "--timeout", "-1"], "--timeout: must be more than 0 seconds"),
    (["subscribe", "--server", "s", "--uri", "demo://x", "--wait", "--timeout", "0"], "--timeout: must be more"),
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
        assert r.code == 4 and _one_error_line(r) == f"mcpsync: error: no outbox consumer {typo!r}"
        for command in (["ack", "--position", "0"], ["drop"]):
            r = await st.cli("outbox", command[0], "--consumer", typo, *command[1:])
            assert r.code == 4 and f"no outbox consumer {typo!r}" in _one_error_line(r)
        assert await ledger_rows(ledger, "SELECT name FROM outbox_consumers WHERE name = %s", typo) == []
        # Creating one is explicit: --create (or the first poll).
        r = await st.cli("outbox", "resync", "--consumer", typo, "--create", "--subject", "alice", "--json")
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
        assert r.out.splitlines()[0] == f"revoked 1 subscription(s) of alice/{st.server.name}, every URI (--uri *):"
        assert r.out.splitlines()[1].startswith(f"  {uri} (workflow mcpsync-sub/")

        async def revoked() -> bool:
            s = await st.cli("list", "--server", st.server.name, "-o", "json")
            return [row["state"] for row in s.json()] == ["REVOKED"]

        await eventually(revoked, timeout=30, interval=0.3, what="REVOKED in the ledger")
        r = await st.cli("revoke", "--server", st.server.name, "--subject", "alice", "--json")
        assert r.code == 0, r.err
        assert r.json()["revoked"] == [] and r.json()["already_ended"] == [{"uri": uri, "state": "REVOKED"}]


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
        assert _one_error_line(r) == (f"mcpsync: error: resume refused: subscription alice/{st.server.name} {uri} is "
                                      "CLOSED, not RECONCILIATION_REQUIRED (an ended subscription is not resumed: "
                                      "'mcpsync subscribe' starts it again)")


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
