"""``mcpsync serve``: the CLI command (the server itself is mcpsync.worker.serve.server, docs/serve.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from mcpsync.worker.cli.common import (
    CliError,
    check_listen,
    count,
    database_url,
    port,
    print_text,
    resolve_config,
    seconds,
)
from mcpsync.worker.serve.quota import Quota, QuotaLimits

__all__ = ["cmd_serve", "register"]


def register(sub: Any) -> None:
    """Add ``serve`` to the top-level subparsers ``sub``."""
    help_ = "an MCP server whose resources are one subject's subscribed resources (fresh, with receipts)"
    c = sub.add_parser(
        "serve", help=help_, description=help_ + ". HTTP: bearer tokens from MCPSYNC_SERVE_TOKENS, a JSON "
                                                 "object {subject: token}; stdio: --stdio SUBJECT. "
                                                 "docs/serve.md.",
        epilog="examples:\n"
               "  MCPSYNC_SERVE_TOKENS='{\"alice\": \"16-or-more-chars\"}' mcpsync serve --port 8765"
               "   # not run in tests: long-lived\n"
               "  mcpsync serve --stdio alice                  # for a host that starts servers over stdio\n")
    c.add_argument("--host", default="127.0.0.1", help="HTTP bind address")
    c.add_argument("--port", type=port, default=0, help="HTTP port (0: a free one, printed)")
    c.add_argument("--stdio", metavar="SUBJECT", default=None, help="serve SUBJECT over stdin/stdout "
                                                                    "instead of HTTP")
    c.add_argument("--max-age", type=seconds, default=None, metavar="SECONDS",
                   help="the published staleness bound: requireFresh refuses content verified longer ago")
    c.add_argument("--consumer", default=None, metavar="NAME",
                   help="follow the outbox as this durable consumer (registered, resumes where it stopped "
                        "after a restart; one name per serve process). Without it serve follows from the "
                        "outbox's end and registers nothing")
    c.add_argument("--page-size", type=count, default=50, help="resources per resources/list page")
    c.add_argument("--client-buffer", type=count, default=256,
                   help="distinct URIs pending per 2025-11-25 client before a slow client is cut off "
                        "(notifications per URI are merged); events buffered per 2026-07-28 listen stream")
    c.add_argument("--allowed-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="a Host header value to serve (repeatable; without a port: any port). Default: the "
                        "bind address and its port, plus localhost names for a loopback bind; others get 421")
    c.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                   help="an Origin header value to serve, e.g. https://app.example (repeatable). Without it: "
                        "http:// + each allowed host; a request without Origin passes; others get 403")
    c.add_argument("--header-timeout", type=seconds, default=10.0, metavar="SECONDS",
                   help="seconds a client has to send a request's headers before its connection is closed")
    c.add_argument("--max-connections", type=count, default=1024,
                   help="open HTTP connections at most; one more is answered 503 and closed")
    limits = QuotaLimits()
    for flag, what in (("--max-listens", "open subscriptions/listen streams"),
                       ("--max-listen-uris", "URIs named in one subscriptions/listen"),
                       ("--max-event-streams", "open events/stream requests"),
                       ("--max-snapshots", "listing snapshots kept (past it the oldest is dropped)"),
                       ("--max-sessions", "2025-11-25 sessions")):
        quota = Quota(flag[len("--max-"):].replace("-", "_"))
        c.add_argument(flag, type=count, default=limits.of(quota), metavar="N",
                       help=f"per subject: {what} (past it -32005)")
    c.set_defaults(func=cmd_serve)


async def cmd_serve(args: argparse.Namespace) -> None:
    from mcpsync.worker.main.connect import open_ledger
    from mcpsync.worker.serve.cursors import CursorSigner
    from mcpsync.worker.serve.run import run_serve, tokens_from_environment
    from mcpsync.worker.serve.server import ServeConfig
    from mcpsync.worker.serve.tokens import unlisted_subjects
    from mcpsync.worker.stack.common import state_dir

    if args.stdio is None:
        check_listen(args.host, args.port, "--host, --port")
    config, _ = resolve_config(args)
    try:
        tokens = tokens_from_environment()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.stdio is None and not tokens:
        raise CliError("no bearer tokens: set MCPSYNC_SERVE_TOKENS='{\"SUBJECT\": \"TOKEN\"}' (or use "
                       "--stdio SUBJECT)")
    if not args.header_timeout <= 3600:
        raise CliError("--header-timeout must be at most 3600 seconds")
    for value in (*args.allowed_host, *args.allowed_origin):
        if not value.strip() or not value.isprintable() or " " in value:
            raise CliError(f"--allowed-host / --allowed-origin: {value!r} is not a host or an origin")
    try:
        signer = CursorSigner.for_serve(state_dir())
    except (OSError, ValueError) as exc:
        raise CliError(f"serve's cursor key: {exc}") from None
    url = database_url(config)
    # Warned once everything is checked: a refused start prints its one error line and nothing else.
    for subject in unlisted_subjects(tokens, (s for server in config.servers for s in server.subjects)):
        print_text(f"mcpsync: warning: MCPSYNC_SERVE_TOKENS holds a token for subject {subject!r}, which no "
                   "configured server lists: it authenticates and sees no resources", file=sys.stderr,
                   flush=True)
    quotas = QuotaLimits(**{q.value: getattr(args, f"max_{q.value}") for q in Quota})
    serve_config = ServeConfig(transport="stdio" if args.stdio else "http", host=args.host, port=args.port,
                               tokens=tokens, stdio_subject=args.stdio, page_size=args.page_size,
                               max_age_seconds=args.max_age, consumer=args.consumer,
                               client_buffer=args.client_buffer, allowed_hosts=tuple(args.allowed_host),
                               allowed_origins=tuple(args.allowed_origin), header_timeout=args.header_timeout,
                               max_connections=args.max_connections, quotas=quotas)
    ledger = await open_ledger(url, max_size=8)
    try:
        await run_serve(serve_config, ledger.pool, signer)
    finally:
        await ledger.pool.close()
