"""A fork server for the ``mcpsync`` CLI: each run is a child forked from a process that has already
imported the CLI, so a test pays a fork (milliseconds) instead of an interpreter start and the CLI's
imports (about a second on a busy two-core box) per command.

Contract:
- ``run(args, env=, input=, timeout=)`` stands in for ``subprocess.run([mcpsync, *args],
  cwd=REPO_ROOT, env=env, capture_output=True, text=True)``: the same stdout, stderr and
  returncode (an exit code from ``SystemExit`` or ``os._exit``; an uncaught exception prints its
  traceback, from ``main`` down, to stderr and exits 1, as the interpreter does; a signal is
  ``-signum``).
  ``timeout`` kills the child and raises ``subprocess.TimeoutExpired``. ``arun`` is the same for
  a coroutine (the caller's event loop keeps running, e.g. a worker in it); ``run_bytes`` is
  ``run`` without ``text=True``, and takes a stdout of the caller's (a terminal, say).
- The child is a real process with its own pid: ``args`` in ``sys.argv[1:]``, ``env`` as its
  whole environment, stdin (``input``, else empty), stdout and stderr on pipes the caller owns
  (its output ends at EOF, when every process holding them, the child's children too, has closed
  them), fresh signal dispositions. Long-running commands (``--watch``, ``--follow``) run until
  they exit or the timeout kills them.
- ``spawn(args, env=, stderr=)`` stands in for ``subprocess.Popen([mcpsync, *args], cwd=REPO_ROOT,
  env=env, stdin=DEVNULL, stdout=PIPE, stderr=stderr)`` for a command that runs until it is stopped
  (``serve``): a :class:`Spawned` with the child's ``pid``, the read end of its stdout (``stdout``,
  the caller's to read and close), ``send_signal``, ``poll``, ``wait(timeout)`` and ``returncode``
  (``-signum`` after a signal). Only forked: an environment that needs a fresh interpreter raises
  ``ValueError``.
- A run whose environment differs from the server's in anything but ``MCPSYNC_*`` variables and
  pytest's ``PYTEST_CURRENT_TEST`` (PATH, PYTHONPATH, locale, ``_ARGCOMPLETE``: state that the
  imports or the interpreter already read) runs in a fresh interpreter instead (``subprocess.run``
  of ``FRESH``), with the same result. (mcpsync reads its ``MCPSYNC_*`` variables when a command
  runs, never at import.)
- The child's command line (``/proc/<pid>/cmdline``, the server's) names ``mcpsync.worker.cli.root``,
  as a fresh one does: ``mcpsync down`` and a second ``up`` recognise a forked ``up`` by it.
- Fork safety: the server is single-threaded, never runs an event loop, and refuses to fork
  with a second thread alive; each child starts its own event loop (``asyncio.run`` in the CLI).
- One server per test process, started on first use (cwd ``REPO_ROOT``, this process's
  environment at that moment), stopped when this process exits (it exits on EOF of its socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import locale
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from mcpsync.worker.stack.common import REPO_ROOT

# The fresh-interpreter command the fork server stands in for (the CLI as ``python -m`` from the
# checkout, as the tests always ran it).
FRESH = [sys.executable, "-m", "mcpsync.worker.cli"]
# Modules the CLI's commands import lazily: imported once in the server, so no child pays for them.
PRELOAD = (
    "mcpsync.worker.cli.root",
    "mcpsync.worker.main.services",
    "mcpsync.worker.api.answer_gate",
    "mcpsync.worker.observe.probe",
    "mcpsync.worker.api.completeness",
    "mcpsync.worker.stack.up",
    "mcpsync.worker.serve.run",
    "mcpsync.worker.observe.metrics",
    "mcpsync.activities.ledger.db",
    "mcpsync.activities.ledger.outbox",
    "mcpsync.activities.ledger.catalog",
    "mcpsync.activities.ledger.released",
    "mcpsync.activities.ledger.retention",
    "mcpsync.activities.ledger.answers",
    "argcomplete",
)
_MAX_MESSAGE = 1 << 20
forked_runs = 0  # runs this process had forked (the rest ran in a fresh interpreter); tests read it


def _same_interpreter_state(env: Mapping[str, str], base: Mapping[str, str]) -> bool:
    """Whether a child of a server started with ``base`` can run with ``env``: they differ only in
    variables read at run time (``MCPSYNC_*``; pytest's ``PYTEST_CURRENT_TEST`` names each test)."""
    def rest(e: Mapping[str, str]) -> dict[str, str]:
        return {k: v for k, v in e.items() if not k.startswith("MCPSYNC_") and k != "PYTEST_CURRENT_TEST"}
    return rest(env) == rest(base)


class _Client:
    """The test process's end: starts the server and asks it for one child per run."""

    def __init__(self) -> None:
        self.env = dict(os.environ)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The command line names mcpsync.worker.cli.root, as FRESH's does: the children share it, and mcpsync
        # tells its own processes from a recycled pid by the command line (stack.process_alive).
        self.server = subprocess.Popen(
            [sys.executable, "-c", f"from tests.cli_process import serve; serve({theirs.fileno()})",
             "mcpsync.worker.cli"],
            cwd=REPO_ROOT, env=self.env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()

    def start(self, args: Sequence[str], env: Mapping[str, str], stdin: int, stdout: int,
              stderr: int) -> tuple[socket.socket, int]:
        """Fork a child on the given pipe ends; returns the reply socket (the exit code arrives on
        it) and the child's pid."""
        mine, reply = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        request = json.dumps({"args": list(args), "env": dict(env)}).encode()
        with self.lock:
            socket.send_fds(self.sock, [request], [reply.fileno(), stdin, stdout, stderr])
        reply.close()
        line = _read_line(mine)
        if not line:
            mine.close()
            raise RuntimeError(f"the CLI fork server is gone (exit code {self.server.poll()})")
        return mine, int(line)


_client: _Client | None = None
_client_lock = threading.Lock()  # arun's threads may ask for the first server at once


def _get_client(env: Mapping[str, str]) -> _Client:
    """The server; a new one when the old one is gone or this process's environment moved on (a
    fixture set PATH, say) and the run asks for the new one."""
    global _client
    with _client_lock:
        if _client is not None and _client.server.poll() is None:
            moved_on = not _same_interpreter_state(_client.env, os.environ)
            if not moved_on or not _same_interpreter_state(env, os.environ):
                return _client
            _client.sock.close()  # the server exits on EOF; children it forked run on
            _client.server.wait(10)
        _client = _Client()
        return _client


def server_pid() -> int | None:
    """The running server's pid (None before the first run): a test sees it survive a run."""
    return None if _client is None or _client.server.poll() is not None else _client.server.pid


def without_database_url() -> dict[str, str]:
    """This process's environment less ``MCPSYNC_DATABASE_URL``: an ``mcpsync`` run with ``--config``
    then uses the file's ``[database] url`` (the environment's URL wins over the file)."""
    return {k: v for k, v in os.environ.items() if k != "MCPSYNC_DATABASE_URL"}


def run_config(conf: os.PathLike[str] | str, *args: str, stdout: int | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """``mcpsync --config conf *args`` against the file's database, in bytes (``run_bytes``)."""
    return run_bytes(["--config", str(conf), *args], env=without_database_url(), stdout=stdout,
                     timeout=timeout)


def _read_line(sock: socket.socket) -> bytes:
    """One line, read a byte at a time (the exit code may follow the pid in the same buffer)."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(1)
        if not chunk:
            return b""
        data += chunk
    return data.strip()


def _text(data: bytes) -> str:
    """Decoded as ``subprocess.run(text=True)`` decodes: locale encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def run(args: Sequence[str], *, env: Mapping[str, str] | None = None, input: str | None = None,
        timeout: float | None = 60) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([mcpsync, *args], cwd=REPO_ROOT, capture_output=True, text=True)``, forked."""
    encoded = None if input is None else input.encode(locale.getpreferredencoding(False))
    r = run_bytes(args, env=env, input=encoded, timeout=timeout)
    return subprocess.CompletedProcess(r.args, r.returncode, _text(r.stdout), _text(r.stderr))


def run_bytes(args: Sequence[str], *, env: Mapping[str, str] | None = None, input: bytes | None = None,
              stdout: int | None = None, timeout: float | None = 60) -> subprocess.CompletedProcess[bytes]:
    """``run`` in bytes; ``stdout`` an open fd (a terminal, say) instead of the captured pipe, as
    ``subprocess.run(stdout=fd, stderr=PIPE)`` (the result's stdout is then None)."""
    env = dict(os.environ if env is None else env)
    client = _get_client(env)
    if not _same_interpreter_state(env, client.env):
        return subprocess.run([*FRESH, *args], cwd=REPO_ROOT, env=env, input=input, timeout=timeout,
                              stdout=subprocess.PIPE if stdout is None else stdout, stderr=subprocess.PIPE)
    global forked_runs
    forked_runs += 1
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe() if stdout is None else (None, stdout)
    err_r, err_w = os.pipe()
    try:
        reply, pid = client.start(args, env, in_r, out_w, err_w)
    finally:
        for fd in (in_r, err_w, *([out_w] if stdout is None else [])):
            os.close(fd)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        out, err, code = _communicate(reply, in_w, out_r, err_r, input or b"", deadline)
    except subprocess.TimeoutExpired:
        os.kill(pid, signal.SIGKILL)
        raise subprocess.TimeoutExpired([*FRESH, *args], timeout or 0) from None
    finally:
        reply.close()
    return subprocess.CompletedProcess([*FRESH, *args], code, out, err)


class Spawned:
    """A child of ``spawn``: it runs until it exits; its exit code comes on the reply socket."""

    def __init__(self, args: Sequence[str], pid: int, stdout: int, reply: socket.socket) -> None:
        self.args = [*FRESH, *args]
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._reply = reply

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wait(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._reply.settimeout(timeout)
            try:
                line = _read_line(self._reply)
            except (TimeoutError, BlockingIOError):  # BlockingIOError: poll's timeout 0
                raise subprocess.TimeoutExpired(self.args, timeout or 0) from None
            self._reply.close()
            if not line:
                raise RuntimeError("the CLI fork server is gone before the child's exit code")
            self.returncode = int(line)
        return self.returncode


def spawn(args: Sequence[str], *, env: Mapping[str, str], stderr: int) -> Spawned:
    """``subprocess.Popen([mcpsync, *args], ...)``, forked: see the module contract."""
    env = dict(env)
    client = _get_client(env)
    if not _same_interpreter_state(env, client.env):
        raise ValueError("spawn: this environment needs a fresh interpreter (it differs from the fork "
                         "server's in more than MCPSYNC_* variables)")
    global forked_runs
    forked_runs += 1
    out_r, out_w = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        reply, pid = client.start(args, env, null, out_w, stderr)
    except BaseException:
        os.close(out_r)
        raise
    finally:
        os.close(null)
        os.close(out_w)
    return Spawned(args, pid, out_r, reply)


async def arun(args: Sequence[str], *, env: Mapping[str, str] | None = None, input: str | None = None,
               timeout: float | None = 60) -> subprocess.CompletedProcess[str]:
    """``run`` without blocking the event loop (it waits in a thread of this process)."""
    return await asyncio.to_thread(run, args, env=env, input=input, timeout=timeout)


def _communicate(reply: socket.socket, in_w: int, out_r: int | None, err_r: int, data: bytes,
                 deadline: float | None) -> tuple[bytes | None, bytes, int]:
    """Write ``data`` to stdin, read stdout (unless None) and stderr to EOF and the exit code off
    ``reply``."""
    readers = [err_r] if out_r is None else [out_r, err_r]
    chunks: dict[int, list[bytes]] = {fd: [] for fd in readers}
    code: bytes = b""
    with selectors.DefaultSelector() as sel:
        if data:
            os.set_blocking(in_w, False)
            sel.register(in_w, selectors.EVENT_WRITE)
        else:
            os.close(in_w)
        for fd in (*readers, reply.fileno()):
            sel.register(fd, selectors.EVENT_READ)
        try:
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired([], 0)
                for key, _ in sel.select(left):
                    fd = key.fd
                    if fd == in_w:
                        try:
                            data = data[os.write(in_w, data[:65536]):]
                        except BrokenPipeError:
                            data = b""
                        if not data:
                            sel.unregister(in_w)
                            os.close(in_w)
                        continue
                    chunk = os.read(fd, 65536)
                    if fd == reply.fileno():
                        code += chunk
                    else:
                        chunks[fd].append(chunk)
                    if not chunk:
                        sel.unregister(fd)
        finally:
            for fd in (*readers, *([in_w] if in_w in sel.get_map() else [])):
                os.close(fd)
    if not code.strip():
        raise RuntimeError("the CLI fork server is gone before the child's exit code")
    return None if out_r is None else b"".join(chunks[out_r]), b"".join(chunks[err_r]), int(code)


# --- the server side --------------------------------------------------------------------------------


def serve(fd: int) -> None:
    """The server's loop: one forked child per request on ``fd``, its exit code sent back when it
    exits (a pidfd per child, so one loop waits on requests and exits alike); returns on EOF."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    sock = socket.socket(fileno=fd)
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, reply socket)
    while True:
        ready, _, _ = select.select([sock, *children], [], [])
        for pidfd in ready:
            if pidfd is sock:
                continue
            pid, reply = children.pop(pidfd)
            _, status = os.waitpid(pid, 0)
            os.close(pidfd)
            with contextlib.suppress(OSError):  # a caller that timed out closed its end
                reply.sendall(b"%d\n" % os.waitstatus_to_exitcode(status))
            reply.close()
        if sock in ready:
            message, fds, _, _ = socket.recv_fds(sock, _MAX_MESSAGE, 4)
            if not message:
                return
            reply_fd, stdin, stdout, stderr = fds
            if threading.active_count() != 1:
                raise RuntimeError("the CLI fork server has a second thread: forking it is unsafe")
            pid = os.fork()
            if pid == 0:
                held = [fd, reply_fd, *children, *(r.fileno() for _, r in children.values())]
                _child(json.loads(message), stdin, stdout, stderr, held)
            for f in (stdin, stdout, stderr):
                os.close(f)
            reply = socket.socket(fileno=reply_fd)
            with contextlib.suppress(OSError):
                reply.sendall(b"%d\n" % pid)
            children[os.pidfd_open(pid)] = (pid, reply)


def _child(request: dict[str, object], stdin: int, stdout: int, stderr: int, server_fds: list[int]) -> None:
    """Runs the CLI as ``python -m mcpsync.worker.cli`` would, then exits; never returns."""
    code = 1
    try:
        for f in server_fds:
            os.close(f)
        for f, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            os.dup2(f, target)
            os.close(f)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        args = request["args"]
        assert isinstance(args, list)
        import mcpsync.worker.cli.root as cli

        sys.argv = [cli.__file__, *args]
        code = _exit_code(cli.main, args)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe at exit is the reader's business
                pass
        os._exit(code)


def _exit_code(main: object, args: list[str]) -> int:
    """``main(args)``'s exit code as the interpreter reports it (``os._exit`` in main never returns)."""
    import traceback

    assert callable(main)
    try:
        main(args)
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:  # noqa: BLE001 - the interpreter's own last resort, reproduced
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next if exc.__traceback__ else None)
        if isinstance(exc, KeyboardInterrupt):
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        return 1
    return 0
