"""The ingress's keyed work queue, as client-go's workqueue: a *dirty* set and a *processing* set.

A key is work to look at, never "what changed": processing a key reads the ledger row's level
(``mcpsync.workflows.coverage``). A key added while it waits is merged (it is dirty already); a
key added while it is processed is handed out again once processing ends (``done``), so one key
is processed by one worker at a time and nothing added is lost. ``take`` lets the worker absorb
what arrived so far, just before it requests a read that observes all of it. Pure and
single-threaded: the session host runs it over its routers, the simulator over its world.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

__all__ = ["WorkQueue"]

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    def __init__(self) -> None:
        self.dirty: set[K] = set()
        self.processing: set[K] = set()
        self.ready: deque[K] = deque()

    def add(self, key: K) -> bool:
        """Mark ``key`` dirty; True when it became ready (the caller wakes a worker). False: merged
        into an add not processed yet, or it waits for its processing to end."""
        if key in self.dirty:
            return False
        self.dirty.add(key)
        if key in self.processing:
            return False
        self.ready.append(key)
        return True

    def get(self) -> K | None:
        """The next ready key, now processing (its dirty mark is taken), or None."""
        if not self.ready:
            return None
        key = self.ready.popleft()
        self.dirty.discard(key)
        self.processing.add(key)
        return key

    def take(self, key: K) -> bool:
        """The worker processing ``key`` takes what was added since it got it (True if anything
        was): it is about to do the work that covers those adds."""
        if key in self.dirty and key in self.processing:
            self.dirty.discard(key)
            return True
        return False

    def done(self, key: K) -> bool:
        """Processing ``key`` ended; True when it was added meanwhile and is ready again."""
        self.processing.discard(key)
        if key in self.dirty:
            self.ready.append(key)
            return True
        return False

    def __len__(self) -> int:
        return len(self.ready)
