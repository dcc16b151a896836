"""mcpsync benchmark: one command, JSON + a PNG plot.

    .venv/bin/python -m benchmarks.run [--subscriptions 200] [--series 100,1000]
                                       [--transport http|stdio|both] [--out benchmarks/out] [--quick]
    .venv/bin/python -m benchmarks.run --ingress-scale 1,50,200 [--idle-seconds 10]

Per (transport, N): a fresh Temporal dev server (free ports) and a fresh PostgreSQL database
(``MCPSYNC_DATABASE_URL``'s server, else an embedded one under the state dir); N subscriptions
on one in-process worker (``mcpsync.worker.main.services.run_services``) against the fixture MCP server over
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
sends them: sustained ingest rate) → revocation (``mcpsync.worker.main.revocation.revoke`` on a sample).

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
phase's subscriptions/s is divided by it (``initial_subscriptions_over_start_floor``). Then the **subscribe
start floor**: the same, its activity subscribing to and reading a URI of its own, as a subscription's start
must (``initial_subscriptions_over_subscribe_start_floor``).

**Cost of a change** (``benchmarks.cost``): CPU of the run's processes (this process, the dev server,
the fixtures, PostgreSQL's postmaster, auxiliaries and the run's backends) from /proc over the churn,
and history events / workflow tasks of the subscription workflows from churn start to drain end,
each divided by the churn's changes. The headline figures are also exposed under flat keys
(``temporal_floor_ms``, ``cpu_ms_per_change``, ``history_events_per_change``, ...) and printed
beside the values before the read-cycle rebuild and its targets (printed, never asserted).

Convergence of a change = oracle mutation committed (fixture clock) → first receipt accepted
(PostgreSQL clock, same host) whose digest is this change's or a later change's of that URI;
for the baseline, the first completed read with such a digest. Targets are reported, not asserted.

Where things are: this module runs the whole (``run``: each (transport, N) in a child process,
``run_one`` in it) and calls the phases in order: ``benchmarks.phases`` (start-up, idle, floors, staleness,
burst, revocation, targets) and ``benchmarks.churn`` (churn, drain, what happened, repair). Options and
the command line are ``benchmarks.options``; the report, its summary and the plot ``benchmarks.report``,
``benchmarks.figures`` and ``benchmarks.plot``; measurements ``benchmarks.usage`` (CPU, RSS),
``benchmarks.probe`` (metrics), ``benchmarks.consumer`` (outbox), ``benchmarks.convergence``,
``benchmarks.temporal_floor`` and ``benchmarks.cost``.
"""

from __future__ import annotations

import asyncio
import json
import logging
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

from benchmarks import ingress_scale
from benchmarks.box_speed import box_speed
from benchmarks.churn import churn_phase, churn_report, drain_phase, repair_phase
from benchmarks.options import Options, parse_args
from benchmarks.phases import (
    Bench,
    burst_phase,
    floor_phase,
    idle_phase,
    revocation_phase,
    staleness_phase,
    staleness_start,
    start_bench,
    startup_phase,
    targets_phase,
    temporal_floors_phase,
)
from benchmarks.plot import plot
from benchmarks.postgres import Postgres
from benchmarks.probe import Probe
from benchmarks.report import TARGETS, Run, growth, print_summary
from benchmarks.scale import SCALE_TARGETS, print_scale_summary, scale_run
from mcpsync.worker.stack.common import state_dir

__all__ = ["TARGETS", "Options", "main", "run"]

log = logging.getLogger("mcpsync.bench")

REPO = Path(__file__).resolve().parents[1]


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
        b = await start_bench(stack, run, pg, probe, work, server=server, db_name=db_name, uris=uris,
                              initial=initial, rng=rng, say=say)
        await (scale_run(b) if opts.scale_only else _every_phase(b, floor_uri))
        r["run_seconds"] = round(time.monotonic() - t_run, 1)
    shutil.rmtree(work, ignore_errors=True)
    return run


async def _every_phase(b: Bench, floor_uri: str) -> None:
    """The full run: every phase, in order (the module docstring)."""
    await startup_phase(b)
    await idle_phase(b)
    base, base_ctl = await floor_phase(b, floor_uri)
    await temporal_floors_phase(b)
    load = await staleness_start(b)
    churn = await churn_phase(b, base, base_ctl)
    drain = await drain_phase(b, churn)
    await staleness_phase(b, load, drain.during, churn.t_churn0, churn.t_churn1)
    sys_lat, sys_conv = await churn_report(b, churn, drain)
    await repair_phase(b, churn, drain)
    await burst_phase(b, base)
    await revocation_phase(b)
    targets_phase(b, sys_lat, sys_conv)


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
    speed = await asyncio.to_thread(box_speed)  # before anything of the run competes for the cores
    runs = await run_isolated(opts, argv)
    grown = growth(runs)
    report = {
        "benchmark": "mcpsync",
        "started_at": started.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": sys.version.split()[0], "speed": speed},
        "postgresql": "MCPSYNC_DATABASE_URL" if os.environ.get("MCPSYNC_DATABASE_URL") else "embedded",
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in opts.__dict__.items()
                    if k not in ("single", "result")},
        "targets": SCALE_TARGETS if opts.scale_only else TARGETS,
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
            (print_scale_summary if opts.scale_only else print_summary)(report)
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

