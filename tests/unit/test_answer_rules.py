"""The answer freshness gate's pure rules (seed 004): ``judge_answer`` through every HOLD rule,
the ACCEPT rule and the seed's escalation-policy timeline. The real-stack scenarios are in
tests/e2e/test_answer_gate.py."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

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
from mcpsync.workflows.names import answer_workflow_id
from mcpsync.workflows.records.ledger import AcceptVerdict
from mcpsync.workflows.records.subscription import SubscriptionState
from tests.histories.corpus import history_files

R = GateReason
S = SubscriptionState
V = AcceptVerdict
REPO_ROOT = Path(__file__).resolve().parents[2]

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
    assert judge(observed(updates_watched=False), policy=policy,
                 now=at(5)).reason_code == R.OBSERVATION_TOO_OLD


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
    unrelated = observed(uri=other, bound=theirs, selected=theirs, latest_accepted=theirs,
                         newest_receipt=theirs)
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
    assert accepted.dependencies[0].update_after_bound \
        and old.receipt_id == accepted.dependencies[0].bound_receipt_id
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


# --- UPDATE_SEEN is the level rule (activities/ledger/proven.py), carried by the observation --------------


def test_update_seen_follows_the_level_rule_not_the_timestamps() -> None:
    # An update noted after the latest accepted read was issued, covered since (a guardrail-rejected
    # read observed it, or a read absorbed it): the row is clean, and the gate says so.
    clean = judge(observed(last_notification_at=at(4), notifications_seen=1, last_notification_generation=1,
                           dirty=False))
    assert clean.verdict == Verdict.ACCEPT
    # An update no observing read covers, stamped before the latest read was issued: dirty, held.
    latest = receipt(2, status=V.UNCHANGED, minute=5)
    held = judge(observed(last_notification_at=at(4), latest_accepted=latest, newest_receipt=latest,
                          last_notification_generation=1, notifications_seen=2, dirty=True))
    assert held.verdict == Verdict.HOLD and held.reason_code == R.UPDATE_SEEN
    assert "not covered by any read" in held.reason


def test_an_observation_without_the_level_bit_is_judged_by_the_timestamp_rule() -> None:
    # What a build before the bit recorded (dirty None) is judged as that build judged it.
    assert observed().dirty is None
    d = judge(observed(last_notification_at=at(4), notifications_seen=1, last_notification_generation=1))
    assert d.reason_code == R.UPDATE_SEEN and "after the latest accepted observation" in d.reason


def _payload(payloads: dict[str, Any]) -> Any:
    (p,) = payloads["payloads"]
    return json.loads(base64.b64decode(p["data"]))


def test_released_answer_histories_decide_as_recorded() -> None:
    """Every check in a released AnswerWorkflow history: its recorded observation (which lacks
    ``dirty``) judged by today's rules gives the disposition the release recorded (its
    ``answer_record_disposition`` input): the workflow's code path and outputs are unchanged for them."""
    checks = 0
    for path in history_files():
        events = json.loads(path.read_text())["events"]
        if events[0]["workflowExecutionStartedEventAttributes"]["workflowType"]["name"] != "AnswerWorkflow":
            continue
        scheduled = {e["eventId"]: e["activityTaskScheduledEventAttributes"] for e in events
                     if "activityTaskScheduledEventAttributes" in e}
        policy, request, snapshot = FreshnessPolicy(), None, None
        for e in events:
            accepted = e.get("workflowExecutionUpdateAcceptedEventAttributes")
            if accepted and accepted["acceptedRequest"]["input"]["name"] == "check":
                policy = FreshnessPolicy.model_validate(
                    _payload(accepted["acceptedRequest"]["input"]["args"])["policy"])
            a = e.get("activityTaskScheduledEventAttributes")
            if a and a["activityType"]["name"] == "answer_observe":
                request = _payload(a["input"])
            c = e.get("activityTaskCompletedEventAttributes")
            if c and scheduled[c["scheduledEventId"]]["activityType"]["name"] == "answer_observe":
                raw = _payload(c["result"])
                assert all("dirty" not in d for d in raw["dependencies"])  # recorded before the bit
                snapshot = ObservationSnapshot.model_validate(raw)
            if a and a["activityType"]["name"] == "answer_record_disposition":
                assert request is not None and snapshot is not None
                recorded = Disposition.model_validate(_payload(a["input"])["disposition"])
                deps = [AnswerDependency.model_validate(d) for d in request["dependencies"]]
                today = judge_answer(answer_id=recorded.answer_id, revision=recorded.revision,
                                     sequence=recorded.sequence, dependencies=deps,
                                     selections=request["selections"], snapshot=snapshot, policy=policy,
                                     previous=None)
                assert today.model_dump(exclude={"reopened", "reason"}) == \
                    recorded.model_dump(exclude={"reopened", "reason"})
                assert today.reason.removeprefix("reopened: ") == recorded.reason.removeprefix("reopened: ")
                checks += 1
    assert checks >= 3  # the corpus's bind, check (ACCEPT), check (HOLD), select, check
