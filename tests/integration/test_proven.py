"""What is said about a version, on the real ledger: every reader of freshness (serve's listing and
read, ``requireFresh``, the CLI's ``list``/``get``/``describe`` rows) answers as the level rule
(``coverage.dirty`` on the fence row) does, and names the accepted version, not the newest re-read.

The cases drive the real ledger's ``note_notification`` / ``allocate_read`` / ``accept``: a failed
read, a read that absorbed duplicate notifications at the ingress, an unchanged re-read, and a read
the guardrail rejects."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from mcpsync.activities.ledger import Ledger
from mcpsync.activities.ledger.serve import ServedResource, freshness_meta, list_served, served_resource
from mcpsync.activities.ledger.subscription_views import list_subscriptions
from mcpsync.workflows.coverage import dirty
from mcpsync.workflows.records.ledger import AcceptRequest, AcceptVerdict
from mcpsync.workflows.records.mcp_calls import ReadOutcomeKind
from mcpsync.workflows.records.subscription import SubscriptionKey, SubscriptionState
from tests.integration.test_ledger import _accept, _active, _issue, _outcome, _rid


@dataclass(frozen=True)
class Said:
    """What each reader says about one resource."""

    served: ServedResource  # serve's read (``served_resource``)
    listed: ServedResource  # serve's listing (``list_served``)
    meta: dict[str, object]  # ``_meta["io.mcpsync/freshness"]`` (requireFresh answers from ``fresh``)
    row: dict[str, object]  # the CLI's list/get/describe row (``list_subscriptions``)


async def _said(ledger: Ledger, key: SubscriptionKey) -> Said:
    served = await served_resource(ledger.pool, key.subject, key.uri)
    assert served is not None
    _, listing = await list_served(ledger.pool, key.subject)
    (listed,) = [r for r in listing if r.uri == key.uri]
    (row,) = await list_subscriptions(ledger.pool, subject=key.subject, server=key.server, uri=key.uri)
    return Said(served, listed, freshness_meta(served, None), row)


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
