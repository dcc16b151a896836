"""Ingress at scale: one ingress process, S subjects, one server, two layouts.

    .venv/bin/python -m benchmarks.run --ingress-scale 1,50,200 [--idle-seconds 10] [--out benchmarks/out]

Contract:
- Each (layout, S) runs in a fresh child process (its RSS is its own): a fresh Temporal dev
  server and database (``benchmarks.postgres.Postgres``), one fixture MCP server over streamable HTTP
  and S ``SessionHost``s of one ``ServerConfig`` listing S subjects, each with its own MCP session.
  Layouts: ``process`` is production
  ``mcpsync.worker.main.services.run_services(..., with_main_worker=False)``:
  one ``Ingress``, so one Temporal worker and one task queue for all S sessions. ``session`` is
  the layout before one ingress per process: every host an ingress of one (``SessionHost`` without an
  ingress), so S workers on S queues. No subscription is started: this is the cost of hosting
  sessions, before any work. ``catalog=False``: catalog scans are work, not hosting.
- Once every (subject, server) has an open session in the ledger and ``settle`` seconds passed,
  it measures: this process's RSS (before the hosts started, and now), the activity pollers the
  SDK reports (``temporal_num_pollers`` gauge summed over the task queues the session rows name),
  those task queues, and CPU seconds over ``idle_seconds`` of nothing happening, per process
  (this one, the dev server, the fixture) from /proc.
- The orchestrator (:func:`run_scale`) runs both layouts per S, writes ``ingress_scale.json`` in
  ``--out`` with the process/session ratios per S, and prints a table; nothing is asserted.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack, suppress
from enum import StrEnum
from pathlib import Path
from typing import Any

from temporalio.client import Client

from benchmarks.common import temporal_and_ledger, until
from benchmarks.postgres import Postgres
from benchmarks.probe import Probe
from benchmarks.usage import rss_bytes
from mcpsync.activities.ledger import Ledger
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.ingress.session_host import SessionHost
from mcpsync.worker.main.config import Config, ServerConfig, TemporalConfig
from mcpsync.worker.main.services import run_services
from mcpsync.worker.stack.common import state_dir

__all__ = ["Layout", "measure_one", "run_scale"]

REPO = Path(__file__).resolve().parents[1]
SERVER = "ingress-scale"


class Layout(StrEnum):
    """How the S sessions of the ingress process reach Temporal."""

    PROCESS = "process"  # production: one Ingress, one worker and one task queue for every session
    SESSION = "session"  # each session host an ingress of one (S workers, S queues), the layout before


def _cpu_seconds(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = data[data.rfind(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _load_average() -> float | None:
    """Other processes share the cores: the 1-minute load average at the end of the idle window."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _threads(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


async def _hosts_of_their_own(config: Config, client: Client, ledger: Ledger) -> None:
    """Layout SESSION: every (server, subject) a ``SessionHost`` without an ingress, i.e. its own."""
    hosts = [SessionHost(server, subject, ledger, client) for server in config.servers
             for subject in server.subjects]
    tasks = [asyncio.create_task(h.run()) for h in hosts]
    try:
        await asyncio.gather(*tasks)
    finally:
        for h in hosts:
            h.stop()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def measure_one(subjects: int, idle_seconds: float, layout: Layout = Layout.PROCESS,
                      settle: float = 3.0) -> dict[str, Any]:
    """One process hosting ``subjects`` sessions of one server in ``layout``; see the module contract."""
    pg = Postgres()
    await pg.start()
    probe = Probe()
    work = state_dir() / "bench" / f"ingress-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    db_name = f"mcpsync_ingress_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    names = [f"subject-{i:04d}" for i in range(subjects)]
    try:
        async with AsyncExitStack() as stack:
            db_url = await pg.create(db_name)
            stack.push_async_callback(pg.drop, db_name)
            tdir = Path("/dev/shm") / f"mcpsync-ingress-{os.getpid()}"
            stack.callback(shutil.rmtree, tdir, True)
            temporal, client, ledger = await temporal_and_ledger(stack, tdir, db_url, runtime=probe.runtime)
            fx = await FixtureProcess.start_http(work, seed="none", log_level="WARNING")
            stack.push_async_callback(fx.stop)
            config = Config(temporal=TemporalConfig(address=temporal.address,
                                                    task_queue="ingress-scale-unused"),
                            servers=[ServerConfig(name=SERVER, transport="http", url=fx.mcp_url,
                                                  subjects=names, catalog=False)])
            await asyncio.sleep(1.0)
            gc.collect()
            rss0 = rss_bytes()
            t0 = time.monotonic()
            services = asyncio.create_task(
                run_services(config, client, ledger, with_main_worker=False) if layout == Layout.PROCESS
                else _hosts_of_their_own(config, client, ledger))

            async def stop_services() -> None:
                services.cancel()
                with suppress(asyncio.CancelledError, Exception):
                    await services

            stack.push_async_callback(stop_services)

            async def all_open() -> bool:
                if services.done():
                    services.result()
                opened = await asyncio.gather(*(ledger.current_session(s, SERVER) for s in names))
                return all(o is not None for o in opened)

            if not await until(all_open, 60 + subjects, 0.25):
                raise RuntimeError(f"ingress scale {subjects}: not every session opened")
            opened_s = time.monotonic() - t0
            await asyncio.sleep(settle)
            gc.collect()
            scrape = await probe.scrape()
            sessions = await asyncio.gather(*(ledger.current_session(s, SERVER) for s in names))
            queues = {si.task_queue for si in sessions if si is not None}
            pollers = sum(v for (n, labels), v in scrape.items() if n == "temporal_num_pollers"
                          and dict(labels).get("task_queue") in queues)
            pids = {"ingress_process": os.getpid(), "temporal_dev_server": temporal.pid, "fixture": fx.pid}
            cpu0 = {k: _cpu_seconds(p) for k, p in pids.items()}
            w0 = time.monotonic()
            await asyncio.sleep(idle_seconds)
            wall = time.monotonic() - w0
            cpu1 = {k: _cpu_seconds(p) for k, p in pids.items()}
            rss1 = rss_bytes()
            idle: dict[str, float | None] = {}
            for k in pids:
                a, b = cpu0[k], cpu1[k]
                idle[k] = None if a is None or b is None else round(100 * (b - a) / wall, 2)
            return {
                "layout": layout.value,
                "subjects": subjects,
                "sessions_open": subjects,
                "seconds_to_open_all": round(opened_s, 2),
                "task_queues": len(queues),
                "activity_pollers": int(pollers),
                "pollers_per_subject": round(pollers / subjects, 2),
                "ingress_rss_before_bytes": rss0,
                "ingress_rss_after_bytes": rss1,
                "ingress_rss_per_subject_bytes": round((rss1 - rss0) / subjects),
                "ingress_threads": _threads(os.getpid()),
                "temporal_server_rss_bytes": rss_bytes(temporal.pid) if temporal.pid else None,
                "fixture_rss_bytes": rss_bytes(fx.pid),
                "idle_seconds": round(wall, 2),
                "idle_cpu_pct_of_one_core": idle,
                "machine_load_average_1m": _load_average(),
            }
    finally:
        await probe.aclose()
        await pg.stop()
        shutil.rmtree(work, ignore_errors=True)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def ratios(process: dict[str, Any], session: dict[str, Any]) -> dict[str, float | None]:
    """process layout ÷ session layout, for one S (below 1: the process layout costs less)."""
    return {
        "activity_pollers": _ratio(process["activity_pollers"], session["activity_pollers"]),
        "ingress_rss": _ratio(process["ingress_rss_after_bytes"], session["ingress_rss_after_bytes"]),
        "ingress_rss_growth": _ratio(
            process["ingress_rss_after_bytes"] - process["ingress_rss_before_bytes"],
            session["ingress_rss_after_bytes"] - session["ingress_rss_before_bytes"]),
        "ingress_threads": _ratio(process["ingress_threads"], session["ingress_threads"]),
        "ingress_idle_cpu": _ratio(process["idle_cpu_pct_of_one_core"]["ingress_process"],
                                   session["idle_cpu_pct_of_one_core"]["ingress_process"]),
        "temporal_dev_server_idle_cpu": _ratio(process["idle_cpu_pct_of_one_core"]["temporal_dev_server"],
                                               session["idle_cpu_pct_of_one_core"]["temporal_dev_server"]),
    }


def run_scale(levels: Sequence[int], idle_seconds: float, out: Path,
              layouts: Sequence[Layout] = (Layout.SESSION, Layout.PROCESS)) -> dict[str, Any]:
    """Each (layout, level) in a child process (this module's ``__main__``); writes
    ``out/ingress_scale.json``."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for s in levels:
        for layout in layouts:
            result = (out / f".ingress-{layout.value}-{s}.json").resolve()
            result.unlink(missing_ok=True)
            code = subprocess.run([sys.executable, "-m", "benchmarks.ingress_scale", str(s),
                                   str(idle_seconds), str(result), layout.value], cwd=str(REPO),
                                  check=False).returncode
            if code != 0 or not result.exists():
                raise RuntimeError(f"ingress scale {layout.value} {s} failed (exit code {code})")
            rows.append(json.loads(result.read_text()))
            result.unlink()
    by = {(r["layout"], r["subjects"]): r for r in rows}
    compared = {str(s): ratios(by[(Layout.PROCESS.value, s)], by[(Layout.SESSION.value, s)]) for s in levels
                if (Layout.PROCESS.value, s) in by and (Layout.SESSION.value, s) in by}
    report = {"benchmark": "mcpsync ingress scale", "cpus": os.cpu_count(), "levels": rows,
              "process_over_session": compared,
              "what": "one ingress process, one fixture server over HTTP, S subjects, each its own MCP "
                      "session; layout process: one Temporal worker and task queue for all (production); "
                      "layout session: one worker and queue per session (before one ingress per process); no "
                      "subscriptions; idle CPU over the idle window"}
    (out / "ingress_scale.json").write_text(json.dumps(report, indent=2))
    return report


def print_table(report: dict[str, Any]) -> None:
    print("\n== mcpsync ingress scale (one process, one server) ==")
    print(f"  {'layout':>8} {'subjects':>8} {'open s':>7} {'queues':>7} {'pollers':>8} {'RSS MiB':>8} "
          f"{'KiB/subj':>9} {'threads':>8} {'idle CPU %: ingress':>20} {'dev server':>11} {'fixture':>8}")
    for r in report["levels"]:
        c = r["idle_cpu_pct_of_one_core"]
        print(f"  {r['layout']:>8} {r['subjects']:>8} {r['seconds_to_open_all']:>7} {r['task_queues']:>7} "
              f"{r['activity_pollers']:>8} {r['ingress_rss_after_bytes'] / 2**20:>8.1f} "
              f"{r['ingress_rss_per_subject_bytes'] / 1024:>9.1f} {r['ingress_threads']:>8} "
              f"{c['ingress_process']!s:>20} {c['temporal_dev_server']!s:>11} {c['fixture']!s:>8}")
    for s, q in report.get("process_over_session", {}).items():
        print(f"  process/session at S={s}: " + ", ".join(f"{k} {v}" for k, v in q.items()))


def _child(argv: Sequence[str]) -> None:
    subjects, idle, result = int(argv[0]), float(argv[1]), Path(argv[2])
    layout = Layout(argv[3]) if len(argv) > 3 else Layout.PROCESS
    code = 0
    try:
        data = asyncio.run(measure_one(subjects, idle, layout))
        result.write_text(json.dumps(data))
        print(f"[{time.strftime('%H:%M:%S')}] ingress scale {layout.value} {subjects}: {json.dumps(data)}",
              flush=True)
    except Exception as exc:  # the orchestrator reports the failure by exit code
        print(f"ingress scale {layout.value} {subjects} failed: {type(exc).__name__}: {exc}", file=sys.stderr,
              flush=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a process that ran a Temporal worker can abort at interpreter exit (sdk-python#300)


if __name__ == "__main__":
    _child(sys.argv[1:])
