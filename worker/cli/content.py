"""``mcpsync revoke``, ``content get`` and ``prune``: cached content, who gets it, how long it stays.

Contract:
- ``revoke`` records the revocation in the ledger (records, purge, outbox in one transaction)
  before it tells the workflows; nothing to revoke is exit 4, ``--wait`` past its bound exit 6.
- ``content get`` releases a receipt's body to the subject it was read for only: refused is
  exit 5, unknown or pruned exit 4; a terminal sees escape sequences shown, not run.
- ``prune`` forgets superseded bodies, old rows and superseded verification receipts (fences, versions
  and every receipt something points at stay).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from mcpsync.worker.cli.common import (
    CliError,
    ExitCode,
    ExitStatus,
    amount,
    count,
    database_url,
    print_out,
    print_text,
    resolve_config,
    terminal_safe,
)
from mcpsync.worker.cli.subscription_text import dash
from mcpsync.worker.main.connect import connect_temporal, open_ledger
from mcpsync.worker.main.revocation import revoke_subject

__all__ = ['register_revoke', 'register_prune', 'register_content']


async def cmd_revoke(args: argparse.Namespace) -> None:
    """The ledger revokes first (one transaction: records, purge, outbox), then the workflows are
    told; ``--wait`` waits for each of them to mirror it (exit 6 if one has not in time).

    ``--uri *`` (the default) is every subscription of the subject on the server, finished ones
    included, and the output names each. A subject (or URI) without any subscription in the ledger
    is exit 4: nothing was revoked, and a typo must not look like a done revocation. The subject
    need not be configured any more: revoking is what an operator does once it lost access."""
    config, _ = resolve_config(args)
    config.server(args.server)
    one = None if args.uri == "*" else args.uri
    ledger = await open_ledger(database_url(config), max_size=2)
    try:
        rows = [r for r in await ledger.fence.subscriptions_for(args.subject, args.server)
                if one is None or r[1] == one]
        if not rows:
            what = f"subject {args.subject!r} on server {args.server!r}" + (f" for {one}" if one else "")
            raise CliError(f"no subscription of {what}: nothing revoked "
                           f"(see 'mcpsync list --server {args.server}')", ExitCode.NOT_FOUND)
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
              "subject_revocation_id": rec.subject_revocation_id, "revoked": rec.revoked,
              "covered": rec.covered, "receipt_ids": rec.receipt_ids, "purged_bodies": rec.purged_bodies,
              "signalled": done.signalled,
              "subscriptions": [{"uri": u, "workflow_id": w, "state_before": st, "live": w in live}
                                for u, w, st in covered]}
    scope = "every URI (--uri *)" if one is None else one
    lines = [f"revoked in the ledger: {len(rec.covered)} subscription(s) of {args.subject}/{args.server}, "
             f"{scope} ({len(rec.revoked)} live), {len(rec.receipt_ids)} receipt(s) withdrawn, "
             f"{rec.purged_bodies} body(ies) purged; {len(done.signalled)} workflow(s) signalled"]
    lines += [f"  {u} (workflow {w})"
              + ("" if w in live else f": already {st}, its content refused and purged")
              for u, w, st in covered]
    if done.pending is not None:
        result |= {"mirrored": done.mirrored, "pending": done.pending}
        lines.append(f"mirrored by {len(done.mirrored or [])}, pending {len(done.pending)}")
    print_out(result, args.json, "\n".join(lines))
    if done.pending:
        raise ExitStatus(ExitCode.UNAVAILABLE)



async def cmd_content_get(args: argparse.Namespace) -> None:
    """The accepted body of a receipt, exactly as read; refusals exit 5, unknown/pruned 4."""
    from mcpsync.activities.ledger.released import ContentNotFound, ContentRefused, released_content

    config, _ = resolve_config(args)
    ledger = await open_ledger(database_url(config), max_size=2)
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
        print_text(f"receipt {content.receipt_id}: {content.size} bytes {dash(content.mime_type)} "
                   f"({content.kind.value}) {content.content_digest} -> {args.output}", file=sys.stderr)
        return
    if sys.stdout.isatty():
        if not content.is_text:
            raise CliError(f"receipt {content.receipt_id} is binary "
                           f"({dash(content.mime_type or 'no MIME type')}): "
                           "pass -o FILE or redirect stdout")
        # A terminal acts on escape sequences: show them, do not run them (a pipe or -o gets the bytes).
        sys.stdout.write(terminal_safe(content.body.decode("utf-8", errors="backslashreplace")))
        sys.stdout.flush()
        return
    sys.stdout.buffer.write(content.body)
    sys.stdout.buffer.flush()


async def cmd_prune(args: argparse.Namespace) -> None:
    from datetime import timedelta

    from mcpsync.activities.ledger.retention import prune

    if args.keep_days < 0:
        raise CliError("--keep-days must not be negative")
    if args.consumer_max_lag_days is not None and args.consumer_max_lag_days < 0:
        raise CliError("--consumer-max-lag-days must not be negative")
    config, _ = resolve_config(args)
    max_lag = args.consumer_max_lag_days
    if max_lag is None:
        max_lag = config.retention.consumer_max_lag_days if config.retention is not None else 30.0
    ledger = await open_ledger(database_url(config), max_size=2)
    try:
        report = await prune(ledger.pool, keep=timedelta(days=args.keep_days), dry_run=args.dry_run,
                             consumer_max_lag=timedelta(days=max_lag))
    finally:
        await ledger.pool.close()
    verb = "would remove" if report.dry_run else "removed"
    ignored = (f"; consumers past {max_lag:g} days lag (they will resync): "
               f"{', '.join(report.consumers_ignored)}" if report.consumers_ignored else "")
    print_out(report.model_dump(mode="json"), args.json,
           f"{verb} (older than {args.keep_days:g} days): {report.content_bodies} content bodies "
           f"({report.content_bytes} bytes), {report.audit_rows} audit rows, "
           f"{report.outbox_rows} outbox rows, "
           f"{report.read_requests} read requests, {report.discovery_scans} discovery scans, "
           f"{report.verification_receipts} verification receipts{ignored}")



def register_revoke(sub: Any) -> None:
    """Add ``revoke`` to the top-level subparsers ``sub``."""
    rv = sub.add_parser("revoke",
                        help="revoke(subject, server, uri|*): purge cached content, outbox 'revoked'")
    rv.add_argument("--server", required=True)
    rv.add_argument("--subject", required=True)
    rv.add_argument("--uri", default="*", help="one exact URI, or * for every subscription of the subject")
    rv.add_argument("--reason", default="revoked by CLI", help="recorded with the revocation")
    rv.add_argument("--wait", type=float, nargs="?", const=60.0, default=None, metavar="SECONDS",
                    help="wait until every live workflow has mirrored the revocation "
                         "(default 60 s; exit 6 if not)")
    rv.add_argument("--json", action="store_true")
    rv.set_defaults(func=cmd_revoke)


def register_prune(sub: Any) -> None:
    """Add ``prune`` to the top-level subparsers ``sub``."""
    pr = sub.add_parser("prune", help="retention: forget superseded bodies, old audit/outbox rows, judged "
                                      "reads, superseded UNCHANGED receipts (fences and versions are kept; "
                                      "see activities/ledger/retention.py)")
    pr.add_argument("--keep-days", type=amount, default=7.0, help="forget rows older than this many days")
    pr.add_argument("--consumer-max-lag-days", type=amount, default=None,
                    help="outbox consumers silent this long stop holding rows back (default: [retention] "
                         "consumer_max_lag_days, else 30)")
    pr.add_argument("--dry-run", action="store_true", help="count only")
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_prune)


def register_content(sub: Any) -> None:
    """Add ``content get`` to the top-level subparsers ``sub``."""
    ct = sub.add_parser("content", help="accepted bodies, for the subject they were read for")
    ct_sub = ct.add_subparsers(dest="content_command", required=True)
    cg = ct_sub.add_parser("get",
                           help="the body of a receipt exactly as read (exit 5 refused, 4 unknown/pruned)")
    cg.add_argument("--receipt", type=count, required=True, help="the receipt id (outboxEvent.v1 receipt_id)")
    cg.add_argument("--subject", required=True,
                    help="the subject asking: only its own receipts are released")
    cg.add_argument("-o", "--output", metavar="FILE",
                    help="write the body here (default: stdout; binary only when stdout is not a terminal)")
    cg.set_defaults(func=cmd_content_get)
