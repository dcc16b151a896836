"""``mcpsync probe``: characterize a configured MCP server without changing it (unless nudged)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Literal

from mcpsync.worker.cli.common import (
    CliError,
    ExitCode,
    print_out,
    resolve_config,
    seconds,
)
from mcpsync.worker.cli.subscription_text import dash

if TYPE_CHECKING:
    from mcpsync.worker.observe.probe import ProbeReport

__all__ = ['cmd_probe', 'register', 'render_text']


async def cmd_probe(args: argparse.Namespace) -> None:
    from mcpsync.worker.observe.probe import Nudge, ProbeError, ToolNudge, probe_server

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


def render_text(report: ProbeReport) -> str:
    """A short human summary of a report (``mcpsync probe`` without ``--json``); every string the
    server chose (its name and version, a URI, a detail) is one escaped field (``dash``)."""
    c, ls, nf, sb = report.capabilities, report.listing, report.not_found, report.subscribe
    lines = [
        f"server        {report.server} ({report.transport} {report.target}) as {report.subject}",
        f"implementation {dash(report.server_name)} {dash(report.server_version)}",
        f"edition       {report.edition} (requested {report.requested_edition}; "
        + ", ".join(f"{e.mode}->{e.negotiated or 'error'}" for e in report.editions) + ")",
        f"capabilities  resources={c.resources} subscribe={c.subscribe} listChanged={c.list_changed} "
        f"snapshot-id={c.snapshot_extension or 'no'}",
        f"listing       {ls.resources} resources, "
        + (f"page size {ls.page_size}, {ls.scans[0].pages} pages" if ls.paginated else "one page")
        + f", cursors {'stable' if ls.cursors_stable else 'CHANGED'} across two scans, listing "
        + f"{'stable' if ls.listing_stable else 'CHANGED'}, lastModified on {ls.with_last_modified}, "
        + f"templates {ls.templates if ls.templates is not None else 'error'}",
        f"not found     code {nf.code} ({nf.classified_as}) for {dash(nf.uri)}",
        f"subscribe     {sb.verdict} via {sb.method}: ack={sb.acked}"
        + (f" in {sb.ack_ms} ms" if sb.ack_ms is not None else "")
        + (f", update in {sb.update_ms} ms" if sb.update_ms is not None else "")
        + (f" ({dash(sb.detail)})" if sb.detail else ""),
        f"error codes   {report.error_codes}",
        f"took          {report.duration_ms:.0f} ms",
    ]
    return "\n".join(lines)

