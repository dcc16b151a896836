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
"""

import json
import os
import sys
import threading
import time

CTL = sys.argv[1]
PAGE_RESOURCES = int(os.environ.get("HOSTILE_PAGE_RESOURCES", "1000000"))
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


threading.Thread(target=control, daemon=True).start()
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": "2025-11-25", "serverInfo": {"name": "hostile", "version": "1"},
            "capabilities": {"resources": {"subscribe": True, "listChanged": False}}}})
    elif method == "ping" or method in ("resources/subscribe", "resources/unsubscribe"):
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
    elif method == "resources/read":
        uri = msg.get("params", {}).get("uri", "")
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "contents": [{"uri": uri, "mimeType": "text/plain", "text": f"revision {revision}"}]}})
    elif method == "resources/list":
        page(rid)
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no {method}"}})
