"""``mcpsync up``: the whole embedded stack in one process tree.

Starts (under the state dir) the Temporal dev server with the search attributes
registered, PostgreSQL (the configured URL, else the embedded server), applies
the migrations, starts the demo MCP server (fixture, streamable HTTP, a demo
resource edited every ``--churn`` seconds), runs the worker and the session host,
subscribes the demo URI, starts ``mcpsync serve`` for the demo subject (``--serve-port``; URL and a
demo bearer token printed, only when ``up`` generated it: one from MCPSYNC_SERVE_TOKENS is used, not
printed) and prints the Web UI URL. Ctrl-C stops everything. A state dir too long for the embedded
PostgreSQL's socket is refused before anything is created or started; everything under the state
dir is private to its owner (``stack.make_private``).
The addresses and this process's pid are written to ``<state>/runtime.json`` so
``mcpsync status``, ``close``, ``outbox tail`` ... find this stack without a config
file; a clean stop removes the file, and a file whose pid no longer runs is stale
(the CLI refuses it). A second ``up`` on a state dir whose stack runs raises
``StackAlreadyRunning`` before binding anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Callable
from contextlib import AsyncExitStack, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.worker.main.config import Config, DatabaseConfig, MetricsConfig, ServerConfig, TemporalConfig
from mcpsync.worker.main.connect import connect_temporal, open_ledger
from mcpsync.worker.main.services import cancel_and_wait, run_services, start_catalogs
from mcpsync.worker.observe.metrics import MetricsUnavailable, serve_metrics
from mcpsync.worker.stack.common import StackAlreadyRunning, make_private, state_dir, write_private
from mcpsync.worker.stack.postgres import EmbeddedPostgres
from mcpsync.worker.stack.running import RunningStack
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.names import QUERY_SUBSCRIPTION
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1

if TYPE_CHECKING:
    from mcpsync.worker.ingress.process import Ingress

__all__ = ["run_up", "reclaim_demo_server", "DEMO_SERVER", "DEMO_URI", "DEMO_SUBJECT"]

DEMO_SERVER = "demo"
DEMO_URI = "demo://policy/escalation"
DEMO_SUBJECT = "anonymous"
# Past a held lease (a SIGKILLed stack's: at most the default lease_seconds, 15 s) with room to spare.
DEMO_SESSION_WAIT_SECONDS = 30.0


def _config_toml(temporal: TemporalConfig, database_url: str, mcp_url: str) -> str:
    return (
        "# Written by 'mcpsync up'. Copy it and edit for your own servers.\n"
        "[temporal]\n"
        f'address = "{temporal.address}"\nnamespace = "{temporal.namespace}"\n'
        f'task_queue = "{temporal.task_queue}"\nui_url = "{temporal.ui_url}"\n\n'
        "[database]\n"
        f'url = "{database_url}"\n\n'
        "[[servers]]\n"
        f'name = "{DEMO_SERVER}"\ntransport = "http"\nurl = "{mcp_url}"\nedition = "2025-11-25"\n'
        f'subjects = ["{DEMO_SUBJECT}"]\n'
    )


async def run_up(args: argparse.Namespace) -> None:
    from mcpsync.fixture import FixtureProcess
    from mcpsync.worker.ingress.process import Ingress

    t0 = time.monotonic()
    root = state_dir()
    db_url = os.environ.get("MCPSYNC_DATABASE_URL")
    if not db_url:
        EmbeddedPostgres.check_state_dir(root)  # before anything is created or started
    runtime_file = root / "runtime.json"
    running = RunningStack.load(runtime_file)
    if (running is not None and running.pid is not None and running.pid != os.getpid()
            and running.stack_alive()):
        # Checked before anything is touched or binds a port: the state dir is the running stack's.
        raise StackAlreadyRunning(f"a stack is already running on state dir {root} (mcpsync up pid "
                                  f"{running.pid}, Temporal {running.temporal_address}): stop it first or "
                                  "set another "
                                  "MCPSYNC_STATE_DIR")
    make_private(root)  # it holds the runtime file, the configuration (a database URL), Temporal's history
    async with AsyncExitStack() as stack:
        print(f"mcpsync up: state dir {root}", flush=True)
        try:
            metrics = serve_metrics(None if args.no_metrics else MetricsConfig(port=args.metrics_port))
        except MetricsUnavailable as exc:
            # 'up' has no config file: name its flag, not the [metrics] table.
            raise MetricsUnavailable(str(exc).replace(
                "(change [metrics] port)",
                "(pass --metrics-port N, 0 for a free one, or --no-metrics)")) from None
        stack.push_async_callback(metrics.aclose)
        temporal_server = await TemporalDevServer.start(root / "temporal", port=args.port,
                                                        ui_port=args.ui_port)
        stack.push_async_callback(temporal_server.stop)
        print(f"  temporal dev server  {temporal_server.address} ({temporal_server.startup_seconds:.1f}s)",
              flush=True)

        if not db_url:
            pg = await EmbeddedPostgres.start(root)
            stack.push_async_callback(pg.stop)
            db_url = pg.url
            print(f"  postgresql (embedded) {pg.pgdata} ({pg.startup_seconds:.1f}s)", flush=True)
        else:
            from mcpsync.activities.ledger.db import redact_url

            print(f"  postgresql           {redact_url(db_url)}", flush=True)
        ledger = await open_ledger(db_url)
        stack.push_async_callback(ledger.pool.close)
        metrics.watch_ledger(ledger)
        stack.push_async_callback(metrics.unwatch_ledger)  # unwound before the pool closes
        if metrics.url:
            print(f"  metrics (Prometheus) {metrics.url}", flush=True)

        reclaim_demo_server(root / "demo-server")
        fixture = await FixtureProcess.start_http(root / "demo-server", seed="demo", demo_churn=args.churn)
        stack.push_async_callback(fixture.stop)
        _record_child(root / "demo-server", fixture.pid)
        stack.callback(_forget_child, root / "demo-server")
        print(f"  demo MCP server      {fixture.mcp_url} (control plane {fixture.control_url})", flush=True)

        temporal_cfg = TemporalConfig(address=temporal_server.address, ui_url=temporal_server.ui_url)
        config_path = root / "mcpsync.toml"
        write_private(config_path, _config_toml(temporal_cfg, db_url, fixture.mcp_url))  # 0600: the URL
        client = await connect_temporal(temporal_cfg)
        ingress = Ingress(client, ledger)
        RunningStack(temporal_address=temporal_server.address, namespace=temporal_cfg.namespace,
                    database_url=db_url, ui_url=temporal_server.ui_url,
                    config_path=str(config_path), pid=os.getpid(),
                    ingress_identity=ingress.identity).save(runtime_file)
        stack.callback(_forget_runtime, runtime_file)
        if running is not None and running.ingress_identity and running.pid != os.getpid():
            # That stack is gone (checked above) and its ingress with it: its session leases would hold
            # this one's ingress off for up to lease_seconds.
            if released := await ledger.sessions.release_leases_of(running.ingress_identity):
                print(f"  released {released} session lease(s) of the stopped mcpsync up pid {running.pid}",
                      flush=True)
        config = Config(
            temporal=temporal_cfg,
            database=DatabaseConfig(url=db_url),
            servers=[ServerConfig(name=DEMO_SERVER, transport="http", url=fixture.mcp_url,
                                  edition="2025-11-25", subjects=[DEMO_SUBJECT])],
        )
        # /readyz: every Temporal worker of this process polls and the demo subscription converged.
        polling: list[Callable[[], bool]] = []
        converged = asyncio.Event()
        metrics.ready_when(lambda: converged.is_set() and bool(polling) and all(check() for check in polling))
        services = asyncio.create_task(run_services(config, client, ledger, ingress=ingress, polling=polling))
        stack.push_async_callback(_cancel, services)
        if not await _await_demo_session(ingress, services):
            print(f"  demo MCP session not open after {DEMO_SESSION_WAIT_SECONDS:g}s; the demo subscription "
                  "waits for it", flush=True)

        key = SubscriptionKey(subject=DEMO_SUBJECT, server=DEMO_SERVER, uri=DEMO_URI)
        # A state dir from an older version holds the demo subscription under its old id: join it.
        handle = await start_subscription(client, key, task_queue=config.temporal.task_queue,
                                          workflow_id=await ledger.fence.workflow_id_of(key))
        await start_catalogs(client, config)
        serve_port = getattr(args, "serve_port", -1)
        if serve_port is not None and serve_port >= 0:
            serve_url, token = await _start_serve(stack, ledger, serve_port)
            if token is None:
                print(f"  mcpsync serve        {serve_url} (subject {DEMO_SUBJECT}; bearer token from "
                      "MCPSYNC_SERVE_TOKENS)", flush=True)
            else:
                print(f"  mcpsync serve        {serve_url} (subject {DEMO_SUBJECT}; "
                      f"demo bearer token {token})", flush=True)
                print(f"    connect the MCP Inspector: transport Streamable HTTP, URL {serve_url}, "
                      f"header 'Authorization: Bearer {token}'", flush=True)
        link = f"{temporal_server.ui_url}/namespaces/default/workflows/{quote(handle.id, safe='')}"
        print(f"\nTemporal Web UI: {temporal_server.ui_url}", flush=True)
        print(f"  demo subscription: {link}", flush=True)
        churn = f"changes every {args.churn:g}s" if args.churn else "does not change (--churn 0)"
        print(f"  ready in {time.monotonic() - t0:.1f}s; the demo resource {churn}. "
              f"Try: {_mcpsync_command()} status --server demo --uri demo://policy/escalation", flush=True)
        stop = (f"stops after {args.exit_after:g}s (--exit-after)" if args.exit_after is not None
                else "Ctrl-C (or 'mcpsync down' from another terminal) stops the stack")
        print(f"  {stop}.\n", flush=True)

        deadline = None if args.exit_after is None else time.monotonic() + args.exit_after
        last = None
        while deadline is None or time.monotonic() < deadline:
            if services.done():
                services.result()
            with suppress(Exception):
                rec = await handle.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1)
                line = (rec.state.value, rec.watermark, rec.last_accepted_digest)
                if rec.state == SubscriptionState.ACTIVE and rec.last_receipt_id is not None:
                    converged.set()
                if line != last:
                    last = line
                    receipt = "-" if rec.last_receipt_id is None else rec.last_receipt_id
                    print(f"  [{time.strftime('%H:%M:%S')}] {rec.state.value:<17} watermark={rec.watermark} "
                          f"receipt={receipt} digest={(rec.last_accepted_digest or '-')[:23]}",
                          flush=True)
            await asyncio.sleep(1.0)


async def _await_demo_session(ingress: Ingress, services: asyncio.Task[None]) -> bool:
    """Wait until this process holds the demo's MCP session: True; False after
    ``DEMO_SESSION_WAIT_SECONDS``. A service that fails meanwhile raises its error.

    A new demo subscription run binds to the session the ledger names when it starts (the host
    records its session before ``Ingress.live`` shows it). A stack SIGKILLed on this database left
    its session open there, on an ingress queue nobody polls any more, and its lease runs on for up
    to the server's ``lease_seconds`` unless ``run_up`` released it (the stale runtime file names that
    stack's ingress): a run started before this process holds a session of its own would send its
    subscribe to that queue, where it waits in SUBSCRIBING until this process has opened its session
    and answers it there (``Ingress.adopt``), then subscribes again."""
    deadline = time.monotonic() + DEMO_SESSION_WAIT_SECONDS
    while ingress.live(DEMO_SUBJECT, DEMO_SERVER) is None:
        if services.done():
            services.result()
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def _start_serve(stack: AsyncExitStack, ledger: Ledger, port: int) -> tuple[str, str | None]:
    """``mcpsync serve`` for the demo subject, in this process: (URL, the demo bearer token to
    print). The token is MCPSYNC_SERVE_TOKENS' for the demo subject when set, and then None is
    returned in its place (an operator's credential is never printed); else a new random one per
    ``up``, returned to be printed."""
    import secrets

    from mcpsync.worker.serve.run import run_serve, tokens_from_environment
    from mcpsync.worker.serve.server import ServeConfig

    tokens = tokens_from_environment()
    configured = next((t for t, subject in tokens if subject == DEMO_SUBJECT), None)
    generated: str | None = None
    if configured is None:
        token = generated = secrets.token_urlsafe(18)
    else:
        token = configured
    config = ServeConfig(port=port, tokens=((token, DEMO_SUBJECT), *((t, s) for t,
                                                                     s in tokens if t != token)))
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_serve(config, ledger.pool, on_listening=listening.set_result))
    stack.push_async_callback(_cancel, task)
    waiters: set[asyncio.Future[Any]] = {task, listening}
    done, _ = await asyncio.wait(waiters, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if listening not in done:
        if task.done():
            task.result()
        raise RuntimeError("mcpsync serve did not start within 30 s")
    return listening.result(), generated


def _mcpsync_command() -> str:
    """How this user runs ``mcpsync`` for the hint: plain ``mcpsync`` when that is the one on PATH
    (a wheel install), the running script's path otherwise; under ``python -m`` in a checkout, its
    ``.venv/bin/mcpsync``. Never a path that does not exist."""
    import shutil
    import sys

    from mcpsync.worker.stack.common import REPO_ROOT, SOURCE_CHECKOUT

    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    on_path = shutil.which("mcpsync")
    if script is not None and script.name == "mcpsync":
        if on_path and Path(on_path).resolve() == script:
            return "mcpsync"
        try:
            return str(script.relative_to(Path.cwd().resolve()))
        except ValueError:
            return str(script)
    venv_script = REPO_ROOT / ".venv" / "bin" / "mcpsync"
    if SOURCE_CHECKOUT and venv_script.exists():
        return ".venv/bin/mcpsync" if Path.cwd().resolve() == REPO_ROOT.resolve() else str(venv_script)
    return "mcpsync" if on_path else f"{sys.executable} -m mcpsync.worker.cli"


OWNER_RECORD = "owner.json"


def _record_child(folder: Path, pid: int) -> None:
    """Record the demo server's pid and ours, so that an ``up`` killed with SIGKILL (no cleanup)
    does not leave it running for good: the next ``up`` on this state dir reclaims it."""
    (folder / OWNER_RECORD).write_text(json.dumps({"pid": pid, "owner_pid": os.getpid()}))


def _forget_child(folder: Path) -> None:
    (folder / OWNER_RECORD).unlink(missing_ok=True)


def reclaim_demo_server(folder: Path) -> None:
    """Stop a demo server an earlier ``up`` of this state dir recorded and left behind (its owner is
    gone: killed with SIGKILL). Only a live process whose command line is the fixture's is touched."""
    from mcpsync.worker.stack.common import process_alive, stop_process

    record_file = folder / OWNER_RECORD
    try:
        record = json.loads(record_file.read_text())
        pid, owner = int(record["pid"]), int(record["owner_pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    if owner != os.getpid() and not process_alive(owner, expect_in_cmdline=("mcpsync",)) and process_alive(
            pid, expect_in_cmdline=("fixture",)):
        stop_process(pid, "fixture")
        print(f"  reclaimed the demo MCP server pid {pid} left by mcpsync up pid {owner}", flush=True)
    record_file.unlink(missing_ok=True)


def _forget_runtime(path: Path) -> None:
    """A stopped stack leaves no runtime file for the other commands to trust (only our own)."""
    info = RunningStack.load(path)
    if info is not None and info.pid == os.getpid():
        path.unlink(missing_ok=True)


async def _cancel(task: asyncio.Task[None]) -> None:
    await cancel_and_wait([task])
