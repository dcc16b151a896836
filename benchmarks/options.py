"""The benchmark's options: :class:`Options` and the command line that fills it (:func:`parse_args`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import staleness
from benchmarks.services import Layout
from mcpsync.worker.main.config import TemporalConfig, WorkflowRunnerKind

__all__ = ["Options", "parse_args"]

DESCRIPTION = "mcpsync benchmark: one command, JSON + a PNG plot."


@dataclass
class Options:
    subscriptions: list[int]
    transports: list[str]
    out: Path
    duration: float = 30.0
    rate: float = 5.0
    max_notify: int = 5
    drop_every: int = 100
    floor_samples: int = 100
    temporal_floor_samples: int = 50
    burst_per_subscription: int = 5
    burst_cap: int = 2000
    revocations: int = 20
    drain_timeout: float = 60.0
    seed: int = 7
    quick: bool = False
    staleness_subscriptions: int = 4  # per staleness profile
    poll_seconds: float = 10.0  # the polling profile's SubscriptionOptions.poll_interval_seconds
    # the lost-notifications profile's SubscriptionOptions.safety_read_seconds
    safety_read_seconds: float = 12.0
    staleness_window: float | None = None  # None: the churn's duration, at least five of the longer period
    temporal_store: str = "tmpfs"
    # the main worker's [temporal] workflow_runner, also the start floor's
    workflow_runner: WorkflowRunnerKind = TemporalConfig().workflow_runner
    ingress_scale: list[int] | None = None  # --ingress-scale: subjects per level (benchmarks.ingress_scale)
    # --layout: mcpsync's worker and ingress in processes of their own, or in this one
    layout: Layout = Layout.SPLIT
    idle_seconds: float = 10.0
    idle_window: float = 20.0  # the idle window after start-up (benchmarks.idle); 0: none
    subscription_safety_read_seconds: float | None = None  # None: SubscriptionOptions' default (production)
    # the main worker's [temporal] max_cached_workflows; None: every subscription stays cached
    max_cached_workflows: int | None = None
    # the N subscriptions' SubscriptionOptions.max_history_events; None: SubscriptionOptions' default
    subscription_max_history_events: int | None = None
    # --scale-only: start, churn and idle window only (benchmarks.scale), the figure of N subscriptions
    scale_only: bool = False
    # workflows whose histories a window's history figures are counted on (evenly spread over the N); the
    # counts are scaled to N when fewer
    history_sample: int = 1000
    single: str | None = None  # "transport:N": run just that, write ``result`` (the orchestrator's child)
    result: Path | None = None

    def staleness_plan(self) -> staleness.StalenessPlan:
        window = self.staleness_window or max(self.duration, 5 * max(self.poll_seconds,
                                                                     self.safety_read_seconds))
        return staleness.StalenessPlan(poll_seconds=self.poll_seconds,
                                       safety_read_seconds=self.safety_read_seconds, window_seconds=window,
                                       subscriptions=self.staleness_subscriptions)


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("expected positive integers")
    return values


def _check_scale_only(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """--scale-only measures one N per transport, by process, over an idle window, and nothing beside it."""
    if a.series:
        p.error("--scale-only runs one N: use --subscriptions, not --series")
    if a.ingress_scale is not None:
        p.error("--scale-only and --ingress-scale are different runs")
    if a.idle_window is not None and a.idle_window <= 0:
        p.error("--scale-only needs an idle window (--idle-window > 0)")
    if a.layout != Layout.SPLIT.value:
        p.error("--scale-only measures the worker and the ingress as processes of their own: --layout split")
    if a.staleness_subscriptions:
        p.error("--scale-only runs no staleness profiles: leave out --staleness-subscriptions")


def parse_args(argv: Sequence[str] | None = None) -> Options:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=DESCRIPTION)
    p.add_argument("--subscriptions", type=int, default=None, help="N for a single run (default 200; "
                                                                   "--quick 50)")
    p.add_argument("--series", type=_ints, default=None,
                   help="comma-separated Ns (e.g. 100,1000): one run per N and transport, plus a growth "
                        "report")
    p.add_argument("--transport", choices=["http", "stdio", "both"], default="both")
    p.add_argument("--out", type=Path, default=Path("benchmarks/out"))
    p.add_argument("--quick", action="store_true", help="small and short: N=50, 10 s churn, fewer samples")
    p.add_argument("--duration", type=float, default=None, help="churn seconds (default 30; --quick 10)")
    p.add_argument("--rate", type=float, default=None, help="changes per second (default 5)")
    p.add_argument("--floor-samples", type=int, default=None, help="default 100; --quick 20")
    p.add_argument("--temporal-floor-samples", type=int, default=None,
                   help="samples of the Temporal floor (benchmarks.floor): default 50; --quick 20")
    p.add_argument("--revocations", type=int, default=None, help="revocation sample size (default 20; "
                                                                 "--quick 5)")
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument("--poll-seconds", type=float, default=None,
                   help="staleness, polling profile: poll_interval_seconds (default 10; --quick 5)")
    p.add_argument("--safety-read-seconds", type=float, default=None,
                   help="staleness, lost-notifications profile: safety_read_seconds (default 12; --quick 6)")
    p.add_argument("--staleness-window", type=float, default=None,
                   help="staleness window seconds, from the churn's start (default: the churn's duration, "
                        "at least five of the longer period)")
    p.add_argument("--staleness-subscriptions", type=int, default=None,
                   help="subscriptions per staleness profile (default 4; --scale-only 0)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--workflow-runner", choices=[x.value for x in WorkflowRunnerKind],
                   default=TemporalConfig().workflow_runner.value,
                   help="the main worker's [temporal] workflow_runner, also the start floor's (default: the "
                        "config default)")
    p.add_argument("--temporal-store", choices=["tmpfs", "disk"], default=None,
                   help="where the dev server keeps its SQLite file (default tmpfs when /dev/shm exists: a "
                        "real cluster's persistence is closer to it than SQLite fsyncs on this VM's disk)")
    p.add_argument("--ingress-scale", type=_ints, default=None, metavar="S,S,...",
                   help="instead of the run: one ingress process hosting S subjects of one server per "
                        "level (e.g. 1,50,200): pollers, RSS, idle CPU (benchmarks.ingress_scale)")
    p.add_argument("--layout", choices=[x.value for x in Layout], default=Layout.SPLIT.value,
                   help="split (default): mcpsync's main worker and ingress in processes of their own, as "
                        "deployed; in-process: both in the benchmark's process with the driver and the "
                        "naive baseline")
    p.add_argument("--idle-seconds", type=float, default=10.0, help="--ingress-scale: idle CPU window "
                                                                    "(default 10)")
    p.add_argument("--idle-window", type=float, default=None,
                   help="seconds of idle cost (no changes) after start-up, per process (benchmarks.idle; "
                        "default 20, --quick 8, 0: none)")
    p.add_argument("--subscription-safety-read-seconds", type=float, default=None,
                   help="the N subscriptions' safety_read_seconds (default: SubscriptionOptions' own, 300)")
    p.add_argument("--max-cached-workflows", type=int, default=None,
                   help="the main worker's [temporal] max_cached_workflows (default: N plus the staleness "
                        "subscriptions, so every run stays cached)")
    p.add_argument("--subscription-max-history-events", type=int, default=None,
                   help="the N subscriptions' max_history_events: continue-as-new after that many events "
                        "(default: SubscriptionOptions' own, 500)")
    p.add_argument("--scale-only", action="store_true",
                   help="the scale figure only (benchmarks.scale): start N subscriptions, churn, then the "
                        "idle window with CPU, memory by process and the ledger's verification schedule; no "
                        "naive client, floors, staleness, burst or revocation")
    p.add_argument("--history-sample", type=int, default=1000,
                   help="workflows whose histories the churn's and the idle window's history figures are "
                        "counted on, evenly spread over the N and scaled to N (default 1000: every workflow "
                        "up to that N)")
    p.add_argument("--single", default=None, help=argparse.SUPPRESS)  # TRANSPORT:N, in a child process
    p.add_argument("--result", type=Path, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    quick = a.quick
    ns = a.series or [a.subscriptions or (50 if quick else 200)]
    if a.series and a.subscriptions:
        p.error("--subscriptions and --series are exclusive")
    if a.max_cached_workflows is not None and a.max_cached_workflows < 1:
        p.error("--max-cached-workflows must be at least 1")
    if a.subscription_max_history_events is not None and a.subscription_max_history_events < 100:
        p.error("--subscription-max-history-events must be at least 100")
    if a.history_sample < 1:
        p.error("--history-sample must be at least 1")
    if a.staleness_subscriptions is not None and a.staleness_subscriptions < 0:
        p.error("--staleness-subscriptions must be at least 0")
    if a.scale_only:
        _check_scale_only(p, a)
    return Options(
        subscriptions=ns,
        transports=["http", "stdio"] if a.transport == "both" else [a.transport],
        out=a.out,
        duration=a.duration if a.duration is not None else (10.0 if quick else 30.0),
        rate=a.rate if a.rate is not None else 5.0,
        floor_samples=a.floor_samples if a.floor_samples is not None else (20 if quick else 100),
        temporal_floor_samples=(a.temporal_floor_samples if a.temporal_floor_samples is not None
                                else (20 if quick else 50)),
        revocations=a.revocations if a.revocations is not None else (5 if quick else 20),
        drain_timeout=a.drain_timeout,
        seed=a.seed,
        staleness_subscriptions=(a.staleness_subscriptions if a.staleness_subscriptions is not None
                                 else 0 if a.scale_only else 4),
        poll_seconds=a.poll_seconds if a.poll_seconds is not None else (5.0 if quick else 10.0),
        safety_read_seconds=a.safety_read_seconds if a.safety_read_seconds is not None
        else (6.0 if quick else 12.0),
        staleness_window=a.staleness_window,
        quick=quick,
        workflow_runner=WorkflowRunnerKind(a.workflow_runner),
        temporal_store=a.temporal_store or ("tmpfs" if os.access("/dev/shm", os.W_OK) else "disk"),
        ingress_scale=a.ingress_scale,
        idle_seconds=a.idle_seconds,
        idle_window=a.idle_window if a.idle_window is not None else (8.0 if quick else 20.0),
        subscription_safety_read_seconds=a.subscription_safety_read_seconds,
        max_cached_workflows=a.max_cached_workflows,
        subscription_max_history_events=a.subscription_max_history_events,
        scale_only=a.scale_only,
        history_sample=a.history_sample,
        layout=Layout(a.layout),
        single=a.single,
        result=a.result,
    )

