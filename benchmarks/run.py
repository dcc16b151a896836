"""mcpsync benchmark: one command, JSON + a PNG plot.

    .venv/bin/python -m benchmarks.run [--subscriptions 200] [--series 100,1000]
                                       [--transport http|stdio|both] [--out benchmarks/out] [--quick]
    .venv/bin/python -m benchmarks.run --ingress-scale 1,50,200 [--idle-seconds 10]

Per (transport, N): a fresh Temporal dev server (free ports) and a fresh PostgreSQL database
(``MCPSYNC_DATABASE_URL``'s server, else an embedded one under the state dir); N subscriptions
on one in-process worker (``mcpsync.worker.runtime.run_services``) against the fixture MCP server over
streamable HTTP or stdio. Side by side in the same run:

- the **system** (mcpsync),
- a **naive baseline** (``benchmarks.naive.NaiveClient``: mcp SDK client, ``cache=None``, reads on
  every notification, keeps the last content read), subscribed to the same URIs (over HTTP the
  same server process; over stdio a twin fixture process that receives the same edits),
- the **floor**: one mutation → one notification → one read RTT, sequentially, measured first.

Phases: initial convergence (memory per subscription is measured here) → floor → churn (``rate``
changes/s for ``duration`` s; each change is one edit plus ``k-1`` duplicate notifications, k
uniform in 1..5; one notification in every 100 is dropped through the fixture's
``drop_notifications`` fault) → drain (until everything converged, ``--drain-timeout`` after the
last change, or only changes that lost notifications remain) → repair (one more edit on URIs left
behind by a dropped notification) → burst (notifications without changes, as fast as the fixture
sends them: sustained ingest rate) → revocation (``mcpsync.worker.runtime.revoke`` on a sample).

Staleness (``benchmarks.staleness``), in the same run: right before the churn, two small sets of
subscriptions start on fixture servers of their own: one without subscribe (it polls every
``--poll-seconds``) and one with subscribe whose every notification is dropped (only the safety
re-read, ``--safety-read-seconds``, bounds it). From the churn's start, for ``--staleness-window``
seconds, each gets an edit and catalog words every second (wake-ups); the figure is the longest gap
between two read allocations of a subscription (``read_requests.issued_at``), printed against the
bound its record publishes.

The **Temporal floor** (``benchmarks.floor``), in the same run, right after the raw floor: a minimal
workflow (not mcpsync's) where a signal runs ONE activity on a second task queue doing one PostgreSQL
transaction and one MCP ``resources/read`` (own session, ``cache=None``) against the run's fixture;
signal sent → workflow task that took the result completed. mcpsync's convergence of changes with
a delivered notification is divided by it (``convergence_over_temporal_floor``). Right after it, the
**Temporal start floor** (``benchmarks.floor.measure_starts``): n minimal workflows (n = the startup
phase's measured subscriptions, at most 200; a warm-up tenth first) whose run is that same ONE
activity, started with at most 32 start calls in flight as ``subscribe()`` starts subscriptions;
n ÷ (first start → last completion) is ``temporal_start_floor.subscriptions_per_s``, and the startup
phase's subscriptions/s is divided by it (``initial_subscriptions_over_start_floor``).

**Cost of a change** (``benchmarks.cost``): CPU of the run's processes (this process, the dev server,
the fixtures, PostgreSQL's postmaster, auxiliaries and the run's backends) from /proc over the churn,
and history events / workflow tasks of the subscription workflows from churn start to drain end,
each divided by the churn's changes. The issue-12 figures are also exposed under flat keys
(``temporal_floor_ms``, ``cpu_ms_per_change``, ``history_events_per_change``, ...) and printed
beside the values before the read-cycle rebuild and its targets (printed, never asserted).

Convergence of a change = oracle mutation committed (fixture clock) → first receipt accepted
(PostgreSQL clock, same host) whose digest is this change's or a later change's of that URI;
for the baseline, the first completed read with such a digest. Targets are reported, not asserted.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import math
import os
import platform
import random
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mcp import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from benchmarks import cost, idle, ingress_scale, staleness
from benchmarks.churn import drive_churn, dropped_uris
from benchmarks.common import (
    SUBJECT,
    TASK_QUEUE,
    fetch_rows,
    fetch_scalar,
    gather_limited,
    percentile,
    ratio,
    summarize,
    until,
)
from benchmarks.consumer import OutboxFollower
from benchmarks.convergence import convergence, convergence_report, first_seen, regressions
from benchmarks.figures import cost_of_a_change, headline_figures
from benchmarks.fixtures import BenchFixture
from benchmarks.naive import NaiveClient, measure_floor, text_digest
from benchmarks.options import Options, parse_args
from benchmarks.plot import plot
from benchmarks.postgres import Postgres
from benchmarks.probe import Probe
from benchmarks.report import TARGETS, Run, growth, print_summary
from benchmarks.services import Services, start_services
from benchmarks.staleness import staleness_section
from benchmarks.temporal_floor import (
    measure_temporal_floor,
    measure_temporal_start_floor,
    temporal_floor_session,
)
from benchmarks.usage import cpu_report, cpu_snapshot, rss_bytes
from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureControl, stdio_command, wait_ready_file
from mcpsync.worker.config import Config, TemporalConfig
from mcpsync.worker.runtime import open_ledger, revoke, start_subscription
from mcpsync.worker.stack import state_dir
from mcpsync.worker.stack_temporal import TemporalDevServer
from mcpsync.workflows.records import SubscriptionKey, SubscriptionOptions

__all__ = ["TARGETS", "Options", "main", "run"]

log = logging.getLogger("mcpsync.bench")

REPO = Path(__file__).resolve().parents[1]


async def _session_queue(ledger: Ledger, server: str) -> str:
    """The task queue of the ingress that holds the session (mcpsync.worker.ingress), from its session row."""
    session = await ledger.current_session(SUBJECT, server)
    return session.task_queue if session is not None else ""


async def _sys_reads(ledger: Ledger, server: str) -> int:
    return int(await fetch_scalar(ledger, "SELECT count(*) FROM read_requests r JOIN subscriptions s "
                                          "USING (workflow_id) WHERE s.server=%s", (server,)) or 0)


async def _verdicts(ledger: Ledger, server: str) -> dict[str, int]:
    rows = await fetch_rows(ledger, "SELECT status, count(*) FROM resource_versions WHERE server=%s "
                                    "GROUP BY status",
                       (server,))
    return {r[0]: int(r[1]) for r in rows}


async def run_one(transport: str, n: int, opts: Options, pg: Postgres, work: Path, probe: Probe) -> Run:
    run = Run(transport, n, opts)
    r = run.result
    r.update(transport=transport, subscriptions=n, layout=opts.layout.value)
    rng = random.Random(f"{opts.seed}/{transport}/{n}")
    server = f"bench-{transport}-{n}"  # unique per run: host counters are looked up by server name
    db_name = f"mcpsync_bench_{os.getpid()}_{transport}_{n}_{uuid.uuid4().hex[:6]}"
    uris = [f"bench://doc/{i:05d}" for i in range(n)]
    floor_uri = "bench://floor"
    initial = {u: f"{u} initial" for u in uris}
    work = work / f"{transport}-{n}"
    work.mkdir(parents=True, exist_ok=True)
    t_run = time.monotonic()
    say = _say(transport, n)

    async with AsyncExitStack() as stack:
        db_url = await pg.create(db_name)
        stack.push_async_callback(pg.drop, db_name)
        tdir = (Path("/dev/shm") / f"mcpsync-bench-{os.getpid()}-{transport}-{n}"
                if opts.temporal_store == "tmpfs"
                else work / "temporal")
        temporal = await TemporalDevServer.start(tdir, port=0, ui_port=0)
        stack.push_async_callback(temporal.stop)
        stack.callback(shutil.rmtree, tdir, True)
        client = await Client.connect(temporal.address, data_converter=pydantic_data_converter,
                                      runtime=probe.runtime)
        ledger = await open_ledger(db_url, max_size=16)
        stack.push_async_callback(ledger.pool.close)

        system_fx = await BenchFixture.start(stack, transport, work, server)
        fixture = system_fx.process  # over HTTP the baseline shares it
        base_target: Any
        if fixture is not None:
            base_target = streamable_http_client(fixture.mcp_url, http_client=create_mcp_http_client())
        else:
            bcommand, benv = stdio_command(ready_file=work / "ready-baseline.json", seed="none",
                                           log_level="WARNING")
            base_target = StdioServerParameters(command=bcommand[0], args=bcommand[1:], env=benv)
        # The staleness profiles' servers (no subscribe; subscribe with every notification lost) run from the
        # start, idle until their subscriptions start right before the churn.
        stale_fx = {p: await BenchFixture.start(stack, transport, work,
                                                f"{server}-{p.value.replace('_', '-')}",
                                                subscribe=p.subscribe, catalog=False)
                    for p in staleness.Profile if opts.staleness_subscriptions > 0}
        # Every subscription stays in the worker's cache (docs/deploy.md: size it to the subscriptions a
        # worker hosts): above it, each safety read of an evicted workflow replays its history.
        cached = max(TemporalConfig().max_cached_workflows, n + 2 * opts.staleness_subscriptions + 100)
        config = Config(temporal=TemporalConfig(address=temporal.address, task_queue=TASK_QUEUE,
                                                max_cached_workflows=cached),
                        servers=[system_fx.config, *(f.config for f in stale_fx.values())])
        services: Services = await start_services(opts.layout, config, client, ledger, db_url,
                                                  work / "services")
        stack.push_async_callback(services.stop)
        probe.also = services.metrics_urls
        stack.callback(setattr, probe, "also", [])

        sys_ctl = await system_fx.control(stack)
        await gather_limited([sys_ctl.create(u, text=initial[u], mime_type="text/plain") for u in uris], 16)

        async def session_open() -> bool:
            await services.check()
            return await ledger.current_session(SUBJECT, server) is not None

        if not await until(session_open, 60):
            raise RuntimeError(f"{transport}: no MCP session within 60 s")

        # --- initial convergence and memory per live subscription -------------------------------------
        async def subscribe(batch: Sequence[str]) -> tuple[float, float]:
            """Start ``batch``; (seconds to start them, seconds until each accepted its initial read)."""
            t0, wall0 = time.monotonic(), time.time()
            await gather_limited([start_subscription(client,
                                                     SubscriptionKey(subject=SUBJECT, server=server, uri=u),
                                                     task_queue=TASK_QUEUE, options=sub_options)
                                  for u in batch], 32)
            started = time.monotonic() - t0
            want = len(batch) + int(await fetch_scalar(ledger, "SELECT count(*) FROM subscriptions "
                                                               "WHERE server=%s AND state='ACTIVE' "
                                                               "AND last_accepted_digest IS NOT NULL AND "
                                                               "NOT (uri = ANY(%s))",
                                                       (server, list(batch))) or 0)

            async def all_initial() -> bool:
                done = await fetch_scalar(ledger, "SELECT count(*) FROM subscriptions WHERE server=%s "
                                                  "AND state='ACTIVE' AND last_accepted_digest IS NOT NULL",
                                          (server,))
                return int(done or 0) >= want

            if not await until(all_initial, 120 + len(batch) * 0.5, 0.25):
                raise RuntimeError(f"{transport}: initial reads did not converge")
            # The end is the last initial receipt's accept (PostgreSQL's clock, same host), not when the
            # 0.25 s poll above saw it: at ~30 starts/s the poll alone would add up to 8 % to 45 starts.
            last = await fetch_scalar(ledger, "SELECT extract(epoch FROM max(accepted_at))::float8 FROM"
                                              " resource_versions WHERE server=%s AND uri = ANY(%s)"
                                              " AND status='ACCEPTED'", (server, list(batch)))
            return started, (float(last) - wall0) if last else time.monotonic() - t0

        # A warm-up tenth first: one-time costs (imports into the workflow sandbox, pools, caches) are not
        # per subscription. Memory per subscription is the RSS growth over the other nine tenths.
        sub_options = (SubscriptionOptions(safety_read_seconds=opts.subscription_safety_read_seconds)
                       if opts.subscription_safety_read_seconds is not None else None)
        warm = max(1, n // 10)
        say(f"starting {n} subscriptions ({warm} warm-up first)")
        await subscribe(uris[:warm])
        await asyncio.sleep(1.0)
        gc.collect()
        rss0, trss0 = rss_bytes(services.worker_pid), rss_bytes(temporal.pid)
        # CPU per subscription over the same window, by process (the dev server, PostgreSQL, mcpsync's
        # processes, this one: the start calls and the ledger polling that finds the end).
        startup_roles, _ = cost.run_processes(temporal.pid, db_name, services.named_processes)
        startup_cpu0 = cost.cpu_sample(startup_roles)
        started, converged = await subscribe(uris[warm:]) if n > warm else (0.0, 1e-9)
        startup_cpu = cost.cpu_delta(startup_cpu0, cost.cpu_sample(startup_roles), n - warm)
        await asyncio.sleep(1.0)  # let the last workflow tasks finish before measuring memory
        gc.collect()
        rss1, trss1 = rss_bytes(services.worker_pid), rss_bytes(temporal.pid)
        measured = max(1, n - warm)
        r["startup"] = {
            "subscriptions_measured": n - warm,
            "start_seconds": round(started, 2),
            "initial_convergence_seconds": round(converged, 2),
            "subscriptions_per_second": round((n - warm) / converged, 1),
            "cpu_ms_per_subscription": startup_cpu["cpu_ms_per_change"],
            "by_process_ms_per_subscription": startup_cpu["by_process_ms_per_change"],
        }
        r["memory"] = {
            "worker_rss_before_bytes": rss0,
            "worker_rss_after_bytes": rss1,
            "worker_bytes_per_subscription": round((rss1 - rss0) / measured),
            "temporal_server_rss_before_bytes": trss0,
            "temporal_server_rss_after_bytes": trss1,
            "temporal_server_bytes_per_subscription": round((trss1 - trss0) / measured),
            "note": "RSS growth while the last N - N/10 subscriptions started and accepted their initial "
                    "read, divided by their number; the worker is the main worker's process (split layout) "
                    "or this process (in-process layout; the baseline client is not started yet)",
        }
        by_start = " + ".join(f"{k} {v}" for k, v in startup_cpu["by_process_ms_per_change"].items() if v)
        say(f"initial convergence of {n - warm}: {converged:.1f}s, worker "
            f"{(rss1 - rss0) / measured / 1024:.1f} KiB/subscription, CPU {startup_cpu['cpu_ms_per_change']} "
            f"ms/subscription = {by_start}")

        # --- idle cost: the N subscriptions with nothing changing (benchmarks.idle) ---------------------
        if opts.idle_window > 0:
            say(f"idle: {opts.idle_window:g}s without changes")
            idle_roles, _ = cost.run_processes(temporal.pid, db_name, services.named_processes)
            idle_runs = await cost.start_runs(
                client, [SubscriptionKey(subject=SUBJECT, server=server, uri=u).workflow_id for u in uris])
            r["idle"] = await idle.measure_idle(
                client, ledger, idle_roles, idle_runs, server=server, seconds=opts.idle_window,
                safety_read_seconds=(opts.subscription_safety_read_seconds
                                     or SubscriptionOptions().safety_read_seconds))
            i = r["idle"]
            say(f"idle: {i['cpu_ms_per_subscription_hour']} ms CPU per subscription-hour = " + " + ".join(
                f"{k} {v}" for k, v in i["by_process_ms_per_subscription_hour"].items() if v)
                + f"; {i['history_events_per_subscription_day']} history events per subscription-day; "
                f"{i['safety_reads']} safety reads (per subscription-hour: scheduled "
                f"{i['safety_reads_per_subscription_hour_scheduled']}, observed "
                f"{i['safety_reads_per_subscription_hour']})")

        # --- baseline client and the floor --------------------------------------------------------
        base = NaiveClient(base_target)
        await base.start()
        stack.push_async_callback(base.aclose)
        if fixture is not None:
            base_ctl: FixtureControl = fixture
            await base_ctl.create(floor_uri, text="floor", mime_type="text/plain")
        else:
            info = await wait_ready_file(work / "ready-baseline.json", timeout=30)
            base_ctl = FixtureControl(info["control_url"])
            stack.push_async_callback(base_ctl.aclose)
            await gather_limited([base_ctl.create(u, text=initial.get(u, "floor"), mime_type="text/plain")
                                  for u in [*uris, floor_uri]], 16)
        await base.subscribe([*uris, floor_uri])
        await base.read_all(uris)
        per_uri = 2 if fixture is not None else 1

        def subscribed(count: int) -> Callable[[dict[str, Any]], bool]:
            def check(stats: dict[str, Any]) -> bool:
                subs = stats["subscriptions"]
                return (all(subs.get(u, 0) >= count for u in uris)
                        and all(s["standalone_stream"] is not False for s in stats["sessions"]))
            return check

        await sys_ctl.wait_stats(subscribed(per_uri), timeout=60, interval=0.2)
        if base_ctl is not sys_ctl:
            await base_ctl.wait_stats(subscribed(1), timeout=60, interval=0.2)
        say("measuring the floor")
        floor = await measure_floor(base, base_ctl, floor_uri, opts.floor_samples)
        r["floor"] = {**summarize([f.total for f in floor]),
                      "notify_p50_ms": summarize([f.notify for f in floor])["p50_ms"],
                      "read_p50_ms": summarize([f.read for f in floor])["p50_ms"],
                      "what": "mutation committed -> notification -> one read completed, sequential, idle"}
        run.curves["floor"] = [f.total for f in floor]
        await base.idle()

        # --- the Temporal floor: signal -> one activity (one transaction + one read) on a second task queue
        say(f"measuring the Temporal floor ({opts.temporal_floor_samples} samples)")
        # --- and the Temporal start floor: n minimal one-activity workflows started like the subscriptions
        start_n = max(1, min(200, r["startup"]["subscriptions_measured"]))
        async with temporal_floor_session(fixture, work) as floor_mcp:
            r["temporal_floor"] = await measure_temporal_floor(client, ledger, floor_mcp,
                                                               opts.temporal_floor_samples)
            run.curves["temporal_floor"] = r["temporal_floor"].pop("_totals")
            say(f"measuring the Temporal start floor ({start_n} workflows, 32 starts in flight)")
            start_roles, _ = cost.run_processes(temporal.pid, db_name, services.named_processes)
            r["temporal_start_floor"] = await measure_temporal_start_floor(client, ledger, floor_mcp, start_n,
                                                                           start_roles)

        # --- staleness profiles: subscribed now, measured over a window that starts with the churn --------
        plan = opts.staleness_plan()
        t_stale0 = time.monotonic()
        stale_runs = [await staleness.start_profile(client, ledger, p, server=f.config.name, subject=SUBJECT,
                                                    control=await f.control(stack), plan=plan,
                                                    task_queue=TASK_QUEUE)
                      for p, f in stale_fx.items()]
        stale_setup = time.monotonic() - t_stale0
        stale_window: asyncio.Task[tuple[datetime, datetime]] | None = None
        # --staleness-subscriptions 0: no staleness load during the churn (cost of a change alone)
        if stale_runs:
            say(f"staleness: {plan.subscriptions} subscriptions per profile, poll {plan.poll_seconds:g}s / "
                f"safety read {plan.safety_read_seconds:g}s, catalog words and edits every "
                f"{plan.tick_seconds:g}s for {plan.window_seconds:g}s")
            stale_window = asyncio.create_task(
                staleness.drive(ledger, stale_runs, plan,
                                random.Random(f"{opts.seed}/{transport}/{n}/staleness")),
                name="bench-staleness")
            stack.callback(stale_window.cancel)

        # --- churn ---------------------------------------------------------------------------------
        follower = await OutboxFollower.start(ledger)  # accept -> consumer received (docs/outbox.md)
        stack.push_async_callback(follower.stop)
        controls = [sys_ctl] if base_ctl is sys_ctl else [sys_ctl, base_ctl]
        reads0, base_reads0, base_notes0 = await _sys_reads(ledger, server), base.reads, base.notifications
        verdicts0 = await _verdicts(ledger, server)
        host0 = await services.host_totals(server)
        completions0 = len(base.completions)
        subscription_runs = await cost.start_runs(
            client, [SubscriptionKey(subject=SUBJECT, server=server, uri=u).workflow_id for u in uris])
        roles, role_notes = cost.run_processes(temporal.pid, db_name, services.named_processes)
        scrape0 = await probe.scrape()
        cpu0 = cpu_snapshot()
        proc_cpu0 = cost.cpu_sample(roles)
        say(f"churn: {opts.rate:g} changes/s for {opts.duration:g}s")
        t_churn0 = time.time()
        changes, lag = await drive_churn(controls, uris, opts, rng)
        t_churn1 = time.time()
        cpu_churn = cpu_report(cpu0, cpu_snapshot())
        proc_cpu = cost.cpu_delta(proc_cpu0, cost.cpu_sample(roles), len(changes))
        final = {ch.uri: ch.digest for ch in changes}

        # --- drain ---------------------------------------------------------------------------------
        async def unconverged() -> tuple[set[str], set[str]]:
            held = dict(await fetch_rows(ledger, "SELECT uri, last_accepted_digest FROM subscriptions "
                                                 "WHERE server=%s",
                                    (server,)))
            return ({u for u, d in final.items() if held.get(u) != d},
                    {u for u, d in final.items() if base.held.get(u) != d})

        t_drain0 = time.monotonic()
        last_progress, last_state = time.monotonic(), (-1, -1)
        stuck_reason = "converged"
        while True:
            sys_left, base_left = await unconverged()
            if not sys_left and not base_left:
                break
            state = (len(sys_left), len(base_left))
            if state != last_state:
                last_state, last_progress = state, time.monotonic()
            if time.time() - t_churn1 > opts.drain_timeout:
                stuck_reason = f"drain timeout ({opts.drain_timeout:g}s after the last change)"
                break
            if time.monotonic() - last_progress > 10:
                dropped = await dropped_uris(controls)
                if (sys_left | base_left) <= dropped:
                    stuck_reason = "only URIs whose notifications were dropped are behind"
                    break
            await asyncio.sleep(0.25)
        drain_seconds = time.monotonic() - t_drain0
        sys_left, base_left = await unconverged()
        await base.idle()
        during = Probe.diff(await probe.scrape(), scrape0)
        t_drain1 = time.time()
        window_history = await cost.history_per_change(client, subscription_runs, t_churn0, t_drain1)

        consumer_lat, consumer_missing = await follower.latencies(t_churn0)
        # --- staleness: the longest gap between reads against the published bound ----------------------
        if stale_window is None:
            r["staleness"] = {"skipped": "--staleness-subscriptions 0"}
        else:
            r["staleness"] = await staleness_section(ledger, stale_runs, stale_window, plan, during,
                                                     stale_setup, t_churn1 - t_churn0)
        for prof in stale_runs:  # their periodic reads must not load the later phases
            await revoke(client, ledger, subject=SUBJECT, server=prof.server, uri=None,
                         reason="benchmark: staleness window over")
        for prof in stale_runs:
            st = r["staleness"][prof.profile.value]
            say(f"staleness {prof.profile.value}: max gap {st['max_gap_between_reads_s']}s vs bound "
                f"{st['published_bound_s']}s ({st['max_gap_over_bound']}x), {st['reads']} reads")

        # --- what happened -------------------------------------------------------------------------
        receipts = await fetch_rows(ledger, "SELECT uri, content_digest, extract(epoch "
                                            "FROM accepted_at)::float8 FROM resource_versions "
                                            "WHERE server=%s AND status IN ('ACCEPTED','UNCHANGED') "
                                            "ORDER BY receipt_id", (server,))
        accepted_seq = await fetch_rows(ledger, "SELECT uri, content_digest FROM resource_versions "
                                                "WHERE server=%s AND status='ACCEPTED' ORDER BY receipt_id",
                                        (server,))
        sys_lat = convergence(changes, first_seen([(u, d, t) for u, d, t in receipts]), baseline=False)
        base_completions = base.completions[completions0:]
        base_lat = convergence(changes, first_seen(base_completions), baseline=True)
        sys_reads = await _sys_reads(ledger, server) - reads0
        by_trigger = dict(await fetch_rows(
            ledger, "SELECT r.trigger_reason, count(*) FROM read_requests r JOIN subscriptions s "
                    "USING (workflow_id) WHERE s.server=%s AND r.issued_at >= to_timestamp(%s) GROUP BY 1",
            (server, t_churn0)))
        read_cycle = [float(x[0]) for x in await fetch_rows(
            ledger, "SELECT extract(epoch FROM r.completed_at - r.issued_at)::float8 FROM read_requests r "
                    "JOIN subscriptions s USING (workflow_id) WHERE s.server=%s AND r.completed_at IS "
                    "NOT NULL AND r.issued_at >= to_timestamp(%s)", (server, t_churn0))]
        base_reads = base.reads - base_reads0
        verdicts1 = await _verdicts(ledger, server)
        verdicts = {k: v - verdicts0.get(k, 0) for k, v in verdicts1.items() if v - verdicts0.get(k, 0)}
        host1 = await services.host_totals(server)
        stats = await sys_ctl.stats()
        dropped_total = sum(stats["notifications_dropped"].values())
        churn_seconds = t_churn1 - t_churn0
        offered = sum(ch.k for ch in changes)
        received = host1.received - host0.received
        sys_conv = convergence_report(sys_lat, [ch.lost(0) for ch in changes])
        base_conv = convergence_report(base_lat, [ch.lost(1) for ch in changes])
        run.curves["system"] = [x for x in sys_lat if x is not None]
        run.curves["baseline"] = [x for x in base_lat if x is not None]
        accepted_new = verdicts.get("ACCEPTED", 0)
        r["churn"] = {
            "duration_seconds": round(churn_seconds, 2),
            "changes": len(changes),
            "changes_per_second": round(len(changes) / churn_seconds, 2),
            "driver_max_lag_ms": round(lag * 1000, 1),
            "uris_changed": len(final),
            "notifications_per_change_mean": round(offered / len(changes), 3) if changes else None,
            "notifications_offered": offered,
            "notifications_dropped": dropped_total,
            "notifications_dropped_pct": round(100 * dropped_total / offered, 3) if offered else None,
            "drain_seconds": round(drain_seconds, 2),
            "drain_ended": stuck_reason,
            "cpu": cpu_churn,
        }
        r["system"] = {
            "reads": sys_reads,
            "reads_per_change": round(sys_reads / len(changes), 3) if changes else None,
            "reads_by_trigger": by_trigger,
            "accepted_new_digest_receipts": accepted_new,
            "reads_per_accepted_receipt": round(sys_reads / accepted_new, 3) if accepted_new else None,
            "verdicts": verdicts,
            "notifications_received": received,
            "notifications_coalesced_at_ingress": host1.coalesced - host0.coalesced,
            "notifications_read_at_ingress": host1.read - host0.read,
            "notifications_per_second": round(received / churn_seconds, 1),
            "convergence": sys_conv,
            "uris_behind_at_end": len(sys_left),
            "regressions": regressions(changes, accepted_seq),
            "read_cycle": summarize(read_cycle),
            "where_time_goes_ms": probe.breakdown(during, server, await _session_queue(ledger, server)),
        }
        r["consumer"] = {**summarize(consumer_lat), "not_received": consumer_missing,
                         "what": "outbox row written (created_at: its accept transaction) -> received by a "
                                 "durable consumer following with LISTEN/NOTIFY "
                                 "(mcpsync.activities.outbox.OutboxConsumer.follow), churn events only"}
        r["baseline"] = {
            "reads": base_reads,
            "reads_per_change": round(base_reads / len(changes), 3) if changes else None,
            "read_errors": base.read_errors,
            "notifications_received": base.notifications - base_notes0,
            "convergence": base_conv,
            "uris_behind_at_end": len(base_left),
            "regressions": regressions(changes, [(u, d) for u, d, _ in base_completions]),
        }
        fl = r["floor"]
        r["comparison"] = {
            "amplification_vs_baseline": ratio(r["system"]["reads_per_change"],
                                               r["baseline"]["reads_per_change"]),
            "convergence_p50_vs_baseline": ratio(sys_conv["p50_ms"], base_conv["p50_ms"]),
            "convergence_p99_vs_baseline": ratio(sys_conv["p99_ms"], base_conv["p99_ms"]),
            "convergence_p999_vs_baseline": ratio(sys_conv["p999_ms"], base_conv["p999_ms"]),
            "convergence_p50_vs_floor": ratio(sys_conv["p50_ms"], fl["p50_ms"]),
            "convergence_p99_vs_floor": ratio(sys_conv["p99_ms"], fl["p99_ms"]),
            "convergence_p999_vs_floor": ratio(sys_conv["p999_ms"], fl["p999_ms"]),
            "delivered_p999_vs_floor": ratio(sys_conv["with_a_delivered_notification"]["p999_ms"],
                                             fl["p999_ms"]),
            "baseline_p50_vs_floor": ratio(base_conv["p50_ms"], fl["p50_ms"]),
        }
        r["cost_of_a_change"] = cost_of_a_change(r, proc_cpu, role_notes, window_history, len(changes))
        say(f"system p50/p99/p99.9 {sys_conv['p50_ms']}/{sys_conv['p99_ms']}/{sys_conv['p999_ms']} ms, "
            f"{r['system']['reads_per_change']} reads/change (baseline {r['baseline']['reads_per_change']})")

        # --- repair: URIs left behind by dropped notifications converge only with a later change ----------
        behind = sorted(sys_left)
        repaired = 0
        t_rep = time.monotonic()
        if behind:
            for u in behind:
                text = f"{u} repair {rng.getrandbits(48):x}"
                for c in controls:
                    await c.edit(u, text=text)
                final[u] = text_digest(text)

            async def repaired_all() -> bool:
                s_left, _ = await unconverged()
                return not (s_left & set(behind))

            await until(repaired_all, 30, 0.25)
            s_left, _ = await unconverged()
            repaired = len(set(behind) - s_left)
        r["repair"] = {"uris_behind": len(behind), "repaired_by_one_more_change": repaired,
                       "seconds": round(time.monotonic() - t_rep, 2),
                       "note": "a change whose every notification was lost stays behind until the URI's "
                               "next change, a session change or the safety re-read "
                               "(SubscriptionOptions.safety_read_seconds, default 300 s jittered down to "
                               "240 s: longer than the drain waits)"}

        # --- burst: notifications without changes, as fast as the fixture delivers them -------------------
        await base.aclose()  # the baseline stops competing for the fixture and the CPU
        await sys_ctl.faults(reset=True)  # nothing dropped from here on
        await asyncio.sleep(0.5)
        per = max(1, min(opts.burst_per_subscription, opts.burst_cap // n))
        targets = uris[: max(1, min(n, opts.burst_cap // per))]  # above the cap: a subset of the URIs
        burst_total = per * len(targets)
        reads_b0, host_b0 = await _sys_reads(ledger, server), (await services.host_totals(server)).received
        t_b0 = time.time()
        await gather_limited([sys_ctl.notify(u, times=per) for u in targets], 8)
        t_sent = time.time()
        got_all_at: float | None = None

        async def settled() -> bool:
            nonlocal got_all_at
            # Polled every 50 ms: once every notification arrived, stop scraping the ingress (a scrape
            # costs the ingress CPU in the split layout, while it is the thing being measured).
            if got_all_at is None and (await services.host_totals(server)).received - host_b0 >= burst_total:
                got_all_at = time.time()
            pending = await fetch_scalar(ledger, "SELECT count(*) FROM read_requests r "
                                                 "JOIN subscriptions s USING (workflow_id) "
                                                 "WHERE s.server=%s AND r.completed_at IS NULL", (server,))
            return got_all_at is not None and int(pending or 0) == 0

        await until(settled, 120, 0.05)
        await asyncio.sleep(1.0)
        last_read = await fetch_scalar(ledger, "SELECT extract(epoch FROM max(r.completed_at))::float8 "
                                               "FROM read_requests r JOIN subscriptions s "
                                               "USING (workflow_id) WHERE s.server=%s", (server,))
        burst_reads = await _sys_reads(ledger, server) - reads_b0
        got = (await services.host_totals(server)).received - host_b0
        settle = max((last_read or t_b0) - t_b0, (got_all_at or t_b0) - t_b0, 1e-6)
        r["burst"] = {
            "notifications": burst_total,
            "received": got,
            "send_seconds": round(t_sent - t_b0, 3),
            "ingress_seconds": round((got_all_at or time.time()) - t_b0, 3),
            "settle_seconds": round(settle, 3),
            "reads": burst_reads,
            "notifications_per_second": round(got / settle, 1),
            "reads_per_second": round(burst_reads / settle, 1),
            "uris": len(targets),
            "what": f"{per} notifications per URI without content change; settle = last read completed",
        }
        say(f"burst: {got} notifications settled in {settle:.2f}s ({got / settle:.0f}/s), "
            f"{burst_reads} reads")

        # --- revocation ----------------------------------------------------------------------------
        sample = uris[: min(opts.revocations, n)]
        effective = datetime.now(UTC)
        await asyncio.gather(*(revoke(client, ledger, subject=SUBJECT, server=server, uri=u,
                                      reason="benchmark", effective_at=effective) for u in sample))

        async def revoked() -> bool:
            c = await fetch_scalar(ledger, "SELECT count(*) FROM revocations WHERE server=%s", (server,))
            return int(c or 0) >= len(sample)

        await until(revoked, 60, 0.1)
        lat = [float(x[0]) for x in await fetch_rows(
            ledger, "SELECT extract(epoch FROM o.created_at - r.effective_at)::float8 FROM revocations r"
                    " JOIN outbox o ON o.outbox_id = r.outbox_id WHERE r.server=%s", (server,))]
        r["revocation"] = {**summarize(lat), "sample": len(sample),
                           "what": "revoke() of the sample at once: effective_at -> outbox 'revoked' row"}
        run.curves["revocation"] = lat

        p999_all = percentile([math.inf if x is None else x for x in sys_lat], 99.9)
        bound = TARGETS["convergence_p999_max_seconds"]
        r["targets_met"] = {
            "amplification": (r["system"]["reads_per_change"] or 99) <= TARGETS["amplification_max"],
            "convergence_p999_over_all_changes": p999_all is not None and p999_all <= bound,
            "convergence_p999_with_a_delivered_notification":
                sys_conv["with_a_delivered_notification"]["unconverged"] == 0
                and (sys_conv["with_a_delivered_notification"]["p999_ms"] or 1e12) <= bound * 1000,
            "revocation_p99": (r["revocation"]["p99_ms"]
                               or 1e12) <= TARGETS["revocation_p99_max_seconds"] * 1000,
        }
        r.update(headline_figures(r))
        r["run_seconds"] = round(time.monotonic() - t_run, 1)
    shutil.rmtree(work, ignore_errors=True)
    return run


def _say(transport: str, n: int) -> Callable[[str], None]:
    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {transport} N={n}: {msg}", flush=True)

    return say


def _read_or_empty(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


async def run_isolated(opts: Options, argv: Sequence[str]) -> list[Run]:
    """Each (transport, N) in a fresh child process: RSS deltas and warm caches do not leak between runs."""
    runs: list[Run] = []
    for transport in opts.transports:
        for n in opts.subscriptions:
            result = (opts.out / f".run-{transport}-{n}.json").resolve()
            result.unlink(missing_ok=True)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "benchmarks.run", *argv, "--single", f"{transport}:{n}", "--result",
                str(result), cwd=str(REPO))
            code = await proc.wait()
            text = await asyncio.to_thread(_read_or_empty, result)
            if code != 0 or not text:
                raise RuntimeError(f"the {transport} N={n} run failed (exit code {code}); see its output "
                                   "above")
            data = json.loads(text)
            result.unlink()
            runs.append(Run(transport, n, opts, result=data["result"], curves=data["curves"]))
    return runs


async def run_single(opts: Options, transport: str, n: int, result: Path) -> None:
    pg = Postgres()
    await pg.start()
    probe = Probe()
    work = state_dir() / "bench" / f"run-{os.getpid()}"
    try:
        one = await run_one(transport, n, opts, pg, work, probe)
    finally:
        await probe.aclose()
        await pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    one.result["postgresql"] = ("MCPSYNC_DATABASE_URL" if os.environ.get("MCPSYNC_DATABASE_URL")
                                else "embedded")
    payload = json.dumps({"result": one.result, "curves": one.curves})
    await asyncio.to_thread(result.write_text, payload)


async def run(opts: Options, argv: Sequence[str] = ()) -> dict[str, Any]:
    opts.out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    runs = await run_isolated(opts, argv)
    grown = growth(runs)
    report = {
        "benchmark": "mcpsync",
        "started_at": started.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": sys.version.split()[0]},
        "postgresql": "MCPSYNC_DATABASE_URL" if os.environ.get("MCPSYNC_DATABASE_URL") else "embedded",
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in opts.__dict__.items()
                    if k not in ("single", "result")},
        "targets": TARGETS,
        "runs": [x.result for x in runs],
        "growth": grown,
        "notes": [
            "Targets are reported, never asserted.",
            "Convergence: oracle commit -> first receipt with that or a later version (system) / first read "
            "completion with it (baseline). p99.9 over fewer than 1000 changes is the maximum.",
            "A change whose every notification was dropped cannot converge by notification: see 'repair'.",
            "The baseline keeps the last read to complete; 'regressions' counts how often it went back to an "
            "older version (mcpsync's fence forbids it).",
            "Staleness: the longest gap between two read allocations of a subscription "
            "(read_requests.issued_at) against the bound its record publishes (staleness_bound_seconds "
            "when polling, safety_read_seconds with subscribe); the periodic read is a deadline armed at "
            "allocation, so the gap may exceed the bound by one dispatch (allocation path), never by a "
            "wake-up.",
        ],
    }
    await asyncio.to_thread((opts.out / "results.json").write_text, json.dumps(report, indent=2))
    await asyncio.to_thread(plot, runs, opts.out / "results.png", grown)
    return report


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    opts = parse_args(args)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    code = 0
    try:
        if opts.ingress_scale is not None:
            scale = ingress_scale.run_scale(opts.ingress_scale, opts.idle_seconds, opts.out)
            ingress_scale.print_table(scale)
            print(f"\nwrote {opts.out / 'ingress_scale.json'}")
        elif opts.single is not None:
            transport, _, n = opts.single.partition(":")
            assert opts.result is not None, "--single needs --result"
            asyncio.run(run_single(opts, transport, int(n), opts.result))
        else:
            report = asyncio.run(run(opts, args))
            print_summary(report)
            print(f"\nwrote {opts.out / 'results.json'} and {opts.out / 'results.png'}")
    except KeyboardInterrupt:
        code = 130
    except Exception as exc:
        logging.getLogger("mcpsync.bench").exception("benchmark failed: %s", exc)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a process that ran a Temporal worker can abort at interpreter exit (sdk-python#300)


if __name__ == "__main__":
    main()

