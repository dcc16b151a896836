"""mcpsync's services during a benchmark run: in the benchmark's process, or split as in production.

Contract:
- :class:`InProcessServices` runs ``mcpsync.worker.main.services.run_services`` (main worker and session
  hosts) as a task of the benchmark's process, which also holds the driver, the naive baseline and
  the floor's worker. One process, one interpreter lock: its CPU cannot be told apart from theirs.
- :class:`SplitServices` runs the same ``run_services`` call in two child processes, the way a
  deployment runs ``mcpsync worker --role main`` and ``mcpsync worker --role ingress``:
  ``main`` holds the workflows and the ledger activities, ``ingress`` the session hosts and the
  ingress queue (the read cycle runs there). Catalog workflows are not started, as in-process.
  Each child serves its own ``/metrics`` (port 0) and says where in a ready file; a child that
  exits early fails :meth:`Services.check` with the tail of its stderr.
- :func:`scrape` reads one ``/metrics`` endpoint into ``{(sample name, labels): value}`` (the
  benchmark's probe sums several).
- Both expose the same narrow surface: :meth:`check`, :meth:`host_totals` (notifications received
  and coalesced by the session hosts, per server), ``metrics_urls`` (endpoints to scrape besides
  the benchmark's own), ``named_processes`` (pid -> cost role), ``worker_pid`` (whose RSS is the
  worker's memory) and :meth:`stop`.

Child entry (internal): ``python -m benchmarks.services --config FILE --role main|ingress --ready
FILE``, the database URL in ``MCPSYNC_DATABASE_URL`` (never on a command line, where ``ps`` shows
a password).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
import urllib.request
from contextlib import suppress
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client

from benchmarks.cost import Role
from mcpsync.activities.ledger import Ledger
from mcpsync.worker.main import event_loop
from mcpsync.worker.main.config import Config, MetricsConfig
from mcpsync.worker.observe import metrics
from mcpsync.worker.observe.metrics import HostTotals

__all__ = ["InProcessServices", "Layout", "Scrape", "Services", "SplitServices", "scrape", "start_services"]

Scrape = dict[tuple[str, frozenset[tuple[str, str]]], float]

_READY_TIMEOUT = 60.0
_REPO = Path(__file__).resolve().parents[1]
_DATABASE_URL_ENV = "MCPSYNC_DATABASE_URL"


class Layout(StrEnum):
    SPLIT = "split"  # worker and ingress in processes of their own (production's shape)
    IN_PROCESS = "in-process"  # both inside the benchmark's process (the layout before 2026-12-03 evening)


class Services(Protocol):
    metrics_urls: list[str]
    named_processes: dict[int, Role]
    worker_pid: int

    async def check(self) -> None:
        """Raise if the services died."""

    async def host_totals(self, server: str) -> HostTotals:
        """Notifications received, coalesced and read at the ingress by the session hosts of ``server`` so
        far."""

    async def stop(self) -> None: ...


class InProcessServices:
    def __init__(self, task: asyncio.Task[None]) -> None:
        self.task = task
        self.metrics_urls: list[str] = []
        self.named_processes: dict[int, Role] = {}
        self.worker_pid = os.getpid()

    async def check(self) -> None:
        if self.task.done():
            self.task.result()
            raise RuntimeError("the in-process services stopped")

    async def host_totals(self, server: str) -> HostTotals:
        return metrics.host_totals().get(server, HostTotals())

    async def stop(self) -> None:
        self.task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await self.task


class _Child:
    def __init__(self, role: str, proc: asyncio.subprocess.Process, stderr: Path, metrics_url: str) -> None:
        self.role, self.proc, self.stderr, self.metrics_url = role, proc, stderr, metrics_url

    def tail(self) -> str:
        try:
            return "\n".join(self.stderr.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            return ""


class SplitServices:
    def __init__(self, main: _Child, ingress: _Child) -> None:
        self.main, self.ingress = main, ingress
        self.metrics_urls = [main.metrics_url, ingress.metrics_url]
        self.named_processes = {main.proc.pid: Role.MCPSYNC_WORKER, ingress.proc.pid: Role.MCPSYNC_INGRESS}
        self.worker_pid = main.proc.pid

    @classmethod
    async def start(cls, config: Config, database_url: str, work: Path) -> SplitServices:
        cfg = work / "services-config.json"
        await asyncio.to_thread(_write, cfg, config.model_dump_json())
        started: list[_Child] = []
        try:
            for role in ("main", "ingress"):  # main first: it registers the search attributes
                started.append(await _spawn(role, cfg, database_url, work))
        except BaseException:
            for child in started:
                await _terminate(child.proc)
            raise
        return cls(*started)

    async def check(self) -> None:
        for child in (self.main, self.ingress):
            if child.proc.returncode is not None:
                raise RuntimeError(f"the {child.role} process exited with "
                                   f"{child.proc.returncode}:\n{child.tail()}")

    async def host_totals(self, server: str) -> HostTotals:
        received = coalesced = read = verified = 0.0
        for (name, labels), value in (await scrape(self.ingress.metrics_url)).items():
            if ("server", server) not in labels:
                continue
            if name.startswith("mcpsync_notifications_received"):
                received += value
            elif name.startswith("mcpsync_notifications_coalesced"):
                coalesced += value
            elif name.startswith("mcpsync_notifications_read_at_ingress"):
                read += value
            elif name.startswith("mcpsync_notifications_verified_at_ingress"):
                verified += value
        return HostTotals(int(received), int(coalesced), int(read), verified=int(verified))

    async def stop(self) -> None:
        await asyncio.gather(_terminate(self.ingress.proc), _terminate(self.main.proc))


async def start_services(layout: Layout, config: Config, client: Client, ledger: Ledger, database_url: str,
                         work: Path) -> Services:
    if layout == Layout.SPLIT:
        return await SplitServices.start(config, database_url, work)
    from mcpsync.worker.main.services import run_services

    return InProcessServices(asyncio.create_task(run_services(config, client, ledger), name="bench-services"))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


async def scrape(url: str) -> Scrape:
    """One ``/metrics`` endpoint's samples by (name, labels)."""
    return {(sample.name, frozenset(sample.labels.items())): float(sample.value)
            for family in text_string_to_metric_families(await asyncio.to_thread(_get, url))
            for sample in family.samples}


async def _spawn(role: str, cfg: Path, database_url: str, work: Path) -> _Child:
    ready, stderr = work / f"services-{role}.ready.json", work / f"services-{role}.stderr.log"
    await asyncio.to_thread(ready.unlink, missing_ok=True)
    err = await asyncio.to_thread(stderr.open, "wb")
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.services", "--config", str(cfg), "--role", role,
            "--ready", str(ready), env={**os.environ, _DATABASE_URL_ENV: database_url},
            stdout=asyncio.subprocess.DEVNULL, stderr=err, cwd=_REPO)
    finally:
        err.close()
    child = _Child(role, proc, stderr, "")
    deadline = time.monotonic() + _READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"the {role} process exited with {proc.returncode} before it was ready:\n"
                               f"{child.tail()}")
        with suppress(OSError, ValueError):
            child.metrics_url = json.loads(ready.read_text())["metrics_url"]
            return child
        await asyncio.sleep(0.1)
    await _terminate(proc)
    raise RuntimeError(f"the {role} process was not ready within {_READY_TIMEOUT:g} s:\n{child.tail()}")


async def _terminate(proc: asyncio.subprocess.Process, timeout: float = 10.0) -> None:
    if proc.returncode is None:
        with suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            with suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


# --- the child ---------------------------------------------------------------------------


async def _child(config: Config, role: str, database_url: str, ready: Path) -> None:
    from mcpsync.worker.main.connect import connect_temporal, open_ledger
    from mcpsync.worker.main.services import run_services
    from mcpsync.worker.observe.metrics import serve_metrics

    server = serve_metrics(MetricsConfig(port=0))  # before the client: it installs the SDK runtime
    client = await connect_temporal(config.temporal)
    ledger = await open_ledger(database_url)
    server.watch_ledger(ledger)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    main = role == "main"
    run_cfg = config.model_copy(update={"servers": []}) if main else config
    services = asyncio.create_task(run_services(run_cfg, client, ledger, with_main_worker=main))
    tmp = ready.with_suffix(".tmp")
    tmp.write_text(json.dumps({"metrics_url": server.url, "pid": os.getpid()}))
    tmp.replace(ready)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait([services, stopped], return_when=asyncio.FIRST_COMPLETED)
        if services.done():
            services.result()
    finally:
        services.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await services
        await server.aclose()
        await ledger.pool.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.services")
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--role", choices=["main", "ingress"], required=True)
    p.add_argument("--ready", type=Path, required=True)
    args = p.parse_args(argv)
    config = Config.model_validate_json(args.config.read_text())
    database_url = os.environ.get(_DATABASE_URL_ENV)
    if not database_url:
        p.error(f"{_DATABASE_URL_ENV} is not set")
    event_loop.run(_child(config, args.role, database_url, args.ready))  # the CLI's loop


if __name__ == "__main__":
    main()
