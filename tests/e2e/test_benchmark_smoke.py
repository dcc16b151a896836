"""Smoke test of the benchmark command: a tiny ``--quick`` run of each transport, the two commands at once.

Checks the shape and sanity of the JSON and that a real PNG was written; no timing
thresholds (the targets are reported by the benchmark, never asserted).
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from benchmarks.png import Canvas, encode_png
from benchmarks.staleness import gaps_between_reads
from mcpsync.workflows.verification_rules import verification_delay

REPO = Path(__file__).resolve().parents[2]


def test_png_writer_round_trips() -> None:
    c = Canvas(7, 3)
    c.set(1, 1, (255, 0, 0))
    data = c.png()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (7, 3)
    idat_len = struct.unpack(">I", data[33:37])[0]
    raw = zlib.decompress(data[41:41 + idat_len])
    assert len(raw) == 3 * (1 + 7 * 3) and raw[1 + 21 + 1 + 3:1 + 21 + 1 + 6] == b"\xff\x00\x00"
    with pytest.raises(ValueError):
        encode_png(2, 2, b"\x00")


def test_gaps_between_reads_start_at_the_held_read_and_count_the_open_gap() -> None:
    t0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    at = [t0 + timedelta(seconds=s) for s in (0.0, 3.0, 8.0, 9.5, 30.0)]
    # Window [5, 20]: from the read at 3 s (held when the window opened) to 8, 9.5, then open until 20;
    # the read at 30 s is after the window, the one at 0 s before the held one.
    assert gaps_between_reads(at, t0 + timedelta(seconds=5), t0 + timedelta(seconds=20)) == [5.0, 1.5, 10.5]
    # No read at all in or before the window: the whole window is one gap.
    assert gaps_between_reads([], t0, t0 + timedelta(seconds=7)) == [7.0]


def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


BENCH_OPTIONS = (
    "--quick", "--subscriptions", "6", "--duration", "3", "--floor-samples", "5",
    "--temporal-floor-samples", "5", "--revocations", "2", "--drain-timeout", "15", "--poll-seconds", "2",
    "--safety-read-seconds", "2.5", "--staleness-window", "5", "--staleness-subscriptions", "2",
    "--idle-window", "2", "--max-cached-workflows", "64", "--subscription-max-history-events", "4000")


@dataclass(frozen=True)
class BenchRun:
    """One benchmark command: its process, its wall clock (every duration the run reports fits in it) and
    where it wrote."""

    proc: subprocess.CompletedProcess[str]
    wall: float
    out: Path


def _benchmark(transport: str, out: Path, database_url: str) -> BenchRun:
    """``python -m benchmarks.run`` of one transport with ``BENCH_OPTIONS``."""
    env = {**os.environ, "MCPSYNC_DATABASE_URL": database_url, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", *BENCH_OPTIONS, "--transport", transport,
                           "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    return BenchRun(proc, time.monotonic() - started, out)


@pytest.fixture(scope="module")
def benchmark_runs(tmp_path_factory: pytest.TempPathFactory,
                   database_url: str) -> Iterator[dict[str, Future[BenchRun]]]:
    """The benchmark command of each transport, both started at once: each is a command of its own, whose run
    is alone in its child process as always."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {t: pool.submit(_benchmark, t, tmp_path_factory.mktemp(f"bench-{t}") / "out", database_url)
               for t in ("http", "stdio")}


@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_quick_benchmark_writes_sane_json_and_png(transport: str,
                                                  benchmark_runs: dict[str, Future[BenchRun]]) -> None:
    """The benchmark command of ``transport``: every section of its ``results.json``, the summary it prints
    and its PNG."""
    run = benchmark_runs[transport].result()
    proc, wall, out = run.proc, run.wall, run.out
    assert proc.returncode == 0, f"benchmark failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "== mcpsync benchmark ==" in proc.stdout

    report = json.loads((out / "results.json").read_text())
    speed = report["machine"]["speed"]  # the yardstick two boxes' CPU figures compare through
    assert speed["python_loop_ms"] > 0 and speed["sha256_ms"] > 0, speed
    assert "box yardstick: python loop" in proc.stdout
    assert report["targets"] == {"amplification_max": 1.05, "convergence_p999_max_seconds": 1.0,
                                 "revocation_p99_max_seconds": 2.0}
    assert [(r["transport"], r["subscriptions"]) for r in report["runs"]] == [(transport, 6)]
    for r in report["runs"]:
        for section in ("startup", "memory", "floor", "churn", "system", "baseline", "comparison", "repair",
                        "burst", "revocation", "consumer", "targets_met"):
            assert section in r, f"{r['transport']}: no {section}"
        churn, system, baseline = r["churn"], r["system"], r["baseline"]
        assert churn["changes"] > 0 and churn["notifications_offered"] >= churn["changes"]
        assert 1 <= churn["notifications_per_change_mean"] <= 5
        assert 0 <= churn["notifications_dropped"] <= churn["notifications_offered"]
        assert _num(churn["cpu"]["machine_busy_pct"])
        for side in (system, baseline):
            conv = side["convergence"]
            assert conv["changes"] == churn["changes"]
            assert 0 <= conv["unconverged"] <= conv["changes"]
            assert 0 <= conv["converged_within_60s_pct"] <= 100
            if conv["samples"]:
                assert 0 <= conv["p50_ms"] <= conv["p99_ms"] <= conv["p999_ms"] <= conv["max_ms"]
            delivered, lost = conv["with_a_delivered_notification"], conv["all_notifications_dropped"]
            assert delivered["changes"] + lost["changes"] == conv["changes"]
            assert len(lost["latencies_ms"]) == lost["changes"] >= lost["converged_later"]
            assert side["reads"] > 0 and side["reads_per_change"] > 0
        assert system["regressions"] == 0, "the fence let an older version replace a newer one"
        assert system["notifications_received"] > 0
        assert _num(system["read_cycle"]["p50_ms"])
        assert "workflow_task_schedule_to_start" in system["where_time_goes_ms"]
        assert r["floor"]["samples"] > 0 and r["floor"]["p50_ms"] > 0
        assert _num(r["comparison"]["amplification_vs_baseline"])
        assert _num(r["comparison"]["convergence_p50_vs_floor"])
        assert (r["memory"]["worker_rss_after_bytes"] > 0
                and _num(r["memory"]["worker_bytes_per_subscription"]))
        assert r["memory"]["max_cached_workflows"] == 64, "--max-cached-workflows did not reach the worker"
        assert r["startup"]["subscriptions_per_second"] > 0
        # The dev server and mcpsync's worker did work for every start (the ingress too, split layout).
        by_start = r["startup"]["by_process_ms_per_subscription"]
        assert by_start["temporal_dev_server"] > 0 and r["startup"]["cpu_ms_per_subscription"] >= \
            by_start["temporal_dev_server"], by_start
        assert r["burst"]["received"] == r["burst"]["notifications"] > 0
        assert r["burst"]["notifications_per_second"] > 0
        assert r["revocation"]["samples"] == r["revocation"]["sample"] == 2
        assert 0 <= r["revocation"]["p50_ms"] <= r["revocation"]["p99_ms"]
        assert r["repair"]["repaired_by_one_more_change"] <= r["repair"]["uris_behind"]
        consumer = r["consumer"]
        assert consumer["samples"] > 0 and consumer["not_received"] == 0, ("every churn event reached the "
                                                                           "consumer")
        assert 0 <= consumer["p50_ms"] <= consumer["p99_ms"]
        assert all(isinstance(v, bool) for v in r["targets_met"].values())
        _check_staleness(r["staleness"], wall)
        _check_cost_of_a_change(r, wall)

    assert "staleness polling" in proc.stdout and "staleness subscribe_lost_notifications" in proc.stdout
    assert "temporal floor ms" in proc.stdout and "history events per change" in proc.stdout
    assert "temporal start floor /s" in proc.stdout and "initial subscriptions / start floor" in proc.stdout
    assert "initial / subscribe start floor" in proc.stdout
    png = (out / "results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 640 and height >= 380


def _check_staleness(section: dict[str, Any], wall: float) -> None:
    """Both profiles measured from real read_requests rows against the bound their records publish
    (no timing threshold: the ratio is printed, not asserted). ``wall``: the run's seconds."""
    assert section["window_seconds"] >= 5 and section["window_overlaps_churn_seconds"] > 0
    added = section["added_wall_seconds"]
    assert set(added) == {"subscribe", "window_after_drain"} and all(_num(v) for v in added.values())
    # Subscribing the staleness profiles takes time; the wait after the drain may be none (rounded to
    # 0.01 s); both happened within the run.
    assert 0 < added["subscribe"] and 0 <= added["window_after_drain"]
    assert added["subscribe"] + added["window_after_drain"] <= wall, (added, wall)
    expected = {"polling": ("staleness_bound_seconds", 2.0, False),
                "subscribe_lost_notifications": ("safety_read_seconds", 2.5, True)}
    for profile, (field, bound, subscribe) in expected.items():
        st = section[profile]
        assert st["bound_field"] == field and st["published_bound_s"] == bound, profile
        assert st["server_subscribe_capability"] is subscribe
        assert st["subscriptions"] == 2 and st["catalog_words"] > 0 and st["edits"] > 0
        assert st["reads"] > 0 and st["gaps"] == st["reads"] + st["subscriptions"], ("one more gap than "
                                                                                     "reads each")
        gap = st["max_gap_between_reads_s"]
        assert _num(gap) and gap > 0 and 0 < st["gap_p50_s"] <= st["gap_p99_s"] <= gap
        where = st["max_gap_where"]
        assert _num(where["began_s_into_window"]) and isinstance(where["open_at_window_end"], bool)
        ratio = st["max_gap_over_bound"]
        assert _num(ratio) and math.isfinite(ratio) and ratio == pytest.approx(gap / bound, abs=1e-3)
    lost = section["subscribe_lost_notifications"]
    assert lost["notifications_dropped"] > 0, "the lost-notifications profile lost nothing"
    # Safety reads only: the workflow's timer ("poll") or the ingress's sweep, which reads as a
    # notified read does ("updated"). A notification that got through is read at its edit, on top of
    # the sweep's cadence (a row is due no sooner than ``verification_delay`` after any read of it).
    triggers = lost["reads_by_trigger"]
    assert triggers.get("poll", 0) + triggers.get("updated", 0) > 0, "no safety read in the window"
    cadence = verification_delay(lost["published_bound_s"], 0.0)
    assert triggers.get("updated", 0) <= lost["subscriptions"] * (lost["window_seconds"] / cadence + 2), \
        "more reads than safety reads: a notification got through"


def _check_cost_of_a_change(r: dict[str, Any], wall: float) -> None:
    """Issue 12's figures exist and come from real data: floor samples from a real history, CPU read from
    /proc for every process of the run, history events counted in the subscriptions' histories.
    ``wall``: the run's seconds."""
    tf = r["temporal_floor"]
    assert tf["samples"] == 5 and tf["missing"] == 0
    assert (0 < tf["p50_ms"] <= tf["p99_ms"] <= tf["max_ms"] <= wall * 1000
            and 0 < tf["signal_to_activity_done_p50_ms"])
    assert tf["activity_postgres_p50_ms"] > 0 and tf["activity_read_p50_ms"] > 0
    assert set(tf["steps_p50_ms"]) == {"sent_to_signaled", "signaled_to_scheduled", "scheduled_to_started",
                                       "started_to_completed", "completed_to_ack"}
    # Each step is the time between two events of one sample (a signal, a workflow task, an activity
    # dispatch or run, the task that took its result: none is instantaneous), and a sample's steps add up
    # to its total, so each step's p50 is positive and no longer than the slowest sample (0.01: rounding).
    for step, v in tf["steps_p50_ms"].items():
        assert _num(v) and 0 < v <= tf["max_ms"] + 0.01, (step, v, tf["max_ms"])
    # Per sample: signaled, 3 workflow-task events, 3 activity events, 3 more workflow-task events.
    assert tf["history_events"] >= 10 * tf["samples"] and tf["workflow_tasks_completed"] >= 2 * tf["samples"]
    assert r["temporal_floor_ms"] == {"p50": tf["p50_ms"], "p99": tf["p99_ms"]}
    delivered = r["system"]["convergence"]["with_a_delivered_notification"]
    over = r["convergence_over_temporal_floor"]
    assert over["p50"] == pytest.approx(delivered["p50_ms"] / tf["p50_ms"], abs=1e-3)
    assert over["p99"] == pytest.approx(delivered["p99_ms"] / tf["p99_ms"], abs=1e-3)

    cost = r["cost_of_a_change"]
    assert cost["unreadable"] == [], "a process of the run could not be read"
    assert cost["processes"]["benchmark_process"] == 1 and cost["processes"]["temporal_dev_server"] >= 1
    assert cost["processes"]["postgresql"] >= 2, "the postmaster and a backend of the run's database"
    assert cost["processes"]["fixtures"] >= 1
    by = cost["by_process_ms_per_change"]
    assert by["benchmark_process"] > 0 and by["temporal_dev_server"] > 0
    # The default layout: mcpsync's main worker and ingress are processes of their own, and both worked.
    assert r["layout"] == "split"
    assert cost["processes"]["mcpsync_worker"] == 1 and cost["processes"]["mcpsync_ingress"] == 1
    assert by["mcpsync_worker"] > 0 and by["mcpsync_ingress"] > 0
    assert r["mcpsync_cpu_ms_per_change"] == pytest.approx(
        by["mcpsync_worker"] + by["mcpsync_ingress"] + by["temporal_dev_server"] + by["postgresql"], abs=0.5)
    assert r["cpu_ms_per_change"] == cost["cpu_ms_per_change"] == pytest.approx(sum(by.values()), abs=0.5)
    assert cost["cpu_seconds"] > 0

    history = cost["history"]
    assert history["workflows"] == r["subscriptions"] and history["runs"] >= history["workflows"]
    assert history["events"] > 0 and history["workflow_tasks_completed"] > 0 and history["signals"] > 0
    # Reads at the ingress: a change reaches its workflow as a report, not as a read it schedules.
    assert history["activities_scheduled"] < history["signals"], history
    assert r["history_events_per_change"] == history["events_per_change"] > 0
    assert r["workflow_tasks_per_change"] == history["workflow_tasks_per_change"] > 0
    assert history["events"] >= 3 * history["workflow_tasks_completed"], ("each task is scheduled, started, "
                                                                          "completed")
    # Billable actions from the same histories (benchmarks.actions): every signal is one; workflow tasks none.
    by_action = history["temporal_actions_by_type"]
    assert by_action.get("signal_workflow") == history["signals"], (by_action, history["signals"])
    assert history["temporal_actions"] == sum(by_action.values()) >= history["signals"]

    assert r["burst_reads_per_s"] == r["burst"]["reads_per_second"] > 0
    assert r["initial_subscriptions_per_s"] == r["startup"]["subscriptions_per_second"] > 0
    assert r["reads_per_change_vs_naive"] == r["comparison"]["amplification_vs_baseline"]

    # The Temporal start floor: as many one-activity workflows as the startup phase timed, 32 starts in
    # flight.
    sf = r["temporal_start_floor"]
    assert (sf["n"] == r["startup"]["subscriptions_measured"] == 5 and sf["concurrency"] == 32
            and sf["warmup"] == 1)
    assert _num(sf["subscriptions_per_s"]) and sf["subscriptions_per_s"] > 0
    assert 0 < sf["start_seconds"] <= sf["seconds"]
    assert sf["subscriptions_per_s"] == pytest.approx(sf["n"] / sf["seconds"], rel=0.05, abs=0.1)
    assert sf["activity_postgres_p50_ms"] > 0 and sf["activity_read_p50_ms"] > 0
    assert _num(sf["cpu_ms_per_start"]) and sf["cpu_ms_per_start"] > 0
    assert _num(sf["machine_busy_pct"]) and _num(sf["other_processes_pct_of_machine"])
    by_start = sf["by_process_ms_per_start"]
    assert sf["cpu_ms_per_start"] == pytest.approx(
        by_start["benchmark_process"] + by_start["temporal_dev_server"], abs=0.2)
    assert r["temporal_start_floor_per_s"] == sf["subscriptions_per_s"]
    assert r["initial_subscriptions_over_start_floor"] == pytest.approx(
        r["initial_subscriptions_per_s"] / sf["subscriptions_per_s"], abs=1e-3)
    # The subscribe start floor: the same shape, its activity subscribing to and reading URIs of its own (a
    # failed subscribe fails its workflow, and the run with it).
    ssf = r["temporal_subscribe_start_floor"]
    assert ssf["n"] == sf["n"] and ssf["warmup"] == sf["warmup"] and ssf["subscriptions_per_s"] > 0
    assert "resources/subscribe" in ssf["what"] and "resources/subscribe" not in sf["what"]
    assert r["initial_subscriptions_over_subscribe_start_floor"] == pytest.approx(
        r["initial_subscriptions_per_s"] / ssf["subscriptions_per_s"], abs=1e-3)

    # Idle cost: the window after start-up, per subscription-hour and by process; the headline keys.
    idle = r["idle"]
    assert idle["subscriptions"] == 6 and 1.5 <= idle["window_seconds"] < 30
    by_idle = idle["by_process_ms_per_subscription_hour"]
    # Six idle subscriptions for 2 s cost a tick or two of CPU (10 ms) in all, so which process shows
    # it is chance: every role is reported, none negative, and the total is their sum.
    assert set(by_idle) >= {"mcpsync_worker", "mcpsync_ingress", "temporal_dev_server"}, by_idle
    assert all(v >= 0 for v in by_idle.values()), by_idle
    assert idle["cpu_ms_per_subscription_hour"] == pytest.approx(sum(by_idle.values()), rel=0.01, abs=0.5)
    assert r["idle_cpu_ms_per_subscription_hour"] == idle["cpu_ms_per_subscription_hour"]
    assert r["history_events_per_subscription_day"] == idle["history_events_per_subscription_day"] >= 0
    # The ledger's due band at its mean draw (12.78 an hour at 300 s).
    assert idle["safety_reads_per_subscription_hour_scheduled"] == pytest.approx(
        3600 / verification_delay(300, 0.5), abs=0.01)
    # The worker's RSS over the window: an int per subscription (either sign: the allocator may give pages
    # back), and per safety read only when there was one (none is due in 2 s at the 300 s period).
    assert isinstance(idle["worker_rss_growth_bytes_per_subscription"], int)
    assert idle["worker_rss_growth_bytes_per_safety_read"] is None or idle["safety_reads"] > 0
    assert r["worker_bytes_per_subscription"] == r["memory"]["worker_bytes_per_subscription"]
    # The window's history by event type and its billable actions; per unchanged read only when one was read.
    assert idle["history_events"] == sum(idle["history_events_by_type"].values())
    assert idle["temporal_actions"] == sum(idle["temporal_actions_by_type"].values()) >= 0
    assert r["temporal_actions_per_subscription_day"] == idle["temporal_actions_per_subscription_day"]
    assert (idle["history_events_per_unchanged_read"] is None) == (idle["unchanged_reads"] == 0)
    assert idle["at_production_period"]["safety_read_seconds"] == 300
    assert _num(idle["machine_busy_pct"]) and _num(idle["other_processes_pct_of_machine"])


def test_scale_only_runs_start_churn_and_idle_with_memory_and_the_verification_schedule(
        tmp_path: Path, database_url: str) -> None:
    """--scale-only over HTTP, N = 4, a 2 s safety-read period so the window holds verifications, the
    histories read on a sample of 2 and scaled to 4."""
    out = tmp_path / "out"
    env = {**os.environ, "MCPSYNC_DATABASE_URL": database_url, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--scale-only", "--transport", "http", "--subscriptions",
         "4", "--rate", "2", "--duration", "1", "--drain-timeout", "15", "--idle-window", "1.5",
         "--subscription-safety-read-seconds", "2", "--max-cached-workflows", "2", "--history-sample", "2",
         "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, f"benchmark failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "== mcpsync scale figure ==" in proc.stdout
    report = json.loads((out / "results.json").read_text())
    assert report["targets"]["convergence_p99_max_ms"] == 250.0
    [r] = report["runs"]
    assert (r["transport"], r["subscriptions"]) == ("http", 4)
    assert {"startup", "memory", "churn", "system", "cost_of_a_change", "idle", "memory_by_process",
            "verification", "scale"} <= set(r)
    skipped = {"baseline", "comparison", "floor", "temporal_floor", "staleness", "burst", "revocation"}
    assert not skipped & set(r), "--scale-only ran a phase the scale figure does not need"
    conv = r["system"]["convergence"]
    assert r["churn"]["changes"] > 0 and conv["changes"] == r["churn"]["changes"]
    # Two histories read, standing for four.
    assert (r["idle"]["subscriptions"], r["idle"]["history_sampled_workflows"]) == (4, 2)
    history = r["cost_of_a_change"]["history"]
    assert (history["workflows"], history["sampled_workflows"]) == (4, 2) and history["events"] > 0

    mem = r["memory_by_process"]
    assert mem["unreadable_pids"] == []
    for role in ("mcpsync_worker", "mcpsync_ingress", "temporal_dev_server", "postgresql", "fixtures"):
        held = mem["at_idle_end"][role]
        assert held["processes"] >= 1 and 0 < held["pss"] <= held["rss"], (role, held)
    per = mem["kib_per_subscription"]
    assert per["all_processes"]["held_pss"] == pytest.approx(
        sum(per[role]["held_pss"] for role in mem["at_idle_end"]), abs=0.5)
    assert 0 < per["mcpsync_processes"]["held_pss"] < per["all_processes"]["held_pss"]

    v = r["verification"]
    assert v["rows"] == 4 and v["verifications"] >= 4, "a 2 s period over the churn and the idle window"
    assert _num(v["max_gap_over_period"]) and v["max_gap_over_period"] > 0
    assert v["max_gap_over_period"] == v["row_max_gap_over_period"]["max"] == v["worst"][0]["over_period"]
    assert set(v["at_end"]) == {"rows_overdue", "rows_never_verified", "rows_due", "most_late_due_seconds"}
    assert v["due_during_idle"]["samples"] >= 1

    s = r["scale"]
    assert s["convergence_p99_ms"] == conv["p99_ms"] and s["max_cached_workflows"] == 2
    assert s["delivered_p99_ms"] == conv["with_a_delivered_notification"]["p99_ms"]
    assert s["max_gap_over_period"] == v["max_gap_over_period"]
    assert s["worker_kib_per_subscription"] == per["mcpsync_worker"]["held_rss"] > 0
    assert set(s["targets_met"]) == {"convergence_p99", "box_busy", "memory_all_processes", "memory_worker",
                                     "verifications_on_schedule"}
    assert all(isinstance(x, bool) for x in s["targets_met"].values())
    png = (out / "results.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24])[0] >= 2 * 640, "the convergence and the verification panels"
