"""The answer freshness gate on the real stack (seed 004): Temporal dev server, PostgreSQL, the
fixture MCP server. The escalation policy end to end, the list_changed / unrelated-update
countercase (with the CLI), a failed read, tombstoned / revoked dependencies. The pure rules are
in tests/unit/test_answer_rules.py."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.answers import AnswerLedger
from mcpsync.activities.starters import start_subscription
from mcpsync.fixture import FixtureProcess
from mcpsync.worker.api.answer_gate import AnswerGate, AnswerGateError, latest_receipts
from mcpsync.worker.main.config import ServerConfig
from mcpsync.worker.main.revocation import revoke
from mcpsync.workflows.answer_rules import (
    GateReason,
    ReceiptObservation,
    Verdict,
)
from mcpsync.workflows.names import SIGNAL_CATALOG_RECONCILED, answer_workflow_id
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import CatalogObservation, SubscriptionKey, SubscriptionState
from tests import cli_process
from tests.conftest import eventually, running_services, unique
from tests.e2e.test_e2e_subscription import _wait_record

R = GateReason
S = SubscriptionState
V = AcceptVerdict
REPO_ROOT = Path(__file__).resolve().parents[2]




# --- the real stack ------------------------------------------------------------------------------



def _server(url: str) -> ServerConfig:
    return ServerConfig(name=unique("fx"), transport="http", url=url, subjects=["alice"],
                        ping_interval_seconds=0.5, ping_timeout_seconds=2)


async def _subscribed(client: Client, ledger: Ledger, fx: FixtureProcess, server: ServerConfig, queue: str,
                      name: str, text: str) -> tuple[SubscriptionKey, Any, int]:
    uri = f"file:///demo/{uuid.uuid4().hex[:12]}/{name}"
    key = SubscriptionKey(subject="alice", server=server.name, uri=uri)
    created = await fx.create(uri, text=text, mime_type="text/plain")
    handle = await start_subscription(client, key, task_queue=queue)
    await _wait_record(handle, lambda r: r.last_accepted_digest == created["committed"]["digest"],
                       f"{name} read")
    await fx.wait_subscribed(uri)
    return key, handle, await _latest_id(ledger, key)


async def _latest(ledger: Ledger, key: SubscriptionKey) -> ReceiptObservation | None:
    return (await latest_receipts(ledger, key.subject, key.server, [key.uri]))[key.uri].receipt


async def _latest_id(ledger: Ledger, key: SubscriptionKey) -> int:
    r = await _latest(ledger, key)
    assert r is not None
    return r.receipt_id


async def _wait_latest(ledger: Ledger, key: SubscriptionKey, pred: Any, what: str) -> ReceiptObservation:
    async def probe() -> ReceiptObservation | None:
        r = await _latest(ledger, key)
        return r if r is not None and pred(r) else None

    result: ReceiptObservation = await eventually(probe, what=what)
    return result


async def _scalar(ledger: Ledger, sql: str, *args: object) -> Any:
    async with ledger.pool.connection() as conn:
        cur = await conn.execute(sql, args)
        row = await cur.fetchone()
    return None if row is None else row[0]


async def _notifications(ledger: Ledger, key: SubscriptionKey) -> int:
    return int(await _scalar(ledger, "SELECT notifications_seen FROM subscriptions WHERE workflow_id=%s",
                             key.workflow_id))


async def _wait_notified(ledger: Ledger, key: SubscriptionKey, before: int) -> None:
    async def seen() -> bool:
        return await _notifications(ledger, key) > before

    await eventually(seen, what="update recorded in the ledger")


async def test_escalation_policy_end_to_end(temporal_client: Client, ledger: Ledger,
                                            fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        queue = cfg.temporal.task_queue
        gate = AnswerGate(temporal_client, queue)
        key, _, old_id = await _subscribed(temporal_client, ledger, fx, server, queue,
                                           "escalation-policy.txt",
                                           "Severity-2 incidents go to customer support.")
        answer_id = unique("sev2")
        question = "Which team should handle a severity-2 incident under the current policy?"
        # 09:00 the draft ("Customer support") is bound to Old.
        bound = await gate.bind(answer_id, question, [(key.subject, key.server, key.uri, old_id)])
        assert bound.record == "answerBinding.v1" and bound.revision == 1
        assert [(s.receipt_id, s.source) for s in bound.selections] == [(old_id, "bound")]
        first = await gate.check(answer_id)
        assert first.verdict == Verdict.ACCEPT and first.receipt_ids == [old_id]
        # 09:04 an update names the URI; its read is slow, so the check sees it before any new content.
        await fx.faults(read_delay_ms={key.uri: 1500})
        seen = await _notifications(ledger, key)
        new = await fx.edit(key.uri, text="Severity-2 incidents go to the duty engineer.")
        await _wait_notified(ledger, key, seen)
        held = await gate.check(answer_id)
        assert held.verdict == Verdict.HOLD and held.reopened
        assert R.UPDATE_SEEN in held.dependencies[0].conditions
        # 09:05 New is read and accepted, but the host still selects Old.
        await fx.faults(read_delay_ms={})
        new_receipt = await _wait_latest(ledger, key,
                                         lambda r: r.content_digest == new["committed"]["digest"],
                                         "New accepted")
        stale = await gate.check(answer_id)
        assert (stale.verdict, stale.reason_code) == (Verdict.HOLD, R.SELECTED_NOT_LATEST)
        assert stale.dependencies[0].conditions == [R.SELECTED_NOT_LATEST]
        assert stale.dependencies[0].latest_receipt_id == new_receipt.receipt_id
        # 09:06 the host selects New; 09:07 the check accepts it within its evidence window.
        selected = await gate.select_input(answer_id, key.uri, new_receipt.receipt_id)
        assert selected.selections[0].source == "host"
        accepted = await gate.check(answer_id)
        assert accepted.verdict == Verdict.ACCEPT and accepted.reason_code == R.INPUTS_CURRENT
        assert accepted.receipt_ids == [new_receipt.receipt_id]
        assert accepted.evidence_from == new_receipt.accepted_at
        assert accepted.evidence_to == accepted.checked_at and accepted.evidence_to > accepted.evidence_from
        assert accepted.dependencies[0].update_after_bound \
            and "resolved" in accepted.dependencies[0].equality_reasoning
        # A later relevant update reopens it; an UNCHANGED re-read with the same digest accepts again.
        await fx.faults(read_delay_ms={key.uri: 1500})
        seen = await _notifications(ledger, key)
        await fx.notify(key.uri)
        await _wait_notified(ledger, key, seen)
        reopened = await gate.check(answer_id)
        assert reopened.verdict == Verdict.HOLD and reopened.reopened \
            and reopened.reason.startswith("reopened")
        await fx.faults(read_delay_ms={})
        await _wait_latest(ledger, key, lambda r: r.receipt_id > new_receipt.receipt_id, "UNCHANGED re-read")
        again = await gate.check(answer_id)
        assert again.verdict == Verdict.ACCEPT and again.receipt_ids == [new_receipt.receipt_id]
        assert again.dependencies[0].equal_by == "unchanged_digest"
        record = await gate.answer(answer_id)
        assert record.disposition == again and record.last_accept == again and record.checks == 6
    history = await AnswerLedger(ledger.pool).dispositions(answer_id)
    assert [(h.sequence, h.verdict) for h in history] == list(enumerate(
        [Verdict.ACCEPT, Verdict.HOLD, Verdict.HOLD, Verdict.ACCEPT, Verdict.HOLD, Verdict.ACCEPT], start=1))
    assert await _scalar(ledger,
                         "SELECT count(*) FROM answer_dispositions WHERE answer_id=%s AND verdict='ACCEPT'"
                                 " AND evidence_from IS NOT NULL", answer_id) == 3
    # No body anywhere in the answer tables: ids, digests and the question only.
    dumped = json.dumps([h.model_dump(mode="json") for h in history])
    assert "duty engineer" not in dumped and "customer support" not in dumped


async def test_list_changed_and_unrelated_updates_do_not_reopen(temporal_client: Client, ledger: Ledger,
                                                                fx: FixtureProcess, tmp_path: Path,
                                                                database_url: str,
                                                                temporal_server: Any) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        queue = cfg.temporal.task_queue
        key, _, policy_id = await _subscribed(temporal_client, ledger, fx, server, queue,
                                              "escalation-policy.txt", "Severity-2: duty engineer.")
        other, _, other_id = await _subscribed(temporal_client, ledger, fx, server, queue, "oncall.txt",
                                               "rota v1")
        conf = tmp_path / "mcpsync.toml"
        conf.write_text(f'[temporal]\naddress = "{temporal_server.address}"\ntask_queue = "{queue}"\n'
                        f'[database]\nurl = "{database_url}"\n'
                        f'[[servers]]\nname = "{server.name}"\ntransport = "http"\nurl = "{fx.mcp_url}"\n'
                        f'subjects = ["alice"]\n')

        async def cli(*args: str, rc: int = 0) -> dict[str, Any]:
            r = await cli_process.arun(["--config", str(conf), "answer", *args, "--json"],
                                       env=cli_process.without_database_url())
            assert r.returncode == rc, r.stderr
            doc: dict[str, Any] = json.loads(r.stdout)
            return doc

        answer_id = unique("cli")
        bound = await cli("bind", "--answer-id", answer_id, "--question", "Who handles sev-2?", "--subject",
                          "alice", "--dep", server.name, key.uri, "latest")
        assert bound["record"] == "answerBinding.v1" and bound["dependencies"][0]["receipt_id"] == policy_id
        gate = AnswerGate(temporal_client, queue, idle_seconds=1.0)
        first = await gate.check(answer_id)
        assert first.verdict == Verdict.ACCEPT and first.receipt_ids == [policy_id]
        # A separate resource appears: list_changed reaches the session host, the answer stays accepted.
        listed = await _scalar(ledger, "SELECT count(*) FROM audit WHERE kind='LIST_CHANGED' AND server=%s",
                               server.name)
        await fx.create(f"file:///demo/{uuid.uuid4().hex[:12]}/formatting-guide.txt", text="use headings")

        async def list_changed_seen() -> bool:
            n = await _scalar(ledger, "SELECT count(*) FROM audit WHERE kind='LIST_CHANGED' AND server=%s",
                              server.name)
            return bool(n > listed)

        await eventually(list_changed_seen, what="list_changed received")
        after_list = await cli("check", "--answer-id", answer_id)
        assert after_list["verdict"] == "ACCEPT" and not after_list["reopened"]
        # An update of an unrelated (subscribed) URI does not reopen it either.
        edit = await fx.edit(other.uri, text="rota v2")
        await _wait_latest(ledger, other, lambda r: r.content_digest == edit["committed"]["digest"],
                           "other read")
        after_other = await gate.check(answer_id)
        assert after_other.verdict == Verdict.ACCEPT and after_other.receipt_ids == [policy_id]
        history = await AnswerLedger(ledger.pool).dispositions(answer_id)
        assert [(h.verdict, h.reopened) for h in history] == [(Verdict.ACCEPT, False)] * 3

        # Refusals name the problem; the answer is untouched.
        with pytest.raises(AnswerGateError, match="not a receipt of"):
            await gate.bind(answer_id, "q", [(key.subject, key.server, key.uri, other_id)])
        with pytest.raises(AnswerGateError, match="not a dependency"):
            await gate.select_input(answer_id, other.uri, other_id)
        with pytest.raises(AnswerGateError, match="not bound"):
            await gate.check(unique("never-bound"))
        # A workflow idles out; the next call starts a new run that reloads the answer from PostgreSQL.
        idle_id = unique("idle")
        await gate.bind(idle_id, "Who handles sev-2?", [(key.subject, key.server, key.uri, policy_id)])
        assert (await gate.check(idle_id)).sequence == 1
        ended = await asyncio.wait_for(
            temporal_client.get_workflow_handle(answer_workflow_id(idle_id)).result(), timeout=30)
        assert ended["record"] == "answerBinding.v1" and ended["checks"] == 1
        reloaded = await gate.check(idle_id)
        assert reloaded.verdict == Verdict.ACCEPT and reloaded.sequence == 2 and reloaded.revision == 1
        # The dependency itself changes: a new receipt exists, the old one is still selected. HOLD,
        # and the CLI says so in its exit code (3) too.
        changed = await fx.edit(key.uri, text="Severity-2: incident commander.")
        await _wait_latest(ledger, key, lambda r: r.content_digest == changed["committed"]["digest"],
                           "new policy")
        held = await cli("check", "--answer-id", answer_id, rc=3)
        assert held["verdict"] == "HOLD" and held["reopened"]


async def test_failed_read_holds_naming_the_unresolved_condition(temporal_client: Client, ledger: Ledger,
                                                                 fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        gate = AnswerGate(temporal_client, cfg.temporal.task_queue)
        key, _, old_id = await _subscribed(temporal_client, ledger, fx, server, cfg.temporal.task_queue,
                                           "escalation-policy.txt", "Old")
        answer_id = unique("failed")
        await gate.bind(answer_id, "Which team handles sev-2?", [(key.subject, key.server, key.uri, old_id)])
        assert (await gate.check(answer_id)).verdict == Verdict.ACCEPT
        await fx.faults(fail_reads={key.uri: -32603})
        await fx.edit(key.uri, text="New")

        async def failed() -> str | None:
            outcome = await _scalar(ledger, "SELECT outcome FROM read_requests WHERE workflow_id=%s"
                                            " AND completed_at IS NOT NULL ORDER BY ordinal DESC LIMIT 1",
                                    key.workflow_id)
            return None if outcome in ("ACCEPTED", "UNCHANGED") else str(outcome)

        outcome = await eventually(failed, what="the read failed")  # the read's kind, e.g. 'transient'
        held = await gate.check(answer_id)
        assert (held.verdict, held.reason_code) == (Verdict.HOLD, R.READ_FAILED)
        assert held.dependencies[0].conditions[0] == R.READ_FAILED
        assert "unresolved" in held.reason and "not an empty resource" in held.reason \
            and "-32603" in held.reason
        assert f"({outcome}, error -32603)" in held.dependencies[0].explanations[0]
        assert held.dependencies[0].latest_receipt_id == old_id  # the old version is not made current either
        # Once a read succeeds the failure is resolved; what remains is selecting the new observation.
        await fx.faults(fail_reads={})
        await fx.notify(key.uri)
        new = await _wait_latest(ledger, key, lambda r: r.receipt_id != old_id, "re-read succeeded")
        assert (await gate.check(answer_id)).reason_code == R.SELECTED_NOT_LATEST
        await gate.select_input(answer_id, key.uri, new.receipt_id)
        assert (await gate.check(answer_id)).verdict == Verdict.ACCEPT


async def test_tombstoned_and_revoked_dependencies_hold(temporal_client: Client, ledger: Ledger,
                                                        fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        queue = cfg.temporal.task_queue
        gate = AnswerGate(temporal_client, queue)
        gone, h_gone, gone_id = await _subscribed(temporal_client, ledger, fx, server, queue,
                                                  "policy.txt", "p")
        lost, h_lost, lost_id = await _subscribed(temporal_client, ledger, fx, server, queue,
                                                  "roster.txt", "r")
        answer_id = unique("gone")
        await gate.bind(answer_id, "Who is on call for sev-2?", [
            (gone.subject, gone.server, gone.uri, gone_id), (lost.subject, lost.server, lost.uri, lost_id)])
        assert (await gate.check(answer_id)).verdict == Verdict.ACCEPT
        await fx.delete(gone.uri)
        rec = await _wait_record(h_gone, lambda r: r.state == S.TOMBSTONE_PENDING, "tombstone pending")
        pending = await gate.check(answer_id)
        assert (pending.verdict, pending.reason_code) == (Verdict.HOLD, R.TOMBSTONE_PENDING)
        assert pending.dependencies[0].conditions == [R.TOMBSTONE_PENDING] and pending.dependencies[1].current
        await h_gone.signal(SIGNAL_CATALOG_RECONCILED, CatalogObservation(
            uri=gone.uri, listed=False, scan_id="scan-answer-test", snapshot_status="SNAPSHOT_UNPROVEN",
            session_generation=rec.session_generation))
        await _wait_record(h_gone, lambda r: r.state == S.TOMBSTONED, "tombstoned")
        await revoke(temporal_client, ledger, subject=lost.subject, server=lost.server, uri=lost.uri,
                     reason="answer gate test")
        await _wait_record(h_lost, lambda r: r.state == S.REVOKED, "revoked")
        held = await gate.check(answer_id)
        assert (held.verdict, held.reason_code) == (Verdict.HOLD, R.REVOKED)
        assert [d.conditions for d in held.dependencies] == [[R.TOMBSTONED], [R.REVOKED]]
        assert "revoked" in held.reason and held.receipt_ids == []
