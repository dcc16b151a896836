"""Convergence statistics of a churn: per change, the seconds until its content (or a later change's
of the same URI) was held; regressions of held content; percentile summaries.

Contract:
- :class:`Change` is one change the churn made (its commit time on each fixture, how many of its
  notifications each fixture dropped).
- :func:`first_seen` maps (uri, digest) to the first time it was held; :func:`convergence` turns it
  into a latency per change (None: never held); :func:`convergence_report` summarizes those, split by
  whether a notification of the change was delivered; :func:`regressions` counts how often held content
  went back to an older version.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import summarize

__all__ = ["Change", "convergence", "convergence_report", "first_seen", "regressions"]


@dataclass
class Change:
    seq: int
    uri: str
    digest: str
    k: int  # notifications for this change (1 from the edit + k-1 duplicates)
    committed: float  # system fixture's commit time
    committed_baseline: float  # baseline fixture's (same process over HTTP)
    dropped: list[int] = field(default_factory=lambda: [0])  # notifications of it dropped, per fixture

    def lost(self, fixture: int) -> bool:
        """Every notification of this change was dropped on that fixture's side."""
        return self.dropped[min(fixture, len(self.dropped) - 1)] >= self.k


def first_seen(pairs: Sequence[tuple[str, str, float]]) -> dict[tuple[str, str], float]:
    first: dict[tuple[str, str], float] = {}
    for uri, digest, t in pairs:
        if (uri, digest) not in first or t < first[(uri, digest)]:
            first[(uri, digest)] = t
    return first


def convergence(changes: Sequence[Change], first: dict[tuple[str, str], float], *, baseline: bool) -> list[
        float | None]:
    """Per change: seconds until this change's or a later change's content of its URI was held."""
    by_uri: dict[str, list[Change]] = defaultdict(list)
    for ch in changes:
        by_uri[ch.uri].append(ch)
    out: dict[int, float | None] = {}
    for uri, chs in by_uri.items():
        best = math.inf
        for ch in reversed(chs):
            best = min(best, first.get((uri, ch.digest), math.inf))
            start = ch.committed_baseline if baseline else ch.committed
            out[ch.seq] = None if best == math.inf else max(0.0, best - start)
    return [out[ch.seq] for ch in changes]


def regressions(changes: Sequence[Change], held_sequence: Sequence[tuple[str, str]]) -> int:
    """How often the held content of a URI went back to an older version."""
    index = {(ch.uri, ch.digest): ch.seq for ch in changes}
    held: dict[str, int] = {}
    count = 0
    for uri, digest in held_sequence:
        i = index.get((uri, digest), -1)
        if i < held.get(uri, -1):
            count += 1
        held[uri] = i
    return count


def convergence_report(lat: Sequence[float | None], lost: Sequence[bool],
                       window: float = 60.0) -> dict[str, Any]:
    """Percentiles over converged changes, plus the same over changes that kept at least one notification."""
    done = [x for x in lat if x is not None]
    out = summarize(done)
    out["changes"] = len(lat)
    out["unconverged"] = len(lat) - len(done)
    out["converged_within_60s_pct"] = (round(100 * sum(1 for x in done if x <= window) / len(lat), 3)
                                       if lat else None)
    delivered = [x for x, gone in zip(lat, lost, strict=True) if not gone]
    gone = [x for x, g in zip(lat, lost, strict=True) if g]
    out["with_a_delivered_notification"] = {
        **summarize([x for x in delivered if x is not None]),
        "changes": len(delivered),
        "unconverged": sum(1 for x in delivered if x is None),
    }
    out["all_notifications_dropped"] = {
        "changes": len(gone),
        "converged_later": sum(1 for x in gone if x is not None),
        "latencies_ms": [None if x is None else round(x * 1000, 1) for x in gone],
        "note": "converged only through a later change of the same URI (or never)",
    }
    return out

