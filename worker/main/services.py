"""Services: the main worker beside one ingress and its session hosts, retention, the catalogs.

Contract:
- ``run_services`` runs the main worker (``main_worker``) beside one ``Ingress`` (one worker, one task
  queue for the MCP activities of every session of the process) and its ``SessionHost`` per (server,
  subject). The ingress worker is never versioned: it runs activities only (no workflow
  code to pin), and each (server, subject) has one lease-holding host whose live MCP session every
  build's reads must reach, so their activity contract stays compatible across builds.
- ``start_catalogs`` starts (or joins) the CatalogWorkflow of every server with ``catalog = true``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence
from contextlib import suppress
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_catalog
from mcpsync.worker.main.config import Config, RetentionConfig
from mcpsync.worker.main.worker import main_worker
from mcpsync.worker.stack.temporal import ensure_search_attributes
from mcpsync.workflows.records.catalog import CatalogKey

if TYPE_CHECKING:
    from mcpsync.worker.ingress.process import Ingress

__all__ = ["cancel_and_wait", "run_services", "start_catalogs"]


log = logging.getLogger("mcpsync.runtime")


async def _register_search_attributes(client: Client, namespace: str) -> None:
    """An upgrade may bring new search attributes (e.g. McpCatalogState): register them before the
    workflows upsert them, where the cluster allows it. Temporal Cloud does not: then say which."""
    try:
        added = await ensure_search_attributes(client, namespace)
    except Exception as exc:  # permission denied (Cloud), wrong type, unreachable operator API
        log.warning("could not register search attributes on %r (%s: %s); register those of "
                    "temporal/search_attributes.toml by hand (Cloud: tcld or the UI)", namespace,
                    type(exc).__name__, str(exc)[:200])
        return
    if added:
        log.info("registered search attributes on %r: %s", namespace, ", ".join(added))


async def run_services(config: Config, client: Client, ledger: Ledger, *,
                       servers: Sequence[str] | None = None, with_main_worker: bool = True,
                       ready: asyncio.Event | None = None,
                       polling: list[Callable[[], bool]] | None = None,
                       ingress: Ingress | None = None) -> None:
    """Run the main worker and the session hosts until cancelled.

    ``polling``: gets one check per Temporal worker this process runs (main, ingress), each true
    once that worker polls (``MetricsServer.ready_when``: ``/readyz``). ``ingress``: the one its
    session hosts belong to (default: a new one), for a caller that asks it which sessions this
    process holds (``Ingress.live``)."""
    # Imported here: the MCP client library is most of the CLI's start-up time, and only the
    # processes that host sessions need it.
    from mcpsync.worker.ingress.process import Ingress
    from mcpsync.worker.ingress.session_host import SessionHost

    ingress = ingress if ingress is not None else Ingress(client, ledger)
    hosts = [
        SessionHost(server, subject, ledger, client, ingress=ingress)
        for server in config.servers
        if servers is None or server.name in servers
        for subject in server.subjects
    ]
    if with_main_worker:
        await _register_search_attributes(client, config.temporal.namespace)
    tasks = [asyncio.create_task(h.run(), name=f"host:{h.server.name}/{h.subject}") for h in hosts]
    if hosts:  # a main-only process polls no ingress queue
        tasks.append(asyncio.create_task(ingress.run(), name="ingress-worker"))
    worker = main_worker(client, ledger, config.temporal) if with_main_worker else None
    if polling is not None:
        if hosts:
            polling.append(lambda: ingress.polling)
        if worker is not None:
            main = worker
            polling.append(lambda: main.is_running)
    try:
        if worker is not None:
            tasks.append(asyncio.create_task(worker.run(), name="main-worker"))
            if config.retention is not None:
                tasks.append(asyncio.create_task(_prune_periodically(ledger, config.retention),
                                                 name="retention"))
        if ready is not None:
            ready.set()
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            t.result()
    finally:
        for h in hosts:
            h.stop()
        await cancel_and_wait(tasks)


async def cancel_and_wait(tasks: Collection[asyncio.Task[Any]]) -> None:
    """Cancel each of ``tasks`` once and wait until all have finished (their results dropped). A
    cancellation of the caller meanwhile does not reach them: awaiting a task passes a cancel on to
    it, and a task cancelled again in its cleanup abandons what it was finishing (psycopg closes a
    connection whose query it was cancelling). The caller is cancelled twice on a Ctrl-C in
    ``mcpsync up``: serve's uvicorn takes the SIGINT, stops, and raises it again."""
    for t in tasks:
        t.cancel()
    pending = {t for t in tasks if not t.done()}
    while pending:
        with suppress(asyncio.CancelledError):
            _, pending = await asyncio.wait(pending)
    for t in tasks:
        if not t.cancelled():
            t.exception()  # retrieved: no "exception was never retrieved" at exit


async def _prune_periodically(ledger: Ledger, cfg: RetentionConfig) -> None:
    """``[retention]``: prune every interval; a failed run is logged and retried next interval."""
    from mcpsync.activities.ledger.retention import prune

    while True:
        await asyncio.sleep(cfg.interval_seconds)
        try:
            report = await prune(ledger.pool, keep=timedelta(days=cfg.keep_days),
                                 consumer_max_lag=timedelta(days=cfg.consumer_max_lag_days))
        except Exception as exc:  # a database outage must not take the worker down
            log.warning("retention run failed: %s: %s", type(exc).__name__, str(exc)[:200])
            continue
        log.info("retention: %s", report.model_dump_json(exclude={"dry_run"}))


async def start_catalogs(client: Client, config: Config) -> list[str]:
    """Start (or join) the CatalogWorkflow of every (server, subject) whose server has ``catalog = true``."""
    started = []
    for server in config.servers:
        if not server.catalog:
            continue
        for subject in server.subjects:
            handle = await start_catalog(client, CatalogKey(subject=subject, server=server.name),
                                         task_queue=config.temporal.task_queue)
            started.append(handle.id)
    return started
