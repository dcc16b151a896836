"""Allocation idempotence: which ticket an allocation request gets before the fence's CAS.

Contract:
- Pure: ``allocation_steps`` asks for the ``read_requests`` rows it needs (``ByCycle``,
  ``ByRequestId``) and answers either the ticket an earlier allocation already holds (a retry) or
  the request id a new allocation takes. The SQL ledger (``activities/ledger_fence.py``) answers the
  asks with SELECTs under the row lock, the simulator's in-memory ledger from its tables; both then
  apply ``coverage.plan_allocate``.
- A retried read cycle (the same ``cycle_id``) gets the ticket it already holds, whatever its
  state: its accept, if it committed, replays. A request id asked again while its allocation is
  not completed gets the same ticket, with the notification count that allocation saw (not
  today's). A request id already used and completed (a reset run derived it again) is a new read
  with an id of its own, ``<id>/<ordinal>``, derived along the chain of completed ids.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass

from mcpsync.workflows.records.ledger import AllocateRequest, ReadTicket

__all__ = ["ByCycle", "HeldRequest", "allocation_steps"]


@dataclass(frozen=True, slots=True)
class ByCycle:
    """The ``read_requests`` row whose ``cycle_id`` is this -> ``HeldRequest | None``."""

    cycle_id: str


@dataclass(frozen=True, slots=True)
class ByRequestId:
    """The ``read_requests`` row whose ``request_id`` is this -> ``HeldRequest | None``."""

    request_id: str


@dataclass(frozen=True, slots=True)
class HeldRequest:
    ordinal: int
    request_id: str
    completed: bool  # completed_at IS NOT NULL
    notified: int  # read_requests.notifications_seen: the row's count at that allocation


def _ticket(held: HeldRequest) -> ReadTicket:
    return ReadTicket(granted=True, ordinal=held.ordinal, request_id=held.request_id,
                      notifications_seen=held.notified)


def allocation_steps(req: AllocateRequest) -> Generator[ByCycle | ByRequestId, HeldRequest | None,
                                                        ReadTicket | str]:
    """The ticket an earlier allocation of this request holds, or the request id a new one takes."""
    if req.cycle_id is not None:
        held = yield ByCycle(req.cycle_id)
        if held is not None:
            return _ticket(held)
    request_id = req.request_id
    while (prior := (yield ByRequestId(request_id))) is not None:
        if not prior.completed:
            return _ticket(prior)
        request_id = f"{request_id}/{prior.ordinal}"
    return request_id
