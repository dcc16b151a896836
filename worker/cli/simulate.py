"""``mcpsync simulate``: the deterministic simulator (``sim/``, dev-only) from the command line.

Contract: exit 1 when an invariant is violated (the JSON names every violated invariant and
carries shrunk, replayable traces); exit 2 when the simulator is not part of the installation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from mcpsync.worker.cli.common import (
    CliError,
    count,
    non_negative,
    print_out,
)

__all__ = ['cmd_simulate', 'register']


def _simulator() -> tuple[Any, Any, Any]:
    """``sim.model``, ``sim.schedule`` and ``sim.runner`` from the source checkout this CLI runs from (an
    editable install)."""
    import importlib

    from mcpsync.worker.stack.common import REPO_ROOT, SOURCE_CHECKOUT

    if SOURCE_CHECKOUT and str(REPO_ROOT) not in sys.path:
        # The console script's sys.path has the installed packages only; the dev-only simulator
        # (a top-level folder of the checkout, left out of the wheel) is found from the checkout root.
        sys.path.append(str(REPO_ROOT))
    try:
        return (importlib.import_module("sim.model"), importlib.import_module("sim.schedule"),
                importlib.import_module("sim.runner"))
    except ImportError as exc:
        raise CliError(f"simulate: the simulator is dev-only and not part of this installation; run it "
                       f"from a source checkout ({exc})") from None


async def cmd_simulate(args: argparse.Namespace) -> None:
    """Deterministic simulator (``sim/``): seeded schedules or one replayed trace.

    Exit 1 when any invariant is violated; the JSON names every violated invariant and
    carries shrunk, replayable traces of the first failures. The simulator is a development
    tool that lives in the source tree (``sim/``), not in the installed package."""
    import time

    model, schedule, runner = _simulator()

    try:
        without = {model.Fault(f.strip()) for f in (args.without or "").split(",") if f.strip()}
    except ValueError:
        known = ", ".join(f.value for f in model.Fault)
        raise CliError(f"--without: unknown fault (known: {known})") from None
    config = model.SimConfig(mean_events=args.events, faults=model.ALL_FAULTS - without)
    started = time.perf_counter()
    if args.replay:
        try:
            doc = json.loads(await asyncio.to_thread(Path(args.replay).read_text))
            trace = model.Trace.from_json(doc.get("trace", doc))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CliError(f"--replay {args.replay}: not a simulation trace ({exc})") from None
        result = schedule.replay(trace, config)
        out: dict[str, Any] = {"replay": args.replay, **result.trace().to_json(), "steps": result.steps,
                               "converged_after": result.converged_after,
                               "runtime_seconds": round(time.perf_counter() - started, 3)}
        print_out(out, args.json, "\n".join(out["violations"]) or "replay: no violation")
        if result.violations:
            raise SystemExit(1)
        return
    if args.schedules < 1:
        raise CliError("--schedules must be at least 1")
    workers = runner.worker_count(args.workers, args.schedules)
    summary = await asyncio.to_thread(runner.run_schedules_in_processes, args.seed, 0, args.schedules, config,
                                      workers=workers)
    report = runner.summary_json(runner.shrink_failures(summary, config), config)
    report["runtime_seconds"] = round(time.perf_counter() - started, 3)
    report["workers"] = workers
    amp, conv = report["read_amplification"], report["convergence_steps"]
    text = (f"{report['schedules']} schedules, {report['events']} events, {report['runtime_seconds']} s: "
            f"{report['violations_total']} violations in {report['failing_schedules']} schedules\n"
            + "".join(f"  {k}: {v}\n" for k, v in report["violations"].items() if v)
            + f"  reads per distinct change {amp['reads_per_distinct_change']}, convergence steps "
              f"p50/p99/max {conv['p50']}/{conv['p99']}/{conv['max']}"
            + "".join(f"\n  replay: {json.dumps(f['trace'])}" for f in report["failures"][:1]))
    print_out(report, args.json, text)
    if report["violations_total"]:
        raise SystemExit(1)


def register(sub: Any) -> None:
    """Add ``simulate`` to the top-level subparsers ``sub``."""
    simu = sub.add_parser("simulate",
                          help="deterministic simulator: seeded adversarial schedules, invariant gate")
    simu.add_argument("--schedules", type=count, default=5000, help="number of seeded schedules")
    simu.add_argument("--seed", default="0", help="seed of the schedule generator")
    simu.add_argument("--events", type=non_negative, default=50,
                      help="mean events per schedule before the drain")
    simu.add_argument("--without", metavar="FAULT,...", default="concurrent_reads",
                      help="fault classes to leave out (default: concurrent_reads, the documented F4 "
                           "limit of max_concurrent_reads > 1; --without '' includes every class)")
    simu.add_argument("--workers", type=non_negative, default=0, help="processes (default: CPU count)")
    simu.add_argument("--replay", metavar="FILE", help="replay one trace (JSON from a failure) instead")
    simu.add_argument("--json", action="store_true")
    simu.set_defaults(func=cmd_simulate)
