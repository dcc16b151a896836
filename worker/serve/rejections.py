"""Guardrail rejections reach ``mcpsync serve``'s clients: a version the guardrail refuses is announced.

Contract:
- A read the guardrail rejects writes a GUARDRAIL_REJECTED receipt and audit row (with the reason),
  and no outbox event: the older accepted version stays in the ledger, but it is not current, so
  serve refuses reads (-32003 with the reason, ``activities/ledger/serve.py``). ``follow_rejections`` tells
  the subscribed clients: from the newest GUARDRAIL_REJECTED audit row at its start it looks for
  newer ones every ``POLL_SECONDS`` (the ``audit (kind, audit_id)`` index) and announces
  ``notifications/resources/updated`` for each (subject, URI) (``ServeHub.announce_updated``), so a
  host re-reads and learns that its cached body is not current.
- Not durable: a rejection while serve is down is not announced later; a client that connects
  afterwards reads (subscribing announces the current state too) and is refused with the reason.
- The reason is the guardrail's (a size, a MIME type, a charset): never a body.
"""

from __future__ import annotations

import asyncio
import logging

from mcpsync.activities.ledger.serve import newest_rejection, rejections_after
from mcpsync.worker.serve.server import ServeHub

__all__ = ["POLL_SECONDS", "follow_rejections"]

logger = logging.getLogger("mcpsync.serve")

POLL_SECONDS = 0.25
_BATCH = 1000


async def follow_rejections(hub: ServeHub) -> None:
    """Announce every guardrail rejection recorded after the start to the subject's subscribed clients."""
    mark: int | None = None
    while True:
        try:
            if mark is None:
                mark = await newest_rejection(hub.pool)
            rows = await rejections_after(hub.pool, mark, limit=_BATCH)
            for audit_id, subject, uri in rows:
                await hub.announce_updated(subject, uri)
                mark = audit_id
            if len(rows) < _BATCH:
                await asyncio.sleep(POLL_SECONDS)
        except asyncio.CancelledError:
            raise
        except Exception:  # the database went away for a moment: look again from the same mark
            logger.warning("guardrail rejection follower failed; retrying in 1 s")
            await asyncio.sleep(1.0)
