"""Byte bounds before parsing: hostile MCP servers over the transports mcpsync really opens
(``session_host.server_transport``), against real sockets and a real subprocess.

- streamable HTTP, JSON (not SSE) responses: a 1 GB reply, streamed or declared, fails that one
  read as MALFORMED ("byte limit") after about the limit; the session answers the next read;
- stdio: a 100 MB line fails that one read the same way; the session answers the next read.
Peak memory stays far below the reply's size."""

from __future__ import annotations

import asyncio
import json
import resource
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcpsync.activities.mcp_session import classify_error
from mcpsync.worker.ingress.session_host import server_transport
from mcpsync.worker.ingress.transport_bounds import MAX_MESSAGE_URIS, transport_limit
from mcpsync.worker.main.config import ServerConfig
from mcpsync.workflows.records.mcp_calls import ReadOutcomeKind

MAX_CONTENT = 256 * 1024  # the transport limit is then ~576 KiB
GB, MB = 1024**3, 1024**2
PAGE_RESOURCES = 1_000_000
INIT = {"protocolVersion": "2025-11-25", "capabilities": {"resources": {}},
        "serverInfo": {"name": "hostile", "version": "1"}}


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _ok(request_id: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id,
                       "result": {"contents": [{"uri": "demo://ok", "text": "fine"}]}}).encode()


async def _http_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A minimal streamable-HTTP MCP server answering in JSON (never SSE)."""
    chunk = b"x" * MB
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method = lines[0].split()[0]
            headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method != "POST":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                continue
            msg = json.loads(body)
            if "id" not in msg:
                writer.write(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n")
                await writer.drain()
                continue
            base = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: s1\r\n"
            uri = (msg.get("params") or {}).get("uri", "")
            if msg["method"] == "initialize":
                reply = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": INIT}).encode()
            elif msg["method"] == "resources/read" and uri == "demo://ok":
                reply = _ok(msg["id"])
            elif msg["method"] in ("resources/list", "resources/templates/list"):  # 1,000,000 descriptors
                writer.write(base + b"transfer-encoding: chunked\r\n\r\n")  # (34 MB, under the byte limit)
                field, key = (("resources", "uri") if msg["method"] == "resources/list"
                              else ("resourceTemplates", "uriTemplate"))
                slices = [(json.dumps({"jsonrpc": "2.0", "id": msg["id"]})[:-1]
                           + f', "result": {{"{field}": [').encode()]
                # generated as sent: this process is the ingress too
                for start in range(0, PAGE_RESOURCES, 2000):
                    slices.append(("," if start else "").encode() + ",".join(
                        f'{{"{key}": "h://r/{i}", "name": "r"}}'
                        for i in range(start, start + 2000)).encode())
                    if start + 2000 >= PAGE_RESOURCES:
                        slices.append(b"]}}")
                    piece = b"".join(slices)
                    # odd-sized: keys split between chunks
                    for at in range(0, len(piece) - 65_537 + 1, 65_537):
                        writer.write(f"{65_537:x}\r\n".encode() + piece[at:at + 65_537] + b"\r\n")
                    rest = piece[len(piece) - len(piece) % 65_537:]
                    slices = [rest] if rest else []
                    await writer.drain()
                if slices:
                    writer.write(f"{len(slices[0]):x}\r\n".encode() + slices[0] + b"\r\n")
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                continue
            elif msg["method"] == "resources/read":
                prefix = (json.dumps({"jsonrpc": "2.0", "id": msg["id"]})[:-1]
                          + ', "result": {"contents": [{"uri": "x", "text": "').encode()
                if uri == "demo://declared":  # Content-Length says 1 GB: refused before any byte
                    writer.write(base + f"content-length: {GB}\r\n\r\n".encode() + prefix)
                else:  # chunked, 1 GB, no length
                    writer.write(base + b"transfer-encoding: chunked\r\n\r\n")
                    writer.write(f"{len(prefix):x}\r\n".encode() + prefix + b"\r\n")
                    for _ in range(GB // MB):
                        writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                        await writer.drain()
                await writer.drain()
                return
            else:
                reply = json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                                    "error": {"code": -32601, "message": "no"}}).encode()
            writer.write(base + f"content-length: {len(reply)}\r\n\r\n".encode() + reply)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


@pytest.fixture
async def hostile_http() -> AsyncIterator[str]:
    server = await asyncio.start_server(_http_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.close()


async def _read_fails_malformed(client: Client, uri: str) -> str:
    with pytest.raises(MCPError) as err:
        await client.read_resource(uri)
    assert classify_error(err.value) == ReadOutcomeKind.MALFORMED, (err.value.code, err.value.message)
    assert "byte limit" in err.value.message
    return err.value.message


async def test_http_json_reply_of_a_gigabyte_is_bounded(hostile_http: str) -> None:
    cfg = ServerConfig(name="hostile", transport="http", url=hostile_http, max_content_bytes=MAX_CONTENT)
    before = _peak_mb()
    async with Client(server_transport(cfg, "alice"), mode="legacy", cache=None,  # type: ignore[arg-type]
                      read_timeout_seconds=20) as client:
        for uri in ("demo://streamed", "demo://declared"):
            await asyncio.wait_for(_read_fails_malformed(client, uri), 30)
            ok = await client.read_resource("demo://ok")
            assert ok.contents[0].text == "fine", (  # type: ignore[union-attr]
                "the session survives: nothing lost for the next read")
    assert _peak_mb() - before < 200, "the reply was never held whole"


async def test_http_json_pages_of_a_million_descriptors_are_bounded(hostile_http: str) -> None:
    """A resources/list page and a templates/list page of 1,000,000 descriptors each within the default
    byte limit (34 MB of 64 MB):
    refused as the URI count passes ``MAX_MESSAGE_URIS``, before anything is parsed."""
    cfg = ServerConfig(name="hostile", transport="http", url=hostile_http)  # the default max_content_bytes
    before = _peak_mb()
    async with Client(server_transport(cfg, "alice"), mode="legacy", cache=None,  # type: ignore[arg-type]
                      read_timeout_seconds=20) as client:
        for listing in (client.list_resources, client.list_resource_templates):
            with pytest.raises(MCPError) as err:
                await asyncio.wait_for(listing(), 30)
            assert f"more than {MAX_MESSAGE_URIS} URIs" in err.value.message, err.value.message
        ok = await client.read_resource("demo://ok")
        assert ok.contents[0].text == "fine", "the session survives"  # type: ignore[union-attr]
    assert _peak_mb() - before < 150, "the page was never parsed"


HOSTILE_STDIO = r'''
import json, sys
out = sys.stdout
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        out.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": INIT}) + "\n")
    elif msg["method"] == "resources/read" and msg["params"]["uri"] == "demo://ok":
        out.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                              "result": {"contents": [{"uri": "demo://ok", "text": "fine"}]}}) + "\n")
    elif msg["method"] == "resources/read":
        out.write('{"jsonrpc": "2.0", "id": %s, "result": {"contents": [{"uri": "x", "text": "'
                  % json.dumps(msg["id"]))
        chunk = "x" * (1024 * 1024)
        for _ in range(100):
            out.write(chunk)
        out.write('"}]}}\n')
    else:
        out.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                              "error": {"code": -32601, "message": "no"}}) + "\n")
    out.flush()
'''


async def test_stdio_line_of_a_hundred_megabytes_is_bounded(tmp_path: Path) -> None:
    script = tmp_path / "hostile_stdio.py"
    script.write_text(f"INIT = {INIT!r}\n" + HOSTILE_STDIO)
    cfg = ServerConfig(name="hostile", transport="stdio", command=[sys.executable, str(script)],
                       max_content_bytes=MAX_CONTENT)
    before = _peak_mb()
    client = Client(server_transport(cfg, "alice"), mode="legacy", cache=None,  # type: ignore[arg-type]
                    read_timeout_seconds=30)
    await client.__aenter__()
    try:
        message = await asyncio.wait_for(_read_fails_malformed(client, "demo://big"), 60)
        assert str(transport_limit(MAX_CONTENT)) in message
        ok = await client.read_resource("demo://ok")
        assert ok.contents[0].text == "fine", "the session survives"  # type: ignore[union-attr]
    finally:
        await client.__aexit__(None, None, None)
    assert _peak_mb() - before < 60, "a 100 MB line was never held"
