"""What every ``mcpsync`` command shares: exit codes, the one-line error, finding the stack.

Contract:
- ``CliError(message, ExitCode.X)`` is an expected failure: ``mcpsync.worker.cli.root.main`` prints it as
  one ``mcpsync: error: ...`` line and exits with the code. ``ExitStatus`` carries a verdict
  exit code after the command printed its result.
- ``resolve_config(args)`` finds the configuration: ``--config``, else ``$MCPSYNC_CONFIG``,
  else ``<state dir>/runtime.json`` written by a running ``mcpsync up``. No runtime file (and no
  configuration) is "nothing is running here", exit 6; a runtime file whose ``mcpsync up``
  process no longer runs is stale: refused (exit 6) rather than trusted, so a command never talks
  to a half-dead stack. A configuration file that is wrong is exit 2. It records in ``args.address_sources``
  where the
  Temporal address and the database URL came from, so every connection error names it.
- ``subscription_key`` validates (server, subject, uri) against the configuration: an
  unknown server is a usage error; with ``configured_subject`` so is a subject the server
  does not list (it would never get a session, so the subscription would never start).
  ``check_target`` and ``key_for`` are its two halves, for commands taking many URIs.
- ``print_error`` is the one place the ``mcpsync: error:`` line is written.
- Flag values are checked when the command line is parsed, before anything is contacted:
  ``count`` (an integer of at least 1: a limit, a batch size, a receipt id), ``non_negative``
  (an integer of at least 0), integers at most ``INT64_MAX`` (the ledger's bigint), ``port`` (0 to
  65535), ``seconds`` (a timeout or interval: more than 0), ``amount`` (at least 0:
  a
  period where 0 means "none", days to keep). A bad value is one ``mcpsync: error:`` line naming
  the flag, exit 2 (``OneLineParser``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, NoReturn, TextIO

from pydantic import ValidationError

from mcpsync.worker.main.config import Config, load_config
from mcpsync.worker.stack.running import RunningStack
from mcpsync.workflows.records.subscription import SubscriptionKey

__all__ = ["AddressSources", "CliError", "ExitCode", "ExitStatus", "EXIT_HOLD", "OneLineParser", "amount",
           "check_listen", "check_target", "count", "database_url", "key_for", "non_negative", "port",
           "print_error",
           "print_out", "resolve_config", "runtime_file", "seconds", "shorten", "subscription_key",
           "terminal_safe", "print_text"]


class ExitCode(IntEnum):
    """The CLI's documented exit codes (docs/cli.md, "Exit codes")."""

    OK = 0
    USAGE = 2  # usage or configuration error, unusable input, a stack already running on the state dir
    REFUSED = 3  # refused by a gate: answer HOLD, scan --require-proven
    NOT_FOUND = 4  # no such subscription, receipt or consumer
    ACCESS_DENIED = 5  # content refused: other subject, revoked, not released by the guardrail
    UNAVAILABLE = 6  # Temporal or PostgreSQL unreachable, a stale runtime file, or a wait timed out


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


@dataclass(frozen=True)
class AddressSources:
    """Where the addresses a command connects to came from, for its connection errors."""

    temporal: str
    database: str


def runtime_file() -> Path:
    from mcpsync.worker.stack.common import state_dir

    return state_dir() / "runtime.json"


def _raw_setting(path: str, table: str, name: str) -> bool:
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False
    section = raw.get(table)
    return isinstance(section, dict) and name in section


def resolve_config(args: argparse.Namespace) -> tuple[Config, RunningStack | None]:
    """The command's configuration (see the module contract); sets ``args.address_sources``."""
    path: str | None = args.config or os.environ.get("MCPSYNC_CONFIG")
    origin = f"--config {args.config}" if args.config else f"MCPSYNC_CONFIG={path}" if path else ""
    runtime_path = runtime_file()
    runtime = None
    if path is None:
        if not runtime_path.exists():
            # No stack, no configuration: the command has nothing to talk to (unavailable, not a usage error).
            raise CliError(f"nothing is running here: no runtime file {runtime_path} (start the stack with "
                           "'mcpsync up', or pass --config FILE / set MCPSYNC_CONFIG)", ExitCode.UNAVAILABLE)
        runtime = RunningStack.load(runtime_path)
        if runtime is None:
            raise CliError(f"runtime file {runtime_path} is unreadable (not the JSON 'mcpsync up' writes): "
                           "remove "
                           "it, or pass --config FILE")
        if not runtime.stack_alive():
            raise CliError(f"runtime file {runtime_path} is stale (stack pid {runtime.pid} not running): "
                           "start 'mcpsync up' or pass --config FILE", ExitCode.UNAVAILABLE)
        path = runtime.config_path
        origin = f"runtime file {runtime_path}"
    config = load_config(path)
    temporal_env = os.environ.get("MCPSYNC_TEMPORAL_ADDRESS")
    if runtime is not None:
        # The running stack's addresses win over the defaults in its generated file; the environment
        # wins over both, for Temporal as for the database (load_config applied it).
        temporal = config.temporal.model_copy(update={"ui_url": runtime.ui_url})
        if not temporal_env:
            temporal = temporal.model_copy(update={"address": runtime.temporal_address})
        config = config.model_copy(update={
            "temporal": temporal,
            "database": config.database.model_copy(update={"url": config.database.url
                                                           or runtime.database_url}),
        })
    if temporal_env:
        temporal_from = "environment variable MCPSYNC_TEMPORAL_ADDRESS"
    elif runtime is not None:
        temporal_from = origin
    elif _raw_setting(path, "temporal", "address"):
        temporal_from = f"config file {path} ({origin})"
    else:
        temporal_from = f"the default (config file {path} sets no [temporal] address)"
    if os.environ.get("MCPSYNC_DATABASE_URL"):
        database_from = "environment variable MCPSYNC_DATABASE_URL"
    elif _raw_setting(path, "database", "url"):
        database_from = f"config file {path} ({origin})"
    else:
        database_from = origin
    args.address_sources = AddressSources(temporal=temporal_from, database=database_from)
    return config, runtime


def database_url(config: Config) -> str:
    """The configured database URL; none, or one PostgreSQL cannot parse, is a configuration error
    (exit 2: no server was asked). The string is not shown: it may hold a password."""
    from psycopg.conninfo import conninfo_to_dict

    if not config.database.url:
        raise CliError("no database URL: set MCPSYNC_DATABASE_URL or [database] url, or run 'mcpsync up'")
    try:
        conninfo_to_dict(config.database.url)
    except Exception:  # noqa: BLE001 - libpq's parser raises ProgrammingError and others
        source = ("MCPSYNC_DATABASE_URL" if os.environ.get("MCPSYNC_DATABASE_URL")
                  else "the configured [database] url")
        raise CliError(f"{source} is not a PostgreSQL connection string (not shown: it may hold a "
                       "password); use postgresql://USER@HOST:PORT/DB or 'host=... dbname=...'") from None
    return config.database.url


def subscription_key(args: argparse.Namespace, config: Config, *,
                     configured_subject: bool = False) -> SubscriptionKey:
    check_target(args, config, configured_subject=configured_subject)
    return key_for(args, args.uri)


def check_target(args: argparse.Namespace, config: Config, *, configured_subject: bool = False) -> None:
    """``--server`` is configured; with ``configured_subject``, so is ``--subject`` for it."""
    server = config.server(args.server)  # raises ConfigError for an unknown server
    if configured_subject and args.subject not in server.subjects:
        raise CliError(f"subject {args.subject!r} is not configured for server {server.name!r} "
                       f"(configured: {', '.join(server.subjects)}): use one of them, or add it to the "
                       "server's subjects")


def key_for(args: argparse.Namespace, uri: str) -> SubscriptionKey:
    """The key of (``--subject``, ``--server``, ``uri``); an unusable URI is a usage error."""
    try:
        return SubscriptionKey(subject=args.subject, server=args.server, uri=uri)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise CliError(f"invalid subscription key: {problems}") from None


def terminal_safe(text: str, *, keep: str = "\n\t") -> str:
    """``text`` with every character a terminal would act on escaped (ESC and every other C0/C1
    control but those in ``keep``, DEL, and the invisible format characters such as bidi overrides),
    as ``\\xNN`` / ``\\uNNNN``: what a server chose cannot retitle, recolour, rewrite or hide
    anything on the operator's terminal. ``keep=""`` for one field of a line (a newline in it cannot
    start a line of its own)."""
    if text.isprintable() and "\x1b" not in text:
        return text
    out = []
    for c in text:
        if c in keep or c.isprintable():
            out.append(c)
        else:
            n = ord(c)
            out.append(f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}")
    return "".join(out)


def print_text(text: str, *, flush: bool = False, file: TextIO | None = None) -> None:
    """The one printer of the CLI's human-readable lines (``print_out``'s text, ``print_error``,
    streamed event lines): every character a terminal acts on is escaped (``terminal_safe``),
    wherever the output goes, since MIME types, URIs, server names and versions and error reasons in
    them come from upstream servers. ``--json`` output is JSON-escaped instead."""
    print(terminal_safe(text), file=file or sys.stdout, flush=flush)


def print_error(message: str) -> None:
    """The one ``mcpsync: error:`` line (a driver's multi-line message is folded onto it)."""
    print_text(f"mcpsync: error: {' '.join(message.split())}", file=sys.stderr)


def shorten(text: str, limit: int = 300) -> str:
    """``text`` on one line, cut at a word boundary (never mid-word) when longer than ``limit``."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit].rsplit(" ", 1)[0] + " …"


def print_out(obj: Any, as_json: bool, text: str) -> None:
    if as_json:
        print(json.dumps(obj, indent=2, default=str))
    else:
        print_text(text)


# --- flag types: bad values are refused at parse time (exit 2, one line) ---------------------


_LEAF = "_mcpsync_command_prog"  # the namespace attribute naming the (sub)command that parsed last


class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (a bad flag value, a missing required flag, an unknown flag) as the
    CLI's one ``mcpsync: error:`` line, exit 2, naming the command whose help to read instead of
    the usage block. A subcommand's error names it (``mcpsync history: ...``); the root's does not
    repeat ``mcpsync``."""

    def error(self, message: str) -> NoReturn:
        self._fail(self.prog, message)

    def _fail(self, prog: str, message: str) -> NoReturn:
        command = f"{prog}: " if " " in prog else ""
        print_error(f"{command}{message} (see '{prog} --help')")
        sys.exit(ExitCode.USAGE)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = super().parse_known_args(args, namespace)
        if not hasattr(parsed, _LEAF):  # the innermost subcommand returns first
            setattr(parsed, _LEAF, self.prog)
        return parsed, extras

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        leaf = getattr(parsed, _LEAF, self.prog)
        delattr(parsed, _LEAF)
        if extras:
            self._fail(leaf, f"unrecognized arguments: {' '.join(extras)}")
        return parsed


INT64_MAX = 2**63 - 1  # PostgreSQL's bigint: the largest limit, position or id the ledger takes


def _number(text: str, kind: type[int] | type[float]) -> float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if value != value or value in (float("inf"), float("-inf")):  # nan, inf
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    if kind is int and value > INT64_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {INT64_MAX}, not {text}")
    return value


def count(text: str) -> int:
    """A limit or batch size: an integer of at least 1."""
    value = int(_number(text, int))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative(text: str) -> int:
    """An outbox position or an id: an integer of at least 0."""
    value = int(_number(text, int))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {value}")
    return value


def port(text: str) -> int:
    """A TCP port: 0 (pick a free one, or none where the flag says so) to 65535."""
    value = int(_number(text, int))
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port between 0 and 65535, not {value}")
    return value


def check_listen(host: str, port_: int, flags: str) -> None:
    """``host:port_`` can be listened on now (port 0: any free one): a busy port or an address of no
    interface here is a usage error naming ``flags``, before anything starts. A check, not a
    reservation: the socket is closed again for the server that binds it."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port_, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind(address)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise CliError(f"cannot listen on {host}:{port_} ({flags}): {reason}") from None


def seconds(text: str) -> float:
    """A timeout or an interval: more than 0 seconds."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, not {value:g}")
    return value


def amount(text: str) -> float:
    """A period where 0 means none, or a number of days: at least 0."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {value:g}")
    return value
