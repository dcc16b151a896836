"""The operator CLI as a new user meets it: the real ``mcpsync`` as a subprocess, against the real
stack where one is needed (Temporal dev server, PostgreSQL, the fixture MCP server, the worker).

Covers issue 13's CLI part: list/get/describe/history/--watch, freshness in status, resume,
idempotent close, exit codes (not found 4, timeout 6, stale runtime file 6, second 'up' 2), 'up'
serving the demo resource (serve's URL and demo bearer token),
validation (unconfigured subject, rollout --percent), connection errors naming their source,
help text and defaults, --version, shell completion."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx2
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.ingress.process import ingress_task_queue
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.serve.server import FRESHNESS_META
from mcpsync.worker.stack.common import REPO_ROOT, free_port
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.worker.stack.up import DEMO_SERVER, DEMO_SUBJECT, DEMO_URI
from mcpsync.workflows.names import SIGNAL_IDENTITY_CONFLICT
from mcpsync.workflows.records.subscription import IdentityConflict, SubscriptionKey, SubscriptionState
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from tests import cli_process
from tests.conftest import PrivateDatabase, eventually, running_services, unique
from tests.e2e.serve_helpers import serve_client
from tests.e2e.test_e2e_faults import MCPSYNC
from tests.e2e.test_e2e_faults import _cli as _cli_with_env

VENV_BIN = Path(sys.executable).parent


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI without the test session's MCPSYNC_DATABASE_URL (empty counts as unset)."""
    return _cli_with_env(*args, env={"MCPSYNC_DATABASE_URL": "", **(env or {})})


@dataclass
class CliRun:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> CliRun:
    """The real CLI as a subprocess (forked from the fork server: tests.cli_process) without
    blocking the event loop (the worker runs in it)."""
    r = await cli_process.arun(args, env={**cli_process.without_database_url(),
                                          "MCPSYNC_STATE_DIR": "/nonexistent-state", **(env or {})},
                               timeout=timeout)
    return CliRun(r.returncode, r.stdout, r.stderr)


def _one_error_line(r: CliRun | subprocess.CompletedProcess[str]) -> str:
    err = r.err if isinstance(r, CliRun) else r.stderr
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcpsync: error: "), err
    return lines[0]


# --- rendering with every freshness field set (the workflow fills them on the lead's branch) ---


def test_freshness_is_shown_when_the_record_has_it() -> None:
    from mcpsync.worker.cli.subscription_text import status_text, subscription_table

    now = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
    rec = ResourceSubscriptionV1(
        subject="alice", server="docs", uri="demo://x", state=SubscriptionState.ACTIVE, edition="2025-11-25",
        started_at=now - timedelta(hours=2), ended_at=now - timedelta(seconds=5),
        last_accepted_at=now - timedelta(seconds=42), last_verified_at=now - timedelta(seconds=7),
        next_read_due_at=now + timedelta(seconds=293), staleness_bound_seconds=30.0,
        safety_read_seconds=300.0)
    lines = {k.strip(): v.strip() for k, _, v in (line.partition(": ")
                                                  for line in status_text(rec, now).splitlines())}
    assert lines["last accepted at"] == "2026-12-03T11:59:18Z (42s ago)"
    assert lines["last verified at"] == "2026-12-03T11:59:53Z (7s ago)"
    assert lines["next read due"] == "2026-12-03T12:04:53Z (4m53s from now)"
    assert lines["staleness bound"].startswith("30 s (polling")
    assert lines["edition"] == "2025-11-25"
    assert lines["started / ended"] == "2026-12-03T10:00:00Z (2h00m ago) / 2026-12-03T11:59:55Z (5s ago)"
    # With subscribe the bound is the safety read period; a record without one says "-".
    safety = rec.model_copy(update={"staleness_bound_seconds": None})
    assert "300 s (safety read period" in status_text(safety, now)
    bare = ResourceSubscriptionV1(subject="a", server="s", uri="demo://y", state=SubscriptionState.DISCOVERED)
    bare_lines = status_text(bare, now)
    for label in ("last accepted at", "last verified at", "next read due", "staleness bound"):
        assert f"{label}: -" in bare_lines

    row = {"workflow_id": "wf1", "server": "docs", "subject": "alice", "uri": "demo://x", "state": "ACTIVE",
           "watermark": 3, "last_receipt_id": 9, "updated_at": (now - timedelta(seconds=3)).isoformat(),
           "session_generation": 1, "subscription_generation": 2, "last_accepted_ordinal": 3,
           "notifications_seen": 4, "last_accepted_digest": "sha256:" + "ab" * 32, "last_accepted_at": None}
    [cells] = _table(subscription_table([row], wide=True, now=now, records={"wf1": rec}))
    assert (cells["LAST_ACCEPTED"], cells["LAST_VERIFIED"], cells["NEXT_READ_DUE"], cells["STALENESS_BOUND"],
            cells["UPDATED"]) == ("42s ago", "7s ago", "in 4m53s", "30s", "3s ago")
    assert cells["DIGEST"] == "sha256:abababababababab" and cells["RECEIPT"] == "9"
    [narrow] = _table(subscription_table([row], wide=False, now=now))
    assert list(narrow) == ["SERVER", "SUBJECT", "URI", "STATE", "WATERMARK", "RECEIPT", "UPDATED"]


def _table(text: str) -> list[dict[str, str]]:
    """Rows of a kubectl-style table as {header: cell}, split at the header columns (cells may hold
    spaces)."""
    header, *lines = text.splitlines()
    names = header.split()
    starts = [header.index(f" {n}") + 1 if i else 0 for i, n in enumerate(names)]
    bounds = list(zip(starts, [*starts[1:], None], strict=True))
    return [{n: line[a:b].strip() for n, (a, b) in zip(names, bounds, strict=True)} for line in lines]


# --- no stack needed ------------------------------------------------------------------------


def test_cli_doc_contract_table_lists_every_signal_update_and_query() -> None:
    import re

    from temporalio import workflow

    from mcpsync.workflows.subscription import ResourceSubscriptionWorkflow

    defn = workflow._Definition.from_class(ResourceSubscriptionWorkflow)
    assert defn is not None
    handlers = ({(n, "signal") for n in defn.signals} | {(n, "update") for n in defn.updates}
                | {(n, "query") for n in defn.queries})
    doc = (REPO_ROOT / "docs" / "cli.md").read_text()
    table = doc[doc.index("**Signals, updates and queries**"):doc.index("Ingress services must signal")]
    documented = set(re.findall(r"^\| `([a-z_]+)` \| (signal|update|query) \|", table, re.MULTILINE))
    assert documented == handlers


def test_version_help_and_completion(tmp_path: Path) -> None:
    r = _cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"mcpsync {version('mcpsync')}"
    r = _cli("--help")
    assert r.returncode == 0 and "examples:" in r.stdout and "register-python-argcomplete mcpsync" in r.stdout
    r = _cli("list", "--help")
    assert "(default: 2.0)" in r.stdout and "mcpsync list -o json" in r.stdout

    from mcpsync.worker.cli.root import build_parser

    def walk(parser: Any, path: str) -> list[str]:
        missing = []
        for action in parser._actions:
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                for name, child in action.choices.items():
                    missing += walk(child, f"{path} {name}")
            elif action.option_strings and not action.help:
                missing.append(f"{path} {action.option_strings[-1]}")
        return missing

    assert walk(build_parser(), "mcpsync") == []

    # Shell completion: the registration script, then a completion request answered by the CLI itself.
    script = subprocess.run([str(VENV_BIN / "register-python-argcomplete"), "mcpsync"], capture_output=True,
                            text=True, check=True).stdout
    assert "complete " in script and "mcpsync" in script
    answer = tmp_path / "completions"
    line = "mcpsync li"
    subprocess.run([str(VENV_BIN / "mcpsync")], env={**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line,
                                                     "COMP_POINT": str(len(line)), "_ARGCOMPLETE_IFS": "\n",
                                                     "_ARGCOMPLETE_STDOUT_FILENAME": str(answer)},
                   capture_output=True, timeout=30, check=False)
    assert answer.read_text().split() == ["list"]
    line = "mcpsync list --st"
    subprocess.run([str(VENV_BIN / "mcpsync")], env={**os.environ, "_ARGCOMPLETE": "1", "COMP_LINE": line,
                                                     "COMP_POINT": str(len(line)), "_ARGCOMPLETE_IFS": "\n",
                                                     "_ARGCOMPLETE_STDOUT_FILENAME": str(answer)},
                   capture_output=True, timeout=30, check=False)
    assert answer.read_text().split() == ["--state"]


def _runtime_file(state: Path, pid: int, config: Path) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "runtime.json").write_text(json.dumps({
        "temporal_address": "127.0.0.1:1", "namespace": "default", "database_url": "postgresql://u@127.0.0.1:1/x",
        "ui_url": "http://127.0.0.1:1", "config_path": str(config), "pid": pid}))


def test_a_stale_runtime_file_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "mcpsync.toml"
    config.write_text('[[servers]]\nname = "demo"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n')
    dead = subprocess.Popen(["true"])
    dead.wait()
    state = tmp_path / "state"
    _runtime_file(state, dead.pid, config)
    for args in (["list"], ["status", "--server", "demo", "--uri", "demo://x"]):
        r = _cli(*args, env={"MCPSYNC_STATE_DIR": str(state)})
        assert r.returncode == 6, r.stderr
        assert _one_error_line(r) == (f"mcpsync: error: runtime file {state / 'runtime.json'} is stale "
                                      f"(stack pid {dead.pid} not running): start 'mcpsync up' or pass "
                                      "--config FILE")
    # A live pid that is not an 'mcpsync up' (a recycled pid) is stale too.
    _runtime_file(state, os.getpid(), config)
    r = _cli("list", env={"MCPSYNC_STATE_DIR": str(state)})
    assert r.returncode == 6 and "is stale" in r.stderr
    # --config wins over the runtime file: the stale file is not consulted.
    r = _cli("--config", str(config), "subscribe", "--server", "demo", "--uri", "demo://x", "--subject",
             "bob", env={"MCPSYNC_STATE_DIR": str(state)})
    assert r.returncode == 2 and "is stale" not in r.stderr


def test_validation_and_connection_errors_name_their_source(tmp_path: Path) -> None:
    config = tmp_path / "mcpsync.toml"
    config.write_text(f'[temporal]\naddress = "127.0.0.1:{free_port()}"\nconnect_timeout_seconds = 1.5\n'
                      f'[database]\nurl = "postgresql://u@127.0.0.1:{free_port()}/x"\n'
                      '[[servers]]\nname = "docs"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n'
                      'subjects = ["alice", "carol"]\n')
    r = _cli("--config", str(config), "subscribe", "--server", "docs", "--uri", "demo://x", "--subject",
             "bob")
    assert r.returncode == 2
    assert ("subject 'bob' is not configured for server 'docs' (configured: alice, carol)"
            in _one_error_line(r))
    # default: anonymous
    r = _cli("--config", str(config), "subscribe", "--server", "docs", "--uri", "demo://x")
    assert r.returncode == 2 and "subject 'anonymous' is not configured" in r.stderr
    r = _cli("--config", str(config), "rollout", "--server", "docs", "--mode", "all", "--percent", "50")
    assert r.returncode == 2 and "--percent applies to --mode percent only" in _one_error_line(r)
    r = _cli("--config", str(config), "rollout", "--server", "docs", "--percent", "150")
    assert r.returncode == 2 and "between 0 and 100" in r.stderr
    # Connection errors: one line, exit 6, naming where the address came from.
    r = _cli("--config", str(config), "subscribe", "--server", "docs", "--uri", "demo://x", "--subject",
             "alice")
    assert r.returncode == 6 and "Temporal unreachable" in r.stderr
    assert _one_error_line(r).endswith(f"address from config file {config} (--config {config})")
    r = _cli("--config", str(config), "list")
    assert r.returncode == 6 and "PostgreSQL unreachable" in r.stderr
    assert _one_error_line(r).endswith(f"address from config file {config} (--config {config})")
    env_addr = f"127.0.0.1:{free_port()}"
    r = _cli("--config", str(config), "status", "--server", "docs", "--uri", "demo://x", "--subject", "alice",
             env={"MCPSYNC_TEMPORAL_ADDRESS": env_addr})
    assert r.returncode == 6 and env_addr in r.stderr
    assert _one_error_line(r).endswith("address from environment variable MCPSYNC_TEMPORAL_ADDRESS")
    bare = tmp_path / "bare.toml"
    bare.write_text('[temporal]\nconnect_timeout_seconds = 1.5\n[[servers]]\nname = "docs"\ntransport = '
                    '"http"\nurl = "http://127.0.0.1:1/mcp"\n')
    r = _cli("--config", str(bare), "status", "--server", "docs", "--uri", "demo://x",
             env={"MCPSYNC_TEMPORAL_ADDRESS": ""})
    if r.returncode == 6:  # nothing listens on the default 127.0.0.1:7233 on this machine
        assert _one_error_line(r).endswith(f"address from the default (config file {bare} sets no "
                                           "[temporal] address)")


# --- the embedded stack: 'mcpsync up' (its serve), twice, the runtime file's life cycle ---


async def test_second_up_is_one_line_and_a_clean_ctrl_c_prints_no_warning_and_leaves_no_runtime_file(
        tmp_path: Path, private_database: PrivateDatabase) -> None:
    """One embedded stack for all of it, on a database where a stack was SIGKILLed a moment ago (its
    demo session still open on its ingress queue, its lease seconds from running out): ``up``
    subscribes the demo on a session of its own, not on that one, whose queue nobody polls; ``up``
    prints serve's URL and its demo bearer token and the demo resource reads through serve (a
    request without the token is refused); a second ``up`` on the same state dir is one error line;
    a clean stop (Ctrl-C: SIGINT to the whole process group, as a terminal sends it) prints no
    WARNING line and leaves no runtime file. A database of its own: no other test's demo rows (another
    'up', a SIGKILLed one) can stand in for this stack's."""
    database_url = private_database.url
    dead = "dead-host:1:0"
    assert await private_database.ledger.sessions.acquire_lease(DEMO_SUBJECT, DEMO_SERVER, dead, 15.0)
    await private_database.ledger.sessions.open_session(
        subject=DEMO_SUBJECT, server=DEMO_SERVER, edition="2025-11-25",
        capabilities={"resources": True, "subscribe": True, "listChanged": True}, server_name="demo",
        server_version="0", task_queue=ingress_task_queue(dead), host_id=dead)
    state = tmp_path / "state"
    env = {**os.environ, "MCPSYNC_STATE_DIR": str(state), "MCPSYNC_DATABASE_URL": database_url}
    env.pop("MCPSYNC_SERVE_TOKENS", None)  # with no tokens configured, serve makes the demo token
    log_path = tmp_path / "up.log"
    log = log_path.open("wb")
    up = await asyncio.create_subprocess_exec(
        *MCPSYNC, "up", "--port", "0", "--ui-port", "0", "--metrics-port", "0", "--churn", "0",
        "--exit-after", "120", cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        await eventually(lambda: "ready in" in log_path.read_text(), timeout=60, what="'up' ready")
        assert up.returncode is None, f"'up' exited {up.returncode} once ready:\n{_up_log(log_path)}"
        runtime = json.loads((state / "runtime.json").read_text())
        assert runtime["pid"] == up.pid
        second = await run_cli("up", "--port", "0", "--ui-port", "0", "--metrics-port", "0",
                               env={"MCPSYNC_STATE_DIR": str(state), "MCPSYNC_DATABASE_URL": database_url})
        assert second.code == 2
        assert _one_error_line(second) == (
            f"mcpsync: error: a stack is already running on state dir {state} (mcpsync up pid {up.pid}, "
            f"Temporal {runtime['temporal_address']}): stop it first or set another MCPSYNC_STATE_DIR")

        async def demo_active() -> Any:
            r = await run_cli("list", "-o", "json", env={"MCPSYNC_STATE_DIR": str(state)})
            assert r.code == 0, r.err
            return next((row for row in r.json() if row["uri"] == DEMO_URI and row["state"] == "ACTIVE"),
                        None)

        # Well within the subscribe's 60 s schedule-to-close: a subscribe sent to the dead stack's
        # queue would wait all of it.
        row = await eventually(demo_active, timeout=40, interval=0.5,
                               what="the demo subscription ACTIVE in 'mcpsync list'")
        assert row["session_generation"] == 2  # this stack's session, one above the dead stack's
        line = await eventually(
            lambda: next((ln for ln in log_path.read_text().splitlines() if "mcpsync serve " in ln), None),
            timeout=90, what="serve line")
        match = re.search(r"(http://\S+/mcp) \(subject anonymous; demo bearer token (\S+)\)", line)
        assert match, line
        url, token = match.group(1), match.group(2)

        async def demo_read() -> bool:
            async with serve_client(url, token, "auto") as client:
                uris = [str(r.uri) for r in (await client.list_resources()).resources]
                if DEMO_URI not in uris:
                    return False
                read = await client.read_resource(DEMO_URI)
                return bool(read.contents) and FRESHNESS_META in (read.meta or {})

        await eventually(demo_read, timeout=60, interval=1.0, what="the demo resource through serve")
        async with httpx2.AsyncClient() as raw:
            assert (
                await raw.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "resources/list"})
            ).status_code == 401
        os.killpg(up.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
        assert await asyncio.wait_for(up.wait(), 30) == 0
        assert [ln for ln in log_path.read_text().splitlines() if "WARNING" in ln] == []
    except BaseException:
        print(f"'up' (exit code {up.returncode}) wrote:\n{_up_log(log_path)}")  # in pytest's report
        raise
    finally:
        # a clean stop: the stack stops its dev server and removes the runtime file
        if up.returncode is None:
            up.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(up.wait(), 30)
        except TimeoutError:
            up.kill()
            await up.wait()
        log.close()
    assert not (state / "runtime.json").exists()
    r = await run_cli("list", env={"MCPSYNC_STATE_DIR": str(state)})
    assert (r.code == 6
            and f"nothing is running here: no runtime file {state / 'runtime.json'}" in _one_error_line(r))


def _up_log(path: Path) -> str:
    """What ``up`` wrote, for a failure report: its demo bearer token masked (a credential)."""
    return re.sub(r"(?i)(bearer token |Bearer )\S+", r"\1***", path.read_text(errors="replace"))[-4000:]


# --- subscription commands against the real stack -------------------------------------------


@dataclass
class CliStack:
    config: Path
    server: ServerConfig
    fx: FixtureProcess
    client: Client
    task_queue: str

    async def cli(self, *args: str, timeout: float = 60.0) -> CliRun:
        return await run_cli("--config", str(self.config), *args, timeout=timeout)

    def key_args(self, uri: str) -> list[str]:
        return ["--server", self.server.name, "--subject", "alice", "--uri", uri]


@asynccontextmanager
async def cli_stack(temporal_client: Client, ledger: Ledger, temporal_server: TemporalDevServer,
                    fx: FixtureProcess, database_url: str, tmp_path: Path) -> AsyncIterator[CliStack]:
    server = ServerConfig(name=unique("cli"), transport="http", url=fx.mcp_url, subjects=["alice"])
    async with running_services(temporal_client, ledger, [server]) as cfg:
        config = tmp_path / "mcpsync.toml"
        config.write_text(f'[temporal]\naddress = "{temporal_server.address}"\ntask_queue = '
                          f'"{cfg.temporal.task_queue}"\n[database]\nurl = "{database_url}"\n'
                          f'[[servers]]\nname = "{server.name}"\ntransport = "http"\nurl = "{fx.mcp_url}"\n'
                          'subjects = ["alice"]\n')
        yield CliStack(config, server, fx, temporal_client, cfg.temporal.task_queue)


async def _subscribed(st: CliStack, uri: str, text: str) -> dict[str, Any]:
    await st.fx.create(uri, text=text)
    r = await st.cli("subscribe", *st.key_args(uri))
    assert r.code == 0, r.err

    async def active() -> dict[str, Any] | None:
        s = await st.cli("status", *st.key_args(uri), "--json")
        assert s.code == 0, s.err
        doc: dict[str, Any] = s.json()
        return doc if doc["state"] == "ACTIVE" and doc["last_receipt_id"] else None

    return await eventually(active, timeout=30, interval=0.3, what=f"{uri} ACTIVE with a receipt")


async def test_list_get_describe_history_and_status(temporal_client: Client, ledger: Ledger,
                                                     temporal_server: TemporalDevServer, fx: FixtureProcess,
                                                     database_url: str, tmp_path: Path) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        uri = f"demo://cli/{uuid.uuid4().hex[:8]}"
        record = await _subscribed(st, uri, "v1")
        # status: the freshness lines are there (values as far as the workflow fills them).
        for key in ("last_accepted_at", "last_verified_at", "next_read_due_at", "staleness_bound_seconds",
                    "safety_read_seconds"):
            assert key in record
        status = await st.cli("status", *st.key_args(uri))
        assert status.code == 0 and "staleness bound: 300 s (safety read period" in status.out
        for label in ("last accepted at:", "last verified at:", "next read due:"):
            assert label in status.out
        # ... and the ledger's word on freshness (activities/ledger/proven.py), as serve and list say it.
        assert record["dirty"] is False and record["fresh"] is True and record["next_verification_due_at"]
        assert "dirty: no" in status.out and "fresh: yes" in status.out

        listed = await st.cli("list", "--server", st.server.name, "-o", "json")
        assert listed.code == 0, listed.err
        rows = listed.json()
        assert [(r["uri"], r["state"], r["subject"]) for r in rows] == [(uri, "ACTIVE", "alice")]
        assert rows[0]["last_receipt_id"] == record["last_receipt_id"] and rows[0]["last_accepted_at"]
        [cells] = _table((await st.cli("list", "--server", st.server.name)).out)
        assert (cells["URI"], cells["STATE"], cells["RECEIPT"]) == (uri, "ACTIVE",
                                                                    str(record["last_receipt_id"]))
        none = await st.cli("list", "--server", st.server.name, "--state", "CLOSED", "--state", "REVOKED")
        assert none.code == 0 and none.out.strip() == "no subscriptions"
        other = await st.cli("list", "--server", st.server.name, "--subject", "nobody", "-o", "json")
        assert other.json() == []
        bad = await st.cli("list", "--state", "FRESH")
        assert bad.code == 2 and "--state FRESH: not a state" in _one_error_line(bad)

        wide = await st.cli("get", *st.key_args(uri), "-o", "wide")
        assert wide.code == 0, wide.err
        [cells] = _table(wide.out)
        assert cells["STATE"] == "ACTIVE" and cells["URI"] == uri and cells["STALENESS_BOUND"] == "300s"
        assert cells["LAST_ACCEPTED"].endswith(" ago")  # from the ledger until the workflow publishes it
        got = (await st.cli("get", *st.key_args(uri), "--json")).json()
        assert got["uri"] == uri and got["record"]["record"] == "resourceSubscription.v1"

        described = await st.cli("describe", *st.key_args(uri))
        assert described.code == 0, described.err
        assert f"receipt #{record['last_receipt_id']} ACCEPTED" in described.out
        assert "staleness bound: 300 s" in described.out and "ledger state: ACTIVE" in described.out
        doc = (await st.cli("describe", *st.key_args(uri), "-o", "json")).json()
        assert doc["record"]["uri"] == uri and doc["receipts"][-1]["receipt_id"] == record["last_receipt_id"]
        assert doc["subscription"]["workflow_id"] == SubscriptionKey(subject="alice", server=st.server.name,
                                                                     uri=uri).workflow_id

        history = await st.cli("history", *st.key_args(uri), "--json")
        assert history.code == 0, history.err
        events = history.json()
        assert [e["receipt_id"] for e in events if e["kind"] == "receipt"][-1] == record["last_receipt_id"]

        # Not found is exit 4 for every command about one subscription.
        missing = st.key_args(f"demo://cli/missing-{uuid.uuid4().hex[:6]}")
        for command in ("status", "get", "describe", "history", "close", "resume"):
            r = await st.cli(command, *missing)
            assert r.code == 4, (command, r.err)
            assert "no subscription for alice/" in _one_error_line(r)


async def test_subscribe_many_uris_one_line_each(temporal_client: Client, ledger: Ledger,
                                                  temporal_server: TemporalDevServer, fx: FixtureProcess,
                                                  database_url: str, tmp_path: Path) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        tag = uuid.uuid4().hex[:8]
        a, b, c = (f"demo://cli/many-{tag}/{n}" for n in "abc")
        for uri in (a, b, c):
            await fx.create(uri, text=f"{uri} v1")
        keys = {u: SubscriptionKey(subject="alice", server=st.server.name, uri=u) for u in (a, b, c)}
        # Variadic and repeated --uri mix; one line per URI, in order.
        r = await st.cli("subscribe", "--server", st.server.name, "--subject", "alice", "--uri", a, b,
                         "--uri", c)
        assert r.code == 0 and r.err == "", r.err
        assert r.out.splitlines() == [f"subscribed: workflow {keys[u].workflow_id} for {u}" for u in (a, b,
                                                                                                      c)]
        rows = await eventually(lambda: _listed(st, 3), timeout=30, what="three ledger rows")
        assert {row["uri"]: row["workflow_id"] for row in rows} == {u: k.workflow_id for u, k in keys.items()}

        # One unusable URI among good ones: the others are subscribed (joined: same ids), the bad one is
        # one error line, and the exit code is its code (2).
        r = await st.cli("subscribe", *st.key_args(a), "not a uri", c, "--json")
        assert r.code == 2, r.err
        assert [json.loads(line)["workflow_id"] for line in r.out.splitlines()] == [keys[a].workflow_id,
                                                                                 keys[c].workflow_id]
        assert _one_error_line(r) == ("mcpsync: error: not a uri: invalid subscription key: uri: Value "
                                      "error, URI has no scheme")
        # A single URI keeps the one-URI output and errors exactly.
        r = await st.cli("subscribe", *st.key_args(b))
        assert r.code == 0 and r.out == f"subscribed: workflow {keys[b].workflow_id}\n"
        r = await st.cli("subscribe", *st.key_args("not a uri"))
        assert r.code == 2 and r.out == ""
        assert _one_error_line(r) == ("mcpsync: error: invalid subscription key: uri: Value error, URI has "
                                      "no scheme")
        for uri in (a, b, c):
            closed = await st.cli("close", *st.key_args(uri))
            assert closed.code == 0, closed.err


async def _listed(st: CliStack, n: int) -> list[dict[str, Any]] | None:
    r = await st.cli("list", "--server", st.server.name, "-o", "json")
    assert r.code == 0, r.err
    rows: list[dict[str, Any]] = r.json()
    return rows if len(rows) == n else None


async def test_resume_close_idempotent_and_watch(temporal_client: Client, ledger: Ledger,
                                                 temporal_server: TemporalDevServer, fx: FixtureProcess,
                                                 database_url: str, tmp_path: Path) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        uri = f"demo://cli/{uuid.uuid4().hex[:8]}"
        await _subscribed(st, uri, "v1")
        watch = await asyncio.create_subprocess_exec(
            *MCPSYNC, "--config", str(st.config), "list", "--server", st.server.name, "--watch", "--interval",
            "0.3", "-o", "json", cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, "MCPSYNC_STATE_DIR": "/nonexistent-state",
                                                 "MCPSYNC_DATABASE_URL": ""})
        assert watch.stdout is not None
        try:
            first = json.loads(await asyncio.wait_for(watch.stdout.readline(), 30))
            assert [r["state"] for r in first] == ["ACTIVE"]

            # resume: refused while ACTIVE; clears RECONCILIATION_REQUIRED.
            r = await st.cli("resume", *st.key_args(uri))
            assert r.code == 2 and _one_error_line(r) == ("mcpsync: error: resume refused: nothing to "
                                                          "resume: subscription is ACTIVE")
            key = SubscriptionKey(subject="alice", server=st.server.name, uri=uri)
            await temporal_client.get_workflow_handle(key.workflow_id).signal(
                SIGNAL_IDENTITY_CONFLICT, IdentityConflict(observed_uri=uri.upper(), reason="test conflict"))

            async def watched(state: str) -> list[dict[str, Any]]:
                while True:
                    rows = json.loads(await asyncio.wait_for(watch.stdout.readline(), 30))
                    if rows[0]["state"] == state:
                        return rows

            await watched("RECONCILIATION_REQUIRED")  # --watch printed the change
            # The run sets the state, then writes its audit row (one activity each): history shows it soon.

            async def audited() -> bool:
                history = (await st.cli("history", *st.key_args(uri), "--json")).json()
                return any(e["kind"] == "audit" and e["audit_kind"] == "RECONCILIATION_REQUIRED"
                           for e in history)

            assert await eventually(audited, timeout=15, interval=0.3,
                                    what="the RECONCILIATION_REQUIRED audit")
            r = await st.cli("resume", *st.key_args(uri), "--reason", "checked by test", "--json")
            assert r.code == 0, r.err
            assert r.json()["state"] != "RECONCILIATION_REQUIRED"  # ACTIVE, or already re-reading
            await watched("ACTIVE")

            # close twice: the second answers the same receipt, exit 0.
            first_close = await st.cli("close", *st.key_args(uri), "--json")
            assert first_close.code == 0, first_close.err
            receipt = first_close.json()
            assert receipt["state"] == "CLOSED"
            again = await st.cli("close", *st.key_args(uri), "--json")
            assert again.code == 0, again.err
            assert again.json() == receipt
            text = await st.cli("close", *st.key_args(uri))
            assert text.code == 0 and text.out.startswith("CLOSED (already ended): close epoch")
            await watched("CLOSED")
        finally:
            watch.send_signal(signal.SIGTERM)
            await asyncio.wait_for(watch.wait(), 30)
        assert watch.returncode == 0


async def test_scan_now_timeout_is_exit_6(temporal_client: Client, ledger: Ledger,
                                          temporal_server: TemporalDevServer, fx: FixtureProcess,
                                          database_url: str, tmp_path: Path) -> None:
    async with cli_stack(temporal_client, ledger, temporal_server, fx, database_url, tmp_path) as st:
        await fx.create("demo://cli/scan", text="x")
        r = await st.cli("catalog", "start", "--server", st.server.name, "--subject", "alice")
        assert r.code == 0, r.err
        # A reconciliation takes two scans (several activity hops): far longer than 50 ms.
        r = await st.cli("scan", "--server", st.server.name, "--subject", "alice", "--now", "--timeout",
                         "0.05")
        assert r.code == 6
        assert _one_error_line(r).startswith("mcpsync: error: no reconciled catalog within 0.05 s")
        # rollout --percent alone implies --mode percent.
        r = await st.cli("rollout", "--server", st.server.name, "--percent", "50", "--json")
        assert r.code == 0, r.err
        assert (r.json()["mode"], r.json()["percent"]) == ("percent", 50.0)
        r = await st.cli("rollout", "--server", st.server.name, "--mode", "all")
        assert r.code == 0 and r.out.strip() == f"rollout {st.server.name}: all"


async def test_an_update_nobody_answers_is_exit_6(temporal_client: Client, temporal_server: TemporalDevServer,
                                                  tmp_path: Path) -> None:
    config = tmp_path / "mcpsync.toml"
    config.write_text(f'[temporal]\naddress = "{temporal_server.address}"\ntask_queue = '
                      f'"{unique("no-worker")}"\n'
                      '[[servers]]\nname = "docs"\ntransport = "http"\nurl = "http://127.0.0.1:1/mcp"\n')
    key_args = ["--server", "docs", "--uri", f"demo://cli/{uuid.uuid4().hex[:8]}"]
    r = await run_cli("--config", str(config), "subscribe", *key_args)
    assert r.code == 0, r.err  # started on a task queue no worker polls
    try:
        r = await run_cli("--config", str(config), "status", *key_args, "--timeout", "1")
        assert r.code == 6, r.err  # a query needs a worker too: bounded, not a 30 s hang and a traceback
        assert ("no answer to query 'subscription' from workflow mcpsync-sub/docs/anonymous/"
                in _one_error_line(r))
        for command in ("close", "resume"):
            r = await run_cli("--config", str(config), command, *key_args, "--timeout", "1")
            assert r.code == 6, (command, r.err)
            assert f"no answer to '{command}' from workflow mcpsync-sub/docs/anonymous/" in _one_error_line(r)
    finally:
        workflow_id = SubscriptionKey(subject="anonymous", server="docs", uri=key_args[-1]).workflow_id
        await temporal_client.get_workflow_handle(workflow_id).terminate("test done")
