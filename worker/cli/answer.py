"""``mcpsync answer bind|select|check|show``: the answer freshness gate (docs/answers.md).

Contract: ``check`` persists its disposition and exits 0 on ACCEPT, 3 (``EXIT_HOLD``) on HOLD,
so a shell can gate on it; a receipt given as ``latest`` is the dependency's newest accepted
receipt in the ledger.
"""

from __future__ import annotations

import argparse
from typing import Any

from mcpsync.worker.cli.common import (
    EXIT_HOLD,
    CliError,
    ExitStatus,
    amount,
    database_url,
    print_out,
    resolve_config,
)
from mcpsync.worker.main.connect import connect_temporal, open_ledger

__all__ = ['cmd_answer', 'register']


async def _answer_env(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    from mcpsync.worker.api.answer_gate import AnswerGate

    config, _ = resolve_config(args)
    client = await connect_temporal(config.temporal)
    ledger = await open_ledger(database_url(config), max_size=2)
    return config, AnswerGate(client, config.temporal.task_queue), ledger


async def _answer_receipt(ledger: Any, subject: str, server: str, uri: str, receipt: str) -> int:
    """A receipt id, or ``latest``: the dependency's latest accepted receipt from the ledger."""
    from mcpsync.worker.api.answer_gate import latest_receipts

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

    from mcpsync.activities.ledger.answers import AnswerLedger
    from mcpsync.worker.api.answer_gate import AnswerGateError
    from mcpsync.workflows.answer_rules import AnswerBindingV1, AnswerDependency, FreshnessPolicy

    config, gate, ledger = await _answer_env(args)
    try:
        if args.answer_command == "bind":
            deps = [AnswerDependency(
                        subject=args.subject, server=server, uri=uri,
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
                print_out([h.model_dump(mode="json") for h in history], args.json,
                          "\n".join(f"#{h.sequence} {h.checked_at.isoformat()} {h.verdict.value} "
                                    f"{h.reason_code.value}" for h in history))
                return
            result = AnswerBindingV1.model_validate(loaded.model_dump())
    except AnswerGateError as exc:
        raise CliError(str(exc)) from None
    except ValidationError as exc:
        raise CliError(f"invalid answer request: {exc.errors()[0]['msg']}") from None
    finally:
        await ledger.pool.close()
    print_out(result.model_dump(mode="json"), args.json, _answer_text(result))
    if args.answer_command == "check" and result.verdict.value == "HOLD":
        raise ExitStatus(EXIT_HOLD)  # so a shell can gate on it: `mcpsync answer check ... && publish`


def register(sub: Any) -> None:
    """Add ``answer`` and its subcommands to the top-level subparsers ``sub``."""
    an = sub.add_parser("answer",
                        help="answer freshness gate: bind an answer, select inputs, HOLD/ACCEPT check")
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
