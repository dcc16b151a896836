"""The published staleness bound on the real stack: wake-ups never postpone a read.

The poll / safety read has a deadline that a pass of the subscription loop does not move: a timer restarted
on every wake-up would let catalog words arriving more often than the poll period starve a polling
subscription of reads while its record still published the bound. Here catalog words arrive every 0.7 s and
the gap between consecutive read allocations (``read_requests.issued_at``, the ledger's own clock) must stay
within the published bound (a 2 s poll) plus a stated dispatch slack, compared to the microsecond: a
restarting timer reads nothing at all during the burst, and a single read one period late or skipped
leaves a gap of at least two jittered periods, more than the bound plus the slack.

One test runs against our fixture server without subscribe; one against
``@modelcontextprotocol/server-postgres`` 0.6.2 over stdio, a server nobody here wrote, which
has no subscribe capability and negotiates edition 2024-11-05 although 2025-11-25 is configured
(edition honesty: an EDITION_MISMATCH audit row, the negotiated edition in the record).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from mcp.client import Client as McpClient
from temporalio.client import Client, WorkflowHandle

from benchmarks.staleness import gaps_between_reads
from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.ingress.session_host import server_transport
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.stack.common import REPO_ROOT
from mcpsync.workflows.names import SIGNAL_CATALOG_RECONCILED
from mcpsync.workflows.records.subscription import (
    CatalogObservation,
    SubscriptionKey,
    SubscriptionOptions,
    SubscriptionState,
)
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.test_e2e_fence import _record
from tests.e2e.test_e2e_subscription import _wait_record

S = SubscriptionState
POLL_SECONDS = 2.0  # the published bound; the deadline falls at 0.8-1.0 of it less the 0.2 s dispatch margin
DISPATCH_SLACK = 0.85
"""How far past the bound a gap may end: the read's dispatch beyond the 0.2 s margin the deadline already
keeps (1.05 s in all at the latest jitter draw). Measured with 2 s polls: gaps of 1.28-1.84 s, under a
second test file's load too (0.16 s spare against the bare bound, 1.01 s against this one). It must stay
below 0.88 s: a read one period late (or skipped) leaves a gap of at least 2 x 0.8 x 1.8 = 2.88 s."""
BURST_SECONDS = 8.0  # four periods of catalog words
SERVER_POSTGRES = REPO_ROOT / ".state/npm/node_modules/@modelcontextprotocol/server-postgres/dist/index.js"


async def _catalog_burst(handle: WorkflowHandle, key: SubscriptionKey, seconds: float) -> int:
    """Catalog words that agree with the subscription (listed), every 0.7 s: pure wake-ups."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    sent = 0
    while loop.time() < end:
        sent += 1
        await handle.signal(SIGNAL_CATALOG_RECONCILED, CatalogObservation(
            uri=key.uri, listed=True, scan_id=f"burst-{sent}", snapshot_status="SNAPSHOT_UNPROVEN",
            session_generation=0))
        # Models the real-world cadence of the wake-ups: a catalog word every 0.7 s, more often than
        # the 2 s poll period, so a poll timer restarted by each wake-up would never fire.
        await asyncio.sleep(0.7)
    return sent


async def _max_gap(ledger: Ledger, key: SubscriptionKey, since_ordinal: int) -> tuple[float, int]:
    rows = await ledger_rows(
        ledger, "SELECT issued_at FROM read_requests WHERE workflow_id=%s AND ordinal >= %s ORDER BY ordinal",
        key.workflow_id, since_ordinal)
    times = [r[0] for r in rows]
    now = (await ledger_rows(ledger, "SELECT now()"))[0][0]
    # The benchmark's own figure (max_gap_between_reads_s), from the first read to now, open gap included.
    return max(gaps_between_reads(times, times[0], now)), len(times)


async def _burst_keeps_the_bound(ledger: Ledger, handle: WorkflowHandle, key: SubscriptionKey) -> None:
    rec = await _wait_record(handle, lambda r: r.state == S.ACTIVE and r.last_issued_ordinal > 0,
                             "first read")
    assert rec.staleness_bound_seconds == POLL_SECONDS
    first = rec.last_issued_ordinal
    sent = await _catalog_burst(handle, key, BURST_SECONDS)
    gap, reads = await _max_gap(ledger, key, first)
    assert sent >= 10  # 12 words in 8 s, 0.7 s apart; two fewer when a busy box slows the signals
    # Without deadlines: no read during the whole burst (gap >= BURST_SECONDS, reads == 1).
    assert gap <= POLL_SECONDS + DISPATCH_SLACK, \
        f"{gap:.3f} s between reads under {sent} catalog words (bound {POLL_SECONDS} s + {DISPATCH_SLACK} s)"
    assert reads >= BURST_SECONDS // POLL_SECONDS
    rec = await _record(handle)  # the record publishes the deadline it keeps
    assert rec.next_read_due_at is not None and rec.last_verified_at is not None
    assert rec.next_read_due_at <= rec.last_verified_at + timedelta(seconds=POLL_SECONDS) \
        + timedelta(seconds=5)


async def test_catalog_words_never_postpone_the_poll_deadline(temporal_client: Client, ledger: Ledger,
                                                              tmp_path: Path) -> None:
    async with await FixtureProcess.start_http(tmp_path, seed="none", subscribe=False) as fx:
        server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=["alice"],
                              catalog=False)
        async with running_services(temporal_client, ledger, [server]) as cfg:
            key = SubscriptionKey(subject="alice", server=server.name, uri=f"demo://stale/{uuid.uuid4().hex}")
            await fx.create(key.uri, text="v1")
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue,
                                              options=SubscriptionOptions(poll_interval_seconds=POLL_SECONDS))
            await _burst_keeps_the_bound(ledger, handle, key)


@asynccontextmanager
async def _scratch_database(database_url: str) -> AsyncIterator[str]:
    """A database of its own for server-postgres to describe (its tables are its resources)."""
    name = f"mcpsync_pgmcp_{uuid.uuid4().hex[:8]}"
    prefix, sep, query = database_url.partition("?")
    admin = database_url
    url = f"{prefix.rsplit('/', 1)[0]}/{name}{sep}{query}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _for_node(url: str) -> str:
    """The URL as server-postgres can take it: Node's URL parser refuses an empty host, which a Unix
    socket URL has (``postgresql://postgres:@/db?host=/dir``, the embedded default); node-postgres
    takes the socket from the ``host`` query parameter whatever host the URL names."""
    return url.replace(":@/", "@localhost/", 1) if "?host=" in url else url


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (scripts/install-npm-servers)")
async def test_server_postgres_polls_within_the_bound_and_says_its_edition(
        temporal_client: Client, ledger: Ledger, database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    assert SERVER_POSTGRES.exists(), "scripts/install-npm-servers installs server-postgres"
    async with _scratch_database(database_url) as pg_url:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("CREATE TABLE escalation_policy (id int)")
        server = ServerConfig(name=unique("pgmcp"), transport="stdio", edition="2025-11-25",
                              command=["node", str(SERVER_POSTGRES), _for_node(pg_url)], subjects=["alice"],
                              catalog=False)
        async with McpClient(server_transport(server, "alice"), mode="legacy", cache=None) as probe:
            listed = [r.uri for r in (await probe.list_resources()).resources]
        uri = next(u for u in listed if u.endswith("/escalation_policy/schema"))
        async with running_services(temporal_client, ledger, [server]) as cfg:
            key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
            handle = await start_subscription(temporal_client, key, task_queue=cfg.temporal.task_queue,
                                              options=SubscriptionOptions(poll_interval_seconds=POLL_SECONDS))
            await _burst_keeps_the_bound(ledger, handle, key)
            rec = await _wait_record(handle, lambda r: r.edition != "", "edition recorded")
            assert rec.edition == "2024-11-05" and not rec.capabilities.get("subscribe")
            mismatch = await ledger_rows(
                ledger, "SELECT detail FROM audit WHERE kind='EDITION_MISMATCH' AND server=%s", server.name)
            assert mismatch and mismatch[0][0] == {"configured": "2025-11-25", "negotiated": "2024-11-05"}
            warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
                      and r.name == "mcpsync.ingress" and "negotiated 2024-11-05" in r.getMessage()]
            assert warned and "configured edition 2025-11-25" in warned[0], "and a warning line says so"
            # A real change on that server is read within the published bound (plus a dispatch).
            before = rec.last_accepted_digest
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute("ALTER TABLE escalation_policy ADD COLUMN owner text")
            loop = asyncio.get_running_loop()
            changed_at = loop.time()
            await eventually(lambda: _accepted_other_than(handle, before), timeout=POLL_SECONDS + 10,
                             what="the schema change accepted by polling")
            assert loop.time() - changed_at <= POLL_SECONDS + DISPATCH_SLACK + 1.0
            receipts = await ledger_rows(
                ledger, "SELECT edition FROM resource_versions WHERE workflow_id=%s", key.workflow_id)
            assert receipts and {r[0] for r in receipts} == {"2024-11-05"}


async def _accepted_other_than(handle: WorkflowHandle, digest: str | None) -> bool:
    rec = await _record(handle)
    return rec.last_accepted_digest is not None and rec.last_accepted_digest != digest
