"""The ingress's rule: whether it reads a notified change itself or signals the workflow.

Contract:
- ``ingress_read_request`` is pure: from the fence row the ingress just recorded a notification
  on (``NotedNotification``) it builds the read cycle the workflow's own read would make, or
  answers None (the workflow is signalled instead). The allocation then applies the same CAS.
"""

from __future__ import annotations

from mcpsync.workflows.records.ledger import AllocateRequest, NotedNotification
from mcpsync.workflows.records.read_cycle import ReadCycleRequest
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason

__all__ = ["ingress_read_request"]

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
