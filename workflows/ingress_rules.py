"""The ingress's rules: whether it reads a notified change itself, and whether the workflow hears of it.

Contract:
- Pure. ``ingress_read_request``: from the fence row the ingress just recorded a notification on
  (``NotedNotification``) it builds the read cycle the workflow's own read would make, or answers
  None (the workflow is signalled instead). The allocation then applies the same CAS.
- ``stays_in_ledger``: a judged read at the ingress that found nothing new and leaves nothing to
  the workflow is not reported: the ledger's transactions hold all of it (the receipt, ``covered``,
  the next verification due), and the run's record would change nothing but counters.
"""

from __future__ import annotations

from mcpsync.workflows.coverage import follow_up_owed
from mcpsync.workflows.records.ledger import AcceptVerdict, AllocateRequest, NotedNotification
from mcpsync.workflows.records.read_cycle import ReadCycleRequest, ReadCycleResult
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason

__all__ = ["ingress_read_request", "stays_in_ledger"]

S = SubscriptionState


def ingress_read_request(noted: NotedNotification, key: SubscriptionKey, *, generation: int,
                         request_id: str) -> ReadCycleRequest | None:
    """The read cycle the ingress makes itself for a notification it just recorded, or None when the
    workflow must be signalled instead (``resource_updated``): the row was not marked ACTIVE by
    ``mark_active`` (``read_reports``: its run mirrors reports), the row is not ACTIVE, the notification
    came on another session generation than the row's. The request carries the row's fence as the
    workflow's own read would; the allocation then applies the same CAS (refused if the row moved
    meanwhile)."""
    row = noted.fence
    if not row.exists or not row.read_reports or row.state != S.ACTIVE \
            or row.session_generation != generation:
        return None
    allocate = AllocateRequest(key=key, session_generation=row.session_generation,
                               subscription_generation=row.subscription_generation,
                               min_ordinal=row.last_issued_ordinal + 1, request_id=request_id,
                               trigger=TriggerReason.UPDATED)
    return ReadCycleRequest(allocate=allocate, expected_state=S.ACTIVE, close_epoch=row.close_epoch)


def stays_in_ledger(noted: NotedNotification, cycle: ReadCycleResult) -> bool:
    """Whether the judged read ``cycle``, made at the ingress for the note that answered ``noted``,
    needs no ``resource_read``: its verdict is UNCHANGED, it leaves the row clean (no follow-up owed
    for a read handed over, ``coverage.follow_up_owed``), and it directly follows the read of the
    current version (when noted, the newest issued read was the one the watermark names, and no read
    was issued between it and this one), so the run's record names no failure, guardrail rejection
    or read in flight that this read's report would have settled."""
    accept = cycle.accept
    if accept is None or accept.verdict != AcceptVerdict.UNCHANGED:
        return False
    row = noted.fence
    if row.watermark != row.last_issued_ordinal or cycle.ticket.ordinal != row.last_issued_ordinal + 1:
        return False
    return not follow_up_owed(accept.notified, accept.covered, cycle.ticket.notifications_seen,
                              handed_over=True, for_notifications=True)
