"""Retention against real PostgreSQL: old, unneeded rows go; fences, receipts and servable bodies stay."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from contextlib import suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.retention import prune
from mcpsync.worker.main.config import Config, RetentionConfig, TemporalConfig
from mcpsync.worker.main.services import run_services
from mcpsync.workflows.records.subscription import CloseReceipt, SubscriptionState
from tests import cli_process
from tests.conftest import eventually, ledger_rows, unique
from tests.integration.test_ledger import _accept, _active, _issue

S = SubscriptionState
OLD = "now() - interval '30 days'"


async def _scan(ledger: Ledger, subject: str, label: str = "A") -> str:
    scan_id = f"scan-{uuid.uuid4().hex[:12]}"
    await ledger_rows(ledger,
                      "INSERT INTO discovery_scans (scan_id, reconciliation_id, label, subject, server,"
                      " session_generation, status, recorded_at)"
                      f" VALUES (%s, %s, %s, %s, 'srv', 1, 'COMPLETE', {OLD})",
                      scan_id, f"rec-{scan_id}", label, subject)
    return scan_id


async def test_prune_forgets_only_what_nothing_current_needs(private_ledger: Ledger) -> None:
    ledger = private_ledger  # prune's counts are of the whole ledger: nothing but this test's rows in it
    key = await _active(ledger, uri="demo://retention/active")
    closed = await _active(ledger, uri="demo://retention/closed")
    subject = key.subject
    for digest in ("sha256:r1", "sha256:r2", "sha256:r-stale"):
        await ledger.content.put_content(subject, digest, "text/plain", b"x" * 10)
    await ledger.content.put_content(closed.subject, "sha256:r-closed", "text/plain", b"y" * 10)
    o1, o2 = await _issue(ledger, key), await _issue(ledger, key)
    assert await _accept(ledger, key, o1, "sha256:r1") == "ACCEPTED"
    assert await _accept(ledger, key, o2, "sha256:r2") == "ACCEPTED"  # current: r2
    open_read = await _issue(ledger, key)  # allocated, never judged: must survive
    oc = await _issue(ledger, closed)
    assert await _accept(ledger, closed, oc, "sha256:r-closed") == "ACCEPTED"
    receipt: CloseReceipt = await ledger.begin_unsubscribe(closed)
    assert receipt.state == S.UNSUBSCRIBING
    await ledger.finish_unsubscribe(closed, True)
    await ledger.journal.audit("RETENTION_TEST", subject=subject, workflow_id=key.workflow_id)
    # A catalog built from two scans keeps them; a scan no catalog used goes.
    a, b, lone = await _scan(ledger, subject), await _scan(ledger, subject, "B"), await _scan(ledger, subject)
    await ledger_rows(ledger, """
        INSERT INTO resource_catalogs (subject, server, reconciliation_id, scan_a, scan_b, status,
            session_generation, window_started_at, measured_at, staleness_bound_seconds, next_review_at,
            uri_set_digest, descriptor_set_digest, template_set_digest, resource_count, template_count)
        VALUES (%s, 'srv', %s, %s, %s, 'SNAPSHOT_UNPROVEN', 1, now(), now(), 60, now(),
            'u', 'd', 't', 0, 0)""",
                subject, f"rec-cat-{a}", a, b)
    # Age everything of these two subscriptions (other tests' rows stay young and untouched).
    wfs = [key.workflow_id, closed.workflow_id]
    subjects = [key.subject, closed.subject]
    await ledger_rows(ledger, f"UPDATE content_store SET stored_at = {OLD} WHERE subject = ANY(%s)", subjects)
    await ledger_rows(ledger, f"UPDATE audit SET created_at = {OLD} WHERE workflow_id = ANY(%s)", wfs)
    await ledger_rows(ledger, f"UPDATE outbox SET created_at = {OLD} WHERE workflow_id = ANY(%s)", wfs)
    await ledger_rows(ledger, f"UPDATE read_requests SET completed_at = {OLD} WHERE workflow_id = ANY(%s)"
                        " AND completed_at IS NOT NULL", wfs)
    outbox_before = len(await ledger_rows(ledger, "SELECT 1 FROM outbox WHERE workflow_id = ANY(%s)", wfs))
    audit_before = len(await ledger_rows(ledger, "SELECT 1 FROM audit WHERE workflow_id = ANY(%s)", wfs))
    assert outbox_before >= 3 and audit_before >= 1

    dry = await prune(ledger.pool, keep=timedelta(days=7), dry_run=True)
    assert (dry.content_bodies, dry.content_bytes, dry.read_requests, dry.discovery_scans) == (3, 30, 3, 1)
    assert (dry.outbox_rows, dry.audit_rows) == (outbox_before, audit_before)
    assert len(await ledger_rows(ledger, "SELECT 1 FROM content_store WHERE subject = ANY(%s)",
                                 subjects)) == 4

    done = await prune(ledger.pool, keep=timedelta(days=7))
    assert done.model_dump(exclude={"dry_run"}) == dry.model_dump(exclude={"dry_run"}) and not done.dry_run
    bodies = {r[0]
              for r in await ledger_rows(ledger,
                                         "SELECT content_digest FROM content_store WHERE subject = ANY(%s)",
                                        subjects)}
    assert bodies == {"sha256:r2"}, "only the current version of an ACTIVE subscription is kept"
    assert (await ledger.content.current_content(key)) is not None
    assert [r[0] for r in await ledger_rows(ledger, "SELECT ordinal FROM read_requests WHERE workflow_id=%s",
                                      key.workflow_id)] == [open_read]
    receipts = await ledger_rows(ledger, "SELECT count(*) FROM resource_versions WHERE workflow_id = ANY(%s)",
                                 wfs)
    assert receipts[0][0] == 3, "ACCEPTED receipts introduced versions: never pruned"
    fence = await ledger.load_fence(key)
    assert (fence.state, fence.last_accepted_digest, fence.last_issued_ordinal) == (S.ACTIVE, "sha256:r2", 3)
    scans = {r[0]
             for r in await ledger_rows(ledger, "SELECT scan_id FROM discovery_scans WHERE scan_id = ANY(%s)",
                                       [a, b, lone])}
    assert scans == {a, b}
    # The fence still works after pruning: a new read is allocated past everything before.
    assert await _issue(ledger, key) == 4
    again = await prune(ledger.pool, keep=timedelta(days=7))
    assert (again.content_bodies, again.read_requests, again.discovery_scans) == (0, 0, 0)
    # A body read again (the resource went back to an old version) is young again, so it cannot
    # be pruned between its read and its acceptance.
    await ledger.content.put_content(closed.subject, "sha256:back", "text/plain", b"z")
    await ledger_rows(ledger, f"UPDATE content_store SET stored_at = {OLD} WHERE subject=%s", closed.subject)
    await ledger.content.put_content(closed.subject, "sha256:back", "text/plain", b"z")
    assert (await prune(ledger.pool, keep=timedelta(days=7), dry_run=True)).content_bodies == 0


async def test_prune_command(tmp_path: Path, database_url: str) -> None:
    conf = tmp_path / "mcpsync.toml"
    conf.write_text(f'[database]\nurl = "{database_url}"\n')

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli_process.run(["--config", str(conf), "prune", *args], timeout=120)

    dry = cli("--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert report["dry_run"] is True and report["keep_seconds"] == 7 * 86400
    assert set(report) >= {"content_bodies", "audit_rows", "outbox_rows", "read_requests", "discovery_scans",
                           "verification_receipts"}
    bad = cli("--keep-days", "-1")
    assert bad.returncode == 2 and "must not be negative" in bad.stderr and "Traceback" not in bad.stderr


async def test_the_worker_prunes_on_its_retention_interval(ledger: Ledger, temporal_client: Any) -> None:
    key = await _active(ledger, uri="demo://retention/periodic")
    await ledger.journal.audit("RETENTION_PERIODIC", subject=key.subject, workflow_id=key.workflow_id)
    await ledger_rows(ledger, f"UPDATE audit SET created_at = {OLD} WHERE workflow_id=%s", key.workflow_id)
    config = Config(temporal=TemporalConfig(task_queue=unique("retention")),
                    retention=RetentionConfig(keep_days=7, interval_seconds=0.3))
    task = asyncio.create_task(run_services(config, temporal_client, ledger, with_main_worker=True))
    try:
        await eventually(lambda: _gone(ledger, key.workflow_id), timeout=20, what="old audit row pruned")
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


async def _gone(ledger: Ledger, workflow_id: str) -> bool:
    return not await ledger_rows(ledger, "SELECT 1 FROM audit WHERE workflow_id=%s", workflow_id)
