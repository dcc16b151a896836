"""Idle cost: what live subscriptions cost while nothing changes.

Contract:
- :func:`measure_idle` waits ``seconds`` with N subscriptions live and no edit, notification or
  start, and diffs over that window the CPU of every process of the run (``benchmarks.cost``:
  mcpsync's main worker and ingress, the Temporal dev server, PostgreSQL, the fixtures, this
  process), the history events stamped in the N workflows' histories (continue-as-new followed)
  and the reads the ledger issued for them (``read_requests``, by trigger).
- What runs in such a window: safety reads (the ingress's sweep of the ledger's due verifications:
  a read at the ingress that, finding nothing new, stays in the ledger with no signal; and the
  workflow's timer: a workflow task, the read cycle activity on the ingress's queue, the workflow
  task that mirrors it), keepalive pings and lease renewals (per
  session, not per subscription), the processes' own timers (metrics refresher, pollers) and
  continue-as-new when a history grows long.
- The figures are per subscription and time: ``cpu_ms_per_subscription_hour`` (in all and by
  process) = CPU ms ÷ (N × window hours); ``history_events_per_subscription_day`` likewise. They
  are the steady state only when the safety reads in the window run at the schedule's rate
  (``safety_reads_per_subscription_hour`` observed against ``..._scheduled``: N ÷ (0.9 × period)),
  i.e. when the subscriptions started at least one safety period before the window ends and spread
  over it; a window right after a fast start-up sees none, and measures the rest (pings, leases,
  timers). ``cpu_ms_per_safety_read_upper_bound`` divides the window's CPU by its safety reads (the
  fixed part included).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client

from benchmarks import cost
from benchmarks.common import fetch_rows
from mcpsync.activities.ledger import Ledger

__all__ = ["measure_idle"]

SAFETY_READ_JITTER_MEAN = 0.9  # safety reads are armed at 0.8-1.0 of the period (workflows/fence.py)


async def measure_idle(client: Client, ledger: Ledger, roles: dict[int, cost.Role], runs: dict[str, str], *,
                       server: str, seconds: float, safety_read_seconds: float | None) -> dict[str, Any]:
    """The idle window of the module contract over the workflows of ``runs`` (ids → current run)."""
    n = max(1, len(runs))
    cpu0 = cost.cpu_sample(roles)
    t0 = time.time()
    await asyncio.sleep(seconds)
    t1 = time.time()
    cpu = cost.cpu_delta(cpu0, cost.cpu_sample(roles), 1)
    history = await cost.history_per_change(client, runs, t0, t1)
    reads = dict(await fetch_rows(
        ledger, "SELECT q.trigger_reason, count(*) FROM read_requests q"
                " JOIN subscriptions s USING (workflow_id)"
                " WHERE s.server = %s AND q.issued_at BETWEEN %s AND %s GROUP BY 1",
        (server, datetime.fromtimestamp(t0, UTC), datetime.fromtimestamp(t1, UTC))))
    sub_hours = n * (t1 - t0) / 3600
    # cpu_delta per "change" with changes=1: the window's CPU ms by process.
    cpu_ms = {k: float(v or 0.0) for k, v in cpu["by_process_ms_per_change"].items()}
    total_ms = sum(cpu_ms.values())
    # Nothing changes in the window: a read triggered "updated" is the ingress's sweep of a due
    # verification (ingress/resync.py, fed to the router like a notification), a "poll" read the
    # workflow's timer.
    resync = int(reads.get("updated", 0))
    safety = int(reads.get("poll", 0)) + resync
    scheduled = 3600 / (SAFETY_READ_JITTER_MEAN * safety_read_seconds) if safety_read_seconds else 0.0
    return {
        "subscriptions": n,
        "window_seconds": round(t1 - t0, 2),
        "cpu_ms": round(total_ms, 1),
        "cpu_ms_per_subscription_hour": round(total_ms / sub_hours, 2),
        "by_process_ms_per_subscription_hour": {k: round(v / sub_hours, 2) for k, v in cpu_ms.items()},
        "history_events": history.events,
        "history_events_per_subscription_day": round(history.events / sub_hours * 24, 1),
        "workflow_tasks_per_subscription_day": round(history.workflow_tasks_completed / sub_hours * 24, 1),
        "reads_by_trigger": {str(k): int(v) for k, v in reads.items()},
        "safety_reads": safety,
        "safety_reads_at_the_ingress": resync,
        "safety_reads_per_subscription_hour": round(safety / sub_hours, 3),
        "safety_reads_per_subscription_hour_scheduled": round(scheduled, 3),
        "cpu_ms_per_safety_read_upper_bound": round(total_ms / safety, 1) if safety else None,
        "history_events_per_safety_read_upper_bound": round(history.events / safety, 1) if safety else None,
        "continued_as_new": history.runs - history.workflows,
        "exited_during_window": cpu["exited_during_window"],
        "what": "no edits, notifications or starts; CPU of the run's processes and history events of the N "
                "subscription workflows over the window, per subscription-hour / -day",
    }
