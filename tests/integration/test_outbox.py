"""The consumer outbox on real PostgreSQL: gap-free positions for any writer, durable consumers,
retention that respects them, the outboxEvent.v1 envelope (docs/outbox.md)."""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger import outbox as outbox_module
from mcpsync.activities.ledger.outbox import (
    NOTIFY_CHANNEL,
    ConsumerError,
    ConsumerNotFound,
    OutboxConsumer,
    OutboxEventType,
    OutboxEventV1,
    consumer_infos,
    events_after,
    stamp,
)
from mcpsync.activities.ledger.outbox import wait_for_events as outbox_wait_for_events
from mcpsync.activities.ledger.retention import prune
from mcpsync.worker.stack.common import REPO_ROOT
from mcpsync.workflows.records.mcp_calls import ReadOutcomeKind
from tests import cli_process
from tests.conftest import PrivateDatabase, eventually, ledger_rows, unique
from tests.integration.test_ledger import _accept, _active, _issue

INSERT = ("INSERT INTO outbox (event_type, workflow_id, subject, server, uri, content_digest)"
          " VALUES ('version_accepted', 'wf-plain-sql', %s, 'srv', %s, 'sha256:x') RETURNING outbox_id")


@pytest.fixture
async def consumers(ledger: Ledger) -> AsyncIterator[list[str]]:
    """Names registered by a test; dropped afterwards so other tests' retention is unaffected."""
    names: list[str] = []
    yield names
    await ledger_rows(ledger, "DELETE FROM outbox_consumers WHERE name = ANY(%s)", names)


async def register(ledger: Ledger, names: list[str], subject: str, name: str | None = None) -> OutboxConsumer:
    """A new consumer of ``subject``, past its start: a name registered after earlier tests pruned
    rows starts with a GAP (docs/outbox.md), which a resync (an empty relist here) closes."""
    name = name or unique("c")
    names.append(name)
    consumer = OutboxConsumer(ledger.pool, name, [subject], register=True)
    batch = await consumer.poll()
    if batch.gap is not None:
        relist = await consumer.resync()
        assert {e.subject for e in relist.events} <= {subject}
        await consumer.ack(relist.position)
    else:
        await consumer.ack(batch.position)
    return consumer


async def settled(ledger: Ledger, subject: str) -> None:
    """Wait until every committed row of ``subject`` has a position (an unrelated transaction still
    open elsewhere in the session's database delays positions, never skips them)."""

    async def positioned() -> bool:
        await stamp(ledger.pool)
        return not await ledger_rows(ledger, "SELECT 1 FROM outbox WHERE subject = %s AND position IS NULL",
                                     subject)

    await eventually(positioned, timeout=20, what=f"positions for {subject}")


async def _connect(url: str) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(url)  # a transaction per connection, committed by hand


async def _insert(conn: psycopg.AsyncConnection[Any], subject: str, uri: str) -> int:
    cur = await conn.execute(INSERT, (subject, uri))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _old_query(ledger: Ledger, subject: str, after_id: int) -> list[int]:
    """The query the outbox was paged by before migration 006 (LedgerReports.outbox_after): id > last."""
    rows = await ledger_rows(ledger, "SELECT outbox_id FROM outbox WHERE outbox_id > %s AND subject = %s"
                                     " ORDER BY outbox_id", after_id, subject)
    return [r[0] for r in rows]


async def _drain(consumer: OutboxConsumer) -> list[OutboxEventV1]:
    got: list[OutboxEventV1] = []
    while True:
        batch = await consumer.poll(limit=50)
        assert batch.gap is None
        got += batch.events
        await consumer.ack(batch.position)
        if not batch.events:
            return got


async def test_reverse_commit_skips_a_row_with_id_paging_and_not_with_positions(
        ledger: Ledger, database_url: str, consumers: list[str]) -> None:
    subject = unique("rev")
    consumer = await register(ledger, consumers, subject)  # registered before anything is written
    a, b = await _connect(database_url), await _connect(database_url)
    try:
        id_a = await _insert(a, subject, "demo://a")  # A takes the smaller id ...
        id_b = await _insert(b, subject, "demo://b")
        assert id_a < id_b
        await b.commit()  # ... B commits first
        old_seen = await _old_query(ledger, subject, 0)
        assert old_seen == [id_b]
        old_cursor = old_seen[-1]  # the old consumer moves its cursor past B
        batch = await consumer.poll()
        assert batch.events == [] and batch.position == batch.acked, \
            "B is not positioned while A may commit below it"
        await consumer.ack(batch.position)
        await a.commit()
    finally:
        await a.close()
        await b.close()
    assert await _old_query(ledger, subject, old_cursor) == [], "the old query skips A for good"
    await settled(ledger, subject)
    got = await _drain(consumer)
    assert sorted(e.outbox_id for e in got) == [id_a, id_b], "the new one delivers both"
    assert [e.position for e in got] == sorted(e.position for e in got)


async def test_id_order_with_a_txid_filter_alone_still_skips(ledger: Ledger, database_url: str,
                                                             consumers: list[str]) -> None:
    """docs/outbox.md: A holds the older txid but inserts later, so it holds the larger id."""
    subject = unique("txid")
    consumer = await register(ledger, consumers, subject)
    a, b = await _connect(database_url), await _connect(database_url)
    try:
        await a.execute("SELECT pg_current_xact_id()")  # A's transaction id is assigned first
        await b.execute("SELECT pg_current_xact_id()")
        id_b = await _insert(b, subject, "demo://b")  # B takes the smaller id
        id_a = await _insert(a, subject, "demo://a")
        await a.commit()
        filtered = await ledger_rows(
            ledger,
            "SELECT outbox_id FROM outbox WHERE subject = %s"
            " AND txid < pg_snapshot_xmin(pg_current_snapshot())"
                    " ORDER BY outbox_id", subject)
        assert [r[0] for r in filtered] == [id_a], \
            "A is finished and below the horizon: a cursor moves to its id"
        assert id_b < id_a
        await b.commit()
    finally:
        await a.close()
        await b.close()
    await settled(ledger, subject)
    got = await _drain(consumer)
    assert sorted(e.outbox_id for e in got) == sorted([id_a, id_b])


async def test_concurrent_plain_sql_writers_committing_out_of_order_lose_nothing(
        ledger: Ledger, database_url: str, consumers: list[str]) -> None:
    subject = unique("conc")
    consumer = await register(ledger, consumers, subject)
    committed: list[int] = []
    rng = random.Random(7)

    async def writer(n: int) -> None:
        conn = await _connect(database_url)
        try:
            for i in range(15):
                ids = [await _insert(conn, subject, f"demo://w{n}/{i}/{k}") for k in range(rng.randint(1, 3))]
                await asyncio.sleep(rng.random() * 0.03)  # commit order differs from id order
                if rng.random() < 0.15:
                    await conn.rollback()
                else:
                    await conn.commit()
                    committed.extend(ids)
        finally:
            await conn.close()

    seen: list[OutboxEventV1] = []
    writers = asyncio.gather(*(writer(n) for n in range(6)))
    while not writers.done():
        batch = await consumer.poll(limit=7)
        seen += batch.events
        await consumer.ack(batch.position)
        await asyncio.sleep(0.005)
    await writers
    await settled(ledger, subject)
    seen += await _drain(consumer)
    ids = [e.outbox_id for e in seen]
    assert sorted(ids) == sorted(committed) and len(ids) == len(set(ids)), \
        "every committed row exactly once here"
    positions = [e.position for e in seen]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)


async def test_consumer_semantics_and_bad_input(ledger: Ledger, database_url: str,
                                                consumers: list[str]) -> None:
    subject = unique("sem")
    name = unique("c")
    with pytest.raises(ConsumerNotFound):
        await OutboxConsumer(ledger.pool, name).ack(0)  # ack of an unknown name: nothing registered
    first = await register(ledger, consumers, subject, name)  # poll registers
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for i in range(3):
            await _insert(conn, subject, f"demo://sem/{i}")
    await settled(ledger, subject)
    second = OutboxConsumer(ledger.pool, name)  # the same name, filter as registered
    b1, b2 = await first.poll(limit=2), await second.poll(limit=2)
    assert [e.outbox_id for e in b1.events] == [e.outbox_id for e in b2.events] and len(b1.events) == 2
    with pytest.raises(ConsumerError, match="beyond what"):
        await first.ack(b1.position + 1_000_000)
    assert await first.ack(b1.position) == b1.position
    assert await second.ack(b1.position - 1) == b1.position, "ack is max(): an older ack never moves back"
    rest = await first.poll()
    assert [e.uri for e in rest.events] == ["demo://sem/2"]
    with pytest.raises(ConsumerError, match="registered for subjects"):
        await OutboxConsumer(ledger.pool, name, ["someone-else"]).poll()
    with pytest.raises(ConsumerError):
        await first.poll(limit=0)
    with pytest.raises(ConsumerError, match="invalid consumer name"):
        OutboxConsumer(ledger.pool, "bad name!")
    # The batch position a filtered consumer acks passes other subjects' rows too.
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        other = unique("other")
        await _insert(conn, other, "demo://other")
    await settled(ledger, other)
    await first.ack(rest.position)
    empty = await first.poll()
    assert empty.events == [] and empty.position > empty.acked
    # A position from another consumer, beyond what this one was delivered: refused, nothing moves.
    neighbour = await register(ledger, consumers, other)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await _insert(conn, other, "demo://other/2")
    await settled(ledger, other)
    theirs = await neighbour.poll()
    assert theirs.position > empty.position
    with pytest.raises(ConsumerError, match="beyond what"):
        await first.ack(theirs.position)
    assert (await consumer_infos(ledger.pool, first.name))[0].position == empty.acked


async def test_follow_wakes_on_notify_from_a_plain_sql_insert(ledger: Ledger, database_url: str,
                                                              consumers: list[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    subject = unique("follow")
    consumer = await register(ledger, consumers, subject)
    parked = asyncio.Event()  # witness: follow polled, found nothing and went to wait on LISTEN

    async def wait_for_events(listener: psycopg.AsyncConnection[Any], timeout: float) -> None:
        parked.set()
        await outbox_wait_for_events(listener, timeout)

    monkeypatch.setattr(outbox_module, "wait_for_events", wait_for_events)
    stream = consumer.follow(idle_timeout=60)  # a sleep loop would take a minute
    nxt = asyncio.ensure_future(stream.__anext__())
    await eventually(parked.is_set, timeout=10, interval=0.01, what="follow waiting on LISTEN")
    assert not nxt.done(), "an idle follow yields nothing"
    loop = asyncio.get_running_loop()
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        started = loop.time()
        outbox_id = await _insert(conn, subject, "demo://follow")
    batch = await asyncio.wait_for(nxt, 10)
    assert [e.outbox_id for e in batch.events] == [outbox_id] and loop.time() - started < 5
    await stream.aclose()


async def test_retention_keeps_unacknowledged_rows_then_reports_a_gap_and_resyncs(
        consumers: list[str], private_database: PrivateDatabase) -> None:
    # Whole-ledger assertions (retention, consumers): a database of its own.
    ledger = private_database.ledger
    key = await _active(ledger, uri="demo://outbox/retention")
    subject = key.subject
    consumer = await register(ledger, consumers, subject)
    await ledger.content.put_content(subject, "sha256:o1", "text/plain", b"one")
    await ledger.content.put_content(subject, "sha256:o2", "text/plain", b"two")
    assert await _accept(ledger, key, await _issue(ledger, key), "sha256:o1") == "ACCEPTED"
    await settled(ledger, subject)
    first = await consumer.poll()
    assert [e.content_digest for e in first.events] == ["sha256:o1"]
    assert await _accept(ledger, key, await _issue(ledger, key), "sha256:o2") == "ACCEPTED"
    await settled(ledger, subject)
    await ledger_rows(ledger, "UPDATE outbox SET created_at = now() - interval '30 days' WHERE subject = %s",
                      subject)
    await ledger_rows(ledger,
                      "UPDATE content_store SET stored_at = now() - interval '30 days' WHERE subject = %s",
                      subject)
    # Unacknowledged: kept, and so is the superseded body the unacknowledged event names. (Lag is
    # the age of the oldest unacknowledged row, 30 days here: within a 60-day bound.)
    await prune(ledger.pool, keep=timedelta(days=7), consumer_max_lag=timedelta(days=60))
    assert len(await ledger_rows(ledger, "SELECT 1 FROM outbox WHERE subject = %s", subject)) == 2
    assert len(await ledger_rows(ledger, "SELECT 1 FROM content_store WHERE subject = %s", subject)) == 2
    await consumer.ack(first.position)  # o1 consumed: its row and its superseded body may go
    await prune(ledger.pool, keep=timedelta(days=7), consumer_max_lag=timedelta(days=60))
    assert [r[0] for r in await ledger_rows(ledger, "SELECT content_digest FROM outbox WHERE subject = %s",
                                            subject)] == ["sha256:o2"]
    assert [r[0]
            for r in await ledger_rows(ledger, "SELECT content_digest FROM content_store WHERE subject = %s",
                                            subject)] == ["sha256:o2"]
    # The consumer lags past the bound (o2, unacknowledged, is 30 days old; the bound 1 day), however
    # recently it acked: its rows go and its next poll names the gap.
    await ledger_rows(ledger,
                      "UPDATE outbox_consumers SET created_at = now() - interval '40 days' WHERE name = %s",
                      consumer.name)
    await consumer.ack(first.position)  # a re-ack that does not move keeps nothing alive
    report = await prune(ledger.pool, keep=timedelta(days=7), consumer_max_lag=timedelta(days=1))
    assert consumer.name in report.consumers_ignored and report.outbox_rows >= 1
    gap = await consumer.poll()
    assert gap.gap is not None and gap.gap.first == first.position + 1 and gap.gap.last >= gap.gap.first
    assert gap.events == [] and (await consumer.poll()).gap == gap.gap, "the gap stays until resync"
    relist = await consumer.resync()
    assert [(e.event_type, e.uri, e.content_digest) for e in relist.events] == [
        (OutboxEventType.VERSION_CURRENT, key.uri, "sha256:o2")]
    await consumer.ack(relist.position)
    after = await consumer.poll()
    assert after.gap is None and after.events == []
    await ledger.content.put_content(subject, "sha256:o3", "text/plain", b"three")
    assert await _accept(ledger, key, await _issue(ledger, key), "sha256:o3") == "ACCEPTED"
    await settled(ledger, subject)
    live = await consumer.poll()
    assert [(e.content_digest, e.previous_digest) for e in live.events] == [("sha256:o3", "sha256:o2")]


async def test_a_tombstoned_event_names_every_receipt_and_digest_it_withdraws(
        ledger: Ledger, consumers: list[str]) -> None:
    key = await _active(ledger, uri="demo://outbox/tombstone")
    consumer = await register(ledger, consumers, key.subject)
    for digest in ("sha256:t1", "sha256:t2"):
        assert await _accept(ledger, key, await _issue(ledger, key), digest) == "ACCEPTED"
    gone = await _accept(ledger, key, await _issue(ledger, key), None, ReadOutcomeKind.NOT_FOUND)
    assert gone == "TOMBSTONE_PENDING"
    await ledger.confirm_tombstone(key, listed=False, scan_id="scan-gone")
    await settled(ledger, key.subject)
    tombs = [e for e in await _drain(consumer) if e.event_type == OutboxEventType.TOMBSTONED]
    assert len(tombs) == 1 and tombs[0].invalidates is not None and tombs[0].previous_digest == "sha256:t2"
    receipts = await ledger.reports.receipts(key)
    assert sorted(tombs[0].invalidates.receipt_ids) == sorted(r.receipt_id for r in receipts)
    assert tombs[0].invalidates.digests == ["sha256:t1", "sha256:t2"]


async def test_envelope_schema_in_the_doc_is_the_models() -> None:
    doc = (REPO_ROOT / "docs" / "outbox.md").read_text()
    m = re.search(r"<!-- outboxEvent.v1 schema -->\s*```json\n(.*?)```", doc, re.S)
    assert m, "docs/outbox.md carries the generated schema"
    assert json.loads(m.group(1)) == OutboxEventV1.model_json_schema()


def _cli(conf: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI against the config's database (the environment's URL would win over the file)."""
    return cli_process.run(["--config", str(conf), *args], env=cli_process.without_database_url(),
                           timeout=120)


async def test_outbox_commands(tmp_path: Path, ledger: Ledger, database_url: str,
                               consumers: list[str]) -> None:
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    subject = unique("cli")
    name = (await register(ledger, consumers, subject)).name
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for i in range(3):
            await _insert(conn, subject, f"demo://cli/{i}")
    await settled(ledger, subject)
    oldest = await events_after(ledger.pool, 0, 1)
    tail = _cli(conf, "outbox", "tail", "--after", "0", "--limit", "2", "--json")
    assert tail.returncode == 0, tail.stderr
    lines = [json.loads(line) for line in tail.stdout.splitlines()]
    assert lines[0]["position"] == oldest[0].position and lines[0]["position"] < lines[1]["position"], \
        "--after 0 starts at the oldest"
    bad = _cli(conf, "outbox", "tail", "--limit", "-1")
    assert bad.returncode == 2 and bad.stderr.startswith("mcpsync: error:") and "Traceback" not in bad.stderr
    polled = _cli(conf, "outbox", "poll", "--consumer", name, "--register", "--subject", subject, "--json")
    assert polled.returncode == 0, polled.stderr
    batch = json.loads(polled.stdout)
    assert [e["uri"] for e in batch["events"]] == [f"demo://cli/{i}" for i in range(3)]
    assert batch["events"][0]["record"] == "outboxEvent.v1"
    beyond = _cli(conf, "outbox", "ack", "--consumer", name, "--position", str(batch["position"] + 10**9))
    assert beyond.returncode == 2 and "beyond" in beyond.stderr
    unknown = _cli(conf, "outbox", "ack", "--consumer", unique("nobody"), "--position", "1")
    assert unknown.returncode == 4 and "no outbox consumer" in unknown.stderr
    acked = _cli(conf, "outbox", "ack", "--consumer", name, "--position", str(batch["position"]), "--json")
    assert acked.returncode == 0 and json.loads(acked.stdout)["position"] == batch["position"]
    listed = _cli(conf, "outbox", "consumers", "--json")
    mine = [c for c in json.loads(listed.stdout) if c["name"] == name]
    assert mine and mine[0]["position"] == batch["position"] and mine[0]["lag_events"] == 0
    assert mine[0]["subjects"] == [subject] and mine[0]["last_ack_at"] is not None
    dropped = _cli(conf, "outbox", "drop", "--consumer", name)
    assert dropped.returncode == 0
    assert _cli(conf, "outbox", "drop", "--consumer", name).returncode == 4


async def test_lag_gauges_follow_the_consumer(ledger: Ledger, database_url: str,
                                              consumers: list[str]) -> None:
    from prometheus_client import generate_latest

    from mcpsync.worker.observe.metrics import REGISTRY, refresh_outbox_lag

    subject = unique("lag")
    consumer = await register(ledger, consumers, subject)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        for i in range(4):
            await _insert(conn, subject, f"demo://lag/{i}")
    await ledger_rows(ledger,
                      "UPDATE outbox SET created_at = now() - interval '90 seconds' WHERE subject = %s",
                      subject)

    def gauge(name: str) -> float:
        text = generate_latest(REGISTRY).decode()
        m = re.search(rf'^{name}{{consumer="{re.escape(consumer.name)}"}} (\S+)$', text, re.M)
        assert m, f"{name} for {consumer.name}"
        return float(m.group(1))

    await refresh_outbox_lag(ledger)
    assert gauge("mcpsync_outbox_consumer_lag_events") == 4
    assert 85 <= gauge("mcpsync_outbox_consumer_lag_seconds") < 600
    await settled(ledger, subject)
    await _drain(consumer)
    await refresh_outbox_lag(ledger)
    assert (gauge("mcpsync_outbox_consumer_lag_events"),
            gauge("mcpsync_outbox_consumer_lag_seconds")) == (0, 0)


async def _following(ledger: Ledger, name: str, app: str, polled_before: datetime | None) -> bool:
    """A backend of application ``app`` sits idle on ``LISTEN mcpsync_outbox`` and consumer ``name``
    polled after ``polled_before``."""
    listening = await ledger_rows(
        ledger, "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND state = 'idle'"
        " AND query = %s", app, f"LISTEN {NOTIFY_CHANNEL}")
    polled = (await consumer_infos(ledger.pool, name))[0].last_poll_at
    return bool(listening) and polled is not None and (polled_before is None or polled > polled_before)


async def test_poll_follow_command_prints_each_batch_and_acks_it(tmp_path: Path, ledger: Ledger,
                                                                 database_url: str,
                                                                 consumers: list[str]) -> None:
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    subject = unique("pf")
    consumer = await register(ledger, consumers, subject)
    app = unique("pf-follow")
    env = cli_process.without_database_url() | {"PGAPPNAME": app}
    polled_before = (await consumer_infos(ledger.pool, consumer.name))[0].last_poll_at
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mcpsync.worker.cli", "--config", str(conf), "outbox", "poll", "--consumer",
        consumer.name, "--follow", "--json", cwd=REPO_ROOT, env=env, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        # Witness that it started and waits on LISTEN: its listening backend (tagged by PGAPPNAME) is
        # idle after the LISTEN, and it polled since (last_poll_at moved: follow LISTENs before polling).
        await eventually(lambda: _following(ledger, consumer.name, app, polled_before), timeout=30,
                         what="outbox poll --follow listening and past its first poll")
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            first = await _insert(conn, subject, "demo://pf/1")
        batch = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        assert [e["outbox_id"] for e in batch["events"]] == [first]
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            second = await _insert(conn, subject, "demo://pf/2")
        batch2 = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        assert [e["outbox_id"] for e in batch2["events"]] == [second]
        infos = await consumer_infos(ledger.pool, consumer.name)
        assert infos[0].position >= batch["position"], "each printed batch was acknowledged"
    finally:
        proc.kill()
        await proc.wait()


async def test_without_live_consumers_prune_goes_by_age_and_later_consumers_start_with_a_gap(
        consumers: list[str], private_database: PrivateDatabase) -> None:
    # Whole-ledger assertions (retention, consumers): a database of its own.
    ledger = private_database.ledger
    database_url = private_database.url
    subject = unique("nolive")
    assert not await ledger_rows(ledger, "SELECT 1 FROM outbox_consumers"), "nobody holds rows back"
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        # positions have begun before this test's row
        await _insert(conn, unique("earlier"), "demo://earlier")
    assert await stamp(ledger.pool) >= 1
    holder = await _connect(database_url)  # an open transaction with an xid holds positions back
    try:
        await holder.execute("SELECT pg_current_xact_id()")
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await _insert(conn, subject, "demo://nolive")
        await ledger_rows(ledger,
                          "UPDATE outbox SET created_at = now() - interval '30 days' WHERE subject = %s",
                          subject)
        report = await prune(ledger.pool, keep=timedelta(days=7))
        assert not await ledger_rows(ledger, "SELECT 1 FROM outbox WHERE subject = %s", subject), \
            "not yet positioned, but nobody is there to miss it"
        top = (await ledger_rows(ledger, "SELECT last_position FROM outbox_state"))[0][0]
        assert report.outbox_pruned_through == top
    finally:
        await holder.close()
    name = unique("late")
    consumers.append(name)
    batch = await OutboxConsumer(ledger.pool, name, [subject], register=True).poll()
    assert batch.gap is not None and batch.gap.first == 1 and batch.gap.last >= top
