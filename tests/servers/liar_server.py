"""A raw JSON-RPC stdio MCP server that misbehaves on purpose (edition 2025-11-25).

It answers the handshake correctly, then: writes non-JSON lines and frames with wrong types
between valid messages, returns read results with wrong types for ``liar://wrong-types``, a
blob declared text/plain that is not text for ``liar://binary-as-text``, and honest content
for ``liar://ok`` (whose body changes on every read of ``liar://bump``).
"""

import base64
import json
import sys

revision = 0


def send(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def garbage() -> None:
    sys.stdout.write("}{ this is not JSON-RPC\n")
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                                 "params": {"uri": 42}}) + "\n")
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": "never-asked", "result": {"x": 1}}) + "\n")
    sys.stdout.flush()


def read_result(uri: str) -> dict:
    if uri == "liar://wrong-types":
        return {"contents": "not a list"}
    if uri == "liar://binary-as-text":
        return {"contents": [{"uri": uri, "mimeType": "text/plain",
                              "blob": base64.b64encode(b"\xff\xfe\x00\x81bin").decode()}]}
    return {"contents": [{"uri": uri, "mimeType": "text/plain", "text": f"honest revision {revision}"}]}


for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        continue
    if method == "initialize":
        # Lifecycle misuse: a notification before the handshake has even been answered.
        send({"jsonrpc": "2.0", "method": "notifications/resources/updated", "params": {"uri": "liar://ok"}})
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": "2025-11-25", "serverInfo": {"name": "liar", "version": "1"},
            "capabilities": {"resources": {"subscribe": True, "listChanged": False}}}})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
    elif method in ("resources/subscribe", "resources/unsubscribe"):
        garbage()
        send({"jsonrpc": "2.0", "id": rid, "result": {}})
    elif method == "resources/read":
        uri = msg.get("params", {}).get("uri", "")
        if uri == "liar://bump":
            revision += 1
            send({"jsonrpc": "2.0", "method": "notifications/resources/updated",
                  "params": {"uri": "liar://ok"}})
        garbage()
        send({"jsonrpc": "2.0", "id": rid, "result": read_result(uri)})
    elif method == "resources/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"resources": [
            {"uri": u, "name": u} for u in ("liar://ok", "liar://wrong-types", "liar://binary-as-text")]}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no {method}"}})
