"""A run's derived figures: the cost of a change (CPU by process and history per change, from
``benchmarks.cost``), the headline figures under flat keys, and the table of them printed beside the
values before the read-cycle rebuild and its targets (printed, never asserted)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks import cost
from benchmarks.common import ratio
from benchmarks.services import Layout

__all__ = ["HEADLINE_TABLE", "cost_of_a_change", "headline_figures"]


def cost_of_a_change(r: dict[str, Any], proc_cpu: dict[str, Any], notes: list[str], wh: cost.WindowHistory,
                     changes: int) -> dict[str, Any]:
    busy = r["churn"]["cpu"]["cpu_seconds"].get("machine_busy")

    def per(v: float | None, digits: int = 2) -> float | None:
        return None if v is None or not changes else round(v / changes, digits)

    byp = proc_cpu["by_process_ms_per_change"]
    split = r["layout"] == Layout.SPLIT.value
    mcpsync_roles = (cost.Role.MCPSYNC_WORKER, cost.Role.MCPSYNC_INGRESS, cost.Role.TEMPORAL_DEV_SERVER,
                     cost.Role.POSTGRESQL)
    return {
        **proc_cpu,
        # Split layout: what mcpsync's own processes and the servers it needs spent, without the driver and
        # the naive baseline (benchmark_process) and without the fixtures (which also serve the baseline's
        # reads).
        "mcpsync_processes_ms_per_change": round(sum(byp[k.value] or 0.0 for k in mcpsync_roles), 1)
        if split and changes else None,
        "whole_machine_busy_ms_per_change": per(None if busy is None else 1000 * busy, 1),
        "cpu_window": "the churn (the same window as churn.cpu), divided by the churn's changes",
        "notes": [*notes,
                  ("benchmark_process is the driver, the naive baseline client and the Temporal floor's "
                   "worker; mcpsync_worker and mcpsync_ingress are mcpsync's own processes; "
                   "mcpsync_processes_ms_per_change = those two + temporal_dev_server + postgresql"
                   if split else
                   "benchmark_process is the mcpsync worker AND the driver and the naive baseline client "
                   "(one process, --layout in-process)"),
                  "fixtures are the system's, the baseline's twin (stdio) and the staleness profiles'",
                  "postgresql: the postmaster serving the run's database, its auxiliary processes (shared "
                  "with any other database on that server) and the backends connected to the run's database"],
        "history": {
            "window": "churn start -> drain end (wall clock vs the events' server time, same host)",
            "workflows": wh.workflows,
            "sampled_workflows": wh.sampled,  # fewer than workflows: the counts are scaled from them
            "runs": wh.runs,
            "events": wh.events,
            "workflow_tasks_completed": wh.workflow_tasks_completed,
            "activities_scheduled": wh.activities_scheduled,
            "signals": wh.signals,
            "events_per_change": per(wh.events),
            "workflow_tasks_per_change": per(wh.workflow_tasks_completed),
            "activities_per_change": per(wh.activities_scheduled),
            "signals_per_change": per(wh.signals),
            "temporal_actions": wh.tally.actions_total,
            "temporal_actions_by_type": {a.value: c for a, c in wh.tally.actions.most_common()},
            "temporal_actions_per_change": per(wh.tally.actions_total),
        },
    }


def headline_figures(r: dict[str, Any]) -> dict[str, Any]:
    """The headline figures under flat keys (the sections hold the detail)."""
    tf = r["temporal_floor"]
    delivered = r["system"]["convergence"]["with_a_delivered_notification"]
    c = r["cost_of_a_change"]
    idle_r = r.get("idle", {})
    return {
        "temporal_floor_ms": {"p50": tf["p50_ms"], "p99": tf["p99_ms"]},
        "convergence_over_temporal_floor": {"p50": ratio(delivered["p50_ms"], tf["p50_ms"]),
                                            "p99": ratio(delivered["p99_ms"], tf["p99_ms"])},
        "cpu_ms_per_change": c["cpu_ms_per_change"],
        "mcpsync_cpu_ms_per_change": c["mcpsync_processes_ms_per_change"],
        "history_events_per_change": c["history"]["events_per_change"],
        "workflow_tasks_per_change": c["history"]["workflow_tasks_per_change"],
        "burst_reads_per_s": r["burst"]["reads_per_second"],
        "initial_subscriptions_per_s": r["startup"]["subscriptions_per_second"],
        "temporal_start_floor_per_s": r["temporal_start_floor"]["subscriptions_per_s"],
        "initial_subscriptions_over_start_floor": ratio(r["startup"]["subscriptions_per_second"],
                                                        r["temporal_start_floor"]["subscriptions_per_s"]),
        "temporal_subscribe_start_floor_per_s": r["temporal_subscribe_start_floor"]["subscriptions_per_s"],
        "initial_subscriptions_over_subscribe_start_floor": ratio(
            r["startup"]["subscriptions_per_second"],
            r["temporal_subscribe_start_floor"]["subscriptions_per_s"]),
        "reads_per_change_vs_naive": r["comparison"]["amplification_vs_baseline"],
        "idle_cpu_ms_per_subscription_hour": idle_r.get("cpu_ms_per_subscription_hour"),
        "idle_cpu_ms_per_subscription_hour_by_process": idle_r.get("by_process_ms_per_subscription_hour"),
        "history_events_per_subscription_day": idle_r.get("history_events_per_subscription_day"),
        "temporal_actions_per_subscription_day": idle_r.get("temporal_actions_per_subscription_day"),
        "temporal_actions_per_subscription_day_at_production_period":
            idle_r.get("at_production_period", {}).get("temporal_actions_per_subscription_day"),
        "history_events_per_unchanged_read": idle_r.get("history_events_per_unchanged_read"),
        "cpu_ms_per_unchanged_read_upper_bound": idle_r.get("cpu_ms_per_unchanged_read_upper_bound"),
        "worker_bytes_per_subscription": r["memory"]["worker_bytes_per_subscription"],
        "max_cached_workflows": r["memory"]["max_cached_workflows"],
    }


# The headline figures' table: (figure, how it is read from a run, its value before the read-cycle rebuild,
# target). Printed, not asserted.
HEADLINE_TABLE: list[tuple[str, Callable[[dict[str, Any]], Any], str, str]] = [
    ("convergence p50 / temporal floor p50", lambda r: r["convergence_over_temporal_floor"]["p50"],
     "~1.8", "<= 1.25"),
    ("CPU per change, run's processes (ms)", lambda r: r["cpu_ms_per_change"], "~118 (whole box)", "<= 45"),
    (" of which mcpsync + Temporal + PostgreSQL", lambda r: r.get("mcpsync_cpu_ms_per_change"), "-",
     "(split layout)"),
    ("burst reads/s", lambda r: r["burst_reads_per_s"], "~29", ">= 75"),
    ("initial subscriptions/s", lambda r: r["initial_subscriptions_per_s"], "~10", ">= 40"),
    (" temporal start floor /s", lambda r: r["temporal_start_floor_per_s"], "-", "-"),
    (" initial subscriptions / start floor", lambda r: r["initial_subscriptions_over_start_floor"], "-", "-"),
    (" subscribe start floor /s", lambda r: r["temporal_subscribe_start_floor_per_s"], "-", "-"),
    (" initial / subscribe start floor",
     lambda r: r["initial_subscriptions_over_subscribe_start_floor"], "-", "-"),
    ("history events per change", lambda r: r["history_events_per_change"], "16-27", "<= 8"),
    ("workflow tasks per change", lambda r: r["workflow_tasks_per_change"], "~5", "-"),
    ("reads per change vs naive", lambda r: r["reads_per_change_vs_naive"], "0.34x", "<= 0.4x"),
    # The idle rows' "before": every safety read signals the workflow, which restarts its period's timer.
    ("temporal actions per subscription-day", lambda r: r["temporal_actions_per_subscription_day"], "-",
     "(this run's period)"),
    (" at production's 300 s period",
     lambda r: r["temporal_actions_per_subscription_day_at_production_period"], "~640-960", "<= 10"),
    ("history events per unchanged read", lambda r: r["history_events_per_unchanged_read"], "7", "0"),
    ("CPU per unchanged read, at most (ms)", lambda r: r["cpu_ms_per_unchanged_read_upper_bound"], "25",
     "-"),
    ("idle CPU per subscription-hour (ms)", lambda r: r["idle_cpu_ms_per_subscription_hour"], "-",
     "<= 100 at 300 s"),
    ("worker KiB per subscription", lambda r: round(r["worker_bytes_per_subscription"] / 1024, 1),
     "124-162", "<= 40 at cache N/10"),
    (" at max_cached_workflows", lambda r: r["max_cached_workflows"], "-", "-"),
]

