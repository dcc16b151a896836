"""The answer freshness gate (issue 5 item 4, seed 004).

Fast unit tests drive the pure gate (``mcpsync.workflows.answer_rules.judge_answer``) through every HOLD
rule, the ACCEPT rule and the seed's escalation-policy timeline. Real-stack tests run the
same scenario end to end (Temporal dev server, PostgreSQL, the fixture MCP server): the
escalation policy, the list_changed / unrelated-update countercase (with the CLI), a failed
read, and tombstoned / revoked dependencies.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from temporalio.client import Client

from mcpsync.activities.answer_ledger import AnswerLedger
from mcpsync.activities.ledger import Ledger
from mcpsync.worker.answer_gate import AnswerGate, AnswerGateError, latest_receipts
from mcpsync.worker.config import ServerConfig
from mcpsync.worker.fixture import FixtureProcess
from mcpsync.worker.runtime import revoke, start_subscription
from mcpsync.workflows.answer_rules import (
    AnswerBindingV1,
    AnswerDependency,
    AnswerState,
    AnswerTracker,
    BindRequest,
    BoundAnswer,
    DependencyObservation,
    Disposition,
    FreshnessPolicy,
    GateReason,
    InputSelection,
    ObservationSnapshot,
    ReadObservation,
    ReceiptObservation,
    Verdict,
    judge_answer,
)
from mcpsync.workflows.names import SIGNAL_CATALOG_RECONCILED, answer_workflow_id
from mcpsync.workflows.records import AcceptVerdict, CatalogObservation, SubscriptionKey, SubscriptionState
from tests.conftest import eventually, running_services, unique
from tests.test_e2e_subscription import _wait_record

R = GateReason
S = SubscriptionState
V = AcceptVerdict
REPO_ROOT = Path(__file__).resolve().parents[1]

# --- the pure gate -------------------------------------------------------------------------------

URI = "file:///demo/escalation-policy.txt"
OLD, NEW = "sha256:" + "0" * 64, "sha256:" + "1" * 64
T0 = datetime(2026, 10, 13, 9, 0, tzinfo=UTC)


def at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)


def receipt(rid: int, *, digest: str | None = OLD, ordinal: int | None = None, status: V = V.ACCEPTED,
            minute: float = 0.0, gens: tuple[int, int] = (1, 1), uri: str = URI) -> ReceiptObservation:
    return ReceiptObservation(receipt_id=rid, subject="alice", server="docs", uri=uri, status=status,
                              content_digest=digest, read_ordinal=ordinal or rid, session_generation=gens[0],
                              subscription_generation=gens[1], read_issued_at=at(minute),
                              accepted_at=at(minute) + timedelta(seconds=1))


def observed(**kw: Any) -> DependencyObservation:
    base = receipt(1)
    fields: dict[str, Any] = dict(subject="alice", server="docs", uri=URI, subscribed=True, state=S.ACTIVE,
                                  session_generation=1, subscription_generation=1, live_session_generation=1,
                                  bound=base, selected=base, latest_accepted=base, newest_receipt=base)
    fields.update(kw)
    return DependencyObservation(**fields)


def dep(receipt_id: int = 1, uri: str = URI) -> AnswerDependency:
    return AnswerDependency(subject="alice", server="docs", uri=uri, receipt_id=receipt_id)


def judge(*observations: DependencyObservation, selections: dict[str, int] | None = None,
          deps: list[AnswerDependency] | None = None, policy: FreshnessPolicy | None = None,
          previous: Disposition | None = None, now: datetime | None = None) -> Disposition:
    snapshot = ObservationSnapshot(checked_at=now or at(10), dependencies=list(observations))
    return judge_answer(answer_id="a1", revision=1, sequence=1, dependencies=deps or [dep()],
                        selections=selections or {}, snapshot=snapshot, policy=policy or FreshnessPolicy(),
                        previous=previous)


def test_accept_when_selected_is_latest_and_no_update_stamps_window_and_receipts() -> None:
    d = judge(observed())
    assert d.verdict == Verdict.ACCEPT and d.reason_code == R.INPUTS_CURRENT
    assert d.receipt_ids == [1]
    assert d.evidence_from == at(0) + timedelta(seconds=1) and d.evidence_to == at(10) == d.checked_at
    assert d.dependencies[0].equal_by == "receipt" and d.dependencies[0].current
    assert d.record == "answerDisposition.v1"


def test_update_after_the_observation_holds() -> None:
    d = judge(observed(last_notification_at=at(4), notifications_seen=1, last_notification_generation=1))
    assert d.verdict == Verdict.HOLD and d.reason_code == R.UPDATE_SEEN
    assert "re-read" in d.reason and d.receipt_ids == [] and d.evidence_from is None


def test_update_before_the_read_that_observed_it_does_not_hold() -> None:
    latest = receipt(2, digest=OLD, status=V.UNCHANGED, minute=5)
    d = judge(observed(last_notification_at=at(4), latest_accepted=latest, newest_receipt=latest,
                       last_notification_generation=1))
    assert d.verdict == Verdict.ACCEPT
    assert d.dependencies[0].update_after_bound


def test_update_from_an_older_session_than_the_observation_proves_nothing_newer() -> None:
    latest = receipt(2, digest=OLD, status=V.UNCHANGED, minute=5, gens=(2, 2))
    d = judge(observed(last_notification_at=at(6), last_notification_generation=1, latest_accepted=latest,
                       newest_receipt=latest, session_generation=2, subscription_generation=2,
                       live_session_generation=2))
    assert d.verdict == Verdict.ACCEPT


def test_read_pending_holds() -> None:
    d = judge(observed(reads_pending=1))
    assert (d.verdict, d.reason_code) == (Verdict.HOLD, R.READ_PENDING)


@pytest.mark.parametrize("outcome,code", [("malformed", R.READ_FAILED), ("transient", R.READ_FAILED),
                                          ("content", R.READ_FAILED), ("denied", R.READ_DENIED)])
def test_failed_or_denied_latest_read_is_unresolved_never_empty(outcome: str, code: GateReason) -> None:
    read = ReadObservation(ordinal=2, outcome=outcome, issued_at=at(5), completed_at=at(5), error_code=-32603)
    d = judge(observed(latest_read=read))
    assert (d.verdict, d.reason_code) == (Verdict.HOLD, code)
    assert "unresolved" in d.reason and "not an empty resource" in d.reason
    assert "-32603" in d.reason


def test_failed_read_older_than_the_latest_accepted_is_resolved() -> None:
    read = ReadObservation(ordinal=1, outcome="malformed", issued_at=at(0), completed_at=at(0))
    latest = receipt(2, minute=1)
    d = judge(observed(latest_read=read, latest_accepted=latest, newest_receipt=latest, selected=latest),
              selections={URI: 2})
    assert d.verdict == Verdict.ACCEPT


def test_guardrail_rejected_newest_read_holds() -> None:
    d = judge(observed(newest_receipt=receipt(2, digest=NEW, status=V.GUARDRAIL_REJECTED, minute=5)))
    assert (d.verdict, d.reason_code) == (Verdict.HOLD, R.GUARDRAIL_REJECTED)


def test_selected_guardrail_rejected_receipt_is_not_releasable() -> None:
    rejected = receipt(2, digest=NEW, status=V.GUARDRAIL_REJECTED, minute=5)
    d = judge(observed(selected=rejected), selections={URI: 2})
    assert R.INPUT_NOT_RELEASABLE in d.dependencies[0].conditions


@pytest.mark.parametrize("state,code", [
    (S.REVOKED, R.REVOKED), (S.TOMBSTONED, R.TOMBSTONED), (S.TOMBSTONE_PENDING, R.TOMBSTONE_PENDING),
    (S.CLOSED, R.SUBSCRIPTION_CLOSED), (S.UNSUBSCRIBE_UNKNOWN, R.SUBSCRIPTION_CLOSED),
    (S.UNSUBSCRIBING, R.SUBSCRIPTION_CLOSED), (S.RECONCILIATION_REQUIRED, R.RECONCILIATION_REQUIRED),
    (S.SUBSCRIBING, R.CONTINUITY_UNCERTAIN),
])
def test_dependency_state_holds_with_a_named_reason(state: SubscriptionState, code: GateReason) -> None:
    d = judge(observed(state=state))
    assert (d.verdict, d.reason_code) == (Verdict.HOLD, code)
    assert d.dependencies[0].conditions == [code]


def test_unknown_dependency_holds() -> None:
    d = judge(DependencyObservation(subject="alice", server="docs", uri=URI, subscribed=False,
                                    selected=receipt(1), bound=receipt(1)))
    assert (d.verdict, d.reason_code) == (Verdict.HOLD, R.UNKNOWN_DEPENDENCY)


def test_replaced_dependency_not_yet_reread_holds() -> None:
    pending = receipt(2, digest=None, status=V.TOMBSTONE_PENDING, minute=3)
    d = judge(observed(newest_receipt=pending))
    assert (d.verdict, d.reason_code) == (Verdict.HOLD, R.REPLACED)


def test_new_read_with_old_copy_still_selected_holds_then_selecting_it_accepts() -> None:
    new = receipt(2, digest=NEW, minute=5)
    d = judge(observed(latest_accepted=new, newest_receipt=new, last_notification_at=at(4),
                       last_notification_generation=1))
    assert (d.verdict, d.reason_code) == (Verdict.HOLD, R.SELECTED_NOT_LATEST)
    assert d.dependencies[0].conditions == [R.SELECTED_NOT_LATEST]
    assert "receipt 1" in d.reason and "latest accepted receipt is 2" in d.reason
    d = judge(observed(latest_accepted=new, newest_receipt=new, selected=new, last_notification_at=at(4),
                       last_notification_generation=1), selections={URI: 2})
    assert d.verdict == Verdict.ACCEPT and d.receipt_ids == [2]
    assert d.evidence_from == new.accepted_at


def test_unchanged_receipt_with_the_same_digest_counts_as_equal_and_says_why() -> None:
    unchanged = receipt(2, digest=OLD, status=V.UNCHANGED, minute=5)
    d = judge(observed(latest_accepted=unchanged, newest_receipt=unchanged, last_notification_at=at(4),
                       last_notification_generation=1))
    assert d.verdict == Verdict.ACCEPT and d.receipt_ids == [1]
    assert d.dependencies[0].equal_by == "unchanged_digest"
    assert "same digest" in d.dependencies[0].equality_reasoning and "UNCHANGED" in d.reason
    # Same digest again, but the content changed in between (A -> B -> A): not equal.
    again = receipt(3, digest=OLD, minute=6)
    d = judge(observed(latest_accepted=again, newest_receipt=again, changes_since_selected=2))
    assert (d.verdict, d.reason_code) == (Verdict.HOLD, R.SELECTED_NOT_LATEST)


def test_selected_receipt_of_another_resource_is_an_identity_mismatch() -> None:
    d = judge(observed(selected=receipt(9, uri="file:///demo/other.txt")), selections={URI: 9})
    assert R.INPUT_IDENTITY_MISMATCH in d.dependencies[0].conditions


@pytest.mark.parametrize("kw", [
    {"live_session_generation": None},
    {"live_session_generation": 2},
    {"session_generation": 2, "subscription_generation": 2, "live_session_generation": 2},
])
def test_uncertain_continuity_holds(kw: dict[str, Any]) -> None:
    d = judge(observed(**kw))
    assert (d.verdict, d.reason_code) == (Verdict.HOLD, R.CONTINUITY_UNCERTAIN)


def test_unwatched_dependency_needs_a_freshness_policy() -> None:
    assert judge(observed(updates_watched=False)).reason_code == R.UNWATCHED
    policy = FreshnessPolicy(max_unwatched_age_seconds=60)
    assert judge(observed(updates_watched=False), policy=policy, now=at(0.5)).verdict == Verdict.ACCEPT
    assert judge(observed(updates_watched=False), policy=policy, now=at(5)).reason_code == R.OBSERVATION_TOO_OLD


def test_no_accepted_version_holds() -> None:
    d = judge(observed(latest_accepted=None, newest_receipt=None))
    assert d.reason_code == R.NO_ACCEPTED_VERSION


def test_conditions_are_ordered_by_precedence_with_one_explanation_each() -> None:
    read = ReadObservation(ordinal=2, outcome="malformed", issued_at=at(5), completed_at=at(5))
    d = judge(observed(latest_read=read, reads_pending=1, last_notification_at=at(4),
                       last_notification_generation=1))
    assert d.dependencies[0].conditions == [R.READ_FAILED, R.READ_PENDING, R.UPDATE_SEEN]
    assert len(d.dependencies[0].explanations) == 3
    assert d.reason_code == R.READ_FAILED and "(+2 more condition(s))" in d.reason


def test_unrelated_uri_update_does_not_reopen_and_window_starts_at_the_latest_confirmation() -> None:
    other = "file:///demo/formatting-guide.txt"
    mine = observed()
    theirs = receipt(5, uri=other, minute=3)
    unrelated = observed(uri=other, bound=theirs, selected=theirs, latest_accepted=theirs, newest_receipt=theirs)
    d = judge(mine, unrelated, deps=[dep(1), dep(5, other)])
    assert d.verdict == Verdict.ACCEPT and d.evidence_from == theirs.accepted_at
    # An update of a URI that is not a dependency is not even looked at.
    noisy = observed(uri=other, last_notification_at=at(9), reads_pending=3)
    assert judge(mine, noisy).verdict == Verdict.ACCEPT


def test_seed_escalation_policy_timeline() -> None:
    """09:00 Old bound, 09:04 update, 09:05 New read with Old selected, 09:06 New selected, 09:07 checked."""
    old, new = receipt(1, digest=OLD, minute=0), receipt(2, digest=NEW, minute=5)
    first = judge(observed(), now=at(1))
    assert first.verdict == Verdict.ACCEPT
    update = judge(observed(last_notification_at=at(4), last_notification_generation=1, reads_pending=1),
                   previous=first, now=at(4.5))
    assert update.verdict == Verdict.HOLD and update.reopened and update.reason.startswith("reopened: ")
    assert {R.UPDATE_SEEN, R.READ_PENDING} <= set(update.dependencies[0].conditions)
    read_new = observed(latest_accepted=new, newest_receipt=new, last_notification_at=at(4),
                        last_notification_generation=1)
    stale_input = judge(read_new, previous=update, now=at(5.5))
    assert stale_input.reason_code == R.SELECTED_NOT_LATEST and not stale_input.reopened
    selected_new = read_new.model_copy(update={"selected": new})
    accepted = judge(selected_new, selections={URI: 2}, previous=stale_input, now=at(7))
    assert accepted.verdict == Verdict.ACCEPT and accepted.receipt_ids == [2]
    assert (accepted.evidence_from, accepted.evidence_to) == (new.accepted_at, at(7))
    assert accepted.dependencies[0].update_after_bound and old.receipt_id == accepted.dependencies[0].bound_receipt_id
    later = judge(selected_new.model_copy(update={"last_notification_at": at(8)}), selections={URI: 2},
                  previous=accepted, now=at(8.5))
    assert later.verdict == Verdict.HOLD and later.reopened and later.reason_code == R.UPDATE_SEEN


def test_bind_request_and_tracker() -> None:
    with pytest.raises(ValidationError, match="once per answer"):
        BindRequest(answer_id="a", question="q", dependencies=[dep(1), dep(2)])
    assert answer_workflow_id("a") == answer_workflow_id("a") != answer_workflow_id("b")
    tracker = AnswerTracker(AnswerState(answer_id="a1"))
    assert not tracker.bound
    req = BindRequest(answer_id="a1", question="Which team handles sev-2?", dependencies=[dep(1)])
    tracker.rebound(req, BoundAnswer(revision=1, bound_at=at(0), selections=[
        InputSelection(uri=URI, receipt_id=1, source="bound", selected_at=at(0))]))
    tracker.selected(InputSelection(uri=URI, receipt_id=2, source="host", selected_at=at(6)))
    assert tracker.observe_request().selections == {URI: 2}
    snapshot = ObservationSnapshot(checked_at=at(7), dependencies=[observed(
        selected=receipt(2, digest=NEW, minute=5), latest_accepted=receipt(2, digest=NEW, minute=5))])
    d = tracker.judged(tracker.judge(snapshot, FreshnessPolicy()), 1)
    assert d.verdict == Verdict.ACCEPT
    rec = tracker.record()
    assert isinstance(rec, AnswerBindingV1) and rec.record == "answerBinding.v1"
    assert rec.checks == 1 and rec.last_accept == d and rec.selections[0].source == "host"
    json.loads(rec.model_dump_json())


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
    await _wait_record(handle, lambda r: r.last_accepted_digest == created["committed"]["digest"], f"{name} read")
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


async def test_escalation_policy_end_to_end(temporal_client: Client, ledger: Ledger, fx: FixtureProcess) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        queue = cfg.temporal.task_queue
        gate = AnswerGate(temporal_client, queue)
        key, _, old_id = await _subscribed(temporal_client, ledger, fx, server, queue, "escalation-policy.txt",
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
        new_receipt = await _wait_latest(ledger, key, lambda r: r.content_digest == new["committed"]["digest"],
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
        assert accepted.dependencies[0].update_after_bound and "resolved" in accepted.dependencies[0].equality_reasoning
        # A later relevant update reopens it; an UNCHANGED re-read with the same digest accepts again.
        await fx.faults(read_delay_ms={key.uri: 1500})
        seen = await _notifications(ledger, key)
        await fx.notify(key.uri)
        await _wait_notified(ledger, key, seen)
        reopened = await gate.check(answer_id)
        assert reopened.verdict == Verdict.HOLD and reopened.reopened and reopened.reason.startswith("reopened")
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
    assert await _scalar(ledger, "SELECT count(*) FROM answer_dispositions WHERE answer_id=%s AND verdict='ACCEPT'"
                                 " AND evidence_from IS NOT NULL", answer_id) == 3
    # No body anywhere in the answer tables: ids, digests and the question only.
    dumped = json.dumps([h.model_dump(mode="json") for h in history])
    assert "duty engineer" not in dumped and "customer support" not in dumped


async def test_list_changed_and_unrelated_updates_do_not_reopen(temporal_client: Client, ledger: Ledger,
                                                                fx: FixtureProcess, tmp_path: Path,
                                                                database_url: str, temporal_server: Any) -> None:
    server = _server(fx.mcp_url)
    async with running_services(temporal_client, ledger, [server]) as cfg:
        queue = cfg.temporal.task_queue
        key, _, policy_id = await _subscribed(temporal_client, ledger, fx, server, queue, "escalation-policy.txt",
                                              "Severity-2: duty engineer.")
        other, _, other_id = await _subscribed(temporal_client, ledger, fx, server, queue, "oncall.txt", "rota v1")
        conf = tmp_path / "mcpsync.toml"
        conf.write_text(f'[temporal]\naddress = "{temporal_server.address}"\ntask_queue = "{queue}"\n'
                        f'[database]\nurl = "{database_url}"\n'
                        f'[[servers]]\nname = "{server.name}"\ntransport = "http"\nurl = "{fx.mcp_url}"\n'
                        f'subjects = ["alice"]\n')

        async def cli(*args: str, rc: int = 0) -> dict[str, Any]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "mcpsync.worker.cli", "--config", str(conf), "answer", *args, "--json",
                cwd=REPO_ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={k: v for k, v in os.environ.items() if k != "MCPSYNC_DATABASE_URL"})
            out, err = await proc.communicate()
            assert proc.returncode == rc, err.decode()
            doc: dict[str, Any] = json.loads(out)
            return doc

        answer_id = unique("cli")
        bound = await cli("bind", "--answer-id", answer_id, "--question", "Who handles sev-2?", "--subject", "alice",
                          "--dep", server.name, key.uri, "latest")
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
        await _wait_latest(ledger, other, lambda r: r.content_digest == edit["committed"]["digest"], "other read")
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
        await _wait_latest(ledger, key, lambda r: r.content_digest == changed["committed"]["digest"], "new policy")
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
        assert "unresolved" in held.reason and "not an empty resource" in held.reason and "-32603" in held.reason
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
        gone, h_gone, gone_id = await _subscribed(temporal_client, ledger, fx, server, queue, "policy.txt", "p")
        lost, h_lost, lost_id = await _subscribed(temporal_client, ledger, fx, server, queue, "roster.txt", "r")
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
