"""Helpers for the ``mcpsync serve`` tests: the serve process, the stack a test serves from (fixture
upstream, worker, subscriptions, serve), SDK clients with a bearer token, events/poll, the Node
clients (TypeScript SDK, Inspector CLI), raw HTTP and SSE."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from pydantic import TypeAdapter
from temporalio.client import Client as TemporalClient
from temporalio.client import WorkflowHandle

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.stack.common import REPO_ROOT
from mcpsync.workflows.records.subscription import SubscriptionKey
from tests import cli_process
from tests.conftest import running_services, unique
from tests.e2e.test_e2e_subscription import _wait_record


class ServeProcess:
    """``mcpsync serve``, forked from the CLI fork server (``tests.cli_process.spawn``): no interpreter
    start and CLI imports per test. Its stdout is read on a thread of its own to the end (the first line
    says where it listens), so nothing it prints ever blocks it."""

    def __init__(self, proc: cli_process.Spawned, url: str, log: Path) -> None:
        self.proc = proc
        self.url = url
        self.log = log  # stderr (logs at INFO: -v)

    @classmethod
    async def start(cls, conf: Path, tokens: dict[str, str], *, consumer: str, port: int = 0,
                    extra: tuple[str, ...] = ()) -> ServeProcess:
        env = cli_process.without_database_url()
        env["MCPSYNC_SERVE_TOKENS"] = json.dumps(tokens)
        log = conf.parent / f"serve-{consumer}-{os.urandom(3).hex()}.log"
        with log.open("wb") as err:
            proc = await asyncio.to_thread(
                cli_process.spawn, ["-v", "--config", str(conf), "serve", "--port", str(port), "--consumer",
                                    consumer, *extra], env=env, stderr=err.fileno())
        first: Future[bytes] = Future()
        threading.Thread(target=_drain, args=(proc.stdout, first), daemon=True).start()
        try:
            line = (await asyncio.wait_for(asyncio.wrap_future(first), 60)).decode()
        except TimeoutError:
            await cls(proc, "", log).kill()
            raise
        if "listening on" not in line:
            raise RuntimeError(f"serve did not start: {line!r} {log.read_text()[-2000:]}")
        return cls(proc, line.rsplit(" ", 1)[-1].strip(), log)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/")[0])

    async def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(self.proc.wait)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 10)
            except subprocess.TimeoutExpired:
                await self.kill()


def _drain(fd: int, first: Future[bytes]) -> None:
    """Read ``fd`` to its end; ``first`` gets the first line (or what came before the end)."""
    with os.fdopen(fd, "rb") as out:
        first.set_result(out.readline())
        for _ in out:
            pass


@asynccontextmanager
async def serve_client(url: str, token: str, mode: Literal["auto", "legacy"], inbox: list[Any] | None = None,
                       ) -> AsyncIterator[Client]:
    async def handler(message: Any) -> None:
        if inbox is not None:
            inbox.append(message)

    async with AsyncExitStack() as stack:
        hc = await stack.enter_async_context(create_mcp_http_client(headers={"Authorization": "Bearer "
                                                                                              f"{token}"}))
        client = await stack.enter_async_context(
            Client(streamable_http_client(url, http_client=hc), mode=mode, cache=None,  # type: ignore[arg-type]
                   message_handler=handler))
        yield client


class _EventsPoll(types.Request[dict[str, Any], Literal["events/poll"]]):
    method: Literal["events/poll"] = "events/poll"
    params: dict[str, Any]


async def events_poll(client: Client, cursor: str | None, max_events: int = 100) -> dict[str, Any]:
    request = _EventsPoll(params={"name": "resource.changed", "cursor": cursor, "maxEvents": max_events})
    result: dict[str, Any] = await client.session.send_request(request, TypeAdapter(dict[str, Any]))
    return result


def serve_conf(tmp_path: Path, database_url: str) -> Path:
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    return conf


@dataclass(frozen=True)
class Seed:
    """One upstream resource a subject subscribes to before serve starts: ``text`` or ``blob``."""

    subject: str
    uri: str
    text: str | None = None
    blob: bytes | None = None
    mime_type: str = "text/markdown"


@dataclass
class Served:
    """The running stack of one test: the fixture upstream, the worker, one subscription per seed at
    its first version, and a serve process for ``tokens`` (every subject's, plus token-only ones)."""

    server: ServerConfig
    tokens: dict[str, str]
    conf: Path
    consumer: str
    serve_args: tuple[str, ...]
    handles: dict[str, WorkflowHandle[Any, Any]]  # by URI: the subscription's workflow
    v1: dict[str, str]  # by URI: the first version's committed digest
    serve: ServeProcess

    async def restart_serve(self) -> None:
        """A new serve process on the same config, tokens, arguments and durable consumer."""
        self.serve = await ServeProcess.start(
            self.conf, self.tokens, consumer=self.consumer, extra=self.serve_args
        )


ServeStack = Callable[..., AbstractAsyncContextManager[Served]]


def serve_stack_factory(
    temporal_client: TemporalClient, ledger: Ledger, fx: FixtureProcess, database_url: str, tmp_path: Path
) -> ServeStack:
    """``serve_stack(*seeds, idle_subjects=(), token_only=(), server_options={}, serve_args=())``: the
    seeds created upstream, the worker running one server for the seeds' subjects and the idle ones
    (configured, nothing subscribed), each seed's subscription at its first version and subscribed
    upstream, then serve started with a token for every subject and the token-only ones; serve stops
    on leaving. Per test, not per module: the tests edit, revoke and kill what it starts."""

    @asynccontextmanager
    async def start(
        *seeds: Seed,
        idle_subjects: tuple[str, ...] = (),
        token_only: tuple[str, ...] = (),
        server_options: dict[str, Any] | None = None,
        serve_args: tuple[str, ...] = (),
    ) -> AsyncIterator[Served]:
        subjects = list(dict.fromkeys([*(s.subject for s in seeds), *idle_subjects]))
        tokens = {subject: unique("serve-token") for subject in (*subjects, *token_only)}
        server = ServerConfig(
            name=unique("fx"), transport="http", url=fx.mcp_url, subjects=subjects, **(server_options or {})
        )
        v1: dict[str, str] = {}
        for seed in seeds:
            body: dict[str, Any] = {"text": seed.text} if seed.blob is None else {"blob": seed.blob}
            created = await fx.create(seed.uri, mime_type=seed.mime_type, **body)
            v1[seed.uri] = created["committed"]["digest"]
        async with running_services(temporal_client, ledger, [server]) as cfg:
            handles = {
                seed.uri: await start_subscription(
                    temporal_client,
                    SubscriptionKey(subject=seed.subject, server=server.name, uri=seed.uri),
                    task_queue=cfg.temporal.task_queue,
                )
                for seed in seeds
            }
            for uri, handle in handles.items():
                await _wait_record(handle, lambda r, d=v1[uri]: r.last_accepted_digest == d, f"{uri} v1")
                await fx.wait_subscribed(uri)
            conf = serve_conf(tmp_path, database_url)
            consumer = unique("serve")
            serve = await ServeProcess.start(conf, tokens, consumer=consumer, extra=serve_args)
            served = Served(server, tokens, conf, consumer, serve_args, handles, v1, serve)
            try:
                yield served
            finally:
                await served.serve.stop()

    return start


async def accepted_digests(ledger: Ledger, subject: str, uri: str) -> list[str]:
    async with ledger.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT content_digest FROM outbox WHERE subject = %s AND uri = %s"
            " AND content_digest IS NOT NULL ORDER BY outbox_id",
            (subject, uri),
        )
        return [r[0] for r in await cur.fetchall()]


NPM_PREFIX = Path(os.environ.get("MCPSYNC_NPM_PREFIX", REPO_ROOT / ".state" / "npm"))
TS_CLIENT = Path(__file__).parent / "js" / "serve_client.mjs"
INSPECTOR = NPM_PREFIX / "node_modules" / "@modelcontextprotocol" / "inspector-cli" / "build" / "index.js"


async def run_node(*args: str, cwd: Path | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        "node",
        *args,
        env={**os.environ, "MCPSYNC_NPM_PREFIX": str(NPM_PREFIX)},
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def run_inspector(url: str, token: str, method: str, *extra: str) -> tuple[int, str]:
    proc = await run_node(
        str(INSPECTOR),
        url,
        "--transport",
        "http",
        "--header",
        f"Authorization: Bearer {token}",
        "--method",
        method,
        *extra,
        cwd=INSPECTOR.parent,
    )  # it finds its package.json from the cwd
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode() + err.decode()


async def ts_lines(proc: asyncio.subprocess.Process, until: str) -> list[dict[str, Any]]:
    assert proc.stdout is not None
    lines: list[dict[str, Any]] = []
    while True:
        raw = await asyncio.wait_for(proc.stdout.readline(), 90)
        assert raw, f"TS client ended early: {lines}"
        lines.append(json.loads(raw))
        if lines[-1]["step"] in (until, "error"):
            return lines


async def raw_session(raw: httpx2.AsyncClient, url: str, headers: dict[str, str]) -> str:
    """A 2025-11-25 session opened by hand (initialize, then notifications/initialized); its id."""
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    session_id = (await raw.post(url, json=init, headers=headers)).headers["mcp-session-id"]
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    await raw.post(url, json=initialized, headers={**headers, "mcp-session-id": session_id})
    return str(session_id)


async def raw_sse_stream(
    url: str, token: str, session_id: str, *, small: bool = False
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A 2025-11-25 session's GET stream on a plain socket (read only when the caller reads it). Without
    ``small`` a client that stops reading stalls serve's sends only after megabytes (on loopback: a
    64 KiB MSS lets serve's socket buffer grow to MiBs; the stream reader holds 8 MiB); with it, after
    tens of KiB: a 536-byte MSS and a 4 KiB receive buffer set before connecting (serve's send buffer
    stays small), and the reader stops taking from the socket at 32 KiB."""
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    if small:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 14)
    else:
        reader, writer = await asyncio.open_connection(host, int(port), limit=1 << 22)
    writer.write(
        (
            f"GET /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
            f"Accept: text/event-stream\r\nmcp-session-id: {session_id}\r\n"
            "mcp-protocol-version: 2025-11-25\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert head.startswith(b"HTTP/1.1 200"), head
    return reader, writer


def sse_messages(received: bytes) -> list[dict[str, Any]]:
    """The JSON-RPC messages of the complete SSE frames in ``received`` (a raw stream's bytes so far)."""
    frames = received.replace(b"\r\n", b"\n").split(b"\n\n")[:-1]  # the last part: not complete yet
    return [
        json.loads(line[5:])
        for frame in frames
        for line in frame.split(b"\n")
        if line.startswith(b"data:") and line[5:].strip()
    ]


async def read_sse_until(
    stream: asyncio.StreamReader, received: bytes, done: Callable[[list[dict[str, Any]]], bool], *,
    quiet: float = 1.0, timeout: float = 60.0,
) -> bytes:
    """Read a raw SSE stream on from ``received`` until ``done(messages)`` holds and nothing more has
    arrived for ``quiet`` seconds; all the bytes read so far."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                chunk = await asyncio.wait_for(stream.read(1 << 20), quiet)
            except TimeoutError:
                if done(sse_messages(received)):
                    return received
                continue
            assert chunk, "the stream ended"
            received += chunk


def jsonrpc_result(resp: httpx2.Response) -> dict[str, Any]:
    """The ``result`` of a JSON-RPC response sent as JSON or as one SSE ``data:`` frame."""
    if resp.headers.get("content-type", "").startswith("application/json"):
        return dict(resp.json()["result"])
    frames = [json.loads(line[5:]) for line in resp.text.splitlines() if line.startswith("data:")]
    return dict(next(f for f in frames if "result" in f)["result"])
