"""Consumers on the real stack (Temporal, PostgreSQL, the fixture MCP server): the envelope
as mcpsync fills it, content access and its refusals, and the reference indexer converging
under churn, two SIGKILLs, a prune and a revocation (docs/outbox.md)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import random
import signal
import sqlite3
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.outbox import OutboxConsumer, OutboxEventType, OutboxEventV1
from mcpsync.activities.ledger.released import ContentKind, ContentNotFound, ContentRefused, released_content
from mcpsync.activities.ledger.retention import prune
from mcpsync.activities.starters import start_subscription
from mcpsync.activities.workflow_updates import execute_update
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.main.revocation import revoke
from mcpsync.worker.stack.common import REPO_ROOT
from mcpsync.workflows.names import UPDATE_CLOSE
from mcpsync.workflows.records.subscription import (
    CloseReceipt,
    CloseRequest,
    SubscriptionKey,
    SubscriptionState,
)
from tests import cli_process
from tests.conftest import PrivateDatabase, eventually, ledger_rows, running_services, unique
from tests.e2e.test_e2e_subscription import _wait_record
from tests.integration.test_outbox import register, settled

PNG = b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary \x00"
_cli = cli_process.run_config  # mcpsync --config FILE ..., against the file's database, in bytes


async def _drain(consumer: OutboxConsumer) -> list[OutboxEventV1]:
    got: list[OutboxEventV1] = []
    while True:
        batch = await consumer.poll()
        got += batch.events
        await consumer.ack(batch.position)
        if not batch.events:
            return got


async def test_envelope_and_content_access_on_the_real_stack(
        temporal_client: Client, fx: FixtureProcess, tmp_path: Path,
        private_database: PrivateDatabase) -> None:
    # Whole-ledger assertions (retention, consumers): a database of its own.
    ledger = private_database.ledger
    database_url = private_database.url
    alice, bob = unique("alice"), unique("bob")
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=[alice, bob],
                          release_max_bytes=2000)
    text_uri, blob_uri = f"demo://consumers/{unique('t')}.md", f"demo://consumers/{unique('b')}.png"
    t1 = await fx.create(text_uri, text="# version one", mime_type="text/markdown")
    b1 = await fx.create(blob_uri, blob=PNG, mime_type="image/png")
    consumer = await register(ledger, [], alice)
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    try:
        async with running_services(temporal_client, ledger, [server]) as cfg:
            q = cfg.temporal.task_queue
            kt = SubscriptionKey(subject=alice, server=server.name, uri=text_uri)
            kb = SubscriptionKey(subject=alice, server=server.name, uri=blob_uri)
            ht, hb = await start_subscription(temporal_client, kt, task_queue=q), \
                await start_subscription(temporal_client, kb, task_queue=q)
            await _wait_record(ht, lambda r: r.last_accepted_digest == t1["committed"]["digest"], "text v1")
            await _wait_record(hb, lambda r: r.last_accepted_digest == b1["committed"]["digest"], "blob v1")
            await fx.wait_subscribed(text_uri)
            t2 = await fx.edit(text_uri, text="# version two", mime_type="text/markdown")
            await _wait_record(ht, lambda r: r.last_accepted_digest == t2["committed"]["digest"], "text v2")
            huge = await fx.edit(text_uri, text="x" * 5000, mime_type="text/markdown")
            await _wait_record(ht, lambda r: "guardrail" in r.detail, "guardrail rejection")

            await settled(ledger, alice)
            events = await _drain(consumer)
            by_digest = {e.content_digest: e for e in events}
            assert set(by_digest) == {t1["committed"]["digest"], t2["committed"]["digest"],
                                      b1["committed"]["digest"]}
            e2 = by_digest[t2["committed"]["digest"]]
            assert e2.event_type == OutboxEventType.VERSION_ACCEPTED \
                and e2.previous_digest == t1["committed"]["digest"]
            assert (e2.mime_type, e2.size, e2.edition) == ("text/markdown", len(b"# version two"),
                                                           "2025-11-25")
            assert e2.server_name and e2.accepted_at is not None and e2.trigger in ("updated", "follow_up")
            assert e2.receipt_id is not None and e2.read_ordinal and e2.subject == alice

            # Content: exactly as read, for the subject it was read for.
            text = await released_content(ledger.pool, receipt_id=e2.receipt_id, subject=alice)
            assert (text.body, text.mime_type,
                    text.kind) == (b"# version two", "text/markdown", ContentKind.TEXT)
            assert "version two" not in repr(text), "the body stays out of reprs (and so out of logs)"
            eb = by_digest[b1["committed"]["digest"]]
            assert eb.receipt_id is not None
            blob = await released_content(ledger.pool, receipt_id=eb.receipt_id, subject=alice)
            assert (blob.body, blob.kind) == (PNG, ContentKind.BLOB)
            with pytest.raises(ContentRefused, match="does not belong"):
                await released_content(ledger.pool, receipt_id=e2.receipt_id, subject=bob)
            rejected = [r for r in await ledger.reports.receipts(kt)
                        if r.content_digest == huge["committed"]["digest"]]
            assert rejected and rejected[0].status == "GUARDRAIL_REJECTED"
            with pytest.raises(ContentRefused, match="guardrail"):
                await released_content(ledger.pool, receipt_id=rejected[0].receipt_id, subject=alice)
            with pytest.raises(ContentNotFound):
                await released_content(ledger.pool, receipt_id=10**12, subject=alice)

            # The CLI: text to stdout, binary to a file or a pipe, refusals exit 5, unknown 4.
            out = _cli(conf, "content", "get", "--receipt", str(e2.receipt_id), "--subject", alice)
            assert out.returncode == 0 and out.stdout == b"# version two", out.stderr
            piped = _cli(conf, "content", "get", "--receipt", str(eb.receipt_id), "--subject", alice)
            assert piped.returncode == 0 and piped.stdout == PNG
            target = tmp_path / "blob.png"
            to_file = _cli(conf, "content", "get", "--receipt", str(eb.receipt_id), "--subject", alice,
                           "-o", str(target))
            assert to_file.returncode == 0 and target.read_bytes() == PNG
            leader, follower = pty.openpty()  # stdout is a terminal: binary is refused there
            try:
                tty = _cli(conf, "content", "get", "--receipt", str(eb.receipt_id), "--subject", alice,
                           stdout=follower)
            finally:
                os.close(follower)
                os.close(leader)
            assert tty.returncode == 2 and b"binary" in tty.stderr
            other = _cli(conf, "content", "get", "--receipt", str(e2.receipt_id), "--subject", bob)
            assert other.returncode == 5 and other.stderr.startswith(b"mcpsync: error:")
            guard = _cli(conf, "content", "get", "--receipt", str(rejected[0].receipt_id), "--subject", alice)
            assert guard.returncode == 5 and b"guardrail" in guard.stderr
            assert _cli(conf, "content", "get", "--receipt", "999999999", "--subject", alice).returncode == 4

            # A superseded body, pruned once every consumer acknowledged it: not found (4).
            e1 = by_digest[t1["committed"]["digest"]]
            assert e1.receipt_id is not None
            await ledger_rows(ledger, "UPDATE content_store SET stored_at = now() - interval '30 days'"
                                      " WHERE subject = %s", alice)
            await prune(ledger.pool, keep=timedelta(days=7))
            with pytest.raises(ContentNotFound, match="pruned"):
                await released_content(ledger.pool, receipt_id=e1.receipt_id, subject=alice)
            assert _cli(conf, "content", "get", "--receipt", str(e1.receipt_id), "--subject",
                        alice).returncode == 4

            # Revocation: the event names what it withdraws; the body is refused from then on.
            await revoke(temporal_client, ledger, subject=alice, server=server.name, uri=text_uri,
                         reason="test")
            revoked = await eventually(lambda: _revoked(consumer), what="revoked event")
            receipts = await ledger.reports.receipts(kt)
            assert revoked.invalidates is not None
            assert set(revoked.invalidates.receipt_ids) == {r.receipt_id for r in receipts}
            assert t2["committed"]["digest"] in revoked.invalidates.digests
            assert revoked.previous_digest == t2["committed"]["digest"]
            with pytest.raises(ContentRefused, match="revoked"):
                await released_content(ledger.pool, receipt_id=e2.receipt_id, subject=alice)
            assert _cli(conf, "content", "get", "--receipt", str(e2.receipt_id), "--subject",
                        alice).returncode == 5
    finally:
        await ledger_rows(ledger, "DELETE FROM outbox_consumers WHERE name = %s", consumer.name)


async def _revoked(consumer: OutboxConsumer) -> OutboxEventV1 | None:
    for e in await _drain(consumer):
        if e.event_type == OutboxEventType.REVOKED:
            return e
    return None


# --- the reference indexer under churn, SIGKILL, prune and revocation ----------------------------

N_SUBSCRIPTIONS = int(os.environ.get("MCPSYNC_TEST_INDEXER_SUBSCRIPTIONS", "50"))


def _indexer(database_url: str, name: str, index: Path, subjects: list[str]) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "examples.indexer", "--database-url", database_url, "--consumer", name,
            "--index", str(index), "--batch", "7"]
    for s in subjects:
        args += ["--subject", s]
    return subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _index(index: Path) -> dict[tuple[str, str], tuple[str, bytes]]:
    db = sqlite3.connect(index)
    try:
        return {(r[0], r[1]): (r[2], r[3])
                for r in db.execute("SELECT subject, uri, digest, body FROM entries")}
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()


def _delivered(index: Path) -> set[int]:
    db = sqlite3.connect(index)
    try:
        return {r[0] for r in db.execute("SELECT outbox_id FROM deliveries WHERE outbox_id IS NOT NULL")}
    finally:
        db.close()


async def test_reference_indexer_converges_through_kills_prune_and_revocation(
        temporal_client: Client, fx: FixtureProcess, tmp_path: Path,
        private_database: PrivateDatabase) -> None:
    # Whole-ledger assertions (retention, consumers): a database of its own.
    ledger = private_database.ledger
    database_url = private_database.url
    alice, bob = unique("ialice"), unique("ibob")
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=[alice, bob])
    rng = random.Random(11)
    n_bob = max(1, N_SUBSCRIPTIONS // 5)
    uris = [f"demo://indexer/{i}/{unique('r')}" for i in range(N_SUBSCRIPTIONS)]
    owners = {uri: (bob if i < n_bob else alice) for i, uri in enumerate(uris)}
    committed: dict[str, tuple[str, bytes]] = {}
    for i, uri in enumerate(uris):
        text = f"v0 of {i}"
        committed[uri] = ((await fx.create(uri, text=text))["committed"]["digest"], text.encode())
    name, index = unique("indexer"), tmp_path / "index.sqlite"
    proc = _indexer(database_url, name, index, [alice, bob])
    kills = 0
    try:
        async with running_services(temporal_client, ledger, [server]) as cfg:
            handles = {}
            for uri in uris:
                key = SubscriptionKey(subject=owners[uri], server=server.name, uri=uri)
                handles[uri] = await start_subscription(temporal_client, key,
                                                        task_queue=cfg.temporal.task_queue)
            for uri in uris:
                await fx.wait_subscribed(uri, timeout=60)
            ids_before_prune: set[int] = set()
            for step in range(3 * N_SUBSCRIPTIONS):
                uri = rng.choice(uris)
                text = f"v{step + 1} of {uri}"
                committed[uri] = ((await fx.edit(uri, text=text))["committed"]["digest"], text.encode())
                await asyncio.sleep(rng.random() * 0.05)
                if step in (N_SUBSCRIPTIONS // 2, 2 * N_SUBSCRIPTIONS):  # SIGKILL mid-stream, restart
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(timeout=10)
                    kills += 1
                    proc = _indexer(database_url, name, index, [alice, bob])
                if step == N_SUBSCRIPTIONS:  # prune while consuming: only acknowledged rows may go
                    ids_before_prune = {r[0] for r in await ledger_rows(
                        ledger, "SELECT outbox_id FROM outbox WHERE subject = ANY(%s)", [alice, bob])}
                    # Older than retention's 7 days, younger than the lag limit (30 days): the indexer
                    # is a live consumer whose acknowledged rows go and whose unacknowledged rows stay.
                    await ledger_rows(ledger, "UPDATE outbox SET created_at = now() - interval '8 days'"
                                              " WHERE subject = ANY(%s)", [alice, bob])
                    report = await prune(ledger.pool, keep=timedelta(days=7))
                    assert report.outbox_rows > 0, "the indexer had acknowledged some rows: they go"
                    kept = {r[0] for r in await ledger_rows(
                        ledger, "SELECT outbox_id FROM outbox WHERE subject = ANY(%s)", [alice, bob])}
                    assert (ids_before_prune - kept) <= _delivered(index), "only delivered rows were pruned"
                if step == 2 * N_SUBSCRIPTIONS + 5:  # bob loses access to everything
                    await eventually(lambda: any(s == bob for s, _ in _index(index)), what="bob indexed")
                    await revoke(temporal_client, ledger, subject=bob, server=server.name, uri=None,
                                 reason="test")
            expected = {(alice, uri): committed[uri] for uri in uris if owners[uri] == alice}

            def converged() -> bool:
                return _index(index) == expected

            await eventually(converged, timeout=120, interval=0.5,
                             what="the index equals the fixture's state")
        assert kills == 2 and proc.poll() is None, "the indexer survived to the end"
        delivered = _delivered(index)
        now_ids = {r[0]
                   for r in await ledger_rows(ledger, "SELECT outbox_id FROM outbox WHERE subject = ANY(%s)",
                                                   [alice, bob])}
        assert (ids_before_prune | now_ids) <= delivered, "no position skipped, none pruned unseen"
        assert not any(subject == bob for subject, _ in _index(index)), \
            "the revoked subject's bodies are gone"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        await ledger_rows(ledger, "DELETE FROM outbox_consumers WHERE name = %s", name)


# --- a subscription that stops being tracked: the ``closed`` event -----------------------------


def _indexer_from_config(conf: Path, name: str, index: Path, subject: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "examples.indexer", "--config", str(conf), "--consumer",
                             name, "--index", str(index), "--subject", subject], cwd=REPO_ROOT,
                            env=cli_process.without_database_url(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


async def test_a_closed_subscription_is_an_event_in_the_outbox_the_relist_and_the_indexer(
        temporal_client: Client, ledger: Ledger, fx: FixtureProcess, database_url: str,
        tmp_path: Path) -> None:
    alice = unique("calice")
    server = ServerConfig(name=unique("fx"), transport="http", url=fx.mcp_url, subjects=[alice])
    kept, closed = f"demo://closing/{unique('kept')}", f"demo://closing/{unique('closed')}"
    first = {uri: await fx.create(uri, text=f"{uri} v1") for uri in (kept, closed)}
    consumer = await register(ledger, [], alice)
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')
    name, index = unique("cindexer"), tmp_path / "index.sqlite"
    # The indexer finds the database through the config (no --database-url) and says what it does.
    proc = _indexer_from_config(conf, name, index, alice)
    try:
        async with running_services(temporal_client, ledger, [server]) as cfg:
            keys = {uri: SubscriptionKey(subject=alice, server=server.name, uri=uri)
                    for uri in (kept, closed)}
            handles = {uri: await start_subscription(temporal_client, k, task_queue=cfg.temporal.task_queue)
                       for uri, k in keys.items()}
            for uri, h in handles.items():
                await _wait_record(h,
                                   lambda r, u=uri: r.last_accepted_digest == first[u]["committed"]["digest"],
                                   uri)
            await eventually(lambda: set(_index(index)) == {(alice, kept), (alice, closed)}, timeout=30,
                             what="both indexed")

            receipt = await execute_update(handles[closed], UPDATE_CLOSE, [CloseRequest(reason="test")],
                                                 result_type=CloseReceipt)
            assert receipt.state == SubscriptionState.CLOSED
            await settled(ledger, alice)
            events = [e for e in await _drain(consumer) if e.uri == closed]
            assert [e.event_type for e in events] == [OutboxEventType.VERSION_ACCEPTED,
                                                      OutboxEventType.CLOSED]
            gone = events[-1]
            assert gone.invalidates is not None and gone.reason and "no longer tracked" in gone.reason
            assert gone.invalidates.receipt_ids == [
                r.receipt_id for r in await ledger.reports.receipts(keys[closed])]
            assert gone.invalidates.digests == [first[closed]["committed"]["digest"]]
            assert gone.previous_digest == first[closed]["committed"]["digest"] and gone.read_ordinal == 1

            # The reference indexer drops it; the relist names it closed, the other one current.
            await eventually(lambda: set(_index(index)) == {(alice, kept)}, timeout=30,
                             what="closed one dropped")
            relist = _cli(conf, "outbox", "resync", "--consumer", consumer.name, "--json")
            assert relist.returncode == 0, relist.stderr
            items = {e["uri"]: e for e in json.loads(relist.stdout)["events"]}
            assert items[kept]["event_type"] == "version_current"
            assert items[closed]["event_type"] == "closed"
            assert items[closed]["invalidates"]["digests"] == [first[closed]["committed"]["digest"]]

            # Subscribing the key again: a new incarnation, higher read ordinals, indexed again.
            again = await start_subscription(temporal_client, keys[closed],
                                             task_queue=cfg.temporal.task_queue)
            await _wait_record(again, lambda r: r.state == SubscriptionState.ACTIVE
                                   and r.last_receipt_id is not None,
                               "reopened")
            await eventually(lambda: set(_index(index)) == {(alice, kept), (alice, closed)}, timeout=30,
                             what="reopened one indexed again")
        assert proc.poll() is None, "the indexer kept running"
        proc.send_signal(signal.SIGINT)  # Ctrl-C: a clean stop, no traceback
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and b"Traceback" not in err and err == b"", err
        lines = out.decode().splitlines()
        assert lines[0] == f"indexer {name}: following the outbox into {index}"
        assert any(" 1 dropped; " in line for line in lines), lines  # a progress line per batch
        assert lines[-1].startswith(f"indexer {name}: stopped; last acknowledged position "), lines[-1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        await ledger_rows(ledger, "DELETE FROM outbox_consumers WHERE name = ANY(%s)", [name, consumer.name])


def test_indexer_unreachable_database_is_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "examples.indexer", "--database-url",
                        "postgresql://u@127.0.0.1:1/x", "--consumer", "c", "--index",
                        str(tmp_path / "i.sqlite")], cwd=REPO_ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 6 and "Traceback" not in r.stderr
    [line] = r.stderr.splitlines()
    assert line.startswith("indexer: error: PostgreSQL unreachable at postgresql://u@127.0.0.1:1/x")
