"""Replay every recorded history (tests/histories/*.json) against the current workflow code.

A failure here means a workflow change is not replay-compatible: running subscriptions
(which live for months) would fail their next workflow task after the deploy. Fix the change
with ``workflow.patched(...)``; never regenerate the corpus to make this pass (docs/upgrades.md).
Offline: ``Replayer`` needs no Temporal server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcpsync.workflows.names import (
    ANSWER_WORKFLOW_TYPE,
    CATALOG_WORKFLOW_TYPE,
    SIGNAL_RESOURCE_READ,
    WORKFLOW_TYPE,
    Act,
)
from mcpsync.workflows.subscription_program import (
    PATCH_IDENTITY_RECONCILIATION,
    PATCH_LEAN_HISTORY,
    PATCH_READ_CYCLE,
    PATCH_READ_DEADLINES,
    PATCH_START_CYCLE,
    PATCH_TTL_POLL_PERIOD,
    PATCHES_BEFORE_READ_CYCLE,
)
from tests.histories.corpus import MAX_HISTORY_BYTES, history_files, leaks, load, replayer, traits

FILES = history_files()


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_recorded_history_replays(path: Path) -> None:
    history = load(path)
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    failure = result.replay_failure
    assert failure is None, f"{path.name} no longer replays: {type(failure).__name__}: {str(failure)[:300]}"


def test_corpus_covers_every_workflow_and_the_long_life_paths() -> None:
    assert len(FILES) >= 12, f"the corpus shrank to {len(FILES)} files"
    seen = {p.stem: traits(load(p)) for p in FILES}
    types = {t.workflow_type for t in seen.values()}
    assert {WORKFLOW_TYPE, CATALOG_WORKFLOW_TYPE, ANSWER_WORKFLOW_TYPE} <= types, types
    subscription = [t for t in seen.values() if t.workflow_type == WORKFLOW_TYPE]
    assert any(t.continued_as_new for t in subscription), "no subscription run that ends in continue-as-new"
    assert any(t.continued_from_run for t in subscription), "no subscription run started by continue-as-new"
    assert any(t.reset for t in subscription), "no subscription run produced by a workflow reset"
    assert any(t.target_changed and t.continued_as_new for t in subscription), \
        "no subscription run that continues-as-new because its target build changed (worker versioning)"
    assert any(t.upgraded for t in subscription), "no subscription run started on a new build (AUTO_UPGRADE)"
    assert any(t.continued_as_new for t in seen.values() if t.workflow_type == CATALOG_WORKFLOW_TYPE)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_recorded_history_is_small_and_holds_no_body_or_token(path: Path) -> None:
    text = path.read_text()
    assert len(text.encode()) <= MAX_HISTORY_BYTES
    assert leaks(text) == []


def _patches(path: Path) -> set[str]:
    """The workflow.patched ids a recorded run took (its ``core_patch`` markers)."""
    found = set()
    for event in load(path).events:
        if event.HasField("marker_recorded_event_attributes"):
            attrs = event.marker_recorded_event_attributes
            if attrs.marker_name == "core_patch":
                found |= {json.loads(p.data)["id"] for p in attrs.details["patch-data"].payloads}
    return found


@pytest.mark.parametrize("patch", [PATCH_READ_DEADLINES, PATCH_IDENTITY_RECONCILIATION, PATCH_TTL_POLL_PERIOD,
                                   PATCH_LEAN_HISTORY, PATCH_READ_CYCLE, PATCH_START_CYCLE])
def test_corpus_holds_both_sides_of_every_subscription_patch(patch: str) -> None:
    # A workflow.patched change must keep replaying the runs recorded before it (no marker) and the
    # runs recorded after it (marker present): a corpus with only one side would not notice either
    # breaking. Add a generation with `scripts/record-histories --tag <patch-id>` after each patch.
    subs = [p for p in FILES if traits(load(p)).workflow_type == WORKFLOW_TYPE]
    marked = {p.name for p in subs if patch in _patches(p)}
    assert marked and len(marked) < len(subs), f"{len(marked)} of {len(subs)} carry {patch}"


def test_patches_before_read_cycle_are_the_older_patches() -> None:
    # A read-cycle run asks for no older patch and takes them all: the list must name every one.
    assert set(PATCHES_BEFORE_READ_CYCLE) == {PATCH_READ_DEADLINES, PATCH_IDENTITY_RECONCILIATION,
                                              PATCH_TTL_POLL_PERIOD, PATCH_LEAN_HISTORY}


def test_corpus_replays_runs_that_mirrored_reads_made_at_the_ingress() -> None:
    # The resource_read handler (reads at the ingress) runs in recorded histories: churn, a reset,
    # a session change and continue-as-new (generation `*@read-at-ingress.json`).
    def reports(path: Path) -> int:
        return sum(1 for e in load(path).events
                   if e.HasField("workflow_execution_signaled_event_attributes")
                   and e.workflow_execution_signaled_event_attributes.signal_name == SIGNAL_RESOURCE_READ)

    with_reports = {p.stem for p in FILES if reports(p)}
    assert {"subscription-updates-churn-and-close@read-at-ingress", "subscription-reset@read-at-ingress",
            "subscription-continue-as-new@read-at-ingress"} <= with_reports, with_reports


def test_corpus_replays_starts_made_in_one_round_trip() -> None:
    # PATCH_START_CYCLE: subscribe, mark ACTIVE and the initial read as one activity
    # (generation `*@start-cycle.json`: churn, a reset, a session change, continue-as-new).
    def starts(path: Path) -> int:
        return sum(1 for e in load(path).events
                   if e.HasField("activity_task_scheduled_event_attributes")
                   and e.activity_task_scheduled_event_attributes.activity_type.name == Act.MCP_SUBSCRIBE_CYCLE)
    with_starts = {p.stem for p in FILES if starts(p) and PATCH_START_CYCLE in _patches(p)}
    assert {"subscription-updates-churn-and-close@start-cycle", "subscription-reset@start-cycle",
            "subscription-session-change@start-cycle", "subscription-continue-as-new@start-cycle"} <= with_starts, \
        with_starts
