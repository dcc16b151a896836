"""Per-subject quotas of ``mcpsync serve``: what one subject may hold at once, so that it cannot deny
the others (docs/serve.md, "Quotas").

Contract:
- ``Quota`` names each bound; ``QuotaLimits`` holds their values (serve flags, documented defaults).
- ``Quotas.hold(quota, subject)`` takes one slot for as long as the ``with`` block runs and gives it
  back when it ends, however it ends; ``take`` / ``give_back`` do the same for a holder whose end is a
  callback (a session). A subject at its limit is refused with ``quota_exceeded``: JSON-RPC
  ``QUOTA_EXCEEDED`` (-32005), the message naming the quota and its limit, ``data`` =
  ``{"quota": name, "limit": n}``. Other subjects' counts are untouched.
- A subject's count is forgotten when it drops to 0: ``live`` answers 0 and nothing is kept for it.
- ``check_size`` refuses a request naming more than the limit of something (URIs per listen).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcp.shared.exceptions import MCPError

__all__ = ["QUOTA_EXCEEDED", "Quota", "QuotaLimits", "Quotas", "quota_exceeded"]

QUOTA_EXCEEDED = -32005


class Quota(Enum):
    LISTENS = "listens"  # open subscriptions/listen streams
    LISTEN_URIS = "listen_uris"  # URIs named in one subscriptions/listen
    EVENT_STREAMS = "event_streams"  # open events/stream requests
    SNAPSHOTS = "snapshots"  # listing snapshots kept (the oldest is dropped, its cursor refused)
    SESSIONS = "sessions"  # 2025-11-25 sessions


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    listens: int = 16
    listen_uris: int = 4096
    event_streams: int = 16
    snapshots: int = 16
    sessions: int = 64

    def of(self, quota: Quota) -> int:
        value: int = getattr(self, quota.value)
        return value


def quota_exceeded(quota: Quota, limit: int) -> MCPError:
    from mcp.shared.exceptions import MCPError  # here: the CLI imports the limits without the SDK

    return MCPError(
        code=QUOTA_EXCEEDED,
        message=f"Quota exceeded: at most {limit} {quota.value.replace('_', ' ')} per subject",
        data={"quota": quota.value, "limit": limit},
    )


class Quotas:
    def __init__(self, limits: QuotaLimits) -> None:
        self.limits = limits
        self._live: dict[tuple[Quota, str], int] = {}

    def live(self, quota: Quota, subject: str) -> int:
        return self._live.get((quota, subject), 0)

    def held(self) -> int:
        """Slots held by every subject together (0 once every holder has ended)."""
        return sum(self._live.values())

    def check_size(self, quota: Quota, size: int) -> None:
        limit = self.limits.of(quota)
        if size > limit:
            raise quota_exceeded(quota, limit)

    def take(self, quota: Quota, subject: str) -> None:
        limit = self.limits.of(quota)
        key = (quota, subject)
        if self._live.get(key, 0) >= limit:
            raise quota_exceeded(quota, limit)
        self._live[key] = self._live.get(key, 0) + 1

    def give_back(self, quota: Quota, subject: str) -> None:
        key = (quota, subject)
        left = self._live.get(key, 0) - 1
        if left > 0:
            self._live[key] = left
        else:
            self._live.pop(key, None)

    @contextmanager
    def hold(self, quota: Quota, subject: str) -> Iterator[None]:
        self.take(quota, subject)
        try:
            yield
        finally:
            self.give_back(quota, subject)
