"""``mcpsync`` command line.

Contract:
- Expected failures (unknown server, Temporal or PostgreSQL unreachable, bad
  config, no such subscription) print one ``mcpsync: error: ...`` line to stderr
  and exit 2; never a traceback. ``--json`` output is one JSON document on stdout.
- Without ``--config`` (or ``MCPSYNC_CONFIG``) the commands talk to the stack that
  ``mcpsync up`` started, found through ``<state dir>/runtime.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from activities.db import DatabaseUnavailable
from worker.config import Config, ConfigError, load_config
from worker.runtime import (
    RuntimeInfo,
    TemporalUnavailable,
    connect_temporal,
    open_ledger,
    run_services,
    start_subscription,
    subscription_handle,
)
from workflows.names import QUERY_SUBSCRIPTION, UPDATE_CLOSE
from workflows.records import CloseReceipt, CloseRequest, ResourceSubscriptionV1, SubscriptionKey

__all__ = ["main", "CliError"]

log = logging.getLogger("mcpsync")

DEMO_URI = "demo://policy/escalation"


class CliError(Exception):
    """An expected failure: printed as one line, exit code 2."""


def _state_dir() -> Path:
    from worker.stack import state_dir

    return state_dir()


def _resolve_config(args: argparse.Namespace) -> tuple[Config, RuntimeInfo | None]:
    path = args.config or os.environ.get("MCPSYNC_CONFIG")
    runtime = RuntimeInfo.load(_state_dir() / "runtime.json")
    if path is None and runtime is not None:
        path = runtime.config_path
    if path is None:
        raise CliError("no configuration: pass --config FILE, set MCPSYNC_CONFIG, or start the stack with "
                       "'mcpsync up'")
    config = load_config(path)
    if runtime is not None and args.config is None and not os.environ.get("MCPSYNC_CONFIG"):
        # The embedded stack's addresses win over the defaults in its generated file.
        config = config.model_copy(update={
            "temporal": config.temporal.model_copy(update={"address": runtime.temporal_address,
                                                           "ui_url": runtime.ui_url}),
            "database": config.database.model_copy(update={"url": config.database.url or runtime.database_url}),
        })
    return config, runtime


def _database_url(config: Config) -> str:
    if not config.database.url:
        raise CliError("no database URL: set MCPSYNC_DATABASE_URL or [database] url, or run 'mcpsync up'")
    return config.database.url


def _key(args: argparse.Namespace, config: Config) -> SubscriptionKey:
    config.server(args.server)  # raises ConfigError for an unknown server
    return SubscriptionKey(subject=args.subject, server=args.server, uri=args.uri)


def _print(obj: Any, as_json: bool, text: str) -> None:
    if as_json:
        print(json.dumps(obj, indent=2, default=str))
    else:
        print(text)


# --- commands ---------------------------------------------------------------------------


async def cmd_migrate(args: argparse.Namespace) -> None:
    config, _ = _resolve_config(args)
    from activities.db import migrate, open_pool

    pool = await open_pool(_database_url(config))
    try:
        applied = await migrate(pool)
    finally:
        await pool.close()
    print(f"migrations applied: {', '.join(applied) if applied else 'none (up to date)'}")


async def cmd_subscribe(args: argparse.Namespace) -> None:
    config, _ = _resolve_config(args)
    key = _key(args, config)
    client = await connect_temporal(config.temporal)
    handle = await start_subscription(client, key, task_queue=config.temporal.task_queue)
    _print({"workflow_id": handle.id, "run_id": handle.result_run_id, **key.model_dump()}, args.json,
           f"subscribed: workflow {handle.id}")


async def _query(args: argparse.Namespace) -> tuple[Config, SubscriptionKey, ResourceSubscriptionV1]:
    config, _ = _resolve_config(args)
    key = _key(args, config)
    client = await connect_temporal(config.temporal)
    try:
        record = await subscription_handle(client, key).query(QUERY_SUBSCRIPTION,
                                                              result_type=ResourceSubscriptionV1)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"no subscription for {key.subject}/{key.server}/{key.uri}") from None
        raise
    return config, key, record


async def cmd_status(args: argparse.Namespace) -> None:
    _, key, record = await _query(args)
    text = "\n".join(f"{k:>24}: {v}" for k, v in record.model_dump(mode="json").items())
    _print(record.model_dump(mode="json"), args.json, text)


async def cmd_close(args: argparse.Namespace) -> None:
    config, _ = _resolve_config(args)
    key = _key(args, config)
    client = await connect_temporal(config.temporal)
    try:
        receipt = await subscription_handle(client, key).execute_update(
            UPDATE_CLOSE, CloseRequest(reason=args.reason), result_type=CloseReceipt
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise CliError(f"no running subscription for {key.subject}/{key.server}/{key.uri}") from None
        raise
    except WorkflowUpdateFailedError as err:
        raise CliError(f"close refused: {err.cause}") from None
    _print(receipt.model_dump(mode="json"), args.json,
           f"{receipt.state.value}: close epoch {receipt.close_epoch}, close ordinal {receipt.close_ordinal}")


async def cmd_outbox(args: argparse.Namespace) -> None:
    config, _ = _resolve_config(args)
    ledger = await open_ledger(_database_url(config), max_size=2)
    try:
        rows = await (ledger.outbox_after(args.after, args.limit) if args.after else ledger.outbox_last(args.limit))
        last = rows[-1]["outbox_id"] if rows else args.after
        _emit_outbox(rows, args.json)
        while args.follow:
            await asyncio.sleep(1.0)
            rows = await ledger.outbox_after(last, args.limit)
            if rows:
                last = rows[-1]["outbox_id"]
                _emit_outbox(rows, args.json)
    finally:
        await ledger.pool.close()


def _emit_outbox(rows: list[Any], as_json: bool) -> None:
    if as_json and not rows:
        return
    for r in rows:
        if as_json:
            print(json.dumps(r, default=str), flush=True)
        else:
            print(f"#{r['outbox_id']} {r['created_at']} {r['event_type']} {r['subject']}/{r['server']} "
                  f"{r['uri']} receipt={r['receipt_id']} ordinal={r['read_ordinal']} {r['content_digest']}",
                  flush=True)


async def cmd_worker(args: argparse.Namespace) -> None:
    config, _ = _resolve_config(args)
    client = await connect_temporal(config.temporal)
    ledger = await open_ledger(_database_url(config))
    servers = args.server or None
    with_main = args.role in ("all", "main")
    if args.role == "main":
        config = config.model_copy(update={"servers": []})
    print(f"mcpsync worker: role={args.role} task_queue={config.temporal.task_queue} "
          f"servers={[s.name for s in config.servers]}", flush=True)
    try:
        await run_services(config, client, ledger, servers=servers, with_main_worker=with_main)
    finally:
        await ledger.pool.close()


async def cmd_up(args: argparse.Namespace) -> None:
    from worker.up import run_up

    await run_up(args)


# --- entry ------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mcpsync", description="Durable, provably fresh MCP resource subscriptions")
    p.add_argument("--config", help="TOML config file (default: $MCPSYNC_CONFIG, else the 'mcpsync up' stack)")
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start the embedded stack, the demo server and the worker")
    up.add_argument("--port", type=int, default=7233, help="Temporal frontend port (0: pick a free one)")
    up.add_argument("--ui-port", type=int, default=8233, help="Temporal Web UI port (0: pick a free one)")
    up.add_argument("--churn", type=float, default=15.0, help="seconds between demo edits (0: none)")
    up.add_argument("--exit-after", type=float, default=None, help=argparse.SUPPRESS)
    up.set_defaults(func=cmd_up)

    w = sub.add_parser("worker", help="run the main worker and/or the session hosts (ingress)")
    w.add_argument("--role", choices=["all", "main", "ingress"], default="all")
    w.add_argument("--server", action="append", help="only these servers (repeatable)")
    w.set_defaults(func=cmd_worker)

    m = sub.add_parser("migrate", help="apply the PostgreSQL ledger migrations")
    m.set_defaults(func=cmd_migrate)

    def keyed(name: str, help_: str, func: Callable[[argparse.Namespace], Awaitable[None]]) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_)
        c.add_argument("--server", required=True)
        c.add_argument("--uri", required=True)
        c.add_argument("--subject", default="anonymous")
        c.add_argument("--json", action="store_true")
        c.set_defaults(func=func)
        return c

    keyed("subscribe", "start (or join) the subscription workflow of a URI", cmd_subscribe)
    keyed("status", "print the resourceSubscription.v1 record", cmd_status)
    close = keyed("close", "close a subscription (Temporal update; returns the close receipt)", cmd_close)
    close.add_argument("--reason", default="requested by CLI")

    ob = sub.add_parser("outbox", help="invalidation outbox")
    ob_sub = ob.add_subparsers(dest="outbox_command", required=True)
    tail = ob_sub.add_parser("tail", help="print the newest outbox rows (and follow with -f)")
    tail.add_argument("--json", action="store_true")
    tail.add_argument("-f", "--follow", action="store_true")
    tail.add_argument("--after", type=int, default=0)
    tail.add_argument("--limit", type=int, default=20)
    tail.set_defaults(func=cmd_outbox)
    return p


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose or args.command in ("up", "worker") else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    code = 0
    try:
        asyncio.run(_run(args))
    except (CliError, ConfigError, TemporalUnavailable, DatabaseUnavailable) as exc:
        print(f"mcpsync: error: {exc}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    # A process that ran a Temporal worker can abort at interpreter exit (sdk-python#300).
    os._exit(code)


async def _run(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        with suppress(NotImplementedError):
            loop.add_signal_handler(sig, task.cancel)
    try:
        await args.func(args)
    except asyncio.CancelledError:
        pass
