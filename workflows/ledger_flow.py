"""The fence row's simple transitions and its ``read_requests`` rows as the rules see them, for both ledgers.

Contract: pure. The PostgreSQL ledger (``activities/ledger/fence.py``) and the simulator's in-memory
one (``sim/ledger.py``) run these and no copy of them: a transition rule takes the locked row and the
activity's request and answers the columns its compare-and-set writes (``{}``: refused, nothing
written); a ``read_requests`` row is read by its column names, whichever store holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mcpsync.workflows.ledger_rules import IssuedRead
from mcpsync.workflows.records.ledger import (
    AcceptVerdict,
    BeginSubscriptionRequest,
    FenceSnapshot,
    FinishUnsubscribeRequest,
    MarkActiveRequest,
    SetStateRequest,
)
from mcpsync.workflows.records.subscription import CLOSING_STATES, TERMINAL_STATES, SubscriptionState

__all__ = ["SUBSCRIBABLE_STATES", "begin_writes", "begins_at_start", "ensure_writes",
           "finish_unsubscribe_writes", "issued_read", "mark_active_writes", "set_state_writes"]

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
    read publishes ``version_accepted`` again, even for the same bytes. A closing row keeps the
    incarnation that closes it."""
    writes: dict[str, Any] = {}
    if held != incarnation and row.state in TERMINAL_STATES:
        writes = {"state": S.DISCOVERED, "close_ordinal": None, "last_accepted_digest": None}
    if held != incarnation and writes.get("state", row.state) not in CLOSING_STATES:
        writes["incarnation"] = incarnation
    return writes


def begins_at_start(row: FenceSnapshot) -> bool:
    """A row a new run subscribes at once (``Act.START_SUBSCRIPTION`` begins on it): DISCOVERED, i.e.
    new or reopened for this incarnation; on any other row the run decides after loading it."""
    return row.state == S.DISCOVERED


def begin_writes(row: FenceSnapshot, req: BeginSubscriptionRequest) -> dict[str, Any]:
    """SUBSCRIBING with subscription generation + 1 bound to the session generation; refused when
    the row is closing or finished, or when the session generation would go backwards."""
    if row.state not in SUBSCRIBABLE_STATES or row.session_generation > req.session_generation:
        return {}
    return {"state": S.SUBSCRIBING, "session_generation": req.session_generation,
            "subscription_generation": row.subscription_generation + 1}


def mark_active_writes(row: FenceSnapshot, req: MarkActiveRequest) -> dict[str, Any]:
    """ACTIVE, from SUBSCRIBING on exactly the request's generations; ``read_reports`` and
    ``safety_read_seconds`` are set or cleared with the transition."""
    if (row.state != S.SUBSCRIBING or row.session_generation != req.session_generation
            or row.subscription_generation != req.subscription_generation):
        return {}
    return {"state": S.ACTIVE, "read_reports": req.read_reports,
            "safety_read_seconds": req.safety_read_seconds}


def set_state_writes(row: FenceSnapshot, req: SetStateRequest) -> dict[str, Any]:
    return {"state": req.state} if row.state in set(req.allowed_from) else {}


def finish_unsubscribe_writes(row: FenceSnapshot, req: FinishUnsubscribeRequest) -> dict[str, Any]:
    """UNSUBSCRIBING -> CLOSED (ack) or UNSUBSCRIBE_UNKNOWN (lost or failed ack). Never reopens."""
    return {"state": S.CLOSED if req.acked else S.UNSUBSCRIBE_UNKNOWN} if row.state == S.UNSUBSCRIBING else {}


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

