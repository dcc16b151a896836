"""Connection bounds of ``mcpsync serve``'s HTTP listener (uvicorn's h11 protocol, bounded).

Contract:
- ``header_timeout`` seconds: a request's head (request line and headers) must be complete that long
  after the connection opens, or after the first byte of a later request on a kept-alive connection;
  otherwise the connection is closed. uvicorn alone bounds only the idle time between requests
  (``timeout_keep_alive``), not a head sent one byte at a time. A response in progress (an SSE stream
  included) is not timed: the head was complete.
- ``max_connections``: open connections at most, whatever their state; one more is answered
  ``503`` with ``Connection: close`` and closed at once, so established clients keep working.
- A head larger than h11's incomplete-event bound (``MAX_HEAD_BYTES``) is 400 (h11's own answer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["MAX_HEAD_BYTES", "bounded_protocol"]

logger = logging.getLogger("mcpsync.serve")

MAX_HEAD_BYTES = 16 * 1024
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
         b"content-length: 38\r\n\r\n{\"error\":\"too many open connections\"}\n")


_REFUSALS = {"count": 0, "logged_at": float("-inf")}
_LOG_EVERY = 10.0  # seconds between warnings about refused connections: a flood is one line per period


def _refused() -> None:
    _REFUSALS["count"] += 1
    now = time.monotonic()
    if now - _REFUSALS["logged_at"] >= _LOG_EVERY:
        logger.warning("%d connection(s) refused at the --max-connections cap", _REFUSALS["count"])
        _REFUSALS["count"], _REFUSALS["logged_at"] = 0, now


def bounded_protocol(header_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the bounds of the module contract."""

    class Bounded(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            if len(self.connections) >= max_connections:
                transport.write(_BUSY)
                transport.close()
                self.transport = transport
                _refused()
                return
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self in self.connections:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self._arm()  # a head in progress (a later request's, after a response): timed from now
            else:
                self._disarm()

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout, self._head_late)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_late(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return Bounded
