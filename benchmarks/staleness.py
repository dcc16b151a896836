"""The benchmark's staleness figure: the longest gap between reads against the published bound.

Contract:
- Two profiles, each on a fixture MCP server of its own, measured side by side in one benchmark
  run and over the same window as the run's churn:
  ``Profile.POLLING``: the server has no subscribe capability, so the subscription polls; its
  record publishes ``staleness_bound_seconds`` (= ``SubscriptionOptions.poll_interval_seconds``).
  ``Profile.LOST_NOTIFICATIONS``: the server can subscribe, but its ``drop_notifications`` fault
  loses every ``notifications/resources/updated``; only the safety re-read bounds staleness and
  the record publishes ``safety_read_seconds``.
- :func:`start_profile` creates the profile's URIs on its fixture, starts the subscriptions with
  the profile's options (production ``mcpsync.activities.starters.start_subscription``) and waits until each
  accepted its initial read.
- :func:`drive` runs the window: every ``tick_seconds`` each profile gets one edit of a random
  URI (churn) and every subscription gets one catalog word (``catalog_reconciled``, listed=True),
  a pure wake-up of exactly the kind that, before read deadlines, restarted the poll / safety
  timer and so postponed the read without limit. Returns the window on PostgreSQL's clock, the
  clock ``read_requests.issued_at`` is written with.
- :func:`gaps_between_reads` is the figure: per workflow, the gaps between consecutive read
  allocations from the last one at or before the window's start to the window's end, the open
  gap from the last read to the end included. :func:`measure` reports max / p50 / p99 over all
  subscriptions of a profile, the bound the records publish and their ratio. Nothing is
  asserted here: the figure is printed against the bound. :func:`staleness_section` waits for the
  window's end and measures every profile into the run's ``staleness`` section.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from temporalio.client import Client, WorkflowHandle

from benchmarks.common import TASK_QUEUE, fetch_rows, fetch_scalar, percentile, until
from benchmarks.probe import Probe
from benchmarks.services import Scrape
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureControl
from mcpsync.workflows.names import QUERY_SUBSCRIPTION, SIGNAL_CATALOG_RECONCILED, Act
from mcpsync.workflows.records.subscription import CatalogObservation, SubscriptionKey, SubscriptionOptions
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1

__all__ = ["DROP_ALL", "Profile", "ProfileRun", "StalenessPlan", "drive", "gaps_between_reads", "measure",
           "staleness_section", "start_profile"]

DROP_ALL = 1_000_000_000
"""``drop_notifications`` fault value that outlasts any run: every updated notification is lost."""


class Profile(StrEnum):
    POLLING = "polling"
    LOST_NOTIFICATIONS = "subscribe_lost_notifications"

    @property
    def subscribe(self) -> bool:
        """Whether the profile's fixture advertises the subscribe capability."""
        return self is Profile.LOST_NOTIFICATIONS

    @property
    def bound_field(self) -> str:
        """The record field (``resourceSubscription.v1``) that publishes this profile's bound."""
        return "staleness_bound_seconds" if self is Profile.POLLING else "safety_read_seconds"


@dataclass(frozen=True)
class StalenessPlan:
    poll_seconds: float  # POLLING: SubscriptionOptions.poll_interval_seconds
    safety_read_seconds: float  # LOST_NOTIFICATIONS: SubscriptionOptions.safety_read_seconds
    window_seconds: float
    subscriptions: int  # per profile
    tick_seconds: float = 1.0  # one edit per profile and one catalog word per subscription per tick

    def options(self, profile: Profile) -> SubscriptionOptions:
        if profile is Profile.POLLING:
            return SubscriptionOptions(poll_interval_seconds=self.poll_seconds)
        return SubscriptionOptions(safety_read_seconds=self.safety_read_seconds)


@dataclass
class ProfileRun:
    profile: Profile
    server: str
    control: FixtureControl
    keys: list[SubscriptionKey]
    handles: list[WorkflowHandle]
    edits: int = 0
    catalog_words: int = 0


async def start_profile(client: Client, ledger: Ledger, profile: Profile, *, server: str, subject: str,
                        control: FixtureControl, plan: StalenessPlan, task_queue: str) -> ProfileRun:
    """Create the profile's URIs, start their subscriptions and wait for every initial read."""
    keys = [SubscriptionKey(subject=subject, server=server, uri=f"bench://stale/{profile.value}/{i:03d}")
            for i in range(plan.subscriptions)]
    if profile is Profile.LOST_NOTIFICATIONS:
        await control.faults(drop_notifications=DROP_ALL)
    for key in keys:
        await control.create(key.uri, text=f"{key.uri} initial", mime_type="text/plain")
    handles = [await start_subscription(client, key, task_queue=task_queue, options=plan.options(profile))
               for key in keys]

    async def initial_reads() -> bool:
        done = await fetch_scalar(ledger, "SELECT count(*) FROM subscriptions WHERE server=%s "
                                          "AND state='ACTIVE' AND last_accepted_digest IS NOT NULL",
                                  (server,))
        return int(done or 0) >= len(keys)

    if not await until(initial_reads, 60 + 2 * len(keys), 0.25):
        raise RuntimeError(f"staleness {profile.value}: initial reads did not converge")
    if profile.subscribe:  # subscribed for real: the bound is the safety read, not a poll
        for key in keys:
            await control.wait_subscribed(key.uri, timeout=30)
    return ProfileRun(profile, server, control, keys, handles)


async def _pg_now(ledger: Ledger) -> datetime:
    now: datetime = await fetch_scalar(ledger, "SELECT clock_timestamp()")
    return now


async def drive(ledger: Ledger, runs: Sequence[ProfileRun], plan: StalenessPlan,
                rng: random.Random) -> tuple[datetime, datetime]:
    """Churn and catalog words for ``plan.window_seconds``; the window on PostgreSQL's clock."""
    loop = asyncio.get_running_loop()
    start = await _pg_now(ledger)
    t0 = loop.time()
    tick = 0
    while loop.time() - t0 < plan.window_seconds:
        for run in runs:
            uri = rng.choice(run.keys).uri
            await run.control.edit(uri, text=f"{uri} change {tick} {rng.getrandbits(48):x}")
            run.edits += 1
            await asyncio.gather(*(h.signal(SIGNAL_CATALOG_RECONCILED, CatalogObservation(
                uri=k.uri, listed=True, scan_id=f"bench-{tick}", snapshot_status="SNAPSHOT_UNPROVEN",
                session_generation=0)) for k, h in zip(run.keys, run.handles, strict=True)))
            run.catalog_words += len(run.keys)
        tick += 1
        await asyncio.sleep(max(0.0, t0 + tick * plan.tick_seconds - loop.time()))
    return start, await _pg_now(ledger)


def gaps_between_reads(issued: Sequence[datetime], start: datetime, end: datetime) -> list[float]:
    """Seconds between consecutive read allocations of one workflow over [start, end].

    The first gap starts at the last read issued at or before ``start`` (the window starts with a
    read already held; without one, at ``start``); the last one ends at ``end``, so a read that
    never came counts as the whole open gap."""
    times = sorted(issued)
    before = [t for t in times if t <= start]
    inside = [t for t in times if start < t <= end]
    points = [before[-1] if before else start, *inside, end]
    return [(b - a).total_seconds() for a, b in zip(points, points[1:], strict=False)]


async def measure(ledger: Ledger, run: ProfileRun, start: datetime, end: datetime) -> dict[str, Any]:
    """The profile's figure over the window, from ``read_requests`` and the workflows' records."""
    ids = [k.workflow_id for k in run.keys]
    rows = await fetch_rows(ledger, "SELECT workflow_id, issued_at, trigger_reason FROM read_requests"
                                    " WHERE workflow_id = ANY(%s) AND issued_at <= %s", (ids, end))
    issued: dict[str, list[datetime]] = defaultdict(list)
    triggers: dict[str, int] = defaultdict(int)
    for workflow_id, at, trigger in rows:
        issued[workflow_id].append(at)
        if at > start:
            triggers[str(trigger)] += 1
    per_workflow = {wid: gaps_between_reads(issued[wid], start, end) for wid in ids}
    gaps = [g for wid in ids for g in per_workflow[wid]]
    records = [await h.query(QUERY_SUBSCRIPTION, result_type=ResourceSubscriptionV1) for h in run.handles]
    published = {getattr(r, run.profile.bound_field) for r in records}
    bound = next(iter(published)) if len(published) == 1 else None  # None: a record does not publish it
    worst = max(gaps) if gaps else None
    stats = await run.control.stats()
    return {
        "subscriptions": len(ids),
        "server_subscribe_capability": run.profile.subscribe,
        "window_seconds": round((end - start).total_seconds(), 2),
        "reads": sum(triggers.values()),
        "reads_by_trigger": dict(triggers),
        "gaps": len(gaps),
        "max_gap_between_reads_s": None if worst is None else round(worst, 3),
        "gap_p50_s": _round(percentile(gaps, 50)),
        "gap_p99_s": _round(percentile(gaps, 99)),
        "published_bound_s": bound,
        "bound_field": run.profile.bound_field,
        "max_gap_over_bound": None if worst is None or not bound else round(worst / bound, 3),
        "max_gap_where": _where(per_workflow, issued, start),
        "over_bound_s": None if worst is None or bound is None else round(worst - bound, 3),
        "edits": run.edits,
        "catalog_words": run.catalog_words,
        "notifications_dropped": sum(stats["notifications_dropped"].values()),
    }


def _where(per_workflow: dict[str, list[float]], issued: dict[str, list[datetime]],
           start: datetime) -> dict[str, Any] | None:
    """Where the longest gap lies: seconds into the window it began, and whether no read closed it yet."""
    candidates = [(g, wid, i) for wid, gaps in per_workflow.items() for i, g in enumerate(gaps)]
    if not candidates:
        return None
    _, wid, i = max(candidates)
    held = sorted(t for t in issued[wid] if t <= start)
    inside = sorted(t for t in issued[wid] if t > start)
    began = (held[-1] if held else start) if i == 0 else inside[i - 1]
    return {"began_s_into_window": round((began - start).total_seconds(), 3),
            "open_at_window_end": i == len(per_workflow[wid]) - 1}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


async def staleness_section(ledger: Ledger, stale_runs: Sequence[ProfileRun],
                            window: asyncio.Task[tuple[datetime, datetime]], plan: StalenessPlan,
                            during: Scrape, setup_seconds: float, churn_seconds: float) -> dict[str, Any]:
    """The ``staleness`` section of a run: waits for the window's end, then measures each profile."""
    t_wait = time.monotonic()
    w0, w1 = await window
    wait = time.monotonic() - t_wait
    return {
        **{prof.profile.value: await measure(ledger, prof, w0, w1) for prof in stale_runs},
        "window_seconds": round((w1 - w0).total_seconds(), 2),
        "window_overlaps_churn_seconds": round(min(churn_seconds, plan.window_seconds), 2),
        "tick_seconds": plan.tick_seconds,
        "added_wall_seconds": {"subscribe": round(setup_seconds, 2), "window_after_drain": round(wait, 2)},
        # What a read past its deadline waits for: the timer's workflow task, then the read cycle activity.
        "dispatch_during_churn_mean_ms": {
            "workflow_task_schedule_to_start": Probe.mean_ms(
                during, "temporal_workflow_task_schedule_to_start_latency", task_queue=TASK_QUEUE),
            "read_cycle_end_to_end": Probe.mean_ms(during, "temporal_activity_succeed_endtoend_latency",
                                                   activity_type=Act.MCP_READ_CYCLE),
        },
        "what": "gaps between consecutive read_requests.issued_at per subscription (from the last read "
                "before the window to its end, the open gap included); each tick one edit per profile and "
                "one catalog word (catalog_reconciled, listed) per subscription: wake-ups that must not "
                "postpone a read",
    }

