"""The fixture's HTTP listener (``fixture/serving.py``): uvicorn on httptools' C parser."""

from __future__ import annotations

import socket

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mcpsync.fixture import serving


async def _app(scope: object, receive: object, send: object) -> None:  # an ASGI app that serves nothing
    return None


def test_the_fixture_parses_http_with_httptools() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        server = serving._uvicorn(_app, sock, lifespan="off")
        server.config.load()
        assert server.config.http_protocol_class is HttpToolsProtocol
