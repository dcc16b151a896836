"""The phases of one benchmark run (``benchmarks.run.run_one``), each a function of the run's
:class:`Bench` and of what the phases before it produced.

Contract:
- :func:`start_bench` starts a run's stack on ``stack`` (database, Temporal dev server, ledger, fixtures,
  mcpsync's services) and waits for the system fixture's MCP session; everything it started stops with
  ``stack``.
- :func:`startup_phase` starts the N subscriptions (a warm-up tenth first): subscriptions/s, CPU and
  memory per subscription. :func:`idle_phase`: the idle cost (``benchmarks.idle``).
  :func:`floor_phase` starts the naive baseline and measures the raw floor; :func:`temporal_floors_phase`
  the Temporal floors (``benchmarks.temporal_floor``). :func:`staleness_start` subscribes the staleness
  profiles and starts their window; :func:`staleness_phase` measures them after the drain.
- :func:`burst_phase`, :func:`revocation_phase` and :func:`targets_phase` come after the churn
  (``benchmarks.churn``). Each phase writes its section(s) into ``Bench.result``.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mcp import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from temporalio.client import Client

from benchmarks import cost, idle, staleness
from benchmarks.common import (
    SUBJECT,
    TASK_QUEUE,
    fetch_rows,
    fetch_scalar,
    gather_limited,
    percentile,
    spread,
    summarize,
    temporal_and_ledger,
    until,
    warmup_count,
)
from benchmarks.figures import headline_figures
from benchmarks.fixtures import BenchFixture
from benchmarks.naive import NaiveClient, measure_floor
from benchmarks.options import Options
from benchmarks.postgres import Postgres
from benchmarks.probe import Probe
from benchmarks.report import TARGETS, Run
from benchmarks.services import Scrape, Services, start_services
from benchmarks.staleness import staleness_section
from benchmarks.temporal_floor import (
    measure_temporal_floor,
    measure_temporal_start_floor,
    start_floor_uris,
    temporal_floor_session,
)
from benchmarks.usage import rss_bytes
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureControl, FixtureProcess, stdio_command, wait_ready_file
from mcpsync.worker.main.config import Config, TemporalConfig
from mcpsync.worker.main.revocation import revoke
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionOptions

__all__ = ["Bench", "StalenessLoad", "burst_phase", "count_reads", "count_verdicts", "floor_phase",
           "idle_phase", "revocation_phase", "session_queue", "staleness_phase", "staleness_start",
           "start_bench", "startup_phase", "subscribed", "targets_phase", "temporal_floors_phase"]


@dataclass
class Bench:
    """One run's stack and names: what every phase works on."""

    transport: str
    n: int
    opts: Options
    run: Run
    say: Callable[[str], None]
    rng: random.Random
    stack: AsyncExitStack
    work: Path
    server: str
    db_name: str
    uris: list[str]
    initial: dict[str, str]
    probe: Probe
    client: Client
    ledger: Ledger
    temporal: TemporalDevServer
    services: Services
    sys_ctl: FixtureControl
    fixture: FixtureProcess | None  # the system fixture's process over HTTP (the baseline shares it)
    base_target: Any  # the naive baseline's MCP transport target
    stale_fx: dict[staleness.Profile, BenchFixture]
    max_cached_workflows: int  # the main worker's cache, in runs

    @property
    def r(self) -> dict[str, Any]:
        return self.run.result


@dataclass
class StalenessLoad:
    """The staleness profiles' subscriptions and their window (None: ``--staleness-subscriptions 0``)."""

    plan: staleness.StalenessPlan
    stale_runs: list[staleness.ProfileRun]
    stale_setup: float
    stale_window: asyncio.Task[tuple[datetime, datetime]] | None


async def session_queue(ledger: Ledger, server: str) -> str:
    """The task queue of the ingress that holds the session (worker/ingress/process.py), from its row."""
    session = await ledger.current_session(SUBJECT, server)
    return session.task_queue if session is not None else ""


async def count_reads(ledger: Ledger, server: str) -> int:
    return int(await fetch_scalar(ledger, "SELECT count(*) FROM read_requests r JOIN subscriptions s "
                                          "USING (workflow_id) WHERE s.server=%s", (server,)) or 0)


async def count_verdicts(ledger: Ledger, server: str) -> dict[str, int]:
    rows = await fetch_rows(ledger, "SELECT status, count(*) FROM resource_versions WHERE server=%s "
                                    "GROUP BY status",
                       (server,))
    return {r[0]: int(r[1]) for r in rows}


def subscribed(uris: Sequence[str], count: int) -> Callable[[dict[str, Any]], bool]:
    """A fixture ``/stats`` predicate: every URI of ``uris`` has ``count`` subscriptions, and every
    session's standalone stream (where notifications arrive over HTTP) is open."""
    def check(stats: dict[str, Any]) -> bool:
        subs = stats["subscriptions"]
        return (all(subs.get(u, 0) >= count for u in uris)
                and all(s["standalone_stream"] is not False for s in stats["sessions"]))
    return check


async def start_bench(stack: AsyncExitStack, run: Run, pg: Postgres, probe: Probe, work: Path, *, server: str,
                      db_name: str, uris: list[str], initial: dict[str, str], rng: random.Random,
                      say: Callable[[str], None]) -> Bench:
    """The run's stack, up to the system fixture's MCP session; see the module contract."""
    transport, n, opts = run.transport, run.n, run.opts
    db_url = await pg.create(db_name)
    stack.push_async_callback(pg.drop, db_name)
    tdir = (Path("/dev/shm") / f"mcpsync-bench-{os.getpid()}-{transport}-{n}"
            if opts.temporal_store == "tmpfs"
            else work / "temporal")
    stack.callback(shutil.rmtree, tdir, True)
    temporal, client, ledger = await temporal_and_ledger(stack, tdir, db_url, runtime=probe.runtime)

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
    # By default every subscription stays in the worker's cache (docs/deploy.md: size it to the
    # subscriptions a worker hosts): above it, each safety read of an evicted workflow replays its history.
    cached = opts.max_cached_workflows or max(TemporalConfig().max_cached_workflows,
                                              n + 2 * opts.staleness_subscriptions + 100)
    config = Config(temporal=TemporalConfig(address=temporal.address, task_queue=TASK_QUEUE,
                                            max_cached_workflows=cached,
                                            workflow_runner=opts.workflow_runner),
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
    return Bench(transport=transport, n=n, opts=opts, run=run, say=say, rng=rng, stack=stack, work=work,
                 server=server, db_name=db_name, uris=uris, initial=initial, probe=probe, client=client,
                 ledger=ledger, temporal=temporal, services=services, sys_ctl=sys_ctl, fixture=fixture,
                 base_target=base_target, stale_fx=stale_fx, max_cached_workflows=cached)


async def startup_phase(b: Bench) -> None:
    """Initial convergence and memory per live subscription: the ``startup`` and ``memory`` sections."""
    transport, n, opts, r, say, uris = b.transport, b.n, b.opts, b.r, b.say, b.uris
    server, client, ledger, services, temporal = b.server, b.client, b.ledger, b.services, b.temporal
    db_name = b.db_name

    async def initial_reads() -> int:
        done = await fetch_scalar(ledger, "SELECT count(*) FROM subscriptions WHERE server=%s AND "
                                          "state='ACTIVE' AND last_accepted_digest IS NOT NULL", (server,))
        return int(done or 0)

    async def progress(every: float = 60.0) -> None:
        """A line a minute while a long start-up runs: how far it got."""
        t0, done0 = time.monotonic(), await initial_reads()
        while True:
            await asyncio.sleep(every)
            done = await initial_reads()
            say(f"start-up: {done} of {n} hold their initial read "
                f"({(done - done0) / (time.monotonic() - t0):.1f}/s)")

    async def subscribe(batch: Sequence[str]) -> tuple[float, float]:
        """Start ``batch``; (seconds to start them, seconds until each accepted its initial read)."""
        t0, wall0 = time.monotonic(), time.time()
        reporter = asyncio.create_task(progress()) if len(batch) >= 2000 else None
        try:
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
                return await initial_reads() >= want

            # A poll every second at large N: the count(*) over every row stays off the measured CPU.
            if not await until(all_initial, 120 + len(batch) * 0.5, 0.25 if len(batch) < 2000 else 1.0):
                raise RuntimeError(f"{transport}: initial reads did not converge")
            # The end is the last initial receipt's accept (PostgreSQL's clock, same host), not when the
            # poll above saw it: at ~30 starts/s a 0.25 s poll alone would add up to 8 % to 45 starts, and
            # the longer poll at large N adds nothing to the measured time.
            last = await fetch_scalar(ledger, "SELECT extract(epoch FROM max(accepted_at))::float8 FROM"
                                              " resource_versions WHERE server=%s AND uri = ANY(%s)"
                                              " AND status='ACCEPTED'", (server, list(batch)))
            return started, (float(last) - wall0) if last else time.monotonic() - t0
        finally:
            if reporter is not None:
                reporter.cancel()

    # A warm-up tenth first: one-time costs (imports into the workflow sandbox, pools, caches) are not
    # per subscription. Memory per subscription is the RSS growth over the other nine tenths.
    overrides: dict[str, Any] = {}
    if opts.subscription_safety_read_seconds is not None:
        overrides["safety_read_seconds"] = opts.subscription_safety_read_seconds
    if opts.subscription_max_history_events is not None:
        overrides["max_history_events"] = opts.subscription_max_history_events
    sub_options = SubscriptionOptions(**overrides) if overrides else None
    warm = warmup_count(n)
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
        "max_cached_workflows": b.max_cached_workflows,
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


async def idle_phase(b: Bench) -> None:
    """Idle cost: the N subscriptions with nothing changing (``benchmarks.idle``): the ``idle`` section."""
    opts, r, say, uris, server, client, ledger = b.opts, b.r, b.say, b.uris, b.server, b.client, b.ledger
    services, temporal, db_name = b.services, b.temporal, b.db_name
    if opts.idle_window > 0:
        say(f"idle: {opts.idle_window:g}s without changes")
        idle_roles, _ = cost.run_processes(temporal.pid, db_name, services.named_processes)
        # The histories of a sample (one round trip per workflow and run), scaled to the N.
        idle_runs = await cost.start_runs(client, spread(
            [SubscriptionKey(subject=SUBJECT, server=server, uri=u).workflow_id for u in uris],
            opts.history_sample))
        gc.collect()
        rss0 = rss_bytes(services.worker_pid)
        scrape0 = await b.probe.scrape()
        r["idle"] = await idle.measure_idle(
            client, ledger, idle_roles, idle_runs, server=server, seconds=opts.idle_window,
            safety_read_seconds=(opts.subscription_safety_read_seconds
                                 or SubscriptionOptions().safety_read_seconds), subscriptions=len(uris))
        gc.collect()
        i = r["idle"]
        i["ledger_batches"] = idle.batches(Probe.diff(await b.probe.scrape(), scrape0))
        # What the worker holds per run can grow after start-up (the SDK core keeps a run's command state
        # machines until the run ends): the window's RSS growth, per subscription and per safety read.
        growth = rss_bytes(services.worker_pid) - rss0
        i["worker_rss_growth_bytes_per_subscription"] = round(growth / i["subscriptions"])
        i["worker_rss_growth_bytes_per_safety_read"] = (round(growth / i["safety_reads"]) if i["safety_reads"]
                                                        else None)
        say(f"idle: {i['cpu_ms_per_subscription_hour']} ms CPU per subscription-hour = " + " + ".join(
            f"{k} {v}" for k, v in i["by_process_ms_per_subscription_hour"].items() if v)
            + f"; {i['history_events_per_subscription_day']} history events and "
            f"{i['temporal_actions_per_subscription_day']} billable actions per subscription-day "
            f"({i['temporal_actions_by_type']}); per unchanged read ({i['unchanged_reads']}): "
            f"{i['history_events_per_unchanged_read']} events, {i['temporal_actions_per_unchanged_read']} "
            f"actions, <= {i['cpu_ms_per_unchanged_read_upper_bound']} ms CPU; "
            f"{i['safety_reads']} safety reads (per subscription-hour: scheduled "
            f"{i['safety_reads_per_subscription_hour_scheduled']}, observed "
            f"{i['safety_reads_per_subscription_hour']}); mean batch: allocate "
            f"{i['ledger_batches']['allocate']['mean_batch']}, accept "
            f"{i['ledger_batches']['accept']['mean_batch']}; worker RSS "
            f"{i['worker_rss_growth_bytes_per_subscription'] / 1024:+.1f} KiB/subscription over the window")


async def floor_phase(b: Bench, floor_uri: str) -> tuple[NaiveClient, FixtureControl]:
    """The naive baseline client, subscribed to every URI, and the raw floor (``floor``); the baseline and
    its fixture's control plane (the system's over HTTP)."""
    opts, r, say, uris, initial, run, stack = b.opts, b.r, b.say, b.uris, b.initial, b.run, b.stack
    fixture, base_target, sys_ctl, work = b.fixture, b.base_target, b.sys_ctl, b.work
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
    await sys_ctl.wait_stats(subscribed(uris, per_uri), timeout=60, interval=0.2)
    if base_ctl is not sys_ctl:
        await base_ctl.wait_stats(subscribed(uris, 1), timeout=60, interval=0.2)
    say("measuring the floor")
    floor = await measure_floor(base, base_ctl, floor_uri, opts.floor_samples)
    r["floor"] = {**summarize([f.total for f in floor]),
                  "notify_p50_ms": summarize([f.notify for f in floor])["p50_ms"],
                  "read_p50_ms": summarize([f.read for f in floor])["p50_ms"],
                  "what": "mutation committed -> notification -> one read completed, sequential, idle"}
    run.curves["floor"] = [f.total for f in floor]
    await base.idle()
    return base, base_ctl


async def temporal_floors_phase(b: Bench) -> None:
    """The Temporal floor (signal -> one activity on a second task queue) and the Temporal start floor (n
    minimal one-activity workflows started like the subscriptions)."""
    opts, r, say, run = b.opts, b.r, b.say, b.run
    client, ledger, fixture, work = b.client, b.ledger, b.fixture, b.work
    temporal, db_name, services = b.temporal, b.db_name, b.services
    say(f"measuring the Temporal floor ({opts.temporal_floor_samples} samples)")
    # --- and the Temporal start floor: n minimal one-activity workflows started like the subscriptions
    start_n = max(1, min(200, r["startup"]["subscriptions_measured"]))
    async with temporal_floor_session(fixture, work, start_floor_uris(start_n)) as floor_mcp:
        r["temporal_floor"] = await measure_temporal_floor(client, ledger, floor_mcp,
                                                           opts.temporal_floor_samples)
        run.curves["temporal_floor"] = r["temporal_floor"].pop("_totals")
        say(f"measuring the Temporal start floor ({start_n} workflows, 32 starts in flight)")
        start_roles, _ = cost.run_processes(temporal.pid, db_name, services.named_processes)
        r["temporal_start_floor"] = await measure_temporal_start_floor(client, ledger, floor_mcp, start_n,
                                                                       start_roles, opts.workflow_runner)
        say(f"measuring the Temporal subscribe start floor ({start_n} workflows, 32 starts in flight)")
        r["temporal_subscribe_start_floor"] = await measure_temporal_start_floor(
            client, ledger, floor_mcp, start_n, start_roles, opts.workflow_runner, subscribe=True)


async def staleness_start(b: Bench) -> StalenessLoad:
    """Staleness profiles: subscribed now, measured over a window that starts with the churn."""
    transport, n, opts, say = b.transport, b.n, b.opts, b.say
    client, ledger, stack = b.client, b.ledger, b.stack
    stale_fx = b.stale_fx
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
    return StalenessLoad(plan, stale_runs, stale_setup, stale_window)


async def staleness_phase(b: Bench, load: StalenessLoad, during: Scrape, t_churn0: float,
                          t_churn1: float) -> None:
    """Staleness: the longest gap between reads against the published bound (``staleness``), then the
    profiles' subscriptions are revoked."""
    r, say, client, ledger = b.r, b.say, b.client, b.ledger
    plan, stale_runs = load.plan, load.stale_runs
    stale_setup, stale_window = load.stale_setup, load.stale_window
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


async def burst_phase(b: Bench, base: NaiveClient) -> None:
    """Burst: notifications without changes, as fast as the fixture delivers them (``burst``)."""
    n, opts, r, say, uris, server, ledger = b.n, b.opts, b.r, b.say, b.uris, b.server, b.ledger
    sys_ctl, services = b.sys_ctl, b.services
    await base.aclose()  # the baseline stops competing for the fixture and the CPU
    await sys_ctl.faults(reset=True)  # nothing dropped from here on
    await asyncio.sleep(0.5)
    per = max(1, min(opts.burst_per_subscription, opts.burst_cap // n))
    targets = uris[: max(1, min(n, opts.burst_cap // per))]  # above the cap: a subset of the URIs
    burst_total = per * len(targets)
    reads_b0, host_b0 = await count_reads(ledger, server), (await services.host_totals(server)).received
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
    burst_reads = await count_reads(ledger, server) - reads_b0
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


async def revocation_phase(b: Bench) -> None:
    """``revoke()`` of a sample at once: effective_at -> outbox 'revoked' row (``revocation``)."""
    n, opts, r, uris = b.n, b.opts, b.r, b.uris
    server, client, ledger, run = b.server, b.client, b.ledger, b.run
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


def targets_phase(b: Bench, sys_lat: Sequence[float | None], sys_conv: dict[str, Any]) -> None:
    """Targets met (reported, never asserted) and the headline figures under flat keys."""
    r = b.r
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
