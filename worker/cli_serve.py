"""``mcpsync serve``: the CLI command (the server itself is mcpsync.worker.serve, docs/serve.md)."""

from __future__ import annotations

import argparse
from typing import Any

from mcpsync.worker.cli_common import CliError, database_url, resolve_config
from mcpsync.worker.serve_quota import Quota, QuotaLimits

__all__ = ["cmd_serve", "register"]


def register(sub: Any) -> None:
    """Add ``serve`` to the top-level subparsers ``sub``."""
    help_ = "an MCP server whose resources are one subject's subscribed resources (fresh, with receipts)"
    c = sub.add_parser(
        "serve", help=help_, description=help_ + ". HTTP: bearer tokens from MCPSYNC_SERVE_TOKENS, a JSON "
                                                 "object {subject: token}; stdio: --stdio SUBJECT. "
                                                 "docs/serve.md.",
        epilog="examples:\n"
               "  MCPSYNC_SERVE_TOKENS='{\"alice\": \"s3cret\"}' mcpsync serve --port 8765\n"
               "  mcpsync serve --stdio alice                  # for a host that starts servers over stdio\n")
    c.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    c.add_argument("--port", type=int, default=0, help="HTTP port (default 0: a free one, printed)")
    c.add_argument("--stdio", metavar="SUBJECT", default=None, help="serve SUBJECT over stdin/stdout "
                                                                    "instead of HTTP")
    c.add_argument("--max-age", type=float, default=None, metavar="SECONDS",
                   help="the published staleness bound: requireFresh refuses content verified longer ago")
    c.add_argument("--consumer", default="serve", help="the durable outbox consumer name of this process "
                                                       "(default 'serve'; one per serve process)")
    c.add_argument("--page-size", type=int, default=50, help="resources per resources/list page")
    c.add_argument("--client-buffer", type=int, default=256,
                   help="distinct URIs pending per 2025-11-25 client before a slow client is cut off "
                        "(notifications per URI are merged); events buffered per 2026-07-28 listen stream")
    limits = QuotaLimits()
    for flag, what in (("--max-listens", "open subscriptions/listen streams"),
                       ("--max-listen-uris", "URIs named in one subscriptions/listen"),
                       ("--max-event-streams", "open events/stream requests"),
                       ("--max-snapshots", "listing snapshots kept (past it the oldest is dropped)"),
                       ("--max-sessions", "2025-11-25 sessions")):
        quota = Quota(flag[len("--max-"):].replace("-", "_"))
        c.add_argument(flag, type=int, default=limits.of(quota), metavar="N",
                       help=f"per subject: {what} (default {limits.of(quota)}; past it -32005)")
    c.set_defaults(func=cmd_serve)


async def cmd_serve(args: argparse.Namespace) -> None:
    from mcpsync.worker.runtime import open_ledger
    from mcpsync.worker.serve import ServeConfig
    from mcpsync.worker.serve_run import run_serve, tokens_from_environment

    config, _ = resolve_config(args)
    try:
        tokens = tokens_from_environment()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.stdio is None and not tokens:
        raise CliError("no bearer tokens: set MCPSYNC_SERVE_TOKENS='{\"SUBJECT\": \"TOKEN\"}' (or use "
                       "--stdio SUBJECT)")
    if args.page_size < 1 or args.client_buffer < 1:
        raise CliError("--page-size and --client-buffer must be at least 1")
    quotas = QuotaLimits(**{q.value: getattr(args, f"max_{q.value}") for q in Quota})
    for q in Quota:
        if quotas.of(q) < 1:
            raise CliError(f"--max-{q.value.replace('_', '-')} must be at least 1")
    serve_config = ServeConfig(transport="stdio" if args.stdio else "http", host=args.host, port=args.port,
                               tokens=tokens, stdio_subject=args.stdio, page_size=args.page_size,
                               max_age_seconds=args.max_age, consumer=args.consumer,
                               client_buffer=args.client_buffer, quotas=quotas)
    url = database_url(config)
    ledger = await open_ledger(url, max_size=8)
    try:
        await run_serve(serve_config, ledger.pool, url)
    finally:
        await ledger.pool.close()
