"""What is said about a version, on the real ledger: every reader of freshness (serve's listing and
read, ``requireFresh``, the CLI's ``list``/``get``/``describe`` rows and ``status``, the answer gate's
UPDATE_SEEN) answers as the level rule (``coverage.dirty`` on the fence row) does, and names the
accepted version, not the newest re-read.

The cases drive the real ledger's ``note_notification`` / ``allocate_read`` / ``accept``: a failed
read, a read that absorbed duplicate notifications at the ingress, a late notification from a
session the row left, an unchanged re-read, and a read the guardrail rejects."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.answers import AnswerLedger
from mcpsync.activities.ledger.proven import proven_of
from mcpsync.activities.ledger.serve import ServedResource, freshness_meta, list_served, served_resource
from mcpsync.activities.ledger.subscription_views import list_subscriptions
from mcpsync.worker.cli.subscription_text import status_view
from mcpsync.workflows.answer_rules import (
    AnswerDependency,
    FreshnessPolicy,
    GateReason,
    ObserveRequest,
    judge_dependency,
)
from mcpsync.workflows.coverage import dirty
from mcpsync.workflows.records.ledger import AcceptRequest, AcceptVerdict, AllocateRequest
from mcpsync.workflows.records.mcp_calls import ReadOutcomeKind
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState, TriggerReason
from mcpsync.workflows.records.versioned import ResourceSubscriptionV1
from tests.integration.test_ledger import _accept, _active, _issue, _outcome, _rid


@dataclass(frozen=True)
class Said:
    """What each reader says about one resource."""

    served: ServedResource  # serve's read (``served_resource``)
    listed: ServedResource  # serve's listing (``list_served``)
    meta: dict[str, object]  # ``_meta["io.mcpsync/freshness"]`` (requireFresh answers from ``fresh``)
    row: dict[str, object]  # the CLI's list/get/describe row (``list_subscriptions``)
    gate: list[GateReason]  # the answer gate's conditions on the resource's newest receipt


async def _said(ledger: Ledger, key: SubscriptionKey) -> Said:
    served = await served_resource(ledger.pool, key.subject, key.uri)
    assert served is not None
    _, listing = await list_served(ledger.pool, key.subject)
    (listed,) = [r for r in listing if r.uri == key.uri]
    (row,) = await list_subscriptions(ledger.pool, subject=key.subject, server=key.server, uri=key.uri)
    return Said(served, listed, freshness_meta(served, None), row, await _gate(ledger, key))


async def _gate(ledger: Ledger, key: SubscriptionKey) -> list[GateReason]:
    """The answer gate's conditions for an answer bound to the resource's newest receipt: the
    production observation (``AnswerLedger.observe``) judged by ``judge_dependency``."""
    receipt_id = (await ledger.load_fence(key)).last_receipt_id
    assert receipt_id is not None
    dep = AnswerDependency(subject=key.subject, server=key.server, uri=key.uri, receipt_id=receipt_id)
    snapshot = await AnswerLedger(ledger.pool).observe(ObserveRequest(dependencies=[dep], selections={}))
    (obs,) = snapshot.dependencies
    return judge_dependency(dep, receipt_id, obs, FreshnessPolicy(), snapshot.checked_at).conditions


async def _assert_level_rule(ledger: Ledger, key: SubscriptionKey) -> bool:
    """Every reader's dirty equals ``coverage.dirty`` on the fence row (a failure names each reader
    that disagrees); that value."""
    expected = dirty(await ledger.load_fence(key))
    said = await _said(ledger, key)
    readers = {
        "serve's read": said.served.dirty,
        "serve's listing": said.listed.dirty,
        "serve's _meta": said.meta["dirty"],
        "requireFresh (refused as UPDATE_SEEN)": "UPDATE_SEEN" in str(said.meta.get("notFreshBecause")),
        "the CLI's row": said.row.get("dirty"),
        "the answer gate (held as UPDATE_SEEN)": GateReason.UPDATE_SEEN in said.gate,
    }
    assert readers == dict.fromkeys(readers, expected)
    if expected:
        assert said.meta["fresh"] is False
    return expected


async def _note(ledger: Ledger, key: SubscriptionKey) -> None:
    assert await ledger.fence.note_notification(key.subject, key.server, key.uri, 1) is not None


async def _first_version(ledger: Ledger, uri: str) -> tuple[SubscriptionKey, int]:
    key = await _active(ledger, uri)
    first = await _issue(ledger, key)
    assert await _accept(ledger, key, first, "sha256:v1") == AcceptVerdict.ACCEPTED
    assert not await _assert_level_rule(ledger, key)
    return key, (await ledger.load_fence(key)).last_receipt_id or 0


async def test_a_failed_read_leaves_a_dirty_resource_dirty_in_every_reader(ledger: Ledger) -> None:
    key, _ = await _first_version(ledger, "demo://failed")
    await _note(ledger, key)
    failed = await _issue(ledger, key)
    assert await _accept(ledger, key, failed, None, ReadOutcomeKind.TRANSIENT) == AcceptVerdict.REJECTED
    assert await _assert_level_rule(ledger, key)


async def test_duplicates_absorbed_at_the_ingress_leave_a_clean_resource_clean_in_every_reader(
    ledger: Ledger,
) -> None:
    key, _ = await _first_version(ledger, "demo://absorbed")
    await _note(ledger, key)
    read = await _issue(ledger, key)
    rid = await _rid(ledger, key, read)
    result = await ledger.fence.accept(
        AcceptRequest(
            outcome=_outcome(key, read, rid, "sha256:v2"),
            expected_state=SubscriptionState.ACTIVE,
            close_epoch=0,
            absorbed=2,
        )
    )
    assert result.verdict == AcceptVerdict.ACCEPTED and (result.notified, result.covered) == (3, 3)
    assert not await _assert_level_rule(ledger, key)


async def test_a_late_notification_from_a_left_session_leaves_a_dirty_resource_dirty_in_every_reader(
    ledger: Ledger,
) -> None:
    # Session 2 notifies (dirty), then a notification from session 1, which the row left, arrives
    # late: it is not counted, but it is the newest notification the row records.
    key = await _active(ledger, "demo://late")
    snap = await ledger.begin_subscription(key, 2)
    snap = await ledger.mark_active(key, 2, snap.subscription_generation)
    ticket = await ledger.fence.allocate_read(AllocateRequest(
        key=key, session_generation=2, subscription_generation=snap.subscription_generation, min_ordinal=1,
        request_id=str(uuid.uuid4()), trigger=TriggerReason.INITIAL))
    assert ticket.granted
    outcome = _outcome(key, ticket.ordinal, ticket.request_id, "sha256:v1").model_copy(
        update={"session_generation": 2, "subscription_generation": snap.subscription_generation})
    result = await ledger.fence.accept(AcceptRequest(outcome=outcome, expected_state=SubscriptionState.ACTIVE,
                                               close_epoch=0))
    assert result.verdict == AcceptVerdict.ACCEPTED
    assert not await _assert_level_rule(ledger, key)
    assert await ledger.fence.note_notification(key.subject, key.server, key.uri, 2) is not None
    assert await ledger.fence.note_notification(key.subject, key.server, key.uri, 1) is not None
    assert await _assert_level_rule(ledger, key)

async def test_accepted_at_and_receipt_id_name_the_accepted_version_not_an_unchanged_reread(
    ledger: Ledger,
) -> None:
    key, accepted_receipt = await _first_version(ledger, "demo://unchanged")
    before = await _said(ledger, key)
    await _note(ledger, key)
    again = await _issue(ledger, key)
    assert await _accept(ledger, key, again, "sha256:v1") == AcceptVerdict.UNCHANGED
    assert not await _assert_level_rule(ledger, key)
    said = await _said(ledger, key)
    accepted_at = before.meta["acceptedAt"]
    assert said.meta["receiptId"] == accepted_receipt
    assert said.meta["ordinal"] == before.meta["ordinal"]  # the accepted read's, not the re-read's
    assert said.meta["acceptedAt"] == accepted_at
    assert said.meta["verifiedAt"] != accepted_at  # the unchanged re-read verified it later
    assert datetime.fromisoformat(str(said.meta["verifiedAt"])) > datetime.fromisoformat(str(accepted_at))
    assert said.row["last_accepted_at"] == accepted_at  # the CLI says the same as serve
    assert said.row["last_verified_at"] == said.meta["verifiedAt"]


async def test_a_guardrail_rejected_read_covers_its_notification_and_is_never_called_fresh(
    ledger: Ledger,
) -> None:
    key, accepted_receipt = await _first_version(ledger, "demo://guarded")
    await _note(ledger, key)
    read = await _issue(ledger, key)
    rid = await _rid(ledger, key, read)
    outcome = _outcome(key, read, rid, "sha256:bad").model_copy(update={"guardrail_rejection": "secret"})
    result = await ledger.fence.accept(
        AcceptRequest(outcome=outcome, expected_state=SubscriptionState.ACTIVE, close_epoch=0)
    )
    assert result.verdict == AcceptVerdict.GUARDRAIL_REJECTED
    assert not await _assert_level_rule(ledger, key)  # the rejected read observed the resource
    said = await _said(ledger, key)
    assert said.meta["guardrailRejected"] is True and said.meta["fresh"] is False
    assert said.meta["receiptId"] == accepted_receipt  # the accepted version, still named


async def test_status_answers_freshness_from_the_ledger_in_the_failed_read_case(ledger: Ledger) -> None:
    # The workflow's record knows no coverage: after a failed read it still shows the old version's
    # times and says nothing of the update no read covers. ``mcpsync status`` answers from the ledger.
    key, _ = await _first_version(ledger, "demo://status-failed")
    fence = await ledger.load_fence(key)
    now = datetime.now(UTC)
    record = ResourceSubscriptionV1(
        subject=key.subject, server=key.server, uri=key.uri, state=SubscriptionState.ACTIVE,
        last_accepted_ordinal=fence.last_accepted_ordinal, last_accepted_digest=fence.last_accepted_digest,
        last_receipt_id=fence.last_receipt_id, safety_read_seconds=300.0, last_accepted_at=now,
        last_verified_at=now)
    await _note(ledger, key)
    failed = await _issue(ledger, key)
    assert await _accept(ledger, key, failed, None, ReadOutcomeKind.TRANSIENT) == AcceptVerdict.REJECTED
    assert await _assert_level_rule(ledger, key)
    proven = await proven_of(ledger.pool, key.subject, key.server, key.uri)
    assert proven is not None and proven.dirty
    doc, text = status_view(record, proven, now)
    due = proven.due_at(300.0)
    assert due is not None and proven.verified_at is not None and proven.accepted_at is not None
    assert doc["dirty"] is True and doc["fresh"] is False and "UPDATE_SEEN" in doc["not_fresh_because"]
    assert doc["last_accepted_at"] == proven.accepted_at.isoformat().replace("+00:00", "Z")
    assert doc["last_verified_at"] == proven.verified_at.isoformat().replace("+00:00", "Z")
    assert doc["next_verification_due_at"] == due.isoformat().replace("+00:00", "Z")
    assert "dirty: yes" in text and "fresh: no: an update arrived" in text
