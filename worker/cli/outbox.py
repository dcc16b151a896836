"""``mcpsync outbox tail|poll|ack|resync|consumers|drop``: the invalidation outbox.

Contract: ``tail`` is for humans (newest events, or those after a position); the consumer
commands move a durable consumer's acknowledged position (an unknown name is exit 4); ``poll
--follow`` acknowledges each batch once printed and stops at a gap (positions pruned before
the consumer acknowledged them), which ``resync`` repairs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable
from typing import Any

from mcpsync.worker.cli.common import (
    CliError,
    ExitCode,
    count,
    database_url,
    non_negative,
    print_out,
    print_text,
    resolve_config,
)
from mcpsync.worker.cli.subscription_text import dash
from mcpsync.worker.main.connect import open_ledger

__all__ = ['register']


async def cmd_outbox(args: argparse.Namespace) -> None:
    """``outbox tail``: for humans. Events in position order; ``--after P`` starts after P (0: oldest)."""
    from mcpsync.activities.ledger.outbox import events_after, latest_events, listen, wait_for_events

    _positive("--limit", args.limit)
    if args.after is not None and args.after < 0:
        raise CliError("--after must not be negative")
    config, _ = resolve_config(args)
    ledger = await open_ledger(database_url(config), max_size=2)
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


def print_json_line(model: Any) -> None:
    """One model as one JSON line, every non-ASCII character escaped (``json.dumps``' default): a
    C1 control or a bidi override from upstream is never raw on a terminal."""
    print(json.dumps(model.model_dump(mode="json")), flush=True)


def _event_line(e: Any) -> str:
    withdrawn = (f" withdraws {len(e.invalidates.receipt_ids)} receipt(s) (was {e.previous_digest or '-'})"
                 if e.invalidates is not None else "")
    return (f"@{e.position} {e.created_at.isoformat()} {e.event_type.value} {e.subject}/{e.server} "
            f"{dash(e.uri)} "
            f"receipt={e.receipt_id} ordinal={e.read_ordinal} {e.content_digest or '-'}{withdrawn}")


def _emit_events(events: list[Any], as_json: bool) -> None:
    for e in events:
        if as_json:
            print_json_line(e)
        else:
            print_text(_event_line(e), flush=True)


async def _with_consumer(args: argparse.Namespace, body: Callable[[Any], Awaitable[None]]) -> None:
    from mcpsync.activities.ledger.outbox import ConsumerError, ConsumerNotFound, OutboxConsumer

    config, _ = resolve_config(args)
    ledger = await open_ledger(database_url(config), max_size=2)
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
        print_json_line(batch)
        return
    if batch.gap is not None:
        print_text(f"GAP: positions {batch.gap.first}..{batch.gap.last} were pruned before consumer "
              f"{batch.consumer!r} acknowledged them; run: mcpsync outbox resync --consumer {batch.consumer}",
              flush=True)
        return
    for e in batch.events:
        print_text(_event_line(e), flush=True)
    then = ("acked by --follow once printed" if following else
            f"ack: mcpsync outbox ack --consumer {batch.consumer} --position {batch.position}")
    print_text(f"position {batch.position} ({len(batch.events)} events after {batch.acked}; {then})",
               flush=True)


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
        print_out({"consumer": consumer.name, "position": position}, args.json,
               f"consumer {consumer.name!r} acknowledged up to {position}")

    await _with_consumer(args, body)


async def cmd_outbox_resync(args: argparse.Namespace) -> None:
    async def body(consumer: Any) -> None:
        batch = await consumer.resync()
        if args.json:
            print_json_line(batch)
            return
        for e in batch.events:
            print_text(_event_line(e), flush=True)
        print_text(f"position {batch.position} ({len(batch.events)} current versions; anything else is not "
              f"current; ack: mcpsync outbox ack --consumer {batch.consumer} --position {batch.position})",
              flush=True)

    await _with_consumer(args, body)


async def cmd_outbox_consumers(args: argparse.Namespace) -> None:
    from mcpsync.activities.ledger.outbox import consumer_infos

    config, _ = resolve_config(args)
    ledger = await open_ledger(database_url(config), max_size=2)
    try:
        infos = await consumer_infos(ledger.pool)
    finally:
        await ledger.pool.close()
    if args.json:
        print(json.dumps([i.model_dump(mode="json") for i in infos]))
        return
    for i in infos:
        print_text(f"{i.name} subjects={','.join(i.subjects) if i.subjects else '*'} position={i.position} "
              f"delivered={i.delivered_up_to} lag={i.lag_events} events/{i.lag_seconds:.1f}s "
              f"last_ack={i.last_ack_at.isoformat() if i.last_ack_at else '-'}")
    if not infos:
        print_text("no outbox consumers")


async def cmd_outbox_drop(args: argparse.Namespace) -> None:
    from mcpsync.activities.ledger.outbox import ConsumerNotFound, drop_consumer

    config, _ = resolve_config(args)
    ledger = await open_ledger(database_url(config), max_size=2)
    try:
        await drop_consumer(ledger.pool, args.consumer)
    except ConsumerNotFound as exc:
        raise CliError(str(exc), ExitCode.NOT_FOUND) from None
    finally:
        await ledger.pool.close()
    print_out({"dropped": args.consumer}, args.json, f"consumer {args.consumer!r} dropped")



def register(sub: Any) -> None:
    """Add ``outbox`` and its subcommands to the top-level subparsers ``sub``."""
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

    poll = consumer_cmd("poll", "the next batch after the consumer's acknowledged position (--register: a "
                                "new name); --follow waits for more and acks each batch once printed",
                        cmd_outbox_poll)
    poll.add_argument("--register", action="store_true",
                      help="register the name if it is new (consumers are capped: "
                           "activities/ledger/outbox.py "
                           "MAX_CONSUMERS); without it a new name exits 4")
    poll.add_argument("--subject", action="append",
                      help="register the consumer for these subjects only (repeatable)")
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
