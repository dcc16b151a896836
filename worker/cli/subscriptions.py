"""``mcpsync`` subscription commands: subscribe, status, list, get, describe, history, resume, close.

Contract:
- ``list`` reads the ledger's ``subscriptions`` table (the source of truth for what exists),
  filtered by ``--server``/``--subject``/``--state``; ``get`` is one key's row and, in
  ``-o wide``, the workflow's freshness; ``describe`` shows the workflow's
  ``resourceSubscription.v1`` record, its freshness, recent receipts and audit rows;
  ``history`` the receipts and audit rows oldest first. ``-o json`` (or ``--json``) prints one
  JSON document; with ``--watch`` one document per change, as JSON lines.
- ``--watch`` re-reads every ``--interval`` seconds and prints only when the output changed.
  It polls rather than LISTEN/NOTIFY: a notify trigger on the fence row would sit on the
  accept hot path and serialize commits on PostgreSQL's notify queue lock.
- Freshness shown for a subscription: last accepted at, last verified at (newest read that saw
  content), next read due (poll or safety read) and the published staleness bound; ``-`` for
  a value the record does not have.
- ``close`` is idempotent: a subscription already closed (or otherwise ended) answers its
  close receipt from the ledger with exit 0. ``resume`` clears RECONCILIATION_REQUIRED.
- A subscription that does not exist is exit 4; a workflow query or update without an answer
  within ``--timeout`` (no worker) is exit 6; a subject the server does not list is exit 2 for
  every command naming one subscription (a configuration error, whatever the ledger holds).
  ``resume`` of a subscription in any state but RECONCILIATION_REQUIRED, an ended one included,
  is exit 2.
- Every command reaches a subscription's workflow under the id its ledger row recorded
  (``FenceLedger.workflow_id_of``): one started under an older id scheme is found all the same. Only
  a CLI configured without a database computes the id (``SubscriptionKey.workflow_id``).
- ``subscribe`` takes one URI or many (``--uri A B`` or ``--uri A --uri B``): one output line per
  URI, in order. With several, a URI that fails (an unusable URI, Temporal unavailable) is one
  ``mcpsync: error: <uri>: ...`` line on stderr and the others are still subscribed; the exit
  code is then the first failure's (2 unusable URI, 6 unavailable), 0 when all succeeded. A
  wrong ``--server``/``--subject`` fails the whole command before any URI (exit 2).
- ``subscribe`` of a URI that the view's latest reconciled catalog does not list still starts it
  (exit 0) and prints one ``mcpsync: warning:`` line on stderr for it.
- ``subscribe --wait`` starts each URI with Update-with-Start (``start_subscription_first_read``)
  and prints, one line per URI, the first read's verdict, receipt and digest, or the state in
  which no read comes (TOMBSTONE_PENDING, RECONCILIATION_REQUIRED, ended). The URIs wait
  concurrently, each bounded by ``--timeout``: a URI without an answer by then is exit 6 (its
  subscription keeps running). Exit 0 whatever the verdict: it is printed, not judged here.
- ``subscribe --wait`` and ``close`` say what they wait for, once, when stderr is a terminal
  (``bulk.waiting``); on a pipe they print nothing more.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from temporalio.client import (
    Client,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.proven import proven_of
from mcpsync.activities.ledger.subscription_views import list_subscriptions, subscription_history
from mcpsync.activities.starters import start_subscription, start_subscription_first_read
from mcpsync.activities.workflow_updates import execute_update
from mcpsync.worker.cli.common import (
    CliError,
    ExitCode,
    ExitStatus,
    check_target,
    count,
    database_url,
    key_for,
    print_error,
    print_out,
    print_text,
    resolve_config,
    seconds,
    shorten,
    subscription_key,
)
from mcpsync.worker.cli.subscription_text import (
    age_of,
    dash,
    first_read_text,
    history_line,
    record_doc,
    status_text,
    status_view,
    subscription_table,
    when,
)
from mcpsync.worker.main.bulk import settle_all, waiting
from mcpsync.worker.main.config import Config
from mcpsync.worker.main.connect import connect_temporal, open_ledger
from mcpsync.workflows.names import QUERY_SUBSCRIPTION, UPDATE_CLOSE, UPDATE_RESUME
from mcpsync.workflows.records.subscription import (
    CloseReceipt,
    CloseRequest,
    ResumeRequest,
    SubscriptionKey,
    SubscriptionState,
)
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1

__all__ = ["register"]

T = TypeVar("T")

SUBSCRIBE_STARTS_IN_FLIGHT = 32  # several URIs without --wait: workflow starts in flight together

ENDED_STATES = (SubscriptionState.CLOSED, SubscriptionState.UNSUBSCRIBE_UNKNOWN, SubscriptionState.TOMBSTONED,
                SubscriptionState.REVOKED)


# --- shared plumbing ---------------------------------------------------------------------


async def _open_ledger(config: Config) -> Ledger | None:
    """The ledger when a database is configured; None for a CLI configured with Temporal only."""
    return await open_ledger(config.database.url, max_size=1) if config.database.url else None


async def _workflow_id_in(ledger: Ledger | None, key: SubscriptionKey) -> str:
    """The id ``key``'s subscription runs under: the ledger's record (``FenceLedger.workflow_id_of``).
    Without a database configured it can only be computed: right for what this version started."""
    return key.workflow_id if ledger is None else await ledger.fence.workflow_id_of(key)


async def _workflow_id(config: Config, key: SubscriptionKey) -> str:
    """``_workflow_id_in`` the configured ledger, opened for this one lookup."""
    ledger = await _open_ledger(config)
    try:
        return await _workflow_id_in(ledger, key)
    finally:
        if ledger is not None:
            await ledger.pool.close()


def _row_workflow_id(rows: Sequence[dict[str, Any]], key: SubscriptionKey) -> str:
    """The workflow id in ``key``'s ledger row (``list_subscriptions``), computed only without one."""
    return str(rows[0]["workflow_id"]) if rows else key.workflow_id


async def _query_record(client: Client, workflow_id: str, timeout: float) -> ResourceSubscriptionV1 | None:
    """The workflow's record, or None when no workflow has that id.

    A query is answered by a worker: without one the server holds it until its own deadline, so
    the wait is bounded here and reported as unavailable (exit 6)."""
    try:
        return await asyncio.wait_for(client.get_workflow_handle(workflow_id).query(
            QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1, rpc_timeout=timedelta(seconds=timeout)),
            timeout + 1.0)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        if err.status not in (RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED):
            raise
    except TimeoutError:
        pass
    except WorkflowQueryFailedError as err:
        raise CliError(f"query '{QUERY_SUBSCRIPTION}' failed in workflow {workflow_id}: {err}",
                       ExitCode.UNAVAILABLE) from None
    raise CliError(f"no answer to query '{QUERY_SUBSCRIPTION}' from workflow {workflow_id} within "
                   f"{timeout:g} s (is a worker running on its task queue?)", ExitCode.UNAVAILABLE)


def _not_found(key: SubscriptionKey) -> CliError:
    return CliError(f"no subscription for {key.subject}/{key.server} {key.uri} (see 'mcpsync list')",
                    ExitCode.NOT_FOUND)


async def _update(client: Client, workflow_id: str, name: str, arg: Any, result_type: type[T],
                  timeout: float) -> T | None:
    """Execute a workflow update (``execute_update``: resent under its id while the server answers
    that it was not applied); None when no workflow runs under ``workflow_id``."""
    try:
        return await asyncio.wait_for(execute_update(client.get_workflow_handle(workflow_id), name, [arg],
                                                     result_type=result_type), timeout)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
        raise CliError(f"no answer to '{name}' from workflow {workflow_id} within {timeout:g} s "
                       "(is a worker running on its task queue?)", ExitCode.UNAVAILABLE) from None


def _cause(err: WorkflowUpdateFailedError) -> str:
    """The validator's or handler's message, without the exception type the SDK prefixes."""
    return str(getattr(err.cause, "message", None) or err.cause)


def _output(args: argparse.Namespace) -> str:
    return "json" if getattr(args, "json", False) else getattr(args, "output", "text")


async def _watch(args: argparse.Namespace, render: Callable[[], Awaitable[tuple[Any, str]]]) -> None:
    """Print once; with ``--watch`` again whenever the output changes, until interrupted."""
    as_json = _output(args) == "json"
    last = None
    while True:
        doc, text = await render()
        # Change is judged on the data, not the text: relative ages ("4s ago") change every poll.
        current = json.dumps(doc, default=str, sort_keys=True)
        if current != last:
            if not args.watch:
                print_out(doc, as_json, text)
                return
            if as_json:
                print(current, flush=True)
            else:
                print_text(f"{'' if last is None else chr(10)}# {time.strftime('%H:%M:%S')}\n{text}",
                           flush=True)
            last = current
        await asyncio.sleep(args.interval)


# --- commands ----------------------------------------------------------------------------


async def _warn_unlisted(ledger: Ledger, key: SubscriptionKey) -> None:
    """A URI the view's latest reconciled catalog does not list: one warning line on stderr (the
    subscription is started all the same: the catalog may predate the resource). Without a catalog
    nothing is known, and nothing is said; ``subscribe --wait`` shows what the first read found."""
    from mcpsync.activities.ledger.catalog import CatalogLedger

    catalogs = CatalogLedger(ledger.pool)
    catalog = await catalogs.latest_catalog(key.subject, key.server)
    if catalog is None or key.uri in await catalogs.known_uris(key.subject, key.server):
        return
    print_text(f"mcpsync: warning: {key.uri} is not listed by {key.server} for {key.subject} (catalog "
          f"#{catalog.catalog_id}, measured {when(catalog.measured_at, datetime.now(UTC))}): if it does not "
          "exist, the subscription goes TOMBSTONE_PENDING ('mcpsync status'; 'subscribe --wait' shows the "
          "first read)",
          file=sys.stderr, flush=True)


async def cmd_subscribe(args: argparse.Namespace) -> None:
    config, _ = resolve_config(args)
    check_target(args, config, configured_subject=True)
    uris: list[str] = args.uri
    # Every URI is checked before anything is contacted: an unusable one needs no Temporal.
    keys: list[SubscriptionKey | CliError] = []
    for uri in uris:
        try:
            keys.append(key_for(args, uri))
        except CliError as exc:
            if len(uris) == 1:
                raise
            keys.append(exc)
    usable = any(isinstance(k, SubscriptionKey) for k in keys)
    client = await connect_temporal(config.temporal) if usable else None
    ledger = await _open_ledger(config) if usable else None
    failures: list[ExitCode] = []

    def failed(uri: str, message: str, code: ExitCode) -> None:
        failures.append(code)
        print_error(f"{uri}: {message}")

    async def subscribe(key: SubscriptionKey) -> tuple[dict[str, Any], str]:
        assert client is not None
        # An existing subscription (whatever id scheme started it) is joined or reopened under its id.
        workflow_id = await _workflow_id_in(ledger, key)
        if not args.wait:
            handle = await start_subscription(client, key, task_queue=config.temporal.task_queue,
                                              workflow_id=workflow_id)
            doc = {"workflow_id": handle.id, "run_id": handle.result_run_id, **key.model_dump()}
            return doc, f"subscribed: workflow {handle.id}" + (f" for {key.uri}" if len(uris) > 1 else "")
        try:
            handle, record = await asyncio.wait_for(start_subscription_first_read(
                client, key, task_queue=config.temporal.task_queue, workflow_id=workflow_id), args.timeout)
        # WorkflowUpdateRPCTimeoutOrCancelledError: the SDK's word for a cancelled wait.
        except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
            raise CliError(f"no first read judged within {args.timeout:g} s in workflow {workflow_id} "
                           "(no live session or no worker? see 'mcpsync status')",
                           ExitCode.UNAVAILABLE) from None
        except WorkflowUpdateFailedError as err:
            raise CliError(f"first_read failed in workflow {workflow_id}: {_cause(err)}",
                           ExitCode.UNAVAILABLE) from None
        return {"workflow_id": handle.id, **record_doc(record)}, first_read_text(record)

    async def settle(key: SubscriptionKey) -> tuple[dict[str, Any], str] | RPCError | CliError:
        try:
            return await subscribe(key)
        except (RPCError, CliError) as exc:
            return exc

    # --wait: every URI's first read at once (each bounded by --timeout); several URIs without it:
    # SUBSCRIBE_STARTS_IN_FLIGHT starts at a time, with a progress bar on a terminal. Printed in order.
    together = args.wait or len(uris) > 1
    usable_keys = [k for k in keys if isinstance(k, SubscriptionKey)]
    with (waiting(f"the first read of {len(usable_keys)} URI(s)", args.timeout)
          if args.wait and usable_keys else nullcontext()):
        waited = iter(await settle_all(usable_keys, settle, limit=len(usable_keys) if args.wait
                                       else SUBSCRIBE_STARTS_IN_FLIGHT, progress=len(uris) > 1,
                                       label="subscribe")
                      if together else [])
    try:
        for uri, key in zip(uris, keys, strict=True):
            if isinstance(key, CliError):
                failed(uri, str(key), key.code)
                continue
            outcome = next(waited) if together else await settle(key)
            if isinstance(outcome, RPCError):
                if len(uris) == 1 or outcome.status not in (RPCStatusCode.UNAVAILABLE,
                                                            RPCStatusCode.DEADLINE_EXCEEDED):
                    raise outcome
                failed(uri, f"Temporal did not answer ({outcome.status.name}: {shorten(outcome.message)})",
                       ExitCode.UNAVAILABLE)
                continue
            if isinstance(outcome, CliError):
                if len(uris) == 1:
                    raise outcome
                failed(uri, str(outcome), outcome.code)
                continue
            doc, text = outcome
            if len(uris) == 1:
                print_out(doc, args.json, text)
            else:  # one line per URI
                if args.json:
                    print(json.dumps(doc, default=str), flush=True)
                else:
                    print_text(text, flush=True)
            if not args.wait and ledger is not None:
                await _warn_unlisted(ledger, key)
    finally:
        if ledger is not None:
            await ledger.pool.close()
    if failures:
        raise ExitStatus(failures[0])


async def cmd_status(args: argparse.Namespace) -> None:
    config, _ = resolve_config(args)
    key = subscription_key(args, config, configured_subject=True)
    client = await connect_temporal(config.temporal)
    ledger = await _open_ledger(config)
    try:
        record = await _query_record(client, await _workflow_id_in(ledger, key), args.timeout)
        if record is None:
            raise _not_found(key)
        # The ledger is the truth of freshness: the same reader as serve and list/get/describe.
        proven = await proven_of(ledger.pool, key.subject, key.server, key.uri) if ledger else None
    finally:
        if ledger is not None:
            await ledger.pool.close()
    doc, text = status_view(record, proven, datetime.now(UTC))
    print_out(doc, args.json, text)


async def cmd_close(args: argparse.Namespace) -> None:
    config, _ = resolve_config(args)
    key = subscription_key(args, config, configured_subject=True)
    client = await connect_temporal(config.temporal)
    workflow_id = await _workflow_id(config, key)
    try:
        with waiting("the close receipt", args.timeout):
            receipt = await _update(client, workflow_id, UPDATE_CLOSE, CloseRequest(reason=args.reason),
                                    CloseReceipt, args.timeout)
    except WorkflowUpdateFailedError as err:
        raise CliError(f"close refused: {_cause(err)}") from None
    already = ""
    if receipt is None:
        # No running workflow: an ended subscription answers the receipt its close froze in the ledger.
        ledger = await open_ledger(database_url(config), max_size=1)
        try:
            fence = await ledger.fence.find_subscription(key.subject, key.server, key.uri)
        finally:
            await ledger.pool.close()
        if fence is None or fence.state is None:
            raise _not_found(key)
        if fence.state not in ENDED_STATES:
            raise CliError(f"subscription {key.subject}/{key.server} {key.uri} is {fence.state.value} in "
                           "the ledger but no workflow runs for it: start it again with 'mcpsync subscribe', "
                           "then close", ExitCode.NOT_FOUND)
        receipt = CloseReceipt(state=fence.state, close_epoch=fence.close_epoch,
                               close_ordinal=fence.close_ordinal if fence.close_ordinal is not None
                               else fence.last_issued_ordinal,
                               last_accepted_ordinal=fence.last_accepted_ordinal)
        already = " (already ended)"
    print_out(receipt.model_dump(mode="json"), args.json,
              f"{receipt.state.value}{already}: close epoch {receipt.close_epoch}, close ordinal "
              f"{receipt.close_ordinal}, last accepted ordinal {receipt.last_accepted_ordinal}")


async def cmd_resume(args: argparse.Namespace) -> None:
    config, _ = resolve_config(args)
    key = subscription_key(args, config, configured_subject=True)
    client = await connect_temporal(config.temporal)
    workflow_id = await _workflow_id(config, key)
    try:
        record = await _update(client, workflow_id, UPDATE_RESUME, ResumeRequest(reason=args.reason),
                               ResourceSubscriptionV1, args.timeout)
    except WorkflowUpdateFailedError as err:
        raise CliError(f"resume refused: {_cause(err)}") from None  # e.g. nothing to resume: ACTIVE
    if record is None:
        # No running workflow: an ended subscription is there all the same (``list`` shows it).
        ledger = await _open_ledger(config)
        try:
            fence = await ledger.fence.find_subscription(key.subject, key.server, key.uri) if ledger else None
        finally:
            if ledger is not None:
                await ledger.pool.close()
        if fence is not None and fence.state is not None:
            raise CliError(f"resume refused: subscription {key.subject}/{key.server} {key.uri} is "
                           f"{fence.state.value}, not RECONCILIATION_REQUIRED (an ended subscription is not "
                           "resumed: 'mcpsync subscribe' starts it again)")
        raise _not_found(key)
    print_out(record.model_dump(mode="json"), args.json,
              f"resumed: {record.state.value} (watermark {record.watermark}, last receipt "
              f"{dash(record.last_receipt_id)})")


async def _with_ledger(config: Config, body: Callable[[Any], Awaitable[None]]) -> None:
    ledger = await open_ledger(database_url(config), max_size=2)
    try:
        await body(ledger.pool)
    finally:
        await ledger.pool.close()


async def cmd_list(args: argparse.Namespace) -> None:
    # Selectors only filter: a server no longer configured still lists the subscriptions it left; a
    # server neither configured nor named by any subscription is unknown (exit 2), as for 'status'.
    config, _ = resolve_config(args)
    states = [s.upper() for s in args.state or ()]
    for s in states:
        if s not in SubscriptionState.__members__:
            raise CliError(f"--state {s}: not a state (one of {', '.join(SubscriptionState.__members__)})")

    wide = _output(args) == "wide"
    client = await connect_temporal(config.temporal) if wide else None

    async def body(pool: Any) -> None:
        async def render() -> tuple[Any, str]:
            rows = await list_subscriptions(pool, server=args.server, subject=args.subject, states=states)
            if (not rows and args.server is not None and args.server not in {s.name for s in config.servers}
                    and not await list_subscriptions(pool, server=args.server)):
                config.server(args.server)  # a typo, not an empty result: unknown server, exit 2
            records = await _live_records(client, rows) if client is not None else None
            text = (subscription_table(rows, wide=wide, now=datetime.now(UTC), records=records)
                    if rows else "no subscriptions")
            return rows, text

        await _watch(args, render)

    await _with_ledger(config, body)


async def _live_records(client: Client, rows: Sequence[dict[str, Any]], *, timeout: float = 5.0,
                        concurrency: int = 16) -> dict[str, ResourceSubscriptionV1]:
    """``list -o wide``'s freshness: the record of every row's workflow that has not ended (an ended
    one publishes none), queried concurrently; a row whose workflow does not answer in ``timeout``
    keeps ``-`` (the table is the ledger's; the freshness columns are best effort)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(workflow_id: str) -> tuple[str, ResourceSubscriptionV1 | None]:
        async with gate:
            try:
                return workflow_id, await _query_record(client, workflow_id, timeout)
            except (CliError, RPCError):
                return workflow_id, None

    ended = {s.value for s in ENDED_STATES}
    live = [r["workflow_id"] for r in rows if r["state"] not in ended][:WIDE_QUERY_LIMIT]
    return {wid: rec for wid, rec in await asyncio.gather(*(one(w) for w in live)) if rec is not None}


WIDE_QUERY_LIMIT = 500
"""``list -o wide`` queries at most this many workflows (one query each); narrow the list with
``--server``/``--subject``/``--state`` to see the freshness of the rest (their columns say ``-``)."""


async def cmd_get(args: argparse.Namespace) -> None:
    config, _ = resolve_config(args)
    key = subscription_key(args, config, configured_subject=True)
    wide = _output(args) == "wide"
    client = await connect_temporal(config.temporal) if wide or _output(args) == "json" else None

    async def body(pool: Any) -> None:
        async def render() -> tuple[Any, str]:
            rows = await list_subscriptions(pool, server=key.server, subject=key.subject, uri=key.uri)
            record = (await _query_record(client, _row_workflow_id(rows, key), args.timeout)
                      if client is not None else None)
            if not rows:
                raise _not_found(key)
            records = {rows[0]["workflow_id"]: record} if record is not None else None
            doc = {**rows[0], "record": record_doc(record) if record else None}
            return doc, subscription_table(rows, wide=wide, now=datetime.now(UTC), records=records)

        await _watch(args, render)

    await _with_ledger(config, body)


async def cmd_describe(args: argparse.Namespace) -> None:
    config, _ = resolve_config(args)
    key = subscription_key(args, config, configured_subject=True)
    client = await connect_temporal(config.temporal)

    async def body(pool: Any) -> None:
        rows = await list_subscriptions(pool, server=key.server, subject=key.subject, uri=key.uri)
        workflow_id = _row_workflow_id(rows, key)
        record = await _query_record(client, workflow_id, args.timeout)
        if not rows and record is None:
            raise _not_found(key)
        events = await subscription_history(pool, workflow_id=workflow_id, subject=key.subject,
                                            server=key.server, uri=key.uri, limit=args.limit)
        receipts = [e for e in events if e["kind"] == "receipt"]
        audits = [e for e in events if e["kind"] == "audit"]
        doc = {"subscription": rows[0] if rows else None, "record": record_doc(record) if record else None,
               "receipts": receipts, "audit": audits}
        now = datetime.now(UTC)
        ledger_state = rows[0]["state"] if rows else "-"
        if record is not None and record.last_accepted_at is None and rows and rows[0]["last_accepted_at"]:
            # The ledger made the current version current: its receipt time is the acceptance time.
            accepted_at = datetime.fromisoformat(rows[0]["last_accepted_at"])
            record = record.model_copy(update={"last_accepted_at": accepted_at})
        lines = [f"{'workflow':>26}: {workflow_id}",
                 f"{'ledger state':>26}: {ledger_state}"
                 + (f" (updated {age_of(rows[0]['updated_at'], now)})" if rows else "")]
        lines.append(status_text(record, now) if record is not None
                     else f"{'record':>26}: - (no workflow for this key)")
        lines.append(f"receipts (newest {args.limit}):")
        lines += [f"  {history_line(e)}" for e in receipts] or ["  -"]
        lines.append(f"audit (newest {args.limit}):")
        lines += [f"  {history_line(e)}" for e in audits] or ["  -"]
        print_out(doc, _output(args) == "json", "\n".join(lines))

    await _with_ledger(config, body)


async def cmd_history(args: argparse.Namespace) -> None:
    config, _ = resolve_config(args)
    key = subscription_key(args, config, configured_subject=True)

    async def body(pool: Any) -> None:
        rows = await list_subscriptions(pool, server=key.server, subject=key.subject, uri=key.uri)
        if not rows:
            raise _not_found(key)
        events = await subscription_history(pool, workflow_id=_row_workflow_id(rows, key),
                                            subject=key.subject, server=key.server, uri=key.uri,
                                            limit=args.limit)
        print_out(events, args.json,
                  "\n".join(history_line(e) for e in events) or "no receipts or audit rows")

    await _with_ledger(config, body)


# --- parser ------------------------------------------------------------------------------


def register(sub: Any) -> None:
    """Add the subscription commands to the top-level subparsers ``sub``."""

    def keyed(name: str, help_: str, func: Callable[[argparse.Namespace], Awaitable[None]], *,
              epilog: str, many: bool = False) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=help_, description=help_, epilog=epilog)
        c.add_argument("--server", required=True, help="configured server name")
        if many:
            c.add_argument("--uri", required=True, nargs="+", action="extend", metavar="URI",
                           help="the resource URI, exactly as listed (several: --uri A B, or --uri repeated)")
        else:
            c.add_argument("--uri", required=True, help="the resource URI, exactly as listed")
        c.add_argument("--subject", default="anonymous",
                       help="the subject (identity) the subscription reads as")
        c.set_defaults(func=func)
        return c

    def query_timeout(c: argparse.ArgumentParser) -> None:
        c.add_argument("--timeout", type=seconds, default=10.0, metavar="SECONDS",
                       help="wait this long for the workflow to answer its query (a worker answers it)")

    def json_flag(c: argparse.ArgumentParser) -> None:
        c.add_argument("--json", action="store_true", help="print one JSON document")

    def output_flags(c: argparse.ArgumentParser, *, watch: bool) -> None:
        c.add_argument("-o", "--output", choices=["text", "wide", "json"], default="text",
                       help="output format (wide: more columns; json: one JSON document)")
        c.add_argument("--json", action="store_true", help="same as -o json")
        if watch:
            c.add_argument("-w", "--watch", action="store_true",
                           help="keep running; print again whenever the output changes (polls the ledger)")
            c.add_argument("--interval", type=seconds, default=2.0, metavar="SECONDS",
                           help="poll interval of --watch")

    s = keyed("subscribe", "start (or join) the subscription workflow of one or more URIs", cmd_subscribe,
              many=True,
              epilog="examples:\n  mcpsync subscribe --server demo --uri demo://policy/escalation\n"
                     "  mcpsync subscribe --server demo --uri demo://a demo://b --uri demo://c\n"
                     "  mcpsync subscribe --server demo --uri demo://a demo://b --wait --timeout 30\n"
                     "one line per URI; exit 0 if all were subscribed (--wait: whatever the verdict), "
                     "else the\n"
                     "first failure's code (2 unusable URI, 6 Temporal unavailable or --wait timed out), "
                     "each\n"
                     "failure one 'mcpsync: error:' line")
    s.add_argument("--json", action="store_true",
                   help="print JSON: one document; with several URIs one JSON object a line, one a URI")
    s.add_argument("--wait", action="store_true",
                   help="start with Update-with-Start and wait for each URI's first read: print its "
                        "verdict, receipt and digest (or the state in which no read comes, e.g. "
                        "TOMBSTONE_PENDING)")
    s.add_argument("--timeout", type=seconds, default=60.0, metavar="SECONDS",
                   help="with --wait: give up on a URI after this long "
                        "(exit 6; the subscription keeps running)")
    s = keyed("status", "print the workflow's resourceSubscription.v1 record, with its freshness", cmd_status,
              epilog="example: mcpsync status --server demo --uri demo://policy/escalation --json")
    query_timeout(s)
    json_flag(s)
    c = keyed("close", "close a subscription (Temporal update; idempotent: an ended one answers its receipt)",
              cmd_close, epilog="example: mcpsync close --server demo --uri demo://policy/escalation")
    c.add_argument("--reason", default="requested by CLI", help="recorded with the close")
    c.add_argument("--timeout", type=seconds, default=60.0, metavar="SECONDS",
                   help="wait this long for the receipt")
    json_flag(c)
    r = keyed("resume", "clear RECONCILIATION_REQUIRED (Temporal update 'resume') and accept reads again",
              cmd_resume, epilog="example: mcpsync resume --server demo --uri demo://policy/escalation "
                                 "--reason 'identity conflict checked'")
    r.add_argument("--reason", default="resolved by CLI", help="recorded with the resume")
    r.add_argument("--timeout", type=seconds, default=30.0, metavar="SECONDS",
                   help="wait this long for the answer")
    json_flag(r)

    ls = sub.add_parser("list", help="list subscriptions from the ledger (kubectl-style table)",
                        description="List subscriptions from the ledger's subscriptions table.",
                        epilog="examples:\n  mcpsync list\n"
                               "  mcpsync list --server demo --state ACTIVE -o wide\n"
                               "  mcpsync list --state RECONCILIATION_REQUIRED --watch\n"
                               "  mcpsync list -o json | jq -r '.[].uri'")
    ls.add_argument("--server", help="only this server")
    ls.add_argument("--subject", help="only this subject")
    ls.add_argument("--state", action="append", metavar="STATE",
                    help="only subscriptions in this state (repeatable: any of them)")
    output_flags(ls, watch=True)
    ls.set_defaults(func=cmd_list)

    g = keyed("get", "one subscription's ledger row (-o wide adds the workflow's freshness)", cmd_get,
              epilog="example: mcpsync get --server demo --uri demo://policy/escalation -o wide --watch")
    output_flags(g, watch=True)
    query_timeout(g)
    d = keyed("describe", "record, freshness, recent receipts and audit rows of one subscription",
              cmd_describe,
              epilog="example: mcpsync describe --server demo --uri demo://policy/escalation --limit 5")
    d.add_argument("--limit", type=count, default=10, help="newest receipts and audit rows shown")
    output_flags(d, watch=False)
    query_timeout(d)
    h = keyed("history", "one subscription's receipts and audit rows, oldest first", cmd_history,
              epilog="example: mcpsync history --server demo --uri demo://policy/escalation --limit 50")
    h.add_argument("--limit", type=count, default=20, help="newest receipts and newest audit rows shown")
    json_flag(h)
