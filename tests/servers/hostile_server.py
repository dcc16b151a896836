"""A hostile stdio MCP server (edition 2025-11-25) for the transport and string bounds at full scale.

Everything hostile is generated here and streamed to stdout, never built whole in either process.
It serves one well-behaved resource, ``hostile://ok`` ("revision N"; subscribable), and takes its
orders from files the test drops into the control directory (``argv[1]``), polled every 20 ms:

- ``flood.json`` {"tag", "count", "size", "unknown"}: ``count`` updated notifications for unique
  URIs of ``size`` characters each, then ``unknown`` well-formed URIs nobody subscribed to. Halfway
  through the flood ``hostile://ok`` changes and is notified (an edit during the flood). Writes
  ``flood.done`` after the last line.
- ``bump``: ``hostile://ok`` changes and is notified (an edit after the flood).

``resources/list`` answers one page of ``PAGE_RESOURCES`` (default 1,000,000) descriptors, streamed.

``hostile://bomb`` answers with ``BOMB_BYTES`` (default 60 MB) of ``[],[],...`` inside ``_meta``: valid
JSON, under the default byte limit, about 20 million values; each read of it appends a line to
``reads-bomb-<label>`` in the control directory.

``hostile_server.py CTL --http`` serves the same over streamable HTTP (edition 2025-11-25, no session
id) on a free port it writes to ``CTL/port``: ``/json`` answers in ``application/json``, ``/sse`` in
``text/event-stream`` (one event per answer); the label is ``json``, ``sse`` or ``stdio``.
"""

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import chain

CTL = sys.argv[1]
PAGE_RESOURCES = int(os.environ.get("HOSTILE_PAGE_RESOURCES", "1000000"))
BOMB_BYTES = int(os.environ.get("HOSTILE_BOMB_BYTES", str(60 * 1000 * 1000)))
BOMB = "hostile://bomb"
INIT = {"protocolVersion": "2025-11-25", "serverInfo": {"name": "hostile", "version": "1"},
        "capabilities": {"resources": {"subscribe": True, "listChanged": False}}}
OK = "hostile://ok"
lock = threading.Lock()
revision = 1


def send_raw(text: str) -> None:
    with lock:
        sys.stdout.write(text)
        sys.stdout.flush()


def send(obj: object) -> None:
    send_raw(json.dumps(obj) + "\n")


def updated(uri: str) -> str:
    return json.dumps({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                       "params": {"uri": uri}}) + "\n"


def bump() -> None:
    global revision
    revision += 1
    send_raw(updated(OK))


def flood(spec: dict) -> None:
    tag, count, size = spec["tag"], spec["count"], spec["size"]
    # The same line as updated(uri), built by concatenation: the URI is ASCII that JSON does not
    # escape, and json.dumps of 1 GB of URIs would make this server, not the ingress, the bottleneck.
    before, after = updated("\0").split("\\u0000")
    filler = "a" * size
    for i in range(count):
        head = f"hostile://huge/{tag}/{i:06d}/"
        send_raw(before + head + filler[:size - len(head)] + after)
        if i == count // 2:
            bump()
    for i in range(spec.get("unknown", 0)):
        send_raw(updated(f"hostile://nobody/{tag}/{i}"))
    with open(os.path.join(CTL, "flood.done"), "w") as f:
        f.write(str(count))


def control() -> None:
    while True:
        time.sleep(0.02)
        path = os.path.join(CTL, "flood.json")
        if os.path.exists(path):
            with open(path) as f:
                spec = json.load(f)
            os.unlink(path)
            flood(spec)
        path = os.path.join(CTL, "bump")
        if os.path.exists(path):
            os.unlink(path)
            bump()


def page(rid: object) -> None:
    """One resources/list page of PAGE_RESOURCES descriptors, written in slices of 10,000."""
    with lock:
        sys.stdout.write('{"jsonrpc": "2.0", "id": ' + json.dumps(rid) + ', "result": {"resources": [')
        for start in range(0, PAGE_RESOURCES, 10_000):
            stop = min(start + 10_000, PAGE_RESOURCES)
            sep = "," if start else ""
            sys.stdout.write(sep + ",".join(f'{{"uri": "hostile://r/{i}", "name": "r"}}'
                                            for i in range(start, stop)))
        sys.stdout.write("]}}\n")
        sys.stdout.flush()


def bomb(rid: object, label: str) -> Iterator[str]:
    """A read result of BOMB_BYTES of ``[],`` inside ``_meta``, in slices of 1 MB."""
    with open(os.path.join(CTL, f"reads-bomb-{label}"), "a") as f:
        f.write("read\n")
    yield ('{"jsonrpc": "2.0", "id": ' + json.dumps(rid) + ', "result": {"contents": [{"uri": "' + BOMB
           + '", "text": "x"}], "_meta": {"bomb": [')
    piece = "[]," * 333_333
    for _ in range(BOMB_BYTES // len(piece)):
        yield piece
    yield "[]]}}}"


def answer(msg: dict, label: str) -> object:
    """The answer to one request: a JSON-RPC object, or an iterator of text (a streamed answer)."""
    method, rid = msg.get("method"), msg.get("id")
    if method == "initialize":
        return {"jsonrpc": "2.0", "id": rid, "result": INIT}
    if method == "ping" or method in ("resources/subscribe", "resources/unsubscribe"):
        return {"jsonrpc": "2.0", "id": rid, "result": {}}
    if method == "resources/read":
        uri = msg.get("params", {}).get("uri", "")
        if uri == BOMB:
            return bomb(rid, label)
        return {"jsonrpc": "2.0", "id": rid, "result": {
            "contents": [{"uri": uri, "mimeType": "text/plain", "text": f"revision {revision}"}]}}
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no {method}"}}


class Http(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        msg = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        if "id" not in msg:
            self.send_response(202)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        sse = self.path == "/sse"
        out = answer(msg, self.path.strip("/"))
        pieces = [json.dumps(out)] if isinstance(out, dict) else out
        self.send_response(200)
        self.send_header("content-type", "text/event-stream" if sse else "application/json")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        if sse:
            pieces = chain(["event: message\ndata: "], pieces, ["\n\n"])
        try:
            for piece in pieces:
                data = piece.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self) -> None:
        self.send_response(405)
        self.send_header("content-length", "0")
        self.end_headers()

    do_DELETE = do_GET


if "--http" in sys.argv:
    http = ThreadingHTTPServer(("127.0.0.1", 0), Http)
    with open(os.path.join(CTL, "port.tmp"), "w") as f:
        f.write(str(http.server_address[1]))
    os.replace(os.path.join(CTL, "port.tmp"), os.path.join(CTL, "port"))
    http.serve_forever()

threading.Thread(target=control, daemon=True).start()
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        continue
    if method == "resources/list":
        page(rid)
        continue
    out = answer(msg, "stdio")
    if isinstance(out, dict):
        send(out)
    else:
        with lock:
            for piece in out:
                sys.stdout.write(piece)
            sys.stdout.write("\n")
            sys.stdout.flush()
