"""Retention of verification receipts on real PostgreSQL: ``prune`` forgets old UNCHANGED receipts a
newer verification of the same bytes superseded and nothing points at; every reader of receipts
answers as before (activities/ledger/retention.py, docs/decisions/0008-receipt-retention.md)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.answers import AnswerLedger
from mcpsync.activities.ledger.metrics import read_snapshot
from mcpsync.activities.ledger.proven import proven_of
from mcpsync.activities.ledger.retention import prune
from mcpsync.activities.ledger.serve import list_served, served_resource
from mcpsync.activities.ledger.subscription_views import list_subscriptions
from mcpsync.workflows.answer_rules import AnswerDependency, ObserveRequest
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import SubscriptionKey
from tests.conftest import ledger_rows
from tests.integration.test_ledger import _accept, _active, _issue

V = AcceptVerdict
KEEP = timedelta(days=7)


async def _read(ledger: Ledger, key: SubscriptionKey, digest: str, verdict: AcceptVerdict) -> int:
    """One judged read of ``digest``; its receipt id."""
    ordinal = await _issue(ledger, key)
    assert await _accept(ledger, key, ordinal, digest) == verdict
    rows = await ledger_rows(ledger, "SELECT receipt_id FROM resource_versions WHERE workflow_id=%s"
                             " AND read_ordinal=%s", key.workflow_id, ordinal)
    return int(rows[0][0])


async def _age(ledger: Ledger, key: SubscriptionKey) -> None:
    """Every receipt of ``key`` 30 days older, in the same order."""
    await ledger_rows(ledger, "UPDATE resource_versions SET accepted_at = accepted_at - interval '30 days'"
                      " WHERE workflow_id=%s", key.workflow_id)


async def _receipts(ledger: Ledger, key: SubscriptionKey) -> list[int]:
    rows = await ledger_rows(ledger, "SELECT receipt_id FROM resource_versions WHERE workflow_id=%s"
                             " ORDER BY receipt_id", key.workflow_id)
    return [int(r[0]) for r in rows]


async def _select(ledger: Ledger, key: SubscriptionKey, receipt_id: int) -> None:
    """An answer bound to ``receipt_id`` (the bind's own selection row, as ``AnswerLedger.bind`` writes)."""
    answer = f"ans-{uuid.uuid4().hex[:8]}"
    await ledger_rows(ledger, "INSERT INTO answer_bindings (answer_id, revision, request_id, workflow_id,"
                      " question, dependencies) VALUES (%s, 1, %s, 'wf-answer', 'q', '[]')", answer, answer)
    await ledger_rows(ledger, "INSERT INTO answer_selections (answer_id, revision, request_id, subject,"
                      " server, uri, receipt_id, source) VALUES (%s, 1, %s, %s, %s, %s, %s, 'bound')",
                      answer, answer, key.subject, key.server, key.uri, receipt_id)


async def _said(ledger: Ledger, key: SubscriptionKey, bound: int) -> dict[str, Any]:
    """What every reader of receipts answers about ``key`` (an answer bound to receipt ``bound``)."""
    dep = AnswerDependency(subject=key.subject, server=key.server, uri=key.uri, receipt_id=bound)
    answers = AnswerLedger(ledger.pool)
    observed = await answers.observe(ObserveRequest(dependencies=[dep], selections={}))
    _, listing = await list_served(ledger.pool, key.subject)
    snap, _ = await read_snapshot(ledger.pool, 0)
    withdrawn = await ledger_rows(ledger, "SELECT DISTINCT content_digest FROM resource_versions"
                                  " WHERE workflow_id=%s ORDER BY 1", key.workflow_id)
    return {
        "proven": await proven_of(ledger.pool, key.subject, key.server, key.uri),  # freshness
        "served": await served_resource(ledger.pool, key.subject, key.uri),  # serve's read
        "listed": [r for r in listing if r.uri == key.uri],  # serve's listing
        "rows": await list_subscriptions(ledger.pool, subject=key.subject, server=key.server, uri=key.uri),
        "current": await ledger.content.current_content(key),  # the body serve and `content` release
        "gate": observed.dependencies,  # the answer gate's observation
        "latest": await answers.latest_receipts(key.subject, key.server, [key.uri]),
        "fence": await ledger.load_fence(key),
        "digests": withdrawn,  # what a withdrawal names and a revocation purges
        "metrics": ({k: n for k, n in snap.receipts.items() if k[1] != V.UNCHANGED.value},
                    {k: (f.subscriptions, f.past_bound) for k, f in snap.freshness.items()}),
    }


async def test_prune_forgets_superseded_verifications_and_keeps_what_readers_need(
    private_ledger: Ledger,
) -> None:
    ledger = private_ledger  # prune's counts are of the whole ledger
    key = await _active(ledger, uri="demo://receipts/busy")
    for digest in ("sha256:d1", "sha256:d2"):
        await ledger.content.put_content(key.subject, digest, "text/plain", b"body")
    a1 = await _read(ledger, key, "sha256:d1", V.ACCEPTED)
    u_d1 = [await _read(ledger, key, "sha256:d1", V.UNCHANGED) for _ in range(5)]
    a2 = await _read(ledger, key, "sha256:d2", V.ACCEPTED)
    u_d2 = [await _read(ledger, key, "sha256:d2", V.UNCHANGED) for _ in range(3)]
    await ledger_rows(ledger, "INSERT INTO outbox (event_type, workflow_id, subject, server, uri, receipt_id)"
                      " VALUES ('overdue', %s, %s, %s, %s, %s)",
                      key.workflow_id, key.subject, key.server, key.uri, u_d1[1])
    await _select(ledger, key, u_d1[2])
    await _age(ledger, key)
    young = await _read(ledger, key, "sha256:d2", V.UNCHANGED)  # the newest, named by the fence row
    # Idle since its last read: its newest receipt is old too and stays (the fence row names it).
    idle = await _active(ledger, uri="demo://receipts/idle")
    i1 = await _read(ledger, idle, "sha256:i", V.ACCEPTED)
    u_idle = [await _read(ledger, idle, "sha256:i", V.UNCHANGED) for _ in range(4)]
    await _age(ledger, idle)
    # Closed: the `closed` outbox row lists every receipt of it; they stay while that row is held.
    closed = await _active(ledger, uri="demo://receipts/closed")
    await _read(ledger, closed, "sha256:c", V.ACCEPTED)
    for _ in range(3):
        await _read(ledger, closed, "sha256:c", V.UNCHANGED)
    await ledger.begin_unsubscribe(closed)
    await _age(ledger, closed)
    closed_receipts = await _receipts(ledger, closed)
    before = {k: await _said(ledger, k, b) for k, b in ((key, a2), (idle, u_idle[-1]))}
    everything = {k.uri: await _receipts(ledger, k) for k in (key, idle)}

    dry = await prune(ledger.pool, keep=KEEP, dry_run=True)
    assert {k.uri: await _receipts(ledger, k) for k in (key, idle)} == everything, "a dry run deletes nothing"
    done = await prune(ledger.pool, keep=KEEP)
    gone_busy = {u_d1[0], u_d1[3], *u_d2}  # u_d1[1]: outbox; u_d1[2]: answer; u_d1[4]: d1's newest
    assert await _receipts(ledger, key) == sorted({a1, *u_d1, a2, *u_d2, young} - gone_busy)
    assert await _receipts(ledger, idle) == [i1, u_idle[-1]], "the version and the newest verification stay"
    assert await _receipts(ledger, closed) == closed_receipts
    counted = (dry.model_dump().get("verification_receipts"), done.model_dump().get("verification_receipts"))
    assert counted == (8, 8) and not done.dry_run
    after = {k: await _said(ledger, k, b) for k, b in ((key, a2), (idle, u_idle[-1]))}
    for k in before:
        assert after[k] == before[k], f"{k.uri}: a reader answers otherwise after the prune"
    assert (await prune(ledger.pool, keep=KEEP)).verification_receipts == 0
    # The fence still works: the next read of the same bytes is UNCHANGED, of new bytes ACCEPTED.
    await _read(ledger, idle, "sha256:i", V.UNCHANGED)
    await _read(ledger, idle, "sha256:i2", V.ACCEPTED)


async def test_a_bind_racing_the_prune_keeps_its_receipt(private_ledger: Ledger) -> None:
    ledger = private_ledger
    key = await _active(ledger, uri="demo://receipts/race")
    await _read(ledger, key, "sha256:r", V.ACCEPTED)
    old = [await _read(ledger, key, "sha256:r", V.UNCHANGED) for _ in range(3)]
    await _age(ledger, key)
    await _read(ledger, key, "sha256:r", V.UNCHANGED)
    async with ledger.pool.connection() as conn:
        async with conn.transaction():
            # A bind naming old[1], not yet committed: its foreign-key check holds the receipt's row.
            await conn.execute("INSERT INTO answer_bindings (answer_id, revision, request_id, workflow_id,"
                               " question, dependencies) VALUES ('race', 1, 'race', 'wf', 'q', '[]')")
            await conn.execute("INSERT INTO answer_selections (answer_id, revision, request_id, subject,"
                               " server, uri, receipt_id, source)"
                               " VALUES ('race', 1, 'race', %s, %s, %s, %s, 'bound')",
                               (key.subject, key.server, key.uri, old[1]))
            pruning = asyncio.create_task(prune(ledger.pool, keep=KEEP))
            await asyncio.sleep(1.0)
            assert not pruning.done(), "the batch waits for the bind"
    report = await pruning
    assert report.verification_receipts == 2
    assert old[1] in await _receipts(ledger, key) and old[0] not in await _receipts(ledger, key)
