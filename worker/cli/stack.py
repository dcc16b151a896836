"""``mcpsync up``, ``down``, ``worker`` and ``migrate``: running the stack and its services.

Contract:
- ``up`` runs the embedded stack in the foreground (``mcpsync.worker.stack.up``); ``down`` stops the
  ``up`` of this state dir through the pid its runtime file records (exit 6 when nothing runs; a
  stale runtime file is removed, exit 6).
- ``worker`` runs the main worker and/or the session hosts with the Prometheus endpoint;
  ``migrate`` applies the ledger migrations.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcpsync.worker.cli.common import (
    CliError,
    ExitCode,
    amount,
    check_listen,
    database_url,
    port,
    resolve_config,
    seconds,
)
from mcpsync.worker.main.connect import connect_temporal, open_ledger
from mcpsync.worker.main.services import run_services

__all__ = ['cmd_up', 'cmd_down', 'cmd_worker', 'cmd_migrate', 'register']


async def cmd_up(args: argparse.Namespace) -> None:
    from mcpsync.worker.serve.tokens import tokens_from_environment
    from mcpsync.worker.stack.up import run_up

    try:
        tokens_from_environment()  # serve's tokens: refused before anything starts
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.no_serve:
        args.serve_port = None
    elif args.serve_port:
        # Before anything starts: a taken port would fail only once the whole stack runs.
        check_listen("127.0.0.1", args.serve_port, "--serve-port")
    await run_up(args)


def _zombie(pid: int) -> bool:
    """Exited, not yet reaped by its parent (``/proc/<pid>/stat`` state Z): stopped, for ``down``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


async def cmd_down(args: argparse.Namespace) -> None:
    """Stop the ``mcpsync up`` of this state dir, started in another terminal or in the background:
    SIGTERM to the pid its runtime file records (a clean stop: it stops its children and removes
    the file), then wait for it. No runtime file: exit 6; a stale one is removed, exit 6."""
    import time

    from mcpsync.worker.cli.common import runtime_file
    from mcpsync.worker.stack.common import process_alive
    from mcpsync.worker.stack.running import RunningStack

    path = runtime_file()
    if not path.exists():
        raise CliError(f"nothing is running here: no runtime file {path}", ExitCode.UNAVAILABLE)
    info = RunningStack.load(path)
    if info is None or info.pid is None:
        raise CliError(f"runtime file {path} names no 'mcpsync up' pid: stop that stack where it runs")
    if not info.stack_alive():
        from mcpsync.worker.stack.up import reclaim_demo_server

        reclaim_demo_server(path.parent / "demo-server")
        path.unlink(missing_ok=True)
        # Nothing was running to stop: exit 6 as for a missing runtime file, the stale one cleaned up.
        raise CliError(f"no stack running on {path.parent} (mcpsync up pid {info.pid} is gone); removed the "
                       "stale runtime file (the next 'mcpsync up' reclaims the dev server and PostgreSQL it "
                       "left)", ExitCode.UNAVAILABLE)
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while process_alive(info.pid, expect_in_cmdline=("mcpsync",)) and not _zombie(info.pid):
        if time.monotonic() > deadline:
            raise CliError(f"mcpsync up pid {info.pid} did not stop within {args.timeout:g} s (it was sent "
                           f"SIGTERM; kill -9 {info.pid} and the next 'mcpsync up' reclaims its children)",
                           ExitCode.UNAVAILABLE)
        await asyncio.sleep(0.2)
    print(f"stopped mcpsync up pid {info.pid} (state dir {path.parent}, Temporal {info.temporal_address})")



async def cmd_worker(args: argparse.Namespace) -> None:
    from mcpsync.worker.observe.metrics import serve_metrics

    config, _ = resolve_config(args)
    metrics = serve_metrics(config.metrics)  # before the Temporal client: it installs the SDK runtime
    client = await connect_temporal(config.temporal)
    ledger = await open_ledger(database_url(config))
    metrics.watch_ledger(ledger)
    metrics.watch_loop()
    polling: list[Callable[[], bool]] = []  # /readyz: every Temporal worker of this process polls
    metrics.ready_when(lambda: bool(polling) and all(check() for check in polling))
    servers = args.server or None
    with_main = args.role in ("all", "main")
    if with_main:
        # Catalog reconciliation is part of the service: start (or join) it for every configured view.
        from mcpsync.worker.main.services import start_catalogs

        await start_catalogs(client, config)
    if args.role == "main":
        config = config.model_copy(update={"servers": []})
    versioning = (f" deployment={config.temporal.deployment_name} build={config.temporal.build_id}"
                  if with_main and config.temporal.versioned else "")
    print(f"mcpsync worker: role={args.role} task_queue={config.temporal.task_queue} "
          f"servers={[s.name for s in config.servers]}{versioning}", flush=True)
    try:
        await run_services(config, client, ledger, servers=servers, with_main_worker=with_main,
                           polling=polling)
    finally:
        await metrics.aclose()
        await ledger.pool.close()



async def cmd_migrate(args: argparse.Namespace) -> None:
    config, _ = resolve_config(args)
    from mcpsync.activities.ledger.db import migrate, open_pool

    pool = await open_pool(database_url(config))
    try:
        applied = await migrate(pool)
    finally:
        await pool.close()
    print(f"migrations applied: {', '.join(applied) if applied else 'none (up to date)'}")



def register(sub: Any) -> None:
    """Add ``up``, ``down``, ``worker`` and ``migrate`` to the top-level subparsers ``sub``."""
    up = sub.add_parser("up", help="start the embedded stack, the demo server and the worker",
                        description="Start the embedded stack in the foreground: Temporal dev server, "
                                    "PostgreSQL, the demo MCP server, the worker. State: $MCPSYNC_STATE_DIR "
                                    "(default .state in a checkout). Ctrl-C, 'mcpsync down' or --exit-after "
                                    "stops it.",
                        epilog="examples:\n"
                               "  mcpsync up                                     # not run in tests: "
                               "long-lived\n"
                               "  mcpsync up --port 0 --ui-port 0 --metrics-port 0 --churn 0   # not run in "
                               "tests: "
                               "long-lived\n"
                               "  mcpsync up --exit-after 600 > up.log 2>&1 &"
                               "    # in the background, for 10 minutes (not run in tests: long-lived)\n"
                               "  mcpsync down                                   "
                               "# stop it from another terminal")
    up.add_argument("--port", type=port, default=7233, help="Temporal frontend port (0: pick a free one)")
    up.add_argument("--ui-port", type=port, default=8233, help="Temporal Web UI port (0: pick a free one)")
    up.add_argument("--churn", type=amount, default=15.0, help="seconds between demo edits (0: none)")
    up.add_argument("--metrics-port", type=port, default=9464,
                    help="Prometheus endpoint port, also /readyz and /healthz (0: a free one, printed)")
    up.add_argument("--no-metrics", action="store_true", help="no Prometheus endpoint")
    up.add_argument("--serve-port", type=port, default=0, metavar="PORT",
                    help="port of 'mcpsync serve' for the demo subject (0: a free one, printed)")
    up.add_argument("--no-serve", action="store_true", help="no 'mcpsync serve' for the demo subject")
    up.add_argument("--exit-after", type=seconds, default=None, metavar="SECONDS",
                    help="stop cleanly after this long "
                         "(default: run until Ctrl-C, SIGTERM or 'mcpsync down')")
    up.set_defaults(func=cmd_up)

    dn = sub.add_parser("down",
                        help="stop the 'mcpsync up' of this state dir "
                             "(started elsewhere or in the background)",
                        description="Stop the 'mcpsync up' of this state dir ($MCPSYNC_STATE_DIR), "
                                    "started in "
                                    "another terminal or in the background: SIGTERM to the pid its runtime "
                                    "file records, then wait until it stopped its services. Exit 6 when "
                                    "nothing runs there (a stale runtime file is removed).",
                        epilog="example: MCPSYNC_STATE_DIR=/tmp/demo mcpsync down")
    dn.add_argument("--timeout", type=seconds, default=60.0, metavar="SECONDS",
                    help="wait this long for it to stop (exit 6 after)")
    dn.set_defaults(func=cmd_down)

    w = sub.add_parser("worker", help="run the main worker and/or the session hosts (ingress)")
    w.add_argument("--role", choices=["all", "main", "ingress"], default="all",
                   help="main: workflows and ledger activities; ingress: the session hosts; all: both")
    w.add_argument("--server", action="append", help="only these servers (repeatable)")
    w.set_defaults(func=cmd_worker)

    m = sub.add_parser("migrate", help="apply the PostgreSQL ledger migrations")
    m.set_defaults(func=cmd_migrate)
