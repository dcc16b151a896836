"""The benchmark's report: a run's result and curves (:class:`Run`), the targets, the growth over N,
and the printed summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks import staleness
from benchmarks.box_speed import yardstick
from benchmarks.common import ratio
from benchmarks.figures import HEADLINE_TABLE
from benchmarks.options import Options
from mcpsync.workflows.names import Act

__all__ = ["TARGETS", "Run", "growth", "print_summary"]

TARGETS = {"amplification_max": 1.05, "convergence_p999_max_seconds": 1.0, "revocation_p99_max_seconds": 2.0}


@dataclass
class Run:
    transport: str
    n: int
    opts: Options
    result: dict[str, Any] = field(default_factory=dict)
    curves: dict[str, list[float]] = field(default_factory=dict)  # latencies for the plot


def growth(runs: Sequence[Run]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for transport in sorted({x.transport for x in runs}):
        rs = sorted((x for x in runs if x.transport == transport), key=lambda x: x.n)
        if len(rs) < 2:
            continue
        table = [{
            "subscriptions": x.n,
            "convergence_p50_ms": x.result["system"]["convergence"]["p50_ms"],
            "convergence_p99_ms": x.result["system"]["convergence"]["p99_ms"],
            "convergence_p999_ms": x.result["system"]["convergence"]["p999_ms"],
            "worker_bytes_per_subscription": x.result["memory"]["worker_bytes_per_subscription"],
            "temporal_server_bytes_per_subscription":
                x.result["memory"]["temporal_server_bytes_per_subscription"],
            "initial_convergence_seconds": x.result["startup"]["initial_convergence_seconds"],
            "burst_reads_per_second": x.result["burst"]["reads_per_second"],
        } for x in rs]
        lo, hi = table[0], table[-1]
        out[transport] = {
            "series": table,
            f"ratio_{hi['subscriptions']}_vs_{lo['subscriptions']}": {
                k: ratio(hi[k], lo[k]) for k in lo if k != "subscriptions"},
        }
    return out


def print_summary(report: dict[str, Any]) -> None:
    def f(v: Any, unit: str = "") -> str:
        return "-" if v is None else f"{v}{unit}"

    print("\n== mcpsync benchmark ==")
    print(yardstick(report["machine"].get("speed")))
    for r in report["runs"]:
        s, b, c, fl = r["system"], r["baseline"], r["comparison"], r["floor"]
        sc = s["convergence"]
        print(f"\n{r['transport']} N={r['subscriptions']}: {r['churn']['changes']} changes in "
              f"{r['churn']['duration_seconds']}s, {r['churn']['notifications_offered']} notifications "
              f"({r['churn']['notifications_dropped']} dropped)")
        print(f"  reads/change        mcpsync {f(s['reads_per_change'])}   naive "
              f"{f(b['reads_per_change'])}   ratio {f(c['amplification_vs_baseline'])}   (target <= "
              f"{TARGETS['amplification_max']})")
        print(f"  convergence ms      p50 {f(sc['p50_ms'])}  p99 {f(sc['p99_ms'])}  p99.9 "
              f"{f(sc['p999_ms'])}  max {f(sc['max_ms'])}   within 60s "
              f"{f(sc['converged_within_60s_pct'], '%')}  unconverged {sc['unconverged']}")
        sd, lost = sc["with_a_delivered_notification"], sc["all_notifications_dropped"]
        print(f"   delivered only     p50 {f(sd['p50_ms'])}  p99 {f(sd['p99_ms'])}  p99.9 "
              f"{f(sd['p999_ms'])}  max {f(sd['max_ms'])}   ({lost['changes']} changes lost every "
              f"notification: {lost['latencies_ms']})")
        bc = b["convergence"]
        print(f"  naive ms            p50 {f(bc['p50_ms'])}  p99 {f(bc['p99_ms'])}  p99.9 "
              f"{f(bc['p999_ms'])}   regressions {b['regressions']} (mcpsync {s['regressions']})")
        print(f"  floor ms            p50 {f(fl['p50_ms'])}  p99 {f(fl['p99_ms'])}   ratio p50 "
              f"{f(c['convergence_p50_vs_floor'])}  p99 {f(c['convergence_p99_vs_floor'])}  "
              f"p99.9 {f(c['convergence_p999_vs_floor'])}")
        print(f"  revocation ms       p50 {f(r['revocation']['p50_ms'])}  p99 "
              f"{f(r['revocation']['p99_ms'])}  (n={r['revocation']['samples']})")
        oc = r["consumer"]
        print(f"  accept->consumer ms p50 {f(oc['p50_ms'])}  p99 {f(oc['p99_ms'])}  max {f(oc['max_ms'])}  "
              f"(n={oc['samples']}, not received {oc['not_received']})")
        print(f"  notifications/s     churn {s['notifications_per_second']}   burst "
              f"{r['burst']['notifications_per_second']} ({r['burst']['reads_per_second']} reads/s)")
        print(f"  memory/subscription worker {r['memory']['worker_bytes_per_subscription'] / 1024:.1f} KiB   "
              f"temporal dev server {r['memory']['temporal_server_bytes_per_subscription'] / 1024:.1f} KiB")
        if "idle" in r:
            i = r["idle"]
            print(f"  idle                {i['cpu_ms_per_subscription_hour']} ms CPU per subscription-hour "
                  f"({i['by_process_ms_per_subscription_hour']}), {i['history_events_per_subscription_day']} "
                  f"events per subscription-day, {i['safety_reads']} safety reads in {i['window_seconds']} s "
                  f"(machine busy {f(i['machine_busy_pct'], '%')}, other processes "
                  f"{f(i['other_processes_pct_of_machine'], '%')})")
            prod = i["at_production_period"]
            print(f"  idle actions        {i['temporal_actions_per_subscription_day']} per subscription-day "
                  f"{i['temporal_actions_by_type']}; per unchanged read ({i['unchanged_reads']}): "
                  f"{f(i['history_events_per_unchanged_read'])} events, "
                  f"{f(i['temporal_actions_per_unchanged_read'])} actions, "
                  f"<= {f(i['cpu_ms_per_unchanged_read_upper_bound'])} ms CPU; at "
                  f"{prod['safety_read_seconds']:g} s: {f(prod['temporal_actions_per_subscription_day'])} "
                  f"actions per subscription-day, {f(prod['usd_per_1000_subscription_months'])} USD per "
                  "1,000 subscription-months")
        cpu = r["churn"]["cpu"]
        print(f"  machine during churn busy {f(cpu['machine_busy_pct'], '%')}, other processes "
              f"{f(cpu['other_processes_pct_of_machine'], '%')} of all cores")
        if "skipped" in r["staleness"]:
            print(f"  staleness           skipped ({r['staleness']['skipped']})")
        for profile in staleness.Profile if "skipped" not in r["staleness"] else ():
            st = r["staleness"][profile.value]
            over = st["over_bound_s"]
            slack = "-" if over is None else f"+{over} s: one dispatch" if over > 0 else "within it"
            print(f"  staleness {profile.value:<28} max gap {f(st['max_gap_between_reads_s'], ' s')} vs "
                  f"bound {f(st['published_bound_s'], ' s')} ({f(st['max_gap_over_bound'], 'x')}, {slack})   "
                  f"p50 {f(st['gap_p50_s'], ' s')}  p99 {f(st['gap_p99_s'], ' s')}   {st['reads']} reads, "
                  f"{st['catalog_words']} catalog words")
        dispatch = r["system"]["where_time_goes_ms"]
        print("  (one dispatch here: workflow task schedule-to-start "
              f"{f(dispatch['workflow_task_schedule_to_start'])} ms + read cycle "
              f"{f(dispatch['activity_end_to_end'][Act.MCP_READ_CYCLE])} ms, means during the churn)")
        print(f"  targets met         {r['targets_met']}")
        tf, cc = r["temporal_floor"], r["cost_of_a_change"]
        print(f"  temporal floor ms   p50 {f(tf['p50_ms'])}  p99 {f(tf['p99_ms'])}  (n={tf['samples']}; "
              f"signal -> 1 activity on a 2nd queue: txn {f(tf['activity_postgres_p50_ms'])} ms + read "
              f"{f(tf['activity_read_p50_ms'])} ms -> workflow ack)")
        for label, key, mcp_work in (("temporal start floor", "temporal_start_floor", "read"),
                                     ("  subscribe start floor", "temporal_subscribe_start_floor",
                                      "subscribe + read")):
            sf = r[key]
            print(f"  {label} {f(sf['subscriptions_per_s'])}/s  (n={sf['n']}, {sf['concurrency']} "
                  f"starts in flight, {f(sf['seconds'])} s; 1 activity per workflow: txn "
                  f"{f(sf['activity_postgres_p50_ms'])} ms + {mcp_work} {f(sf['activity_read_p50_ms'])} ms; "
                  f"CPU {f(sf['cpu_ms_per_start'])} ms/start, benchmark process + dev server; machine busy "
                  f"{f(sf['machine_busy_pct'], '%')}, other processes "
                  f"{f(sf['other_processes_pct_of_machine'], '%')})")
        byp = cc["by_process_ms_per_change"]
        print(f"  CPU ms/change       {f(cc['cpu_ms_per_change'])} = "
              + " + ".join(f"{k} {f(v)}" for k, v in byp.items())
              + f"   (whole machine {f(cc['whole_machine_busy_ms_per_change'])}; unreadable pids "
                f"{cc['unreadable'] or 'none'})")
        print(f"  {'headline figure':<38} {'this run':>10}   {'before':<16} target")
        for label, get, before, target in HEADLINE_TABLE:
            print(f"  {label:<38} {f(get(r)):>10}   {before:<16} {target}")

