"""The churn and what follows it in one benchmark run (``benchmarks.run.run_one``).

Contract:
- :func:`drive_churn` edits at a steady rate on every fixture of the run, with duplicate notifications
  and dropped ones (the fixture's ``drop_notifications`` fault), charged to the change they belong to.
- :func:`churn_phase` runs it with the counters, CPU and metrics it is measured against (:class:`Churn`);
  :func:`drain_phase` waits until mcpsync and the baseline hold every URI's last change, the drain
  timeout, or only changes that lost their notifications are behind (:class:`Drain`);
  :func:`churn_report` writes what happened (``churn``, ``system``, ``consumer``, ``baseline``,
  ``comparison``, ``cost_of_a_change``); :func:`repair_phase` edits the URIs left behind once more.
- Without a baseline (``--scale-only``: no naive client) the same phases measure mcpsync alone and the
  ``baseline`` and ``comparison`` sections are left out.
- What the drain polls and the convergence report reads grows with the changes, not with N: the rows of
  the URIs the churn changed and the receipts since its start; the histories are a sample of the
  workflows (``--history-sample``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from benchmarks import cost
from benchmarks.common import SUBJECT, fetch_rows, ratio, spread, summarize, until
from benchmarks.consumer import OutboxFollower
from benchmarks.convergence import Change, convergence, convergence_report, first_seen, regressions
from benchmarks.figures import cost_of_a_change
from benchmarks.naive import NaiveClient, text_digest
from benchmarks.options import Options
from benchmarks.phases import Bench, count_reads, count_verdicts, session_queue
from benchmarks.probe import Probe
from benchmarks.services import Scrape
from benchmarks.usage import cpu_report, cpu_snapshot
from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureControl
from mcpsync.worker.observe.metrics import HostTotals
from mcpsync.workflows.records.subscription import SubscriptionKey

__all__ = ["Churn", "Drain", "churn_phase", "churn_report", "drain_phase", "drive_churn", "dropped_uris",
           "repair_phase"]


def ts(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


async def dropped_uris(controls: Sequence[FixtureControl]) -> set[str]:
    out: set[str] = set()
    for c in controls:
        out |= set((await c.stats())["notifications_dropped"])
    return out


async def drive_churn(controls: Sequence[FixtureControl], uris: Sequence[str], opts: Options,
                      rng: random.Random) -> tuple[list[Change], float]:
    """Edit at ``opts.rate``/s; each edit notifies once, ``k-1`` duplicates follow; 1/``drop_every`` dropped.

    A drop is armed through the fixture's ``drop_notifications`` fault (the next notification it
    sends is lost); once consumed, ``/stats`` names the URI and the drop is charged to the latest
    change of that URI (``Change.dropped``: per fixture, system first)."""
    loop = asyncio.get_running_loop()
    changes: list[Change] = []
    latest: dict[str, Change] = {}
    start = loop.time()
    total = int(opts.rate * opts.duration)
    notified, next_drop, lag = 0, opts.drop_every, 0.0
    armed: list[dict[str, int] | None] = [None] * len(controls)  # dropped-per-URI before arming

    async def settle_drops(final: bool = False) -> None:
        for j, c in enumerate(controls):
            before = armed[j]
            if before is None:
                continue
            if not final and (await c.faults())["drop_notifications"] > 0:
                continue  # not consumed yet
            after: dict[str, int] = (await c.stats())["notifications_dropped"]
            if final:
                await c.faults(drop_notifications=0)  # an unconsumed drop must not hit the later phases
            for uri, count in after.items():
                if count > before.get(uri, 0) and uri in latest:
                    latest[uri].dropped[j] += count - before.get(uri, 0)
            armed[j] = None

    for i in range(total):
        due = start + i / opts.rate
        now = loop.time()
        if due > now:
            await asyncio.sleep(due - now)
        lag = max(lag, loop.time() - due)
        await settle_drops()
        uri = rng.choice(uris)
        k = rng.randint(1, opts.max_notify)
        text = f"{uri} change {i} {rng.getrandbits(48):x}"
        committed: list[float] = []
        for c in controls:
            m = await c.edit(uri, text=text)
            committed.append(ts(m["committed_at"]))
            if k > 1:
                await c.notify(uri, times=k - 1)
        ch = Change(i, uri, text_digest(text), k, committed[0], committed[-1], [0] * len(controls))
        changes.append(ch)
        latest[uri] = ch
        notified += k
        if notified >= next_drop:
            next_drop += opts.drop_every
            for j, c in enumerate(controls):
                if armed[j] is None:
                    armed[j] = dict((await c.stats())["notifications_dropped"])
                    await c.faults(drop_notifications=1)  # the next notification this fixture sends is lost
    await asyncio.sleep(0.5)
    await settle_drops(final=True)
    return changes, lag


@dataclass
class Churn:
    """What the churn phase made and the counters it started from (the drain and the report diff them)."""

    ledger: Ledger
    server: str
    base: NaiveClient | None  # None: no naive baseline (--scale-only)
    follower: OutboxFollower
    controls: list[FixtureControl]
    reads0: int
    base_reads0: int
    base_notes0: int
    verdicts0: dict[str, int]
    host0: HostTotals
    completions0: int
    subscription_runs: Any
    role_notes: list[str]
    scrape0: Scrape
    t_churn0: float
    t_churn1: float
    changes: list[Change]
    lag: float
    cpu_churn: dict[str, Any]
    proc_cpu: dict[str, Any]
    final: dict[str, str]  # uri -> the digest of its last change

    async def unconverged(self) -> tuple[set[str], set[str]]:
        """URIs whose last change mcpsync (first set) and the baseline (second) do not hold yet."""
        ledger, server, final, base = self.ledger, self.server, self.final, self.base
        held = dict(await fetch_rows(ledger, "SELECT uri, last_accepted_digest FROM subscriptions "
                                             "WHERE server=%s AND uri = ANY(%s)",
                                (server, list(final))))
        return ({u for u, d in final.items() if held.get(u) != d},
                set() if base is None else {u for u, d in final.items() if base.held.get(u) != d})


@dataclass
class Drain:
    """How the drain ended and what the churn window measured up to its end."""

    sys_left: set[str]
    base_left: set[str]
    drain_seconds: float
    stuck_reason: str
    during: Scrape  # the probe's diff over churn + drain
    window_history: cost.WindowHistory
    consumer_lat: list[float]
    consumer_missing: int


async def churn_phase(b: Bench, base: NaiveClient | None, base_ctl: FixtureControl | None) -> Churn:
    """``opts.rate`` changes/s for ``opts.duration`` s on every fixture (:func:`drive_churn`), CPU measured
    over it; ``base`` None: mcpsync alone (its fixture's edits only)."""
    opts, say, uris, rng = b.opts, b.say, b.uris, b.rng
    server, client, ledger, stack = b.server, b.client, b.ledger, b.stack
    sys_ctl, services, temporal, db_name, probe = b.sys_ctl, b.services, b.temporal, b.db_name, b.probe
    follower = await OutboxFollower.start(ledger)  # accept -> consumer received (docs/outbox.md)
    stack.push_async_callback(follower.stop)
    controls = [sys_ctl] if base_ctl is None or base_ctl is sys_ctl else [sys_ctl, base_ctl]
    reads0 = await count_reads(ledger, server)
    base_reads0, base_notes0 = (base.reads, base.notifications) if base is not None else (0, 0)
    verdicts0 = await count_verdicts(ledger, server)
    host0 = await services.host_totals(server)
    completions0 = len(base.completions) if base is not None else 0
    subscription_runs = await cost.start_runs(client, spread(
        [SubscriptionKey(subject=SUBJECT, server=server, uri=u).workflow_id for u in uris],
        opts.history_sample))
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
    return Churn(ledger=ledger, server=server, base=base, follower=follower, controls=controls, reads0=reads0,
                 base_reads0=base_reads0, base_notes0=base_notes0, verdicts0=verdicts0, host0=host0,
                 completions0=completions0, subscription_runs=subscription_runs, role_notes=role_notes,
                 scrape0=scrape0, t_churn0=t_churn0, t_churn1=t_churn1, changes=changes, lag=lag,
                 cpu_churn=cpu_churn, proc_cpu=proc_cpu, final=final)


async def drain_phase(b: Bench, churn: Churn) -> Drain:
    """Until everything converged, ``opts.drain_timeout`` after the last change, or only changes that lost
    notifications remain; then the churn window's history and the outbox consumer's latencies."""
    opts, client, probe = b.opts, b.client, b.probe
    base, controls, unconverged, scrape0 = churn.base, churn.controls, churn.unconverged, churn.scrape0
    subscription_runs, t_churn0 = churn.subscription_runs, churn.t_churn0
    t_churn1, follower = churn.t_churn1, churn.follower

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
    if base is not None:
        await base.idle()
    during = Probe.diff(await probe.scrape(), scrape0)
    t_drain1 = time.time()
    window_history = await cost.history_per_change(client, subscription_runs, t_churn0, t_drain1,
                                                   of=len(b.uris))

    consumer_lat, consumer_missing = await follower.latencies(t_churn0)
    return Drain(sys_left=sys_left, base_left=base_left, drain_seconds=drain_seconds,
                 stuck_reason=stuck_reason, during=during, window_history=window_history,
                 consumer_lat=consumer_lat, consumer_missing=consumer_missing)


async def churn_report(b: Bench, churn: Churn, drain: Drain) -> tuple[list[float | None], dict[str, Any]]:
    """What happened: the ``churn``, ``system``, ``consumer``, ``baseline``, ``comparison`` (with a baseline)
    and ``cost_of_a_change`` sections; mcpsync's convergence per change and its report."""
    r, run, say, server = b.r, b.run, b.say, b.server
    ledger, sys_ctl, services, probe = b.ledger, b.sys_ctl, b.services, b.probe
    changes, final, lag, cpu_churn = churn.changes, churn.final, churn.lag, churn.cpu_churn
    reads0, verdicts0 = churn.reads0, churn.verdicts0
    host0, t_churn0, t_churn1 = churn.host0, churn.t_churn0, churn.t_churn1
    proc_cpu, role_notes = churn.proc_cpu, churn.role_notes
    sys_left = drain.sys_left
    drain_seconds, stuck_reason = drain.drain_seconds, drain.stuck_reason
    during, window_history = drain.during, drain.window_history
    consumer_lat, consumer_missing = drain.consumer_lat, drain.consumer_missing
    # A change's content is new: no receipt before the churn holds it, nor one of a URI it did not change.
    changed = (server, list(final), t_churn0)
    receipts = await fetch_rows(ledger, "SELECT uri, content_digest, extract(epoch "
                                        "FROM accepted_at)::float8 FROM resource_versions "
                                        "WHERE server=%s AND uri = ANY(%s) AND accepted_at >= "
                                        "to_timestamp(%s) AND status IN ('ACCEPTED','UNCHANGED') "
                                        "ORDER BY receipt_id", changed)
    accepted_seq = await fetch_rows(ledger, "SELECT uri, content_digest FROM resource_versions "
                                            "WHERE server=%s AND uri = ANY(%s) AND accepted_at >= "
                                            "to_timestamp(%s) AND status='ACCEPTED' ORDER BY receipt_id",
                                    changed)
    sys_lat = convergence(changes, first_seen([(u, d, t) for u, d, t in receipts]), baseline=False)
    sys_reads = await count_reads(ledger, server) - reads0
    by_trigger = dict(await fetch_rows(
        ledger, "SELECT r.trigger_reason, count(*) FROM read_requests r JOIN subscriptions s "
                "USING (workflow_id) WHERE s.server=%s AND r.issued_at >= to_timestamp(%s) GROUP BY 1",
        (server, t_churn0)))
    read_cycle = [float(x[0]) for x in await fetch_rows(
        ledger, "SELECT extract(epoch FROM r.completed_at - r.issued_at)::float8 FROM read_requests r "
                "JOIN subscriptions s USING (workflow_id) WHERE s.server=%s AND r.completed_at IS "
                "NOT NULL AND r.issued_at >= to_timestamp(%s)", (server, t_churn0))]
    verdicts1 = await count_verdicts(ledger, server)
    verdicts = {k: v - verdicts0.get(k, 0) for k, v in verdicts1.items() if v - verdicts0.get(k, 0)}
    host1 = await services.host_totals(server)
    stats = await sys_ctl.stats()
    dropped_total = sum(stats["notifications_dropped"].values())
    churn_seconds = t_churn1 - t_churn0
    offered = sum(ch.k for ch in changes)
    received = host1.received - host0.received
    sys_conv = convergence_report(sys_lat, [ch.lost(0) for ch in changes])
    run.curves["system"] = [x for x in sys_lat if x is not None]
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
        "notifications_verified_at_ingress": host1.verified - host0.verified,
        "notifications_per_second": round(received / churn_seconds, 1),
        "convergence": sys_conv,
        "uris_behind_at_end": len(sys_left),
        "regressions": regressions(changes, accepted_seq),
        "read_cycle": summarize(read_cycle),
        "where_time_goes_ms": probe.breakdown(during, server, await session_queue(ledger, server)),
    }
    r["consumer"] = {**summarize(consumer_lat), "not_received": consumer_missing,
                     "what": "outbox row written (created_at: its accept transaction) -> received by a "
                             "durable consumer following with LISTEN/NOTIFY "
                             "(mcpsync.activities.ledger.outbox.OutboxConsumer.follow), churn events only"}
    if churn.base is not None:
        _baseline_sections(b, churn, drain, sys_conv)
    r["cost_of_a_change"] = cost_of_a_change(r, proc_cpu, role_notes, window_history, len(changes))
    against = f" (baseline {r['baseline']['reads_per_change']})" if "baseline" in r else ""
    say(f"system p50/p99/p99.9 {sys_conv['p50_ms']}/{sys_conv['p99_ms']}/{sys_conv['p999_ms']} ms, "
        f"{r['system']['reads_per_change']} reads/change{against}")
    return sys_lat, sys_conv


def _baseline_sections(b: Bench, churn: Churn, drain: Drain, sys_conv: dict[str, Any]) -> None:
    """The naive baseline's ``baseline`` section, and the ``comparison`` of mcpsync with it and the floor."""
    r, changes, base = b.r, churn.changes, churn.base
    assert base is not None
    base_completions = base.completions[churn.completions0:]
    base_lat = convergence(changes, first_seen(base_completions), baseline=True)
    base_conv = convergence_report(base_lat, [ch.lost(1) for ch in changes])
    b.run.curves["baseline"] = [x for x in base_lat if x is not None]
    base_reads = base.reads - churn.base_reads0
    r["baseline"] = {
        "reads": base_reads,
        "reads_per_change": round(base_reads / len(changes), 3) if changes else None,
        "read_errors": base.read_errors,
        "notifications_received": base.notifications - churn.base_notes0,
        "convergence": base_conv,
        "uris_behind_at_end": len(drain.base_left),
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


async def repair_phase(b: Bench, churn: Churn, drain: Drain) -> None:
    """URIs left behind by dropped notifications converge only with a later change (``repair``)."""
    r, rng = b.r, b.rng
    controls, final, unconverged, sys_left = churn.controls, churn.final, churn.unconverged, drain.sys_left
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
