"""Process faults: the Temporal dev server killed and restarted on its SQLite file, PostgreSQL
(the embedded server from the wheel) stopped and started, while changes keep coming; the only
ingress of idle subscriptions killed and none for twice their safety-read period.

Invalidations that arrive while a dependency is down are retried by the ingress, ledger
activities are retried by Temporal: every change still converges and nothing regresses. The
verifications no ingress made while none ran are reported once one returns (docs/caching.md,
"When an ingress returns"), and read within its window.
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.main.connect import open_ledger
from mcpsync.worker.stack.postgres import EmbeddedPostgres
from mcpsync.worker.stack.temporal import TemporalDevServer
from mcpsync.workflows.records.ledger import AcceptVerdict, OutboxEventType
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionOptions
from mcpsync.workflows.verification_rules import SWEEP_IDLE_SECONDS
from tests.conftest import eventually, ledger_rows, running_services, unique
from tests.e2e.conftest import SpareFixtures, ingress_received
from tests.e2e.test_e2e_scaleout import _metrics_port, _spawn, _stop
from tests.e2e.test_e2e_subscription import _wait_record
from tests.e2e.test_metrics import _samples, _scrape, _value


async def test_temporal_and_postgres_restarts_lose_nothing(own_state_dir: Path,
                                                           spare_fixtures: SpareFixtures) -> None:
    temporal = await TemporalDevServer.start(own_state_dir / "temporal", port=0, ui_port=0)
    pg = await EmbeddedPostgres.start(own_state_dir, database="faults")
    ledger = await open_ledger(pg.url)
    fx = await spare_fixtures.take()
    try:
        client = await Client.connect(temporal.address, data_converter=pydantic_data_converter)
        server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url)
        uri = f"demo://proc/{uuid.uuid4().hex}"
        key = SubscriptionKey(subject="anonymous", server=server.name, uri=uri)
        first = await fx.create(uri, text="v1")
        async with running_services(client, ledger, [server]) as cfg:
            handle = await start_subscription(client, key, task_queue=cfg.temporal.task_queue)
            await _wait_record(handle, lambda r: r.last_accepted_digest == first["committed"]["digest"], "v1")
            await fx.wait_subscribed(uri)

            # Temporal killed (SIGKILL) while a change is notified; restarted on the same file.
            await temporal.kill()
            received = ingress_received(server.name)
            v2 = await fx.edit(uri, text="v2 while Temporal is down")
            # Witness that the change was notified while Temporal was down: the ingress received it.
            await eventually(lambda: ingress_received(server.name) > received, timeout=30,
                             what="v2's notification received by the ingress while Temporal is down")
            await temporal.restart()
            await _wait_record(handle, lambda r: r.last_accepted_digest == v2["committed"]["digest"],
                               "v2 after the Temporal restart", timeout=60)

            # PostgreSQL stopped while a change is notified; started again on the same data dir.
            await pg.stop()
            received = ingress_received(server.name)
            v3 = await fx.edit(uri, text="v3 while PostgreSQL is down")
            # Witness that the change was notified while PostgreSQL was down: the ingress received it.
            await eventually(lambda: ingress_received(server.name) > received, timeout=30,
                             what="v3's notification received by the ingress while PostgreSQL is down")
            pg = await EmbeddedPostgres.start(own_state_dir, database="faults")
            rec = await _wait_record(handle, lambda r: r.last_accepted_digest == v3["committed"]["digest"],
                                     "v3 after the PostgreSQL restart", timeout=90)
        fence = await ledger.load_fence(key)
        assert fence.last_accepted_digest == v3["committed"]["digest"] and fence.watermark == rec.watermark
        statuses = [r.status.value for r in await ledger.reports.receipts(key)]
        accepted = [r.read_ordinal for r in await ledger.reports.receipts(key)
                    if r.status.value == "ACCEPTED"]
        assert accepted == sorted(accepted) and statuses.count("ACCEPTED") >= 3
    finally:
        await fx.stop()
        await ledger.pool.close()
        await pg.stop()
        await temporal.stop()



# --- the ingress killed for two periods ------------------------------------------------------

KILL_PERIOD = 4.0  # safety_read_seconds: the sweep verifies a row 3.2-3.6 s after its newest verification
NO_INGRESS = 2 * KILL_PERIOD  # how long no ingress holds the lease (none sweeps, none reads)
# A lease is granted for 0.85 of this (9.35 s) and renewed every 0.2 (2.2 s): the ingress is killed
# while its lease has over NO_INGRESS left, and the standby started then (the next ingress) takes it
# when it lapses, so the next ingress's own start is not the test's time.
KILL_LEASE_SECONDS = 11.0
KILL_SUBSCRIPTIONS = 6
# docs/caching.md: every overdue row is read (and its gap reported) within SWEEP_IDLE_SECONDS and one
# read of the new holder taking the lease; READ_SECONDS is that read's dispatch on a loaded box.
READ_SECONDS = 2.0
RETURN_WINDOW = SWEEP_IDLE_SECONDS + READ_SECONDS


async def test_ingress_killed_for_two_periods_every_gap_reported_and_read_on_its_return(
        temporal_client: Client, temporal_server: TemporalDevServer, ledger: Ledger, database_url: str,
        tmp_path: Path, spare_fixtures: SpareFixtures) -> None:
    """The only ingress of an idle (subject, server) SIGKILLed, none for twice the safety-read period,
    then one again: every subscription's gap is reported once, closed by its first verification
    (an ``overdue`` outbox event, ``mcpsync_verifications_overdue`` on the main worker's endpoint),
    within the documented window of the new holder's lease; a change made while no ingress ran is
    accepted once, and every subscription's receipts and outbox stay in read-ordinal order."""
    server, queue = unique("fx"), unique("killq")
    stack = f'[temporal]\naddress = "{temporal_server.address}"\ntask_queue = "{queue}"\n\n' \
            f'[database]\nurl = "{database_url}"\n\n'
    main_config = tmp_path / "main.toml"
    main_config.write_text(f'{stack}[metrics]\nport = 0\nrefresh_seconds = 0.5\n')
    # The main worker serves no MCP server (``--role main`` drops them): it starts while the fixture does.
    procs = {"main": _spawn(main_config, "main", tmp_path / "main.log")}
    tag = uuid.uuid4().hex[:8]
    keys = [SubscriptionKey(subject="alice", server=server, uri=f"demo://kill/{tag}/{i}")
            for i in range(KILL_SUBSCRIPTIONS)]
    uris = [k.uri for k in keys]
    fx: FixtureProcess | None = None
    try:
        fx = await spare_fixtures.take()
        config = tmp_path / "ingress.toml"
        config.write_text(
            f'{stack}[[servers]]\nname = "{server}"\ntransport = "http"\nurl = "{fx.mcp_url}"\n'
            f'subjects = ["alice"]\ncatalog = false\nlease_seconds = {KILL_LEASE_SECONDS}\n'
            f'ping_interval_seconds = 0.5\nping_timeout_seconds = 2\n')
        procs["in1"] = _spawn(config, "ingress", tmp_path / "in1.log")
        v1 = {k.uri: (await fx.create(k.uri, text="v1"))["committed"]["digest"] for k in keys}
        options = SubscriptionOptions(safety_read_seconds=KILL_PERIOD)
        handles = await asyncio.gather(*(start_subscription(temporal_client, k, task_queue=queue,
                                                            options=options) for k in keys))

        async def verified() -> bool:
            rows = await ledger_rows(ledger, "SELECT count(*) FROM subscriptions WHERE uri = ANY(%s)"
                                     " AND verified_at IS NOT NULL AND last_accepted_digest = ANY(%s)",
                                     uris, list(v1.values()))
            return rows[0][0] == len(keys)

        await eventually(verified, timeout=90, what="every subscription read and verified")
        holder = await ledger.sessions.lease_holder("alice", server)
        assert holder is not None and int(holder[0].split(":")[1]) == procs["in1"].pid, holder
        before = {k.uri: (await ledger.fence.find_subscription(k.subject, k.server, k.uri)) for k in keys}

        # Killed while its lease has a little over NO_INGRESS left: no ingress can hold it for that long.
        await eventually(lambda: _lease_left(ledger, server, NO_INGRESS + 0.3, NO_INGRESS + 0.8),
                         timeout=3 * KILL_LEASE_SECONDS, interval=0.02, what="the lease's time left")
        lapses_at = (await ledger_rows(ledger, "SELECT lease_until FROM session_leases WHERE subject=%s"
                                       " AND server=%s", "alice", server))[0][0]
        procs["in1"].send_signal(signal.SIGKILL)
        killed_at = (await ledger_rows(ledger, "SELECT now()"))[0][0]  # just after the kill
        assert procs["in1"].wait(timeout=10) == -signal.SIGKILL
        assert (lapses_at - killed_at).total_seconds() >= NO_INGRESS, (killed_at, lapses_at)
        v2 = (await fx.edit(keys[0].uri, text="v2 while no ingress runs"))["committed"]["digest"]
        procs["in2"] = _spawn(config, "ingress", tmp_path / "in2.log")

        async def held() -> datetime | None:
            h = await ledger.sessions.lease_holder("alice", server)
            if h is None or int(h[0].split(":")[1]) != procs["in2"].pid:
                return None
            return (await ledger_rows(ledger, "SELECT now()"))[0][0]  # type: ignore[no-any-return]

        held_at = await eventually(held, timeout=60, interval=0.02, what="the new ingress holds the lease")

        async def reported() -> list[tuple[Any, ...]] | None:
            rows = await ledger_rows(ledger, "SELECT uri, detail, created_at FROM outbox WHERE uri = ANY(%s)"
                                     " AND event_type = %s", uris, OutboxEventType.OVERDUE.value)
            return rows if len({r[0] for r in rows}) == len(keys) else None

        overdue = await eventually(reported, timeout=60, what="an overdue event of every subscription")
        port = await eventually(lambda: _metrics_port(tmp_path / "main.log"), what="the main's metrics port")

        async def counted() -> float | None:
            text = await asyncio.to_thread(_scrape, f"http://127.0.0.1:{port}/metrics")
            found = _value(_samples(text), "mcpsync_verifications_overdue", server=server)
            return found if found == len(keys) else None

        await eventually(counted, timeout=10, interval=0.2, what="mcpsync_verifications_overdue")
        await asyncio.gather(*(_wait_record(h, lambda r, k=k: r.last_accepted_digest == (v2 if k == keys[0]
                                                                                        else v1[k.uri]),
                                            f"{k.uri} current") for h, k in zip(handles, keys, strict=True)))
        overdue = await reported()  # again, now that every run converged: no second report came
        assert overdue is not None
        # The first granted read after the lease changed hands: the verification that closed the gap.
        first = await ledger_rows(ledger, "SELECT s.uri, min(r.issued_at) FROM read_requests r"
                                  " JOIN subscriptions s USING (workflow_id) WHERE s.uri = ANY(%s)"
                                  " AND r.issued_at >= %s GROUP BY s.uri", uris, held_at)
        # Reported once each, none more: the outbox, the audit and the endpoint agree.
        assert sorted(r[0] for r in overdue) == sorted(uris), overdue
        assert all(r[1]["closed"] is True and r[1]["gap_seconds"] >= NO_INGRESS
                   and r[1]["period_seconds"] == KILL_PERIOD for r in overdue), overdue
        audit = await ledger_rows(ledger, "SELECT count(*) FROM audit WHERE server=%s AND kind=%s", server,
                                  "VERIFICATION_OVERDUE")
        assert audit[0][0] == len(keys) and await counted() == len(keys)
        reported_in = max((r[2] - held_at).total_seconds() for r in overdue)
        read_in = max((r[1] - held_at).total_seconds() for r in first)
        gaps = sorted(r[1]["gap_seconds"] for r in overdue)
        print(f"no ingress for {(held_at - killed_at).total_seconds():.2f} s: {len(keys)} gaps of "
              f"{gaps[0]:.1f}-{gaps[-1]:.1f} s reported within {reported_in:.2f} s and read within "
              f"{read_in:.2f} s of the new lease (window {RETURN_WINDOW:g} s)")
        assert len(first) == len(keys) and read_in <= RETURN_WINDOW and reported_in <= RETURN_WINDOW, \
            (read_in, reported_in)
        # Nothing accepted out of order: per subscription, the receipts that moved the watermark
        # (ACCEPTED, UNCHANGED) and the outbox (its consumers' watermark) in read-ordinal order, the
        # fence's watermark never back, v2 accepted once.
        for k in keys:
            receipts = await ledger_rows(ledger, "SELECT read_ordinal, status, content_digest FROM"
                                         " resource_versions WHERE uri=%s AND server=%s ORDER BY receipt_id",
                                         k.uri, server)
            advanced = [r[0] for r in receipts if r[1] in (AcceptVerdict.ACCEPTED.value,
                                                            AcceptVerdict.UNCHANGED.value)]
            assert advanced == sorted(set(advanced)), (k.uri, receipts)
            accepted = [r[2] for r in receipts if r[1] == AcceptVerdict.ACCEPTED.value]
            assert accepted == ([v1[k.uri], v2] if k == keys[0] else [v1[k.uri]]), (k.uri, receipts)
            outbox = [r[0] for r in await ledger_rows(ledger, "SELECT read_ordinal FROM outbox WHERE uri=%s"
                                                      " AND server=%s ORDER BY outbox_id", k.uri, server)]
            assert outbox == sorted(outbox), (k.uri, outbox)
            after = await ledger.fence.find_subscription(k.subject, k.server, k.uri)
            assert after is not None and before[k.uri] is not None
            assert after.watermark >= before[k.uri].watermark and after.watermark == advanced[-1]  # type: ignore[union-attr]
    finally:
        _stop(procs.values())
        if fx is not None:
            spare_fixtures.retire(fx)


async def _lease_left(ledger: Ledger, server: str, least: float, most: float) -> bool:
    """alice's lease of ``server`` runs out between ``least`` and ``most`` seconds from now (the
    database's clock)."""
    left = await ledger.sessions.lease_remaining("alice", server)
    return left is not None and least <= left <= most
