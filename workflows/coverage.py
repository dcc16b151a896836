"""Level-based coverage, owned by the ledger row (docs/decisions/0002-level-based-coverage.md).

The fence row counts notifications (``notifications_seen``, called *notified* here) and records
``covered``: the ``notified`` value at the allocation of the newest judged read that observed the
resource (ACCEPTED, UNCHANGED, TOMBSTONE_PENDING, GUARDRAIL_REJECTED). The row is **dirty** while
``notified > covered``. A read allocated after a notification was recorded observes its change: the
server sent the notification after the change, the ingress recorded it before the allocation, and
the read is sent after the allocation. So the allocation's ``notified`` says exactly which
notifications the read covers. A read that fails, is lost, refused or superseded sets nothing: the
row stays dirty. No clock decides coverage. A read nobody notified (the workflow's own safety read,
the ingress's sweep, whose note only looks the row up: ``plan_note``'s work, nothing written) is no
notification either: it covers what the row counted at its allocation.

Pure write plans over the locked row (``FenceSnapshot``): the SQL ledger
(``activities/ledger/fence.py``) and the simulator's in-memory ledger (``sim/``) both apply them.
"""

from __future__ import annotations

from pydantic import BaseModel

from mcpsync.workflows.ledger_rules import marked_active
from mcpsync.workflows.records.base import replaced
from mcpsync.workflows.records.ledger import AcceptVerdict, FenceSnapshot
from mcpsync.workflows.records.subscription import SubscriptionState

__all__ = ["dirty", "NotePlan", "plan_note", "plan_allocate", "covered_after", "follow_up_owed"]

OBSERVED = frozenset({AcceptVerdict.ACCEPTED, AcceptVerdict.UNCHANGED, AcceptVerdict.TOMBSTONE_PENDING,
                      AcceptVerdict.GUARDRAIL_REJECTED})
"""Verdicts of a read that observed the resource: only these advance ``covered``. A guardrail
rejection observed the content too (it moves the fence position; the previous version stays
current): reading it again for the same notifications would be rejected the same way."""


def dirty(row: FenceSnapshot) -> bool:
    """A notification was recorded that no judged read observing the resource covers yet."""
    return row.exists and row.notifications_seen > row.covered


class NotePlan(BaseModel):
    """``note_notification``'s write (``notifications_seen`` := ``notified``) and whether the
    notification creates work: it made the row dirty, or a read allocated before it may be in
    flight (``allocated_sequence > covered``: the newest allocation is not confirmed as covering),
    or the row is not ACTIVE on the notification's session generation (its workflow learns that
    from the read it then tries or the resubscribe; a notification from an older session is not
    counted). Otherwise the work is owned already: the notification that made the row dirty created
    it, and the read it earns is allocated later, so it covers this one too."""

    model_config = {"frozen": True}

    notified: int
    work: bool

    def applied(self, row: FenceSnapshot) -> FenceSnapshot:
        """The row after the note's write."""
        return replaced(row, {"notifications_seen": self.notified})


def plan_note(row: FenceSnapshot, *, generation: int) -> NotePlan:
    if generation < row.session_generation:
        # From a session the row has left: it says nothing about the current one and is not counted
        # (a count nobody reads would leave the row dirty with no owner); the workflow audits it.
        return NotePlan(notified=row.notifications_seen, work=True)
    notified = row.notifications_seen + 1
    was_clean = row.notifications_seen <= row.covered
    in_flight = row.allocated_sequence > row.covered
    elsewhere = row.state != SubscriptionState.ACTIVE or row.session_generation != generation
    return NotePlan(notified=notified, work=was_clean or in_flight or elsewhere)


class AllocatePlan(BaseModel):
    """A granted allocation: the ordinal, and ``notified`` (the row's count now, stored with the
    read request): the notifications that read covers if it observes the resource."""

    model_config = {"frozen": True}

    ordinal: int
    notified: int

    def columns(self) -> dict[str, int]:
        """The allocation's write to the row: column -> new value."""
        return {"last_issued_ordinal": self.ordinal, "allocated_sequence": self.notified}

    def applied(self, row: FenceSnapshot) -> FenceSnapshot:
        return replaced(row, self.columns())


def plan_allocate(row: FenceSnapshot, *, session_generation: int, subscription_generation: int,
                  min_ordinal: int) -> AllocatePlan | None:
    """The allocation CAS (None: refused, the row is not ACTIVE on these generations). The row then
    holds ``last_issued_ordinal`` := ``ordinal`` and ``allocated_sequence`` := ``notified``."""
    if not marked_active(row, session_generation=session_generation,
                         subscription_generation=subscription_generation):
        return None
    return AllocatePlan(ordinal=max(row.last_issued_ordinal + 1, min_ordinal),
                        notified=row.notifications_seen)


def covered_after(row: FenceSnapshot, verdict: AcceptVerdict, read_notified: int) -> int | None:
    """The accept's write of ``covered`` for a read that covers ``read_notified`` notifications (its
    allocation's count, plus those the ingress absorbed into it, counted by this accept): the larger
    of the row's and the read's when the verdict observed the resource (it never moves back); None:
    no write."""
    if verdict not in OBSERVED or read_notified <= row.covered:
        return None
    return read_notified


def follow_up_owed(notified: int, covered: int, read_notified: int, *, handed_over: bool,
                   for_notifications: bool) -> bool:
    """After a judged read (allocated at ``read_notified``; the row now at ``notified`` / ``covered``),
    whether the workflow owes a FOLLOW_UP read: the row is dirty and the work is the workflow's.
    - A read the ingress made and reported (``handed_over``) leaves whatever is dirty to the workflow.
    - The workflow's own read owes one for notifications recorded after its allocation: it may not
      have observed them (their wake-up may also have been set aside, e.g. during a resubscribe).
    - The workflow's own read that observed nothing (failed, superseded) owes one read for the
      notifications it covered only by the way; not when it was their own read
      (``for_notifications``: triggered UPDATED or FOLLOW_UP), so a server that keeps failing is
      not read in a loop: the next notification (the row stays dirty, so it creates work), poll or
      safety read reads again."""
    if notified <= covered:
        return False
    return handed_over or notified > read_notified or not for_notifications
