"""The ASGI gate in front of ``mcpsync serve``'s streamable-HTTP app: every request passes it first.

Contract, in the order checked (each refusal is a small JSON body, and nothing after it runs):
1. ``Host`` not allowed → 421 (Misdirected Request); ``Origin`` present and not allowed → 403. Both
   before the token is looked at: a DNS-rebinding page learns nothing, not even whether a token works.
   A request without ``Origin`` (a non-browser client) passes. ``HostRules`` says what is allowed.
2. An unknown or missing bearer token (any other scheme, ``Basic`` included) → 401.
3. A body over ``max_request_bytes`` → 413, declared (``Content-Length``) or chunked: the gate reads
   the body before the app does (at most the limit plus one chunk), so the app never sees a partial
   one.
4. The request goes on with ``scope["user"]`` naming its subject: the SDK's session manager binds
   each session to the subject that opened it and answers a request of another subject on that
   session (POST, GET, DELETE) exactly as for an unknown session (404), without saying it exists.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["Gate", "HostRules", "default_hosts", "default_origins"]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
_HOST = re.compile(r"(\[[^\]]*\]|[^:]*)(?::\d+)?")  # a Host value: its name, then an optional port


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1", "[::1]") or host.startswith("127.")


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def default_hosts(bind: str, port: int) -> tuple[str, ...]:
    """The Host values allowed without ``--allowed-host``: the bind address and its port, plus the
    localhost names on that port for a loopback bind."""
    names = [_bracketed(bind), *(LOOPBACK_NAMES if _is_loopback(bind) else ())]
    return tuple(dict.fromkeys(f"{name}:{port}" for name in names))


def default_origins(bind: str, port: int) -> tuple[str, ...]:
    """The Origin values allowed without ``--allowed-origin``: ``http://`` + each default host."""
    return tuple(f"http://{host}" for host in default_hosts(bind, port))


@dataclass(frozen=True, slots=True)
class HostRules:
    """Allowed ``Host`` values (``host:port``, or ``host`` for any port) and ``Origin`` values
    (``scheme://host[:port]``), compared case-insensitively."""

    hosts: frozenset[str]
    origins: frozenset[str]

    @classmethod
    def of(cls, hosts: tuple[str, ...], origins: tuple[str, ...]) -> HostRules:
        return cls(frozenset(h.lower() for h in hosts), frozenset(o.lower().rstrip("/") for o in origins))

    def host_allowed(self, host: bytes | None) -> bool:
        if not host:
            return False
        value = host.decode("latin-1").strip().lower()
        named = _HOST.fullmatch(value)
        return value in self.hosts or (named is not None and named.group(1) in self.hosts)

    def origin_allowed(self, origin: bytes | None) -> bool:
        return origin is None or origin.decode("latin-1").strip().lower().rstrip("/") in self.origins


async def reply(send: Send, status: int, error: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": error}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})


class Gate:
    """The checks of the module contract, then ``app``."""

    def __init__(self, app: ASGIApp, *, rules: HostRules, subject_for: Callable[[str | None], str | None],
                 max_request_bytes: int) -> None:
        self.app = app
        self.rules = rules
        self.subject_for = subject_for
        self.limit = max_request_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)  # the first of repeated headers, as Starlette reads them
        if not self.rules.host_allowed(headers.get(b"host")):
            await reply(send, 421, "misdirected request: this Host is not served here")
            return
        if not self.rules.origin_allowed(headers.get(b"origin")):
            await reply(send, 403, "forbidden: this Origin is not allowed")
            return
        auth = headers.get(b"authorization")
        subject = self.subject_for(auth.decode("latin-1") if auth is not None else None)
        if subject is None:
            await reply(send, 401, "unauthorized: unknown or missing bearer token",
                        [(b"www-authenticate", b'Bearer realm="mcpsync-serve"')])
            return
        length = headers.get(b"content-length")  # h11 has refused a malformed one already
        if length is not None and length.strip().isdigit() and int(length) > self.limit:
            await reply(send, 413, f"request body over {self.limit} bytes")
            return
        if length is not None or b"transfer-encoding" in headers:
            body = await self._body(receive)
            if body is None:
                await reply(send, 413, f"request body over {self.limit} bytes")
                return
            receive = _replay(body, receive)
        # The SDK compares (client_id, issuer, subject) of a session's requests with its opener's.
        scope["user"] = AuthenticatedUser(
            AccessToken(token="", client_id=subject, scopes=[], subject=subject)
        )
        await self.app(scope, receive, send)

    async def _body(self, receive: Receive) -> bytes | None:
        """The whole request body, or None once it is over the limit (the rest is not read)."""
        parts: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(parts)  # the client went away: the app sees a short body and the disconnect
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.limit:
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
