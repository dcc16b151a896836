"""The seam through which activities report what they did, without importing the worker.

Contract:
- Activities receive a ``Meters`` (a constructor argument) and call only these methods; the
  worker passes its Prometheus implementation (``mcpsync.worker.observe.metrics.PROMETHEUS``), tools and tests
  may pass ``NO_METERS``. Dependencies point one way: workflows <- activities <- worker.
- A meter never raises into the activity and never sees a resource body (keys and verdicts only).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

from mcpsync.workflows.records.ledger import AcceptRequest, AcceptResult

__all__ = ["Meters", "NoMeters", "NO_METERS"]


class Meters(Protocol):
    def read_timer(self, server: str, request_id: str) -> AbstractContextManager[None]:
        """Around one ``resources/read``: count it, time it, remember when it was sent."""
        ...

    def receipt_judged(self, req: AcceptRequest, result: AcceptResult) -> None:
        """The ledger judged a read (verdict counts, convergence of the notifications it settles)."""
        ...


class NoMeters:
    """Measures nothing."""

    def read_timer(self, server: str, request_id: str) -> AbstractContextManager[None]:
        return nullcontext()

    def receipt_judged(self, req: AcceptRequest, result: AcceptResult) -> None:
        return None


NO_METERS: Meters = NoMeters()
