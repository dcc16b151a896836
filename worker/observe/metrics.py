"""Prometheus metrics: the Temporal SDK runtime's meters plus mcpsync's own, on one endpoint.

Contract:
- ``serve_metrics(cfg)`` (``[metrics]`` in the config; ``None`` = off, every method a no-op)
  creates a ``temporalio.runtime.Runtime`` whose Prometheus exporter listens on a private
  loopback port and (by default) installs it as the default runtime, so it must run before
  the process creates its first Temporal client. It then serves ``GET /metrics`` on
  ``cfg.host:cfg.port``: mcpsync's registry followed by the SDK's exposition (``temporal_*``),
  fetched from that loopback port on each scrape (scrape-and-merge: one target per process).
  The SDK exporter uses Prometheus conventions (``_total`` counters, unit suffixes, seconds),
  so the merged body passes ``promtool check metrics``. Every metric is listed in docs/metrics.md.
- mcpsync's registry holds prometheus_client types only (Counter, Histogram, Info, the
  process and platform collectors, and custom collectors): no hand-written exposition text.
- In-process meters, fed by one-line hooks (no I/O, never blocking the caller):
  ``note_notification`` (session host ingress: also registers the host, whose routing program's
  counters (``IngressRouter.received`` / ``coalesced`` / ...) a collector exports),
  ``read_timer`` (the ``resources/read`` activity: ``mcpsync_reads_total``, read latency) and
  ``receipt_judged`` (the accept: receipts by verdict, ``mcpsync_changes_total``, convergence
  latency; the accept runs inside ``mcp_read_cycle`` (a start's initial read inside
  ``mcp_subscribe_cycle``), in the ingress process). Read amplification =
  ``rate(mcpsync_reads_total) / rate(mcpsync_changes_total)``; with several processes, ``sum``
  the counters first.
- Convergence latency = a notification received by this process's ingress → the first
  receipt (ACCEPTED, UNCHANGED or TOMBSTONE_PENDING) of a read that started after it, one
  observation per receipt (its oldest satisfied notification). It needs ingress and the
  accept in one process: the ingress process accepts.
- Ledger-derived gauges (subscriptions per state, unresolved states and their oldest age,
  freshness age, sessions up, amplification, stale receipts, STALE_AFTER_CLOSE, overdue
  verifications, revocation latency) come from the ledger's read-only queries
  (``mcpsync.activities.ledger.metrics``, whose contract defines freshness, its bound per ``mode``
  and the unresolved states), run
  every ``cfg.refresh_seconds`` by a background task on the event loop (``watch_ledger``) and
  exported by a custom collector; a scrape only renders the last snapshot and never touches
  the database. A query that fails counts in ``mcpsync_ledger_refresh_errors``. They describe
  the whole ledger: with several processes serving metrics, aggregate them with ``max``, not
  ``sum``.
- Health (the same port, for Kubernetes probes, docs/deploy.md): ``GET /healthz`` answers 200 while
  the process's event loop turns (a tick every second; 503 once it is ``LIVENESS_STALE_SECONDS``
  old: a wedged loop) and ``GET /readyz`` 200 once every Temporal worker of the process polls
  (``ready_when``: the main worker and/or the ingress worker started, past the SDK's namespace
  check), 503 before and after. Neither touches PostgreSQL or Temporal: a probe is never load.
- Labels are bounded: ``server`` (configured servers), ``subject`` (configured subjects,
  only on ``mcpsync_session_up``), ``verdict``, ``state``, ``outcome``, ``mode``. No URI or
  content ever becomes a label.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import platform
import socket
import threading
import time
import urllib.request
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import psycopg
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from mcpsync.activities.ledger.coalescer import TOTALS as BATCH_TOTALS
from mcpsync.activities.ledger.metrics import UNRESOLVED, LedgerSnapshot, last_revocation_id, read_snapshot
from mcpsync.worker.main.config import ConfigError, MetricsConfig
from mcpsync.workflows.ingress import IngressRouter
from mcpsync.workflows.records.ledger import AcceptRequest, AcceptResult, AcceptVerdict

if TYPE_CHECKING:
    from mcpsync.activities.ledger import Ledger

__all__ = [
    "REGISTRY",
    "MetricsServer",
    "MetricsUnavailable",
    "host_totals",
    "note_notification",
    "read_timer",
    "receipt_judged",
    "PrometheusMeters",
    "PROMETHEUS",
    "refresh_outbox_lag",
    "serve_metrics",
    "LIVENESS_STALE_SECONDS",
]

log = logging.getLogger("mcpsync.metrics")

disable_created_metrics()  # no *_created series: Prometheus does not need them
REGISTRY = CollectorRegistry(auto_describe=True)
"""mcpsync's own registry (not prometheus_client's global one)."""
# process_* (CPU, memory, fds, start time) and python_info, as prometheus_client defines them.
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


BUILD_INFO = Info("mcpsync_build", "mcpsync build: its version and the versions of what it runs on",
                  registry=REGISTRY)
BUILD_INFO.info({"version": _version("mcpsync"), "temporalio": _version("temporalio"), "mcp": _version("mcp"),
                 "python": platform.python_version()})

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_CONVERGENCE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0)
_REVOCATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)

READS = Counter("mcpsync_reads", "resources/read calls sent to MCP servers", ["server"], registry=REGISTRY)
READ_LATENCY = Histogram("mcpsync_read_latency_seconds", "resources/read round trip (outcome ok|error)",
                         ["server", "outcome"], buckets=_LATENCY_BUCKETS, registry=REGISTRY)
RECEIPTS = Counter("mcpsync_receipts", "Reads judged by the ledger's accept, by verdict",
                   ["server", "verdict"], registry=REGISTRY)
CHANGES = Counter("mcpsync_changes",
                  "Distinct changes: reads the ledger accepted as a new version (ACCEPTED)",
                  ["server"], registry=REGISTRY)
CONVERGENCE = Histogram("mcpsync_convergence_seconds",
                        "Notification received by ingress -> receipt accepted for a read started after it",
                        ["server"], buckets=_CONVERGENCE_BUCKETS, registry=REGISTRY)
REVOCATION = Histogram("mcpsync_revocation_latency_seconds",
                       "Revocation effective_at -> its outbox row (ledger revocations recorded since start)",
                       buckets=_REVOCATION_BUCKETS, registry=REGISTRY)

# Verdicts whose receipt says the subscription now knows the server's state after the read.
_CURRENT = frozenset({AcceptVerdict.ACCEPTED, AcceptVerdict.UNCHANGED, AcceptVerdict.TOMBSTONE_PENDING})
_MAX_PENDING_KEYS = 100_000
_MAX_PENDING_PER_KEY = 64
_MAX_READ_STARTS = 50_000

class MetricsUnavailable(ConfigError):
    """The metrics endpoint could not be started (port in use, bad address)."""


# --- in-process hooks -------------------------------------------------------------------


class _Host(Protocol):
    """What the collector reads from a session host (``mcpsync.worker.ingress.session_host.SessionHost``)."""

    subject: str

    @property
    def router(self) -> IngressRouter: ...  # counts notifications: received, coalesced, read, routed

    @property
    def server(self) -> Any: ...


_lock = threading.Lock()
_hosts: weakref.WeakSet[Any] = weakref.WeakSet()
_pending: OrderedDict[tuple[str, str, str], list[float]] = OrderedDict()  # receive times per subscription
_read_starts: OrderedDict[str, float] = OrderedDict()  # request id -> wall time the read was sent


def note_notification(host: _Host, uri: str) -> None:
    """Ingress received ``notifications/resources/updated`` for ``uri`` (before coalescing)."""
    now = time.time()
    with _lock:
        _hosts.add(host)
    key = (host.subject, str(host.server.name), uri)
    times = _pending.get(key)
    if times is None:
        if len(_pending) >= _MAX_PENDING_KEYS:
            _pending.popitem(last=False)
        _pending[key] = [now]
    elif len(times) < _MAX_PENDING_PER_KEY:
        times.append(now)  # full: the oldest ones are what convergence measures


@contextmanager
def read_timer(server: str, request_id: str) -> Iterator[None]:
    """Around one ``resources/read``: counts it, times it, remembers when it was sent."""
    READS.labels(server).inc()
    _read_starts[request_id] = time.time()
    if len(_read_starts) > _MAX_READ_STARTS:
        _read_starts.popitem(last=False)
    started = time.perf_counter()
    outcome = "error"
    try:
        yield
        outcome = "ok"
    finally:
        READ_LATENCY.labels(server, outcome).observe(time.perf_counter() - started)


def receipt_judged(req: AcceptRequest, result: AcceptResult) -> None:
    """The ledger judged a read: count the verdict; a current receipt settles older notifications."""
    key = req.outcome.key
    RECEIPTS.labels(key.server, result.verdict.value).inc()
    if result.verdict == AcceptVerdict.ACCEPTED:
        CHANGES.labels(key.server).inc()
    sent = _read_starts.pop(req.outcome.request_id, None)
    if sent is None or result.verdict not in _CURRENT:
        return
    pkey = (key.subject, key.server, key.uri)
    times = _pending.get(pkey)
    if not times:
        return
    settled = bisect.bisect_right(times, sent)
    if settled:
        CONVERGENCE.labels(key.server).observe(max(0.0, time.time() - times[0]))
        del times[:settled]
        if not times:
            _pending.pop(pkey, None)


class PrometheusMeters:
    """``mcpsync.activities.meters.Meters`` on this module's Prometheus registry (what the worker passes)."""

    def read_timer(self, server: str, request_id: str) -> AbstractContextManager[None]:
        return read_timer(server, request_id)

    def receipt_judged(self, req: AcceptRequest, result: AcceptResult) -> None:
        receipt_judged(req, result)


PROMETHEUS = PrometheusMeters()


class HostTotals(NamedTuple):
    """Notifications of one server's session hosts in this process."""

    received: int = 0
    coalesced: int = 0
    read: int = 0  # read at the ingress and reported (``resource_read``), no signal to read
    routed: int = 0  # signalled ``resource_updated`` for the workflow to read (in-process hosts only)
    verified: int = 0  # read at the ingress, nothing new and nothing owed: kept in the ledger, no signal


def host_totals() -> dict[str, HostTotals]:
    """``{server: HostTotals}`` over the session hosts seen in this process."""
    with _lock:
        hosts = list(_hosts)
    out: dict[str, HostTotals] = {}
    for h in hosts:
        t = out.get(h.server.name, HostTotals())
        r = h.router
        out[h.server.name] = HostTotals(t.received + r.received, t.coalesced + r.coalesced,
                                        t.read + r.read, t.routed + r.routed, t.verified + r.verified)
    return out


class _HostCollector(Collector):
    def collect(self) -> Iterable[Any]:
        received = CounterMetricFamily("mcpsync_notifications_received",
                                       "resources/updated notifications received by ingress",
                                       labels=["server"])
        coalesced = CounterMetricFamily("mcpsync_notifications_coalesced",
                                        "Notifications folded at ingress: merged into a key already queued, "
                                        "taken by the read about to be requested, or noted on a dirty row "
                                        "with no work",
                                        labels=["server"])
        read = CounterMetricFamily("mcpsync_notifications_read_at_ingress",
                                   "Notifications whose change the ingress read itself and reported to the "
                                   "workflow (resource_read: no Temporal hop before the read)",
                                   labels=["server"])
        verified = CounterMetricFamily("mcpsync_notifications_verified_at_ingress",
                                       "Notifications whose read at the ingress found nothing new and left "
                                       "nothing owed: kept in the ledger, no signal to the workflow",
                                       labels=["server"])
        for server, t in sorted(host_totals().items()):
            received.add_metric([server], t.received)
            coalesced.add_metric([server], t.coalesced)
            read.add_metric([server], t.read)
            verified.add_metric([server], t.verified)
        yield received
        yield coalesced
        yield read
        yield verified


REGISTRY.register(_HostCollector())


class _BatchCollector(Collector):
    """The read path's group commit (``mcpsync.activities.ledger.coalescer.TOTALS``), per kind."""

    def collect(self) -> Iterable[Any]:
        batches = CounterMetricFamily("mcpsync_ledger_batches", "Ledger transactions of the read path's "
                                      "group commit (kind: allocate, accept)", labels=["kind"])
        calls = CounterMetricFamily("mcpsync_ledger_batched_calls", "Calls those transactions answered: "
                                    "calls / batches is the mean batch", labels=["kind"])
        retried = CounterMetricFamily("mcpsync_ledger_batch_retries", "Calls run again alone because "
                                      "their batch's transaction failed", labels=["kind"])
        for kind, t in sorted(BATCH_TOTALS.items()):
            batches.add_metric([kind], t.batches)
            calls.add_metric([kind], t.calls)
            retried.add_metric([kind], t.retried)
        yield from (batches, calls, retried)


REGISTRY.register(_BatchCollector())


# --- ledger-derived gauges ---------------------------------------------------------------


class _LedgerCollector(Collector):
    """Exports the last ``LedgerSnapshot`` (values read from the ledger, not counted in-process)."""

    def __init__(self) -> None:
        self.snapshot: LedgerSnapshot | None = None  # swapped whole by the refresher

    def collect(self) -> Iterable[Any]:
        snap = self.snapshot
        if snap is None:
            return
        g = GaugeMetricFamily
        amp = g("mcpsync_read_amplification", "Reads per distinct change: granted reads / ACCEPTED receipts "
                "(ledger, all time; for a rate use mcpsync_reads_total / mcpsync_changes_total)",
                labels=["server"])
        reads = g("mcpsync_ledger_reads", "Granted read allocations (ledger, all time)", labels=["server"])
        changes = g("mcpsync_ledger_distinct_changes", "ACCEPTED (new digest) receipts (ledger)",
                    labels=["server"])
        stale = g("mcpsync_stale_receipts", "STALE receipts (ledger)", labels=["server"])
        sac = g("mcpsync_stale_after_close", "STALE_AFTER_CLOSE audit rows (ledger)", labels=["server"])
        overdue = g("mcpsync_verifications_overdue", "Breaches recorded: verifications further apart than "
                    "the staleness bound, by the verification that closed the gap or a watchdog that found "
                    "it open (VERIFICATION_OVERDUE audit rows, ledger)",
                    labels=["server"])
        servers = sorted(set(snap.reads) | {s for s, _ in snap.receipts} | set(snap.stale_after_close)
                         | set(snap.overdue))
        for server in servers:
            a = snap.amplification(server)
            if a is not None:
                amp.add_metric([server], a)
            reads.add_metric([server], snap.reads.get(server, 0))
            changes.add_metric([server], snap.receipts.get((server, AcceptVerdict.ACCEPTED.value), 0))
            stale.add_metric([server], snap.receipts.get((server, AcceptVerdict.STALE.value), 0))
            sac.add_metric([server], snap.stale_after_close.get(server, 0))
            overdue.add_metric([server], snap.overdue.get(server, 0))
        yield from (amp, reads, changes, stale, sac, overdue)
        yield from self._subscriptions(snap)
        yield from self._freshness(snap)
        up = g("mcpsync_session_up", "1 if the (server, subject) has an open MCP session whose ingress holds "
               "the lease, else 0; listed while it has a subscription in progress (ledger)",
               labels=["server", "subject"])
        for (server, subject), is_up in sorted(snap.sessions.items()):
            up.add_metric([server, subject], 1.0 if is_up else 0.0)
        yield up
        yield g("mcpsync_revocations", "Revocations recorded (ledger)", value=snap.revocations)
        yield g("mcpsync_ledger_snapshot_age_seconds", "Seconds since the ledger gauges were refreshed",
                value=max(0.0, time.time() - snap.taken_at))
        # Outbox consumer lag: _OutboxLagCollector below, fed in the same refresh (refresh_outbox_lag).

    @staticmethod
    def _subscriptions(snap: LedgerSnapshot) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily
        total = g("mcpsync_subscriptions", "Subscriptions per state (ledger)", labels=["server", "state"])
        unresolved = g("mcpsync_unresolved_subscriptions", "Subscriptions neither ACTIVE nor finished "
                       "(CLOSED, REVOKED, TOMBSTONED) per state (ledger)", labels=["server", "state"])
        oldest = g("mcpsync_unresolved_oldest_age_seconds", "Seconds the longest-waiting subscription has "
                   "been in this unresolved state (ledger; absent when none is)", labels=["server", "state"])
        for (server, state), n in sorted(snap.states.items()):
            total.add_metric([server, state], n)
        for server in sorted({server for server, _ in snap.states}):
            for st in UNRESOLVED:
                unresolved.add_metric([server, st.value], snap.states.get((server, st.value), 0))
        for (server, state), seconds in sorted(snap.state_oldest.items()):
            oldest.add_metric([server, state], max(0.0, seconds))
        yield from (total, unresolved, oldest)

    @staticmethod
    def _freshness(snap: LedgerSnapshot) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily
        watched = g("mcpsync_freshness_subscriptions", "Subscriptions in a watching state (ACTIVE and the "
                    "read cycle) per freshness mode (ledger)", labels=["server", "mode"])
        age = g("mcpsync_freshness_age_max_seconds", "Oldest freshness age: seconds since the newest read "
                "that saw content (ACCEPTED or UNCHANGED receipt), over watching subscriptions (ledger)",
                labels=["server", "mode"])
        past = g("mcpsync_freshness_past_bound_subscriptions", "Watching subscriptions whose freshness age "
                 "exceeds the published bound of their mode (ledger)", labels=["server", "mode"])
        for (server, mode), f in sorted(snap.freshness.items()):
            watched.add_metric([server, mode], f.subscriptions)
            age.add_metric([server, mode], max(0.0, f.max_age))
            past.add_metric([server, mode], f.past_bound)
        bound = g("mcpsync_freshness_bound_seconds", "Published staleness bound per mode: safety re-read "
                  "period (subscribe), poll interval (poll)", labels=["mode"])
        for mode, seconds in sorted(snap.bounds.items()):
            bound.add_metric([mode.value], seconds)
        yield from (watched, age, past, bound)


_LEDGER = _LedgerCollector()
REGISTRY.register(_LEDGER)
REFRESH_ERRORS = Counter("mcpsync_ledger_refresh_errors", "Failed refreshes of the ledger gauges",
                         registry=REGISTRY)


# --- outbox consumer lag (mcpsync.activities.ledger.outbox, docs/outbox.md) ------------------------------


class _OutboxLagCollector(Collector):
    """Per registered consumer: unacknowledged events and the age of the oldest (ledger)."""

    def __init__(self) -> None:
        self.lags: list[tuple[str, int, float]] | None = None  # (consumer, events, seconds), swapped whole

    def collect(self) -> Iterable[Any]:
        if self.lags is None:
            return
        events = GaugeMetricFamily("mcpsync_outbox_consumer_lag_events",
                                   "Outbox events after the consumer's acknowledged position (ledger)",
                                   labels=["consumer"])
        seconds = GaugeMetricFamily("mcpsync_outbox_consumer_lag_seconds",
                                    "Age of the oldest unacknowledged outbox event, 0 when caught up "
                                    "(ledger)",
                                    labels=["consumer"])
        for name, n, age in self.lags:
            events.add_metric([name], n)
            seconds.add_metric([name], age)
        yield from (events, seconds)


_OUTBOX_LAG = _OutboxLagCollector()
REGISTRY.register(_OUTBOX_LAG)


async def refresh_outbox_lag(ledger: Ledger) -> None:
    """Feed the lag gauges from ``mcpsync.activities.ledger.outbox.consumer_infos`` (consumer names are
    operator-chosen and few: a bounded label)."""
    from mcpsync.activities.ledger.outbox import consumer_infos

    infos = await consumer_infos(ledger.pool)
    _OUTBOX_LAG.lags = [(i.name, i.lag_events, i.lag_seconds) for i in infos]


# --- the endpoint --------------------------------------------------------------------------


LIVENESS_STALE_SECONDS = 30.0  # /healthz: an event loop that has not ticked for this long is wedged


class MetricsServer:
    """The ``/metrics`` endpoint (with ``/healthz``, ``/readyz``), the Temporal runtime behind it and the
    ledger refresher."""

    def __init__(self, cfg: MetricsConfig | None, *, set_default_runtime: bool = True) -> None:
        self.cfg = cfg
        self.runtime: Runtime | None = None
        self.temporal_url: str | None = None
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._refresher: asyncio.Task[None] | None = None
        self._revocation_cursor: int | None = None
        self._ready: Callable[[], bool] | None = None
        self._tick: float | None = None  # monotonic time of the event loop's last heartbeat
        self._heartbeat: asyncio.Task[None] | None = None
        if cfg is None:
            return
        temporal_port = _free_loopback_port()
        self.temporal_url = f"http://127.0.0.1:{temporal_port}/metrics"
        self.runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(
            bind_address=f"127.0.0.1:{temporal_port}", counters_total_suffix=True, unit_suffix=True,
            durations_as_seconds=True)))
        if set_default_runtime:
            # Every Temporal client created from now on (and its workers) reports to this runtime.
            Runtime.set_default(self.runtime, error_if_already_set=False)
        try:
            self._httpd = ThreadingHTTPServer((cfg.host, cfg.port), _handler(self))
        except OSError as exc:
            raise MetricsUnavailable(f"cannot serve metrics on {cfg.host}:{cfg.port}: {exc.strerror or exc} "
                                     "(change [metrics] port)") from None
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="mcpsync-metrics", daemon=True)
        self._thread.start()
        log.info("metrics on %s", self.url)

    @property
    def enabled(self) -> bool:
        return self._httpd is not None

    @property
    def port(self) -> int | None:
        return None if self._httpd is None else int(self._httpd.server_address[1])

    @property
    def url(self) -> str | None:
        if self._httpd is None or self.cfg is None:
            return None
        host = "127.0.0.1" if self.cfg.host in ("0.0.0.0", "") else self.cfg.host
        return f"http://{host}:{self.port}/metrics"

    def render(self) -> bytes:
        """The scrape body: mcpsync's registry, then the SDK runtime's exposition."""
        body = generate_latest(REGISTRY)
        if self.temporal_url is not None:
            try:
                with urllib.request.urlopen(self.temporal_url, timeout=2) as resp:  # loopback, ours
                    body += resp.read()
            except OSError as exc:
                body += f"# temporal runtime metrics unavailable: {type(exc).__name__}\n".encode()
        return body

    def ready_when(self, check: Callable[[], bool]) -> None:
        """``/readyz`` answers 200 while ``check()`` is true (called from the HTTP thread: cheap, no I/O)."""
        self._ready = check

    def is_ready(self) -> bool:
        try:
            return self._ready is not None and bool(self._ready())
        except Exception:  # a check that fails is not ready
            return False

    def watch_loop(self) -> None:
        """Start the event-loop heartbeat ``/healthz`` reads (call from the event loop)."""
        if self.cfg is None or self._heartbeat is not None:
            return
        self._tick = time.monotonic()
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat(), name="metrics-heartbeat")

    def is_live(self) -> bool:
        """No heartbeat started: live while the endpoint serves; else the loop ticked recently."""
        return self._tick is None or time.monotonic() - self._tick < LIVENESS_STALE_SECONDS

    async def _beat(self) -> None:
        while True:
            self._tick = time.monotonic()
            await asyncio.sleep(1.0)

    def watch_ledger(self, ledger: Ledger) -> None:
        """Refresh the ledger-derived gauges every ``refresh_seconds`` (call from the event loop)."""
        if self.cfg is None or self._refresher is not None:
            return
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop(ledger),
                                                                 name="metrics-ledger")

    async def refresh(self, ledger: Ledger) -> LedgerSnapshot:
        """Refresh once now (the loop calls this; tests may too)."""
        first = self._revocation_cursor is None
        snap, new = await read_snapshot(ledger.pool, self._revocation_cursor or 0)
        if snap.failures:
            REFRESH_ERRORS.inc()
            log.warning("metrics: ledger gauges partly unavailable: %s", "; ".join(snap.failures))
        if first:
            # The histogram counts revocations recorded while this process runs (counter semantics).
            self._revocation_cursor = await last_revocation_id(ledger.pool)
            new = [(i, x) for i, x in new if i > self._revocation_cursor]
        for rid, seconds in new:
            REVOCATION.observe(max(0.0, seconds))
            self._revocation_cursor = max(self._revocation_cursor or 0, rid)
        _LEDGER.snapshot = snap
        try:
            await refresh_outbox_lag(ledger)
        except psycopg.Error as exc:  # an older schema: only these gauges are missing
            REFRESH_ERRORS.inc()
            log.warning("metrics: outbox consumer lag unavailable: %s", str(exc).splitlines()[0][:120])
        return snap

    async def _refresh_loop(self, ledger: Ledger) -> None:
        assert self.cfg is not None
        while True:
            try:
                await self.refresh(ledger)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # PostgreSQL away: keep the last snapshot, try again
                REFRESH_ERRORS.inc()
                log.warning("metrics: ledger refresh failed: %s", str(exc)[:200])
            await asyncio.sleep(self.cfg.refresh_seconds)

    async def unwatch_ledger(self) -> None:
        """Stop refreshing the ledger gauges (before the ledger's pool closes)."""
        if self._refresher is not None:
            self._refresher.cancel()
            with suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None

    async def aclose(self) -> None:
        self._ready = None  # shutting down: no longer ready
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        await self.unwatch_ledger()
        if self._httpd is not None:
            httpd, self._httpd = self._httpd, None
            await asyncio.to_thread(httpd.shutdown)
            httpd.server_close()


def serve_metrics(cfg: MetricsConfig | None, *, set_default_runtime: bool = True) -> MetricsServer:
    """Start the endpoint for ``cfg`` (``None``: a disabled server whose methods do nothing).

    Call before creating any Temporal client. Raises :class:`MetricsUnavailable`."""
    return MetricsServer(cfg, set_default_runtime=set_default_runtime)


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _handler(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server API)
            path = self.path.split("?", 1)[0]
            if path in ("/healthz", "/readyz"):
                ok = server.is_live() if path == "/healthz" else server.is_ready()
                failing = b"event loop stalled\n" if path == "/healthz" else b"not polling\n"
                body = b"ok\n" if ok else failing
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if path not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = server.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
            return

    return Handler
