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
  fixed part included). The history counts come from a sample of the workflows when the caller passes
  one (``history_sampled_workflows``), scaled to N (``benchmarks.cost.history_per_change``).
- A read that found nothing new (``read_requests.outcome`` UNCHANGED, completed in the window, whatever
  triggered it) is an *unchanged read*: ``history_events_per_unchanged_read``,
  ``temporal_actions_per_unchanged_read`` and ``cpu_ms_per_unchanged_read_upper_bound`` divide the
  window's history events, billable actions (``benchmarks.actions``) and CPU by their number.
  ``temporal_actions_per_subscription_day`` is the window's billable actions per subscription-day at
  the run's safety-read period; ``at_production_period`` projects the per-unchanged-read figures to
  production's period (``SubscriptionOptions().safety_read_seconds``, N ÷ (0.9 × period) reads) and
  prices the actions (``benchmarks.actions.PRICES_USD_PER_MILLION``): a projection of what happens
  once per read, blind to what is rarer than the window (a watchdog's timer hours apart).
  ``machine_busy_pct`` and ``other_processes_pct_of_machine`` say how loaded the shared box was over the
  window (``benchmarks.usage``): CPU figures are upper bounds on a loaded box, counts hold.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client

from benchmarks import actions, cost, usage
from benchmarks.common import fetch_rows
from benchmarks.services import Scrape
from mcpsync.activities.ledger import Ledger
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import SubscriptionOptions, TriggerReason
from mcpsync.workflows.verification_rules import verification_delay

__all__ = ["measure_idle"]


def mean_interval(period: float) -> float:
    """Seconds between two scheduled verifications on average: the ledger's due band at its mean draw
    (``verification_rules.verification_delay`` is linear in the draw)."""
    return verification_delay(period, 0.5)


async def measure_idle(client: Client, ledger: Ledger, roles: dict[int, cost.Role], runs: dict[str, str], *,
                       server: str, seconds: float, safety_read_seconds: float | None,
                       subscriptions: int | None = None) -> dict[str, Any]:
    """The idle window of the module contract over ``subscriptions`` workflows (default: those of
    ``runs``); ``runs`` (ids → current run) are the ones whose histories are read, scaled to the rest."""
    n = max(1, subscriptions or len(runs))
    cpu0, box0 = cost.cpu_sample(roles), usage.cpu_snapshot()
    t0 = time.time()
    await asyncio.sleep(seconds)
    t1 = time.time()
    cpu, box = cost.cpu_delta(cpu0, cost.cpu_sample(roles), 1), usage.cpu_report(box0, usage.cpu_snapshot())
    history = await cost.history_per_change(client, runs, t0, t1, of=n)
    window = (datetime.fromtimestamp(t0, UTC), datetime.fromtimestamp(t1, UTC))
    reads = dict(await fetch_rows(
        ledger, "SELECT q.trigger_reason, count(*) FROM read_requests q"
                " JOIN subscriptions s USING (workflow_id)"
                " WHERE s.server = %s AND q.issued_at BETWEEN %s AND %s GROUP BY 1", (server, *window)))
    unchanged = int((await fetch_rows(
        ledger, "SELECT count(*) FROM read_requests q JOIN subscriptions s USING (workflow_id)"
                " WHERE s.server = %s AND q.outcome = %s AND q.completed_at BETWEEN %s AND %s",
        (server, AcceptVerdict.UNCHANGED.value, *window)))[0][0])
    sub_hours = n * (t1 - t0) / 3600
    # cpu_delta per "change" with changes=1: the window's CPU ms by process.
    cpu_ms = {k: float(v or 0.0) for k, v in cpu["by_process_ms_per_change"].items()}
    total_ms = sum(cpu_ms.values())
    # Nothing changes in the window: a read triggered "updated" is the ingress's sweep of a due
    # verification (ingress/resync.py, fed to the router like a notification), a "poll" read the
    # workflow's own (its watchdog's, or a polling run's timer).
    resync = int(reads.get(TriggerReason.UPDATED.value, 0))
    safety = int(reads.get(TriggerReason.POLL.value, 0)) + resync
    scheduled = 3600 / mean_interval(safety_read_seconds) if safety_read_seconds else 0.0
    tally = history.tally

    def per(v: float, d: float, digits: int = 2) -> float | None:
        return round(v / d, digits) if d else None

    return {
        "subscriptions": n,
        "window_seconds": round(t1 - t0, 2),
        "cpu_ms": round(total_ms, 1),
        "cpu_ms_per_subscription_hour": round(total_ms / sub_hours, 2),
        "by_process_ms_per_subscription_hour": {k: round(v / sub_hours, 2) for k, v in cpu_ms.items()},
        "history_sampled_workflows": history.sampled,
        "history_events": history.events,
        "history_events_by_type": dict(tally.events_by_type.most_common()),
        "history_events_per_subscription_day": round(history.events / sub_hours * 24, 1),
        "workflow_tasks_per_subscription_day": round(history.workflow_tasks_completed / sub_hours * 24, 1),
        "temporal_actions": tally.actions_total,
        "temporal_actions_by_type": {a.value: c for a, c in tally.actions.most_common()},
        "temporal_actions_per_subscription_day": round(tally.actions_total / sub_hours * 24, 1),
        "reads_by_trigger": {str(k): int(v) for k, v in reads.items()},
        "safety_reads": safety,
        "safety_reads_at_the_ingress": resync,
        "safety_reads_per_subscription_hour": round(safety / sub_hours, 3),
        "safety_reads_per_subscription_hour_scheduled": round(scheduled, 3),
        "cpu_ms_per_safety_read_upper_bound": per(total_ms, safety, 1),
        "history_events_per_safety_read_upper_bound": per(history.events, safety, 1),
        "unchanged_reads": unchanged,
        "history_events_per_unchanged_read": per(history.events, unchanged),
        "temporal_actions_per_unchanged_read": per(tally.actions_total, unchanged),
        "cpu_ms_per_unchanged_read_upper_bound": per(total_ms, unchanged, 1),
        "at_production_period": at_production_period(per(tally.actions_total, unchanged),
                                                      per(history.events, unchanged)),
        "machine_busy_pct": box["machine_busy_pct"],
        "other_processes_pct_of_machine": box["other_processes_pct_of_machine"],
        "continued_as_new": history.runs - history.workflows,
        "exited_during_window": cpu["exited_during_window"],
        "what": "no edits, notifications or starts; CPU of the run's processes and history events and "
                "Temporal Cloud billable actions of the N subscription workflows over the window, per "
                "subscription-hour / -day and per unchanged read",
    }


def batches(d: Scrape) -> dict[str, dict[str, float | None]]:
    """The read path's group commit over a scrape diff ``d`` (the run's processes summed), per kind:
    transactions, calls and the mean batch (``mcpsync_ledger_batches`` / ``_batched_calls``)."""
    out: dict[str, dict[str, float | None]] = {}
    for kind in ("allocate", "accept"):
        label = frozenset({("kind", kind)})
        n = d.get(("mcpsync_ledger_batches_total", label), 0.0)
        calls = d.get(("mcpsync_ledger_batched_calls_total", label), 0.0)
        out[kind] = {"batches": n, "calls": calls, "mean_batch": round(calls / n, 2) if n else None}
    return out


def at_production_period(actions_per_read: float | None, events_per_read: float | None) -> dict[str, Any]:
    """Per-unchanged-read figures at production's safety-read period, per subscription-day and priced."""
    period = SubscriptionOptions().safety_read_seconds
    reads_per_day = 86400 / mean_interval(period)
    a_day = None if actions_per_read is None else actions_per_read * reads_per_day
    return {
        "safety_read_seconds": period,
        "unchanged_reads_per_subscription_day": round(reads_per_day, 1),
        "temporal_actions_per_subscription_day": None if a_day is None else round(a_day, 1),
        "history_events_per_subscription_day": (None if events_per_read is None
                                                else round(events_per_read * reads_per_day, 1)),
        "usd_per_1000_subscription_months": None if a_day is None else {
            f"at_{price:g}_per_million": round(a_day * 30 * 1000 * price / 1e6, 2)
            for price in actions.PRICES_USD_PER_MILLION},
        "what": "this window's figures per unchanged read x production's reads per subscription-day; "
                "leaves out what is rarer than the window (a watchdog timer) and what no history shows "
                "(benchmarks.actions.NOT_IN_HISTORY)",
    }
