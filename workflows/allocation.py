"""Allocation idempotence: which ticket an allocation request gets before the fence's CAS.

Contract:
- Pure: ``prior_allocation`` reads the ``read_requests`` rows it needs through ``find(column, value)``
  and answers either the ticket an earlier allocation already holds (a retry) or the request id a
  new allocation takes. The SQL ledger (``activities/ledger/fence.py``) finds them with SELECTs under
  the row lock, the simulator's in-memory ledger in its tables; both then apply
  ``coverage.plan_allocate``.
- A retried read cycle (the same ``cycle_id``) gets the ticket it already holds, whatever its
  state: its accept, if it committed, replays. A request id asked again while its allocation is
  not completed gets the same ticket, with the notification count that allocation saw (not
  today's). A request id already used and completed (a reset run derived it again) is a new read
  with an id of its own, ``<id>/<ordinal>``, derived along the chain of completed ids.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from mcpsync.workflows.records.ledger import AllocateRequest, ReadTicket

__all__ = ["Find", "prior_allocation", "rederivations"]

Find = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]
"""(column, value) -> the ``read_requests`` row (by column name) whose ``cycle_id`` or
``request_id`` holds value, or None."""


def _ticket(held: Mapping[str, Any]) -> ReadTicket:
    return ReadTicket(granted=True, ordinal=held["ordinal"], request_id=held["request_id"],
                      notifications_seen=held["notifications_seen"])


async def prior_allocation(req: AllocateRequest, find: Find) -> ReadTicket | str:
    """The ticket an earlier allocation of this request holds, or the request id a new one takes."""
    if req.cycle_id is not None and (held := await find("cycle_id", req.cycle_id)) is not None:
        return _ticket(held)
    request_id = req.request_id
    while (prior := await find("request_id", request_id)) is not None:
        if prior["completed_at"] is None:
            return _ticket(prior)
        request_id = f"{request_id}/{prior['ordinal']}"
    return request_id


def rederivations(asked: str, taken: str) -> int:
    """How many completed allocations ``prior_allocation`` stepped past to go from the request id
    ``asked`` to the id ``taken`` (each appends ``/<ordinal>``): 0 for the id as asked."""
    return taken.count("/") - asked.count("/")
