"""Ingress at scale (issue 12 item 5, measurement only): one ingress process, S subjects, one server.

    .venv/bin/python -m benchmarks.run --ingress-scale 1,50,200 [--idle-seconds 10] [--out benchmarks/out]

Contract:
- Each S runs in a fresh child process (its RSS is its own): a fresh Temporal dev server and
  database (``benchmarks.run.Postgres``), one fixture MCP server over streamable HTTP and
  production ``worker.runtime.run_services(..., with_main_worker=False)`` for one ``ServerConfig``
  listing S subjects: S ``SessionHost``s in this process, each with its own MCP session, its own
  Temporal worker and its own session task queue. No subscription is started: this is the cost
  of hosting sessions, before any work. ``catalog=False``: catalog scans are work, not hosting.
- Once every (subject, server) has an open session in the ledger and ``settle`` seconds passed,
  it measures: this process's RSS (before the hosts started, and now), the activity pollers the
  SDK reports (``temporal_num_pollers`` gauge summed over the session task queues), the Temporal
  workers' task queues, and CPU seconds over ``idle_seconds`` of nothing happening, per process
  (this one, the dev server, the fixture) from /proc.
- The orchestrator (:func:`run_scale`) writes ``ingress_scale.json`` in ``--out`` and prints a
  table; nothing is asserted.
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
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from benchmarks.common import until
from worker.config import Config, ServerConfig, TemporalConfig
from worker.fixture import FixtureProcess
from worker.runtime import open_ledger, run_services
from worker.stack import TemporalDevServer, state_dir
from workflows.records import session_task_queue

__all__ = ["measure_one", "run_scale"]

REPO = Path(__file__).resolve().parents[1]
SERVER = "ingress-scale"


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


async def measure_one(subjects: int, idle_seconds: float, settle: float = 3.0) -> dict[str, Any]:
    """One process hosting ``subjects`` sessions of one server; see the module contract."""
    from benchmarks.run import Postgres, Probe, rss_bytes

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
            temporal = await TemporalDevServer.start(tdir, port=0, ui_port=0)
            stack.push_async_callback(temporal.stop)
            stack.callback(shutil.rmtree, tdir, True)
            client = await Client.connect(temporal.address, data_converter=pydantic_data_converter,
                                          runtime=probe.runtime)
            ledger = await open_ledger(db_url, max_size=16)
            stack.push_async_callback(ledger.pool.close)
            fx = await FixtureProcess.start_http(work, seed="none", log_level="WARNING")
            stack.push_async_callback(fx.stop)
            config = Config(temporal=TemporalConfig(address=temporal.address, task_queue="ingress-scale-unused"),
                            servers=[ServerConfig(name=SERVER, transport="http", url=fx.mcp_url, subjects=names,
                                                  catalog=False)])
            await asyncio.sleep(1.0)
            gc.collect()
            rss0 = rss_bytes()
            t0 = time.monotonic()
            services = asyncio.create_task(run_services(config, client, ledger, with_main_worker=False))

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
            queues = {session_task_queue(s, SERVER) for s in names}
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
                "subjects": subjects,
                "sessions_open": subjects,
                "seconds_to_open_all": round(opened_s, 2),
                "session_task_queues": len(queues),
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


def run_scale(levels: Sequence[int], idle_seconds: float, out: Path) -> dict[str, Any]:
    """Each level in a child process (this module's ``__main__``); writes ``out/ingress_scale.json``."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for s in levels:
        result = (out / f".ingress-{s}.json").resolve()
        result.unlink(missing_ok=True)
        code = subprocess.run([sys.executable, "-m", "benchmarks.ingress_scale", str(s), str(idle_seconds),
                               str(result)], cwd=str(REPO), check=False).returncode
        if code != 0 or not result.exists():
            raise RuntimeError(f"ingress scale {s} failed (exit code {code})")
        rows.append(json.loads(result.read_text()))
        result.unlink()
    report = {"benchmark": "mcpsync ingress scale", "cpus": os.cpu_count(), "levels": rows,
              "what": "one ingress process, one fixture server over HTTP, S subjects: S session hosts, each its own "
                      "MCP session, Temporal worker and task queue; no subscriptions; idle CPU over the idle window"}
    (out / "ingress_scale.json").write_text(json.dumps(report, indent=2))
    return report


def print_table(report: dict[str, Any]) -> None:
    print("\n== mcpsync ingress scale (one process, one server) ==")
    print(f"  {'subjects':>8} {'open s':>7} {'pollers':>8} {'RSS MiB':>8} {'KiB/subj':>9} {'threads':>8} "
          f"{'idle CPU %: ingress':>20} {'dev server':>11} {'fixture':>8}")
    for r in report["levels"]:
        c = r["idle_cpu_pct_of_one_core"]
        print(f"  {r['subjects']:>8} {r['seconds_to_open_all']:>7} {r['activity_pollers']:>8} "
              f"{r['ingress_rss_after_bytes'] / 2**20:>8.1f} {r['ingress_rss_per_subject_bytes'] / 1024:>9.1f} "
              f"{r['ingress_threads']:>8} {c['ingress_process']!s:>20} {c['temporal_dev_server']!s:>11} "
              f"{c['fixture']!s:>8}")


def _child(argv: Sequence[str]) -> None:
    subjects, idle, result = int(argv[0]), float(argv[1]), Path(argv[2])
    code = 0
    try:
        data = asyncio.run(measure_one(subjects, idle))
        result.write_text(json.dumps(data))
        print(f"[{time.strftime('%H:%M:%S')}] ingress scale {subjects}: {json.dumps(data)}", flush=True)
    except Exception as exc:  # the orchestrator reports the failure by exit code
        print(f"ingress scale {subjects} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # a process that ran a Temporal worker can abort at interpreter exit (sdk-python#300)


if __name__ == "__main__":
    _child(sys.argv[1:])
