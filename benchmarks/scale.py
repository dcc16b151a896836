"""The scale figure (``python -m benchmarks.run --scale-only``): N subscriptions on one box, what a few
changes cost while the rest wait, and whether the ledger's verification schedule holds at that N.

Contract:
- :func:`scale_run` runs the phases the figure needs, the full run's own (``benchmarks.phases``,
  ``benchmarks.churn``): the start-up (``startup``, ``memory``: start rate, CPU per start, the worker's
  growth), every URI subscribed at the fixture, the churn at ``--rate`` for ``--duration`` and its drain
  without the naive client (``churn``, ``system``, ``cost_of_a_change``: convergence of the changes),
  then the idle window (``idle``: how busy the box was, CPU by process) with the ledger's due rows
  sampled through it (:class:`DueSampler`); then the ``memory_by_process``, ``verification`` and
  ``scale`` sections.
- :func:`memory_by_role` is the RSS and PSS of the run's processes (``cost.run_processes``) by role,
  from /proc/PID/smaps_rollup. ``memory_by_process`` holds them right before the first start and at the
  idle window's end, and per subscription: held at the end ÷ N, and grown since before the first start
  ÷ N. PSS counts a page shared by several processes once over them (PostgreSQL's shared buffers), so
  a sum over processes is a PSS sum; RSS is given beside it.
- :func:`verification_schedule` judges every ACTIVE row with a safety-read period of the run's server
  over [the last initial read, the idle window's end] (PostgreSQL's clock). Its verifications are its
  granted read allocations (``read_requests.issued_at``, the transaction time ``record_allocation``
  stamps ``verified_at`` with), whoever asked for them; its gaps are ``staleness.gaps_between_reads``
  (from its last verification before the window, the open gap to the window's end included), each over
  the row's own period. At the end, from the row itself: overdue (``verified_at`` more than a period
  ago, or none), and due but not swept yet (``verify_due_at`` passed) and how late.
- The ``scale`` section holds the figure's values beside its targets (``SCALE_TARGETS``: 50,000
  subscriptions on two cores), printed by :func:`print_scale_summary`, never asserted.
"""

from __future__ import annotations

import asyncio
import gc
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

from benchmarks import cost, usage
from benchmarks.box_speed import yardstick
from benchmarks.churn import churn_phase, churn_report, drain_phase
from benchmarks.common import SUBJECT, fetch_rows, fetch_scalar, percentile
from benchmarks.phases import Bench, idle_phase, startup_phase, subscribed
from benchmarks.staleness import gaps_between_reads
from mcpsync.activities.ledger import Ledger
from mcpsync.workflows.records.subscription import SubscriptionState

__all__ = ["SCALE_TARGETS", "DueSampler", "memory_by_role", "print_scale_summary", "scale_run",
           "verification_schedule"]

SCALE_TARGETS = {
    "convergence_p99_max_ms": 250.0,
    "machine_busy_max_pct": 60.0,
    "all_processes_max_kib_per_subscription": 100.0,
    "worker_max_kib_per_subscription": 40.0,  # at a cache of N/10
    "max_gap_over_period": 1.0,
}

ACTIVE = SubscriptionState.ACTIVE.value
MCPSYNC_ROLES = (cost.Role.MCPSYNC_WORKER, cost.Role.MCPSYNC_INGRESS, cost.Role.TEMPORAL_DEV_SERVER,
                 cost.Role.POSTGRESQL)


async def scale_run(b: Bench) -> None:
    """The scale figure's phases on ``b`` (module contract)."""
    mem0, _ = memory_by_role(b)
    await startup_phase(b)
    window_start = await _pg_now(b.ledger)  # every initial read is in: the schedule is judged from here
    b.say("waiting until the fixture holds a subscription of every URI")
    await b.sys_ctl.wait_stats(subscribed(b.uris, 1), timeout=60 + b.n / 100, interval=1.0)
    churn = await churn_phase(b, None, None)
    drain = await drain_phase(b, churn)
    await churn_report(b, churn, drain)
    # The outbox consumer measured the churn's events; through the idle window it would only add the
    # benchmark process's CPU to the box's (an overdue event per late row, when the sweep falls behind).
    await churn.follower.stop()
    async with DueSampler(b.ledger, b.server) as due:
        await idle_phase(b)
    gc.collect()
    mem1, unreadable = memory_by_role(b)
    window_end = await _pg_now(b.ledger)
    r, n = b.r, b.n
    r["memory_by_process"] = _memory_section(mem0, mem1, n, unreadable)
    r["verification"] = await verification_schedule(b.ledger, b.server, window_start, window_end)
    r["verification"]["due_during_idle"] = due.report()
    b.run.curves["verification"] = r["verification"].pop("_row_max_gap_over_period")
    r["scale"] = scale_figures(r)
    s = r["scale"]
    b.say(f"scale: start {s['start_rate_per_s']}/s, convergence p50/p99 {s['convergence_p50_ms']}/"
          f"{s['convergence_p99_ms']} ms, busy {s['machine_busy_pct_churn']} % (churn) / "
          f"{s['machine_busy_pct_idle']} % (idle), {s['all_processes_kib_per_subscription']} KiB per "
          f"subscription (worker {s['worker_kib_per_subscription']}), max verification gap "
          f"{s['max_gap_over_period']} of the period, {s['rows_overdue_at_end']} rows overdue")


async def _pg_now(ledger: Ledger) -> datetime:
    now: datetime = await fetch_scalar(ledger, "SELECT clock_timestamp()")
    return now


def memory_by_role(b: Bench) -> tuple[dict[str, dict[str, int]], list[int]]:
    """Role -> {rss, pss, processes} summed over the run's processes now; and the pids that could not be
    read (they exited, or /proc hides them)."""
    roles, _ = cost.run_processes(b.temporal.pid, b.db_name, b.services.named_processes)
    out = {role.value: {"rss": 0, "pss": 0, "processes": 0} for role in cost.Role}
    unreadable: list[int] = []
    for pid, role in roles.items():
        m = usage.memory_bytes(pid)
        if m is None:
            unreadable.append(pid)
            continue
        row = out[role.value]
        row["rss"] += m.rss
        row["pss"] += m.pss
        row["processes"] += 1
    return out, sorted(unreadable)


def _memory_section(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], n: int,
                    unreadable: list[int]) -> dict[str, Any]:
    def kib(v: float) -> float:
        return round(v / 1024 / n, 1)

    def total(mem: dict[str, dict[str, int]], key: str, roles: Sequence[str]) -> int:
        return sum(mem[r][key] for r in roles)

    every = [r.value for r in cost.Role]
    mcpsync = [r.value for r in MCPSYNC_ROLES]
    per: dict[str, Any] = {}
    for role in every:
        per[role] = {"held_rss": kib(after[role]["rss"]), "held_pss": kib(after[role]["pss"]),
                     "grown_pss": kib(after[role]["pss"] - before[role]["pss"])}
    for name, roles in (("all_processes", every), ("mcpsync_processes", mcpsync)):
        per[name] = {"held_rss": kib(total(after, "rss", roles)), "held_pss": kib(total(after, "pss", roles)),
                     "grown_pss": kib(total(after, "pss", roles) - total(before, "pss", roles))}
    return {
        "before_first_start": before,
        "at_idle_end": after,
        "kib_per_subscription": per,
        "unreadable_pids": unreadable,
        "what": "RSS and PSS (smaps_rollup) summed by role; per subscription: held at the idle window's end "
                "÷ N, and grown since right before the first start ÷ N. all_processes: every process of "
                "the run (the driver and the fixture MCP server included); mcpsync_processes: worker, "
                "ingress, Temporal dev server, PostgreSQL (postmaster, auxiliaries, the run's backends)",
    }


class DueSampler:
    """Every ``interval`` seconds while entered: the rows of the run's server that are due
    (``verify_due_at`` passed, not claimed by a sweep) and how late the most overdue of them is, through
    the sweep's own partial index; the worst of each over the samples (:meth:`report`)."""

    def __init__(self, ledger: Ledger, server: str, interval: float = 10.0) -> None:
        self.ledger, self.server, self.interval = ledger, server, interval
        self.samples: list[tuple[int, float]] = []
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DueSampler:
        self.task = asyncio.create_task(self._run(), name="bench-due-sampler")
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            rows = await fetch_rows(
                self.ledger,
                "SELECT count(*), COALESCE(EXTRACT(EPOCH FROM now() - min(verify_due_at)), 0)::float8"
                " FROM subscriptions WHERE subject = %s AND server = %s AND state = %s"
                " AND safety_read_seconds IS NOT NULL AND verify_due_at <= now()",
                (SUBJECT, self.server, ACTIVE))
            self.samples.append((int(rows[0][0]), float(rows[0][1])))
            await asyncio.sleep(self.interval)

    def report(self) -> dict[str, Any]:
        return {"samples": len(self.samples), "interval_seconds": self.interval,
                "max_rows_due": max((c for c, _ in self.samples), default=None),
                "max_seconds_late": max((round(late, 3) for _, late in self.samples), default=None),
                "what": "rows whose verify_due_at passed and no sweep claimed yet, and how late the oldest "
                        "was, sampled through the idle window"}


async def verification_schedule(ledger: Ledger, server: str, start: datetime,
                                end: datetime) -> dict[str, Any]:
    """The ``verification`` section over [start, end] (module contract); ``_row_max_gap_over_period`` is
    each row's worst gap over its period, for the plot."""
    rows = await fetch_rows(
        ledger, "SELECT workflow_id, uri, safety_read_seconds, verified_at, verify_due_at FROM subscriptions"
                " WHERE server = %s AND state = %s AND safety_read_seconds IS NOT NULL", (server, ACTIVE))
    reads = await fetch_rows(
        ledger, "SELECT r.workflow_id, r.issued_at FROM read_requests r"
                " JOIN subscriptions s USING (workflow_id)"
                " WHERE s.server = %s AND r.issued_at > %s AND r.issued_at <= %s"
                " UNION ALL SELECT r.workflow_id, max(r.issued_at) FROM read_requests r"
                " JOIN subscriptions s USING (workflow_id) WHERE s.server = %s AND r.issued_at <= %s"
                " GROUP BY r.workflow_id", (server, start, end, server, start))
    issued: dict[str, list[datetime]] = defaultdict(list)
    for workflow_id, at in reads:
        issued[workflow_id].append(at)
    worst: list[tuple[float, float, str, bool]] = []  # (gap / period, gap s, uri, open at the end)
    overdue = never = due = 0
    late = 0.0
    for workflow_id, uri, period, verified_at, due_at in rows:
        gaps = gaps_between_reads(issued[workflow_id], start, end)
        g = max(gaps)
        worst.append((g / float(period), g, uri, gaps.index(g) == len(gaps) - 1))
        if verified_at is None:
            never += 1
        if verified_at is None or (end - verified_at).total_seconds() > float(period):
            overdue += 1
        if due_at is not None and due_at <= end:
            due += 1
            late = max(late, (end - due_at).total_seconds())
    ratios = [w[0] for w in worst]
    in_window = sum(1 for times in issued.values() for at in times if at > start)
    hours = max(1e-9, (end - start).total_seconds() / 3600)
    worst.sort(reverse=True)
    return {
        "window_seconds": round((end - start).total_seconds(), 1),
        "rows": len(rows),
        "verifications": in_window,
        "verifications_per_row_hour": round(in_window / max(1, len(rows)) / hours, 3),
        "max_gap_over_period": round(max(ratios), 3) if ratios else None,
        "row_max_gap_over_period": {"p50": _r(percentile(ratios, 50)), "p99": _r(percentile(ratios, 99)),
                                    "max": _r(max(ratios, default=None))},
        "rows_with_a_gap_over_period": sum(1 for x in ratios if x > 1.0),
        "worst": [{"uri": uri, "gap_seconds": round(gap, 3), "over_period": round(ratio, 3),
                   "open_at_end": op} for ratio, gap, uri, op in worst[:5]],
        "at_end": {"rows_overdue": overdue, "rows_never_verified": never, "rows_due": due,
                   "most_late_due_seconds": round(late, 3)},
        "what": "per ACTIVE row with a safety-read period: gaps between its verifications (granted read "
                "allocations, read_requests.issued_at) from the last initial read to the idle window's end, "
                "the open gap included, over the row's period; at the end, rows overdue (verified_at older "
                "than a period, or none) and due but not swept (verify_due_at passed)",
        "_row_max_gap_over_period": ratios,
    }


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def scale_figures(r: dict[str, Any]) -> dict[str, Any]:
    """The figure's values beside its targets (``SCALE_TARGETS``): reported, never asserted."""
    conv, idle_r, churn = r["system"]["convergence"], r["idle"], r["churn"]
    delivered = conv["with_a_delivered_notification"]
    per, ver = r["memory_by_process"]["kib_per_subscription"], r["verification"]
    values = {
        "subscriptions": r["subscriptions"],
        "start_rate_per_s": r["startup"]["subscriptions_per_second"],
        "cpu_ms_per_start": r["startup"]["cpu_ms_per_subscription"],
        "convergence_p50_ms": conv["p50_ms"],
        "convergence_p99_ms": conv["p99_ms"],
        "convergence_unconverged": conv["unconverged"],
        "delivered_p99_ms": delivered["p99_ms"],
        "delivered_unconverged": delivered["unconverged"],
        "changes_with_every_notification_dropped": conv["all_notifications_dropped"]["changes"],
        "machine_busy_pct_churn": churn["cpu"]["machine_busy_pct"],
        "other_processes_pct_churn": churn["cpu"]["other_processes_pct_of_machine"],
        "machine_busy_pct_idle": idle_r["machine_busy_pct"],
        "other_processes_pct_idle": idle_r["other_processes_pct_of_machine"],
        "idle_cpu_ms_per_subscription_hour": idle_r["cpu_ms_per_subscription_hour"],
        "all_processes_kib_per_subscription": per["all_processes"]["held_pss"],
        "mcpsync_processes_kib_per_subscription": per["mcpsync_processes"]["held_pss"],
        "worker_kib_per_subscription": per[cost.Role.MCPSYNC_WORKER.value]["held_rss"],
        "max_cached_workflows": r["memory"]["max_cached_workflows"],
        "max_gap_over_period": ver["max_gap_over_period"],
        "rows_with_a_gap_over_period": ver["rows_with_a_gap_over_period"],
        "rows_overdue_at_end": ver["at_end"]["rows_overdue"],
    }
    t = SCALE_TARGETS

    def le(v: float | None, bound: float) -> bool:
        return v is not None and v <= bound

    values["targets_met"] = {
        "convergence_p99": le(values["delivered_p99_ms"], t["convergence_p99_max_ms"])
        and values["delivered_unconverged"] == 0,
        "box_busy": le(values["machine_busy_pct_churn"], t["machine_busy_max_pct"])
        and le(values["machine_busy_pct_idle"], t["machine_busy_max_pct"]),
        "memory_all_processes": le(values["all_processes_kib_per_subscription"],
                                   t["all_processes_max_kib_per_subscription"]),
        "memory_worker": le(values["worker_kib_per_subscription"], t["worker_max_kib_per_subscription"]),
        "verifications_on_schedule": le(values["max_gap_over_period"], t["max_gap_over_period"])
        and values["rows_overdue_at_end"] == 0,
    }
    values["targets"] = t
    values["notes"] = [
        "convergence: the target is judged on the changes with a delivered notification (the churn drops "
        "one notification in 100: a change that lost all of its waits for the safety read or a later "
        "change, counted in changes_with_every_notification_dropped)",
        "memory: held at the idle window's end ÷ N; all processes and mcpsync's as PSS sums, the worker's "
        "RSS; the worker target holds at a cache of N/10 (max_cached_workflows)",
        "box busy: the whole machine during the churn and during the idle window (other processes "
        "included: see other_processes_pct_*)",
    ]
    return values


def print_scale_summary(report: dict[str, Any]) -> None:
    print("\n== mcpsync scale figure ==")
    print(yardstick(report["machine"].get("speed")))
    for r in report["runs"]:
        s, v, m = r["scale"], r["verification"], r["memory_by_process"]["kib_per_subscription"]
        print(f"\n{r['transport']} N={r['subscriptions']}, max_cached_workflows {s['max_cached_workflows']}")
        up = r["startup"]
        print(f"  start-up            {s['start_rate_per_s']} subscriptions/s, {s['cpu_ms_per_start']} ms "
              f"CPU per start ({up['subscriptions_measured']} in {up['initial_convergence_seconds']} s)")
        print(f"  convergence ms      p50 {s['convergence_p50_ms']}  p99 {s['convergence_p99_ms']}  "
              f"(delivered p99 {s['delivered_p99_ms']}, unconverged {s['delivered_unconverged']}; "
              f"{s['changes_with_every_notification_dropped']} of {r['churn']['changes']} changes lost every "
              "notification)")
        print(f"  box busy            churn {s['machine_busy_pct_churn']} % (other processes "
              f"{s['other_processes_pct_churn']} %), idle {s['machine_busy_pct_idle']} % (other "
              f"{s['other_processes_pct_idle']} %); idle CPU {s['idle_cpu_ms_per_subscription_hour']} ms per "
              "subscription-hour")
        print("  KiB/subscription    " + ", ".join(
            f"{k} {x['held_pss']}" for k, x in m.items() if x["held_pss"]) + " (PSS held at the end)")
        due = v["due_during_idle"]
        print(f"  verifications       max gap {v['max_gap_over_period']} of the period (p99 row "
              f"{v['row_max_gap_over_period']['p99']}), {v['rows_with_a_gap_over_period']} rows over, "
              f"{v['at_end']['rows_overdue']} overdue at the end, {v['verifications']} in "
              f"{v['window_seconds']} s; due backlog at most {due['max_rows_due']} rows, "
              f"{due['max_seconds_late']} s late")
        print(f"  targets met         {s['targets_met']}")
