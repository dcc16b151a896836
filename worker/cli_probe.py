"""``mcpsync probe``: characterize a configured MCP server without changing it (unless nudged)."""

from __future__ import annotations

import argparse
from typing import Any, Literal

from mcpsync.worker.cli_common import (
    CliError,
    ExitCode,
    print_out,
    resolve_config,
    seconds,
)

__all__ = ['cmd_probe', 'register']


async def cmd_probe(args: argparse.Namespace) -> None:
    from mcpsync.worker.probe import Nudge, ProbeError, ToolNudge, probe_server, render_text

    config, _ = resolve_config(args)
    server = config.server(args.server)
    nudge: Nudge | Literal["auto"] | None = None
    if args.nudge_tool:
        nudge = ToolNudge(args.nudge_tool, toggle=args.nudge_toggle)
    elif args.nudge:
        nudge = "auto"
    try:
        report = await probe_server(server, subject=args.subject, uri=args.uri, nudge=nudge,
                                    update_bound_seconds=args.update_bound, timeout=args.timeout,
                                    edition=args.edition)
    except ProbeError as exc:  # not reached, not started or not initialized: unavailable
        raise CliError(str(exc), ExitCode.UNAVAILABLE) from None
    print_out(report.model_dump(mode="json"), args.json, render_text(report))


def register(sub: Any) -> None:
    """Add ``probe`` to the top-level subparsers ``sub``."""
    pr = sub.add_parser("probe", help="characterize a configured MCP server without changing it")
    pr.add_argument("--server", required=True)
    pr.add_argument("--subject", default="anonymous")
    pr.add_argument("--uri", help="resource to read and subscribe to (default: the first one listed)")
    pr.add_argument("--edition", choices=["2025-11-25", "2026-07-28", "auto"],
                    help="default: the server's config")
    pr.add_argument("--nudge", action="store_true",
                    help="prove updates with a known server-specific nudge (CHANGES server state)")
    pr.add_argument("--nudge-tool", metavar="TOOL",
                    help="nudge by calling this tool (no arguments); implies --nudge")
    pr.add_argument("--nudge-toggle", action="store_true",
                    help="call --nudge-tool again afterwards to undo it")
    pr.add_argument("--update-bound", type=seconds, default=10.0, metavar="SECONDS",
                    help="how long to wait for an update after the nudge")
    pr.add_argument("--timeout", type=seconds, default=10.0, metavar="SECONDS", help="per-request timeout")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_probe)
