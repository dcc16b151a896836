"""One 2025-11-25 serve session's pending notifications: level-based, like client-go's workqueue dirty set.

Contract (docs/serve.md, "Bounded per-client buffers"):
- Pending items are ``(kind, uri)`` keys of one insertion-ordered dict: ``("updated", uri)`` per URI and
  one ``("list_changed", None)`` flag. An item already pending is merged (``add`` answers
  ``Added.MERGED``), never sent twice: a resource-updated notification only says "re-read it", and one
  read covers every change before it; so does one list for ``list_changed``.
- ``take`` waits until an item is pending and removes the oldest one (fair: a URI that keeps changing
  keeps its place, it does not jump ahead of or starve the others). An item taken is no longer
  pending: added again while its send is in flight, it is pending again and is sent once more after.
- The bound counts distinct items waiting unread, not notifications: ``add`` answers ``Added.FULL`` (and
  adds nothing) when a new URI would make more than ``limit`` URIs pending; the ``list_changed`` flag
  is one more, it never grows. The caller then ends the session with ``finish(last)``.
- ``finish(last)`` drops everything pending: ``last`` is the next and final item ``take`` returns,
  and ``add`` answers ``Added.FINISHED`` from then on (nothing more is pended). ``take`` after the final
  item waits forever (the session's end cancels it).
- No I/O, no server: one event loop, one taker (the session's drain task).
"""

from __future__ import annotations

import asyncio
from enum import Enum
from typing import Literal

__all__ = ["Added", "Item", "PendingNotifications"]

Item = tuple[str, str | None]  # (kind, uri): ("updated", uri), ("list_changed", None), or a final item


class Added(Enum):
    """What ``add`` did with an item."""

    PENDING = "pending"  # pending now (it was not)
    MERGED = "merged"  # already pending: nothing more to send
    FULL = "full"  # not added: one more URI would pass the bound
    FINISHED = "finished"  # not added: the session was finished


LIST_CHANGED: Item = ("list_changed", None)


class PendingNotifications:
    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._items: dict[Item, None] = {}  # insertion-ordered: the oldest first
        self._uris = 0  # pending ("updated", uri) items (the flag is not counted)
        self._ready = asyncio.Event()
        self._last: Item | None = None
        self._finished = False

    def __len__(self) -> int:
        return len(self._items) + (self._last is not None)

    @property
    def finished(self) -> bool:
        return self._finished

    def in_order(self) -> list[Item]:
        """What ``take`` would return, in order (for tests and logs)."""
        return [*self._items, *([self._last] if self._last is not None else [])]

    def add(self, kind: Literal["updated", "list_changed"], uri: str | None = None) -> Added:
        if self._finished:
            return Added.FINISHED
        item: Item = LIST_CHANGED if kind == "list_changed" else ("updated", uri)
        if item in self._items:
            return Added.MERGED
        if kind == "updated":
            if self._uris >= self.limit:
                return Added.FULL
            self._uris += 1
        self._items[item] = None
        self._ready.set()
        return Added.PENDING

    def finish(self, last: Item) -> None:
        """Drop everything pending; ``last`` is the final item ``take`` returns."""
        self._items.clear()
        self._uris = 0
        self._finished = True
        self._last = last
        self._ready.set()

    def take_nowait(self) -> Item | None:
        """The oldest pending item, removed; None when nothing is pending."""
        if self._items:
            item = next(iter(self._items))
            del self._items[item]
            if item[0] == "updated":
                self._uris -= 1
            return item
        if self._last is not None:
            item, self._last = self._last, None
            return item
        self._ready.clear()
        return None

    async def take(self) -> Item:
        while True:
            item = self.take_nowait()
            if item is not None:
                return item
            await self._ready.wait()
