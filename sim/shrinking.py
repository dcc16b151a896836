"""Shrinking: delta debugging (ddmin) of an event list, for a violation or for any kept property.

Contract:
- ``delta_debug`` drops chunks of events while its ``accept`` keeps the candidate, to a 1-minimal list
  within a replay budget; ``shrink`` keeps the violated invariant (``sim.situations.shrink_to`` keeps a
  situation with the same loop).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sim.model import Event, Invariant, ScheduleResult, SimConfig, Trace
from sim.schedule import replay

__all__ = ["delta_debug", "shrink"]


def delta_debug(events: Sequence[Event], accept: Callable[[list[Event]], list[Event] | None],
                budget: int) -> list[Event]:
    """Delta-debugging (ddmin): drop chunks of ``events`` while ``accept`` keeps the candidate, until
    the list is 1-minimal or ``budget`` calls of ``accept`` are spent. ``accept`` answers the events to
    go on from (the candidate, or what replaying it kept) or None for a candidate that lost the property."""
    left = budget
    current = list(events)
    chunks = 2
    while len(current) >= 2 and left > 0:
        size = max(1, len(current) // chunks)
        reduced = False
        for start in range(0, len(current), size):
            if left <= 0:
                break
            left -= 1
            kept = accept(current[:start] + current[start + size:])
            if kept is not None:
                current, reduced = list(kept), True
                chunks = max(chunks - 1, 2)
                break
        if not reduced:
            if size == 1:
                break
            chunks = min(len(current), chunks * 2)
    return current


def shrink(result: ScheduleResult, config: SimConfig = SimConfig(), *,
           target: Invariant | None = None) -> ScheduleResult:
    """Delta-debugging: the shortest event list (1-minimal within the budget) that still
    violates ``target`` (default: the first violated invariant)."""
    target = target or result.violations[0].invariant
    best = [result]

    def fails(events: list[Event]) -> list[Event] | None:
        r = replay(Trace(result.seed, result.profile, tuple(events)), config)
        if not any(v.invariant == target for v in r.violations):
            return None
        best[0] = r
        return list(r.events)

    delta_debug(result.events, fails, config.shrink_budget)
    return best[0]
