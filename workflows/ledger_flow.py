"""The fence row's simple transitions and the ledger's ``read_requests`` lookups, for both ledgers.

Contract:
- Pure. The PostgreSQL ledger (``activities/ledger_fence.py``) and the simulator's in-memory one
  (``sim/ledger.py``) run these and no copy of them: a transition rule takes the locked row and
  answers the columns its compare-and-set writes (``{}``: refused, nothing written); a
  ``read_requests`` row is read by its column names, whichever store holds it.
- Rows are never moved backwards or out of a closing state: CLOSED and UNSUBSCRIBE_UNKNOWN never
  reopen in their incarnation, and a closing row keeps the incarnation that closes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from mcpsync.workflows.allocation import ByCycle, HeldRequest, allocation_steps
from mcpsync.workflows.ledger_rules import IssuedRead
from mcpsync.workflows.records.ledger import AcceptVerdict, AllocateRequest, FenceSnapshot, ReadTicket
from mcpsync.workflows.records.subscription import CLOSING_STATES, TERMINAL_STATES, SubscriptionState

__all__ = ["SUBSCRIBABLE_STATES", "begin_writes", "ensure_writes", "finish_unsubscribe_writes", "issued_read",
           "mark_active_writes", "prior_allocation", "set_state_writes"]

S = SubscriptionState
SUBSCRIBABLE_STATES = frozenset({S.DISCOVERED, S.SUBSCRIBING, S.ACTIVE, S.TOMBSTONE_PENDING,
                                 S.RECONCILIATION_REQUIRED})
"""The states from which (re)subscribing is allowed."""
_VERDICTS = {v.value for v in AcceptVerdict}


def ensure_writes(row: FenceSnapshot, *, held: str, incarnation: str) -> dict[str, Any]:
    """``ensure_subscription`` on an existing row holding incarnation ``held``. A finished row
    (``TERMINAL_STATES``) reopens to DISCOVERED (ordinals and epochs kept) only for a new incarnation:
    the chain that closed it, reset or not, finds it closed. The reopened row has no current digest:
    consumers were told ``closed`` (or ``tombstoned``, ``revoked``), so the new incarnation's first
    read publishes ``version_accepted`` again, even for the same bytes."""
    writes: dict[str, Any] = {}
    if held != incarnation and row.state in TERMINAL_STATES:
        writes = {"state": S.DISCOVERED, "close_ordinal": None, "last_accepted_digest": None}
    if held != incarnation and writes.get("state", row.state) not in CLOSING_STATES:
        writes["incarnation"] = incarnation
    return writes


def begin_writes(row: FenceSnapshot, session_generation: int) -> dict[str, Any]:
    """``begin_subscription``: SUBSCRIBING with subscription generation + 1 bound to
    ``session_generation``; refused when the row is closing or closed, or when the session
    generation would go backwards."""
    if row.state not in SUBSCRIBABLE_STATES or row.session_generation > session_generation:
        return {}
    return {"state": S.SUBSCRIBING, "session_generation": session_generation,
            "subscription_generation": row.subscription_generation + 1}


def mark_active_writes(row: FenceSnapshot, session_generation: int, subscription_generation: int, *,
                       read_reports: bool, safety_read_seconds: float | None) -> dict[str, Any]:
    """``mark_active``: ACTIVE, from SUBSCRIBING on exactly these generations. ``read_reports`` (the
    run mirrors reads the ingress makes) and ``safety_read_seconds`` (the period the ingress's
    resync reads by) are set or cleared with the transition."""
    if (row.state != S.SUBSCRIBING or row.session_generation != session_generation
            or row.subscription_generation != subscription_generation):
        return {}
    return {"state": S.ACTIVE, "read_reports": read_reports, "safety_read_seconds": safety_read_seconds}


def set_state_writes(row: FenceSnapshot, state: SubscriptionState,
                     allowed_from: Iterable[SubscriptionState]) -> dict[str, Any]:
    return {"state": state} if row.state in set(allowed_from) else {}


def finish_unsubscribe_writes(row: FenceSnapshot, *, acked: bool) -> dict[str, Any]:
    """UNSUBSCRIBING -> CLOSED (ack) or UNSUBSCRIBE_UNKNOWN (lost or failed ack). Never reopens."""
    return set_state_writes(row, S.CLOSED if acked else S.UNSUBSCRIBE_UNKNOWN, [S.UNSUBSCRIBING])


def issued_read(row: Mapping[str, Any] | None) -> IssuedRead | None:
    """The ``read_requests`` row of a read (None: the fence never issued it), as ``judge_read`` takes it."""
    if row is None:
        return None
    outcome = row["outcome"]
    return IssuedRead(ordinal=row["ordinal"], request_id=row["request_id"],
                      session_generation=row["session_generation"],
                      subscription_generation=row["subscription_generation"],
                      completed_verdict=AcceptVerdict(outcome) if outcome in _VERDICTS else None,
                      in_cycle=row["cycle_id"] is not None, notified=row["notifications_seen"])


Find = Callable[[str, str], Awaitable[Mapping[str, Any] | None]]


async def prior_allocation(req: AllocateRequest, find: Find) -> ReadTicket | str:
    """``allocation.allocation_steps`` answered by ``find(column, value)``: the ``read_requests`` row
    whose ``cycle_id`` or ``request_id`` column holds ``value``, or None. The ticket an earlier
    allocation of ``req`` holds (a retry), or the request id a new allocation takes."""
    steps = allocation_steps(req)
    held: HeldRequest | None = None
    while True:
        try:
            ask = steps.send(held)
        except StopIteration as stop:
            decided: ReadTicket | str = stop.value
            return decided
        found = await (find("cycle_id", ask.cycle_id) if isinstance(ask, ByCycle)
                       else find("request_id", ask.request_id))
        held = None if found is None else HeldRequest(
            ordinal=found["ordinal"], request_id=found["request_id"],
            completed=found["completed_at"] is not None, notified=found["notifications_seen"])
