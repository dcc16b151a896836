"""``mcpsync scan``, ``catalog start`` and ``rollout``: catalog reconciliation and staged rollout.

Contract: ``scan`` prints the reconciled catalog of (subject, server); ``--require-proven`` goes
through the completeness gate (exit 3 unless SNAPSHOT_PROVEN); ``--now`` without an answer
within ``--timeout`` is exit 6. ``rollout`` without ``--mode``/``--percent`` shows the policy.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from mcpsync.activities.starters import start_catalog
from mcpsync.activities.workflow_updates import execute_update
from mcpsync.worker.cli.common import (
    CliError,
    ExitCode,
    database_url,
    print_out,
    resolve_config,
    seconds,
)
from mcpsync.worker.cli.subscription_text import dash
from mcpsync.worker.main.connect import connect_temporal, open_ledger

__all__ = ['register']


DEFAULT_ROLLOUT_PERCENT = 5.0


async def cmd_scan(args: argparse.Namespace) -> None:
    """The reconciled catalog of (subject, server); ``--require-proven`` goes through the
    completeness gate."""
    from mcpsync.activities.ledger.catalog import CatalogLedger
    from mcpsync.worker.api.completeness import (
        CompletenessRefused,
        describe_catalog,
        require_complete_catalog,
    )
    from mcpsync.workflows.names import UPDATE_RECONCILE
    from mcpsync.workflows.records.catalog import CatalogKey, CatalogSnapshot

    config, _ = resolve_config(args)
    config.server(args.server)
    if args.now:
        client = await connect_temporal(config.temporal)
        key = CatalogKey(subject=args.subject, server=args.server)
        try:
            handle = client.get_workflow_handle(key.workflow_id)
            await asyncio.wait_for(execute_update(handle, UPDATE_RECONCILE, ["requested by CLI"],
                                                  result_type=CatalogSnapshot), args.timeout)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise CliError(f"no CatalogWorkflow for {args.subject}/{args.server}: "
                               "start it with 'mcpsync catalog start'") from None
            raise
        except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
            # The SDK turns the cancellation of a pending update into its own error, not TimeoutError.
            raise CliError(f"no reconciled catalog within {args.timeout:g} s (is a worker running? see the "
                           "workflow's restarts)", ExitCode.UNAVAILABLE) from None
    ledger = await open_ledger(database_url(config), max_size=2)
    catalogs = CatalogLedger(ledger.pool)
    try:
        out = await describe_catalog(catalogs, args.subject, args.server)
        if args.require_proven:
            try:
                grant = await require_complete_catalog(catalogs, args.subject, args.server, task=args.task)
            except CompletenessRefused as exc:
                raise CliError(str(exc), ExitCode.REFUSED) from None
            out.update(uris=list(grant.uris), consumption_id=grant.consumption_id)
    finally:
        await ledger.pool.close()
    c = out["catalog"]
    text = (f"{args.subject}/{args.server}: no reconciled catalog yet" if c is None else
            f"{args.subject}/{args.server}: catalog #{c['catalog_id']} {c['status']} "
            f"({dash(c['status_reason'])})\n"
            f"  {c['resource_count']} resources, {c['template_count']} templates; "
            f"measured {c['measured_at']}; "
            f"staleness bound {c['staleness_bound_seconds']:.0f} s; next review {c['next_review_at']}\n"
            + "".join(f"  {dash(u)}\n" for u in out["uris"])
            + "".join(f"  scan {x['label']} {x['scan_id'][:8]}: {x['status']}, {x['page_count']} pages, "
                      f"list_changed {x['notifications_observed']}\n" for x in out["scans"]))
    print_out(out, args.json, text.rstrip())


async def cmd_catalog_start(args: argparse.Namespace) -> None:
    from mcpsync.workflows.records.catalog import CatalogKey, CatalogPolicy

    config, _ = resolve_config(args)
    config.server(args.server)
    client = await connect_temporal(config.temporal)
    policy = CatalogPolicy(rescan_seconds=args.rescan_seconds,
                           rescan_seconds_with_list_changed=args.rescan_seconds_with_list_changed,
                           auto_subscribe_prefixes=tuple(args.auto_subscribe or ()))
    key = CatalogKey(subject=args.subject, server=args.server)
    handle = await start_catalog(client, key, task_queue=config.temporal.task_queue, policy=policy)
    print_out({"workflow_id": handle.id, "run_id": handle.result_run_id, **key.model_dump()}, args.json,
           f"catalog reconciliation running: workflow {handle.id}")


async def cmd_rollout(args: argparse.Namespace) -> None:
    from mcpsync.activities.ledger.catalog import CatalogLedger
    from mcpsync.workflows.records.catalog import RolloutMode, RolloutPolicy

    # --percent alone means --mode percent; with another mode it would be ignored: refused.
    if args.percent is not None and args.mode not in (None, RolloutMode.PERCENT.value):
        raise CliError(f"--percent applies to --mode percent only, not --mode {args.mode}")
    if args.percent is not None and not 0 <= args.percent <= 100:
        raise CliError(f"--percent must be between 0 and 100, not {args.percent:g}")
    mode = RolloutMode(args.mode) if args.mode else RolloutMode.PERCENT
    config, _ = resolve_config(args)
    config.server(args.server)
    ledger = await open_ledger(database_url(config), max_size=2)
    try:
        catalogs = CatalogLedger(ledger.pool)
        if args.mode is None and args.percent is None:
            policy = await catalogs.rollout(args.server)
        else:
            percent = DEFAULT_ROLLOUT_PERCENT if args.percent is None else args.percent
            policy = await catalogs.set_rollout(RolloutPolicy(server=args.server, mode=mode, percent=percent))
    finally:
        await ledger.pool.close()
    print_out(policy.model_dump(mode="json"), args.json,
           f"rollout {policy.server}: {policy.mode.value}"
           + (f" {policy.percent:g}%" if policy.mode == RolloutMode.PERCENT else ""))


def register(sub: Any) -> None:
    """Add ``scan``, ``catalog start`` and ``rollout`` to the top-level subparsers ``sub``."""
    sc = sub.add_parser("scan", help="the reconciled catalog (resourceCatalog.v1, resourceDiscoveryScan.v1)")
    sc.add_argument("--server", required=True)
    sc.add_argument("--subject", default="anonymous")
    sc.add_argument("--require-proven", action="store_true",
                    help="completeness gate: fail unless the catalog is SNAPSHOT_PROVEN "
                         "(records the consumption)")
    sc.add_argument("--task", default="cli", help="completeness task name recorded with --require-proven")
    sc.add_argument("--now", action="store_true", help="reconcile first and wait for the new catalog")
    sc.add_argument("--timeout", type=seconds, default=60.0, help="seconds to wait with --now")
    sc.add_argument("--json", action="store_true")
    sc.set_defaults(func=cmd_scan)

    cat = sub.add_parser("catalog", help="catalog reconciliation workflows")
    cat_sub = cat.add_subparsers(dest="catalog_command", required=True)
    cs = cat_sub.add_parser("start", help="start (or join) the CatalogWorkflow of (subject, server)")
    cs.add_argument("--server", required=True)
    cs.add_argument("--subject", default="anonymous")
    cs.add_argument("--rescan-seconds", type=seconds, default=300.0, help="period without listChanged")
    cs.add_argument("--rescan-seconds-with-list-changed", type=seconds, default=1800.0,
                    help="safety rescan period when the server sends list_changed")
    cs.add_argument("--auto-subscribe", action="append", metavar="URI_PREFIX",
                    help="subscribe to new URIs starting with this prefix (repeatable)")
    cs.add_argument("--json", action="store_true")
    cs.set_defaults(func=cmd_catalog_start)

    ro = sub.add_parser("rollout", help="show or set the staged rollout of a server (shadow / percent / all)")
    ro.add_argument("--server", required=True)
    ro.add_argument("--mode", choices=["shadow", "percent", "all"],
                    help="set this mode (absent: show the policy)")
    ro.add_argument("--percent", type=float, default=None,
                    help=f"share of URIs refreshed with --mode percent (alone: implies --mode percent; "
                         f"{DEFAULT_ROLLOUT_PERCENT:g} when --mode percent is given without it)")
    ro.add_argument("--json", action="store_true")
    ro.set_defaults(func=cmd_rollout)
