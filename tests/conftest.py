"""Fixtures and helpers every tier may use; PostgreSQL is shared by the integration and e2e tiers.

The tiers (``scripts/test unit|sim|integration|e2e``): ``tests/unit/`` needs nothing running and
stays fast; ``tests/sim/`` is the simulator's gate (nothing running, CPU-bound);
``tests/integration/`` needs PostgreSQL; ``tests/e2e/`` needs a Temporal dev server, PostgreSQL and
MCP servers (its fixtures are in ``tests/e2e/conftest.py``).

- PostgreSQL: ``MCPSYNC_DATABASE_URL``'s server if set, else an embedded server under the
  session's temporary state dir (the README's default), started and stopped once by
  ``postgres_url``. Each test session gets its own fresh database so runs never see each other's rows.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import stat
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.worker.main.config import Config, ServerConfig, TemporalConfig
from mcpsync.worker.main.connect import open_ledger
from mcpsync.worker.main.services import run_services
from mcpsync.worker.stack.common import command_line, pid_alive
from mcpsync.worker.stack.postgres import EmbeddedPostgres

TEST_TASK_QUEUE_PREFIX = "mcpsync-test"
# The longest files of the suite, longest first (each file's --durations, summed, in the whole suite on two
# workers: 35-78 s on a shared box; the first file of a worker also carries the session's setup).
# scripts/test runs whole files on two workers in collection order (--dist loadfile
# --no-loadscope-reorder): these go out first, so that no long file starts last and runs alone while the
# other worker idles; the rest keep their order.
LONGEST_FILES = (
    "tests/e2e/test_serve.py",
    "tests/e2e/test_benchmark_smoke.py",
    "tests/e2e/test_catalog_e2e.py",
    "tests/sim/test_simulation.py",
    "tests/e2e/test_e2e_scaleout.py",
    "tests/e2e/test_simulation_real_stack.py",
    "tests/e2e/test_e2e_staleness.py",
    "tests/e2e/test_wheel.py",
    "tests/e2e/test_e2e_process_faults.py",
    "tests/e2e/test_e2e_checklist.py",
    "tests/e2e/test_e2e_fence.py",
    "tests/e2e/test_cli_newcomer.py",
    "tests/e2e/test_security_local_user.py",
    "tests/unit/test_fuzz_upstream_replies.py",
    "tests/e2e/test_security_upstream_replies.py",
    "tests/e2e/test_security_serve_sessions.py",
    "tests/e2e/test_serve_truth.py",
    "tests/e2e/test_security_serve_visibility.py",
    "tests/e2e/test_docs_commands.py",
)
REPO_ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``LONGEST_FILES`` first, in that order; every other test keeps its place (the sort is stable)."""
    rank = {path: i for i, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def _admin_and_db(url: str, name: str) -> tuple[str, str]:
    prefix, sep, query = url.partition("?")
    base = prefix.rsplit("/", 1)[0]
    return url, f"{base}/{name}{sep}{query}"


@pytest.fixture(scope="session")
def tmp_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@asynccontextmanager
async def postgres_server(state_dir: Path) -> AsyncIterator[str]:
    """A PostgreSQL server for the duration of the block; yields its admin URL.

    ``MCPSYNC_DATABASE_URL``'s server when set (never stopped here), else an embedded server on
    ``state_dir`` that this block owns: it starts it and it alone stops it. A state dir has one
    owner: the embedded wheel reuses a running server on the same data dir, and its ``stop()``
    stops it for every holder, so a second owner would stop the server under the first.
    """
    base = os.environ.get("MCPSYNC_DATABASE_URL")
    if base:
        yield base
        return
    embedded = await EmbeddedPostgres.start(state_dir)
    try:
        yield embedded.admin_url
    finally:
        await embedded.stop()


@asynccontextmanager
async def fresh_database(server_url: str) -> AsyncIterator[str]:
    """A new, empty database (dropped afterwards) on the server at ``server_url``; yields its URL.

    Starts and stops no server: take ``server_url`` from the ``postgres_url`` fixture (the
    session's server) or from a ``postgres_server`` block of the test's own.
    """
    name = f"mcpsync_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin, url = _admin_and_db(server_url, name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url
    finally:
        with suppress(Exception), psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


SHARED_MEMORY = Path("/dev/shm")
# Where private_state_dir makes its dirs without a writable /dev/shm.
ON_DISK_ROOT = REPO_ROOT / ".state" / "t"


def memory_backed_root() -> Path | None:
    """A directory for the test session's servers' files on tmpfs (``/dev/shm/mcpsync-tests``),
    None without a writable ``/dev/shm``. On tmpfs an fsync costs nothing: on this project's VMs a
    PostgreSQL commit or a Temporal dev server's SQLite write waits for the disk otherwise (about
    half of a workflow task's time). Nothing a test asserts is about surviving the machine's crash;
    a test that kills and restarts a server finds its files where it left them, as on disk."""
    if not (SHARED_MEMORY.is_dir() and os.access(SHARED_MEMORY, os.W_OK | os.X_OK)):
        return None
    root = SHARED_MEMORY / "mcpsync-tests"
    with suppress(FileExistsError):
        root.mkdir()
        root.chmod(0o1777)  # shared by every user's sessions, as /tmp is
    return root


def private_state_dir(prefix: str) -> Path:
    """A new, empty directory for an embedded PostgreSQL of a test or a test session (or another
    server's files): under :func:`memory_backed_root`, else under the project's own state dir
    (``.state/t/``); remove it with ``shutil.rmtree`` when done.

    Not under pytest's tmp: pytest makes ``/tmp/pytest-of-<user>`` 0700 whenever a session starts,
    which locks the embedded server's own system user out of a data dir below it while another
    session (a second ``scripts/test``, a tier run in another terminal) is still using it. Short,
    so the server's Unix socket path stays within the kernel's limit.
    """
    root = memory_backed_root()
    if root is None:
        root = ON_DISK_ROOT
        root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root))


# A private_state_dir's name: its prefix, the pid of the process that made it (a pid is at most
# 4194304, the kernel's largest pid_max), a dash, mkdtemp's random part.
STATE_DIR_NAME = re.compile(r"[a-z]+(\d{1,7})-")


def _names(pid: int, directory: Path) -> bool:
    """``pid``'s command line names ``directory`` or a path in it (a zombie's names nothing)."""
    line = command_line(pid) + " "
    return f"{directory}{os.sep}" in line or f"{directory} " in line


def _stop_servers_of(directory: Path, grace: float = 3.0) -> list[int]:
    """Stop this user's processes whose command line names a path in ``directory`` (the Temporal dev
    server's ``--db-filename``, PostgreSQL's ``-D``: a killed session's servers outlive it): SIGTERM,
    then SIGKILL after ``grace`` seconds. Answers their pids."""
    found: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with suppress(OSError):
            if proc.stat().st_uid == os.getuid() and _names(int(proc.name), directory):
                found.append(int(proc.name))
    for pid in found:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_names(pid, directory) for pid in found):
        time.sleep(0.05)
    for pid in found:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return found


def sweep_stale_state_dirs(root: Path) -> list[Path]:
    """Remove the directories :func:`private_state_dir` made under ``root`` (this user's) whose
    maker is no longer alive, and stop the servers still running on them (``_stop_servers_of``): a
    session that was killed (SIGKILL, the machine's OOM killer) never removes its own, and on tmpfs
    they hold RAM. A dir is made by the process that uses it (the session's process, or each
    pytest-xdist worker, for itself), so a live maker's dir is in use and stays; a pid the kernel
    has given to another process since keeps the dir until a later sweep. Answers the dirs removed."""
    removed: list[Path] = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return removed
    for entry in entries:
        named = STATE_DIR_NAME.match(entry.name)
        if named is None or pid_alive(int(named[1])):
            continue
        with suppress(FileNotFoundError):
            info = entry.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            _stop_servers_of(entry)
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def pytest_sessionstart() -> None:
    """Sweep the state dirs killed sessions left (:func:`sweep_stale_state_dirs`). Runs in every
    process of a session: the controller and each xdist worker."""
    for root in (memory_backed_root(), ON_DISK_ROOT):
        if root is not None:
            sweep_stale_state_dirs(root)


@pytest.fixture(scope="session")
async def postgres_url() -> AsyncIterator[str]:
    """The session's PostgreSQL server (admin URL), started once and stopped once, by this fixture."""
    where = private_state_dir("s")
    try:
        async with postgres_server(where) as url:
            yield url
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def own_state_dir() -> Iterator[Path]:
    """A private state dir for a test that starts an embedded PostgreSQL or a Temporal dev server of its
    own."""
    where = private_state_dir("o")
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(scope="session")
async def database_url(postgres_url: str) -> AsyncIterator[str]:
    async with fresh_database(postgres_url) as url:
        yield url


@pytest.fixture(scope="session")
async def ledger(database_url: str) -> AsyncIterator[Ledger]:
    led = await open_ledger(database_url)
    try:
        yield led
    finally:
        await led.pool.close()


@dataclass(frozen=True)
class PrivateDatabase:
    url: str
    ledger: Ledger


@pytest.fixture
async def private_database(postgres_url: str) -> AsyncIterator[PrivateDatabase]:
    """A migrated ledger on a database of its own (dropped afterwards), for a test whose assertions
    are about the whole ledger: retention, consumers holding rows back. In the session's database
    other tests' rows and durable consumers (a serve process with ``--consumer`` registers one) would
    move them."""
    async with fresh_database(postgres_url) as url:
        led = await open_ledger(url)
        try:
            yield PrivateDatabase(url=url, ledger=led)
        finally:
            await led.pool.close()


@pytest.fixture
def private_ledger(private_database: PrivateDatabase) -> Ledger:
    return private_database.ledger


async def ledger_rows(ledger: Ledger, sql: str, *args: object) -> list[tuple[Any, ...]]:
    """Run one SQL statement on the ledger; its rows (none for a statement without a result)."""
    async with ledger.pool.connection() as conn:
        cur = await conn.execute(sql, args)
        return list(await cur.fetchall()) if cur.description else []


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def running_services(
    client: Client, ledger: Ledger, servers: list[ServerConfig], *, task_queue: str | None = None,
    with_main_worker: bool = True, namespace: str = "default",
) -> AsyncIterator[Config]:
    """Run the main worker and session hosts for ``servers`` in this process."""
    config = Config(
        temporal=TemporalConfig(address="unused", namespace=namespace,
                                task_queue=task_queue or unique(TEST_TASK_QUEUE_PREFIX)),
        servers=servers,
    )
    task = asyncio.create_task(run_services(config, client, ledger, with_main_worker=with_main_worker))
    try:
        yield config
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task


async def eventually(predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.1,
                     what: str = "condition") -> Any:
    """Poll an (async or sync) predicate until truthy; fail with ``what`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: Any = None
    while loop.time() < deadline:
        last = predicate()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last value: {last!r})")
