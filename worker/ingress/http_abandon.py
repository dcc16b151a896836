"""A streamable-HTTP request the client abandons releases its connection and task at once.

The SDK answers a request that times out (-32001) or whose caller is cancelled with a courtesy
``notifications/cancelled``. On the 2026-07-28 edition its transport then aborts the request's
POST; below it (2025-11-25) it only sends the notification and leaves the POST waiting for an answer
that may never come: one connection and one task per abandoned request until the server answers or
the read timeout (300 s) ends it. A session's pool holds ``HTTP_CONNECTIONS`` connections, so a
server that never answers stalls the session after that many timeouts: every later request, the
courtesy cancels too, waits for a connection.

Contract:
- ``install()`` makes the SDK's ``streamable_http_client`` use ``ReleasingTransport``: the courtesy
  cancel for a request whose POST is in flight aborts that POST (its connection closes, its task
  ends) on every edition, and the closed connection is the server's cancellation, as on
  2026-07-28: the frame is not POSTed. (POSTed, it would wait for a connection behind every
  request still queued for one, and the SDK sends it inline: the session's writer would stall.)
  A cancel for a request that is no longer in flight goes out as the SDK sends it. Nothing else
  changes: the request's caller already got its error.
"""

from __future__ import annotations

import mcp.client.streamable_http as streamable_http
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCNotification

__all__ = ["ReleasingTransport", "install"]


class ReleasingTransport(streamable_http.StreamableHTTPTransport):
    """``StreamableHTTPTransport`` whose courtesy cancel aborts the cancelled request's POST."""

    def _consume_modern_cancellation(self, session_message: SessionMessage) -> bool:
        message = session_message.message
        if isinstance(message, JSONRPCNotification) and message.method == "notifications/cancelled":
            request_id = cancelled_request_id_from_params(message.params)
            post = self._in_flight_posts.get(request_id) if request_id is not None else None
            if post is not None:
                post.scope.cancel()
                return True
        return super()._consume_modern_cancellation(session_message)


def install() -> None:
    """Make the SDK's streamable HTTP client use ``ReleasingTransport`` (it looks the name up when
    called)."""
    streamable_http.StreamableHTTPTransport = ReleasingTransport  # type: ignore[misc]
